"""What a newcomer meets: errors that name the key or the fix before any work, run directories that are never
mixed or left behind, the end-of-run summary, 'run already complete', and train.sh before install."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_turn.config import validate_config
from ragen_turn.engines.local.trainer import build_trainer
from ragen_turn.engines.rundir import clear_earlier_run, remove_if_unused, take_run_dir
from ragen_turn.compose import compose_config

from helpers import micro_config

ROOT = Path(__file__).resolve().parent.parent


def _quiet(*_):
    pass


@pytest.mark.parametrize("override,message", [
    ("+algorithm.gama=0.9", "algorithm.gama: unknown key.*gamma"),
    ("+trainer.total_steps=5", "trainer.total_steps: unknown key"),
    ("model=hf", "model.path is required for model=hf"),
    ("logger=tensorboard", "logger must be one of"),
])
def test_bad_keys_are_refused_naming_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        validate_config(compose_config(["env=sokoban", "algo=turn_ppo", override]))


def test_the_schema_knows_every_shipped_config_and_the_eval_extras():
    from ragen_turn.schema import check_schema

    for overrides in (["model=hf", "model.path=/x"], ["env=webshop", "algo=st_ppo"], ["+sweep=gamma_lambda"],
                      ["+paper=turnppo_webshop_qwen2.5-3b", "model.path=/x"], ["engine=verl", "model.path=/x"],
                      ["+checkpoint=/x", "+eval_output=/y"], ["+custom_envs.MyTag.env_type=sokoban"]):
        try:  # nothing shipped, documented or user-tagged is an unknown key (a path that is not there may be refused)
            check_schema(compose_config(overrides))
        except ValueError as e:
            assert "unknown key" not in str(e), (overrides, str(e))


def test_wandb_missing_is_reported_before_any_work(monkeypatch):
    import ragen_turn.config as config

    monkeypatch.setattr(config, "find_spec", lambda name: None if name == "wandb" else object())
    with pytest.raises(ValueError, match="logger=wandb needs the wandb package.*install.sh"):
        validate_config(compose_config(["logger=wandb"]))


def test_overwrite_deletes_the_old_run_and_keeps_hydras_files(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000010").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "eval_sokoban.json").write_text("{}")
    (run / "hydra").mkdir()
    said = []
    clear_earlier_run(run, log=said.append)
    assert sorted(p.name for p in run.iterdir()) == ["hydra"] and "deleted the previous run" in said[0]
    assert remove_if_unused(run) and not run.exists()  # nothing of a run left: the directory goes too


def test_take_run_dir_clears_an_earlier_run_on_overwrite_and_keeps_it_on_resume(tmp_path):
    """What both engines' trainers call first (the verl launch kept an earlier run's files on overwrite before)."""
    run = tmp_path / "run"
    for extra, kept in ((["trainer.resume=true", "trainer.overwrite=true"], True), (["trainer.overwrite=true"], False)):
        (run / "checkpoints" / "global_step_10").mkdir(parents=True, exist_ok=True)
        (run / "metrics.jsonl").write_text('{"step": 0}\n')
        said = []
        lock = take_run_dir(micro_config(extra, run_dir=str(run)), log=said.append)
        assert (run / "metrics.jsonl").exists() == kept and (run / "checkpoints").exists() == kept, extra
        assert (run / "run.lock").exists() and any("deleted the previous run" in x for x in said) != kept
        lock.release()


def test_a_run_on_the_dev_seeds_calls_its_numbers_dev_not_held_out(tmp_path):
    lines = []
    build_trainer(micro_config(["algo=turn_ppo", "trainer.total_training_steps=0", "es_manager.val.seeds=dev"],
                               run_dir=tmp_path), log=lines.append).fit()
    text = "\n".join(lines)
    assert "dev evaluation before RL" in text and "dev success (2 episodes):" in text
    assert "held-out success" not in text and "held-out evaluation before RL" not in text
    assert "held-out eval " not in text


def test_finished_run_ends_with_a_summary_and_a_resume_says_complete(tmp_path):
    cfg = micro_config(["algo=turn_ppo", "trainer.total_training_steps=1"], run_dir=tmp_path)
    lines = []
    last = build_trainer(cfg, log=lines.append).fit()
    text = "\n".join(lines)
    assert "step    1/1" in text and "[ragen_turn] done:" in text
    for part in ("held-out success (2 episodes):", "at step 0 (before RL) ->", f"checkpoint: {tmp_path}",
                 f"metrics:    {tmp_path / 'metrics.jsonl'}", f"bash eval.sh sokoban {tmp_path}",
                 f"-m ragen_turn.report {tmp_path}"):
        assert part in text, part
    assert "held-out score" not in text  # Sokoban reports no score
    s = last["summary"]
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert s["init"] == rows[0]["val/success"] and s["last"] == rows[-1]["val/success"] and s["steps"] == 1
    again = []
    out = build_trainer(micro_config(["algo=turn_ppo", "trainer.total_training_steps=1", "trainer.resume=true"],
                                     run_dir=tmp_path), log=again.append).fit()
    assert any("run already complete" in ln for ln in again) and out["summary"]["last"] == s["last"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == len(rows)  # nothing trained or logged


def test_summary_adds_webshops_score_and_return_when_the_env_reports_a_score(tmp_path):
    from ragen_turn.engines.runlog import run_summary

    rows = [{"step": 0, "val/success": 0.0, "val/score": 0.164, "val/reward": -0.152}, {"step": 1, "env/reward": 0.1},
            {"step": 2, "val/success": 0.097, "val/score": 0.374, "val/reward": 0.181}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text, summary = run_summary(micro_config(["env=webshop"], run_dir=tmp_path), tmp_path)
    assert "held-out score: 0.164 at step 0 -> 0.374 at step 2" in text
    assert "held-out reward: -0.152 at step 0 -> 0.181 at step 2" in text and summary["last"] == 0.097


def test_refused_command_leaves_no_run_dir(tmp_path):
    run = tmp_path / "runs" / "x"
    out = subprocess.run([sys.executable, "-m", "ragen_turn.train", "env=sokoban", "algo=turn_ppo",
                          "+algorithm.gama=0.9", f"trainer.default_local_dir={run}"],
                         cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert out.returncode == 2 and "algorithm.gama: unknown key" in out.stderr
    assert not run.exists()


def test_train_sh_usage_lists_every_env_and_algo_config():
    """``bash train.sh`` alone: the usage names each config/env and config/algo choice (read from the folders, so a
    new algorithm's YAML is listed without editing train.sh)."""
    out = subprocess.run(["bash", "train.sh"], cwd=ROOT, text=True, capture_output=True, timeout=60)
    assert out.returncode == 2
    first = out.stderr.splitlines()[0]
    env_part, algo_part = first.split("<algo: ")
    for group, part in (("env", env_part), ("algo", algo_part)):
        names = sorted(p.stem for p in (ROOT / "config" / group).glob("*.yaml"))
        assert names and all(f"{n}|" in part or f"{n}>" in part for n in names), (group, names, first)


def test_train_sh_before_install_says_to_install(tmp_path):
    """A fresh clone with no .venv and a Python without the packages: the hint, not a ModuleNotFoundError."""
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    for f in ("train.sh", "eval.sh", "scripts/python.sh"):
        shutil.copy(ROOT / f, clone / f)
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    env = dict(os.environ, PYTHON=str(bare / "bin" / "python"))
    env.pop("PYTHONPATH", None)
    for cmd in (["bash", "train.sh", "sokoban", "turn_ppo"], ["bash", "eval.sh", "sokoban", "runs/x"]):
        out = subprocess.run(cmd, cwd=clone, env=env, text=True, capture_output=True, timeout=60)
        assert out.returncode == 2 and "run bash scripts/install.sh first" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_eval_sh_reads_a_run_whose_name_holds_overrides(tmp_path):
    """Run names carry their overrides ('=' and ','); eval.sh quotes the path for Hydra's grammar and Hydra writes
    no run dir of its own for the evaluation."""
    plain = tmp_path / "runs" / "plain"
    build_trainer(micro_config(["algo=grpo", "trainer.total_training_steps=1"], run_dir=plain), log=_quiet).fit()
    run = plain.rename(plain.with_name("sokoban_turn_ppo_tiny_s0_algorithm.gamma=0.95,algorithm.lam=1.0"))
    out = subprocess.run(["bash", "eval.sh", "sokoban", str(run), "es_manager.val.env_groups=2", "device=cpu",
                          "agent_proxy.max_turn=2", "actor_rollout_ref.rollout.response_length=8"],
                         cwd=ROOT, text=True, capture_output=True, timeout=300,
                         env=dict(os.environ, RAGEN_TURN_RUNS_DIR=str(tmp_path / "runs")))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| model | episodes | success" in out.stdout
    # the JSON goes into the run dir, not into the checkpoint (a model directory eval only reads)
    assert (run / "eval" / "sokoban_step_000001.json").is_file()
    assert not list((run / "checkpoints").rglob("eval_*.json"))
    # no run dir named after eval's overrides
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [run.name]
    # a plain Hugging Face model dir (e.g. a cached warm start), read-only: the JSON goes under the runs dir, or --out
    hf = tmp_path / "models" / "some_model"
    shutil.copytree(run / "checkpoints" / "step_000001" / "actor", hf)
    hf.chmod(0o555)
    try:
        small = ["es_manager.val.env_groups=2", "device=cpu", "agent_proxy.max_turn=2",
                 "actor_rollout_ref.rollout.response_length=8"]
        env = dict(os.environ, RAGEN_TURN_RUNS_DIR=str(tmp_path / "runs"))
        out = subprocess.run(["bash", "eval.sh", "sokoban", str(hf), *small], cwd=ROOT, text=True, capture_output=True,
                             timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        assert (tmp_path / "runs" / "eval_some_model" / "eval_sokoban.json").is_file()
        assert not list(tmp_path.joinpath("models").rglob("eval_*.json"))
        assert "| some_model |" in out.stdout
        out = subprocess.run(["bash", str(ROOT / "eval.sh"), "sokoban", str(hf), "--out", "mine/e.json", *small],
                             cwd=tmp_path, text=True, capture_output=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        assert (tmp_path / "mine" / "e.json").is_file()  # relative to where the command was typed
    finally:
        hf.chmod(0o755)
