"""Held-out critic quality (``val/critic_explained_var``): the realised returns by hand, and the local engine's
wiring (values read where each critic is trained, on the held-out episodes)."""
import pytest
import torch

from ragen_turn.engines.advantages import heldout_critic_explained_var, realised_returns
from ragen_turn.rollout import Trajectory

from helpers import micro_config


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
