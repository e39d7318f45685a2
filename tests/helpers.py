"""Shared test helpers: a micro config and the tiny tokenizer."""
from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile

from ragen_turn.compose import compose_config

MICRO_MODEL = ["model.hidden_size=32", "model.num_hidden_layers=1", "model.num_attention_heads=2",
               "model.num_key_value_heads=1", "model.intermediate_size=64", "model.warmstart.enable=false",
               "model.copy_pretrain_steps=0"]


# a 1-step run of the micro model through train.sh / eval.sh (RAGEN's named configs and the like)
ONE_STEP_RUN = MICRO_MODEL + [
    "trainer.total_training_steps=1", "es_manager.train.env_groups=2", "es_manager.train.group_size=2",
    "ppo_mini_batch_size=4", "es_manager.val.env_groups=2", "agent_proxy.max_turn=2", "trainer.collapse_freq=0",
    "actor_rollout_ref.rollout.response_length=8", "device=cpu"]


def sh(script, *args, cwd=None, timeout=900):
    """``bash <repo>/<script> args...`` with this interpreter as PYTHON; the CompletedProcess (text, captured)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    return subprocess.run(["bash", str(root / script), *map(str, args)], cwd=cwd or root,
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=timeout)


# RAGEN_TURN_TEST_DEVICE=cuda runs the engine tests on a GPU (CI has none: cpu)
TEST_DEVICE = os.environ.get("RAGEN_TURN_TEST_DEVICE", "cpu")


_RUN_ROOT = []  # one directory per process for the run dirs micro_config makes; removed when the process ends


def new_run_dir() -> str:
    """A fresh run directory for a test that names none; all of them go when the test process ends (tests used
    to leave one ``/tmp/ragen_turn_test_run_*`` per call)."""
    if not _RUN_ROOT:
        _RUN_ROOT.append(tempfile.mkdtemp(prefix="ragen_turn_test_runs_"))
        atexit.register(shutil.rmtree, _RUN_ROOT[0], ignore_errors=True)
    return tempfile.mkdtemp(prefix="run_", dir=_RUN_ROOT[0])


def micro_config(overrides=(), run_dir=None):
    """A config small enough for CPU tests: 2 groups x 2 rollouts, 2 turns, a 40k-parameter model
    (unless the overrides pick another ``model=``)."""
    other_model = any(o.startswith("model=") for o in overrides)
    base = ([] if other_model else MICRO_MODEL) + [
        "es_manager.train.env_groups=2", "es_manager.train.group_size=2", "es_manager.val.env_groups=2",
        "agent_proxy.max_turn=2", "actor_rollout_ref.rollout.response_length=8", "ppo_mini_batch_size=2",
        "micro_batch_size_per_gpu=2", "trainer.total_training_steps=2", "trainer.test_freq=0", "trainer.save_freq=0",
        f"device={TEST_DEVICE}",
    ]
    if run_dir is None:  # never the repo's runs/: a trainer built here writes config.yaml and resets metrics.jsonl
        run_dir = new_run_dir()
    base.append(f"trainer.default_local_dir={run_dir}")
    return compose_config(base + list(overrides))


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    from ragen_turn.models import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(dict(name="tiny", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=64))
    return tok


def metrics_rows(run_dir) -> list:
    """Every line of ``<run_dir>/metrics.jsonl``, parsed."""
    import json
    from pathlib import Path

    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def resume_vs_uninterrupted(tmp_path, common, stop_at: int):
    """The same micro run twice: uninterrupted (``tmp_path/full``), and stopped after step ``stop_at`` then resumed
    by a fresh trainer (``tmp_path/part``, as a killed run restarted). ``common`` must set the total steps and
    ``trainer.save_freq=1``. Returns (full trainer, resumed trainer, full's metrics rows, part's)."""
    from ragen_turn.engines.local.trainer import build_trainer

    def quiet(*a, **k):
        pass

    full = build_trainer(micro_config(common, run_dir=tmp_path / "full"), log=quiet)
    full.fit()
    part = build_trainer(micro_config(list(common) + [f"trainer.total_training_steps={stop_at}"],
                                      run_dir=tmp_path / "part"), log=quiet)
    part.fit()
    resumed = build_trainer(micro_config(list(common) + ["trainer.resume=true"], run_dir=tmp_path / "part"), log=quiet)
    assert resumed.step == stop_at
    resumed.fit()
    return full, resumed, metrics_rows(tmp_path / "full"), metrics_rows(tmp_path / "part")
