"""The advantage step both engines share, between the rollout (and its filter) and the update.

Both engines hand a :class:`~ragen_turn.rollout.Trajectory` (with critic ``values`` in the shared
layout: ``values[:, t]`` = V(state just before token t)) to these functions, so reward normalisation
(:func:`normalized_turn_rewards`), the advantage estimators (:func:`compute_advantages`: one registry lookup for
every estimator), the critic's targets (:func:`critic_targets`: every response token, or the turn starts for the
turn critic) and the advantage statistics exist once.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import torch
from omegaconf import OmegaConf

from ragen_turn.algos import (KLController, adv_estimator_spec, explained_variance, get_adv_estimator_fn, num_turns,
                              reward_kl,
                              turn_start_values, turn_sums, turn_token_counts)
from ragen_turn.algos.value_norm import ValueNorm
from ragen_turn.rollout import Trajectory


def normalized_turn_rewards(batch: Trajectory, cfg: Any) -> torch.Tensor:
    """Turn rewards ``[B, H]`` after ``agent_proxy.use_turn_scores`` and RAGEN's reward normalisation.

    Normalisation is an affine map of each episode's return R -> (R - mean) * scale over its group
    (``grouping=state``) or the batch (:func:`group_return_affine`): every turn reward is multiplied by
    the scale and the mean comes off the last turn, so the per-turn structure is kept.
    """
    ap = cfg.agent_proxy
    tr, tm = batch.turn_rewards.clone(), batch.turn_mask
    last = (tm.sum(dim=1).long() - 1).clamp(min=0)
    if not ap.use_turn_scores:
        total = tr.sum(dim=1)
        tr = torch.zeros_like(tr).scatter(1, last[:, None], total[:, None])
    method = ap.reward_normalization.method
    if method == "identity":
        return tr
    groups = batch.group_ids if ap.reward_normalization.grouping == "state" else torch.zeros_like(batch.group_ids)
    mean, scale = group_return_affine(tr.sum(dim=1), groups, method)
    tr = tr * scale[:, None]
    return tr.scatter_add(1, last[:, None], (-mean * scale)[:, None]) * tm


def group_return_affine(R: torch.Tensor, groups: torch.Tensor, method: str,
                        eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """RAGEN's per-group normalisation of episode returns as ``(R - mean) * scale``; returns mean, scale ``[B]``.

    ``mean_std``: mean and sample std (n - 1, as ``torch.std``) of the group; scale = 1 / (std + 1e-6), and 0
    (the episode's normalised return is 0) when std <= 1e-6 or the group has one episode (RAGEN's rule: a
    group without spread carries no signal). ``mean``: scale 1. As in RAGEN, when every group has one
    episode (G = 1 with ``grouping=state``) nothing is normalised: mean 0, scale 1.
    """
    if method not in ("mean_std", "mean"):
        raise ValueError(f"agent_proxy.reward_normalization.method must be identity, mean_std or mean, got {method!r}")
    R = R.double()
    _, inv = groups.unique(return_inverse=True)
    G = int(inv.max()) + 1
    cnt = torch.zeros(G, dtype=R.dtype).scatter_add(0, inv, torch.ones_like(R))
    if bool((cnt <= 1).all()):
        return torch.zeros_like(R).float(), torch.ones_like(R).float()
    mean = (torch.zeros(G, dtype=R.dtype).scatter_add(0, inv, R) / cnt)[inv]
    if method == "mean":
        return mean.float(), torch.ones_like(R).float()
    var = torch.zeros(G, dtype=R.dtype).scatter_add(0, inv, (R - mean) ** 2) / (cnt - 1).clamp(min=1)
    std = var.sqrt()[inv]
    flat = (std <= eps) | (cnt[inv] <= 1)
    scale = torch.where(flat, torch.zeros_like(std), 1.0 / (std + eps))
    return mean.float(), scale.float()


def reward_kl_penalty(batch: Trajectory, cfg: Any, ctrl: Optional[KLController]
                      ) -> Tuple[Optional[torch.Tensor], Dict[str, float]]:
    """verl's ``apply_kl_penalty`` for both engines (``algorithm.use_kl_in_reward``): the per-token reward
    ``-beta * kl_t`` ``[B, T]`` (``kl_t``: ``algorithm.kl_penalty`` of ``batch.old_logp`` against
    ``batch.ref_logp`` on the response tokens; ``beta``: ``ctrl.value`` before this step's update), and verl's
    metrics ``actor/reward_kl_penalty`` (the step's KL: mean over rows of each row's token mean) and
    ``actor/reward_kl_penalty_coeff`` (beta). The controller is then updated with that KL and the number of rows.
    ``(None, {})`` when ``ctrl`` is None (the penalty is off)."""
    if ctrl is None:
        return None, {}
    if batch.old_logp is None or batch.ref_logp is None:
        raise ValueError("algorithm.use_kl_in_reward=true needs the old and the reference log-probs of the batch")
    kld, current = reward_kl(batch.old_logp, batch.ref_logp, batch.response_mask,
                             str(cfg.algorithm.get("kl_penalty", "kl")))
    beta = float(ctrl.value)
    ctrl.update(current, batch.batch_size)
    return -beta * kld, {"actor/reward_kl_penalty": current, "actor/reward_kl_penalty_coeff": beta}


def compute_advantages(batch: Trajectory, cfg: Any, token_rewards: Optional[torch.Tensor] = None) -> None:
    """The advantage step of every trainer: ``algorithm.adv_estimator`` from the registry on the
    normalised turn rewards; sets ``batch.advantages`` ``[B, T]`` and the returns in the layout of the
    estimator's critic: ``batch.returns`` ``[B, T]``, or ``batch.turn_returns`` ``[B, H]`` (turn GAE's
    return_h, as it gives them) for a turn critic.

    ``token_rewards`` ``[B, T]`` (the in-reward KL penalty, :func:`reward_kl_penalty`), added after the
    normalisation as verl adds it to the token-level scores: an estimator whose registry entry takes per-token
    rewards (``token_rewards``: token GAE) gets it on its tokens; for the others each turn's tokens are summed
    into that turn's reward (GRPO sums the turns: the episode's score minus beta x its summed KL, as verl's
    GRPO; turn GAE: per turn; bi-level GAE: per turn, docs/SPEC.md)."""
    name = cfg.algorithm.adv_estimator
    turn_rewards, extra = normalized_turn_rewards(batch, cfg), {}
    if token_rewards is not None:
        if adv_estimator_spec(name).token_rewards:
            extra["token_rewards"] = token_rewards
        else:
            H = turn_rewards.shape[1]
            turn_rewards = turn_rewards + turn_sums(token_rewards.to(turn_rewards) * batch.response_mask,
                                                    batch.turn_ids, H) * batch.turn_mask
    batch.advantages, returns = get_adv_estimator_fn(name)(
        turn_rewards=turn_rewards, turn_mask=batch.turn_mask, turn_ids=batch.turn_ids,
        response_mask=batch.response_mask, group_ids=batch.group_ids, values=batch.values, config=cfg.algorithm,
        bootstrap_values=batch.bootstrap_values, **extra)
    if adv_estimator_spec(name).critic_level == "turn":
        batch.returns, batch.turn_returns = None, returns
    else:
        batch.returns, batch.turn_returns = returns, None


def score_metrics(batch: Trajectory, cfg: Any, token_rewards: Optional[torch.Tensor] = None) -> Dict[str, float]:
    """verl's ``critic/score/*``, ``critic/rewards/*`` and ``critic/advantages/*`` (mean, max, min; RAGEN logs them
    through verl's ``compute_data_metrics``) for the local engine (the verl engine logs verl's own): a row's score is
    its normalised reward sum (RAGEN's token-level scores), its reward that plus the in-reward KL penalty
    ``token_rewards`` ``[B, T]``; advantages over the response tokens. After :func:`compute_advantages`."""
    score = normalized_turn_rewards(batch, cfg).sum(dim=1).float()
    rewards = score if token_rewards is None else score + (token_rewards * batch.response_mask).sum(dim=1)
    out: Dict[str, float] = {}
    for name, x in (("score", score), ("rewards", rewards),
                    ("advantages", batch.advantages[batch.response_mask.bool()].float())):
        if x.numel():
            out.update({f"critic/{name}/mean": float(x.mean()), f"critic/{name}/max": float(x.max()),
                        f"critic/{name}/min": float(x.min())})
    return out


def critic_targets(batch: Trajectory, level: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the critic of ``level`` (``critic.level``: the estimator's, ``algos.adv_estimator_spec``) is
    trained on, for both engines: ``(mask, old_values, returns)``.

    - ``token``: ``[B, T]`` ``response_mask``, ``values``, ``returns``: every response token.
    - ``turn`` (the turn critic V(s_h)): ``[B, H]`` ``turn_mask``, V(s_h) (``values`` at each turn's first
      token: the value just before it) and ``turn_returns`` (return_h, as turn GAE gives it). The same critic
      as ``token``, trained only at the turn starts.

    ``old_values`` are the critic's before this step's update (so ``critic/explained_var`` over them is
    CleanRL's). A turn critic's fresh values are read with :func:`critic_values` in the same layout.
    """
    if level == "token":
        return batch.response_mask, batch.values, batch.returns
    if level == "turn":
        H = batch.turn_mask.shape[1]
        return batch.turn_mask, turn_start_values(batch.values, batch.turn_ids, H), batch.turn_returns
    raise ValueError(f"critic.level={level}: no critic to train (critic_targets needs token or turn)")


def normalised_critic_batch(norm: ValueNorm, batch: Trajectory, level: str) -> Tuple[Trajectory, Dict[str, float]]:
    """``critic.target_norm``, both engines, once per critic update: the stats take the step's targets
    (:func:`critic_targets`' returns over its mask) and a copy of ``batch`` is returned whose ``values`` are the
    critic's outputs at rollout time (``batch.values``, on the return scale, normalised at the stats before the
    update: the value clip's centre) and whose ``returns`` / ``turn_returns`` are the targets normalised at the new
    stats (``algos/value_norm.py``); other fields shared. Metrics ``critic/target_mean``, ``critic/target_std``: the
    new stats."""
    mask, _, targets = critic_targets(batch, level)
    prev = norm.update(targets, mask)
    new = norm.stats()
    rm = batch.response_mask
    out = dataclasses.replace(batch, values=norm.normalize(batch.values, prev) * rm)
    if level == "turn":
        out.turn_returns = norm.normalize(batch.turn_returns, new) * batch.turn_mask
    else:
        out.returns = norm.normalize(batch.returns, new) * rm
    return out, {"critic/target_mean": new.mean, "critic/target_std": new.std}


def critic_values(values: torch.Tensor, batch: Trajectory, level: str) -> torch.Tensor:
    """Fresh critic ``values`` ``[B, T]`` (the shared layout) in :func:`critic_targets`' layout for ``level``:
    as they are (``token``) or V(s_h) ``[B, H]`` at the turn starts (``turn``)."""
    if level == "turn":
        return turn_start_values(values, batch.turn_ids, batch.turn_mask.shape[1])
    return values


def advantage_metrics(advantages: torch.Tensor, response_mask: torch.Tensor, turn_ids: torch.Tensor,
                      response_length: int) -> dict:
    """Both engines' ``adv/*`` metrics of one batch (``[B, T]`` tensors).

    ``adv/mean``, ``adv/std``: over response tokens. A turn that sampled ``response_length`` tokens hit the
    per-turn cap (its answer was cut): ``response_length/capped_turn_frac`` is their share of turns, and
    ``adv/capped_turn_mean`` / ``adv/other_turn_mean`` the mean turn advantage (the mean over its tokens) of
    capped and of other turns (left out when the batch has no such turn). A capped mean near or above the other
    turns' says the advantage does not penalise cut answers.
    """
    on = response_mask.bool()
    adv = advantages[on]
    out = {"adv/mean": float(adv.mean()) if adv.numel() else 0.0,
           "adv/std": float(adv.std()) if adv.numel() > 1 else 0.0}
    H = num_turns(turn_ids)
    if H == 0:
        return out
    counts = turn_token_counts(turn_ids, H)
    present = counts > 0
    turn_adv = turn_sums(torch.where(on, advantages, torch.zeros_like(advantages)).float(), turn_ids, H) \
        / counts.clamp(min=1)
    capped = present & (counts >= response_length)
    other = present & ~capped
    out["response_length/capped_turn_frac"] = float(capped.sum()) / max(int(present.sum()), 1)
    if capped.any():
        out["adv/capped_turn_mean"] = float(turn_adv[capped].mean())
    if other.any():
        out["adv/other_turn_mean"] = float(turn_adv[other].mean())
    return out



def realised_returns(batch: Trajectory, cfg: Any) -> torch.Tensor:
    """The realised (Monte Carlo) returns of finished episodes in the layout of ``critic.level``'s targets
    (:func:`critic_targets`): the estimator's own returns at ``lam = 1`` with every value 0 and no bootstrap, on
    the normalised turn rewards (:func:`normalized_turn_rewards`, as the critic's training targets).

    At ``lam = 1`` GAE's values cancel, so this is the discounted reward-to-go with the run's discounts:
    ``turn_gae``: ``G_h = sum_{k >= h} gamma^(k - h) r_k`` over turns ``[B, H]``; ``token_gae``:
    ``G_t = sum_{t' >= t} gamma^(n(t, t')) r_t'`` over response tokens ``[B, T]`` (``n``: response tokens from t to
    t', turn h's reward on its last token); ``bi_level_gae``: ``high_level_gamma`` across turns, ``gamma`` inside
    a turn. An episode cut short (turn budget, context) counts as finished: the return it realised."""
    alg = cfg.algorithm
    alg = dict(OmegaConf.to_container(alg, resolve=True) if OmegaConf.is_config(alg) else alg, lam=1.0)
    name = cfg.algorithm.adv_estimator
    _, returns = get_adv_estimator_fn(name)(
        turn_rewards=normalized_turn_rewards(batch, cfg), turn_mask=batch.turn_mask, turn_ids=batch.turn_ids,
        response_mask=batch.response_mask, group_ids=batch.group_ids,
        values=torch.zeros(batch.response_mask.shape), config=alg, bootstrap_values=None)
    return returns


def heldout_critic_explained_var(batch: Trajectory, cfg: Any) -> float:
    """``val/critic_explained_var``: ``1 - Var[G - V] / Var[G]`` over held-out episodes whose critic ``values``
    (the shared layout, ``[B, T]``) are set: V(s_h) at the turn starts against ``G_h`` (turn critic), or V at every
    response token against ``G_t`` (token critic), where G is :func:`realised_returns` (nan when Var[G] = 0)."""
    level = cfg.critic.level
    mask = batch.turn_mask if level == "turn" else batch.response_mask
    return explained_variance(critic_values(batch.values.float(), batch, level), realised_returns(batch, cfg), mask)
