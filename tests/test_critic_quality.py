"""Held-out critic quality (``val/critic_explained_var``): the realised returns by hand, and the local engine's
wiring (values read where each critic is trained, on the held-out episodes)."""
import pytest
import torch

from ragen_turn.engines.advantages import heldout_critic_explained_var, realised_returns
from ragen_turn.rollout import Trajectory

from helpers import micro_config, resume_vs_uninterrupted


def _quiet(*a, **k):
    pass


def hand_batch() -> Trajectory:
    """Two episodes, 8 tokens. Row 0: prompt, turn 0 on tokens 1-2, prompt, turn 1 on 4-5, padding;
    rewards 1 then 2. Row 1: prompt, one turn on tokens 1-3, reward 3."""
    rm = torch.tensor([[0, 1, 1, 0, 1, 1, 0, 0], [0, 1, 1, 1, 0, 0, 0, 0]], dtype=torch.float32)
    tid = torch.tensor([[-1, 0, 0, -1, 1, 1, -1, -1], [-1, 0, 0, 0, -1, -1, -1, -1]])
    return Trajectory(input_ids=torch.zeros(2, 8, dtype=torch.long), attention_mask=(tid >= -1).long(),
                      response_mask=rm, turn_ids=tid, turn_rewards=torch.tensor([[1.0, 2.0], [3.0, 0.0]]),
                      turn_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]), group_ids=torch.tensor([0, 1]),
                      success=torch.zeros(2), episode_rewards=torch.tensor([3.0, 3.0]))


def test_turn_critic_heldout_explained_variance_by_hand():
    # gamma 0.5, lam 0.9 (the realised return is lam = 1's whatever the run's lam): G = [[1 + 0.5 * 2, 2], [3, -]]
    cfg = micro_config(["algo=turn_ppo", "algorithm.gamma=0.5", "algorithm.lam=0.9"])
    b = hand_batch()
    torch.testing.assert_close(realised_returns(b, cfg) * b.turn_mask, torch.tensor([[2.0, 2.0], [3.0, 0.0]]))
    # V(s_h) sits at each turn's first token (the shared layout): 1.5, 2 (row 0) and 2.5 (row 1); other tokens'
    # values must not count
    b.values = torch.full((2, 8), 9.0)
    b.values[0, 1], b.values[0, 4], b.values[1, 1] = 1.5, 2.0, 2.5
    # G - V = [0.5, 0, 0.5]: Var = 1/18; Var[G] = 2/9 -> 1 - 1/4
    assert heldout_critic_explained_var(b, cfg) == pytest.approx(0.75)


def test_token_critic_heldout_explained_variance_by_hand():
    # token GAE, gamma 0.5: each turn's reward on its last token, discounted per response token
    cfg = micro_config(["algo=token_ppo", "algorithm.gamma=0.5", "algorithm.lam=0.9"])
    b = hand_batch()
    want = torch.tensor([[0, 0.75, 1.5, 0, 1.0, 2.0, 0, 0], [0, 0.75, 1.5, 3.0, 0, 0, 0, 0]])
    torch.testing.assert_close(realised_returns(b, cfg) * b.response_mask, want)
    b.values = want + 5.0 * (1 - b.response_mask)  # exact on response tokens; the rest must not count
    assert heldout_critic_explained_var(b, cfg) == pytest.approx(1.0)
    b.values = want.clone()
    b.values[0, 5] = 1.0  # one token off by 1: 1 - Var[G - V] / Var[G] over the 7 response tokens
    G = want[b.response_mask.bool()]
    err = torch.zeros(7)
    err[3] = 1.0
    assert heldout_critic_explained_var(b, cfg) == pytest.approx(float(1 - err.var(unbiased=False)
                                                                      / G.var(unbiased=False)), rel=1e-5)


@pytest.mark.parametrize("algo", ["turn_ppo", "token_ppo"])
def test_local_evaluation_logs_the_critics_heldout_explained_variance(algo, tmp_path):
    """The trainer's evaluation reads its critic on the held-out episodes it played: the metric equals one computed
    here from a separate forward of the critic (V(s_h) at the token before each turn; every response token for the
    token critic) against the realised returns."""
    from ragen_turn.algos import explained_variance
    from ragen_turn.engines.local.trainer import build_trainer, evaluate_policy

    cfg = micro_config([f"algo={algo}", "es_manager.val.env_groups=4", "algorithm.gamma=0.9"], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    with torch.no_grad():
        tr.critic.value_head.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(0))
    metrics = tr.evaluate()
    seen = []
    evaluate_policy(tr.actor, tr.tokenizer, cfg, tr.val_envs, tr.device, on_batch=seen.append)
    b = seen[0]
    raw = tr._forward_all(lambda ids, am, pos, rm: tr.critic(ids, am, pos), b)  # V after each token
    G = realised_returns(b, cfg)
    vals, rets = [], []
    for i in range(b.batch_size):
        for t in range(1, b.input_ids.shape[1]):
            if b.response_mask[i, t] != 1:
                continue
            h = int(b.turn_ids[i, t])
            first = b.response_mask[i, t - 1] == 0
            if algo == "token_ppo" or first:
                vals.append(raw[i, t - 1])
                rets.append(G[i, t] if algo == "token_ppo" else G[i, h])
    v, g = torch.stack(vals), torch.stack(rets)
    expected = explained_variance(v, g, torch.ones_like(v))
    assert g.var() > 0 and expected != 0.0
    assert metrics["val/critic_explained_var"] == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_no_critic_no_heldout_explained_variance(tmp_path):
    from ragen_turn.engines.local.trainer import build_trainer

    tr = build_trainer(micro_config(["algo=grpo"], run_dir=tmp_path), log=_quiet)
    assert "val/critic_explained_var" not in tr.evaluate()


def test_a_resumed_run_with_a_critic_warmup_gives_the_metrics_of_an_uninterrupted_one(tmp_path):
    """trainer.critic_warmup=3 (steps 1-2 train only the critic), stopped after step 2, inside the warm-up, and
    resumed: every metric of every step (held-out critic quality included) is the uninterrupted run's."""
    common = ["algo=turn_ppo", "trainer.critic_warmup=3", "trainer.save_freq=1", "trainer.test_freq=2",
              "trainer.total_training_steps=4"]
    full, resumed, a, b = resume_vs_uninterrupted(tmp_path, common, stop_at=2)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert [r.get("actor/critic_warmup", 0.0) for r in a[1:]] == [1.0, 1.0, 0.0, 0.0]
    assert all("val/critic_explained_var" in a[i] for i in (0, 2, 4))
    for ra, rb in zip(a, b):
        assert set(ra) == set(rb)
        for k in ra:
            if not k.startswith("perf/"):
                assert ra[k] == pytest.approx(rb[k], rel=1e-6, abs=1e-7), (ra["step"], k)
    for p1, p2 in zip(full.critic.parameters(), resumed.critic.parameters()):
        assert torch.allclose(p1, p2, atol=1e-6)


def test_value_clipping_off_is_the_plain_squared_error_on_both_engines(tmp_path):
    """critic.cliprange_value=null: the local critic loss is 0.5 x the mean squared error over the critic's
    positions (no clip); verl gets a clip range no update reaches, and its value loss is then the same number."""
    from ragen_turn.algos import value_loss
    from ragen_turn.engines.advantages import critic_targets
    from ragen_turn.engines.local.trainer import build_trainer
    from ragen_turn.engines.verl.config import NO_VALUE_CLIP, verl_cliprange_value

    tr = build_trainer(micro_config(["algo=turn_ppo", "critic.cliprange_value=null"], run_dir=tmp_path), log=_quiet)
    assert tr.cfg.critic.cliprange_value is None
    b = tr.rollout(0)
    tr.score(b)
    tr.compute_advantages(b)
    from ragen_turn.engines.advantages import critic_values

    # returns 5 above the old values, fresh values 4 above: an error of 1 everywhere, the clip range passed 8 times
    b.turn_returns = (critic_values(b.values, b, "turn") + 5.0) * b.turn_mask
    loss, m = tr.critic_loss(b, b.values + 4.0 * b.response_mask)
    mask, _, returns = critic_targets(b, "turn")
    v = critic_values(b.values + 4.0 * b.response_mask, b, "turn")
    assert float(loss) == pytest.approx(0.5, rel=1e-6)
    assert m["critic/vf_clipfrac"] == 0.0
    clipped, mc = value_loss(v, critic_values(b.values, b, "turn"), returns, mask, 0.5)
    assert mc["critic/vf_clipfrac"] > 0 and float(clipped) > float(loss)  # the clip would have bitten
    assert verl_cliprange_value(None) == NO_VALUE_CLIP and verl_cliprange_value(0.5) == 0.5
    verl_losses = pytest.importorskip("verl.trainer.ppo.core_algos")
    vl, clipfrac = verl_losses.compute_value_loss(vpreds=v, returns=returns, values=critic_values(b.values, b, "turn"),
                                                  response_mask=mask, cliprange_value=NO_VALUE_CLIP)
    assert float(vl) == pytest.approx(float(loss), rel=1e-6) and float(clipfrac) == 0.0


@pytest.mark.parametrize("algo", ["turn_ppo", "token_ppo"])
def test_head_init_fit_is_the_least_squares_head_on_the_first_batch(algo, tmp_path):
    """critic.head_init=fit: at the first update the value head solves the ridge normal equations on the frozen
    backbone's states where the critic reads (each row's own forward, here) against the batch's targets: residuals
    sum to 0 (the bias is free) and X^T r = ridge N w; the backbone is untouched by the fit; later steps do not
    fit again."""
    from ragen_turn.engines.advantages import critic_targets
    from ragen_turn.engines.local.trainer import build_trainer

    tr = build_trainer(micro_config([f"algo={algo}", "critic.head_init=fit", "es_manager.train.env_groups=4"],
                                    run_dir=tmp_path), log=_quiet)
    b = tr.rollout(0)
    tr.score(b)
    tr.compute_advantages(b)
    body = [p.detach().clone() for n, p in tr.critic.named_parameters() if not n.startswith("value_head.")]
    tr.fit_critic_head(b)
    assert all(torch.equal(p0, p) for p0, p in zip(body, [p for n, p in tr.critic.named_parameters()
                                                          if not n.startswith("value_head.")]))
    mask, _, returns = critic_targets(b, tr.cfg.critic.level)
    X, y = [], []
    for i in range(b.batch_size):
        row = b.select([i])
        with torch.no_grad():
            h = tr.critic.backbone(input_ids=row.input_ids, attention_mask=row.attention_mask,
                                   position_ids=row.position_ids, use_cache=False).last_hidden_state[0].double()
        starts = [t for t in range(1, row.input_ids.shape[1]) if row.response_mask[0, t] == 1
                  and (algo == "token_ppo" or row.response_mask[0, t - 1] == 0)]
        X += [h[t - 1] for t in starts]
        y += list(returns[i][mask[i].bool()].double())
    X, y = torch.stack(X), torch.stack(y)
    assert len(y) == int(mask.sum()) and y.var() > 0
    w, bias = tr.critic.value_head.weight[0].detach().double(), tr.critic.value_head.bias.detach().double()
    r = y - (X @ w + bias)
    assert float(r.sum()) == pytest.approx(0.0, abs=1e-3 * len(y))
    torch.testing.assert_close(X.T @ r, 1e-3 * len(y) * w, rtol=1e-3, atol=1e-3)
    assert float(r.pow(2).mean()) < float((y - y.mean()).pow(2).mean())  # it explains some of the variance

    metrics = tr.update(b)  # step index 0: fits (again, the same head), then its gradient steps
    assert metrics["critic/head_fit"] == 1.0
    tr.step = 1
    assert "critic/head_fit" not in tr.update(b)
