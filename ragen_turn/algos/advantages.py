"""Advantage estimators: GRPO, token-level GAE, turn-level GAE (Turn-PPO), RAGEN's bi-level GAE.

The maths (``compute_*``) takes each estimator's own inputs. The registry (like verl's
``register_adv_est`` / ``get_adv_estimator_fn``) holds one adapter per name, all with one keyword
signature, so a trainer dispatches with ``get_adv_estimator_fn(name)(**inputs)``::

    advantages, returns = fn(turn_rewards=[B, H], turn_mask=[B, H], turn_ids=[B, T], response_mask=[B, T],
                             group_ids=[B], values=[B, T] or None, config=algorithm config,
                             bootstrap_values=[B] or None)

``advantages`` are ``[B, T]`` (0 off the response); ``returns`` are the critic's targets in the layout of the
estimator's critic (its registry entry's ``critic_level``): ``[B, T]`` for ``none`` / ``token``, the turn
returns ``[B, H]`` (0 where ``turn_mask`` is 0) for ``turn``.

``bootstrap_values`` (``algorithm.bootstrap_truncated``): V of the state after each row's last turn for
rows cut by the context window or the turn / action budget (0 for finished rows); the GAE estimators use it
as the value after the last turn instead of 0.

All functions are pure, run under ``torch.no_grad`` and are vectorised over the batch; recurrences
over time are done with a blocked discounted reverse cumulative sum (matrix products), not a
Python loop over tokens. Shapes: ``B`` rows, ``T`` tokens, ``H`` turns.
"""
from __future__ import annotations

import torch

from typing import Any, Optional

from ragen_turn.cfg_get import cfg_get

from .checks import check_finite, check_mask, check_ndim, check_same_shape, check_unit_interval
from .registry import EstimatorSpec, Registry
from .turns import (
    compact_rows,
    place_turn_rewards,
    scatter_turns,
    turn_boundaries,
    turn_ids_from_mask,
    turn_mask_from_ids,
    turn_start_values,
    uncompact_rows,
)

# each entry carries its EstimatorSpec (the critic it reads, bootstrapping, group size): registry.py
ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator", EstimatorSpec)
register_adv_est = ADV_ESTIMATOR_REGISTRY.register  # register_adv_est(name, critic_level=, bootstraps=, ...)
get_adv_estimator_fn = ADV_ESTIMATOR_REGISTRY.lookup
adv_estimator_spec = ADV_ESTIMATOR_REGISTRY.spec  # name -> EstimatorSpec


# --------------------------------------------------------------------------------------------
# the one recurrence: A_k = x_k + discount * A_{k+1}
# --------------------------------------------------------------------------------------------
def discounted_reverse_cumsum(x: torch.Tensor, discount: float, block: int = 64) -> torch.Tensor:
    """``out[..., k] = sum_{j >= k} discount**(j-k) * x[..., j]`` along the last dim.

    Blocked: within blocks of ``block`` entries a triangular matrix of powers, across blocks a
    second (small) matrix, so the cost is two matmuls and no loop over positions. Powers that
    underflow are true zeros of the sum's weights.

    Args:
        x: ``[..., N]`` float.
    Returns:
        ``[..., N]`` same dtype as ``x``.
    """
    N = x.shape[-1]
    if N == 0:
        return x.clone()
    dtype = x.dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    xw = x.to(work)
    C = min(block, N)
    nC = -(-N // C)
    pad = nC * C - N
    if pad:
        xw = torch.nn.functional.pad(xw, (0, pad))
    xb = xw.reshape(*xw.shape[:-1], nC, C)  # [..., nC, C]
    d = torch.tensor(float(discount), dtype=work, device=x.device)
    k = torch.arange(C, device=x.device)
    gap = (k[None, :] - k[:, None]).to(work)  # [C(k), C(j)] = j - k
    W = torch.where(gap >= 0, d ** gap.clamp(min=0), torch.zeros((), dtype=work, device=x.device))
    local = xb @ W.transpose(0, 1)  # [..., nC, C]: sum within the block from k to its end
    # value at the first entry of each block, carried from all later blocks
    firsts = local[..., 0]  # [..., nC]
    c = torch.arange(nC, device=x.device)
    cgap = (c[None, :] - c[:, None]).to(work)
    Wc = torch.where(cgap >= 0, d ** (C * cgap.clamp(min=0)), torch.zeros((), dtype=work, device=x.device))
    carried_firsts = firsts @ Wc.transpose(0, 1)  # [..., nC]: full sum from each block's first entry
    nxt = torch.nn.functional.pad(carried_firsts[..., 1:], (0, 1))  # full sum from the next block's start
    tail_w = d ** (C - k).to(work)  # [C]: discount from position k to the next block's start
    out = local + nxt[..., None] * tail_w
    out = out.reshape(*xw.shape)[..., :N]
    return out.to(dtype)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``x`` to zero mean / unit variance over the entries where ``mask`` is 1.

    Args:
        x, mask: same shape. Returns the same shape; entries off the mask are 0.
    """
    m = mask.to(x.dtype)
    n = m.sum()
    if n < 2:
        return x * m
    mean = (x * m).sum() / n
    var = (((x - mean) ** 2) * m).sum() / (n - 1)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * m


# --------------------------------------------------------------------------------------------
# GRPO
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def compute_grpo_advantages(scores: torch.Tensor, group_ids: torch.Tensor, norm_by_std: bool = True,
                            eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantage of each episode (RAGEN / verl GRPO).

    ``A_i = (R_i - mean_g) / (std_g + eps)`` over the rollouts of i's group (unbiased std), or
    ``R_i - mean_g`` when ``norm_by_std`` is False. A group of one rollout gets A = 0 (no baseline
    can be formed from itself).

    Args:
        scores: ``[B]`` episode returns; group_ids: ``[B]`` int (rollouts of the same env seed).
    Returns:
        adv: ``[B]`` float.
    """
    check_ndim("scores", scores, 1)
    check_ndim("group_ids", group_ids, 1)
    check_same_shape(scores=scores, group_ids=group_ids)
    check_finite("scores", scores)
    s = scores.float()
    _, inv = torch.unique(group_ids, return_inverse=True)
    G = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(G, device=s.device).scatter_add(0, inv, torch.ones_like(s))
    mean = torch.zeros(G, device=s.device).scatter_add(0, inv, s) / count
    dev = s - mean[inv]
    var = torch.zeros(G, device=s.device).scatter_add(0, inv, dev**2) / (count - 1).clamp(min=1)
    if norm_by_std:
        denom = var.sqrt()[inv] + eps
        adv = torch.where(denom > 0, dev / denom.clamp(min=1e-30), torch.zeros_like(dev))
    else:
        adv = dev
    return torch.where(count[inv] > 1, adv, torch.zeros_like(adv))


# --------------------------------------------------------------------------------------------
# token-level GAE over the response tokens of a multi-turn episode
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def compute_token_gae(token_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
                      gamma: float, lam: float,
                      last_values: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE that skips environment tokens (RAGEN's multi-turn PPO baseline).

    ``delta_t = r_t + gamma * V_next - V_t`` where ``V_next`` is the value at the next *response*
    token of the row (environment tokens in between are skipped) and, after the last one,
    ``last_values`` (0 when not given: the episode is done); ``A_t = delta_t + gamma * lam * A_next``;
    ``returns = A + V``.

    Args:
        token_rewards: ``[B, T]`` (0 off the response; r_h sits on the last token of turn h).
        values: ``[B, T]`` critic values V_t (read where ``response_mask`` is 1).
        response_mask: ``[B, T]`` 0/1.
        last_values: ``[B]`` V of the state after the row's last turn, to bootstrap rows that were cut
            (truncated) rather than finished; 0 for finished rows.
    Returns:
        advantages, returns: ``[B, T]``, 0 off the response.
    """
    _check_gae_inputs(token_rewards=token_rewards, values=values, response_mask=response_mask, gamma=gamma,
                      lam=lam)
    mask = response_mask.float()
    if ((token_rewards != 0) & ~response_mask.bool()).any():
        raise ValueError("token_rewards is non-zero on a token where response_mask is 0 (that reward would be lost)")
    r, pmask, rank = compact_rows(token_rewards.float(), mask)
    v, _, _ = compact_rows(values.float(), mask)
    v_next = torch.nn.functional.pad(v[:, 1:], (0, 1)) * torch.nn.functional.pad(pmask[:, 1:], (0, 1))
    v_next = _bootstrap_last(v_next, pmask, last_values)
    delta = (r + gamma * v_next - v) * pmask
    adv = discounted_reverse_cumsum(delta, gamma * lam) * pmask
    advantages = uncompact_rows(adv, mask, rank)
    returns = (advantages + values.float()) * mask
    return advantages, returns


# --------------------------------------------------------------------------------------------
# turn-level GAE (Turn-PPO)
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def compute_turn_gae(turn_rewards: torch.Tensor, turn_values: torch.Tensor, turn_mask: torch.Tensor,
                     gamma: float, lam: float,
                     last_values: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE over the turn-MDP (Turn-PPO).

    ``delta_h = r_h + gamma * V(s_{h+1}) - V(s_h)``; after the row's last turn ``V(s_{h+1})`` is
    ``last_values`` (0 when not given: done); ``A_h = sum_l (gamma*lam)^l delta_{h+l}``;
    ``return_h = A_h + V(s_h)``.

    Args:
        turn_rewards: ``[B, H]`` r_h; turn_values: ``[B, H]`` V(s_h); turn_mask: ``[B, H]`` 0/1,
            a prefix of 1s per row (turns 0..n_b-1).
        last_values: ``[B]`` V of the state after the row's last turn, to bootstrap rows that were cut
            (truncated) rather than finished; 0 for finished rows.
    Returns:
        advantages, returns: ``[B, H]``, 0 where ``turn_mask`` is 0.
    """
    _check_gae_inputs(turn_rewards=turn_rewards, turn_values=turn_values, turn_mask=turn_mask, gamma=gamma,
                      lam=lam)
    m = turn_mask.float()
    if (m[:, 1:] > m[:, :-1]).any():
        raise ValueError("turn_mask must be a prefix of 1s in each row (no gap between turns)")
    v = turn_values.float() * m
    v_next = _bootstrap_last(torch.nn.functional.pad(v[:, 1:], (0, 1)), m, last_values)  # 0 after the last: done
    delta = (turn_rewards.float() + gamma * v_next - v) * m
    adv = discounted_reverse_cumsum(delta, gamma * lam) * m
    return adv, (adv + v) * m


# --------------------------------------------------------------------------------------------
# RAGEN's bi-level GAE (baseline)
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def compute_bi_level_gae(turn_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
                         gamma: float, lam: float, high_level_gamma: float,
                         turn_ends: str = "rewards") -> tuple[torch.Tensor, torch.Tensor]:
    """RAGEN's two-level GAE: turn-level GAE between turns, token-level GAE inside each turn.

    High level: values are read at the *last* token of each turn, GAE across turns with
    ``high_level_gamma`` and ``lam`` gives a return R_h per turn. Low level: inside turn h, a
    token GAE with ``gamma`` and ``lam`` whose only reward is R_h on the turn's last token and
    which does not bootstrap past the turn's end.

    ``turn_ends`` says what a turn is. ``mask``: each run of response tokens (one model answer).
    ``rewards`` (RAGEN's code): the response tokens up to and including the next token whose reward
    (turn h's reward sits on turn h's last token) is non-zero, so answers with a zero reward join the
    next one; response tokens after the last non-zero reward form a tail that is not in the high
    level and whose token GAE has no reward and bootstraps 0 past its last token. The two agree when
    every turn's reward is non-zero.

    Args:
        turn_rewards: ``[B, H]``; values: ``[B, T]``; response_mask: ``[B, T]``.
    Returns:
        advantages, returns: ``[B, T]``, 0 off the response.
    """
    _check_gae_inputs(values=values, response_mask=response_mask, gamma=gamma, lam=lam)
    check_unit_interval("high_level_gamma", high_level_gamma)
    if turn_ends not in ("mask", "rewards"):
        raise ValueError(f"algorithm.bi_level_gae_turn_ends must be mask or rewards, got {turn_ends!r}")
    turn_ids = turn_ids_from_mask(response_mask)
    H = turn_rewards.shape[1]
    if turn_ends == "rewards":  # re-cut the turns at the tokens with a non-zero reward
        on = turn_ids >= 0
        tok_r = place_turn_rewards(turn_rewards, turn_ids)
        is_end = (tok_r != 0) & on
        ends_before = is_end.long().cumsum(dim=1) - is_end.long()
        turn_ids = torch.where(on, ends_before, torch.full_like(turn_ids, -1))
        H = max(int(turn_ids.max()) + 1, 1) if on.any() else 1
        turn_rewards = torch.zeros(turn_ids.shape[0], H, dtype=tok_r.dtype, device=tok_r.device).scatter_add(
            1, turn_ids.clamp(min=0), tok_r * on)
        high_mask = (torch.arange(H, device=turn_ids.device)[None, :] < is_end.sum(dim=1, keepdim=True)).float()
    tmask = turn_mask_from_ids(turn_ids, H)
    if turn_ends == "mask":
        high_mask = tmask
    _, ends = turn_boundaries(turn_ids, H)
    v_end = values.float().gather(1, ends) * high_mask
    _, high_returns = compute_turn_gae(turn_rewards * high_mask, v_end, high_mask, high_level_gamma, lam)
    # Low level: lay each turn's tokens out as its own row [B*H, L] and run plain GAE there.
    token_rewards = place_turn_rewards(high_returns * high_mask, turn_ids)
    rows_r, rows_v, rows_m, back = _turn_rows(turn_ids, H, token_rewards.float(), values.float())
    v_next = torch.nn.functional.pad(rows_v[:, 1:], (0, 1)) * torch.nn.functional.pad(rows_m[:, 1:], (0, 1))
    delta = (rows_r + gamma * v_next - rows_v) * rows_m
    adv_rows = discounted_reverse_cumsum(delta, gamma * lam) * rows_m
    advantages = back(adv_rows)
    mask = response_mask.float()
    return advantages * mask, (advantages + values.float()) * mask


def _turn_rows(turn_ids: torch.Tensor, H: int, *xs: torch.Tensor):
    """Lay the tokens of each turn out as rows: ``[B, T]`` -> ``[B*H, L]`` (L = longest turn), in order and
    without gaps (tokens of one turn separated by tokens outside turns sit next to each other).

    Returns the laid-out tensors, the row mask ``[B*H, L]`` and a function mapping a ``[B*H, L]``
    tensor back to ``[B, T]``.
    """
    B, T = turn_ids.shape
    starts, _ = turn_boundaries(turn_ids, H)
    on = turn_ids >= 0
    rank = on.long().cumsum(dim=1) - 1  # index among the row's turn tokens (a turn may span gaps)
    offset = rank - rank.gather(1, starts.clamp(max=T - 1)).gather(1, turn_ids.clamp(min=0))  # index inside the turn
    L = int(offset[on].max()) + 1 if on.any() else 0
    flat_row = (torch.arange(B, device=turn_ids.device)[:, None] * H + turn_ids.clamp(min=0))
    spill = B * H * L  # an extra slot for tokens outside turns
    flat_idx = torch.where(on, flat_row * L + offset, torch.full_like(offset, spill))

    def lay(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(spill + 1, dtype=x.dtype, device=x.device)
        return out.scatter(0, flat_idx.reshape(-1), x.reshape(-1))[:spill].reshape(B * H, L)

    row_mask = lay(on.float())

    def back(rows: torch.Tensor) -> torch.Tensor:
        flat = torch.cat([rows.reshape(-1), rows.new_zeros(1)])
        return flat.gather(0, flat_idx.reshape(-1)).reshape(B, T)

    return (*[lay(x) for x in xs], row_mask, back)


# --------------------------------------------------------------------------------------------
# the registry: one signature for every estimator
# --------------------------------------------------------------------------------------------
# config keys (the ``algorithm`` section; a dict or an object with attributes): gamma, lam (1.0, as verl),
# high_level_gamma (0.95, RAGEN's), norm_adv (whiten: over tokens for token estimators, over turns for
# turn_gae; default true), norm_adv_by_std_in_grpo (true).
@register_adv_est("grpo", critic_level="none", bootstraps=False, min_group_size=2)
@torch.no_grad()
def grpo_advantage(*, turn_rewards: torch.Tensor, turn_mask: torch.Tensor, turn_ids: torch.Tensor,
                   response_mask: torch.Tensor, group_ids: Optional[torch.Tensor], values: Optional[torch.Tensor],
                   config: Any, bootstrap_values: Optional[torch.Tensor] = None,
                   token_rewards: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: the episode's group-normalised return on every response token; returns = advantages (no critic)."""
    _check_bootstrap("grpo", bootstrap_values)
    _check_token_rewards("grpo", token_rewards)
    scores = turn_rewards.sum(dim=1)
    adv = compute_grpo_advantages(scores, group_ids, norm_by_std=bool(cfg_get(config, "norm_adv_by_std_in_grpo", True)))
    advantages = adv[:, None] * response_mask
    return advantages, advantages.clone()


@register_adv_est("token_gae", critic_level="token", bootstraps=True, token_rewards=True)
@torch.no_grad()
def token_gae_advantage(*, turn_rewards: torch.Tensor, turn_mask: torch.Tensor, turn_ids: torch.Tensor,
                        response_mask: torch.Tensor, group_ids: Optional[torch.Tensor],
                        values: Optional[torch.Tensor], config: Any,
                        bootstrap_values: Optional[torch.Tensor] = None,
                        token_rewards: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token GAE over the response tokens, r_h on turn h's last token (:func:`compute_token_gae`), plus
    ``token_rewards`` ``[B, T]`` (the in-reward KL penalty) on their own tokens when given."""
    rewards = place_turn_rewards(turn_rewards, turn_ids)
    if token_rewards is not None:
        rewards = rewards + token_rewards.to(rewards) * response_mask
    adv, ret = compute_token_gae(rewards, values, response_mask,
                                 float(cfg_get(config, "gamma", 1.0)), float(cfg_get(config, "lam", 1.0)),
                                 last_values=bootstrap_values)
    return (masked_whiten(adv, response_mask) if cfg_get(config, "norm_adv", True) else adv), ret


@register_adv_est("bi_level_gae", critic_level="token", bootstraps=False)
@torch.no_grad()
def bi_level_gae_advantage(*, turn_rewards: torch.Tensor, turn_mask: torch.Tensor, turn_ids: torch.Tensor,
                           response_mask: torch.Tensor, group_ids: Optional[torch.Tensor],
                           values: Optional[torch.Tensor], config: Any,
                           bootstrap_values: Optional[torch.Tensor] = None,
                           token_rewards: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RAGEN's bi-level GAE (:func:`compute_bi_level_gae`; ``bi_level_gae_turn_ends``: mask | rewards)."""
    _check_bootstrap("bi_level_gae", bootstrap_values)
    _check_token_rewards("bi_level_gae", token_rewards)
    adv, ret = compute_bi_level_gae(turn_rewards, values, response_mask, float(cfg_get(config, "gamma", 1.0)),
                                    float(cfg_get(config, "lam", 1.0)),
                                    float(cfg_get(config, "high_level_gamma", 0.95)),
                                    turn_ends=str(cfg_get(config, "bi_level_gae_turn_ends", "rewards")))
    return (masked_whiten(adv, response_mask) if cfg_get(config, "norm_adv", True) else adv), ret


@register_adv_est("turn_gae", critic_level="turn", bootstraps=True)
@torch.no_grad()
def turn_gae_advantage(*, turn_rewards: torch.Tensor, turn_mask: torch.Tensor, turn_ids: torch.Tensor,
                       response_mask: torch.Tensor, group_ids: Optional[torch.Tensor], values: Optional[torch.Tensor],
                       config: Any, bootstrap_values: Optional[torch.Tensor] = None,
                       token_rewards: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-PPO's turn GAE, the one pipeline both engines run: V(s_h) = the value at turn h's first token
    (0 without a critic), :func:`compute_turn_gae` over the turns, whitened over turns (each turn is one
    sample of the turn-MDP), then turn h's advantage on every token of turn h ``[B, T]``; the returns stay per
    turn ``[B, H]`` (return_h: the turn critic's targets, ``critic_level="turn"``).
    """
    _check_token_rewards("turn_gae", token_rewards)
    H = turn_mask.shape[1]
    turn_values = turn_start_values(values.float(), turn_ids, H) if values is not None \
        else torch.zeros_like(turn_rewards, dtype=torch.float32)
    adv, ret = compute_turn_gae(turn_rewards, turn_values, turn_mask, float(cfg_get(config, "gamma", 1.0)),
                                float(cfg_get(config, "lam", 1.0)), last_values=bootstrap_values)
    if cfg_get(config, "norm_adv", True):
        adv = masked_whiten(adv, turn_mask)
    return scatter_turns(adv, turn_ids) * response_mask, ret


def _check_bootstrap(name: str, bootstrap_values: Optional[torch.Tensor]) -> None:
    """``bootstrap_values`` given to an estimator whose registry entry says it does not bootstrap."""
    if bootstrap_values is not None and not adv_estimator_spec(name).bootstraps:
        raise ValueError(f"algorithm.adv_estimator={name} does not bootstrap truncated episodes "
                         f"(algorithm.bootstrap_truncated needs one of {bootstrapping_estimators()})")


def _check_token_rewards(name: str, token_rewards: Optional[torch.Tensor]) -> None:
    """``token_rewards`` given to an estimator whose registry entry does not take per-token rewards (the caller,
    ``engines/advantages.compute_advantages``, sums them into the turn rewards for those)."""
    if token_rewards is not None and not adv_estimator_spec(name).token_rewards:
        raise ValueError(f"algorithm.adv_estimator={name} takes no per-token rewards: sum them into turn_rewards")


def bootstrapping_estimators() -> list:
    """The registered estimators that accept ``bootstrap_values`` (their spec's ``bootstraps``)."""
    return sorted(n for n in ADV_ESTIMATOR_REGISTRY if adv_estimator_spec(n).bootstraps)


def _bootstrap_last(v_next: torch.Tensor, mask: torch.Tensor, last_values: Optional[torch.Tensor]) -> torch.Tensor:
    """``v_next`` ``[B, N]`` with ``last_values`` ``[B]`` placed at each row's last masked entry (a prefix mask)."""
    if last_values is None or v_next.shape[1] == 0:
        return v_next
    check_ndim("last_values", last_values, 1)
    if last_values.shape[0] != v_next.shape[0]:
        raise ValueError(f"last_values has {last_values.shape[0]} rows, the batch {v_next.shape[0]}")
    check_finite("last_values", last_values)
    n = mask.sum(dim=1).long()
    last = (n - 1).clamp(min=0)[:, None]
    boot = (last_values.to(v_next) * (n > 0).to(v_next))[:, None]
    return v_next.scatter(1, last, boot)


def _check_gae_inputs(gamma: float, lam: float, **tensors: torch.Tensor) -> None:
    check_unit_interval("gamma", gamma)
    check_unit_interval("lam", lam)
    for name, t in tensors.items():
        check_ndim(name, t, 2)
    check_same_shape(**tensors)
    for name, t in tensors.items():
        if name.endswith("mask"):
            check_mask(name, t)
        else:
            check_finite(name, t)
