"""Hydra entry point: ``python -m ragen_turn.train env=sokoban algo=turn_ppo [overrides]``.

``bash train.sh sokoban turn_ppo [overrides]`` is the same. ``engine=local`` (default) trains in this
process; ``engine=verl`` hands the same config to the verl engine (multi-GPU).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "config")

# ${mul:a,b}: products in configs (e.g. the critic lr as a multiple of the actor's in sweep=critic_lr)
if not OmegaConf.has_resolver("mul"):
    OmegaConf.register_new_resolver("mul", lambda *xs: math.prod(float(x) for x in xs))


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """The resolved config for ``overrides`` (as on the command line), without starting a run."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # inside a @hydra.main app (e.g. eval re-composing a run)
        cfg = compose(config_name="base", overrides=list(overrides or []))
    else:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(config_name="base", overrides=list(overrides or []))
    OmegaConf.resolve(cfg)
    return cfg


def run(cfg: DictConfig) -> dict:
    OmegaConf.resolve(cfg)
    engine = cfg.engine.name
    if engine == "local":
        from ragen_turn.engines.local.trainer import build_trainer

        trainer = build_trainer(cfg)
        return trainer.fit()
    if engine == "verl":
        from ragen_turn.engines.verl import launch  # imports verl lazily, with an install hint

        return launch(cfg)
    raise ValueError(f"engine.name must be local or verl, got {engine!r}")


def quiet_transformers() -> None:
    """One progress line per step is ours; transformers' load/save progress bars are noise here."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


@hydra.main(config_path=CONFIG_DIR, config_name="base", version_base="1.3")
def main(cfg: DictConfig) -> None:
    quiet_transformers()
    try:
        run(cfg)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # config / input errors: one clear line
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
