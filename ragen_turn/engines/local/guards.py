"""The local trainer's update guards: what keeps a bad update from being kept.

- ``actor.max_update_kl``: an actor update whose approx KL over the batch is above it is rolled back (weights and
  optimizer state: ``_rollback_point``, ``_roll_back_past``, ``update_kl``);
- the weights' soundness check (``sound_update``): an update that leaves non-finite weights, or moves them by
  more than ``MAX_RELATIVE_UPDATE`` times their norm, is put back;
- the count of steps in a row with a skipped, rolled-back or unsound update (``_after_update``), which stops the
  run at ``trainer.max_nonfinite_steps``.

:class:`UpdateGuardMixin` is part of :class:`~ragen_turn.engines.local.trainer.StarPOTrainer` (it wraps its
``update``); the PPO loop itself stays in ``trainer.py``.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, Tuple

import torch

from ragen_turn.algos import kl_penalty, masked_mean
from ragen_turn.engines.rundir import TrainingStopped
from ragen_turn.rollout import Trajectory


class UpdateGuardMixin:
    """Rollback past ``max_update_kl``, the weights' soundness check and the non-finite step count."""

    @torch.no_grad()
    def update_kl(self, batch: Trajectory) -> float:
        """How far the actor's update moved the policy: approx KL (k3, per response token, capped at 10) between
        the rollout policy and the updated one over the whole batch (one extra forward)."""
        self.actor.eval()
        new = self._forward_all(lambda *a: self.logprobs(self.actor, *a), batch)
        return float(masked_mean(kl_penalty(batch.old_logp, new, "low_var_kl"), batch.response_mask.float()))

    def _rollback_point(self, model) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
        """What a ``max_update_kl`` rollback restores: a copy of ``model``'s weights and of the actor optimizer's
        state (its moments)."""
        return ({k: v.detach().clone() for k, v in self._weights(model).items()},
                copy.deepcopy(self.actor_optim.state_dict()))

    def _roll_back_past(self, limit: float, batch: Trajectory, model, before, metrics: Dict[str, float]) -> bool:
        """``actor.max_update_kl``: the update's approx KL over ``batch`` (:meth:`update_kl`, ``actor/update_kl``);
        above ``limit`` the weights and the optimizer's state go back to ``before`` (:meth:`_rollback_point`).
        True when rolled back (``actor/update_rolled_back``)."""
        kl = metrics["actor/update_kl"] = self.update_kl(batch)
        rolled_back = not kl <= limit
        if rolled_back:
            model.load_state_dict(before[0], strict=self.lora is None)
            self.actor_optim.load_state_dict(before[1])
            self.log(f"[warn] step {self.step + 1}: the actor's update moved the policy by approx KL {kl:.4g} "
                     f"> actor_rollout_ref.actor.max_update_kl={limit}: rolled back")
        metrics["actor/update_rolled_back"] = float(rolled_back)
        return rolled_back

    def _after_update(self, metrics: Dict[str, float], skipped: int, rolled_back: bool) -> Dict[str, float]:
        """Eval mode, and the count of steps in a row whose update was skipped or rolled back."""
        self.actor.eval()
        if skipped:
            self.log(f"[warn] step {self.step + 1}: {skipped} update(s) skipped: non-finite loss or gradient")
        if skipped or rolled_back:
            self.nonfinite_in_a_row += 1
            if self.nonfinite_in_a_row >= self.cfg.trainer.max_nonfinite_steps:
                raise TrainingStopped(f"non-finite or rolled-back updates in {self.nonfinite_in_a_row} steps in a row "
                                      f"(trainer.max_nonfinite_steps={self.cfg.trainer.max_nonfinite_steps}); "
                                      f"lower the learning rate or check the rewards. {self.checkpoint_note()}")
        else:
            self.nonfinite_in_a_row = 0
        return metrics

    # -------------------------------------------------------------------------------- weights' soundness
    MAX_RELATIVE_UPDATE = 1.0  # an update moving a model's weights by more than their own norm is a blow-up

    def _trained_modules(self) -> Dict[str, torch.nn.Module]:
        mods = {"actor": self.actor}
        if self.critic is not None:
            mods["critic"] = self.critic.value_head if self.shared_critic else self.critic
        return mods

    def _weights(self, m: torch.nn.Module) -> Dict[str, torch.Tensor]:
        """What an update changes in ``m``: its state dict, or with LoRA its trainable parameters only (a copy of
        the frozen base each step would cost a full model)."""
        return m.state_dict() if self.lora is None else {n: p for n, p in m.named_parameters() if p.requires_grad}

    def sound_update(self, batch: Trajectory) -> Dict[str, float]:
        """:meth:`update`, then the weights are part of the soundness check: an update that leaves non-finite
        weights, or moves a model's weights by more than :data:`MAX_RELATIVE_UPDATE` times their norm (a finite
        blow-up, e.g. lr=1e30: the loss and gradient are finite, the weights reach 1e30 and the next rollout's
        sampling distribution is not finite) is treated like a non-finite loss: the weights and optimizer states
        are put back, the checkpoint before is not confirmed (``last_good`` stays), and the step counts toward
        ``trainer.max_nonfinite_steps``. Costs a copy of the weights and optimizer states (on the CPU) per step.
        Metrics: ``<model>/weights_update_rel`` (||w_after - w_before|| / max(||w_before||, 1))."""
        mods = self._trained_modules()
        optims = [o for o in (self.actor_optim, self.critic_optim) if o is not None]
        before = {k: {n: t.detach().to("cpu", copy=True) for n, t in self._weights(m).items()} for k, m in mods.items()}
        optim_before = [copy.deepcopy(o.state_dict()) for o in optims]
        norm_before = None if self.value_norm is None else self.value_norm.state_dict()
        in_a_row = self.nonfinite_in_a_row

        def put_back() -> None:
            for k, m in mods.items():
                m.load_state_dict(before[k], strict=self.lora is None)
            for o, state in zip(optims, optim_before):
                o.load_state_dict(state)
            if norm_before is not None:  # the critic's outputs are read at the stats it was trained with
                self.value_norm.load_state_dict(norm_before)

        try:
            metrics = self.update(batch)
        except TrainingStopped:  # stopped by a skipped update: the weights it left are not kept either
            put_back()
            raise
        bad = []
        for k, m in mods.items():
            num = den = 0.0
            finite = True
            for n, t in self._weights(m).items():
                if not t.is_floating_point():
                    continue
                a, b = t.detach().double().cpu(), before[k][n].double()  # 1e30 ** 2 overflows float32
                finite = finite and bool(torch.isfinite(a).all())
                num += float((a - b).pow(2).sum())
                den += float(b.pow(2).sum())
            # relative to the weights' norm, and to 1 at least (a zero-initialised value head starts at norm 0)
            rel = (num ** 0.5) / max(den ** 0.5, 1.0) if finite else float("inf")
            metrics[f"{k}/weights_update_rel"] = rel
            if not finite:
                bad.append(f"{k} weights not finite")
            elif not rel <= self.MAX_RELATIVE_UPDATE:
                bad.append(f"{k} weights moved by {rel:.3g} x their norm")
        metrics["actor/weights_unsound"] = float(bool(bad))
        if not bad:
            return metrics
        put_back()
        self.nonfinite_in_a_row = in_a_row + 1
        self.log(f"[warn] step {self.step + 1}: the update left unsound weights ({'; '.join(bad)}): "
                 "weights and optimizer states put back")
        if self.nonfinite_in_a_row >= self.cfg.trainer.max_nonfinite_steps:
            lr = self.cfg.actor_rollout_ref.actor.optim.lr
            raise TrainingStopped(f"unsound updates (non-finite or exploding weights, non-finite or rolled-back "
                                  f"updates) in {self.nonfinite_in_a_row} steps in a row (trainer.max_nonfinite_steps="
                                  f"{self.cfg.trainer.max_nonfinite_steps}); lower the learning rate "
                                  f"(actor_rollout_ref.actor.optim.lr={lr}). {self.checkpoint_note()}")
        return metrics
