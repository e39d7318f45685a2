"""RAGEN-2's rollout filter (``rollout_filter.filter_rows``, both engines): group selection by strategy, RAGEN's top_k
floor, RAGEN's ``rollout/*`` metrics, an empty selection, and RAGEN's README command.

Hand cases below; the selection was also compared with RAGEN's own ``RolloutFilter._select_top_groups``
(mll-lab-nu/RAGEN 20daedc, ragen/trainer/rollout_filter.py) on 6,000 random score vectors over the four strategies,
both directions, include_zero and both top_p modes: the same groups every time (ties: the same kept scores).
"""
from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import TEST_DEVICE, micro_config
from ragen_turn.config import FilterSpec, kept_batch_size, kept_group_count
from ragen_turn.engines.rollout_filter import filter_rows, kept_rows, pad_rows, select_groups

ROOT = Path(__file__).resolve().parent.parent


def sel(scores, **kw):
    return select_groups(torch.tensor(scores), FilterSpec(**kw)).tolist()


# ---------------------------------------------------------------- selection
def test_top_k_floors_as_ragen():
    assert kept_group_count(8, 0.7) == 5  # RAGEN's int(0.7 x 8); rounding would keep 6
    assert [kept_group_count(10, r) for r in (0.05, 0.25, 0.5, 0.99, 1.0)] == [1, 2, 5, 9, 10]
    scores = [0.1, 0.8, 0.3, 0.7, 0.2, 0.6, 0.5, 0.4]
    assert sel(scores, value=0.7, strategy="top_k") == [1, 3, 5, 6, 7]
    assert sel(scores, value=0.7, strategy="top_k", direction="smallest") == [0, 4, 2, 7, 6]
    cfg = micro_config(["es_manager.train.env_groups=8", "es_manager.train.group_size=2",
                        "actor_rollout_ref.rollout.rollout_filter_ratio=0.7", "ppo_mini_batch_size=2"])
    assert kept_batch_size(cfg) == 10


def test_top_p_linear_keeps_groups_until_their_share_of_the_reward_std_reaches_the_value():
    scores = [0.5, 0.0, 2.0, 1.0, 0.5]  # sum 4
    assert sel(scores, value=0.5, strategy="top_p") == [2]           # 2.0 >= 0.5 x 4 - 0.01
    assert sel(scores, value=0.75, strategy="top_p") == [2, 3]       # 3.0 >= 2.99
    assert sel(scores, value=0.9, strategy="top_p") == [2, 3, 0, 4]  # 3.5 < 3.59, 4.0 >= 3.59; ties: earlier first
    assert sel(scores, value=0.9, strategy="top_p", selection_eps=0.5) == [2, 3, 0]  # 3.5 >= 3.1
    assert sel(scores, value=1.0, strategy="top_p") == [0, 1, 2, 3, 4]  # >= 1: everything, the zero group too
    assert sel([0.0, 0.0, 0.0], value=0.9, strategy="top_p") == []      # no spread anywhere: nothing to learn from
    # RAGEN's rule: a score <= 0 ends the walk, so smallest-first stops at once on a zero-spread group
    assert sel(scores, value=0.9, strategy="top_p", direction="smallest") == []
    assert sel([0.5, 2.0, 1.0], value=0.3, strategy="top_p", direction="smallest") == [0, 2]  # 1.5 >= 1.04


def test_top_p_softmax_min_p_top_k_abs_and_include_zero():
    ln3 = math.log(3.0)  # softmax [0, ln 3] = [0.25, 0.75]
    assert sel([0.0, ln3], value=0.5, strategy="top_p", top_p_prob_mode="softmax") == [1]
    assert sel([0.0, ln3], value=0.8, strategy="top_p", top_p_prob_mode="softmax") == [1, 0]
    assert sel([1.0, 2.0, 4.0], value=0.5, strategy="min_p") == [1, 2]            # >= 0.5 x 4
    assert sel([1.0, 2.0, 4.0], value=0.5, strategy="min_p", direction="smallest") == [0, 1]  # <= 1 / 0.5
    assert sel([0.3, 0.9, 0.1, 0.5], value=2, strategy="top_k_abs") == [1, 3]
    assert sel([0.3, 0.0, 0.0, 0.5], value=0.75, strategy="top_k", include_zero=False) == [3, 0]
    assert sel([0.0, 0.0], value=0.5, strategy="top_k", include_zero=False) == []
    with pytest.raises(ValueError, match="rollout_filter_strategy"):
        sel([1.0], value=0.5, strategy="top_q")


# ---------------------------------------------------------------- rows and metrics
def test_filter_rows_metrics_with_ragens_names():
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 3.0, 1.0])  # std (n - 1) 0.7071, 0, 1.4142; mean 0.5, 1, 2
    rows, m = filter_rows(groups, rewards, FilterSpec(value=0.9, strategy="top_p"))
    assert rows.tolist() == [0, 1, 4, 5]
    s2 = math.sqrt(2)
    want = {"rollout/in_group_reward_std": (s2 / 2 + s2) / 3, "rollout/chosen_in_group_reward_std": (s2 / 2 + s2) / 2,
            "rollout/in_group_reward_mean": 3.5 / 3, "rollout/chosen_in_group_reward_mean": 1.25,
            "rollout/in_group_reward_max": 5 / 3, "rollout/chosen_in_group_reward_max": 2.0,
            "rollout/in_group_reward_sum": 7 / 3, "rollout/chosen_in_group_reward_sum": 2.5,
            "rollout/in_group_std": (s2 / 2 + s2) / 3, "rollout/chosen_in_group_mean": 1.25,
            "rollout/filter_kept_count": 2.0, "rollout/filter_kept_ratio": 2 / 3, "rollout/filter_zero_count": 1.0}
    for k, v in want.items():
        assert m[k] == pytest.approx(v, rel=1e-6), k
    # nothing kept: the chosen stats are 0, as RAGEN's
    rows, m = filter_rows(groups, torch.ones(6), FilterSpec(value=0.9, strategy="top_p"))
    assert rows.tolist() == [] and m["rollout/filter_kept_ratio"] == 0.0
    assert m["rollout/chosen_in_group_reward_mean"] == 0
    assert m["rollout/filter_zero_count"] == 3.0
    # the earlier top fraction by std, now floored: the best 1 of 3 groups
    assert kept_rows(groups, rewards, 0.5, "std").tolist() == [4, 5]
    assert kept_rows(groups, rewards, 0.7, "mean").tolist() == [2, 3, 4, 5]  # int(0.7 x 3) = 2 groups by mean


def test_pad_rows_repeats_kept_rows_up_to_a_multiple():
    rows = torch.tensor([4, 5, 9])
    out = pad_rows(rows, 4, seed=0)
    assert len(out) == 4 and out[:3].tolist() == [4, 5, 9] and out[3].item() in (4, 5, 9)
    out = pad_rows(rows, 8, seed=1)
    assert len(out) == 8 and sorted(out[3:6].tolist()) == [4, 5, 9]  # each kept row once before any twice
    assert pad_rows(rows, 3, seed=0).tolist() == [4, 5, 9] and pad_rows(rows[:0], 4, seed=0).tolist() == []


# ---------------------------------------------------------------- both engines
def test_both_engines_call_the_same_filter():
    for path in ("ragen_turn/engines/local/trainer.py", "ragen_turn/engines/verl/trainer.py"):
        tree = ast.parse((ROOT / path).read_text())
        calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "filter_rows" in calls and "kept_rows" not in calls, path


def _scripted(trainer, answer):
    from ragen_turn.rollout import TextPolicy

    trainer.sampler = TextPolicy(trainer.tokenizer, lambda slot: answer(slot))


def test_local_engine_logs_the_filter_and_skips_a_step_with_nothing_kept(tmp_path):
    from ragen_turn.engines.local.trainer import build_trainer

    r = "actor_rollout_ref.rollout."
    cfg = micro_config(["env=bandit", "algo=grpo", "model.warmstart.enable=false", r + "rollout_filter_value=0.9",
                        "es_manager.train.env_groups=4", "es_manager.train.group_size=2", "ppo_mini_batch_size=2"],
                       run_dir=tmp_path)
    assert cfg.actor_rollout_ref.rollout.rollout_filter_strategy == "top_p" and kept_batch_size(cfg) is None
    lines = []
    trainer = build_trainer(cfg, log=lines.append)
    _scripted(trainer, lambda slot: "<answer>nobody</answer>")  # every episode: the same penalty, no spread
    before = [p.detach().clone() for p in trainer.actor.parameters()]
    trainer.fit()
    steps = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if "env/reward" in x]
    assert [m["rollout/empty_after_filter"] for m in steps] == [1.0, 1.0]
    assert [m["rollout/consecutive_empty_after_filter_steps"] for m in steps] == [1.0, 2.0]
    assert all(m["rollout/filter_kept_ratio"] == 0.0 and m["rollout/filter_zero_count"] == 4.0 for m in steps)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.actor.parameters()))
    assert sum("kept no env group" in x for x in lines) == 2


def test_ragen_readme_filter_command_runs(tmp_path):
    """RAGEN's README: ``actor_rollout_ref.rollout_filter_strategy=top_p
    actor_rollout_ref.rollout.rollout_filter_value=0.9``."""
    micro = ["model.hidden_size=32", "model.num_hidden_layers=1", "model.num_attention_heads=2",
             "model.num_key_value_heads=1", "model.intermediate_size=64", "model.warmstart.enable=false",
             "es_manager.train.env_groups=4", "es_manager.train.group_size=2", "es_manager.val.env_groups=2",
             "agent_proxy.max_turn=2", "ppo_mini_batch_size=2", "trainer.total_training_steps=2", "trainer.test_freq=0",
             "trainer.save_freq=0", "actor_rollout_ref.rollout.temperature=3", f"device={TEST_DEVICE}",
             f"trainer.default_local_dir={tmp_path / 'run'}"]
    res = subprocess.run(["bash", "train.sh", "frozen_lake", "grpo", "actor_rollout_ref.rollout_filter_strategy=top_p",
                          "actor_rollout_ref.rollout.rollout_filter_value=0.9", *micro],
                         cwd=ROOT, env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in steps if "rollout/filter_kept_ratio" in m]
    assert len(train) == 2 and all(0.0 <= m["rollout/filter_kept_ratio"] <= 1.0 for m in train)
    text = (tmp_path / "run" / "config.yaml").read_text()
    assert "rollout_filter_strategy: top_p" in text and "rollout_filter_ratio: 0.9" in text
