"""The local trainer's held-out evaluation: every held-out env played once at ``rollout.val_temperature``
(``val/*`` metrics), the critic's explained variance on those episodes, and the logged generations.

:func:`evaluate_policy` needs only a model and a tokenizer (``evaluate.py`` uses it on a checkpoint);
:class:`EvaluationMixin` is part of :class:`~ragen_turn.engines.local.trainer.StarPOTrainer`.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
from omegaconf import DictConfig

from ragen_turn.algos import values_before_tokens
from ragen_turn.engines.advantages import heldout_critic_explained_var
from ragen_turn.engines.runlog import episode_metrics, write_generations
from ragen_turn.rollout import ChatFormatter, EnvGroupManager, Trajectory, context_config, run_episodes, throttled
from ragen_turn.runfiles import GENERATIONS_FILE

from .sampler import LocalSampler


@torch.no_grad()
def evaluate_policy(model, tokenizer, cfg: DictConfig, envs: EnvGroupManager, device, prefix: str = "val",
                    log=None, on_batch=None) -> Dict[str, float]:
    """Play every env of ``envs`` (held-out seeds for ``val``) once at ``rollout.val_temperature``.

    ``log`` (optional) gets one progress line per turn; ``on_batch`` (optional) gets the episodes' ``Trajectory``."""
    model.eval()
    r = cfg.actor_rollout_ref.rollout
    sampler = LocalSampler(model, tokenizer, temperature=r.val_temperature, top_p=1.0 if r.val_temperature else r.top_p,
                           device=device, generator=torch.Generator().manual_seed(int(cfg.seed)),
                           micro_batch_size=r.micro_batch_size, prefix_cache=r.prefix_cache, decode=r.decode,
                           lean=r.lean_forward)
    episodes = run_episodes(envs.assign_seeds(cfg.seed, 0), sampler, ChatFormatter(tokenizer), context_config(cfg),
                            log=log)
    batch = Trajectory.from_episodes(episodes, tokenizer.pad_token_id)
    if on_batch is not None:
        on_batch(batch)
    return episode_metrics(batch, prefix)


class EvaluationMixin:
    """Held-out evaluation during training (:class:`StarPOTrainer`'s ``evaluate``)."""

    def evaluate(self, envs: Optional[EnvGroupManager] = None, prefix: str = "val") -> Dict[str, float]:
        """Held-out episodes (:func:`evaluate_policy`); with a critic, also ``<prefix>/critic_explained_var``: its
        values on those episodes against their realised returns (``heldout_critic_explained_var``)."""
        n = int(self.cfg.trainer.get("log_val_generations") or 0)
        seen: List[Trajectory] = []

        def on_batch(batch: Trajectory) -> None:
            seen.append(batch)
            if n and prefix == "val":
                write_generations(self.out_dir / GENERATIONS_FILE, self.step, batch.episodes[:n],
                                  [self.tokenizer.decode(e.token_ids) for e in batch.episodes[:n]])

        out = evaluate_policy(self.actor, self.tokenizer, self.cfg, envs or self.val_envs, self.device, prefix,
                              log=throttled(self.log, 20.0), on_batch=on_batch)
        if self.critic is not None:
            self.critic.eval()
            batch = seen[0]
            after = self.denormalized(self._forward_all(lambda ids, am, pos, _: self.critic(ids, am, pos), batch))
            batch.values = values_before_tokens(after) * batch.response_mask
            out[f"{prefix}/critic_explained_var"] = heldout_critic_explained_var(batch, self.cfg)
        return out
