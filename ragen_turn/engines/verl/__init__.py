"""The verl engine (multi-GPU: Ray + FSDP/Megatron + vLLM/SGLang, verl 0.9.1).

``bash train.sh sokoban turn_ppo engine=verl trainer.n_gpus_per_node=8 model.path=...`` ends in
:func:`launch`. Importing this package never imports verl (so ``import ragen_turn`` works without
it); :func:`launch` does, and says how to install it when it is missing.

Modules (each imports verl): :mod:`.register` (our policy losses and ``turn_gae`` in verl's
registries), :mod:`.config` (our Hydra keys -> verl's config), :mod:`.agent_loop` (the verl agent
loop that plays our environments turn by turn), :mod:`.losses` (the actor loss with turn counts),
:mod:`.trainer` (``StarPOTrainer`` / ``TurnPPOTrainer`` on verl's ``RayPPOTrainer``). See docs/verl.md.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Dict

VERL_VERSION = "0.9.1"
INSTALL_HINT = ("engine=verl needs verl {v} and its GPU stack: pip install -e '.[gpu]' "
                "(verl[vllm]=={v} plus cachetools uvicorn fastapi pyzmq msgspec). "
                "On one GPU or CPU, use engine=local.").format(v=VERL_VERSION)


class VerlNotInstalled(ImportError, ValueError):
    """verl (or a module its trainer needs) is not importable.

    Also a ValueError, so ``python -m ragen_turn.train`` reports it as a one-line config error.
    """


def require_verl() -> None:
    """Raise :class:`VerlNotInstalled` with the install command unless verl 0.9.1 can be imported."""
    if importlib.util.find_spec("verl") is None:
        raise VerlNotInstalled(INSTALL_HINT)
    try:
        import verl
    except Exception as e:  # a broken install (e.g. a missing undeclared dependency)
        raise VerlNotInstalled(f"import verl failed ({type(e).__name__}: {e}). {INSTALL_HINT}") from e
    if getattr(verl, "__version__", None) != VERL_VERSION:
        raise VerlNotInstalled(f"found verl {getattr(verl, '__version__', '?')}, need {VERL_VERSION}. {INSTALL_HINT}")
    missing = [m for m in ("ray", "cachetools", "uvicorn", "fastapi", "zmq", "msgspec")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise VerlNotInstalled(f"verl's trainer needs {', '.join(missing)} (not declared by verl). {INSTALL_HINT}")


def build_verl_config(cfg: Any):
    """Our resolved config -> verl's (model directory resolved; built for tiny/smollm2 names)."""
    require_verl()
    from ragen_turn.models import resolve_model_path

    from .config import to_verl_config

    model = dict(cfg.model)
    if cfg.get("model_path"):
        model["path"] = cfg.model_path
    path = resolve_model_path(model, dtype=cfg.get("dtype"))
    return to_verl_config(cfg, model_path=str(path))


def check_config(cfg: Any) -> None:
    """What the train command checks for engine=verl before any work (``ragen_turn.preflight``): verl is installed
    and our config maps onto verl's (placement, batch splits); ValueError naming the key."""
    require_verl()
    from .config import check_ragen_config

    check_ragen_config(cfg)


def launch(cfg: Any) -> Dict[str, float]:
    """Train with verl: take the run directory (its lock: one process per run dir), map the config, check it with
    verl's own classes, then ``run_ppo``."""
    require_verl()
    from ragen_turn.engines.rundir import check_run_dir

    check_run_dir(cfg)
    vcfg = build_verl_config(cfg)
    from .config import check_verl_config

    check_verl_config(vcfg)
    import os

    from verl.trainer.main_ppo import run_ppo

    from .trainer import TaskRunner

    # this process imports verl already; the Ray workers get the variable through the runtime env
    os.environ.setdefault("VERL_USE_EXTERNAL_MODULES", str(
        vcfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES))
    run_ppo(vcfg, task_runner_class=TaskRunner)
    return {}


__all__ = ["launch", "check_config", "build_verl_config", "require_verl", "VerlNotInstalled", "INSTALL_HINT",
           "VERL_VERSION"]
