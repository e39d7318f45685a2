"""``actor.target_kl`` and ``actor.step_scale`` on verl: an AdamW whose step reads the mini-batch's loss statistics.

verl's actor worker runs each update as ``for mini-batch: zero grads; forward/backward every micro-batch (our
loss); optimizer_step()`` (``TrainingWorker.train_mini_batch``), and builds its optimizer from
``actor.optim.optimizer_impl`` / ``optimizer`` (a module path and a class name) with
``override_optimizer_config`` as extra arguments. The verl engine's config mapping points those at this
module's :class:`AdamW` when either knob is set; the local engine implements the same rules in its own loop
(``engines/local/trainer.py``, ``_run_updates``):

- ``target_kl``: a mini-batch whose approx KL to the rollout policy (``actor/approx_kl``, measured by the loss
  before the step) is above it, or not finite, is not stepped, nor is any later mini-batch of that update;
- ``step_scale="live"``: each step's learning rate times the mini-batch's share of response tokens that still get
  gradient (``actor/live_frac``).

The loss wrapper (``turn_counts.ppo_loss_with_turn_counts``), in the same worker process, hands each
micro-batch's share of those two statistics to :func:`add_micro_batch` (summed, they are the mini-batch's values,
as the logged ones) and the update's id (the trainer's count of actor updates, a batch field) to
:func:`start_update`, which
clears the stop at a new update. With several data-parallel ranks the shares are averaged over the ranks (each
is already divided by the rank count, see ``register.global_counts``) so every rank takes the same decision.
The trainer reads which mini-batches stepped from the per-mini-batch approx KL verl returns, by the same rule
(:func:`stepped_minibatches`).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

UPDATE_FIELD = "ragen_update_id"  # the batch field carrying the update's id (a count of actor updates) to the loss

_state = {"update": None, "stopped": False, "kl": 0.0, "live": None}


def start_update(update_id: Optional[float]) -> None:
    """Called by the loss for each micro-batch: a new update id clears the previous update's stop."""
    if update_id is not None and update_id != _state["update"]:
        _state.update(update=update_id, stopped=False)


def add_micro_batch(approx_kl: Optional[float], live_frac: Optional[float]) -> None:
    """One micro-batch's shares of the mini-batch's approx KL and live fraction (None: the loss has none; the
    local engine then reads 0 and 1)."""
    _state["kl"] += float(approx_kl or 0.0)
    if live_frac is not None:
        _state["live"] = (_state["live"] or 0.0) + float(live_frac)


def _clear_minibatch_stats() -> None:
    _state["kl"], _state["live"] = 0.0, None


def _take_minibatch_stats() -> tuple:
    """The mini-batch's (approx KL, live fraction), averaged over data-parallel ranks."""
    kl, live = _state["kl"], 1.0 if _state["live"] is None else _state["live"]
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.tensor([kl, live], dtype=torch.float64,
                         device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t)
        kl, live = (t / dist.get_world_size()).tolist()
    return kl, live


def kl_stops(approx_kl: float, target_kl: Optional[float]) -> bool:
    """The early-stop rule of both engines: above the target, or not finite."""
    return target_kl is not None and not (math.isfinite(approx_kl) and approx_kl <= target_kl)


def stepped_minibatches(approx_kls: Sequence[float], target_kl: Optional[float]) -> List[bool]:
    """Which mini-batches of one update stepped, from each one's approx KL (in order)."""
    out, stopped = [], False
    for kl in approx_kls:
        stopped = stopped or kl_stops(float(kl), target_kl)
        out.append(not stopped)
    return out


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose ``step`` applies ``target_kl`` and ``step_scale`` (module docstring)."""

    def __init__(self, params, *args, target_kl: Optional[float] = None, step_scale: str = "none", **kwargs):
        if step_scale not in ("none", "live"):
            raise ValueError(f"actor_rollout_ref.actor.step_scale must be none or live, got {step_scale!r}")
        super().__init__(params, *args, **kwargs)
        self.target_kl = None if target_kl is None else float(target_kl)
        self.step_scale = step_scale

    def zero_grad(self, set_to_none: bool = True):
        """verl zeroes the gradients as each mini-batch starts: its statistics start from zero too."""
        _clear_minibatch_stats()
        return super().zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        kl, live = _take_minibatch_stats()
        if _state["stopped"] or kl_stops(kl, self.target_kl):
            _state["stopped"] = True
            return None
        if self.step_scale != "live":
            return super().step(closure)
        lrs = [g["lr"] for g in self.param_groups]
        for g in self.param_groups:
            g["lr"] = g["lr"] * live
        try:
            return super().step(closure)
        finally:
            for g, lr in zip(self.param_groups, lrs):
                g["lr"] = lr
