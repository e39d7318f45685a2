"""What both engines share: the config checks, the advantage registry's one signature, the turn critic's
targets, and what a run logs (metrics.jsonl and its resume rule)."""
from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import pytest
import torch

from ragen_turn import algos
from ragen_turn.config import kept_batch_size, validate_config
from ragen_turn.engines import advantages, rollout_filter, runlog

from helpers import micro_config

REPO = Path(__file__).resolve().parents[1]


def _batch(B=6, H=3, seed=0):
    """A Trajectory-like batch: rows of 1..H turns of 1..3 tokens, prompt/env tokens in between."""
    from ragen_turn.rollout import Trajectory
    from ragen_turn.rollout.trajectory import Episode

    g = torch.Generator().manual_seed(seed)
    eps = []
    for b in range(B):
        n = int(torch.randint(1, H + 1, (1,), generator=g))
        ids, mask, tids = [1, 1], [0, 0], [-1, -1]
        for h in range(n):
            k = int(torch.randint(1, 4, (1,), generator=g))
            ids += [2] * k + [1, 1]
            mask += [1] * k + [0, 0]
            tids += [h] * k + [-1, -1]
        rewards = torch.randn(n, generator=g).tolist()
        eps.append(Episode(token_ids=ids, response_mask=mask, turn_ids=tids, turn_rewards=rewards, group_id=b // 2,
                           env_seed=b // 2))
    batch = Trajectory.from_episodes(eps, pad_token_id=0)
    batch.values = torch.randn(batch.input_ids.shape, generator=g) * batch.response_mask
    return batch


def _inputs(batch):
    return dict(turn_rewards=batch.turn_rewards, turn_mask=batch.turn_mask, turn_ids=batch.turn_ids,
                response_mask=batch.response_mask, group_ids=batch.group_ids, values=batch.values)


def test_every_registered_estimator_has_the_one_signature():
    sigs = {name: inspect.signature(fn) for name, fn in algos.ADV_ESTIMATOR_REGISTRY.items()}
    assert set(sigs) == {"grpo", "token_gae", "bi_level_gae", "turn_gae"}
    first = next(iter(sigs.values()))
    assert all(s == first for s in sigs.values()), sigs
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in first.parameters.values())


@pytest.mark.parametrize("name", ["grpo", "token_gae", "bi_level_gae", "turn_gae"])
def test_registry_dispatch_gives_token_layout_zero_off_the_response(name):
    """Advantages on tokens; returns in the layout of the estimator's critic (per turn: the turn critic)."""
    batch = _batch()
    adv, ret = algos.get_adv_estimator_fn(name)(**_inputs(batch), config={"gamma": 0.9, "lam": 0.8})
    assert adv.shape == batch.response_mask.shape
    off = batch.response_mask == 0
    assert torch.all(adv[off] == 0)
    if algos.adv_estimator_spec(name).critic_level == "turn":
        assert ret.shape == batch.turn_mask.shape and torch.all(ret[batch.turn_mask == 0] == 0)
    else:
        assert ret.shape == batch.response_mask.shape and torch.all(ret[off] == 0)
    assert torch.isfinite(adv).all() and adv[~off].abs().sum() > 0


def test_turn_gae_estimator_is_turn_gae_over_values_at_turn_starts():
    """The pipeline (V(s_h) at turn starts, turn GAE, scatter) against a per-row hand loop."""
    batch = _batch(seed=3)
    gamma, lam = 0.9, 0.7
    adv, ret = algos.get_adv_estimator_fn("turn_gae")(**_inputs(batch),
                                                      config={"gamma": gamma, "lam": lam, "norm_adv": False})
    for b in range(batch.batch_size):
        tids = batch.turn_ids[b]
        n = int(batch.turn_mask[b].sum())
        v = [float(batch.values[b][(tids == h).nonzero()[0, 0]]) for h in range(n)]
        r = batch.turn_rewards[b, :n].tolist()
        a_next, expect = 0.0, [0.0] * n
        for h in reversed(range(n)):
            delta = r[h] + gamma * (v[h + 1] if h + 1 < n else 0.0) - v[h]
            a_next = delta + gamma * lam * a_next
            expect[h] = a_next
        for h in range(n):
            on = tids == h
            assert torch.allclose(adv[b][on], torch.tensor(expect[h]), atol=1e-5)
            assert ret[b, h].item() == pytest.approx(expect[h] + v[h], abs=1e-5)  # return_h, per turn


def test_turn_critic_targets_are_the_turn_returns_at_turn_starts():
    cfg = micro_config(["algo=turn_ppo"])
    batch = _batch(seed=5)
    advantages.compute_advantages(batch, cfg)
    mask, old, returns = advantages.critic_targets(batch, "turn")
    assert batch.returns is None and returns is batch.turn_returns  # as turn GAE gave them: no read-back
    H = batch.turn_mask.shape[1]
    tvals = algos.turn_start_values(batch.values, batch.turn_ids, H)
    _, turn_ret = algos.compute_turn_gae(advantages.normalized_turn_rewards(batch, cfg), tvals, batch.turn_mask,
                                         cfg.algorithm.gamma, cfg.algorithm.lam)
    assert torch.equal(mask, batch.turn_mask) and torch.equal(old, tvals)
    assert torch.allclose(returns, turn_ret, atol=1e-6)
    # fresh values are read in the same layout; the token critic's targets are the tokens' own
    assert torch.equal(advantages.critic_values(batch.values, batch, "turn"), tvals)
    advantages.compute_advantages(batch, micro_config(["algo=token_ppo"]))
    assert batch.turn_returns is None
    mask, old, returns = advantages.critic_targets(batch, "token")
    assert mask is batch.response_mask and old is batch.values and returns is batch.returns
    with pytest.raises(ValueError, match="critic.level=none"):
        advantages.critic_targets(batch, "none")


@pytest.mark.parametrize("algo,key,value,fine", [
    ("turn_ppo", "trainer", "turn", True), ("turn_ppo", "critic_level", "turn", True),
    ("token_ppo", "trainer", "starpo", True), ("grpo", "critic_level", "none", True),
    ("turn_is", "trainer", "turn", False), ("st_ppo", "trainer", "turn", False),
    ("turn_ppo", "trainer", "starpo", False),
    ("turn_ppo", "critic_level", "token", False), ("grpo", "critic_level", "token", False)])
def test_removed_algo_keys_are_ignored_when_they_agree_and_stop_when_not(algo, key, value, fine, capsys):
    """An old config's algo keys (the trainer class, the critic level) compose still: a value the estimator's
    registry entry implies is ignored with a note naming what replaced the key; another one stops with that
    message."""
    from ragen_turn import config as config_mod

    config_mod._noted.clear()
    cfg = micro_config([f"algo={algo}", f"algo.{key}={value}"])
    if fine:
        validate_config(cfg)
        validate_config(cfg)
        err = capsys.readouterr().err
        assert err.count(f"algo.{key}={value} is ignored (removed:") == 1, err  # one note per process
        assert "algorithm.adv_estimator" in err
    else:
        with pytest.raises(ValueError, match=rf"algo\.{key}={value}: this key was removed and .*"
                                             rf"algorithm.adv_estimator={cfg.algorithm.adv_estimator}"):
            validate_config(cfg)


@pytest.mark.parametrize("algo", ["grpo", "token_ppo", "bi_level_gae", "turn_ppo", "st_ppo", "so_grpo"])
def test_the_critic_level_is_the_estimators_registry_entry(algo):
    cfg = micro_config([f"algo={algo}"])
    assert cfg.critic.level == algos.adv_estimator_spec(cfg.algorithm.adv_estimator).critic_level
    assert "critic_level" not in (REPO / "config" / "algo" / f"{algo}.yaml").read_text()


def test_kept_batch_size_is_what_the_filter_keeps():
    cfg = micro_config(["es_manager.train.env_groups=5", "es_manager.train.group_size=3",
                        "actor_rollout_ref.rollout.rollout_filter_ratio=0.5", "ppo_mini_batch_size=3"])
    groups = torch.arange(5).repeat_interleave(3)
    rewards = torch.randn(15, generator=torch.Generator().manual_seed(0))
    # 5 x 0.5 = 2.5 groups rounds (half to even) to 2: the config check and the filter agree
    assert len(rollout_filter.kept_rows(groups, rewards, 0.5, "std")) == kept_batch_size(cfg) == 6


def test_metrics_log_and_its_resume_rule(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for step in range(4):
        runlog.append_metrics(path, {"step": step, "x": float("nan") if step == 1 else float(step),
                                     "n": torch.tensor(2.0)})
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [ln["step"] for ln in lines] == [0, 1, 2, 3] and lines[1]["x"] is None and lines[0]["n"] == 2.0
    runlog.truncate_metrics(path, 2)  # resumed from the step-2 checkpoint: lines of steps 0..2 stay
    assert [json.loads(ln)["step"] for ln in path.read_text().splitlines()] == [0, 1, 2]
    runlog.truncate_metrics(path, 0)  # a fresh run: no old lines
    assert not path.exists()
    runlog.truncate_metrics(path, 3)  # nothing to truncate
    assert not path.exists()


def test_progress_line_shows_missing_and_nan_as_dash():
    line = runlog.progress_line({"step": 3, "env/reward": 1.5, "env/success": math.nan, "val/success": 0.25,
                                 "val/reward": 2.0, "val/invalid_action_rate": 0.0})
    assert line.startswith("step    3") and "reward 1.500" in line and "success -" in line
    assert "| val success 0.250" in line


# ------------------------------------------------------------------------------------------------
# reward normalisation (RAGEN's rule)
# ------------------------------------------------------------------------------------------------
def _norm_cfg(method, grouping="state", turn_scores=True):
    return micro_config([f"agent_proxy.reward_normalization.method={method}",
                         f"agent_proxy.reward_normalization.grouping={grouping}",
                         f"agent_proxy.use_turn_scores={str(turn_scores).lower()}"])


def _episodes_batch(returns_per_turn, group_ids):
    from ragen_turn.rollout import Trajectory
    from ragen_turn.rollout.trajectory import Episode

    eps = []
    for rewards, g in zip(returns_per_turn, group_ids):
        ids, mask, tids = [1], [0], [-1]
        for h in range(len(rewards)):
            ids += [2, 1]
            mask += [1, 0]
            tids += [h, -1]
        eps.append(Episode(token_ids=ids, response_mask=mask, turn_ids=tids, turn_rewards=list(rewards), group_id=g,
                           env_seed=g))
    return Trajectory.from_episodes(eps, pad_token_id=0)


def test_mean_std_with_one_episode_per_group_leaves_rewards_alone():
    """G = 1 (the papers' batch design): RAGEN normalises nothing when no group has two episodes; the old rule
    divided by std + 1e-6 = 1e-6 and gave [-1e5, -1e5, 2e5]-sized rewards."""
    batch = _episodes_batch([[-0.1, -0.1, 10.9], [-0.1, 1.0]], [0, 1])
    out = advantages.normalized_turn_rewards(batch, _norm_cfg("mean_std"))
    assert torch.allclose(out, batch.turn_rewards)
    assert float(out.abs().max()) < 11


def test_mean_std_zero_for_groups_without_spread():
    # group 0: equal returns 10.7 reached by float sums that differ in the 7th digit; group 1: spread; group 2: one
    batch = _episodes_batch([[10.9, -0.1, -0.1], [-0.1, -0.1, 10.9], [1.0], [3.0], [5.0]], [0, 0, 1, 1, 2])
    R = batch.turn_rewards.sum(dim=1)
    assert R[0] != R[1] and abs(float(R[0] - R[1])) < 2e-6
    out = advantages.normalized_turn_rewards(batch, _norm_cfg("mean_std"))
    ret = out.sum(dim=1)
    assert ret[:2].tolist() == [0.0, 0.0]  # std <= 1e-6: zeros (not 0.5 and 0)
    s = math.sqrt(2.0)  # sample std of (1, 3)
    assert ret[2:4].tolist() == pytest.approx([-1 / (s + 1e-6), 1 / (s + 1e-6)], rel=1e-5)
    assert ret[4].item() == 0.0  # a one-episode group in a batch with larger groups: no spread, zero
    assert torch.all(out[:2] == 0)  # every turn reward of a flat group is 0, not only the return
    out_mean = advantages.normalized_turn_rewards(batch, _norm_cfg("mean"))
    assert out_mean.sum(dim=1)[2:].tolist() == pytest.approx([-1.0, 1.0, 0.0], abs=1e-5)


def test_mean_std_over_the_batch_and_equal_returns():
    batch = _episodes_batch([[1.0], [1.0], [1.0]], [0, 1, 2])
    out = advantages.normalized_turn_rewards(batch, _norm_cfg("mean_std", grouping="batch"))
    assert torch.all(out == 0)  # one group of three equal returns
    batch = _episodes_batch([[1.0, 1.0], [0.0]], [0, 1])
    out = advantages.normalized_turn_rewards(batch, _norm_cfg("mean_std", grouping="batch", turn_scores=False))
    ret = out.sum(dim=1)
    assert ret.tolist() == pytest.approx([1 / (math.sqrt(2) + 1e-6), -1 / (math.sqrt(2) + 1e-6)], rel=1e-5)
    assert out[0, 0].item() == 0.0  # use_turn_scores=false: the return sits on the last turn
