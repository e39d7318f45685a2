"""The run directory, the same for both engines: its lock, the checks before a run starts, writes that survive
a crash, and the disk-full error.

- :func:`lock_run_dir`: one process per run directory. ``fcntl.flock`` on ``<run>/run.lock`` (the kernel drops
  it when the holder dies, however it dies); the file holds the holder's pid, so a second process is refused
  naming it, and a lock left by a killed process is taken over with a line saying so.
- :func:`check_run_dir`: before any work, the run directory is writable (a real write is tried: ``os.access``
  says yes to root on a read-only directory) and does not hold another run unless ``trainer.resume`` /
  ``trainer.overwrite`` say so.
- :func:`atomic_write_text`: temp file, fsync, rename, fsync of the directory: a reader sees the old text or
  the new, never an empty or torn file.
- :func:`writing`: turns a failed write on a full disk into ``DiskFull("no space left on device while writing
  <path>")``, whichever writer reports it (torch's zip writer says ``unexpected pos ...`` without the errno,
  safetensors raises a ``SafetensorError`` that is no ``OSError``; :func:`is_disk_full`).
- :func:`clear_earlier_run` (``trainer.overwrite=true``) deletes what an earlier run left, only a run's own files and
  only in a run directory (:func:`check_overwritable`: anything else is refused, nothing deleted; :func:`take_run_dir`:
  the check, then that, what both engines' trainers call first); :func:`remove_if_unused`
  deletes a run directory that a command refused before its first step left with nothing of a run in it.
- :func:`crash_point`: a fault-injection hook for the kill-anywhere tests: ``RAGEN_TURN_CRASH_AT=N`` ends the
  process at the N-th crash point it passes (``os._exit``, or a real ``SIGKILL`` with ``N:sigkill``);
  ``RAGEN_TURN_CRASH_LOG=FILE`` appends the number and label of every point passed. Unset: a counter only.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

from ragen_turn.runfiles import (CHECKPOINTS_DIR, CONFIG_FILE, CONFIGS_FILE, ERROR_LOG, GENERATIONS_FILE, INSPECT_PAGE,
                                  LOCK_FILE, METRICS_FILE, PROVENANCE_FILE, TRACE_FILE)

PathLike = Union[str, os.PathLike]


# ------------------------------------------------------------------------------------------------ crash points
_crash = {"n": 0}


def crash_point(label: str) -> None:
    """Count one crash point; end the process here when it is the one ``RAGEN_TURN_CRASH_AT`` names."""
    _crash["n"] += 1
    n = _crash["n"]
    log = os.environ.get("RAGEN_TURN_CRASH_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{n} {label}\n")
    spec = os.environ.get("RAGEN_TURN_CRASH_AT")
    if not spec:
        return
    at, _, how = spec.partition(":")
    if int(at) != n:
        return
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)


# ------------------------------------------------------------------------------------------------ disk writes
class DiskFull(RuntimeError):
    """A write failed because the device is full; ``path`` is what was being written."""

    def __init__(self, path: PathLike, detail: str = ""):
        self.path = str(path)
        super().__init__(f"no space left on device while writing {path}{detail}")


class TrainingStopped(RuntimeError):
    """A guard stopped the run (e.g. non-finite updates in a row); the message names the checkpoint to go back to."""


class RunAborted(RuntimeError):
    """A run ended by a fault it cannot go on from (verl: a Ray worker or rollout server died, an error in a
    worker): the message is one line naming what happened, the traceback file and the resume command."""


def _free_bytes(path: PathLike) -> Optional[int]:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


FULL_BELOW_BYTES = 64 << 20  # a write error with less free space than this is read as a full disk


_FULL_WORDS = ("no space left on device", "disk quota exceeded", "os error 28", "os error 122",
               "errno 28", "errno 122")


def is_disk_full(e: BaseException) -> bool:
    """``e`` says the device is full: ``OSError`` ENOSPC / EDQUOT, or a writer that keeps only the words
    (safetensors' ``SafetensorError: ... No space left on device (os error 28)``, an error passed on by a Ray
    worker), anywhere in its chain of causes."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(w in str(e).lower() for w in _FULL_WORDS):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


@contextlib.contextmanager
def writing(path: PathLike) -> Iterator[None]:
    """Run a write of ``path``; a full disk comes out as :class:`DiskFull` naming ``path``, whichever writer
    reports it (``OSError``, safetensors' ``SafetensorError``, torch's zip writer, json, a Ray worker's error)."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:
        if is_disk_full(e):
            raise DiskFull(path, f" ({type(e).__name__}: {str(e).strip().splitlines()[-1][:200]})"
                           if not isinstance(e, OSError) else "") from e
        if isinstance(e, RuntimeError):  # torch.save's zip writer: "unexpected pos ..." / "file write failed"
            free = _free_bytes(path)
            if free is not None and free < FULL_BELOW_BYTES:
                raise DiskFull(path, f" ({free} bytes free; {type(e).__name__}: {str(e).strip()[:200]})") from e
        raise


def fsync_dir(path: PathLike) -> None:
    """Make a rename or a new entry in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: PathLike) -> None:
    """fsync every file and directory under ``path`` (before renaming it into place)."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(root)


def atomic_write_text(path: PathLike, text: str) -> None:
    """Replace ``path`` by ``text`` so that a crash at any moment leaves the old content or the new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with writing(path):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            crash_point(f"{path.name}: temp file created, empty")
            data = text.encode()
            while data:
                data = data[os.write(fd, data):]
            crash_point(f"{path.name}: temp file written, not synced")
            os.fsync(fd)
        finally:
            os.close(fd)
        crash_point(f"{path.name}: temp file synced, not renamed")
        os.replace(tmp, path)
        crash_point(f"{path.name}: renamed, directory not synced")
        fsync_dir(path.parent)


# ------------------------------------------------------------------------------------------------ lock
class RunDirBusy(ValueError):
    """Another live process holds the run directory's lock (a ValueError: the train CLI exits with 2)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _holder(text: str) -> Dict[str, str]:
    parts = text.split()
    return {"pid": parts[0], "host": parts[1] if len(parts) > 1 else "?"} if parts and parts[0].isdigit() else {}


class RunDirLock:
    """An exclusive ``flock`` on ``<run>/run.lock`` held by this process (see :func:`lock_run_dir`)."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir, self.fd = run_dir, fd

    def release(self) -> None:
        """Unlock (and clear the pid: a later run does not read this one as stale)."""
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass
        os.close(self.fd)  # closing the last descriptor drops the flock
        self.fd = -1
        _HELD.pop(_key(self.run_dir), None)


_HELD: Dict[str, RunDirLock] = {}


def _key(run_dir: PathLike) -> str:
    return os.path.realpath(run_dir)


def lock_run_dir(run_dir: PathLike, log: Callable[[str], None] = print) -> RunDirLock:
    """Take ``run_dir``'s lock for this process (creating the directory), or raise :class:`RunDirBusy` naming
    the pid that holds it. Re-entrant: a process that holds it gets the same lock back. Held until
    :meth:`RunDirLock.release` or the end of the process."""
    run_dir = Path(run_dir)
    held = _HELD.get(_key(run_dir))
    if held is not None and held.fd >= 0:
        return held
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        text = os.pread(fd, 200, 0).decode(errors="replace")
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        h = _holder(text)
        who = f"pid {h['pid']} on {h['host']}" if h else "another process (pid not yet written)"
        raise RunDirBusy(f"{run_dir} is in use by {who} ({path}): a second run or resume into a live run "
                         "directory is refused; wait for it to end, or pick another trainer.experiment_name / "
                         "trainer.default_local_dir") from None
    previous = _holder(os.pread(fd, 200, 0).decode(errors="replace"))
    if previous and int(previous["pid"]) != os.getpid():
        state = "no longer running" if not _pid_alive(int(previous["pid"])) else "running, but not holding it"
        log(f"[ragen_turn] {path}: stale lock of pid {previous['pid']} on {previous['host']} ({state}) taken over")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode(), 0)
    os.fsync(fd)
    lock = _HELD[_key(run_dir)] = RunDirLock(run_dir, fd)
    return lock


@atexit.register
def _release_all() -> None:
    for lock in list(_HELD.values()):
        lock.release()


# ------------------------------------------------------------------------------------------------ checks
def _probe_writable(run_dir: Path, key: str) -> None:
    """Raise ``ValueError`` naming ``key`` unless a file can be created in ``run_dir`` (or, when it does not exist
    yet, in its nearest existing ancestor, where the run would create it). Leaves nothing behind."""
    p = run_dir
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise ValueError(f"{key}={run_dir}: {p} is not a directory, so the run directory cannot be made there")
    try:
        with tempfile.TemporaryFile(dir=p, prefix=".ragen_turn_write_probe"):
            pass
    except OSError as e:
        raise ValueError(f"{key}={run_dir}: not writable ({p}: {e.strerror or e}); the run writes its metrics "
                         "and checkpoints there") from None


def run_dir_holds_run(run_dir: PathLike) -> bool:
    """A run has logged into ``run_dir`` (a non-empty ``metrics.jsonl``)."""
    m = Path(run_dir) / METRICS_FILE
    return m.is_file() and m.stat().st_size > 0


def check_run_dir(cfg, log: Callable[[str], None] = print) -> RunDirLock:
    """Before any work: the run directory ``trainer.default_local_dir`` is writable, this process holds its lock,
    and it holds no earlier run unless ``trainer.resume`` or ``trainer.overwrite`` is set. Returns the lock."""
    key = "trainer.default_local_dir"
    run_dir = Path(str(cfg.trainer.default_local_dir))
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{key}={run_dir}: exists and is not a directory")
    _probe_writable(run_dir, key)
    held_before = _key(run_dir) in _HELD
    made = [q for q in (run_dir, run_dir / LOCK_FILE) if not q.exists()]  # what a refusal takes away again
    lock = lock_run_dir(run_dir, log=log)
    try:
        if not cfg.trainer.resume and not cfg.trainer.get("overwrite", False) and run_dir_holds_run(run_dir):
            raise FileExistsError(f"{run_dir} already holds a run ({run_dir / METRICS_FILE}): trainer.resume=true "
                                  "continues it, trainer.overwrite=true starts it over, or set another "
                                  "trainer.experiment_name / trainer.default_local_dir")
        if cfg.trainer.resume and not cfg.trainer.get("overwrite", False):
            check_resume_config(cfg, run_dir)
        if cfg.trainer.get("overwrite", False) and not cfg.trainer.resume:
            check_overwritable(run_dir)  # deletes nothing: a folder that is not (only) a run is refused
    except BaseException:
        if not held_before:
            lock.release()
            for q in reversed(made):  # a refused command leaves no lock file (nor directory) it made
                with contextlib.suppress(OSError):
                    q.rmdir() if q.is_dir() else q.unlink()
        raise
    return lock


# what a run trains: a resume may change how it runs (steps, lr, logging, checkpoints), not these; the model's
# sizes change the shapes of its weights (checked before any model is built)
IDENTITY_KEYS = ("algo.name", "env.name", "model.name", "model.path", "seed", "engine.name",
                 "algorithm.adv_estimator", "actor_rollout_ref.actor.policy_loss.loss_mode", "critic.level",
                 "env.train_tags", "env_module", "model.arch", "model.hidden_size", "model.num_hidden_layers",
                 "model.num_attention_heads", "model.num_key_value_heads", "model.intermediate_size",
                 "model.tie_word_embeddings", "actor_rollout_ref.model.lora_rank")


def _plain(v):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(v) if OmegaConf.is_config(v) else v


def identity_of(cfg) -> Dict[str, object]:
    """``{key: value}`` of :data:`IDENTITY_KEYS` in ``cfg`` (what a run's provenance records of what it trains)."""
    from omegaconf import OmegaConf

    return {k: _plain(OmegaConf.select(cfg, k, default=None)) for k in IDENTITY_KEYS}


_ABSENT = object()


def resume_config_changes(old, new) -> List[str]:
    """``key: old -> new`` for each of :data:`IDENTITY_KEYS` that differs between a run's record (its config, or
    an :func:`identity_of` dict) and a resume's config; a key the record lacks (an older version's) is not
    compared, nor ``model.path`` unless both name one (the verl engine records the resolved directory)."""
    from omegaconf import OmegaConf

    out = []
    for key in IDENTITY_KEYS:
        a = old.get(key, _ABSENT) if isinstance(old, dict) else OmegaConf.select(old, key, default=_ABSENT)
        if a is _ABSENT:
            continue
        a, b = _plain(a), _plain(OmegaConf.select(new, key, default=None))
        if key == "model.path" and (a is None or b is None):
            continue
        if key == "actor_rollout_ref.model.lora_rank":  # a run recorded before LoRA existed: full fine-tuning
            a, b = a or 0, b or 0
        if a != b:
            out.append(f"{key}: {a} -> {b}")
    return out


def run_records(run_dir: PathLike) -> Tuple[List[Tuple[str, object]], List[str]]:
    """What ``run_dir`` keeps of what its run trains: ``[(where, config or identity dict)]`` from ``config.yaml``,
    the last line of ``configs.jsonl`` and the last entry of ``provenance.json`` that has an ``identity``; and
    the records missing or unreadable, in words."""
    import json

    from omegaconf import OmegaConf

    run_dir = Path(run_dir)
    found: List[Tuple[str, object]] = []
    lost: List[str] = []
    path = run_dir / CONFIG_FILE
    try:
        found.append((str(path), OmegaConf.load(path)))
    except FileNotFoundError:
        lost.append(f"{CONFIG_FILE} is missing")
    except Exception as e:  # noqa: BLE001 (a torn or hand-edited file: say so, do not guess)
        lost.append(f"{path} cannot be read ({type(e).__name__}: {str(e).strip().splitlines()[0][:160]})")
    path = run_dir / CONFIGS_FILE
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        entry = json.loads(lines[-1])["config"] if lines else None
        if isinstance(entry, dict):
            found.append((f"{path} (its last line)", OmegaConf.create(entry)))
        else:
            lost.append(f"{CONFIGS_FILE} holds no config")
    except FileNotFoundError:
        lost.append(f"{CONFIGS_FILE} is missing")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        lost.append(f"{path}'s last line cannot be read ({type(e).__name__})")
    path = run_dir / PROVENANCE_FILE
    try:
        entries = json.loads(path.read_text())
        ident = next((e["identity"] for e in reversed(entries) if isinstance(e, dict)
                      and isinstance(e.get("identity"), dict)), None)
        if ident is not None:
            found.append((f"{path} (identity)", ident))
        else:
            lost.append(f"{PROVENANCE_FILE} records no identity")
    except FileNotFoundError:
        lost.append(f"{PROVENANCE_FILE} is missing")
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        lost.append(f"{path} cannot be read ({type(e).__name__})")
    return found, lost


def _holds_checkpoints(run_dir: Path) -> bool:
    return any(p.is_dir() for p in (*run_dir.glob(f"{CHECKPOINTS_DIR}/step_*"), *run_dir.glob("global_step_*")))


def check_resume_config(cfg, run_dir: PathLike) -> None:
    """``trainer.resume=true`` into a run whose records (``config.yaml``, ``configs.jsonl``, the identity in
    ``provenance.json``: :func:`run_records`) say it trains something else (another algorithm, env, model or
    model size, seed, ...: :data:`IDENTITY_KEYS`) is refused naming the keys; so is a resume into a run (metrics
    or checkpoints) that keeps none of those records (``trainer.overwrite=true`` lets either go on)."""
    run_dir = Path(run_dir)
    found, lost = run_records(run_dir)
    if not found:
        if run_dir_holds_run(run_dir) or _holds_checkpoints(run_dir):
            raise ValueError(f"trainer.resume=true: {run_dir} keeps no record of what its run trains "
                             f"({'; '.join(lost)}), so this resume cannot be checked against it: refused. "
                             "trainer.overwrite=true starts the run over (or resumes anyway, with trainer.resume=true)")
        return
    changes: List[str] = []
    where: List[str] = []
    for name, old in found:
        differs = resume_config_changes(old, cfg)
        where += [name] if differs else []
        changes += [c for c in differs if c not in changes]
    if changes:
        raise ValueError(f"trainer.resume=true: this config trains something else than the run in {run_dir} "
                         f"({'; '.join(changes)}; the run's config: {', '.join(where)}): resume with the run's values, "
                         "pick another trainer.experiment_name / trainer.default_local_dir, or set "
                         "trainer.overwrite=true to resume anyway")


def run_complete(step: int, total: int) -> bool:
    """A resumed run that has already trained its ``total`` steps (``total`` 0: a warm-start-only run, never
    complete): it trains nothing and leaves the run's files as they are (``config.yaml``, ``configs.jsonl``,
    ``metrics.jsonl``, provenance)."""
    return int(step) >= int(total) > 0


def record_config(out_dir: PathLike, text: str, step: int) -> None:
    """``config.yaml`` = this start's config (resolved); ``configs.jsonl`` keeps one line per start or resume
    (``step`` it starts at, time, config), so the record of the steps before a resume is never lost. A fresh start
    (step 0) begins a new history."""
    import json

    from omegaconf import OmegaConf

    out_dir = Path(out_dir)
    atomic_write_text(out_dir / CONFIG_FILE, text)
    history = out_dir / CONFIGS_FILE
    entry = {"step": int(step), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "pid": os.getpid(),
             "config": OmegaConf.to_container(OmegaConf.create(text))}
    line = json.dumps(entry, sort_keys=True) + "\n"
    with writing(history):
        if step == 0:
            atomic_write_text(history, line)
        else:
            with open(history, "a") as f:
                f.write(line)


# ------------------------------------------------------------------------------------------------ overwrite, leftovers
HYDRA_SUBDIR = "hydra"  # Hydra's job files of the current command: kept


def run_files(out_dir: PathLike) -> List[Path]:
    """What a previous run left in ``out_dir``: everything but Hydra's job files and the lock."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    return sorted(p for p in out_dir.iterdir() if p.name not in (HYDRA_SUBDIR, LOCK_FILE))


# what makes a directory recognisably a run of ours (trainer.overwrite=true deletes nothing elsewhere)
RUN_RECORDS = (METRICS_FILE, CONFIG_FILE, CONFIGS_FILE, PROVENANCE_FILE)
# every name a run of ours writes in its directory: the trainers (both engines), eval.sh, the report, wandb
_WRITTEN = "|".join(map(re.escape, (METRICS_FILE, CONFIG_FILE, CONFIGS_FILE, PROVENANCE_FILE, GENERATIONS_FILE,
                                     TRACE_FILE)))  # written atomically: through a .<name>.tmp-<pid> file
_OURS = re.compile(rf"^(?:{_WRITTEN}|{re.escape(INSPECT_PAGE)}"
                   rf"|{re.escape(ERROR_LOG)}|{re.escape(CHECKPOINTS_DIR)}|wandb|report|eval|eval_[^/]*\.json"
                   r"|latest_checkpointed_iteration\.txt"
                   r"|(?:\.(?:tmp|del)_)?global_step_\d+"
                   rf"|\.(?:{_WRITTEN}"
                   r"|latest_checkpointed_iteration\.txt)\.tmp-\d+|\.ragen_turn_write_probe\w*)$")
# inside checkpoints/: step directories (staged, being deleted), the pointers and their temp files
_OURS_IN_CHECKPOINTS = re.compile(r"^(?:(?:\.(?:tmp|del)_)?(?:global_)?step_\d+|latest|last_good"
                                  r"|\.(?:latest|last_good)\.tmp-\d+)$")


def foreign_entries(out_dir: PathLike) -> List[str]:
    """The entries of ``out_dir`` (and of its ``checkpoints/``) that no run of ours writes, as paths relative to
    ``out_dir``: what ``trainer.overwrite=true`` must not delete."""
    out_dir = Path(out_dir)
    out = []
    for p in run_files(out_dir):
        if not _OURS.match(p.name):
            out.append(p.name)
        elif p.name == CHECKPOINTS_DIR and p.is_dir() and not p.is_symlink():
            out += [f"{CHECKPOINTS_DIR}/{q.name}" for q in sorted(p.iterdir())
                    if not _OURS_IN_CHECKPOINTS.match(q.name)]
    return out


def check_overwritable(out_dir: PathLike) -> List[Path]:
    """``trainer.overwrite=true``: what it will delete in ``out_dir`` (a run's files only). ``ValueError`` (exit 2),
    deleting nothing, when ``out_dir`` holds anything but a run of ours: a folder without a run's records
    (:data:`RUN_RECORDS`), or entries no run writes (a mistyped path must not wipe a user's folder)."""
    out_dir = Path(out_dir)
    old = run_files(out_dir)
    if not old:
        return []
    key = f"trainer.overwrite=true with trainer.default_local_dir={out_dir}"
    names = [p.name for p in old]
    shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    if not any((out_dir / r).is_file() for r in RUN_RECORDS):
        raise ValueError(f"{key}: this folder is not a run directory (it has none of {', '.join(RUN_RECORDS)}) "
                         f"and holds {shown}; nothing was deleted. Point trainer.default_local_dir (or "
                         "trainer.experiment_name) at a run, or at a new folder")
    foreign = foreign_entries(out_dir)
    if foreign:
        more = f" and {len(foreign) - 12} more" if len(foreign) > 12 else ""
        raise ValueError(f"{key}: the run directory also holds what no run writes ({', '.join(foreign[:12])}{more})"
                         "; nothing was deleted. Move those out, or pick another trainer.experiment_name / "
                         "trainer.default_local_dir")
    return old


def clear_earlier_run(out_dir: PathLike, log: Callable[[str], None] = print) -> None:
    """``trainer.overwrite=true``: delete the earlier run's files (checkpoints, metrics, config, evaluations,
    wandb) so none is mixed with the new run's; only what a run of ours writes, and only in a run directory
    (:func:`check_overwritable`, else ``ValueError`` and nothing deleted). Call it holding the directory's lock
    (:func:`check_run_dir`)."""
    old = check_overwritable(out_dir)
    for p in old:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    if old:
        log(f"[ragen_turn] trainer.overwrite=true: deleted the previous run in {out_dir} "
            f"({', '.join(p.name for p in old)})")


def take_run_dir(cfg, log: Callable[[str], None] = print) -> RunDirLock:
    """What a trainer of either engine does first: :func:`check_run_dir` (the lock, held until the process ends),
    then with ``trainer.overwrite=true`` (and no ``trainer.resume``) :func:`clear_earlier_run`. Returns the lock."""
    lock = check_run_dir(cfg, log=log)
    if not cfg.trainer.resume and cfg.trainer.get("overwrite", False):
        clear_earlier_run(cfg.trainer.default_local_dir, log)
    return lock


def remove_if_unused(out_dir: PathLike) -> bool:
    """Delete ``out_dir`` when it holds nothing of a run (only Hydra's job files and the lock, or nothing) and no
    other live process holds it: a command that stopped before its first step leaves no stray run directory.
    Returns True if it was deleted."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir() or run_files(out_dir):
        return False
    try:
        lock = lock_run_dir(out_dir, log=lambda _: None)
    except (RunDirBusy, OSError):
        return False
    shutil.rmtree(out_dir, ignore_errors=True)
    lock.release()
    return True
