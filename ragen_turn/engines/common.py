"""The engine-agnostic half of a training step, shared by the local and the verl engines.

Both engines hand a :class:`~ragen_turn.rollout.Trajectory` (with critic ``values`` in the shared
layout: ``values[:, t]`` = V(state just before token t)) to these functions, so StarPO-S filtering,
reward normalisation and every advantage estimator exist once.
"""
from __future__ import annotations

from typing import Any

import torch

from ragen_turn.algos import (
    compute_bi_level_gae,
    compute_grpo_advantages,
    compute_token_gae,
    compute_turn_gae,
    masked_whiten,
    place_turn_rewards,
    scatter_turns,
    turn_start_values,
)
from ragen_turn.rollout import Trajectory


def kept_rows(group_ids: torch.Tensor, episode_rewards: torch.Tensor, ratio: float, kind: str) -> torch.Tensor:
    """StarPO-S: indices of the rows in the top ``ratio`` env groups by reward std (or mean)."""
    if ratio >= 1.0:
        return torch.arange(len(group_ids))
    uniq = group_ids.unique()
    score = []
    for g in uniq.tolist():
        rew = episode_rewards[group_ids == g]
        score.append(float(rew.std(unbiased=False)) if kind == "std" else float(rew.mean()))
    k = max(1, int(round(len(uniq) * ratio)))
    keep = uniq[torch.tensor(score).argsort(descending=True, stable=True)[:k]]
    return torch.isin(group_ids, keep).nonzero().flatten()


def normalized_turn_rewards(batch: Trajectory, cfg: Any) -> torch.Tensor:
    """Turn rewards ``[B, H]`` after ``agent_proxy.use_turn_scores`` and RAGEN's reward normalisation.

    Normalisation is an affine map of each episode's return R -> (R - mean) / std over its group
    (``grouping=state``) or the batch: every turn reward is divided by std and the mean comes off
    the last turn, so the per-turn structure is kept.
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
    R = tr.sum(dim=1)
    _, inv = groups.unique(return_inverse=True)
    G = int(inv.max()) + 1
    cnt = torch.zeros(G).scatter_add(0, inv, torch.ones_like(R))
    mean = torch.zeros(G).scatter_add(0, inv, R) / cnt
    scale = torch.ones_like(R)
    if method == "mean_std":
        var = torch.zeros(G).scatter_add(0, inv, (R - mean[inv]) ** 2) / cnt
        scale = 1.0 / (var.sqrt()[inv] + 1e-6)
    tr = tr * scale[:, None]
    return tr.scatter_add(1, last[:, None], (-mean[inv] * scale)[:, None]) * tm


def read_turn_values(batch: Trajectory, cfg: Any) -> None:
    """The turn critic's V(s_h) ``[B, H]``: the values at each turn's first token."""
    if cfg.critic.level == "turn":
        batch.turn_values = turn_start_values(batch.values, batch.turn_ids, batch.turn_mask.shape[1])


def compute_starpo_advantages(batch: Trajectory, cfg: Any) -> None:
    """RAGEN's token path: ``grpo``, ``token_gae`` or ``bi_level_gae``; sets advantages/returns ``[B, T]``."""
    alg = cfg.algorithm
    mask = batch.response_mask
    tr = normalized_turn_rewards(batch, cfg)
    if alg.adv_estimator == "grpo":
        adv = compute_grpo_advantages(tr.sum(dim=1), batch.group_ids, norm_by_std=alg.norm_adv_by_std_in_grpo)
        batch.advantages = adv[:, None] * mask
        batch.returns = batch.advantages.clone()
        return
    if alg.adv_estimator == "token_gae":
        adv, ret = compute_token_gae(place_turn_rewards(tr, batch.turn_ids), batch.values, mask, alg.gamma, alg.lam)
    elif alg.adv_estimator == "bi_level_gae":
        adv, ret = compute_bi_level_gae(tr, batch.values, mask, alg.gamma, alg.lam, alg.high_level_gamma)
    else:
        raise ValueError(f"the StarPO path does not compute algorithm.adv_estimator={alg.adv_estimator}")
    batch.advantages = masked_whiten(adv, mask) if alg.norm_adv else adv
    batch.returns = ret


def compute_turn_advantages(batch: Trajectory, cfg: Any) -> None:
    """Turn-PPO: turn-level GAE over V(s_h), one advantage per turn on every token of the turn.

    Other estimators (``turn_is`` / ``st_ppo`` use token GAE) go through the StarPO path.
    """
    alg = cfg.algorithm
    if alg.adv_estimator != "turn_gae":
        return compute_starpo_advantages(batch, cfg)
    tr = normalized_turn_rewards(batch, cfg)
    adv, ret = compute_turn_gae(tr, batch.turn_values, batch.turn_mask, alg.gamma, alg.lam)
    if alg.norm_adv:
        adv = masked_whiten(adv, batch.turn_mask)  # each turn is one sample of the turn-MDP
    batch.turn_returns = ret
    batch.advantages = scatter_turns(adv, batch.turn_ids) * batch.response_mask
    batch.returns = scatter_turns(ret, batch.turn_ids) * batch.response_mask
