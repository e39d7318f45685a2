"""Hydra entry point: ``python -m ragen_turn.train env=sokoban algo=turn_ppo [overrides]``.

``bash train.sh sokoban turn_ppo [overrides]`` is the same. ``engine=local`` (default) trains in this
process; ``engine=verl`` hands the same config to the verl engine (multi-GPU). The config goes through
:mod:`ragen_turn.compose` (its pipeline) once: :func:`ragen_turn.compose.prepare_cli` before Hydra composes,
:func:`ragen_turn.compose.finalize` in the preflight callback (``ragen_turn.preflight``), or in :func:`main` for
the jobs of a ``--multirun``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ragen_turn.compose import CONFIG_DIR, prepare_cli
from ragen_turn.preflight import CONFIG_ERRORS, exit_code, take_finalized, watch
from ragen_turn.runtime import quiet_transformers

__all__ = ["CONFIG_DIR", "cli", "main", "run"]


def run(cfg: DictConfig) -> dict:
    """Train on a finalized config (:func:`ragen_turn.compose.finalize`) with the engine it names."""
    engine = cfg.engine.name
    if engine == "local":
        from ragen_turn.engines.local.trainer import build_trainer

        trainer = build_trainer(cfg)
        return trainer.fit()
    if engine == "verl":
        from ragen_turn.engines.verl import launch  # imports verl lazily, with an install hint

        return launch(cfg)
    raise ValueError(f"engine.name must be local or verl, got {engine!r}")


@hydra.main(config_path=CONFIG_DIR, config_name="base", version_base="1.3")
def main(cfg: DictConfig) -> dict | None:
    from ragen_turn.engines.rundir import DiskFull, RunAborted, TrainingStopped

    quiet_transformers()
    try:
        cfg = take_finalized(cfg)  # the preflight callback's (a single run), or finalized here
        out = run(cfg)
    except CONFIG_ERRORS as e:  # config / input errors: one clear line, exit code 2
        print(f"error: {e}", file=sys.stderr)
        _drop_unused_run_dir(cfg)
        sys.exit(2)
    except (DiskFull, TrainingStopped, RunAborted) as e:  # one line: what happened, the checkpoint to go back to
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    return out.get("summary") if isinstance(out, dict) else None


def _drop_unused_run_dir(cfg: DictConfig) -> None:
    """A command refused before its first step leaves no run directory behind (only Hydra's files were in it)."""
    from ragen_turn.engines.rundir import remove_if_unused

    try:
        out_dir = Path(str(cfg.trainer.default_local_dir))
    except Exception:  # the config itself did not resolve: nothing was named
        return
    remove_if_unused(out_dir)


class MultirunSummary(Callback):
    """``--multirun``: one table at the end, a row per job (run dir, held-out success before / last / best, time)."""

    def __init__(self) -> None:
        self.rows: list = []

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        ok = getattr(job_return, "status", None) == JobStatus.COMPLETED
        value = job_return.return_value if ok else None
        self.rows.append((value or {}, None if ok else repr(getattr(job_return, "_return_value", "failed"))))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from ragen_turn.runtime import fmt_duration

        def num(v):
            return "-" if v is None else f"{v:.3f}"

        lines = ["", f"[ragen_turn] multirun: {len(self.rows)} job(s)",
                 "| run | steps | held-out before | last | best (step) | time |", "|---|---|---|---|---|---|"]
        for s, err in self.rows:
            if err is not None:
                lines.append(f"| (failed: {err[:80]}) | | | | | |")
                continue
            best = f"{num(s.get('best'))} ({s.get('best_step')})" if s.get("best") is not None else "-"
            t = fmt_duration(s["elapsed_s"]) if s.get("elapsed_s") is not None else "-"
            lines.append(f"| {s.get('run', '?')} | {s.get('steps', '-')} | {num(s.get('init'))} | "
                         f"{num(s.get('last'))} | {best} | {t} |")
        print("\n".join(lines))


def cli() -> None:
    """``python -m ragen_turn.train``: Hydra's app; every config error exits with code 2 (``preflight``)."""
    try:
        prepare_cli()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    watch()
    try:
        main()
    except SystemExit as e:
        raise SystemExit(exit_code(e.code)) from None


if __name__ == "__main__":
    cli()
