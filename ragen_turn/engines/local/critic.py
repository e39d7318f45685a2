"""The local trainer's critic: where its outputs are read, its loss and targets, and its least-squares head fit.

:class:`CriticMixin` is part of :class:`~ragen_turn.engines.local.trainer.StarPOTrainer` (it reads the trainer's
``critic``, ``value_norm`` and config); the critic's targets and values in the engines' shared layout are
``engines/advantages.py``'s (``critic_targets``, ``critic_values``), the model is ``models/value_head.py``'s
``CriticModel``.
"""
from __future__ import annotations

from typing import Optional

import torch

from ragen_turn.algos import GlobalCounts, turn_boundaries, value_loss, values_before_tokens
from ragen_turn.engines.advantages import critic_targets, critic_values
from ragen_turn.rollout import Trajectory


class CriticMixin:
    """The critic's reads (``value_reads``, ``critic_values``, ``denormalized``), its loss (``critic_loss``,
    ``critic_step_loss``, ``value_targets``) and ``critic.head_init=fit`` (``fit_critic_head``)."""

    def value_reads(self, response_mask: torch.Tensor, last: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """``[B, T]`` bool: the positions whose critic output is used (the one before each response token, V of the
        state before it; ``last`` ``[B]``: each row's last real token too), so that the critic's last layer runs
        there only (``engine.last_layer_where_read``); None when that is off (every position)."""
        if not self.cfg.engine.last_layer_where_read:
            return None
        read = torch.zeros(response_mask.shape, dtype=torch.bool, device=response_mask.device)
        read[:, :-1] = response_mask[:, 1:].bool()
        if last is not None:
            read[torch.arange(read.shape[0], device=read.device), last] = True
        return read

    def critic_values(self, ids, am, pos, response_mask=None) -> torch.Tensor:
        """Critic outputs in the engines' shared layout: ``[:, t]`` = V(state just before token t) (with
        ``engine.last_layer_where_read`` and a ``response_mask``: at its tokens only, 0 elsewhere; in the
        normalised units with ``critic.target_norm``: what its loss reads)."""
        read = self.value_reads(response_mask) if response_mask is not None else None
        return values_before_tokens(self.critic(ids, am, pos, causal=self.cfg.engine.causal_attention, read=read))

    def denormalized(self, out: torch.Tensor) -> torch.Tensor:
        """The critic's outputs on the return scale: as they are, or de-normalised (``critic.target_norm``)."""
        return out if self.value_norm is None else self.value_norm.denormalize(out)

    def value_targets(self, batch: Trajectory):
        """``(values, returns, mask)`` the critic is trained on
        (:func:`~ragen_turn.engines.advantages.critic_targets`: tokens ``[B, T]``, or the turn starts ``[B, H]``
        for the turn critic): the values are the critic's before this step's update, so
        ``critic/explained_var`` over them is CleanRL's."""
        mask, old, returns = critic_targets(batch, self.cfg.critic.level)
        return old, returns, mask

    def critic_loss(self, mb: Trajectory, values: torch.Tensor, counts: Optional[GlobalCounts] = None):
        """The critic's loss on a micro-batch from fresh ``values`` ``[b, T]`` (token layout) read where
        :func:`~ragen_turn.engines.advantages.critic_targets` puts its targets: its share of the mean over the
        mini-batch's response tokens (token critic) or turns (turn critic) (``counts``)."""
        level = self.cfg.critic.level
        mask, old, returns = critic_targets(mb, level)
        n = (counts.turns if level == "turn" else counts.tokens) if counts else None
        return value_loss(critic_values(values, mb, level), old, returns, mask,
                          self.cfg.critic.cliprange_value, normaliser=n)

    def fit_critic_head(self, batch: Trajectory) -> None:
        """``critic.head_init=fit``: the value head by least squares (:meth:`CriticModel.fit_head`) on
        :meth:`critic_features` of ``batch``."""
        self.critic.fit_head(*(t.to(self.device) for t in self.critic_features(batch)))

    @torch.no_grad()
    def critic_features(self, batch: Trajectory):
        """``(X [N, H], y [N])`` on the CPU: the critic backbone's last hidden states where the critic reads its values
        (the state before each target: turn starts or response tokens) and the batch's targets there
        (``critic_targets``), in row order."""
        level = self.cfg.critic.level
        feats, ys = [], []
        self.critic.eval()
        for idx in self._micro_batches(batch):
            mb = batch.select(idx).to(self.device)
            out = self.critic.backbone(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                                       position_ids=mb.position_ids, use_cache=False)
            hidden = torch.nn.functional.pad(out.last_hidden_state.float()[:, :-1], (0, 0, 1, 0))  # [b, T, H]:
            # the state before token t, where values_before_tokens reads V
            mask, _, returns = critic_targets(mb, level)
            if level == "turn":
                starts, _ = turn_boundaries(mb.turn_ids, mask.shape[1])
                hidden = hidden.gather(1, starts[..., None].expand(-1, -1, hidden.shape[-1]))  # [b, H_turns, H]
            on = mask.bool()
            feats.append(hidden[on].cpu())
            ys.append(returns[on].float().cpu())
        return torch.cat(feats), torch.cat(ys)

    def critic_step_loss(self, mb: Trajectory, counts: Optional[GlobalCounts] = None):
        values = self.critic_values(mb.input_ids, mb.attention_mask, mb.position_ids, mb.response_mask)
        return self.critic_loss(mb, values.float(), counts)
