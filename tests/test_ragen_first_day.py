"""A RAGEN user's first day (issue 60): eval.sh evaluates the run's own env groups; RAGEN's eval form
(``--config-name NAME model_path=...``) works; an ``<env>`` that is not the run's stops naming both."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHON": sys.executable}
# a tiny model and a 1-step run; the warm start (copy pretraining and SFT before RL) is skipped
TINY = ["model.warmstart.enable=false", "model.copy_pretrain_steps=0", "model.hidden_size=32",
        "model.num_hidden_layers=1", "model.num_attention_heads=2", "model.num_key_value_heads=1",
        "model.intermediate_size=64",
        "trainer.total_training_steps=1", "es_manager.train.env_groups=2", "es_manager.train.group_size=2",
        "ppo_mini_batch_size=4", "es_manager.val.env_groups=2", "agent_proxy.max_turn=2", "trainer.collapse_freq=0",
        "actor_rollout_ref.rollout.response_length=8", "device=cpu"]


def sh(script, *args, cwd=ROOT):
    return subprocess.run(["bash", str(ROOT / script), *map(str, args)], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="module")
def named_runs(tmp_path_factory):
    """(name -> run dir) for a 1-step _1_bandit and _2_sokoban run."""
    out = {}
    for name in ("_1_bandit", "_2_sokoban"):
        run = tmp_path_factory.mktemp(name) / "run"
        res = sh("train.sh", "--config-name", name, *TINY, f"trainer.default_local_dir={run}")
        assert res.returncode == 0, res.stderr[-2000:]
        out[name] = (run, res.stdout)
    return out


@pytest.mark.parametrize("name,env,tag", [("_1_bandit", "bandit", "Bandit"), ("_2_sokoban", "sokoban", "CoordSokoban")])
def test_eval_sh_evaluates_the_runs_own_envs(named_runs, name, env, tag):
    run, train_out = named_runs[name]
    next_line = next(x for x in train_out.splitlines() if "next:" in x).split("next:")[1].split("#")[0].split()
    assert next_line[:3] == ["bash", "eval.sh", env]  # the line the run printed evaluates the run's env
    for args in (next_line[2:], [run]):  # with the <env> the run printed, and without one
        res = sh("eval.sh", *args)
        assert res.returncode == 0, res.stderr[-2000:]
        assert f"[eval] env={env}: held-out tags {tag} (2 episodes)" in res.stdout
        assert f"--config-name {name}" in res.stdout
        data = json.loads((run / "eval" / f"{env}_step_000001.json").read_text())
        assert data["env"] == env and data["val_tags"] == [tag] and f"val/{tag}/success" in data
        assert data["episodes"] == 2


def test_an_env_that_is_not_the_runs_stops_naming_both(named_runs):
    run, _ = named_runs["_1_bandit"]
    res = sh("eval.sh", "sokoban", run)
    assert res.returncode == 2
    assert "env=sokoban" in res.stderr and "trained on env=bandit" in res.stderr and "Bandit" in res.stderr
    assert not (run / "eval" / "sokoban_step_000001.json").exists()


def test_ragens_eval_form_with_config_name_and_model_path(named_runs, tmp_path):
    run, _ = named_runs["_2_sokoban"]
    rel = os.path.relpath(run, tmp_path)  # model_path relative to where the command is typed
    res = sh("eval.sh", "--config-name", "_2_sokoban", f"model_path={rel}", "es_manager.val.env_groups=3", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[eval] env=sokoban: held-out tags CoordSokoban (3 episodes)" in res.stdout
    bad = sh("eval.sh", "--config-name", "_1_bandit", f"model_path={run}")
    assert bad.returncode == 2 and "--config-name _1_bandit" in bad.stderr and "_2_sokoban" in bad.stderr
    missing = sh("eval.sh", "--config-name", "_2_sokoban")
    assert missing.returncode == 2 and "model_path=" in missing.stderr
    # a model directory outside any run: the named config's envs
    hf = tmp_path / "hf"
    subprocess.run(["cp", "-r", str(run / "checkpoints" / "step_000001" / "actor"), str(hf)], check=True)
    res = sh("eval.sh", "--config-name", "_2_sokoban", f"model_path={hf}", "es_manager.val.env_groups=2",
             "agent_proxy.max_turn=1", "actor_rollout_ref.rollout.response_length=8", f"trainer.runs_dir={tmp_path}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "held-out tags CoordSokoban (2 episodes)" in res.stdout
    assert json.loads((tmp_path / "eval_hf" / "eval_sokoban.json").read_text())["val_tags"] == ["CoordSokoban"]
