"""The KL penalty in the reward (verl's ``algorithm.use_kl_in_reward``): its coefficient's controllers and the
per-token penalty.

Each response token's reward loses ``beta * kl_t``, where ``kl_t`` is :func:`~.losses.kl_penalty` of the rollout
policy's log-prob (the old log-probs) against the reference model's (``algorithm.kl_penalty``: kl | abs | mse |
low_var_kl), and ``beta`` is the controller's value (``algorithm.kl_ctrl``):

- ``fixed``: ``beta = kl_coef`` always;
- ``adaptive`` (Ziegler et al. 2019, as verl's ``AdaptiveKLController``): after each step,
  ``beta *= 1 + clip(kl / target_kl - 1, -0.2, 0.2) * n / horizon``, with ``kl`` the step's mean over rows of
  each row's mean penalty over its response tokens and ``n`` the number of rows.

The controller is read (``beta``) before it is updated with this step's KL, as in verl's ``apply_kl_penalty``.
How the per-token penalty reaches each estimator (on its token, or summed into its turn) is
``engines/advantages.py``'s (the estimator's registry entry: ``token_rewards``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

import torch

from ragen_turn.cfg_get import cfg_get

from .losses import kl_penalty

KL_CTRL_TYPES = ("fixed", "adaptive")


@dataclass
class KLController:
    """The in-reward KL coefficient ``value`` (``beta``); ``adaptive`` moves it toward ``target_kl`` over
    ``horizon`` rows (see the module docstring); ``fixed`` keeps it."""

    value: float
    kind: str = "fixed"
    target_kl: float = 0.1
    horizon: int = 10000

    def __post_init__(self):
        if self.kind not in KL_CTRL_TYPES:
            raise ValueError(f"algorithm.kl_ctrl.type must be one of {KL_CTRL_TYPES}, got {self.kind!r}")
        if self.kind == "adaptive" and not (self.horizon > 0 and self.target_kl > 0):
            raise ValueError(f"algorithm.kl_ctrl.type=adaptive needs horizon > 0 and target_kl > 0, got horizon="
                             f"{self.horizon}, target_kl={self.target_kl}")

    def update(self, current_kl: float, n_steps: int) -> None:
        """After a step whose mean penalty was ``current_kl`` over ``n_steps`` rows."""
        if self.kind == "adaptive":
            error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * n_steps / self.horizon


def kl_controller(algorithm: Any) -> Optional[KLController]:
    """The controller of an ``algorithm`` config section (``kl_ctrl.type / kl_coef / target_kl / horizon``), or
    None when ``use_kl_in_reward`` is off."""
    if not bool(cfg_get(algorithm, "use_kl_in_reward", False)):
        return None
    return KLController(value=float(cfg_get(algorithm, "kl_ctrl.kl_coef", 0.001)),
                        kind=str(cfg_get(algorithm, "kl_ctrl.type", "fixed")),
                        target_kl=float(cfg_get(algorithm, "kl_ctrl.target_kl", 0.1)),
                        horizon=int(cfg_get(algorithm, "kl_ctrl.horizon", 10000)))


@torch.no_grad()
def reward_kl(old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor,
              kind: str = "kl") -> Tuple[torch.Tensor, float]:
    """The per-token KL estimate ``[B, T]`` (0 off the response) and the step's KL: the mean over rows of each
    row's mean over its response tokens (a row without response tokens counts 0, as verl's ``masked_mean``).

    Args:
        old_log_prob, ref_log_prob, response_mask: ``[B, T]``.
    """
    mask = response_mask.float()
    kld = kl_penalty(old_log_prob.float(), ref_log_prob.float(), kind) * mask
    per_row = kld.sum(dim=1) / (mask.sum(dim=1) + 1e-8)
    return kld, float(per_row.mean()) if per_row.numel() else 0.0
