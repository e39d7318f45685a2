"""The rollout filter both engines apply to a scored batch (StarPO-S's ``top_k``, RAGEN-2's ``top_p`` / ``min_p``):
which env groups are kept (:func:`select_groups`, on :func:`group_reward_stats`), the rows they hold
(:func:`filter_rows`, :func:`kept_rows`) and the padding of the kept rows to a multiple of the mini-batch
(:func:`pad_rows`).
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from ragen_turn.config import FILTER_STRATEGIES, FilterSpec, kept_group_count


def select_groups(scores: torch.Tensor, spec: FilterSpec) -> torch.Tensor:
    """Positions ``[k]`` of the kept groups among ``scores`` ``[n_groups]`` (float), best first (ties: the earlier
    group first). An empty result is possible (top_p / min_p / include_zero=False) and means: train on nothing."""
    scores = scores.float()  # RAGEN's precision: its thresholds compare in float32
    n_groups = len(scores)
    idx = torch.arange(n_groups)
    if not spec.include_zero:
        nonzero = scores.abs() > 1e-10
        scores, idx = scores[nonzero], idx[nonzero]
        if len(idx) == 0:
            return idx
    if spec.direction not in ("largest", "smallest"):
        raise ValueError(f"actor_rollout_ref.rollout.rollout_filter_type must be largest or smallest, "
                         f"got {spec.direction!r}")
    sign = 1.0 if spec.direction == "largest" else -1.0
    order = torch.argsort(-sign * scores, stable=True)  # best first
    if spec.strategy == "top_p":
        if spec.value >= 1.0:
            return idx
        if spec.top_p_prob_mode == "softmax":  # the fewest best groups whose softmax mass reaches value
            probs = torch.softmax(sign * scores, dim=0)[order]
            k = int(torch.searchsorted(torch.cumsum(probs, 0), torch.tensor(spec.value, dtype=probs.dtype))) + 1
            return idx[order[:min(k, len(idx))]]
        if spec.top_p_prob_mode != "linear":
            raise ValueError(f"actor_rollout_ref.rollout.rollout_filter_top_p_prob_mode must be linear or softmax, "
                             f"got {spec.top_p_prob_mode!r}")
        # linear: best groups first until their scores add up to value x the sum (less selection_eps); a score
        # <= 0 never counts, so groups without reward spread are not kept
        need = spec.value * scores.sum() - spec.selection_eps
        total, k = 0.0, 0
        for s in scores[order].tolist():
            if bool(total >= need) or s <= 0:
                break
            total += s
            k += 1
        return idx[order[:k]] if bool(total >= need) else idx[:0]
    if spec.strategy in ("top_k", "top_k_abs"):
        k = kept_group_count(n_groups, spec.value) if spec.strategy == "top_k" else max(int(spec.value), 1)
        return idx[order[:max(min(k, len(idx)), 1)]]
    if spec.strategy == "min_p":
        if spec.direction == "largest":
            keep = scores >= scores.max() * spec.value - 1e-10
        else:
            keep = scores <= scores.min() / (spec.value + 1e-10) + 1e-10
        return idx[keep]
    raise ValueError(f"actor_rollout_ref.rollout.rollout_filter_strategy must be one of {list(FILTER_STRATEGIES)}, "
                     f"got {spec.strategy!r}")


def group_reward_stats(group_ids: torch.Tensor, episode_rewards: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Per env group (in sorted group-id order), of its episodes' total rewards: ``ids``, ``std`` (n - 1, as RAGEN's
    ``torch.std``; 0 for a group of one), ``max``, ``mean``, ``sum``, each ``[n_groups]`` (float32)."""
    uniq = group_ids.unique()
    rows = [episode_rewards[group_ids == g].float() for g in uniq.tolist()]
    return {"ids": uniq,
            "std": torch.stack([r.std() if len(r) > 1 else r.new_zeros(()) for r in rows]),
            "max": torch.stack([r.max() for r in rows]), "mean": torch.stack([r.mean() for r in rows]),
            "sum": torch.stack([r.sum() for r in rows])}


def filter_rows(group_ids: torch.Tensor, episode_rewards: torch.Tensor,
                spec: FilterSpec) -> Tuple[torch.Tensor, Dict[str, float]]:
    """RAGEN-2's rollout filter on one batch (both engines): the indices of the rows (episodes) of the kept env
    groups, in batch order, and RAGEN's ``rollout/*`` metrics of the batch's groups and of the kept ones
    (``in_group_reward_std`` ..., ``chosen_in_group_reward_std`` ..., ``filter_kept_count`` / ``_ratio``,
    ``filter_zero_count``: groups scoring 0). ``group_ids`` / ``episode_rewards`` ``[B]``."""
    st = group_reward_stats(group_ids, episode_rewards)
    scores = {"reward_variance": st["std"], "reward": st["mean"], "reward_sum": st["sum"]}[spec.metric]
    chosen = torch.arange(len(scores)) if spec.keeps_all else select_groups(scores, spec)
    n = len(scores)
    pick = lambda v: float(v[chosen].mean()) if len(chosen) else 0.0  # noqa: E731
    metrics: Dict[str, float] = {}
    for name in ("std", "max", "mean"):
        metrics[f"rollout/in_group_{name}"] = float(st[name].mean())
        metrics[f"rollout/chosen_in_group_{name}"] = pick(st[name])
    for name in ("std", "max", "mean", "sum"):
        metrics[f"rollout/in_group_reward_{name}"] = float(st[name].mean())
        metrics[f"rollout/chosen_in_group_reward_{name}"] = pick(st[name])
    metrics["rollout/filter_kept_count"] = float(len(chosen))
    metrics["rollout/filter_kept_ratio"] = len(chosen) / n
    metrics["rollout/filter_zero_count"] = float((scores.abs() <= 1e-10).sum())
    rows = torch.isin(group_ids, st["ids"][chosen]).nonzero().flatten()
    return rows, metrics


def pad_rows(rows: torch.Tensor, multiple: int, seed: int) -> torch.Tensor:
    """``rows`` ``[k]`` with rows drawn from them (without repeats while they last; seeded) appended until the count
    is a multiple of ``multiple``: RAGEN's ``copy`` batch adjustment, for engines that split a batch evenly."""
    short = -len(rows) % multiple
    if short == 0 or len(rows) == 0:
        return rows
    g = torch.Generator().manual_seed(int(seed))
    extra = torch.cat([torch.randperm(len(rows), generator=g) for _ in range(-(-short // len(rows)))])[:short]
    return torch.cat([rows, rows[extra]])


def kept_rows(group_ids: torch.Tensor, episode_rewards: torch.Tensor, ratio: float, kind: str) -> torch.Tensor:
    """StarPO-S (top_k): the rows of the top ``ratio`` env groups by reward std (``kind`` std) or mean (mean)."""
    spec = FilterSpec(value=ratio, strategy="top_k", metric="reward_variance" if kind == "std" else "reward")
    return filter_rows(group_ids, episode_rewards, spec)[0]
