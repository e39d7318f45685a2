"""Runs for the kill-anywhere tests, each in its own process (forked from a forkserver that has torch and the
trainer imported, so a run starts in about a second).

A run trains the micro config of tests/helpers.py for 3 steps with a checkpoint after every step and one kept;
``crash_at`` (``N`` or ``N:sigkill``) ends it at the N-th crash point of ``ragen_turn.engines.rundir``.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path
from typing import Dict, List, Optional

COMMON = ["algo=turn_ppo", "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.keep_checkpoints=1",
          "trainer.test_freq=0", "trainer.val_before_train=true"]


def train(run_dir: str, resume: bool = False, crash_at: Optional[str] = None, crash_log: Optional[str] = None,
          extra: tuple = ()) -> None:
    """One process's run (the target of :func:`run`)."""
    for name, value in (("RAGEN_TURN_CRASH_AT", crash_at), ("RAGEN_TURN_CRASH_LOG", crash_log)):
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    from helpers import micro_config
    from ragen_turn.engines.local.trainer import build_trainer

    cfg = micro_config(COMMON + list(extra) + (["trainer.resume=true"] if resume else []), run_dir=run_dir)
    build_trainer(cfg, log=lambda *a: None).fit()


_ctx = None


def context():
    global _ctx
    if _ctx is None:
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(["torch", "transformers", "ragen_turn.engines.local.trainer", "helpers",
                                     "crash_child"])
    return _ctx


def run(run_dir, timeout: float = 300, **kw) -> int:
    """:func:`train` in a fresh process; its exit code (137: crashed at the crash point, -9: SIGKILL)."""
    p = context().Process(target=train, args=(str(run_dir),), kwargs=kw)
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        raise TimeoutError(f"run in {run_dir} did not finish in {timeout} s")
    return p.exitcode


def metrics(run_dir) -> List[Dict]:
    """The metrics a run logged, without the timing ones (perf/*)."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]
