"""The run directory ``trainer.default_local_dir`` before a run starts: refuse to mix two runs in it, clear it for
``trainer.overwrite=true``, and remove it again when a run stops before writing anything.

Hydra writes its own job files into ``<run>/hydra`` before the run starts; they belong to the current command and
are kept.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, List

HYDRA_SUBDIR = "hydra"


def run_files(out_dir: Path) -> List[Path]:
    """What a previous run left in ``out_dir``: everything but Hydra's job files of this command."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    return sorted(p for p in out_dir.iterdir() if p.name != HYDRA_SUBDIR)


def holds_a_run(out_dir: Path) -> bool:
    m = Path(out_dir) / "metrics.jsonl"
    return (m.is_file() and m.stat().st_size > 0) or (Path(out_dir) / "checkpoints").is_dir()


def prepare_run_dir(out_dir: Path, resume: bool, overwrite: bool, log: Callable[[str], None] = print) -> None:
    """Check ``out_dir`` for a new run (``resume=False``): a directory that holds a run is refused unless
    ``overwrite``, which deletes that run's files (checkpoints, metrics, config, evaluations, wandb) first."""
    out_dir = Path(out_dir)
    if resume or not holds_a_run(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        return
    if not overwrite:
        raise FileExistsError(f"{out_dir} already holds a run: trainer.resume=true continues it, "
                              "trainer.overwrite=true deletes it and starts over, or set another "
                              "trainer.experiment_name / trainer.default_local_dir")
    old = run_files(out_dir)
    for p in old:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    log(f"[ragen_turn] trainer.overwrite=true: deleted the previous run in {out_dir} "
        f"({', '.join(p.name for p in old)})")


def remove_if_unused(out_dir: Path) -> bool:
    """Delete ``out_dir`` when it holds nothing of a run (only Hydra's job files, or nothing): a command that
    stopped before its first step leaves no stray run directory. Returns True if it was deleted."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir() or run_files(out_dir):
        return False
    shutil.rmtree(out_dir, ignore_errors=True)
    return True
