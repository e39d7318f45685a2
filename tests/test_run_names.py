"""Run names: the command line's overrides that change a run are in its directory name (Hydra's override_dirname
without run-control keys), so the README's usage lines never collide; resume / overwrite / logging keys are not."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import MICRO_MODEL

from ragen_turn.compose import MAX_SUFFIX, compose_config, run_name_suffix

ROOT = Path(__file__).resolve().parent.parent


def _dir(*overrides: str) -> str:
    return str(compose_config(["env=sokoban", "algo=turn_ppo", *overrides]).trainer.default_local_dir)


def test_overrides_that_change_the_run_are_in_its_name():
    main = _dir()
    assert main == "runs/sokoban_turn_ppo_tiny_s0"
    assert _dir("algorithm.lam=1.0", "algorithm.gamma=0.95") == main + "_algorithm.gamma=0.95,algorithm.lam=1.0"
    # run control: the same run, continued or started over, checkpointed or logged differently
    for o in ("trainer.resume=true", "trainer.overwrite=true", "trainer.time_budget_s=60", "trainer.save_freq=5",
              "trainer.test_freq=5", "trainer.keep_checkpoints=1", "wandb.mode=online", "logger=wandb",
              "trainer.total_training_steps=60", "trainer.resume_from=last_good",
              "trainer.max_nonfinite_steps=1"):
        assert _dir(o) == main, o
    assert _dir("seed=3") == "runs/sokoban_turn_ppo_tiny_s3" and _dir("algo=grpo") == "runs/sokoban_grpo_tiny_s0"
    assert _dir("seed.train=7") == "runs/sokoban_turn_ppo_tiny_s7"  # RAGEN's seed key: in the name as s7 only


def test_suffix_is_a_safe_file_name_of_bounded_length():
    assert run_name_suffix("") == ""
    assert run_name_suffix("model.path=/models/Qwen 2") == "_model.path=_models_Qwen_2"
    long_a, long_b = ",".join(f"k{i}=1" for i in range(60)), ",".join(f"k{i}=2" for i in range(60))
    a, b = run_name_suffix(long_a), run_name_suffix(long_b)
    assert len(a) == MAX_SUFFIX + 1 and a != b  # cut, and the hash of the whole list tells them apart
    assert re.fullmatch(r"_[A-Za-z0-9._=,+\-]+", a)


def _readme_usage_lines():
    text = (ROOT / "README.md").read_text()
    block = text.split("## Usage", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [ln.split("#", 1)[0].split() for ln in block.splitlines() if ln.startswith("bash train.sh")]


def test_readme_usage_lines_get_their_own_run_dirs():
    lines = _readme_usage_lines()
    assert len(lines) >= 5
    dirs = {}
    for words in lines:
        if words[2] == "--config-name":  # RAGEN's named runs: bash train.sh --config-name _2_sokoban ...
            cfg = compose_config(words[4:], config_name=words[3])
        else:
            _, _, env, algo, *overrides = words
            cfg = compose_config([f"env={env}", f"algo={algo}", *overrides])
        dirs[" ".join(words)] = str(cfg.trainer.default_local_dir)
    main = "runs/sokoban_turn_ppo_tiny_s0"
    same = [cmd for cmd, d in dirs.items() if d == main]
    assert all("trainer.resume=true" in c or "trainer.overwrite=true" in c for c in same), same
    others = [d for cmd, d in dirs.items() if d != main]
    assert len(others) == len(set(others)), dirs


def test_the_hydra_app_names_runs_the_same_way(tmp_path):
    """Inside ``@hydra.main`` (train.sh's path) the suffix comes from Hydra's own override_dirname."""
    script = tmp_path / "task.py"
    script.write_text(
        "import hydra\n"
        "import ragen_turn.compose as t\n"
        "@hydra.main(config_path=t.CONFIG_DIR, config_name='base', version_base='1.3')\n"
        "def main(cfg):\n"
        "    print('DIR', cfg.trainer.default_local_dir)\n"
        "main()\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, str(script), "env=sokoban", "algo=turn_ppo", "algorithm.gamma=0.95",
                          "trainer.resume=true", "hydra.run.dir=" + str(tmp_path / "h")], cwd=tmp_path, env=env,
                         text=True, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "DIR runs/sokoban_turn_ppo_tiny_s0_algorithm.gamma=0.95" in out.stdout


def _train(runs: Path, *extra: str) -> subprocess.CompletedProcess:
    """``python -m ragen_turn.train`` (train.sh's command), its run dir named by the run name in ``runs``."""
    micro = [*MICRO_MODEL, "es_manager.train.env_groups=2", "es_manager.train.group_size=2",
             "ppo_mini_batch_size=2", "micro_batch_size_per_gpu=2", "es_manager.val.env_groups=2",
             "agent_proxy.max_turn=2", "actor_rollout_ref.rollout.response_length=8", "device=cpu"]
    env = dict(os.environ, RAGEN_TURN_RUNS_DIR=str(runs))
    cmd = [sys.executable, "-m", "ragen_turn.train", "env=sokoban", "algo=grpo", *micro, *extra]
    out = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-1500:]
    return out


def test_the_run_already_complete_hint_continues_the_run_it_names(tmp_path):
    """Follow the hint as printed: a 1-step run, its resume says complete and writes nothing, the hinted
    command trains step 2 in the same run directory (the step count and the logger are not part of the
    name)."""
    runs = tmp_path / "runs"
    _train(runs, "trainer.total_training_steps=1", "trainer.save_freq=1")
    (run,) = list(runs.iterdir())
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*")
             if p.is_file() and "hydra" not in p.relative_to(run).parts and p.name != "run.lock"}
    again = _train(runs, "trainer.total_training_steps=1", "trainer.resume=true").stdout
    assert "run already complete" in again
    hint = re.search(r"to train on: (?:the same command with )?(trainer\.total_training_steps=<more than 1> "
                     r"trainer\.resume=true)", again)
    assert hint, again[-800:]
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}
    assert after == files  # the no-op resume rewrote nothing: config.yaml, configs.jsonl, metrics, ckpts
    _train(runs, *hint.group(1).replace("<more than 1>", "2").split(), "logger=console")
    assert [p.name for p in runs.iterdir()] == [run.name]  # no second run directory
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2], steps
    starts = [json.loads(line)["step"] for line in (run / "configs.jsonl").read_text().splitlines()]
    assert starts == [0, 1]  # the first start and the resume at step 1, nothing from the no-op resume
