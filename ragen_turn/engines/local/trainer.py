"""The local engine's trainers: ``StarPOTrainer`` (RAGEN's token path) and ``TurnPPOTrainer``.

One training step, in order (CleanRL's shape, RAGEN's names)::

    rollout     BR env groups x G rollouts, multi-turn, token in / token out   -> Trajectory
    filter      StarPO-S: keep the top rollout_filter_ratio groups by reward std
    score       old log-probs, reference log-probs (KL on), critic values
    advantages  grpo | token_gae | bi_level_gae  (StarPO)   turn_gae  (Turn-PPO)
    update      critic, then actor: ppo_epochs x mini-batches (x micro-batches), grad clip
    log         one progress line, metrics.jsonl; checkpoints; held-out eval

``TurnPPOTrainer`` overrides only how values are read (V(s_h) at the turn starts), how advantages
are computed (turn-level GAE) and the critic's targets (turn returns at the turn starts); the
policy loss comes from the config by name.
"""
from __future__ import annotations

import copy
import json
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ragen_turn.algos import (
    get_policy_loss_fn,
    kl_penalty,
    masked_mean,
    turn_start_values,
    value_loss,
    values_before_tokens,
)
from ragen_turn.engines.common import (
    compute_starpo_advantages,
    compute_turn_advantages,
    kept_rows,
    read_turn_values,
)
from ragen_turn.models import CriticModel, load_model_and_tokenizer, logprobs_and_hidden, sequence_logprobs
from ragen_turn.rollout import ChatFormatter, ContextConfig, EnvGroupManager, Trajectory, run_episodes, throttled

from .sampler import LocalSampler

TOKEN_ADV = ("grpo", "token_gae", "bi_level_gae")


# ------------------------------------------------------------------------------------------------
# config checks: fail before any work, naming the key
# ------------------------------------------------------------------------------------------------
def validate_config(cfg: DictConfig) -> None:
    from ragen_turn.algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
    from ragen_turn.rollout.env_manager import parse_split

    missing = sorted(OmegaConf.missing_keys(cfg)) if OmegaConf.is_config(cfg) else []
    if missing:  # `???` values a paper config (or model=hf's path) asks for
        raise ValueError(f"missing required value(s): {', '.join(missing)} (set them on the command line)")

    adv = cfg.algorithm.adv_estimator
    if adv not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(f"algorithm.adv_estimator={adv!r} is unknown; known: {sorted(ADV_ESTIMATOR_REGISTRY)}")
    loss = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if loss not in POLICY_LOSS_REGISTRY:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.loss_mode={loss!r} is unknown; "
                         f"known: {sorted(POLICY_LOSS_REGISTRY)}")
    level = cfg.critic.level
    if level not in ("none", "token", "turn"):
        raise ValueError(f"critic.level must be none, token or turn, got {level!r}")
    needs = {"grpo": "none", "token_gae": "token", "bi_level_gae": "token", "turn_gae": "turn"}[adv]
    if level != needs:
        raise ValueError(f"algorithm.adv_estimator={adv} needs critic.level={needs}, got {level!r}")
    if cfg.critic.shared_backbone and level != "none" and \
            cfg.critic.ppo_epochs != cfg.actor_rollout_ref.actor.ppo_epochs:
        raise ValueError(f"critic.shared_backbone=true trains the critic inside the actor's update: critic.ppo_epochs="
                         f"{cfg.critic.ppo_epochs} must equal actor_rollout_ref.actor.ppo_epochs="
                         f"{cfg.actor_rollout_ref.actor.ppo_epochs}")
    parse_split(cfg.custom_envs, cfg.es_manager.train, "train")
    parse_split(cfg.custom_envs, cfg.es_manager.val, "val")
    tr = cfg.es_manager.train
    if adv == "grpo" and tr.group_size < 2:
        raise ValueError(f"es_manager.train.group_size={tr.group_size}: grpo needs group_size >= 2 "
                         "(its baseline is the group mean)")
    ratio = cfg.actor_rollout_ref.rollout.rollout_filter_ratio
    if not (0 < ratio <= 1):
        raise ValueError(f"actor_rollout_ref.rollout.rollout_filter_ratio must be in (0, 1], got {ratio}")
    kept = max(1, int(round(tr.env_groups * ratio))) * tr.group_size
    if cfg.ppo_mini_batch_size < 1 or cfg.ppo_mini_batch_size > kept:
        raise ValueError(f"ppo_mini_batch_size={cfg.ppo_mini_batch_size} must be in [1, {kept}] (the rollout batch "
                         f"after filtering: es_manager.train.env_groups x group_size x rollout_filter_ratio)")
    if cfg.micro_batch_size_per_gpu < 1:
        raise ValueError("micro_batch_size_per_gpu must be >= 1")
    if cfg.ppo_epochs < 1:
        raise ValueError("ppo_epochs must be >= 1")
    if cfg.agent_proxy.reward_normalization.method not in ("identity", "mean_std", "mean"):
        raise ValueError("agent_proxy.reward_normalization.method must be identity, mean_std or mean")
    if cfg.agent_proxy.reward_normalization.grouping not in ("state", "batch"):
        raise ValueError("agent_proxy.reward_normalization.grouping must be state or batch")
    for k in ("gamma", "lam", "high_level_gamma"):
        if not 0 <= cfg.algorithm[k] <= 1:
            raise ValueError(f"algorithm.{k} must be in [0, 1], got {cfg.algorithm[k]}")
    if cfg.trainer.total_training_steps < 0:
        raise ValueError("trainer.total_training_steps must be >= 0")
    budget = cfg.trainer.get("time_budget_s")
    if budget is not None and not float(budget) > 0:
        raise ValueError(f"trainer.time_budget_s must be null or > 0 seconds, got {budget}")
    if cfg.device not in ("auto", "cpu", "cuda") and not str(cfg.device).startswith("cuda:"):
        raise ValueError(f"device must be auto, cpu or cuda, got {cfg.device!r}")
    if str(cfg.device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={cfg.device} but CUDA is not available")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def derived_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] % (2**63))


def context_config(cfg: DictConfig) -> ContextConfig:
    ap = cfg.agent_proxy
    return ContextConfig(max_turn=ap.max_turn, action_sep=ap.action_sep, max_actions_per_turn=ap.max_actions_per_turn,
                         enable_think=ap.enable_think, max_context_tokens=ap.max_context_tokens,
                         response_length=cfg.actor_rollout_ref.rollout.response_length,
                         format_penalty=cfg.es_manager.format_penalty,
                         include_env_instruction=ap.get("include_env_instruction", True))


def model_config(cfg: DictConfig) -> Dict[str, Any]:
    m = OmegaConf.to_container(cfg.model, resolve=True)
    if cfg.get("model_path"):
        m["path"] = cfg.model_path
    return m


# ------------------------------------------------------------------------------------------------
# episode metrics
# ------------------------------------------------------------------------------------------------
def episode_metrics(batch: Trajectory, prefix: str = "env") -> Dict[str, float]:
    eps = batch.episodes
    n_actions = sum(e.num_actions for e in eps)
    n_turns = sum(e.num_turns for e in eps)
    # env-specific numbers (search_qa: em, f1, searches): mean over the episodes whose env reports them
    extra = {f"{prefix}/{k}": float(np.mean([e.metrics[k] for e in eps if k in e.metrics]))
             for k in sorted({k for e in eps for k in e.metrics})}
    return {**extra,
        f"{prefix}/success": float(np.mean([e.success for e in eps])),
        f"{prefix}/reward": float(np.mean([e.total_reward for e in eps])),
        f"{prefix}/turns": float(np.mean([e.num_turns for e in eps])),
        f"{prefix}/actions": float(np.mean([e.num_actions for e in eps])),
        f"{prefix}/invalid_action_rate": 1.0 - sum(e.num_valid_actions for e in eps) / max(n_actions, 1),
        f"{prefix}/format_error_rate": sum(e.format_errors for e in eps) / max(n_turns, 1),
        f"{prefix}/truncated": float(np.mean([e.truncated for e in eps])),
        f"{prefix}/response_tokens": float(batch.response_mask.sum(dim=1).mean()),
    }


@torch.no_grad()
def evaluate_policy(model, tokenizer, cfg: DictConfig, envs: EnvGroupManager, device, prefix: str = "val",
                    log=None) -> Dict[str, float]:
    """Play every env of ``envs`` (held-out seeds for ``val``) once at ``rollout.val_temperature``.

    ``log`` (optional) gets one progress line per turn."""
    model.eval()
    r = cfg.actor_rollout_ref.rollout
    sampler = LocalSampler(model, tokenizer, temperature=r.val_temperature, top_p=1.0 if r.val_temperature else r.top_p,
                           device=device, generator=torch.Generator().manual_seed(int(cfg.seed)),
                           micro_batch_size=r.micro_batch_size, prefix_cache=r.prefix_cache)
    episodes = run_episodes(envs.assign_seeds(cfg.seed, 0), sampler, ChatFormatter(tokenizer), context_config(cfg), log=log)
    return episode_metrics(Trajectory.from_episodes(episodes, tokenizer.pad_token_id), prefix)


# ------------------------------------------------------------------------------------------------
class StarPOTrainer:
    """RAGEN's StarPO loop on one device: grpo / token_ppo / bi_level_gae / s_ppo."""

    def __init__(self, cfg: DictConfig, log=print):
        validate_config(cfg)
        self.cfg = cfg
        self.log = log
        self.device = pick_device(cfg.device)
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
        seed_everything(cfg.seed)
        self.out_dir = Path(cfg.trainer.default_local_dir)
        existing = self.out_dir / "metrics.jsonl"
        if not cfg.trainer.resume and not cfg.trainer.get("overwrite", False) and existing.is_file() \
                and existing.stat().st_size > 0:
            raise FileExistsError(f"{self.out_dir} already holds a run ({existing}): trainer.resume=true continues "
                                  "it, trainer.overwrite=true starts it over, or set another trainer.experiment_name "
                                  "/ trainer.default_local_dir")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = self.out_dir / "checkpoints"

        self.actor, self.tokenizer = load_model_and_tokenizer(model_config(cfg), device="cpu", dtype=cfg.dtype)
        self.tokenizer.padding_side = "left"
        if cfg.model.get("warmstart", {}).get("enable", False):
            from ragen_turn.warmstart import warmstart

            self.actor = warmstart(self.actor, self.tokenizer, cfg, log=log)
        self.actor.to(self.device)
        self.ref = None
        if cfg.actor_rollout_ref.actor.use_kl_loss:
            self.ref = copy.deepcopy(self.actor).eval().requires_grad_(False)
        self.critic: Optional[CriticModel] = None
        # shared_backbone: the value head reads the actor's backbone and trains with the actor (one joint loss)
        self.shared_critic = cfg.critic.level != "none" and bool(cfg.critic.shared_backbone)
        if self.shared_critic:
            self.critic = CriticModel.on_shared_backbone(self.actor)
        elif cfg.critic.level != "none":
            self.critic = CriticModel.from_causal_lm(self.actor).to(self.device)
        if cfg.engine.get("gradient_checkpointing", False):  # recompute each layer in backward: memory for time
            for m in (self.actor, None if self.shared_critic else self.critic):
                if m is not None:
                    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        a, c = cfg.actor_rollout_ref.actor, cfg.critic
        groups = [{"params": list(self.actor.parameters())}]
        if self.shared_critic:  # the head keeps the critic's lr and weight decay
            groups.append({"params": list(self.critic.value_head.parameters()), "lr": c.optim.lr,
                           "weight_decay": c.optim.weight_decay})
        self.actor_optim = torch.optim.AdamW(groups, lr=a.optim.lr, weight_decay=a.optim.weight_decay,
                                             betas=tuple(a.optim.betas))
        self.critic_optim = None
        if self.critic is not None and not self.shared_critic:
            self.critic_optim = torch.optim.AdamW(self.critic.parameters(), lr=c.optim.lr,
                                                  weight_decay=c.optim.weight_decay)
        self.ctx = context_config(cfg)
        self.formatter = ChatFormatter(self.tokenizer)
        self.train_envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train")
        self.val_envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.val, "val")
        r = cfg.actor_rollout_ref.rollout
        self.gen = torch.Generator(device="cpu")
        self.sampler = LocalSampler(self.actor, self.tokenizer, temperature=r.temperature, top_p=r.top_p,
                                    device=self.device, generator=self.gen, micro_batch_size=r.micro_batch_size,
                                    prefix_cache=r.prefix_cache)
        self.loss_fn = get_policy_loss_fn(a.policy_loss.loss_mode)
        self.loss_cfg = OmegaConf.to_container(a.policy_loss, resolve=True)
        self.loss_cfg.update(clip_ratio_low=a.clip_ratio_low, clip_ratio_high=a.clip_ratio_high)
        self.step = 0
        self.nonfinite_in_a_row = 0
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.wandb = None
        if cfg.trainer.resume:
            self.load_checkpoint()
        elif self.metrics_path.exists():
            self.metrics_path.unlink()  # a fresh run in the same directory starts a fresh log
        (self.out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    # -------------------------------------------------------------------------------- rollout
    def rollout(self, step: int) -> Trajectory:
        self.actor.eval()
        self.gen.manual_seed(derived_seed(self.cfg.seed, step, 7))
        slots = self.train_envs.assign_seeds(self.cfg.seed, step)
        episodes = run_episodes(slots, self.sampler, self.formatter, self.ctx)
        return Trajectory.from_episodes(episodes, self.tokenizer.pad_token_id)

    def filter_groups(self, batch: Trajectory) -> Trajectory:
        """StarPO-S: keep the top ``rollout_filter_ratio`` env groups by reward std (or mean)."""
        r = self.cfg.actor_rollout_ref.rollout
        if r.rollout_filter_ratio >= 1.0:
            return batch
        return batch.select(kept_rows(batch.group_ids, batch.episode_rewards, r.rollout_filter_ratio,
                                      r.rollout_filter_type))

    # -------------------------------------------------------------------------------- scoring
    def _micro_batches(self, n: int) -> List[torch.Tensor]:
        mb = self.cfg.micro_batch_size_per_gpu
        return [torch.arange(i, min(i + mb, n)) for i in range(0, n, mb)]

    @torch.no_grad()
    def _forward_all(self, fn, batch: Trajectory) -> torch.Tensor:
        """``fn(ids, am, pos, response_mask)`` over micro-batches, concatenated on the CPU."""
        outs = []
        for idx in self._micro_batches(batch.batch_size):
            dev = self.device
            outs.append(fn(batch.input_ids[idx].to(dev), batch.attention_mask[idx].to(dev),
                           batch.position_ids[idx].to(dev), batch.response_mask[idx].to(dev)).float().cpu())
        return torch.cat(outs, dim=0)

    def logprobs(self, model, ids, am, pos, response_mask, **kw):
        """Log-probs of the response tokens at the sampling temperature (so ratios compare like with like);
        0 on other tokens."""
        return sequence_logprobs(model, ids, am, pos, temperature=self.cfg.actor_rollout_ref.rollout.temperature or 1.0,
                                 token_mask=response_mask, **kw)

    def critic_values(self, ids, am, pos) -> torch.Tensor:
        """Critic values in the engines' shared layout: ``[:, t]`` = V(state just before token t)."""
        return values_before_tokens(self.critic(ids, am, pos))

    def score(self, batch: Trajectory) -> None:
        self.actor.eval()
        batch.old_logp = self._forward_all(lambda *a: self.logprobs(self.actor, *a), batch)
        if self.ref is not None:
            batch.ref_logp = self._forward_all(lambda *a: self.logprobs(self.ref, *a), batch)
        if self.critic is not None:
            self.critic.eval()
            batch.values = self._forward_all(lambda ids, am, pos, _: self.critic_values(ids, am, pos), batch) \
                * batch.response_mask
            self.read_values(batch)

    def read_values(self, batch: Trajectory) -> None:
        """Hook: derived value layouts (the turn critic's V(s_h))."""

    def compute_advantages(self, batch: Trajectory) -> None:
        """Hook: advantages and returns (RAGEN's grpo / token GAE / bi-level GAE)."""
        compute_starpo_advantages(batch, self.cfg)

    # -------------------------------------------------------------------------------- critic
    def critic_loss(self, mb: Trajectory, values: torch.Tensor):
        """Hook: the critic's loss on a micro-batch from fresh ``values`` ``[b, T]`` (token layout)."""
        return value_loss(values, mb.values.to(values.device), mb.returns.to(values.device),
                          mb.response_mask.to(values.device), self.cfg.critic.cliprange_value)

    # -------------------------------------------------------------------------------- update
    def _minibatches(self, n: int, epoch: int) -> List[torch.Tensor]:
        g = torch.Generator().manual_seed(derived_seed(self.cfg.seed, self.step, epoch, 11))
        perm = torch.randperm(n, generator=g)
        bm = self.cfg.ppo_mini_batch_size
        return [perm[i:i + bm] for i in range(0, n, bm) if len(perm[i:i + bm]) > 0]

    def _optimizer_step(self, model, optim, grad_clip: float) -> Optional[float]:
        """Clip and step; returns the grad norm, or None (and skips the step) if it is not finite."""
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
        if not torch.isfinite(gn):
            optim.zero_grad(set_to_none=True)
            return None
        optim.step()
        optim.zero_grad(set_to_none=True)
        return float(gn)

    def _run_updates(self, batch: Trajectory, model, optim, loss_of, epochs: int, grad_clip: float, prefix: str):
        """PPO epochs x mini-batches x micro-batches with gradient accumulation. Returns mean metrics."""
        model.train()
        acc: Dict[str, List[float]] = {}
        skipped = 0
        for epoch in range(epochs):
            for mini in self._minibatches(batch.batch_size, epoch):
                optim.zero_grad(set_to_none=True)
                mb_size = len(mini)
                ok = True
                for i in range(0, mb_size, self.cfg.micro_batch_size_per_gpu):
                    micro = batch.select(mini[i:i + self.cfg.micro_batch_size_per_gpu])
                    loss, metrics = loss_of(micro)
                    if not torch.isfinite(loss):
                        ok = False
                        break
                    (loss * (micro.batch_size / mb_size)).backward()
                    for k, v in metrics.items():
                        acc.setdefault(k, []).append(v)
                gn = self._optimizer_step(model, optim, grad_clip) if ok else None
                if gn is None:
                    optim.zero_grad(set_to_none=True)
                    skipped += 1
                else:
                    acc.setdefault(f"{prefix}/grad_norm", []).append(gn)
        out = {k: float(np.nanmean(v)) for k, v in acc.items()}
        out[f"{prefix}/skipped_updates"] = float(skipped)
        return out, skipped

    def actor_loss(self, mb: Trajectory):
        dev = self.device
        ids, am, pos = mb.input_ids.to(dev), mb.attention_mask.to(dev), mb.position_ids.to(dev)
        logp, ent = self.logprobs(self.actor, ids, am, pos, mb.response_mask.to(dev), return_entropy=True)
        return self.policy_loss(mb, logp, ent)

    def joint_loss(self, mb: Trajectory):
        """Shared backbone: policy loss + ``critic.vf_coef`` x value loss from one forward of the actor."""
        dev = self.device
        ids, am, pos = mb.input_ids.to(dev), mb.attention_mask.to(dev), mb.position_ids.to(dev)
        logp, ent, hidden = logprobs_and_hidden(self.actor, ids, am, pos,
                                                temperature=self.cfg.actor_rollout_ref.rollout.temperature or 1.0,
                                                token_mask=mb.response_mask.to(dev))
        loss, metrics = self.policy_loss(mb, logp, ent)
        v_loss, v_metrics = self.critic_loss(mb, values_before_tokens(self.critic.values_from_hidden(hidden)))
        metrics.update(v_metrics)
        return loss + self.cfg.critic.vf_coef * v_loss, metrics

    def policy_loss(self, mb: Trajectory, logp: torch.Tensor, ent: torch.Tensor):
        """The configured policy loss (+ entropy bonus, + KL to the reference) from fresh ``logp``/``ent`` [b, T]."""
        a = self.cfg.actor_rollout_ref.actor
        dev = self.device
        mask = mb.response_mask.to(dev)
        loss, metrics = self.loss_fn(mb.old_logp.to(dev), logp, mb.advantages.to(dev), mask, None, self.loss_cfg, None,
                                     mb.turn_ids.to(dev))
        entropy = masked_mean(ent, mask)
        metrics["actor/entropy"] = float(entropy.detach())
        if a.entropy_coeff:
            loss = loss - a.entropy_coeff * entropy
        if self.ref is not None:
            kl = masked_mean(kl_penalty(logp, mb.ref_logp.to(dev), a.kl_loss_type), mask)
            metrics["actor/kl_loss"] = float(kl.detach())
            loss = loss + a.kl_loss_coef * kl
        return loss, metrics

    def critic_step_loss(self, mb: Trajectory):
        dev = self.device
        values = self.critic_values(mb.input_ids.to(dev), mb.attention_mask.to(dev), mb.position_ids.to(dev))
        return self.critic_loss(mb, values.float())

    def update(self, batch: Trajectory) -> Dict[str, float]:
        metrics: Dict[str, float] = {}
        skipped = 0
        if self.critic is not None and not self.shared_critic:
            m, s = self._run_updates(batch, self.critic, self.critic_optim, self.critic_step_loss,
                                     self.cfg.critic.ppo_epochs, self.cfg.critic.grad_clip, "critic")
            metrics.update(m)
            skipped += s
        model, loss_of = self.actor, self.actor_loss
        if self.shared_critic:  # one optimizer step on actor + value head (clipped together)
            model, loss_of = torch.nn.ModuleList([self.actor, self.critic.value_head]), self.joint_loss
        m, s = self._run_updates(batch, model, self.actor_optim, loss_of,
                                 self.cfg.actor_rollout_ref.actor.ppo_epochs,
                                 self.cfg.actor_rollout_ref.actor.grad_clip, "actor")
        metrics.update(m)
        skipped += s
        self.actor.eval()
        if skipped:
            self.nonfinite_in_a_row += 1
            self.log(f"[warn] step {self.step}: {skipped} update(s) skipped: non-finite loss or gradient")
            if self.nonfinite_in_a_row >= self.cfg.trainer.max_nonfinite_steps:
                raise RuntimeError(f"non-finite loss/gradient in {self.nonfinite_in_a_row} steps in a row "
                                   f"(trainer.max_nonfinite_steps={self.cfg.trainer.max_nonfinite_steps}); "
                                   "lower the learning rate or check the rewards")
        else:
            self.nonfinite_in_a_row = 0
        return metrics

    # -------------------------------------------------------------------------------- one step
    def train_step(self) -> Dict[str, float]:
        t0 = time.time()
        reused0 = getattr(self.sampler, "cached_tokens_reused", 0)
        batch = self.rollout(self.step)
        t_roll = time.time() - t0
        metrics = episode_metrics(batch)
        batch = self.filter_groups(batch)
        self.score(batch)
        self.compute_advantages(batch)
        adv = batch.advantages[batch.response_mask.bool()]
        metrics["adv/mean"], metrics["adv/std"] = float(adv.mean()), float(adv.std()) if adv.numel() > 1 else 0.0
        if not torch.isfinite(adv).all():
            self.nonfinite_in_a_row += 1
            self.log(f"[warn] step {self.step}: non-finite advantages, update skipped")
            if self.nonfinite_in_a_row >= self.cfg.trainer.max_nonfinite_steps:
                raise RuntimeError("non-finite advantages in too many steps in a row")
        else:
            t1 = time.time()
            metrics.update(self.update(batch))
            metrics["perf/update_s"] = time.time() - t1
        dt = time.time() - t0
        metrics["perf/rollout_s"] = t_roll
        metrics["perf/step_s"] = dt
        metrics["perf/tokens_per_s"] = float(batch.attention_mask.sum()) / max(dt, 1e-9)
        metrics["perf/sampled_tokens_per_s"] = float(batch.response_mask.sum()) / max(t_roll, 1e-9)
        metrics["perf/prefix_cache_tokens"] = float(getattr(self.sampler, "cached_tokens_reused", 0) - reused0)
        metrics["env/kept_episodes"] = float(batch.batch_size)
        return metrics

    def evaluate(self, envs: Optional[EnvGroupManager] = None, prefix: str = "val") -> Dict[str, float]:
        return evaluate_policy(self.actor, self.tokenizer, self.cfg, envs or self.val_envs, self.device, prefix,
                               log=throttled(self.log, 20.0))

    def fit(self) -> Dict[str, float]:
        cfg = self.cfg.trainer
        total = cfg.total_training_steps
        self.log(f"[ragen_turn] {self.cfg.trainer.experiment_name}: {type(self).__name__}, "
                 f"algo={self.cfg.algo.name} loss={self.cfg.actor_rollout_ref.actor.policy_loss.loss_mode} "
                 f"adv={self.cfg.algorithm.adv_estimator} critic={self.cfg.critic.level} device={self.device} "
                 f"batch={len(self.train_envs)} episodes, steps {self.step}->{total}, out={self.out_dir}")
        last: Dict[str, float] = {}
        budget = cfg.get("time_budget_s")
        started = time.time()
        if self.step == 0 and cfg.val_before_train:
            t = time.time()
            last = {"step": 0, **self.evaluate()}
            last["perf/val_s"] = time.time() - t
            self._write_metrics(last)
            self.log(self._progress(last))
        while self.step < total:
            metrics = self.train_step()
            self.step += 1
            metrics["step"] = self.step
            final = self.step == total
            if budget is not None and not final and time.time() - started >= float(budget):
                self.log(f"[ragen_turn] trainer.time_budget_s={budget} spent after step {self.step}: "
                         f"final evaluation and checkpoint (resume with trainer.resume=true)")
                final = True
            if (cfg.test_freq and self.step % cfg.test_freq == 0) or final:
                t = time.time()
                metrics.update(self.evaluate())
                metrics["perf/val_s"] = time.time() - t
            self._write_metrics(metrics)
            self.log(self._progress(metrics))
            if (cfg.save_freq and self.step % cfg.save_freq == 0) or final:
                self.save_checkpoint()
            last = metrics
            if final:
                break
        return last

    # -------------------------------------------------------------------------------- logging
    def _write_metrics(self, metrics: Dict[str, float]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(clean, sort_keys=True) + "\n")
        if self.cfg.logger == "wandb":
            self._wandb_log(metrics)

    def _wandb_log(self, metrics: Dict[str, float]) -> None:
        if self.wandb is None:
            try:
                import wandb
            except ImportError as e:
                raise RuntimeError("logger=wandb needs `pip install wandb`") from e
            os.environ.setdefault("WANDB_MODE", self.cfg.wandb.mode)
            self.wandb = wandb.init(project=self.cfg.wandb.project, name=self.cfg.trainer.experiment_name,
                                    dir=str(self.out_dir), config=OmegaConf.to_container(self.cfg, resolve=True))
        self.wandb.log(metrics, step=int(metrics.get("step", self.step)))

    @staticmethod
    def _progress(m: Dict[str, float]) -> str:
        def f(key, fmt="{:.3f}"):
            v = m.get(key)
            return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

        parts = [f"step {int(m.get('step', 0)):4d}"]
        if "env/reward" in m:
            parts += [f"reward {f('env/reward')}", f"success {f('env/success')}",
                      f"clip_tok {f('actor/clip_frac_token')}", f"clip_turn {f('actor/clip_frac_turn')}",
                      f"kl {f('actor/approx_kl', '{:.4f}')}", f"ent {f('actor/entropy')}",
                      f"vloss {f('critic/value_loss')}",
                      f"tok/s {f('perf/tokens_per_s', '{:.0f}')}", f"{f('perf/step_s', '{:.1f}')}s"]
        if "val/success" in m:
            parts += [f"| val success {f('val/success')} reward {f('val/reward')} invalid "
                      f"{f('val/invalid_action_rate')}"]
        return "  ".join(parts)

    # -------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        final = self.ckpt_dir / f"step_{self.step:06d}"
        tmp = self.ckpt_dir / f".tmp_step_{self.step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.actor.save_pretrained(tmp / "actor")
        self.tokenizer.save_pretrained(tmp / "actor")
        state = {"step": self.step, "nonfinite_in_a_row": self.nonfinite_in_a_row,
                 "actor_optim": self.actor_optim.state_dict(),
                 "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}}
        if self.shared_critic:
            self.critic.save_value_head(tmp / "critic")
        elif self.critic is not None:
            self.critic.save_pretrained(tmp / "critic")
            state["critic_optim"] = self.critic_optim.state_dict()
        torch.save(state, tmp / "trainer_state.pt")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        (self.ckpt_dir / "latest").write_text(final.name + "\n")
        keep = self.cfg.trainer.keep_checkpoints
        if keep and keep > 0:
            for old in sorted(self.ckpt_dir.glob("step_*"))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        return final

    def load_checkpoint(self) -> bool:
        latest = self.ckpt_dir / "latest"
        if not latest.exists():
            self.log(f"[ragen_turn] trainer.resume=true but no checkpoint in {self.ckpt_dir}: starting fresh")
            if self.metrics_path.exists():
                self.metrics_path.unlink()
            return False
        path = self.ckpt_dir / latest.read_text().strip()
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(path / "actor", dtype=self.dtype, local_files_only=True)
        self.actor.load_state_dict(loaded.state_dict())
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        self.actor_optim.load_state_dict(state["actor_optim"])
        if self.shared_critic:
            self.critic.load_value_head(path / "critic")
        elif self.critic is not None:
            loaded_c = CriticModel.from_pretrained(path / "critic", dtype=self.cfg.dtype)
            self.critic.load_state_dict(loaded_c.state_dict())
            self.critic_optim.load_state_dict(state["critic_optim"])
        self.step = int(state["step"])
        self.nonfinite_in_a_row = int(state["nonfinite_in_a_row"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        if self.metrics_path.exists():  # drop log lines written after the checkpoint
            lines = [ln for ln in self.metrics_path.read_text().splitlines()
                     if ln.strip() and json.loads(ln).get("step", 0) <= self.step]
            self.metrics_path.write_text("".join(ln + "\n" for ln in lines))
        self.log(f"[ragen_turn] resumed from {path} at step {self.step}")
        return True


class TurnPPOTrainer(StarPOTrainer):
    """Turn-PPO: turn critic V(s_h), turn-level GAE, the configured turn-level loss.

    Also runs ``turn_is`` / ``st_ppo`` (token critic, token GAE, turn-level ratio): for those only
    the loss differs from the StarPO path.
    """

    def read_values(self, batch: Trajectory) -> None:
        read_turn_values(batch, self.cfg)

    def compute_advantages(self, batch: Trajectory) -> None:
        compute_turn_advantages(batch, self.cfg)

    def critic_loss(self, mb: Trajectory, values: torch.Tensor):
        if self.cfg.critic.level != "turn":
            return super().critic_loss(mb, values)
        dev = values.device
        H = mb.turn_mask.shape[1]
        turn_ids = mb.turn_ids.to(dev)
        v = turn_start_values(values, turn_ids, H)
        return value_loss(v, mb.turn_values.to(dev), mb.turn_returns.to(dev), mb.turn_mask.to(dev),
                          self.cfg.critic.cliprange_value)


TRAINERS = {"starpo": StarPOTrainer, "turn": TurnPPOTrainer}


def build_trainer(cfg: DictConfig, log=print) -> StarPOTrainer:
    name = cfg.algo.get("trainer", "starpo")
    if name not in TRAINERS:
        raise ValueError(f"algo.trainer must be one of {sorted(TRAINERS)}, got {name!r}")
    return TRAINERS[name](cfg, log=log)
