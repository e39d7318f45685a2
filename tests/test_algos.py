"""The maths of the algorithm core: hand-computed cases, loop references, invariants, bad input."""
from __future__ import annotations

import math

import pytest
import torch

from ragen_turn.algos import (
    clip_bias_scale,
    compute_bi_level_gae,
    compute_grpo_advantages,
    compute_token_gae,
    compute_turn_gae,
    discounted_reverse_cumsum,
    gather_turns,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    place_turn_rewards,
    policy_loss,
    scatter_turns,
    state_positions,
    turn_boundaries,
    turn_ids_from_mask,
    turn_mask_from_ids,
    value_loss,
)
from ragen_turn.algos.losses import PPOTerms, ppo_objective

from reference import (
    random_batch,
    ref_bi_level,
    ref_grpo,
    ref_policy_loss,
    ref_token_gae,
    ref_turn_gae,
    turns_of,
)

ALL_LOSSES = ["token_ppo", "turn_ppo", "turn_ppo_geo", "turn_is", "s_ppo", "st_ppo"]


# ------------------------------------------------------------------------------------------ turns
def test_turn_ids_and_positions_hand_case():
    m = torch.tensor([[0, 0, 1, 1, 0, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0, 1, 0, 0, 0]])
    t = turn_ids_from_mask(m)
    assert t.tolist() == [[-1, -1, 0, 0, -1, 1, 1, 1, -1, -1], [-1, 0, 0, -1, -1, -1, 1, -1, -1, -1]]
    starts, ends = turn_boundaries(t, 2)
    assert starts.tolist() == [[2, 5], [1, 6]] and ends.tolist() == [[3, 7], [2, 6]]
    assert state_positions(t, 2).tolist() == [[1, 4], [0, 5]]
    x = torch.arange(10.0).expand(2, 10)
    assert gather_turns(x, state_positions(t, 2), turn_mask_from_ids(t, 2)).tolist() == [[1, 4], [0, 5]]
    assert scatter_turns(torch.tensor([[10.0, 20.0], [30.0, 40.0]]), t).tolist() == [
        [0, 0, 10, 10, 0, 20, 20, 20, 0, 0], [0, 30, 30, 0, 0, 0, 40, 0, 0, 0]]
    assert place_turn_rewards(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), t).tolist() == [
        [0, 0, 0, 1, 0, 0, 0, 2, 0, 0], [0, 0, 3, 0, 0, 0, 4, 0, 0, 0]]


def test_turn_ids_row_with_fewer_turns_and_empty_row():
    m = torch.tensor([[0, 1, 0, 1, 0, 1], [0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    t = turn_ids_from_mask(m)
    assert turn_mask_from_ids(t, 3).tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]


def test_state_position_needs_a_prompt():
    with pytest.raises(ValueError, match="starts at token 0"):
        state_positions(turn_ids_from_mask(torch.tensor([[1, 1, 0]])), 1)


@pytest.mark.parametrize("discount", [0.0, 0.5, 0.9, 0.99, 1.0])
@pytest.mark.parametrize("N", [1, 7, 64, 65, 300])
def test_discounted_reverse_cumsum_matches_loop(discount, N):
    g = torch.Generator().manual_seed(N)
    x = torch.randn(3, N, generator=g, dtype=torch.float64)
    ref = torch.zeros_like(x)
    acc = torch.zeros(3, dtype=torch.float64)
    for k in range(N - 1, -1, -1):
        acc = x[:, k] + discount * acc
        ref[:, k] = acc
    assert torch.allclose(discounted_reverse_cumsum(x, discount), ref, atol=1e-9)


# ------------------------------------------------------------------------------------------ GRPO
def test_grpo_hand_case():
    scores = torch.tensor([1.0, 3.0, 0.0, 0.0, 5.0])
    gid = torch.tensor([7, 7, 2, 2, 9])
    adv = compute_grpo_advantages(scores, gid, eps=0.0)
    s = math.sqrt(2.0)  # unbiased std of {1, 3}
    assert torch.allclose(adv, torch.tensor([-1 / s, 1 / s, 0.0, 0.0, 0.0]))
    assert torch.allclose(compute_grpo_advantages(scores, gid, norm_by_std=False),
                          torch.tensor([-1.0, 1.0, 0.0, 0.0, 0.0]))


@pytest.mark.parametrize("seed", range(5))
def test_grpo_matches_reference(seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(24, generator=g)
    gid = torch.randint(0, 6, (24,), generator=g)
    for norm in (True, False):
        assert torch.allclose(compute_grpo_advantages(scores, gid, norm), ref_grpo(scores, gid, norm), atol=1e-5)


# ------------------------------------------------------------------------------------------ GAE
def test_turn_gae_hand_case():
    r = torch.tensor([[0.0, 1.0]])
    v = torch.tensor([[0.5, 0.8]])
    adv, ret = compute_turn_gae(r, v, torch.ones(1, 2), gamma=0.9, lam=0.8)
    # delta1 = 1 - 0.8 = 0.2 ; delta0 = 0 + 0.9*0.8 - 0.5 = 0.22 ; A0 = 0.22 + 0.72*0.2
    assert torch.allclose(adv, torch.tensor([[0.364, 0.2]]))
    assert torch.allclose(ret, torch.tensor([[0.864, 1.0]]))


def test_turn_gae_three_turns_with_padding_row():
    r = torch.tensor([[-0.1, -0.1, 10.0], [1.0, 0.0, 0.0]])
    v = torch.tensor([[1.0, 2.0, 3.0], [0.5, 9.0, 9.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv, ret = compute_turn_gae(r, v, m, gamma=1.0, lam=1.0)
    # gamma = lam = 1: A_h = sum of rewards from h on - V(s_h)
    assert torch.allclose(adv, torch.tensor([[8.8, 7.9, 7.0], [0.5, 0.0, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[9.8, 9.9, 10.0], [1.0, 0.0, 0.0]]))


def test_turn_gae_gamma_lam_one_is_mc_return_minus_value():
    mask, _ = random_batch(3, B=8, max_turns=6)
    tid = turn_ids_from_mask(mask)
    H = int(tid.max()) + 1
    tm = turn_mask_from_ids(tid, H)
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(8, H, generator=g) * tm, torch.randn(8, H, generator=g) * tm
    adv, ret = compute_turn_gae(r, v, tm, 1.0, 1.0)
    mc = r.flip(1).cumsum(1).flip(1) * tm
    assert torch.allclose(adv, (mc - v) * tm, atol=1e-5)
    assert torch.allclose(ret, mc, atol=1e-5)


def test_token_gae_hand_case_skips_env_tokens():
    mask = torch.tensor([[0.0, 1, 1, 0, 0, 1]])
    rew = torch.tensor([[0.0, 0, 0.5, 0, 0, 1.0]])
    vals = torch.tensor([[0.0, 0.1, 0.2, 9.0, 9.0, 0.3]])  # env-token values must be ignored
    adv, ret = compute_token_gae(rew, vals, mask, gamma=0.5, lam=1.0)
    # A5 = 1 - .3 = .7 ; A2 = .5 + .5*.3 - .2 + .5*.7 = .8 ; A1 = 0 + .5*.2 - .1 + .5*.8 = .4
    assert torch.allclose(adv, torch.tensor([[0.0, 0.4, 0.8, 0, 0, 0.7]]))
    assert torch.allclose(ret, torch.tensor([[0.0, 0.5, 1.0, 0, 0, 1.0]]))
    # Not skipping (a naive token GAE over all positions) gives another answer: the test has teeth.
    naive = torch.zeros(6)
    last = 0.0
    for t in range(5, -1, -1):
        v_next = vals[0, t + 1].item() if t < 5 else 0.0
        last = rew[0, t].item() + 0.5 * v_next - vals[0, t].item() + 0.5 * last
        naive[t] = last
    assert not torch.allclose(naive[2], adv[0, 2])


def test_token_gae_rejects_reward_on_env_token():
    with pytest.raises(ValueError, match="token_rewards"):
        compute_token_gae(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), torch.tensor([[0.0, 1.0]]), 1.0, 1.0)


def test_bi_level_gae_hand_case():
    # one row, two turns of 2 tokens; values at ends: 0.5 (pos 2), 0.7 (pos 5)
    mask = torch.tensor([[0.0, 1, 1, 0, 1, 1]])
    vals = torch.tensor([[0.0, 0.1, 0.5, 0.0, 0.2, 0.7]])
    r = torch.tensor([[0.0, 1.0]])
    adv, _ = compute_bi_level_gae(r, vals, mask, gamma=1.0, lam=1.0, high_level_gamma=0.9)
    # high: R1 = 1 ; A0 = 0 + .9*.7 - .5 + .9*(1 - .7) = .4 ; R0 = .9
    # low turn0: A2 = .9 - .5 = .4 ; A1 = 0 + .5 - .1 + .4 = .8 ; turn1: A5 = 1 - .7 = .3 ; A4 = .7 - .2 + .3 = .8
    assert torch.allclose(adv, torch.tensor([[0.0, 0.8, 0.4, 0.0, 0.8, 0.3]]), atol=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_gae_functions_match_loop_references(seed):
    mask, _ = random_batch(seed, B=6, max_turns=5, max_len=7)
    g = torch.Generator().manual_seed(seed)
    tid = turn_ids_from_mask(mask)
    H = int(tid.max()) + 1
    tm = turn_mask_from_ids(tid, H)
    turn_r = torch.randn(6, H, generator=g) * tm
    values = torch.randn(*mask.shape, generator=g)
    gamma, lam = [(0.99, 0.9), (0.9, 0.95), (1.0, 1.0), (0.8, 0.0)][seed % 4]
    tok_r = place_turn_rewards(turn_r, tid)
    a, r = compute_token_gae(tok_r, values * mask, mask, gamma, lam)
    ra, rr = ref_token_gae(tok_r, values * mask, mask, gamma, lam)
    assert torch.allclose(a, ra, atol=1e-5) and torch.allclose(r, rr, atol=1e-5)
    tv = torch.randn(6, H, generator=g) * tm
    a, r = compute_turn_gae(turn_r, tv, tm, gamma, lam)
    ra, rr = ref_turn_gae(turn_r, tv, tm, gamma, lam)
    assert torch.allclose(a, ra, atol=1e-5) and torch.allclose(r, rr, atol=1e-5)
    a, r = compute_bi_level_gae(turn_r, values, mask, gamma, lam, high_level_gamma=0.95)
    ra, rr = ref_bi_level(turn_r, values, mask, gamma, lam, 0.95)
    assert torch.allclose(a, ra, atol=1e-5) and torch.allclose(r, rr, atol=1e-5)


def test_registry_names():
    for name in ["grpo", "token_gae", "turn_gae", "bi_level_gae"]:
        assert callable(get_adv_estimator_fn(name))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        get_adv_estimator_fn("nope")
    for name in ALL_LOSSES:
        assert callable(get_policy_loss_fn(name))
    with pytest.raises(ValueError, match="unknown policy loss"):
        get_policy_loss_fn("nope")


# ------------------------------------------------------------------------------------------ losses
def _loss_inputs(seed, B=5, max_turns=4, max_len=6, scale=0.3):
    mask, _ = random_batch(seed, B=B, max_turns=max_turns, max_len=max_len)
    g = torch.Generator().manual_seed(seed + 100)
    old = -torch.rand(*mask.shape, generator=g) * 3
    logp = (old + torch.randn(*mask.shape, generator=g) * scale).requires_grad_(True)
    adv = torch.randn(*mask.shape, generator=g) * mask
    return old, logp, adv, mask


def test_token_ppo_hand_case():
    mask = torch.tensor([[0.0, 1, 1]])
    old = torch.log(torch.tensor([[1.0, 0.5, 0.5]]))
    logp = torch.log(torch.tensor([[1.0, 0.75, 0.25]])).requires_grad_(True)  # ratios 1.5, 0.5
    adv = torch.tensor([[0.0, 1.0, 2.0]])
    loss, m = policy_loss("token_ppo", logp, old, adv, mask, config={"clip_ratio_low": 0.2, "clip_ratio_high": 0.2})
    # token1: -min(1.5, 1.2) = -1.2 (clipped) ; token2: -min(0.5*2, 0.8*2) = -1.0 ; mean = -1.1
    assert loss.item() == pytest.approx(-1.1)
    assert m["actor/clip_frac_token"] == pytest.approx(0.5)
    loss.backward()
    assert logp.grad[0, 1].item() == 0.0 and logp.grad[0, 2].item() != 0.0


def test_turn_ppo_hand_case_sum_and_geo():
    # two turns: tokens (1,2) and (4,); prompt 0, env 3
    mask = torch.tensor([[0.0, 1, 1, 0, 1]])
    old = torch.zeros(1, 5)
    logp = torch.tensor([[0.0, 0.1, 0.2, 0.0, -0.5]])
    adv = torch.tensor([[0.0, 1.0, 1.0, 0.0, -2.0]])
    cfg = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}
    loss, m = policy_loss("turn_ppo", logp, old, adv, mask, config=cfg)
    w0, w1 = math.exp(0.3), math.exp(-0.5)  # 1.35 (clipped at 1.2 with A>0), 0.61 (clipped at 0.8 with A<0)
    expect = 0.5 * (-min(w0 * 1, 1.2 * 1)) + 0.5 * (-min(w1 * -2, 0.8 * -2))
    assert loss.item() == pytest.approx(expect)
    assert m["actor/clip_frac_turn"] == pytest.approx(1.0)
    loss_g, _ = policy_loss("turn_ppo_geo", logp, old, adv, mask, config=cfg)
    g0, g1 = math.exp(0.15), math.exp(-0.5)
    expect_g = 0.5 * (-min(g0, 1.2)) + 0.5 * (-min(g1 * -2, 0.8 * -2))
    assert loss_g.item() == pytest.approx(expect_g)


def test_clip_bias_hand_case():
    # one row, 2 tokens, A = 1 each; ratios 2.0 (clipped-active) and 1.0; n = 0.5 each
    terms = PPOTerms(ratio=torch.tensor([[2.0, 1.0]]), advantages=torch.tensor([[1.0, 1.0]]),
                     weight=torch.tensor([[0.5, 0.5]]))
    _, clipped = ppo_objective(terms, 0.2, 0.28)
    scale, cg = clip_bias_scale(terms, clipped)
    # C = .5*2*1 = 1 ; G = .5*1*1 = .5 ; C/G = 2 ; s = .5
    assert cg.item() == pytest.approx(2.0, rel=1e-6) and scale.item() == pytest.approx(0.5, rel=1e-6)
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    old = torch.zeros(1, 3)
    logp = torch.tensor([[0.0, math.log(2.0), 0.0]])
    adv = torch.tensor([[0.0, 1.0, 1.0]])
    loss, m = policy_loss("s_ppo", logp, old, adv, mask)
    # L_row = .5 * (-1.28) + .5 * (-1) = -1.14 ; scaled by .5
    assert loss.item() == pytest.approx(-0.57, rel=1e-5)
    assert m["actor/clip_bias_scale"] == pytest.approx(0.5, rel=1e-5)


def test_clip_bias_batch_level_uses_batch_sums():
    mask = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    old = torch.zeros(2, 2)
    logp = torch.tensor([[0.0, math.log(2.0)], [0.0, 0.0]])
    adv = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    _, ms = policy_loss("s_ppo", logp, old, adv, mask)
    _, mb = policy_loss("s_ppo", logp, old, adv, mask, config={"clip_bias_level": "batch"})
    # sample: row 0 fully clipped -> s0 = 1/max(1, big) ~ 0, row 1 nothing clipped -> s1 = 1
    # batch: C = .5*2 = 1, G = .5*1 = .5 -> s = .5 for both
    assert ms["actor/clip_bias_scale"] == pytest.approx(0.5, abs=1e-6)  # mean of (~0, 1)
    assert mb["actor/clip_bias_scale"] == pytest.approx(0.5, rel=1e-6)
    assert mb["actor/clip_bias_ratio"] == pytest.approx(2.0, rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", ALL_LOSSES)
def test_losses_match_loop_reference_value_and_grad(name, seed):
    old, logp, adv, mask = _loss_inputs(seed, scale=0.4)
    cfg = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    loss, _ = policy_loss(name, logp, old, adv, mask, config=cfg)
    (grad,) = torch.autograd.grad(loss, logp)
    logp2 = logp.detach().clone().requires_grad_(True)
    ref = ref_policy_loss(name, old, logp2, adv, mask)
    (ref_grad,) = torch.autograd.grad(ref, logp2)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-6)


@pytest.mark.parametrize("agg", ["turn-mean", "token-mean"])
def test_turn_ppo_agg_modes_match_reference(agg):
    old, logp, adv, mask = _loss_inputs(11)
    loss, _ = policy_loss("turn_ppo", logp, old, adv, mask, config={"loss_agg_mode": agg})
    ref = ref_policy_loss("turn_ppo", old, logp, adv, mask, agg=agg)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)


def test_clip_bias_flag_applies_to_turn_ppo():
    old, logp, adv, mask = _loss_inputs(4, scale=1.0)
    loss, m = policy_loss("turn_ppo", logp, old, adv, mask, config={"clip_bias": True})
    ref = ref_policy_loss("turn_ppo", old, logp, adv, mask, clip_bias=True)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert m["actor/clip_bias_scale"] < 1.0  # something was clipped at this scale


# ------------------------------------------------------------------------------------------ invariants
def test_turn_ppo_geo_one_turn_equals_gspo():
    g = torch.Generator().manual_seed(0)
    B, T = 6, 12
    mask = torch.zeros(B, T)
    lengths = [3, 8, 1, 5, 9, 4]
    for b, L in enumerate(lengths):
        mask[b, 2:2 + L] = 1
    old = -torch.rand(B, T, generator=g)
    logp = (old + 0.3 * torch.randn(B, T, generator=g)).requires_grad_(True)
    seq_adv = torch.randn(B, generator=g)
    adv = seq_adv[:, None] * mask
    loss, _ = policy_loss("turn_ppo_geo", logp, old, adv, mask)
    # GSPO: s_i = exp(mean_t (logp - old)), L = mean_i -min(s_i A_i, clip(s_i) A_i)
    s = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))
    gspo = (-torch.minimum(s * seq_adv, s.clamp(0.8, 1.28) * seq_adv)).mean()
    assert loss.item() == pytest.approx(gspo.item(), rel=1e-5)
    (g1,) = torch.autograd.grad(loss, logp, retain_graph=True)
    (g2,) = torch.autograd.grad(gspo, logp)
    assert torch.allclose(g1, g2, atol=1e-7)


def test_turn_ppo_one_turn_equals_sequence_level_ppo():
    old, logp, _, _ = _loss_inputs(2)
    mask = torch.zeros_like(old)
    mask[:, 1:4] = 1
    seq_adv = torch.tensor([1.0, -1.0, 0.5, 2.0, -0.3])
    adv = seq_adv[:, None] * mask
    loss, _ = policy_loss("turn_ppo", logp, old, adv, mask)
    s = torch.exp(((logp - old) * mask).sum(1))  # product of token ratios
    seq = (-torch.minimum(s * seq_adv, s.clamp(0.8, 1.28) * seq_adv)).mean()
    assert loss.item() == pytest.approx(seq.item(), rel=1e-5)


def test_turn_is_equals_turn_ppo_token_mean_when_adv_constant_per_turn():
    old, logp, adv, mask = _loss_inputs(5)
    tid = turn_ids_from_mask(mask)
    H = int(tid.max()) + 1
    turn_adv = torch.randn(mask.shape[0], H)
    adv = scatter_turns(turn_adv, tid)
    for mode in ("sum", "geo_mean"):
        cfg = {"ratio_mode": mode, "loss_agg_mode": "token-mean"}
        a, _ = policy_loss("turn_is", logp, old, adv, mask, config={"ratio_mode": mode})
        b, _ = policy_loss("turn_ppo", logp, old, adv, mask, config=cfg)
        assert a.item() == pytest.approx(b.item(), rel=1e-5)  # float32: the two losses sum in different orders


def test_corrections_equal_base_when_nothing_clipped():
    old, logp, adv, mask = _loss_inputs(6, scale=0.01)  # ratios within 1 +- 0.05
    for base, corrected in (("token_ppo", "s_ppo"), ("turn_is", "st_ppo")):
        a, ma = policy_loss(base, logp, old, adv, mask)
        b, mb = policy_loss(corrected, logp, old, adv, mask)
        assert ma["actor/clip_frac_token"] == 0.0
        assert a.item() == b.item()
        assert mb["actor/clip_bias_scale"] == 1.0


def test_clipped_turn_gives_zero_gradient_to_all_its_tokens():
    mask = torch.tensor([[0.0, 1, 1, 1, 0, 1, 1]])
    old = torch.zeros(1, 7)
    # turn 0 has log-ratio sum 0.9 (ratio 2.46 > 1.28, A > 0: clipped); turn 1 small
    logp = torch.tensor([[0.0, 0.3, 0.3, 0.3, 0.0, 0.01, -0.01]], requires_grad=True)
    adv = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0]])
    for name in ("turn_ppo", "turn_ppo_geo", "turn_is"):
        if name != "turn_ppo":
            logp.data[0, 1:4] = 0.6  # geo-mean ratio exp(0.6) = 1.82 > 1.28
        loss, _ = policy_loss(name, logp, old, adv, mask)
        (g,) = torch.autograd.grad(loss, logp)
        assert torch.all(g[0, 1:4] == 0), name
        assert torch.all(g[0, 5:7] != 0), name


@pytest.mark.parametrize("name", ALL_LOSSES)
def test_losses_finite_for_extreme_turns(name):
    T = 4100
    mask = torch.zeros(2, T)
    mask[0, 1:4097] = 1  # a 4096-token turn
    mask[1, 1] = 1  # a 1-token turn
    mask[1, 3] = 1
    for shift in (50.0 / 4096, -50.0 / 4096, 50.0, -50.0):
        old = torch.zeros(2, T)
        logp = torch.full((2, T), shift, requires_grad=True)
        adv = torch.ones(2, T) * mask
        adv[1] *= -1
        loss, m = policy_loss(name, logp, old, adv, mask)
        (g,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(loss) and torch.isfinite(g).all(), (name, shift)
        assert all(math.isfinite(v) for v in m.values()), (name, shift, m)


# ------------------------------------------------------------------------------------------ value loss
def test_value_loss_hand_case_and_clip():
    v = torch.tensor([[1.0, 2.0]])
    old = torch.tensor([[0.0, 2.0]])
    ret = torch.tensor([[1.0, 0.0]])
    loss, m = value_loss(v, old, ret, torch.ones(1, 2), clip_range=0.5)
    # pos0: max((1-1)^2, (0.5-1)^2) = .25 ; pos1: max(4, 4) = 4 ; 0.5 * mean = 1.0625
    assert loss.item() == pytest.approx(1.0625)
    assert m["critic/vf_clipfrac"] == pytest.approx(0.5)
    loss_nc, _ = value_loss(v, old, ret, torch.ones(1, 2), clip_range=None)
    assert loss_nc.item() == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------ bad input
def test_bad_inputs_raise_value_errors_naming_the_argument():
    old, logp, adv, mask = _loss_inputs(0)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss("turn_ppo", logp, old, adv[:, :-1], mask)
    with pytest.raises(ValueError, match="response_mask"):
        policy_loss("token_ppo", logp, old, adv, mask * 2)
    bad_adv = adv.clone()
    bad_adv[mask.bool()] = float("nan")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss("turn_ppo", logp, old, bad_adv, mask)
    tid = turn_ids_from_mask(mask)
    gap = torch.where(tid >= 1, tid + 1, tid)  # turn 1 missing: an empty turn
    with pytest.raises(ValueError, match="empty turn"):
        policy_loss("turn_ppo", logp, old, adv, mask, turn_ids=gap)
    wrong = tid.clone()
    wrong[mask == 0] = 0
    with pytest.raises(ValueError, match="turn_ids"):
        policy_loss("turn_ppo", logp, old, adv, mask, turn_ids=wrong)
    with pytest.raises(ValueError, match="turn_values"):
        compute_turn_gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 0.9, 0.9)
    with pytest.raises(ValueError, match="turn_mask"):
        compute_turn_gae(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([[1.0, 0.5, 0.0]]), 0.9, 0.9)
    with pytest.raises(ValueError, match="turn_mask"):
        compute_turn_gae(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([[1.0, 0.0, 1.0]]), 0.9, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        compute_turn_gae(torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), 1.5, 0.9)
    with pytest.raises(ValueError, match="values"):
        compute_token_gae(torch.zeros(1, 3), torch.tensor([[0.0, float("inf"), 0.0]]), torch.ones(1, 3), 1, 1)
    with pytest.raises(ValueError, match="scores"):
        compute_grpo_advantages(torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="clip_ratio"):
        policy_loss("token_ppo", logp, old, adv, mask, config={"clip_ratio_low": 1.5})
    with pytest.raises(ValueError, match="ratio_mode"):
        policy_loss("turn_is", logp, old, adv, mask, config={"ratio_mode": "max"})


def test_turn_ids_from_mask_matches_reference_on_random_batches():
    for seed in range(10):
        mask, turns = random_batch(seed, B=7)
        tid = turn_ids_from_mask(mask)
        for b in range(7):
            assert turns_of(mask[b]) == turns[b]
            for h, toks in enumerate(turns[b]):
                assert all(tid[b, t].item() == h for t in toks)


@pytest.mark.parametrize("seed", range(10))
def test_bi_level_gae_turn_ends_rewards_matches_a_port_of_ragens_function(seed):
    """algorithm.bi_level_gae_turn_ends=rewards against RAGEN's function (ported in tests/reference.py) on
    turns of which about 30% have a zero reward, and on RAGEN's default (use_turn_scores=False: the sum on
    the last turn, so one segment over the whole episode)."""
    from reference import ref_ragen_bi_level

    mask, _ = random_batch(100 + seed, B=6, max_turns=5, max_len=6)
    g = torch.Generator().manual_seed(seed)
    tid = turn_ids_from_mask(mask)
    H = int(tid.max()) + 1
    tm = turn_mask_from_ids(tid, H)
    turn_r = torch.randn(6, H, generator=g) * (torch.rand(6, H, generator=g) > 0.3) * tm
    values = torch.randn(*mask.shape, generator=g) * mask
    gamma, lam, hg = [(1.0, 1.0, 0.95), (0.99, 0.9, 0.9), (0.9, 0.95, 1.0)][seed % 3]
    last = (tm.sum(dim=1).long() - 1)[:, None]
    episode_sum = torch.zeros_like(turn_r).scatter(1, last, turn_r.sum(dim=1, keepdim=True))
    for tr in (turn_r, episode_sum):
        a, r = compute_bi_level_gae(tr, values, mask, gamma, lam, hg, turn_ends="rewards")
        ra, rr = ref_ragen_bi_level(place_turn_rewards(tr, tid), values, mask, gamma, lam, hg)
        assert torch.allclose(a, ra, atol=1e-5) and torch.allclose(r, rr, atol=1e-5)
    # with every turn's reward non-zero the two definitions of a turn agree
    nonzero = torch.where(tm.bool() & (turn_r == 0), torch.full_like(turn_r, 0.5), turn_r)
    a1, r1 = compute_bi_level_gae(nonzero, values, mask, gamma, lam, hg, turn_ends="rewards")
    a2, r2 = compute_bi_level_gae(nonzero, values, mask, gamma, lam, hg, turn_ends="mask")
    assert torch.allclose(a1, a2, atol=1e-5) and torch.allclose(r1, r2, atol=1e-5)


def test_bi_level_gae_turn_ends_differ_on_zero_reward_turns_and_are_checked():
    mask = torch.tensor([[0.0, 1, 1, 0, 1, 1]])
    vals = torch.tensor([[0.0, 0.1, 0.5, 0.0, 0.2, 0.7]])
    r = torch.tensor([[0.0, 1.0]])  # the first turn's reward is 0: RAGEN joins it to the second
    a_mask, _ = compute_bi_level_gae(r, vals, mask, 1.0, 1.0, 0.9, turn_ends="mask")
    a_rew, _ = compute_bi_level_gae(r, vals, mask, 1.0, 1.0, 0.9, turn_ends="rewards")
    # one segment, reward 1 at its end (pos 5): A5 = 1 - .7 = .3, A4 = .7 - .2 + .3 = .8, A2 = .2 - .5 + .8 = .5,
    # A1 = .5 - .1 + .5 = .9 (the token GAE chains across the environment tokens at pos 3)
    assert torch.allclose(a_rew, torch.tensor([[0.0, 0.9, 0.5, 0.0, 0.8, 0.3]]), atol=1e-6)
    assert not torch.allclose(a_mask, a_rew)
    with pytest.raises(ValueError, match="bi_level_gae_turn_ends"):
        compute_bi_level_gae(r, vals, mask, 1.0, 1.0, 0.9, turn_ends="tokens")
