"""The local trainer's optimizers: AdamW for the actor (with the shared critic's value head as a second group)
and for the critic, verl's constant learning rate with linear warm-up, and one clipped optimizer step.

:class:`OptimizerMixin` is part of :class:`~ragen_turn.engines.local.trainer.StarPOTrainer`; the PPO loop that
calls it (``_run_updates``) stays in ``trainer.py``, the optimizers' state in a checkpoint is
``checkpointing.py``'s.
"""
from __future__ import annotations

from typing import Optional

import torch


class OptimizerMixin:
    """Building the optimizers (``_build_optimizers``), the lr of an update (``_set_lr``) and its step
    (``_optimizer_step``)."""

    def _build_optimizers(self) -> None:
        """``actor_optim`` (the actor's trainable parameters; with ``critic.shared_backbone`` the value head too, at
        the critic's lr and weight decay) and ``critic_optim`` (a separate critic; None otherwise), each group's
        config lr kept as ``initial_lr``."""
        a, c = self.cfg.actor_rollout_ref.actor, self.cfg.critic
        groups = [{"params": [p for p in self.actor.parameters() if p.requires_grad]}]  # LoRA: the adapter
        if self.shared_critic:  # the head keeps the critic's lr and weight decay
            groups.append({"params": list(self.critic.value_head.parameters()), "lr": c.optim.lr,
                           "weight_decay": c.optim.weight_decay})
        self.actor_optim = torch.optim.AdamW(groups, lr=a.optim.lr, weight_decay=a.optim.weight_decay,
                                             betas=tuple(a.optim.betas))
        self.critic_optim = None
        if self.critic is not None and not self.shared_critic:
            self.critic_optim = torch.optim.AdamW(self.critic.parameters(), lr=c.optim.lr,
                                                  weight_decay=c.optim.weight_decay)
        for optim in filter(None, (self.actor_optim, self.critic_optim)):  # each group's config lr, which a
            for g in optim.param_groups:                                     # warm-up scales (_set_lr)
                g["initial_lr"] = g["lr"]

    def _set_lr(self, optim: torch.optim.Optimizer, optim_cfg, index: int) -> float:
        """The lr of the ``index``-th update (0-based, one per training step): each param group's config lr
        (``initial_lr``) times :func:`warmup_lr_factor`. Derived from the step alone, so a resumed run gets the
        same lr as one that never stopped. Returns the first group's lr, the one this update uses (verl logs its
        ``actor/lr`` after stepping the schedule: the next update's)."""
        f = warmup_lr_factor(optim_cfg, index, int(self.cfg.trainer.total_training_steps))
        for g in optim.param_groups:
            g["lr"] = g["initial_lr"] * f
        return optim.param_groups[0]["lr"]

    def _optimizer_step(self, model, optim, grad_clip: float, step_scale: float = 1.0) -> Optional[float]:
        """Clip and step (the step's lr times ``step_scale``); returns the grad norm before clipping, or None (and
        skips the step) if it is not finite."""
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
        if not torch.isfinite(gn):
            optim.zero_grad(set_to_none=True)
            return None
        lrs = [g["lr"] for g in optim.param_groups]
        for g in optim.param_groups:
            g["lr"] *= step_scale
        optim.step()
        for g, lr in zip(optim.param_groups, lrs):
            g["lr"] = lr
        optim.zero_grad(set_to_none=True)
        return float(gn)


def warmup_lr_factor(optim_cfg, index: int, total_steps: int) -> float:
    """verl's constant lr schedule with linear warm-up, as a factor on the config lr for update ``index``
    (0-based; one per training step): ``index / n`` while ``index < n``, then 1, where
    n = ``optim.lr_warmup_steps``, or ``int(lr_warmup_steps_ratio * total_steps)`` when that is 0 or negative
    (verl's rule; RAGEN's own FSDP worker delegates only a negative one: the two differ only for 0 with a
    ratio > 0). The first update of a warm-up thus has lr 0 (it fills Adam's moments only), as in verl and
    transformers' ``get_constant_schedule_with_warmup``. n = 0: always 1."""
    n = int(optim_cfg.get("lr_warmup_steps", -1))
    if n <= 0:
        n = int(float(optim_cfg.get("lr_warmup_steps_ratio", 0.0)) * total_steps)
    return index / n if index < n else 1.0
