"""Value-target normalisation (``critic.target_norm``): the critic fits standardised returns.

A running estimate of the critic's targets' mean and std (:class:`ValueNorm`: a debiased exponential moving
average of the mean and the mean square of each training step's targets, as MAPPO's ``ValueNorm``); the critic's
output y is in those units and its value on the return scale is ``V = y * std + mean`` (:meth:`ValueNorm.denormalize`),
which is what GAE, explained variance and the held-out read use. At each critic update (one per training step):

1. the stats the critic's outputs were read with this step are kept (``prev = norm.stats()``);
2. the stats take the step's targets (:meth:`ValueNorm.update`: ``G`` over the critic's mask);
3. the critic fits ``(G - mean) / std`` at the new stats, its value clip centred on its own outputs at rollout
   time, ``(V_old - prev.mean) / prev.std`` (so ``critic.cliprange_value`` is in the critic's output units).

Before the first update the stats are the identity (mean 0, std 1). The std is floored at :data:`MIN_STD`
(targets of one value). Pure torch and floats: the engines keep one in trainer state and checkpoint
:meth:`ValueNorm.state_dict`.
"""
from __future__ import annotations

import math
from typing import Any, Dict, NamedTuple, Optional

import torch

MIN_STD = 0.1  # std floor (MAPPO's ValueNorm clamps the variance at 1e-2)


class NormStats(NamedTuple):
    mean: float
    std: float


IDENTITY = NormStats(0.0, 1.0)


class ValueNorm:
    """Running mean / std of the critic's targets: per update, ``m <- beta m + (1 - beta) mean(G)``,
    ``s <- beta s + (1 - beta) mean(G^2)``, ``d <- beta d + (1 - beta)``; mean = m / d, var = s / d - mean^2
    (debiased: after one update the batch's own mean and variance; ``beta = 0`` is the last batch's only)."""

    def __init__(self, beta: float = 0.99):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"critic.target_norm_beta must be in [0, 1), got {beta}")
        self.beta = float(beta)
        self.m = self.s = self.d = 0.0

    def stats(self) -> NormStats:
        """``(mean, std)`` the critic's outputs are read with now (the identity before the first update)."""
        if self.d == 0.0:
            return IDENTITY
        mean = self.m / self.d
        var = max(self.s / self.d - mean * mean, 0.0)
        return NormStats(mean, max(math.sqrt(var), MIN_STD))

    def update(self, targets: torch.Tensor, mask: torch.Tensor) -> NormStats:
        """Take one step's ``targets`` over ``mask`` (any layout, same shape; float64 sums); returns the stats
        before it. No masked entry: nothing changes."""
        prev = self.stats()
        m = mask.bool()
        x = targets[m].double()
        if x.numel() == 0:
            return prev
        b = self.beta
        self.m = b * self.m + (1 - b) * float(x.mean())
        self.s = b * self.s + (1 - b) * float((x * x).mean())
        self.d = b * self.d + (1 - b)
        return prev

    def normalize(self, x: torch.Tensor, stats: Optional[NormStats] = None) -> torch.Tensor:
        """``(x - mean) / std`` at ``stats`` (default: the current ones)."""
        mean, std = stats or self.stats()
        return (x - mean) / std

    def denormalize(self, y: torch.Tensor, stats: Optional[NormStats] = None) -> torch.Tensor:
        """``y * std + mean``: the critic's output on the return scale."""
        mean, std = stats or self.stats()
        return y * std + mean

    def state_dict(self) -> Dict[str, float]:
        return {"beta": self.beta, "m": self.m, "s": self.s, "d": self.d}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.m, self.s, self.d = float(state["m"]), float(state["s"]), float(state["d"])


def value_norm(critic_cfg: Any) -> Optional[ValueNorm]:
    """The run's :class:`ValueNorm` (``critic.target_norm=true``, ``critic.target_norm_beta``), else None."""
    if critic_cfg.get("level", "none") == "none" or not critic_cfg.get("target_norm", False):
        return None
    return ValueNorm(float(critic_cfg.get("target_norm_beta", 0.99)))
