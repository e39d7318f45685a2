"""The train command's checks before any work: the config, then the run directory.

:class:`Preflight` is a Hydra callback (``config/base.yaml``: ``hydra.callbacks.preflight``). Hydra calls its
``on_run_start`` after composing the config and before it makes the run's output directory
(``hydra.run.dir`` lies inside the run directory), so a bad config or a busy run directory stops the command
with exit code 2 in a few seconds and leaves no directory behind: no model is loaded, no warm start or Ray is
started. What it checks: the config (``compose.finalize``: the schema and the cross-key rules; the task
function then trains with this finalized config, :func:`take_finalized`), then (:func:`preflight`) verl's
rules, that the run directory is writable, that no live process holds it (its lock is taken here and held
to the end) and that it holds no earlier run unless ``trainer.resume`` / ``trainer.overwrite`` say so.

A config that Hydra itself cannot compose (``ppo_epochs=abc`` against the schema's int, an unknown key
without ``+``) fails before any callback; :func:`exit_code` turns Hydra's exit code 1 into 2 for those.
"""
from __future__ import annotations

import copy
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict

from ragen_turn.runfiles import CHECKPOINTS_DIR

CONFIG_ERRORS = (ValueError, FileNotFoundError, FileExistsError)  # a config or input problem: exit code 2
_state: dict = {"composed": False, "finalized": None}


def preflight(cfg: DictConfig) -> None:
    """Check a finalized task config (``compose.finalize``: the schema and the cross-key rules) for the run:
    verl's own rules, the checkpoint to resume from, and take its run directory's lock (see the module doc)."""
    from pathlib import Path

    from ragen_turn.engines import checkpoints
    from ragen_turn.engines.rundir import check_run_dir

    if cfg.engine.name == "verl":  # verl's own rules (install, placement, batch split over GPUs), before Ray
        from ragen_turn.engines.verl import check_config

        check_config(cfg)
    if cfg.trainer.resume and not cfg.trainer.get("overwrite", False):  # the checkpoint to load is there,
        out = Path(cfg.trainer.default_local_dir)                         # complete, and verifiable
        checkpoints.check_resume_target(out if cfg.engine.name == "verl" else out / CHECKPOINTS_DIR,
                                        cfg.trainer.get("resume_from"), bool(cfg.trainer.get("load_unverified")),
                                        cfg.engine.name)
    check_run_dir(cfg)


def task_config(config: DictConfig) -> DictConfig:
    """The job's config from Hydra's (without ``hydra``), finalized (``compose.finalize``: RAGEN's keys
    mapped, resolved, checked) as the task function will train with it."""
    from hydra.core.hydra_config import HydraConfig

    from ragen_turn.compose import finalize

    HydraConfig.instance().set_config(config)  # ${hydra:...} and resolvers reading it work as in the job
    cfg = copy.deepcopy(config)
    with open_dict(cfg):
        del cfg["hydra"]
    return finalize(cfg)


def take_finalized(cfg: DictConfig) -> DictConfig:
    """The task function's config: the one :class:`Preflight` finalized for this run (so the pipeline runs
    once a command), else ``finalize(cfg)`` (a ``--multirun`` job: Hydra starts it without ``on_run_start``)."""
    from ragen_turn.compose import finalize

    done, _state["finalized"] = _state["finalized"], None
    return done if done is not None else finalize(cfg)


class Preflight(Callback):
    """Runs :func:`preflight` for ``python -m ragen_turn.train`` before Hydra writes anything."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _state["composed"] = True
        if config.hydra.job.name != "train":  # evaluate composes the same base.yaml
            return
        try:
            cfg = task_config(config)
            preflight(cfg)
        except CONFIG_ERRORS as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        _state["finalized"] = cfg
        from ragen_turn.config import env_config_lines
        from ragen_turn.ragen_keys import unused_lines

        for line in unused_lines(cfg) + env_config_lines(cfg):  # once per run: RAGEN keys given that have no
            print(line)                                            # effect here, and each env tag's config

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _state["composed"] = True  # each job is finalized and checked as it starts (configs differ per job)
        _state["finalized"] = None


def watch() -> None:
    """A train command starts: nothing composed yet (see :func:`exit_code`)."""
    _state["composed"] = False


def exit_code(code: Any) -> Any:
    """Hydra exits with 1 when it cannot compose the config (before :class:`Preflight` ran): a config error, 2."""
    return 2 if code == 1 and not _state["composed"] else code
