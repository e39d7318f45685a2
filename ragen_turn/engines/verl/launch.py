"""How a verl run starts and ends (the package doc, ``ragen_turn.engines.verl``, re-exports these names): verl's
install check, the run's model directory and verl config, a private temporary directory for its Ray workers,
:func:`launch`, and a failure said in one line. Importing it never imports verl."""
from __future__ import annotations

import contextlib
import getpass
import importlib.util
import os
from typing import Any, Dict, Iterator

from ragen_turn.engines.rundir import RunAborted
from ragen_turn.runfiles import ERROR_LOG, METRICS_FILE

VERL_VERSION = "0.9.1"
INSTALL_HINT = ("engine=verl needs verl {v}: pip install -e '.[verl]' (CPU: verl with the CPU torch) or "
                "pip install -e '.[gpu]' (GPUs: verl[vllm]=={v}); both add cachetools uvicorn fastapi pyzmq msgspec."
                ).format(v=VERL_VERSION)


class VerlNotInstalled(ImportError, ValueError):
    """verl (or a module its trainer needs) is not importable.

    Also a ValueError, so ``python -m ragen_turn.train`` reports it as a one-line config error.
    """


def require_verl(import_it: bool = True) -> None:
    """Raise :class:`VerlNotInstalled` with the install command unless verl 0.9.1 can be imported.

    ``import_it=False`` (the train command's check before any work) reads the version from the package's metadata
    instead of importing verl, which costs about twice torch's import.
    """
    if importlib.util.find_spec("verl") is None:
        raise VerlNotInstalled(INSTALL_HINT)
    if import_it:
        try:
            import verl
        except Exception as e:  # a broken install (e.g. a missing undeclared dependency)
            raise VerlNotInstalled(f"import verl failed ({type(e).__name__}: {e}). {INSTALL_HINT}") from e
        version = getattr(verl, "__version__", None)
    else:
        from importlib.metadata import PackageNotFoundError, version as dist_version

        try:
            version = dist_version("verl")
        except PackageNotFoundError:
            version = None
    if version != VERL_VERSION:
        raise VerlNotInstalled(f"found verl {version or '?'}, need {VERL_VERSION}. {INSTALL_HINT}")
    missing = [m for m in ("ray", "cachetools", "uvicorn", "fastapi", "zmq", "msgspec")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise VerlNotInstalled(f"verl's trainer needs {', '.join(missing)} (not declared by verl). {INSTALL_HINT}")


def model_path_for_verl(cfg: Any, log=print) -> str:
    """The Hugging Face directory verl loads the actor (and the critic) from.

    ``model.path`` or the built tiny/smollm2 model; with ``model.warmstart.enable`` the
    warm-started (SFT) copy of it, from the same cache the local engine uses (run here, before Ray,
    when it is not cached yet).
    """
    from ragen_turn.models import resolve_model_path
    from ragen_turn.warmstart import warmstart_notice

    warmstart_notice(cfg, log)  # what is built before step 1 (the cache lacks it), how long, the keys that skip it
    path = resolve_model_path(dict(cfg.model), dtype=cfg.get("dtype"))
    from transformers import AutoTokenizer

    from ragen_turn.rollout.context import check_context_fits
    from ragen_turn.warmstart import warmstart_dir, warmstart_enabled

    check_context_fits(cfg, AutoTokenizer.from_pretrained(str(path), local_files_only=True))  # before the SFT

    if warmstart_enabled(cfg, log):
        path = warmstart_dir(cfg, path, log=log)
    return str(path)


def build_verl_config(cfg: Any, log=print):
    """Our resolved config -> verl's (config checked first; model directory resolved and warm-started)."""
    require_verl()
    from .config import check_ragen_config, to_verl_config

    check_ragen_config(cfg)  # before any model building or SFT
    return to_verl_config(cfg, model_path=model_path_for_verl(cfg, log=log))


def check_config(cfg: Any) -> None:
    """What the train command checks for engine=verl before any work (``ragen_turn.preflight``): verl is installed
    and our config maps onto verl's (placement, batch splits); ValueError naming the key."""
    require_verl(import_it=False)  # launch imports it; verl's config module imports no verl either
    from .config import check_ragen_config

    check_ragen_config(cfg)


@contextlib.contextmanager
def private_tmpdir(vcfg: Any, watch: bool = True) -> Iterator[str]:
    """A temporary directory of this run: the ``TMPDIR`` of every Ray worker (``ray_kwargs.ray_init.runtime_env``)
    and Ray's own temp dir (``ray_init._temp_dir``: the Ray session folder); when the block ends, the run's
    processes still alive are ended and the directory is removed (:mod:`.watchdog`). ``watch``: a watchdog
    process does the same if this process dies without running its ``finally`` (``kill -9``).

    verl's checkpoint code (``verl.utils.fs.local_mkdir_safe``) leaves an empty ``ckpt_<hash>.lock`` in
    ``tempfile.gettempdir()`` for every checkpoint directory in every process that writes one (the task runner, each
    actor and critic rank), and never deletes it: in ``/tmp``, a run left a few of these per checkpoint; Ray leaves
    a session folder (2-3 MB) per run. Ray merges the job's ``env_vars`` into every worker's. A short path under
    the system's temp directory (Ray's sockets live under it and must stay short); torch's compile cache keeps its
    usual place so runs still share it.
    """
    import tempfile

    from omegaconf import open_dict

    from . import watchdog

    tmp = tempfile.mkdtemp(prefix="ragen_turn_verl_")
    env = vcfg.ray_kwargs.ray_init.runtime_env.env_vars
    with open_dict(env):
        env["TMPDIR"] = tmp
        if "TORCHINDUCTOR_CACHE_DIR" not in env and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    with open_dict(vcfg.ray_kwargs.ray_init):
        vcfg.ray_kwargs.ray_init["_temp_dir"] = os.path.join(tmp, "ray")
    guard = watchdog.start(os.getpid(), tmp) if watch else None
    try:
        yield tmp
    finally:
        watchdog.cleanup(tmp)
        if guard is not None:
            guard.kill()
            guard.wait()


_DIED = ("ActorDiedError", "RayActorError", "ActorUnavailableError", "WorkerCrashedError", "LocalRayletDiedError",
         "NodeDiedError", "OwnerDiedError", "ObjectLostError", "RaySystemError", "OutOfMemoryError")


def _cause(e: BaseException) -> BaseException:
    """The error a Ray task raised (``RayTaskError.cause``, through any nesting)."""
    seen = 0
    while getattr(e, "cause", None) is not None and seen < 8 and e.cause is not e:
        e, seen = e.cause, seen + 1
    return e


def what_died(e: BaseException) -> str:
    """``Ray actor <class> (pid N)`` from a Ray death error's message, else its kind."""
    import re

    text = str(e)
    cls = re.search(r"class_name: (\S+)", text)
    pid = re.search(r"\bpid: (\d+)", text)
    if cls:  # verl's colocated workers: create_colocated_worker_cls.<locals>.WorkerDict
        return f"the Ray actor {cls.group(1).split('.')[-1]}" + (f" (pid {pid.group(1)})" if pid else "")
    return {"WorkerCrashedError": "a Ray worker", "LocalRayletDiedError": "Ray's raylet",
            "NodeDiedError": "a Ray node", "OutOfMemoryError": "a Ray worker (out of memory)"}.get(
        type(e).__name__, f"a Ray process ({type(e).__name__})")


def resume_command(out_dir: Any = None) -> str:
    """This command with ``trainer.resume=true`` (and the run directory ``out_dir``, absolute, so it works from
    any directory), with this process's Python: it continues the run from its newest complete checkpoint, or starts
    it over when none was written (the run directory already holds its metrics, so the same command without
    ``trainer.resume=true`` would be refused as "already holds a run")."""
    import shlex
    import sys
    from pathlib import Path

    drop = ("trainer.resume=", "trainer.overwrite=", "trainer.resume_from=", "hydra.mode=")
    drop += ("trainer.default_local_dir=",) if out_dir is not None else ()
    args = [a for a in sys.argv[1:] if not a.startswith(drop) and a not in ("--multirun", "-m")]
    if out_dir is not None:
        args.append(f"trainer.default_local_dir={Path(out_dir).resolve()}")
    return " ".join(shlex.quote(a) for a in [sys.executable, "-m", "ragen_turn.train", *args, "trainer.resume=true"])


def run_failure(e: BaseException, out_dir: Any) -> BaseException:
    """The error ``launch`` raises for ``e`` from ``run_ppo``: what our code raised in the task runner (a config
    error, ``DiskFull``, ``TrainingStopped``) as itself; anything else as one :class:`RunAborted` line (what died
    or failed, the resume command), the full traceback in ``<run>/error.log``."""
    import traceback
    from pathlib import Path

    from ragen_turn.engines import checkpoints as ckpt
    from ragen_turn.engines.rundir import DiskFull, TrainingStopped, is_disk_full

    out_dir = Path(out_dir)
    cause = _cause(e)
    newest = ckpt.newest_complete(out_dir)
    note = (f"resume from the newest complete checkpoint ({newest.name}) with: {resume_command(out_dir)}"
            if newest is not None else
            f"no checkpoint was written in {out_dir}; start the run over with: {resume_command(out_dir)}")
    if isinstance(cause, DiskFull) or (not isinstance(cause, TrainingStopped) and is_disk_full(cause)):
        path = cause.path if isinstance(cause, DiskFull) else out_dir
        return DiskFull(path, f"; {note}")
    if isinstance(cause, (TrainingStopped, ValueError, FileNotFoundError, FileExistsError)):
        return cause
    log = out_dir / ERROR_LOG
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write("".join(traceback.format_exception(type(e), e, e.__traceback__)) + "\n")
        where = f"traceback: {log}"
    except OSError:
        where = "no traceback written (the run dir is not writable)"
    if type(cause).__name__ in _DIED or type(e).__name__ in _DIED:
        return RunAborted(f"{what_died(cause)} died; the run stopped ({where}); {note}")
    last = str(cause).strip().splitlines()[-1][:300] if str(cause).strip() else ""
    return RunAborted(f"the run failed: {type(cause).__name__}: {last} ({where}); {note}")


def launch(cfg: Any) -> Dict[str, float]:
    """Train with verl: take the run directory (its lock: one process per run dir), check and map the config,
    then ``run_ppo`` on a local Ray cluster it starts.

    Every check runs before Ray starts (ours, then verl's own config classes). Returns the last
    line of ``metrics.jsonl``.
    """
    import json
    from pathlib import Path

    require_verl()
    from ragen_turn.engines.rundir import take_run_dir

    take_run_dir(cfg)  # the lock; trainer.overwrite=true deletes the earlier run's files (verl would keep them)
    vcfg = build_verl_config(cfg)
    from .config import check_verl_config, resolve_placement, worker_env

    check_verl_config(vcfg)
    # this process imported verl already: set what the Ray workers get through their runtime env here too,
    # and register the CPU platform before verl's driver code asks for one
    os.environ.update(worker_env(resolve_placement(cfg)))
    from . import cpu_platform  # noqa: F401

    import ray
    from verl.trainer.main_ppo import run_ppo

    from .trainer import TaskRunner

    started = not ray.is_initialized()
    with private_tmpdir(vcfg):
        try:
            run_ppo(vcfg, task_runner_class=TaskRunner)
        except Exception as e:  # one line (train.py prints it), the traceback in <run>/error.log
            raise run_failure(e, vcfg.ragen.trainer.default_local_dir) from None
        finally:
            if started and ray.is_initialized():
                ray.shutdown()
    metrics = Path(vcfg.ragen.trainer.default_local_dir) / METRICS_FILE
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    last = json.loads(lines[-1]) if lines else {}
    # Ray may drop a worker's last printed lines when the cluster stops: say where the run ended from here
    from ragen_turn.engines.runlog import progress_line

    print(f"[ragen_turn] verl run finished: {progress_line(last)} (metrics: {metrics})", flush=True)
    return last


__all__ = ["launch", "check_config", "private_tmpdir", "RunAborted", "run_failure", "build_verl_config",
           "model_path_for_verl", "require_verl", "VerlNotInstalled", "INSTALL_HINT", "VERL_VERSION"]
