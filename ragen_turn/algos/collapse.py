"""RAGEN-2's collapse measures of the reasoning ``z`` (the think text) against the prompts ``x``.

Given the policy's log-probability of every sampled reasoning ``z_i`` under every distinct prompt ``x_j``
of the batch (teacher forcing ``[x_j | z_i]``), with ``col[i]`` the prompt ``z_i`` was sampled from:

- matched ``m_i = log p(z_i | x_col[i])``; marginal ``q_i = log (1/N sum_j p(z_i | x_j))`` (the prompts
  weighted uniformly, as they are in the batch);
- MI estimate ``I(X;Z) ~ mean_i (m_i - q_i)``, at most ``log N``: low means the reasoning no longer
  depends on the input (template collapse);
- its z-score ``mean_i (m_i - q_i) / (std_i q_i + eps)``;
- conditional entropy ``H(Z|X) ~ -mean_i m_i`` (low: entropy collapse) and ``H(Z) ~ -mean_i q_i``;
- retrieval accuracy: how often ``argmax_j log p(z_i | x_j)`` is ``col[i]`` (chance ``1/N``).

Per-token measures use the mean log-prob over the reasoning's tokens; ``*_seq`` ones the sum.
"""
from __future__ import annotations

import math
from typing import Dict

import torch


def collapse_measures(cross_logp_mean: torch.Tensor, cross_logp_sum: torch.Tensor, col: torch.Tensor,
                      std_eps: float = 1e-3) -> Dict[str, float]:
    """The measures from cross log-probs.

    Args:
        cross_logp_mean, cross_logp_sum: ``[NK, N]``: mean / summed token log-prob of reasoning ``i`` after
            prompt ``j``.
        col: ``[NK]`` long, the prompt each reasoning was sampled from.
    Returns:
        ``collapse/*`` floats (empty when there are fewer than 2 prompts).
    """
    if cross_logp_mean.shape != cross_logp_sum.shape or cross_logp_mean.dim() != 2:
        raise ValueError(f"cross log-probs must be [NK, N] and alike, got {tuple(cross_logp_mean.shape)} and "
                         f"{tuple(cross_logp_sum.shape)}")
    nk, n = cross_logp_mean.shape
    if col.shape != (nk,):
        raise ValueError(f"col must be [NK]={nk}, got {tuple(col.shape)}")
    if n < 2 or nk == 0:
        return {}
    rows = torch.arange(nk, device=col.device)
    out: Dict[str, float] = {"collapse/num_prompts": float(n), "collapse/num_samples": float(nk),
                             "collapse/mi_upper_bound": math.log(n)}
    for suffix, cross in (("", cross_logp_mean.double()), ("_seq", cross_logp_sum.double())):
        matched = cross[rows, col]
        marginal = torch.logsumexp(cross, dim=1) - math.log(n)
        gap = matched - marginal
        out[f"collapse/mi{suffix}_estimate"] = float(gap.mean())
        out[f"collapse/mi_zscore{suffix}"] = float((gap / (marginal.std(unbiased=False) + std_eps)).mean())
        out[f"collapse/conditional_entropy{suffix}_est"] = float(-matched.mean())
        out[f"collapse/reasoning_entropy{suffix}_est"] = float(-marginal.mean())
    out["collapse/retrieval_accuracy"] = float((cross_logp_mean.argmax(dim=1) == col).double().mean())
    out["collapse/retrieval_chance_level"] = 1.0 / n
    return out
