"""Value-target normalisation (``critic.target_norm``, ``algos/value_norm.py``): the running stats by hand, the
local engine against a loop reference, micro-batch invariance and resume with it on (the verl engine's driver:
tests/test_verl.py ``test_target_norm_with_fake_workers``)."""
import json
import math

import pytest
import torch
from omegaconf import open_dict

from ragen_turn.algos import ValueNorm, explained_variance
from ragen_turn.algos.value_norm import MIN_STD
from ragen_turn.engines.advantages import normalised_critic_batch, realised_returns

from helpers import micro_config, resume_vs_uninterrupted
from test_critic_quality import hand_batch


def _quiet(*a, **k):
    pass


def test_running_stats_by_hand():
    n = ValueNorm(beta=0.5)
    assert tuple(n.stats()) == (0.0, 1.0)  # the identity before any target
    x = torch.tensor([[1.0, 3.0, 100.0]])
    prev = n.update(x, torch.tensor([[1.0, 1.0, 0.0]]))  # the masked 100 does not count
    assert tuple(prev) == (0.0, 1.0)
    # debiased: m = 0.5 * 2, s = 0.5 * 5, d = 0.5 -> mean 2, E[x^2] 5, var 1
    assert n.stats().mean == pytest.approx(2.0) and n.stats().std == pytest.approx(1.0)
    n.update(torch.tensor([5.0]), torch.tensor([1.0]))
    # m = 0.25 * 2 + 0.5 * 5 = 3, s = 0.25 * 5 + 0.5 * 25 = 13.75, d = 0.75: mean 4, var 18.333 - 16
    assert n.stats().mean == pytest.approx(4.0) and n.stats().std == pytest.approx(math.sqrt(55 / 3 - 16))
    y = n.normalize(torch.tensor([4.0, 5.5]))
    torch.testing.assert_close(y, torch.tensor([0.0, 1.5 / math.sqrt(7 / 3)]))
    torch.testing.assert_close(n.denormalize(y), torch.tensor([4.0, 5.5]))
    n.update(torch.tensor([9.0]), torch.tensor([0.0]))  # nothing masked in: no change
    assert n.stats().mean == pytest.approx(4.0)
    same = ValueNorm(beta=0.0)
    same.update(torch.full((3,), 2.0), torch.ones(3))
    assert tuple(same.stats()) == (pytest.approx(2.0), MIN_STD)  # one value: the std floor
    back = ValueNorm(beta=0.5)
    back.load_state_dict(n.state_dict())
    assert back.stats() == n.stats()
    with pytest.raises(ValueError, match="target_norm_beta"):
        ValueNorm(beta=1.0)


def test_normalised_critic_batch_by_hand():
    """The turn critic's batch: values (the critic's outputs at rollout time) at the stats before the update, the
    targets at the stats after it; the caller's batch unchanged."""
    b = hand_batch()
    b.values = torch.full((2, 8), 3.0) * b.response_mask
    b.turn_returns = torch.tensor([[2.0, 4.0], [6.0, 0.0]])
    n = ValueNorm(beta=0.0)  # the last batch's stats only
    n.update(torch.tensor([1.0, 5.0]), torch.ones(2))  # before: mean 3, std 2
    cb, m = normalised_critic_batch(n, b, "turn")
    # after: the targets 2, 4, 6 (the padded turn's 0 masked out): mean 4, std sqrt(8 / 3)
    sd = math.sqrt(8 / 3)
    assert m == {"critic/target_mean": pytest.approx(4.0), "critic/target_std": pytest.approx(sd)}
    torch.testing.assert_close(cb.turn_returns, torch.tensor([[-2 / sd, 0.0], [2 / sd, 0.0]]))
    assert not cb.values.any()  # (3 - 3) / 2 on the response tokens, 0 elsewhere
    assert (b.values[b.response_mask.bool()] == 3.0).all() and b.turn_returns[0, 0] == 2.0
    b.returns = torch.arange(16.0).view(2, 8) * b.response_mask  # the token critic: every response token
    cb, _ = normalised_critic_batch(ValueNorm(beta=0.0), b, "token")
    G = b.returns[b.response_mask.bool()]
    mu, sd = float(G.mean()), float(G.std(unbiased=False))
    torch.testing.assert_close(cb.returns, (b.returns - mu) / sd * b.response_mask)
    torch.testing.assert_close(cb.values, b.values)  # identity before the first update


def _norm_trainer(tmp_path, algo, *extra):
    from ragen_turn.engines.local.trainer import build_trainer

    from test_local_engine import uneven_policy

    cfg = micro_config([f"algo={algo}", "critic.target_norm=true", "critic.target_norm_beta=0.5",
                        "es_manager.train.env_groups=4", "es_manager.train.group_size=2", "agent_proxy.max_turn=3",
                        "ppo_mini_batch_size=8", "algorithm.gamma=0.9", *extra], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    tr.sampler = uneven_policy(tr.tokenizer)
    return tr


@pytest.mark.parametrize("algo", ["turn_ppo", "token_ppo"])
def test_local_engine_equals_a_loop_reference(algo, tmp_path):
    """With stats in place (mean 1.5, std 2) and a critic that predicts something: the scored values are the
    critic's outputs de-normalised; ``critic/explained_var`` is on the raw scale; the critic's loss is the clipped
    value loss, by loops, on (G - mean') / std' (the stats after taking this batch's targets) around the critic's
    own outputs at scoring time; the held-out explained variance is on the raw scale too."""
    tr = _norm_trainer(tmp_path, algo, "es_manager.val.env_groups=4")
    tr.value_norm.load_state_dict({"m": 0.75, "s": 0.5 * (4 + 1.5 ** 2), "d": 0.5})
    assert tuple(tr.value_norm.stats()) == (pytest.approx(1.5), pytest.approx(2.0))
    torch.manual_seed(0)
    with torch.no_grad():
        tr.critic.value_head.weight.normal_(0, 0.1)
    batch = tr.rollout(0)
    tr.score(batch)
    tr.compute_advantages(batch)
    raw = tr._forward_all(lambda ids, am, pos, _: tr.critic(ids, am, pos), batch)  # outputs after each token
    turn = algo == "turn_ppo"
    G = batch.turn_returns if turn else batch.returns
    pos, out, ret = [], [], []  # each target's (row, token) where V is read, the critic's output there, its target
    for b in range(batch.batch_size):
        for t in range(1, batch.input_ids.shape[1]):
            if batch.response_mask[b, t] != 1 or (turn and batch.response_mask[b, t - 1] == 1):
                continue
            assert batch.values[b, t] == pytest.approx(float(raw[b, t - 1]) * 2.0 + 1.5, rel=1e-5, abs=1e-5)
            pos.append((b, t))
            out.append(float(raw[b, t - 1]))
            ret.append(float(G[b, int(batch.turn_ids[b, t])] if turn else G[b, t]))
    v_raw = torch.tensor(out) * 2.0 + 1.5
    r = torch.tensor(ret)
    metrics = {"critic/explained_var": explained_variance(*tr.value_targets(batch))}
    assert metrics["critic/explained_var"] == pytest.approx(explained_variance(v_raw, r, torch.ones_like(r)),
                                                             rel=1e-4, abs=1e-6)
    # the critic's batch: the stats take this batch's targets (beta 0.5 on the state above), by hand
    r64 = r.double()
    m1, s1, d1 = 0.5 * 0.75 + 0.5 * float(r64.mean()), 0.5 * 3.125 + 0.5 * float((r64 ** 2).mean()), 0.75
    mu, sd = m1 / d1, max(math.sqrt(s1 / d1 - (m1 / d1) ** 2), MIN_STD)
    cb, m = normalised_critic_batch(tr.value_norm, batch, tr.cfg.critic.level)
    assert m["critic/target_mean"] == pytest.approx(mu) and m["critic/target_std"] == pytest.approx(sd)
    with torch.no_grad():  # a nudge of the critic, so some values move past the clip
        tr.critic.value_head.weight.add_(0.1 * torch.randn_like(tr.critic.value_head.weight))
    new = tr._forward_all(lambda ids, am, pos, _: tr.critic(ids, am, pos), batch)
    y = torch.tensor([float(new[b, t - 1]) for b, t in pos])
    old, g = torch.tensor(out), (r - mu) / sd
    moved = (y - old).abs()
    c = float(moved.min()) / 2  # every value moves past the clip: the clip binds where it moved toward its target
    with open_dict(tr.cfg):
        tr.cfg.critic.cliprange_value = c
    per = [max((yi - gi) ** 2, (oi + max(-c, min(c, yi - oi)) - gi) ** 2) for yi, oi, gi in zip(y, old, g)]
    loss, lm = tr.critic_step_loss(cb.to(tr.device))
    assert float(loss.detach()) == pytest.approx(0.5 * float(sum(per)) / len(per), rel=1e-4)
    err, err_clip = (y - g) ** 2, (old + (y - old).clamp(-c, c) - g) ** 2
    clipped = int((err_clip > err).sum())
    assert 0 < clipped < len(per) and lm["critic/vf_clipfrac"] == pytest.approx(clipped / len(per), rel=1e-5)
    # held out: the critic's outputs de-normalised at the current stats against the raw realised returns
    from ragen_turn.algos import values_before_tokens
    from ragen_turn.engines.local.trainer import evaluate_policy

    got = tr.evaluate()["val/critic_explained_var"]
    seen = []
    evaluate_policy(tr.actor, tr.tokenizer, tr.cfg, tr.val_envs, tr.device, on_batch=seen.append)
    h = seen[0]
    after = tr._forward_all(lambda ids, am, pos, _: tr.critic(ids, am, pos), h)
    v = values_before_tokens(after * sd + mu)
    level = tr.cfg.critic.level
    from ragen_turn.engines.advantages import critic_values

    mask = h.turn_mask if turn else h.response_mask
    want = explained_variance(critic_values(v, h, level), realised_returns(h, tr.cfg), mask)
    assert math.isfinite(want) and got == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_micro_batch_size_does_not_change_a_normalised_critic(tmp_path):
    """One training step from stats in place (mean 1.5, std 2: the clip centred on outputs read at them) and a
    critic that predicts something, two mini-batches of 4, in micro-batches of 4 and of 3: the same critic weights,
    stats and logged critic metrics."""
    runs = {}
    for micro in (4, 3):
        tr = _norm_trainer(tmp_path / str(micro), "turn_ppo", f"micro_batch_size_per_gpu={micro}",
                           "trainer.total_training_steps=1", "critic.optim.lr=1e-3", "trainer.test_freq=0",
                           "trainer.val_before_train=false", "critic.cliprange_value=0.001",
                           "ppo_mini_batch_size=4")
        tr.value_norm.load_state_dict({"m": 0.75, "s": 0.5 * (4 + 1.5 ** 2), "d": 0.5})
        torch.manual_seed(0)
        with torch.no_grad():
            tr.critic.value_head.weight.normal_(0, 0.1)
        tr.fit()
        rows = [json.loads(x) for x in (tmp_path / str(micro) / "metrics.jsonl").open()]
        runs[micro] = (tr, [r for r in rows if "critic/value_loss" in r])
    (a, ra), (b, rb) = runs[4], runs[3]
    assert len(ra) == len(rb) == 1 and ra[0]["critic/target_std"] != pytest.approx(2.0)
    assert a.value_norm.state_dict() == pytest.approx(b.value_norm.state_dict(), rel=1e-6)  # scored in micro-batches
    for k in ("critic/value_loss", "critic/vf_clipfrac", "critic/target_mean", "critic/target_std",
              "critic/explained_var"):
        assert rb[0][k] == pytest.approx(ra[0][k], rel=1e-5, abs=1e-7), k
    for p, q in zip(a.critic.parameters(), b.critic.parameters()):
        # AdamW's first step: about lr x sign(g) per weight, float noise can flip a sign where g ~ 0
        assert torch.allclose(p, q, rtol=0, atol=0.05 * 1e-3)


def test_a_resumed_run_with_target_norm_gives_the_metrics_of_an_uninterrupted_one(tmp_path):
    """Stopped after step 2 and resumed: the stats come back from the checkpoint, and every metric of every step
    (the held-out critic quality included) is the uninterrupted run's; a checkpoint without stats is refused."""
    from ragen_turn.engines.local.trainer import build_trainer

    common = ["algo=turn_ppo", "critic.target_norm=true", "critic.target_norm_beta=0.5", "trainer.save_freq=1",
              "trainer.test_freq=2", "trainer.total_training_steps=4"]
    full, resumed, a, b = resume_vs_uninterrupted(tmp_path, common, stop_at=2)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert all("val/critic_explained_var" in a[i] for i in (0, 2, 4)) and "critic/target_std" in a[3]
    for ra, rb in zip(a, b):
        assert set(ra) == set(rb)
        for k in ra:
            if not k.startswith("perf/"):
                assert ra[k] == pytest.approx(rb[k], rel=1e-6, abs=1e-7), (ra["step"], k)
    assert resumed.value_norm.state_dict() == full.value_norm.state_dict()
    off = [c for c in common if not c.startswith("critic.target_norm")]
    build_trainer(micro_config(off + ["trainer.total_training_steps=1"], run_dir=tmp_path / "off"), log=_quiet).fit()
    with pytest.raises(Exception, match="critic.target_norm=true"):
        build_trainer(micro_config(common + ["trainer.resume=true", "trainer.resume_from=latest"],
                                   run_dir=tmp_path / "off"), log=_quiet)


def test_target_norm_off_by_default(tmp_path):
    from ragen_turn.engines.local.trainer import build_trainer

    tr = build_trainer(micro_config(["algo=turn_ppo"], run_dir=tmp_path), log=_quiet)
    assert tr.cfg.critic.target_norm is False and tr.value_norm is None


def test_an_update_put_back_puts_the_stats_back(tmp_path):
    """An update that leaves unsound weights (actor lr 1e30) is put back: the critic's weights, and the stats its
    outputs are read with, are those before it; a sound update keeps the stats it took."""
    tr = _norm_trainer(tmp_path, "turn_ppo", "actor_rollout_ref.actor.optim.lr=1e30", "trainer.max_nonfinite_steps=3")
    batch = tr.rollout(0)
    tr.score(batch)
    tr.compute_advantages(batch)
    before = dict(tr.value_norm.state_dict())
    assert tr.sound_update(batch)["actor/weights_unsound"] == 1.0
    assert tr.value_norm.state_dict() == before
    with open_dict(tr.cfg):
        tr.cfg.actor_rollout_ref.actor.optim.lr = 1e-4
    for g in tr.actor_optim.param_groups:
        g["lr"] = g["initial_lr"] = 1e-4
    assert tr.sound_update(batch)["actor/weights_unsound"] == 0.0
    assert tr.value_norm.state_dict() != before and tr.value_norm.stats().std != 1.0
