"""The maths of the algorithm core: hand-computed cases, loop references, invariants, bad input."""
from __future__ import annotations

import math

import pytest
import torch

from ragen_turn.algos import (
    GlobalCounts,
    compute_bi_level_gae,
    compute_grpo_advantages,
    compute_token_gae,
    compute_turn_gae,
    discounted_reverse_cumsum,
    gather_turns,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    loss_settings,
    masked_mean,
    minibatch_clip_stats,
    needs_minibatch_stats,
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
from ragen_turn.algos.registry import Registry

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
    adv, _ = compute_bi_level_gae(r, vals, mask, gamma=1.0, lam=1.0, high_level_gamma=0.9, turn_ends="mask")
    # high: R1 = 1 ; A0 = 0 + .9*.7 - .5 + .9*(1 - .7) = .4 ; R0 = .9
    # low turn0: A2 = .9 - .5 = .4 ; A1 = 0 + .5 - .1 + .4 = .8 ; turn1: A5 = 1 - .7 = .3 ; A4 = .7 - .2 + .3 = .8
    assert torch.allclose(adv, torch.tensor([[0.0, 0.8, 0.4, 0.0, 0.8, 0.3]]), atol=1e-6)


@pytest.mark.parametrize("bootstrap", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_gae_functions_match_loop_references(seed, bootstrap):
    mask, _ = random_batch(seed, B=6, max_turns=5, max_len=7)
    g = torch.Generator().manual_seed(seed)
    tid = turn_ids_from_mask(mask)
    H = int(tid.max()) + 1
    tm = turn_mask_from_ids(tid, H)
    turn_r = torch.randn(6, H, generator=g) * tm
    values = torch.randn(*mask.shape, generator=g)
    # some rows truncated: they bootstrap from a value after their last turn
    boot = torch.randn(6, generator=g) * (torch.rand(6, generator=g) > 0.5) if bootstrap else None
    gamma, lam = [(0.99, 0.9), (0.9, 0.95), (1.0, 1.0), (0.8, 0.0)][seed % 4]
    tok_r = place_turn_rewards(turn_r, tid)
    a, r = compute_token_gae(tok_r, values * mask, mask, gamma, lam, last_values=boot)
    ra, rr = ref_token_gae(tok_r, values * mask, mask, gamma, lam, last_values=boot)
    assert torch.allclose(a, ra, atol=1e-5) and torch.allclose(r, rr, atol=1e-5)
    tv = torch.randn(6, H, generator=g) * tm
    a, r = compute_turn_gae(turn_r, tv, tm, gamma, lam, last_values=boot)
    ra, rr = ref_turn_gae(turn_r, tv, tm, gamma, lam, last_values=boot)
    assert torch.allclose(a, ra, atol=1e-5) and torch.allclose(r, rr, atol=1e-5)
    a, r = compute_bi_level_gae(turn_r, values, mask, gamma, lam, high_level_gamma=0.95)
    ra, rr = ref_bi_level(turn_r, values, mask, gamma, lam, 0.95)
    assert torch.allclose(a, ra, atol=1e-5) and torch.allclose(r, rr, atol=1e-5)


def test_bootstrap_truncated_hand_cases():
    """A truncated row bootstraps from V(state after its last turn); a finished row (last_values 0) does not."""
    r = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    v = torch.tensor([[0.5, 0.8], [0.5, 0.8]])
    adv, ret = compute_turn_gae(r, v, torch.ones(2, 2), gamma=0.9, lam=0.8, last_values=torch.tensor([2.0, 0.0]))
    # row 0: delta1 = 1 + .9*2 - .8 = 2.0 ; delta0 = .9*.8 - .5 = .22 ; A0 = .22 + .72*2 = 1.66
    assert torch.allclose(adv, torch.tensor([[1.66, 2.0], [0.364, 0.2]]))
    assert torch.allclose(ret, torch.tensor([[2.16, 2.8], [0.864, 1.0]]))
    # a row with fewer turns gets its bootstrap after its own last turn
    adv, _ = compute_turn_gae(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.0]]), torch.tensor([[1.0, 0.0]]),
                              gamma=0.5, lam=1.0, last_values=torch.tensor([4.0]))
    assert adv.tolist() == [[pytest.approx(1.0 + 0.5 * 4.0 - 0.5), 0.0]]
    mask = torch.tensor([[0.0, 1, 1, 0, 0, 1, 0]])
    rew = torch.tensor([[0.0, 0, 0.5, 0, 0, 1.0, 0]])
    vals = torch.tensor([[0.0, 0.1, 0.2, 9.0, 9.0, 0.3, 0.0]])
    adv, ret = compute_token_gae(rew, vals, mask, gamma=0.5, lam=1.0, last_values=torch.tensor([1.0]))
    # A5 = 1 + .5*1 - .3 = 1.2 ; A2 = .5 + .5*.3 - .2 + .5*1.2 = 1.05 ; A1 = .5*.2 - .1 + .5*1.05 = .525
    assert torch.allclose(adv, torch.tensor([[0.0, 0.525, 1.05, 0, 0, 1.2, 0]]))
    with pytest.raises(ValueError, match="bootstrap"):
        get_adv_estimator_fn("grpo")(turn_rewards=r, turn_mask=torch.ones(2, 2), turn_ids=None, response_mask=None,
                                     group_ids=torch.tensor([0, 0]), values=None, config={},
                                     bootstrap_values=torch.zeros(2))


def test_registry_names():
    for name in ["grpo", "token_gae", "turn_gae", "bi_level_gae"]:
        assert callable(get_adv_estimator_fn(name))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        get_adv_estimator_fn("nope")
    for name in ALL_LOSSES:
        assert callable(get_policy_loss_fn(name))
    with pytest.raises(ValueError, match="unknown policy loss"):
        get_policy_loss_fn("nope")


def test_registry_entries_carry_each_algorithms_properties():
    """The facts the config checks and the engines read, on the entries (by hand, from the papers)."""
    from ragen_turn.algos import EstimatorSpec, adv_estimator_spec, bootstrapping_estimators

    names = ["grpo", "token_gae", "bi_level_gae", "turn_gae"]
    specs = {n: adv_estimator_spec(n) for n in names}
    assert {n: (s.critic_level, s.bootstraps, s.min_group_size) for n, s in specs.items()} == {
        "grpo": ("none", False, 2), "token_gae": ("token", True, 1), "bi_level_gae": ("token", False, 1),
        "turn_gae": ("turn", True, 1)}
    assert bootstrapping_estimators() == ["token_gae", "turn_gae"]
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        adv_estimator_spec("nope")
    reg = Registry("advantage estimator", EstimatorSpec)  # a new entry must say what it needs
    with pytest.raises(TypeError, match="critic_level"):
        reg.register("x", bootstraps=False)
    with pytest.raises(ValueError, match="critic_level must be one of"):
        reg.register("x", critic_level="state", bootstraps=False)
    with pytest.raises(ValueError, match="no value to bootstrap"):
        reg.register("x", critic_level="none", bootstraps=True)
    with pytest.raises(TypeError, match="takes no properties"):
        Registry("thing").register("x", unit="token")


@pytest.mark.parametrize("name", ALL_LOSSES)
def test_a_losss_unit_and_default_aggregation_are_its_entrys(name):
    """``unit`` on the entry is what its builder makes (one unit per turn or per token), and with no
    ``loss_agg_mode`` the loss is the one at the entry's ``default_agg``."""
    from ragen_turn.algos import loss_settings, policy_loss_spec

    spec = policy_loss_spec(name)
    old, logp, adv, mask = _loss_inputs(3)
    fn = get_policy_loss_fn(name)
    units = fn.build_units(old, logp, adv, mask, None, loss_settings({}), None, None, None)
    H = int(units.turn_ids.max()) + 1
    assert units.terms.ratio.shape[1] == (H if spec.unit == "turn" else mask.shape[1])
    assert spec.forces_clip_bias == (name in ("s_ppo", "st_ppo"))
    loss, _ = fn(old, logp, adv, mask, None, {})
    loss_at_default, _ = fn(old, logp, adv, mask, spec.default_agg, {})
    other = "seq-mean-token-mean" if spec.unit == "token" else "seq-mean-turn-sum-token-norm"
    loss_other, _ = fn(old, logp, adv, mask, other, {})
    assert torch.equal(loss, loss_at_default) and not torch.allclose(loss, loss_other)


# ------------------------------------------------------------------------------------------ losses
def _loss_inputs(seed, B=5, max_turns=4, max_len=6, scale=0.3):
    mask, _ = random_batch(seed, B=B, max_turns=max_turns, max_len=max_len)
    g = torch.Generator().manual_seed(seed + 100)
    old = -torch.rand(*mask.shape, generator=g) * 3
    logp = (old + torch.randn(*mask.shape, generator=g) * scale).requires_grad_(True)
    adv = torch.randn(*mask.shape, generator=g) * mask
    return old, logp, adv, mask


def test_token_trust_metrics_hand_case():
    # one turn of two tokens, A = +1: d = (+0.5, -0.5) sums to 0, so the turn's ratio is 1 and nothing is clipped;
    # token 0's own ratio e^0.5 > 1.28 is outside token PPO's region and still gets gradient under the turn ratio
    mask = torch.tensor([[1.0, 1.0]])
    old = torch.zeros(1, 2)
    logp = torch.tensor([[0.5, -0.5]]).requires_grad_(True)
    adv = torch.ones(1, 2)
    _, m = policy_loss("turn_ppo", logp, old, adv, mask, config={"ratio_mode": "sum"})
    assert m["actor/clip_frac_turn"] == 0.0
    assert m["actor/token_outside_frac"] == pytest.approx(0.5)
    assert m["actor/token_outside_kept_frac"] == pytest.approx(0.5)
    # token PPO clips exactly the tokens that are outside, so it keeps none of them
    _, m = policy_loss("token_ppo", logp, old, adv, mask)
    assert m["actor/token_outside_frac"] == pytest.approx(0.5) == m["actor/clip_frac_token"]
    assert m["actor/token_outside_kept_frac"] == 0.0
    # a clipped turn keeps none: d = (+0.5, +0.5), turn ratio e^1 > 1.28 with A > 0
    _, m = policy_loss("turn_ppo", torch.tensor([[0.5, 0.5]]), old, adv, mask, config={"ratio_mode": "sum"})
    assert m["actor/token_outside_frac"] == pytest.approx(1.0)
    assert m["actor/token_outside_kept_frac"] == 0.0


def test_token_ppo_keeps_no_outside_token():
    old, logp, adv, mask = _loss_inputs(3, scale=0.6)
    _, m = policy_loss("token_ppo", logp, old, adv, mask)
    assert m["actor/token_outside_frac"] > 0.1
    assert m["actor/token_outside_frac"] == pytest.approx(m["actor/clip_frac_token"])
    assert m["actor/token_outside_kept_frac"] == 0.0


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


def test_ppo_objective_hand_case_with_dual_clip():
    # units: (w, A) = (2, 1) clipped high; (1, 1) kept; (0.5, -1) clipped low; (10, -1) dual-clipped; (2, -1) kept
    terms = PPOTerms(ratio=torch.tensor([[2.0, 1.0, 0.5, 10.0, 2.0]]),
                     advantages=torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]]), weight=torch.full((1, 5), 0.2))
    per, clipped, dual = ppo_objective(terms, 0.2, 0.28, 3.0)
    assert per[0].tolist() == pytest.approx([-1.28, -1.0, 0.8, 3.0, 2.0])
    assert clipped.tolist() == [[True, False, True, False, False]]
    assert dual.tolist() == [[False, False, False, True, False]]
    per_off, _, dual_off = ppo_objective(terms, 0.2, 0.28, None)  # no dual clip: the unit pays 10
    assert per_off[0, 3].item() == pytest.approx(10.0) and not dual_off.any()


def test_clip_bias_hand_case():
    # one row, 2 tokens, A = 1 each; ratios 2.0 (clipped-active) and 1.0; n = 0.5 each
    # C = .5*2*1 = 1 ; G = .5*1*1 = .5 ; C/G = 2 ; s = .5
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
    # float64 and a seeded generator: the two losses sum in different orders, and in float32 the global RNG's
    # state (which depends on test order) once gave a draw whose relative gap was 1.5e-5.
    old, logp, mask = old.double(), logp.detach().double().requires_grad_(True), mask.double()
    tid = turn_ids_from_mask(mask)
    H = int(tid.max()) + 1
    turn_adv = torch.randn(mask.shape[0], H, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    adv = scatter_turns(turn_adv, tid)
    for mode in ("sum", "geo_mean"):
        cfg = {"ratio_mode": mode, "loss_agg_mode": "token-mean"}
        a, _ = policy_loss("turn_is", logp, old, adv, mask, config={"ratio_mode": mode})
        b, _ = policy_loss("turn_ppo", logp, old, adv, mask, config=cfg)
        assert a.item() == pytest.approx(b.item(), rel=1e-10)


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


# ------------------------------------------------------------------------------------------ dual clip
def test_dual_clip_hand_cases():
    """verl's clip_ratio_c = 3: a token with ratio 10 and A = -1 costs 3.0, and so does a 5-token turn whose
    token log-ratios sum to log 10 under turn_ppo (both get no gradient)."""
    mask = torch.tensor([[0.0, 1.0]])
    logp = torch.tensor([[0.0, math.log(10.0)]], requires_grad=True)
    loss, m = policy_loss("token_ppo", logp, torch.zeros(1, 2), torch.tensor([[0.0, -1.0]]), mask)
    assert loss.item() == pytest.approx(3.0) and m["actor/dual_clip_frac"] == 1.0 and m["actor/pg_loss"] == 3.0
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.all(g == 0)
    mask = torch.tensor([[0.0, 1, 1, 1, 1, 1]])
    logp = torch.tensor([[0.0, 0.1, 0.7, 0.5, 0.4, math.log(10.0) - 1.7]], requires_grad=True)
    adv = -mask
    loss, m = policy_loss("turn_ppo", logp, torch.zeros(1, 6), adv, mask)
    assert loss.item() == pytest.approx(3.0, rel=1e-6) and m["actor/dual_clip_frac"] == 1.0
    assert torch.all(torch.autograd.grad(loss, logp)[0] == 0)
    # the geo-mean losses need a geo-mean ratio of 10: every token's log-ratio is log 10
    logp = (mask * math.log(10.0)).requires_grad_(True)
    for name in ("turn_ppo_geo", "turn_is"):
        loss, m = policy_loss(name, logp, torch.zeros(1, 6), adv, mask)
        assert loss.item() == pytest.approx(3.0, rel=1e-6), name
        assert m["actor/dual_clip_frac"] == 1.0, name
    # a bigger clip_ratio_c lets the unclipped branch through: loss 10
    loss, m = policy_loss("turn_is", logp, torch.zeros(1, 6), adv, mask, config={"clip_ratio_c": 20.0})
    assert loss.item() == pytest.approx(10.0, rel=1e-6) and m["actor/dual_clip_frac"] == 0.0


@pytest.mark.parametrize("name", ALL_LOSSES)
def test_dual_clip_bounds_every_loss(name):
    """A < 0 units cost at most c |A| in every loss, corrections included (same numbers as the loop reference)."""
    old, logp, adv, mask = _loss_inputs(8, B=6, scale=2.0)  # ratios up to e^6: many units past c
    adv = -adv.abs()
    loss, m = policy_loss(name, logp, old, adv, mask)
    ref = ref_policy_loss(name, old, logp, adv, mask)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert m["actor/dual_clip_frac"] > 0.1
    loss_nc, _ = policy_loss(name, logp, old, adv, mask, config={"clip_ratio_c": 1e6})
    assert loss_nc.item() > loss.item() + 0.3  # without the cap the same batch costs more
    assert loss.item() <= 3.0 * float(adv.abs().max()) + 1e-5


# ------------------------------------------------------------------------------------------ no silent zero
def test_turn_with_log_ratio_30_has_finite_loss_and_the_formulas_gradient():
    """Summed log-ratio 30 (ratio 1.07e13): the loss is finite and is what was differentiated; the gradient is
    zero only where (dual) clipping says so, and the formula's value where it does not."""
    mask = torch.tensor([[0.0, 1, 1, 1, 0, 1]])
    old = torch.zeros(1, 6)
    big = torch.tensor([[0.0, 10.0, 10.0, 10.0, 0.0, 0.0]])  # turn 0: log-ratio 30, turn 1: 0
    for A0, cfg, expect_loss0, grad0 in (
            (-1.0, {}, 3.0, 0.0),                                   # dual-clipped: c |A|, no gradient
            (1.0, {}, -1.28, 0.0),                                  # PPO-clipped: (1+eps) A, no gradient
            (-1.0, {"clip_ratio_c": 1e15}, math.exp(30), math.exp(30)),  # unclipped: w |A|, d/dlogp_t = w
    ):
        logp = big.clone().requires_grad_(True)
        adv = torch.tensor([[0.0, A0, A0, A0, 0.0, 1.0]])
        loss, m = policy_loss("turn_ppo", logp, old, adv, mask, config=cfg)
        (g,) = torch.autograd.grad(loss, logp)
        # turn-mean over 2 turns; turn 1 has w = 1, A = 1: loss -1
        assert torch.isfinite(loss) and loss.item() == pytest.approx(0.5 * (expect_loss0 - 1.0), rel=1e-5)
        assert m["actor/pg_loss"] == pytest.approx(loss.item(), rel=1e-6)
        assert g[0, 1:4].tolist() == pytest.approx([0.5 * grad0] * 3, rel=1e-5)
        assert g[0, 5].item() == pytest.approx(-0.5)  # turn 1 keeps its gradient: -A w n
    # far below 1 with A > 0: the gradient is -A w n = -e^-30 / 2 per token, not a clamped 0
    logp = (-big).requires_grad_(True)
    adv = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0, 1.0]])
    loss, _ = policy_loss("turn_ppo", logp, old, adv, mask)
    (g,) = torch.autograd.grad(loss, logp)
    assert g[0, 1].item() == pytest.approx(-0.5 * math.exp(-30), rel=1e-4) and g[0, 1].item() != 0.0


# ------------------------------------------------------------------------------------------ global counts
CONFIGS = [{}, {"clip_bias": True}, {"clip_bias": True, "clip_bias_level": "batch"},
           {"clip_bias": True, "clip_bias_stat": "rms", "clip_bias_level": "batch", "clip_bias_threshold": 1.5},
           {"clip_bias": True, "clip_bias_stat": "rms", "clip_bias_threshold": 1.0},
           {"clip_bias": True, "clip_bias_threshold": 3.0, "loss_agg_mode": "seq-mean-token-mean"},
           {"loss_agg_mode": "token-mean", "clip_ratio_c": 2.0},
           # the trust-region options for turn ratios (a no-op on token_ppo / s_ppo) and the other aggregations
           {"token_band": True},
           {"turn_band": "sqrt_len", "clip_bias": True},
           {"token_band": True, "turn_band": "sqrt_len", "clip_ratio_c": 2.0},
           {"loss_agg_mode": "seq-mean-turn-sum-token-norm", "token_band": True},
           # token_band's own band: token PPO's under GSPO's turn band (issue #58), and a band of its own
           {"token_band": True, "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
           {"token_band": True, "token_clip_low": 0.1, "token_clip_high": 0.15, "turn_band": "sqrt_len"},
           {"loss_agg_mode": "seq-mean-token-sum", "clip_bias": True},
           {"loss_agg_mode": "seq-mean-token-sum-norm", "loss_scale_factor": 20.0}]
TOKEN_ONLY_AGGS = ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _ref_kwargs(cfg):
    return dict(clip_bias=cfg.get("clip_bias", False), stat=cfg.get("clip_bias_stat", "mass"),
                level=cfg.get("clip_bias_level", "sample"), threshold=cfg.get("clip_bias_threshold"),
                agg=cfg.get("loss_agg_mode"), clip_c=cfg.get("clip_ratio_c", 3.0),
                token_band=cfg.get("token_band", False), turn_band=cfg.get("turn_band", "fixed"),
                loss_scale_factor=cfg.get("loss_scale_factor"), low=cfg.get("clip_ratio_low", 0.2),
                high=cfg.get("clip_ratio_high", 0.28), token_low=cfg.get("token_clip_low", 0.2),
                token_high=cfg.get("token_clip_high", 0.28))


def _valid(name, cfg):
    agg = cfg.get("loss_agg_mode")
    turn_unit = name.startswith("turn_ppo")
    return not ((agg in TOKEN_ONLY_AGGS and turn_unit) or (agg == "seq-mean-turn-sum-token-norm" and not turn_unit))


@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
@pytest.mark.parametrize("name", ALL_LOSSES)
def test_every_reading_matches_the_loop_reference(name, cfg):
    cfg = CONFIGS[cfg]
    if not _valid(name, cfg):
        pytest.skip("an aggregation of the other unit type")
    old, logp, adv, mask = _loss_inputs(3, B=6, scale=0.6)
    loss, m = policy_loss(name, logp, old, adv, mask, config=cfg)
    (grad,) = torch.autograd.grad(loss, logp)
    logp2 = logp.detach().clone().requires_grad_(True)
    ref = ref_policy_loss(name, old, logp2, adv, mask, **_ref_kwargs(cfg))
    (ref_grad,) = torch.autograd.grad(ref, logp2)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-6)


@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
@pytest.mark.parametrize("name", ALL_LOSSES)
def test_micro_batch_losses_add_up_to_the_mini_batch_loss(name, cfg):
    """With the mini-batch's GlobalCounts (and, for batch-level corrections, its summed statistics from a
    no-grad pre-pass), micro-batches of any size give the whole mini-batch's loss and gradient, and their
    metrics (each a micro-batch's share) add up to the whole mini-batch's metrics."""
    cfg = CONFIGS[cfg]
    if not _valid(name, cfg):
        pytest.skip("an aggregation of the other unit type")
    old, logp, adv, mask = _loss_inputs(12, B=8, max_turns=5, max_len=7, scale=0.6)
    fn = get_policy_loss_fn(name)
    full, m_full = fn(old, logp, adv, mask, None, cfg)
    (g_full,) = torch.autograd.grad(full, logp)
    assert 0 < m_full["actor/clip_frac_token"] < 1 and 0 < m_full["actor/approx_kl"]  # the metrics are not trivial
    counts = GlobalCounts.of(mask)
    for micro in (1, 2, 3):
        parts = [slice(i, i + micro) for i in range(0, 8, micro)]
        if needs_minibatch_stats(name, cfg):
            stats = sum(minibatch_clip_stats(name, old[p], logp[p], adv[p], mask[p], cfg, global_counts=counts)
                        for p in parts)
            counts = counts.with_clip_stats(stats)
        outs = [fn(old[p], logp[p], adv[p], mask[p], None, cfg, None, None, counts) for p in parts]
        total = sum(o[0] for o in outs)
        (g_total,) = torch.autograd.grad(total, logp)
        assert total.item() == pytest.approx(full.item(), rel=1e-5, abs=1e-7), micro
        assert torch.allclose(g_total, g_full, atol=1e-7), micro
        assert set(outs[0][1]) == set(m_full)
        for k, v in m_full.items():
            assert sum(o[1][k] for o in outs) == pytest.approx(v, rel=1e-6, abs=1e-9), (micro, k)


def test_value_loss_and_masked_mean_add_up_with_a_normaliser():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(6, 9, generator=g) > 0.4).float()
    v, old, ret, x = (torch.randn(6, 9, generator=g) for _ in range(4))
    full, _ = value_loss(v, old, ret, mask, 0.5)
    parts = sum(value_loss(v[i:i + 2], old[i:i + 2], ret[i:i + 2], mask[i:i + 2], 0.5,
                           normaliser=float(mask.sum()))[0] for i in range(0, 6, 2))
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)
    mm = sum(masked_mean(x[i:i + 4], mask[i:i + 4], float(mask.sum())) for i in range(0, 6, 4))
    assert mm.item() == pytest.approx(masked_mean(x, mask).item(), rel=1e-6)


def test_rms_reading_hand_case():
    """SORL's reading: RMS(w A) over tokens outside [0.8, 1.28] / RMS over the inside ones, 1/rho past 5."""
    mask = torch.ones(1, 4)
    old = torch.zeros(1, 4)
    # token ratios 10, 1, 1, 1 with A = 1, 1, 1, -1 (token 0 is outside the clip range)
    logp = torch.tensor([[math.log(10.0), 0.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    base, _ = policy_loss("token_ppo", logp, old, adv, mask)
    cfg = {"clip_bias": True, "clip_bias_stat": "rms"}
    loss, m = policy_loss("token_ppo", logp, old, adv, mask, config=cfg)
    # rho = sqrt(100) / sqrt(3/3) = 10 > 5: the loss is multiplied by 1/10
    assert m["actor/clip_bias_ratio"] == pytest.approx(10.0, rel=1e-6)
    assert loss.item() == pytest.approx(base.item() / 10.0, rel=1e-6)
    loss_hi, m_hi = policy_loss("token_ppo", logp, old, adv, mask, config={**cfg, "clip_bias_threshold": 12.0})
    assert loss_hi.item() == pytest.approx(base.item()) and m_hi["actor/clip_bias_scale"] == 1.0
    # the mass reading on the same batch: C = n*10, G = n*sqrt(3): ratio 5.77, scale 0.173
    _, mm = policy_loss("token_ppo", logp, old, adv, mask, config={"clip_bias": True})
    assert mm["actor/clip_bias_ratio"] == pytest.approx(10.0 / math.sqrt(3.0), rel=1e-6)


def test_loss_settings_name_the_bad_key():
    for cfg, key in (({"clip_ratio_c": 1.0}, "clip_ratio_c"), ({"clip_bias_stat": "max"}, "clip_bias_stat"),
                     ({"clip_bias_threshold": 0.5}, "clip_bias_threshold"),
                     ({"clip_bias_level": "x"}, "clip_bias_level"),
                     ({"ratio_mode": "prod"}, "ratio_mode"), ({"clip_ratio_c": float("inf")}, "clip_ratio_c")):
        with pytest.raises(ValueError, match=key):
            loss_settings(cfg)
    assert loss_settings({"clip_bias_stat": "rms"}).clip_bias_threshold == 5.0
    assert loss_settings({}).clip_bias_threshold == 1.0 and loss_settings({}).clip_c == 3.0


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


# ----------------------------------------------------------------------------------------- trust region for turn ratios
def test_mass_correction_keeps_a_rows_gradient_when_one_unit_is_dual_clipped():
    """One row, two turns: turn 0 has A = -1 and a product ratio of e^10 (dual-clipped, its loss capped at c|A|),
    turn 1 has A = +1 at ratio 1 (live). At its raw ratio turn 0 would give r = e^10 and scale turn 1's gradient to
    e^-10; it enters at c = 3: r = 3, scale 1/3."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]])
    old = torch.zeros(1, 5)
    logp = torch.tensor([[5.0, 5.0, 0.0, 0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0, 0.0, 1.0, 1.0]])
    loss, m = policy_loss("turn_ppo", logp, old, adv, mask, config={"clip_bias": True})
    assert m["actor/dual_clip_frac"] == pytest.approx(0.5) and m["actor/clip_bias_ratio"] == pytest.approx(3.0)
    (g,) = torch.autograd.grad(loss, logp)
    # turn 1's gradient: -A w n s = -1 * 1 * 1/2 * 1/3 on each of its tokens; turn 0's: none (dual-clipped)
    assert g[0, 3].item() == pytest.approx(-1 / 6) and g[0, 4].item() == pytest.approx(-1 / 6)
    assert g[0, 0].item() == 0.0 and g[0, 1].item() == 0.0


def test_token_band_takes_the_gradient_of_tokens_outside_token_ppos_band_hand_case():
    """One turn d = (+0.5, -0.5), A = +1: the turn ratio is 1 (not clipped); token 0's own ratio e^0.5 > 1.28 is
    outside token PPO's band. token_band: the value is unchanged, token 0 gets no gradient, token 1 keeps -A w n."""
    mask = torch.tensor([[1.0, 1.0]])
    old = torch.zeros(1, 2)
    adv = torch.ones(1, 2)
    for name in ("turn_ppo", "turn_ppo_geo", "turn_is", "st_ppo"):
        logp = torch.tensor([[0.5, -0.5]], requires_grad=True)
        base, _ = policy_loss(name, logp, old, adv, mask)
        loss, m = policy_loss(name, logp, old, adv, mask, config={"token_band": True})
        assert loss.item() == pytest.approx(base.item())
        (g,) = torch.autograd.grad(loss, logp)
        assert g[0, 0].item() == 0.0 and g[0, 1].item() < 0, name
        assert m["actor/token_band_frac"] == pytest.approx(0.5) and m["actor/live_frac"] == pytest.approx(0.5)
        assert m["actor/token_outside_kept_frac"] == 0.0
    # token_ppo has no turn ratio: the key changes nothing
    logp = torch.tensor([[0.5, -0.5]], requires_grad=True)
    a, _ = policy_loss("token_ppo", logp, old, adv, mask)
    b, mb = policy_loss("token_ppo", logp, old, adv, mask, config={"token_band": True})
    assert a.item() == b.item() and mb["actor/token_band_frac"] == 0.0


def test_token_band_gates_at_token_ppos_band_under_a_gspo_turn_band_hand_case():
    """Issue #58's hand case. A GSPO turn band (3e-4 / 4e-4) on a geo-mean ratio, A = +1, one turn of three tokens
    d = (+0.01, -0.01, +0.1): every token is inside token PPO's band [log 0.8, log 1.28], so token_band masks none
    and each keeps its gradient (A = -1: the turn's mean log-ratio 0.033 is above GSPO's band, which clips A < 0
    only below it, so the turn stays live). Then, A = +1, a token d = +0.4 > log 1.28: it alone is masked."""
    gspo = {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}
    old = torch.zeros(1, 3)
    mask = torch.ones(1, 3)
    adv = -torch.ones(1, 3)  # the turn's mean log-ratio 0.033 > 0: on A < 0's side it is not clipped
    for name in ("turn_ppo_geo", "turn_is", "st_ppo"):
        logp = torch.tensor([[0.01, -0.01, 0.1]], requires_grad=True)
        base, _ = policy_loss(name, logp, old, adv, mask, config=gspo)
        loss, m = policy_loss(name, logp, old, adv, mask, config={**gspo, "token_band": True})
        (g0,) = torch.autograd.grad(base, logp)
        (g,) = torch.autograd.grad(loss, logp)
        assert loss.item() == pytest.approx(base.item())
        assert torch.equal(g, g0) and bool((g != 0).all()), name  # all three keep their gradient
        assert m["actor/token_band_frac"] == 0.0
        # before the fix the gate read the turn's band: d = +-0.01 are outside 3e-4 / 4e-4 and lost it
        legacy = {**gspo, "token_band": True, "token_clip_low": 3e-4, "token_clip_high": 4e-4}
        _, m_legacy = policy_loss(name, logp, old, adv, mask, config=legacy)
        assert m_legacy["actor/token_band_frac"] == pytest.approx(1 / 3)  # d = -0.01 < log(1 - 3e-4) with A < 0
    # one token outside token PPO's band on its advantage's side: it alone is masked (A = +1, d = +0.4)
    old, mask, adv = torch.zeros(1, 4), torch.ones(1, 4), torch.ones(1, 4)
    for name in ("turn_ppo_geo", "turn_is", "st_ppo"):
        logp = torch.tensor([[0.01, -0.01, -0.5, 0.4]], requires_grad=True)  # mean -0.025: live for A > 0
        loss, m = policy_loss(name, logp, old, adv, mask, config={**gspo, "token_band": True})
        (g,) = torch.autograd.grad(loss, logp)
        assert g[0, 3].item() == 0.0 and bool((g[0, :3] != 0).all()), name
        assert m["actor/token_band_frac"] == pytest.approx(0.25)


def test_turn_band_sqrt_len_hand_cases():
    """A turn of 4 tokens, A = +1. Each d_t = 0.1 (sum 0.4): the fixed band (log 1.28 = 0.247 on the sum) clips it,
    sqrt_len (2 x 0.247 = 0.494) keeps it live. Each d_t = 0.2 (sum 0.8): both clip it. The geo-mean ratio gets the
    same band on its mean (0.494 / 4 = 0.123, where the fixed band is 0.247): mean 0.1 live under both, 0.2 clipped
    only under sqrt_len, 0.3 under both."""
    mask = torch.ones(1, 4)
    old = torch.zeros(1, 4)
    adv = torch.ones(1, 4)
    cases = {"turn_ppo": ((0.1, True, False), (0.2, True, True)),
             "turn_ppo_geo": ((0.1, False, False), (0.2, False, True), (0.3, True, True))}
    for name, rows in cases.items():
        for d, fixed_clipped, sqrt_clipped in rows:
            logp = torch.full((1, 4), d)
            _, mf = policy_loss(name, logp, old, adv, mask)
            _, ms = policy_loss(name, logp, old, adv, mask, config={"turn_band": "sqrt_len"})
            assert mf["actor/clip_frac_turn"] == float(fixed_clipped), (name, d)
            assert ms["actor/clip_frac_turn"] == float(sqrt_clipped), (name, d)
    # the clipped value is at the band's edge: turn_ppo, sum 0.8, band e^0.494
    logp = torch.full((1, 4), 0.2)
    loss, _ = policy_loss("turn_ppo", logp, old, adv, mask, config={"turn_band": "sqrt_len"})
    assert loss.item() == pytest.approx(-math.exp(2 * math.log(1.28)), rel=1e-6)
    # A < 0, sum -1.2 (each -0.3): below the sqrt band's low edge 2 log 0.8 = -0.446: clipped
    _, m = policy_loss("turn_ppo", torch.full((1, 4), -0.3), old, -adv, mask, config={"turn_band": "sqrt_len"})
    assert m["actor/clip_frac_turn"] == 1.0


def test_aggregations_hand_cases():
    """Two rows: row 0 one turn of 2 tokens, row 1 two turns of 1 and 3 tokens; all ratios 1, so each unit's loss
    is -A. seq-mean-turn-sum-token-norm: each row's turn losses summed over its tokens, mean over rows;
    seq-mean-token-sum (DrGRPO): token losses summed per row, mean over rows; -norm: divided by the constant."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0], [2.0, 0.0, 3.0, 3.0, 3.0]])
    z = torch.zeros(2, 5)
    loss, _ = policy_loss("turn_ppo", z, z, adv, mask, config={"loss_agg_mode": "seq-mean-turn-sum-token-norm"})
    assert loss.item() == pytest.approx(-((1 / 2) + (2 + 3) / 4) / 2)
    loss, _ = policy_loss("token_ppo", z, z, adv, mask, config={"loss_agg_mode": "seq-mean-token-sum"})
    assert loss.item() == pytest.approx(-((1 + 1) + (2 + 9)) / 2)
    loss, _ = policy_loss("token_ppo", z, z, adv, mask, config={"loss_agg_mode": "seq-mean-token-sum-norm",
                                                                 "loss_scale_factor": 10.0})
    assert loss.item() == pytest.approx(-((1 + 1) + (2 + 9)) / 2 / 10)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        policy_loss("token_ppo", z, z, adv, mask, config={"loss_agg_mode": "seq-mean-token-sum-norm"})
    with pytest.raises(ValueError, match="turn-unit"):
        policy_loss("turn_ppo", z, z, adv, mask, config={"loss_agg_mode": "seq-mean-token-sum"})
    for cfg, key in (({"turn_band": "wide"}, "turn_band"), ({"loss_agg_mode": "x"}, "loss_agg_mode"),
                     ({"loss_scale_factor": 0}, "loss_scale_factor")):
        with pytest.raises(ValueError, match=key):
            loss_settings(cfg)
