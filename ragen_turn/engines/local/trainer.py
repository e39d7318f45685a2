"""The local engine's trainer, ``StarPOTrainer``: RAGEN's StarPO loop for every algorithm.

One training step, in order (CleanRL's shape, RAGEN's names)::

    rollout     BR env groups x G rollouts, multi-turn, token in / token out   -> Trajectory
    filter      the rollout filter (engines/rollout_filter.py): keep env groups by a score (StarPO-S's top_k by
                in-group reward std, RAGEN-2's top_p / min_p, ...; the default ratio 1.0 keeps every group)
    score       old log-probs, reference log-probs (KL on), critic values
    advantages  grpo | token_gae | bi_level_gae | turn_gae  (the registry's, by name)
    update      critic, then actor: ppo_epochs x mini-batches (x micro-batches), grad clip
    log         one progress line, metrics.jsonl; checkpoints; held-out eval

The advantage estimator and the policy loss come from the config by name; the critic follows the estimator
(``critic.level``, from its registry entry): none, a token critic, or the turn critic V(s_h), which is the
same critic trained only at the turn starts on return_h (``engines.advantages.critic_targets``, shared with the
verl engine). Config checks, device/seeds and what a run logs live outside the engine (``ragen_turn.config``,
``runtime``, ``engines.runlog``).

This file holds the loop and the PPO update (rollout, scoring, advantages, mini-batches, losses, optimizer steps);
the trainer's other jobs are mixins in their own files: the optimizers and the lr schedule (``optimizers.py``),
the critic's reads, loss and head fit (``critic.py``), the update guards (``max_update_kl`` rollback, the weights'
soundness check: ``guards.py``), held-out evaluation (``evaluation.py``) and checkpoints (``checkpointing.py``).
"""
from __future__ import annotations

import contextlib
import copy
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ragen_turn.algos import (
    GlobalCounts,
    explained_variance,
    get_policy_loss_fn,
    kl_controller,
    kl_penalty,
    masked_mean,
    minibatch_clip_stats,
    needs_minibatch_stats,
    value_norm,
    values_before_tokens,
)
from ragen_turn.config import FilterSpec, model_config, policy_loss_config, validate_config
from ragen_turn.engines import checkpoints as ckpt
from ragen_turn.engines.advantages import (advantage_metrics, compute_advantages, normalised_critic_batch,
                                           reward_kl_penalty, score_metrics)
from ragen_turn.engines.rollout_filter import filter_rows
from ragen_turn.engines.trace import EpisodeTracer, trace_rows
from ragen_turn.engines.rundir import (
    DiskFull,
    TrainingStopped,
    identity_of,
    record_config,
    run_complete,
    take_run_dir,
)
from ragen_turn.engines.runlog import (
    append_metrics,
    with_ragen_names,
    episode_metrics,
    progress_line,
    record_provenance,
    run_header,
    run_summary,
    truncate_metrics,
    val_split_name,
)
from ragen_turn.runfiles import CHECKPOINTS_DIR, GENERATIONS_FILE, METRICS_FILE, TRACE_FILE
from ragen_turn.runtime import derived_seed, eta, fmt_duration, pick_device, seed_everything
from ragen_turn.models import CriticModel, load_model_and_tokenizer, logprobs_and_hidden, sequence_logprobs
from ragen_turn.models.lora import lora_of
from ragen_turn.rollout import ChatFormatter, EnvGroupManager, Trajectory, context_config, run_episodes, throttled
from ragen_turn.rollout.context import check_context_fits

from .checkpointing import (HYPERPARAMS, TRAINER_STATE_FORMAT, CheckpointMixin, load_trainer_state,
                            restore_rng_states, rng_states)
from .collapse import collapse_due, collapse_metrics
from .critic import CriticMixin
from .evaluation import EvaluationMixin, evaluate_policy
from .guards import UpdateGuardMixin
from .optimizers import OptimizerMixin, warmup_lr_factor
from .sampler import LocalSampler, NonFiniteSampling

# importable from here as before the split (tests, evaluate.py, benchmarks): the names that moved out
__all__ = ["StarPOTrainer", "build_trainer", "warmup_lr_factor", "evaluate_policy", "rng_states",
           "restore_rng_states", "load_trainer_state", "TRAINER_STATE_FORMAT", "HYPERPARAMS", "context_config",
           "episode_metrics", "ROLLOUT_PROGRESS_S", "UPDATE_PROGRESS_S"]


ROLLOUT_PROGRESS_S = 30.0  # a training rollout's progress line at most this often (none in a shorter rollout)
UPDATE_PROGRESS_S = 30.0  # the same for an update (its mini-batches), which can take minutes too


# ------------------------------------------------------------------------------------------------
class StarPOTrainer(OptimizerMixin, CriticMixin, UpdateGuardMixin, EvaluationMixin, CheckpointMixin):
    """RAGEN's StarPO loop on one device, for every algo (grpo, token_ppo, bi_level_gae, turn_ppo, s_ppo,
    turn_is, st_ppo, ...): the advantage estimator and the policy loss come from the config by name, the
    critic (none, token or turn) from the estimator's registry entry (``critic.level``)."""

    def __init__(self, cfg: DictConfig, log=print):
        validate_config(cfg)
        self.cfg = cfg
        self.log = log
        self.device = pick_device(cfg.device)
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
        seed_everything(cfg.seed)
        self.out_dir = Path(cfg.trainer.default_local_dir)
        # writable, ours alone, no earlier run unless resume/overwrite; trainer.overwrite=true: its files go first
        self.lock = take_run_dir(cfg, log=log)
        self.ckpt_dir = self.out_dir / CHECKPOINTS_DIR
        ckpt.clean(self.ckpt_dir, log=log)  # what a run killed while writing or deleting a checkpoint left
        if not cfg.trainer.resume and ckpt.step_dirs(self.ckpt_dir):  # its step dirs and pointers only
            ckpt.remove_all(self.ckpt_dir)
            log(f"[ragen_turn] removed the checkpoints of the earlier run in {self.ckpt_dir} (a fresh start)")
        self.started = time.time()

        from ragen_turn.warmstart import warmstart_notice

        warmstart_notice(cfg, log)  # what is built before step 1 (the cache lacks it), how long, the keys that skip it
        self.actor, self.tokenizer = load_model_and_tokenizer(model_config(cfg), device="cpu", dtype=cfg.dtype)
        self.tokenizer.padding_side = "left"
        check_context_fits(cfg, self.tokenizer)  # the checks that need the tokenizer, before any warm start
        from ragen_turn.warmstart import warmstart, warmstart_enabled

        if warmstart_enabled(cfg, log):
            self.actor = warmstart(self.actor, self.tokenizer, cfg, log=log)
        self.actor.to(self.device)
        self.critic: Optional[CriticModel] = None
        # shared_backbone: the value head reads the actor's backbone and trains with the actor (one joint loss)
        self.shared_critic = cfg.critic.level != "none" and bool(cfg.critic.shared_backbone)
        if self.shared_critic:
            self.critic = CriticModel.on_shared_backbone(self.actor)
        elif cfg.critic.level != "none":
            self.critic = CriticModel.from_causal_lm(self.actor).to(self.device)
        self.value_norm = value_norm(cfg.critic)  # critic.target_norm: the targets' running mean / std (None: off)
        # LoRA (actor_rollout_ref.model.lora_rank > 0): after the critic's copy, which stays fully fine-tuned
        self.lora = lora_of(self.actor, cfg.actor_rollout_ref.get("model"))
        self.ref = None
        self.kl_ctrl = kl_controller(cfg.algorithm)  # the in-reward KL's coefficient (None: off)
        if cfg.actor_rollout_ref.actor.use_kl_loss or self.kl_ctrl is not None:  # LoRA: the adapter off (no copy)
            self.ref = self.actor if self.lora else copy.deepcopy(self.actor).eval().requires_grad_(False)
        if cfg.engine.get("gradient_checkpointing", False):  # recompute each layer in backward: memory for time
            for m in (self.actor, None if self.shared_critic else self.critic):
                if m is not None:
                    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self._build_optimizers()  # actor (+ the shared critic's head) and critic AdamW (optimizers.py)
        self.ctx = context_config(cfg)
        self.formatter = ChatFormatter(self.tokenizer)
        self.train_envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train")
        self.val_envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.val, "val")
        r = cfg.actor_rollout_ref.rollout
        self.gen = torch.Generator(device="cpu")
        self.sampler = LocalSampler(self.actor, self.tokenizer, temperature=r.temperature, top_p=r.top_p,
                                    top_k=r.get("top_k", -1), device=self.device, generator=self.gen,
                                    micro_batch_size=r.micro_batch_size, prefix_cache=r.prefix_cache, decode=r.decode,
                                    lean=r.lean_forward)
        self.sampler.record_logprobs = bool(r.sampler_logprobs)
        self.loss_fn = get_policy_loss_fn(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
        self.loss_cfg = policy_loss_config(cfg)
        self.tracer = EpisodeTracer(cfg, self.out_dir / TRACE_FILE, "local", self.tokenizer, self.loss_cfg) \
            if cfg.trainer.trace_episodes else None  # trace.jsonl (engines/trace.py); off: nothing built
        self.step = 0
        self.update_trace: Dict[str, List[Dict[str, float]]] = {}  # each update's mini-batch metrics, in order
        self.nonfinite_in_a_row = 0
        self.unconfirmed: Optional[Path] = None  # the last checkpoint, until the step after it updates soundly
        self.metrics_path = self.out_dir / METRICS_FILE
        self.wandb = None
        if cfg.trainer.resume:
            self.load_checkpoint()
        if not run_complete(self.step, cfg.trainer.total_training_steps):  # a finished run resumed: as it was
            truncate_metrics(self.metrics_path, self.step, log=log)  # fresh run: fresh log; resumed: <= step
            truncate_metrics(self.out_dir / GENERATIONS_FILE, self.step, log=log)
            truncate_metrics(self.out_dir / TRACE_FILE, self.step, log=log)
            record_config(self.out_dir, OmegaConf.to_yaml(cfg, resolve=True), self.step)  # + configs.jsonl
            record_provenance(self.out_dir, self.step, self.actor, identity=identity_of(cfg))

    # -------------------------------------------------------------------------------- rollout
    def rollout(self, step: int) -> Trajectory:
        self.actor.eval()
        self.gen.manual_seed(derived_seed(self.cfg.seed, step, 7))
        slots = self.train_envs.assign_seeds(self.cfg.seed, step)
        # a rollout that takes long says where it is (turns, episodes still going) every ROLLOUT_PROGRESS_S
        tag = f"[rollout] step {step + 1}:"
        progress = throttled(lambda line: self.log(line.replace("[rollout]", tag, 1)), ROLLOUT_PROGRESS_S)
        try:
            episodes = run_episodes(slots, self.sampler, self.formatter, self.ctx, log=progress)
        except NonFiniteSampling as e:
            raise TrainingStopped(f"step {step + 1}: {e}. {self.checkpoint_note()}") from None
        return Trajectory.from_episodes(episodes, self.tokenizer.pad_token_id)

    def filter_groups(self, batch: Trajectory) -> Trajectory:
        """The rollout filter (StarPO-S top_k, RAGEN-2's top_p, ...: ``rollout_filter.filter_rows``); its ``rollout/*``
        metrics are left in ``self.filter_metrics``. The batch may come back empty (top_p when no group's rewards
        vary): the step then trains on nothing."""
        spec = FilterSpec.from_config(self.cfg.actor_rollout_ref.rollout)
        rows, self.filter_metrics = filter_rows(batch.group_ids, batch.episode_rewards, spec)
        return batch if len(rows) == batch.batch_size else batch.select(rows)

    # -------------------------------------------------------------------------------- scoring
    def _micro_batches(self, batch: Trajectory) -> List[torch.Tensor]:
        """Row indices of ``batch``'s micro-batches: at most ``micro_batch_size_per_gpu`` rows of similar length
        each, cut as ``engine.micro_batch_split`` says (:meth:`Trajectory.micro_batches`)."""
        return batch.micro_batches(self.cfg.micro_batch_size_per_gpu, self.cfg.engine.micro_batch_split)

    @torch.no_grad()
    def _forward_all(self, fn, batch: Trajectory) -> torch.Tensor:
        """``fn(ids, am, pos, response_mask)`` ``[b, t]`` over length-sorted micro-batches
        (:meth:`Trajectory.micro_batches`), each padded only to its own longest row; returns ``[B, T]`` float32
        on the CPU in the batch's row order, 0 past each micro-batch's width (padding)."""
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        for idx in self._micro_batches(batch):
            mb = batch.select(idx).to(self.device)
            res = fn(mb.input_ids, mb.attention_mask, mb.position_ids, mb.response_mask).float().cpu()
            out[idx, :res.shape[1]] = res
        return out

    def logprobs(self, model, ids, am, pos, response_mask, **kw):
        """Log-probs of the response tokens at the sampling temperature (so ratios compare like with like);
        0 on other tokens."""
        return sequence_logprobs(model, ids, am, pos, temperature=self.cfg.actor_rollout_ref.rollout.temperature or 1.0,
                                 token_mask=response_mask, causal=self.cfg.engine.causal_attention,
                                 last_layer_read=self.cfg.engine.last_layer_where_read, **kw)

    def score(self, batch: Trajectory) -> None:
        self.actor.eval()
        if batch.sampled_logp is not None and self.cfg.actor_rollout_ref.rollout.sampler_logprobs:
            batch.old_logp = batch.sampled_logp * batch.response_mask  # the sampler's (rollout.sampler_logprobs)
        else:
            batch.old_logp = self._forward_all(lambda *a: self.logprobs(self.actor, *a), batch)
        if self.ref is not None:
            with self.lora.adapter_off() if self.lora else contextlib.nullcontext():
                batch.ref_logp = self._forward_all(lambda *a: self.logprobs(self.ref, *a), batch)
        if self.critic is not None:
            self.critic.eval()
            boot = self.cfg.algorithm.bootstrap_truncated
            after = self.denormalized(self._forward_all(lambda ids, am, pos, rm: self.critic(  # V after token t
                ids, am, pos, causal=self.cfg.engine.causal_attention,                     # (where read)
                read=self.value_reads(rm, (am.sum(dim=1) - 1).clamp(min=0) if boot else None)), batch))
            batch.values = values_before_tokens(after) * batch.response_mask
            if self.cfg.algorithm.bootstrap_truncated:  # V after the row's last token, for rows that were cut
                last = (batch.attention_mask.sum(dim=1) - 1).clamp(min=0)
                truncated = torch.tensor([float(e.truncated) for e in batch.episodes])
                batch.bootstrap_values = after.gather(1, last[:, None]).squeeze(1) * truncated

    def compute_advantages(self, batch: Trajectory) -> Dict[str, float]:
        """Advantages and returns ``[B, T]`` of ``algorithm.adv_estimator`` (the registry's, as on verl), with the
        in-reward KL penalty when ``algorithm.use_kl_in_reward`` (its ``actor/reward_kl_penalty*`` metrics), and
        verl's ``critic/score|rewards|advantages/*``."""
        penalty, metrics = reward_kl_penalty(batch, self.cfg, self.kl_ctrl)
        compute_advantages(batch, self.cfg, penalty)
        metrics.update(score_metrics(batch, self.cfg, penalty))
        return metrics

    # -------------------------------------------------------------------------------- update
    def _minibatches(self, n: int, epoch: int) -> List[torch.Tensor]:
        g = torch.Generator().manual_seed(derived_seed(self.cfg.seed, self.step, epoch, 11))
        perm = torch.randperm(n, generator=g)
        bm = self.cfg.ppo_mini_batch_size
        return [perm[i:i + bm] for i in range(0, n, bm) if len(perm[i:i + bm]) > 0]

    def _run_updates(self, batch: Trajectory, model, optim, loss_of, epochs: int, grad_clip: float, prefix: str,
                     stats_of=None, target_kl: Optional[float] = None, step_scale: str = "none"):
        """PPO epochs x mini-batches, each accumulated over its micro-batches (:meth:`_accumulate`), then clipped
        and stepped. Returns the mean over mini-batches of each mini-batch's metrics, and the count of skipped
        (non-finite) mini-batches; ``self.update_trace[prefix]`` keeps each mini-batch's own metrics in order.

        ``target_kl`` (CleanRL's / SB3's; the actor's ``target_kl`` or ``max_update_kl``): a mini-batch whose
        approx KL to the rollout policy, measured before its step, is above it (or not finite) is not stepped,
        and the update's remaining mini-batches and epochs are dropped (``<prefix>/kl_stop`` = 1).
        ``step_scale=live``: each mini-batch's step is its lr times the share of its response tokens that still
        get gradient (``actor/live_frac``): clipping then shrinks the step, where Adam alone would renormalise
        the few live units' gradient into a full-size step (``<prefix>/step_scale``)."""
        model.train()
        acc: Dict[str, List[float]] = {}
        trace: List[Dict[str, float]] = []
        self.update_trace[prefix] = trace
        skipped = 0
        stopped = False
        per_epoch = -(-batch.batch_size // self.cfg.ppo_mini_batch_size)
        done, t0 = 0, time.time()
        progress = throttled(self.log, UPDATE_PROGRESS_S)  # as the rollout's: where it is, every 30 s
        for epoch in range(epochs):
            for mini in self._minibatches(batch.batch_size, epoch):
                if done:
                    progress(f"[update] step {self.step + 1}: {prefix} {done}/{epochs * per_epoch} mini-batches done "
                             f"(epoch {epoch + 1}/{epochs}), {eta(done, epochs * per_epoch, time.time() - t0)}")
                done += 1
                optim.zero_grad(set_to_none=True)
                metrics = self._accumulate(batch.select(mini), loss_of, stats_of)
                if metrics is not None and target_kl is not None and \
                        not metrics.get("actor/approx_kl", 0.0) <= target_kl:
                    optim.zero_grad(set_to_none=True)
                    trace.append(dict(metrics, **{f"{prefix}/stepped": 0.0}))
                    stopped = True
                    break
                scale = 1.0
                if metrics is not None and step_scale == "live":
                    scale = float(metrics.get("actor/live_frac", 1.0))
                gn = self._optimizer_step(model, optim, grad_clip, scale) if metrics is not None else None
                if gn is None:
                    optim.zero_grad(set_to_none=True)
                    skipped += 1
                    continue
                metrics = dict(metrics, **{f"{prefix}/grad_norm": gn})
                if step_scale != "none":
                    metrics[f"{prefix}/step_scale"] = scale
                trace.append(dict(metrics, **{f"{prefix}/stepped": 1.0}))
                for k, v in metrics.items():
                    acc.setdefault(k, []).append(v)
            if stopped:
                break
        out = {k: float(np.nanmean(v)) for k, v in acc.items()}
        out[f"{prefix}/skipped_updates"] = float(skipped)
        if target_kl is not None:
            out[f"{prefix}/kl_stop"] = float(stopped)
            out[f"{prefix}/minibatches_stepped"] = float(sum(t[f"{prefix}/stepped"] for t in trace))
        return out, skipped

    def _accumulate(self, mini: Trajectory, loss_of, stats_of=None) -> Optional[Dict[str, float]]:
        """Forward and backward one mini-batch in micro-batches of ``micro_batch_size_per_gpu`` (rows of similar
        length together: :meth:`Trajectory.micro_batches`); the gradients add up in ``.grad``.

        Every micro-batch loss divides by the mini-batch's counts (:class:`GlobalCounts`), so the micro-batch
        losses add up to the mini-batch's loss and the accumulated gradient is the mini-batch's, for any
        micro-batch size. ``stats_of(micro, counts)`` (a no-grad pre-pass, when the loss takes a statistic over
        the whole mini-batch) gives each micro-batch's part of it, summed before any backward.

        Each micro-batch is moved to the trainer's device here, once: the loss hooks (``loss_of``, ``stats_of``:
        :meth:`actor_loss`, :meth:`critic_step_loss`, :meth:`joint_loss`, :meth:`clip_stats`) take it there.

        Returns the mini-batch's metrics, or None when a loss is not finite. Every metric a loss hook returns is
        its micro-batch's share of the mini-batch's value (``ragen_turn.algos.losses``: sums over the micro-batch
        divided by the mini-batch's counts), so they are added up: the same statistics for any micro-batch size.
        """
        counts = GlobalCounts.of(mini.response_mask, mini.turn_ids)
        micros = [mini.select(idx).to(self.device) for idx in self._micro_batches(mini)]
        if stats_of is not None:
            with torch.no_grad():
                counts = counts.with_clip_stats(sum(stats_of(m, counts) for m in micros))
        acc: Dict[str, List[float]] = {}
        for micro in micros:
            loss, metrics = loss_of(micro, counts)
            if not torch.isfinite(loss):
                return None
            loss.backward()
            for k, v in metrics.items():
                acc.setdefault(k, []).append(v)
        return {k: float(np.sum(v)) for k, v in acc.items()}

    def _fresh_logprobs(self, mb: Trajectory, **kw):
        return self.logprobs(self.actor, mb.input_ids, mb.attention_mask, mb.position_ids, mb.response_mask, **kw)

    def actor_loss(self, mb: Trajectory, counts: Optional[GlobalCounts] = None):
        logp, ent = self._fresh_logprobs(mb, return_entropy=True)
        return self.policy_loss(mb, logp, ent, counts)

    def clip_stats(self, mb: Trajectory, counts: GlobalCounts) -> torch.Tensor:
        """This micro-batch's part of the clipping-bias statistic over the mini-batch (``clip_bias_level=batch``)."""
        return minibatch_clip_stats(self.cfg.actor_rollout_ref.actor.policy_loss.loss_mode, mb.old_logp,
                                    self._fresh_logprobs(mb), mb.advantages, mb.response_mask, self.loss_cfg,
                                    turn_ids=mb.turn_ids, global_counts=counts)

    def joint_loss(self, mb: Trajectory, counts: Optional[GlobalCounts] = None):
        """Shared backbone: policy loss + ``critic.vf_coef`` x value loss from one forward of the actor."""
        logp, ent, hidden = logprobs_and_hidden(self.actor, mb.input_ids, mb.attention_mask, mb.position_ids,
                                                temperature=self.cfg.actor_rollout_ref.rollout.temperature or 1.0,
                                                token_mask=mb.response_mask, causal=self.cfg.engine.causal_attention)
        loss, metrics = self.policy_loss(mb, logp, ent, counts)
        v_loss, v_metrics = self.critic_loss(mb, values_before_tokens(self.critic.values_from_hidden(hidden)), counts)
        metrics.update(v_metrics)
        return loss + self.cfg.critic.vf_coef * v_loss, metrics

    def policy_loss(self, mb: Trajectory, logp: torch.Tensor, ent: torch.Tensor,
                    counts: Optional[GlobalCounts] = None):
        """The configured policy loss (+ entropy bonus, + KL to the reference) from fresh ``logp``/``ent`` [b, T]:
        with the mini-batch's ``counts``, every term is this micro-batch's share of the mini-batch's mean."""
        a = self.cfg.actor_rollout_ref.actor
        mask = mb.response_mask
        loss, metrics = self.loss_fn(old_log_prob=mb.old_logp, log_prob=logp, advantages=mb.advantages,
                                     response_mask=mask, config=self.loss_cfg, turn_ids=mb.turn_ids,
                                     global_counts=counts)
        if self.tracer is not None:  # the traced episodes' turn ratios and clip flags, as this loss saw them
            self.tracer.observe(mb.episodes, mb.old_logp, logp, mb.advantages, mask, mb.turn_ids, "loss", counts)
        n_tokens = counts.tokens if counts else None
        entropy = masked_mean(ent, mask, n_tokens)
        metrics["actor/entropy"] = float(entropy.detach())
        if a.entropy_coeff:
            loss = loss - a.entropy_coeff * entropy
        if a.use_kl_loss:
            kl = masked_mean(kl_penalty(logp, mb.ref_logp, a.kl_loss_type), mask, n_tokens)
            metrics["actor/kl_loss"] = float(kl.detach())
            loss = loss + a.kl_loss_coef * kl
        return loss, metrics

    def update(self, batch: Trajectory) -> Dict[str, float]:
        """Critic, then actor. The actor's update stops early at ``actor.target_kl`` (a mini-batch whose approx KL
        is above it is not stepped, and the rest of the update is dropped; :meth:`_run_updates`). With
        ``actor.max_update_kl`` it is also guarded: it stops early at that KL too, and an update whose KL over the
        batch (:meth:`update_kl`) is still above it is rolled back (weights and optimizer state;
        ``actor/update_rolled_back`` = 1). A step with a skipped (non-finite) or rolled-back update counts toward
        ``trainer.max_nonfinite_steps``."""
        metrics: Dict[str, float] = {}
        skipped = 0
        self.update_trace = {}
        cbatch = batch  # what the critic trains on: with critic.target_norm, normalised values and targets
        if self.value_norm is not None:
            cbatch, m = normalised_critic_batch(self.value_norm, batch, self.cfg.critic.level)
            metrics.update(m)
        if self.critic is not None and self.step == 0 and self.cfg.critic.get("head_init", "zero") == "fit":
            self.fit_critic_head(cbatch)  # the first update: the head fitted before any gradient step
            metrics["critic/head_fit"] = 1.0
        if self.critic is not None and not self.shared_critic:
            metrics["critic/lr"] = self._set_lr(self.critic_optim, self.cfg.critic.optim, self.step)
            m, s = self._run_updates(cbatch, self.critic, self.critic_optim, self.critic_step_loss,
                                     self.cfg.critic.ppo_epochs, self.cfg.critic.grad_clip, "critic")
            metrics.update(m)
            skipped += s
        warmup = self.cfg.trainer.critic_warmup
        if warmup > self.step + 1:  # verl's rule and step count (from 1): critic only
            metrics["actor/critic_warmup"] = 1.0
            return self._after_update(metrics, skipped, rolled_back=False)
        # the actor's updates count from its first one (verl steps its lr schedule only when the actor updates)
        metrics["actor/lr"] = self._set_lr(self.actor_optim, self.cfg.actor_rollout_ref.actor.optim,
                                           self.step + 1 - max(warmup, 1))
        model, loss_of = self.actor, self.actor_loss
        if self.shared_critic:  # one optimizer step on actor + value head (clipped together)
            model, loss_of = torch.nn.ModuleList([self.actor, self.critic.value_head]), self.joint_loss
            batch = cbatch  # the value loss's values and targets (the actor's loss does not read them)
        a = self.cfg.actor_rollout_ref.actor
        stats_of = self.clip_stats if needs_minibatch_stats(a.policy_loss.loss_mode, self.loss_cfg) else None
        limit = a.get("max_update_kl")
        stops = [x for x in (a.get("target_kl"), limit) if x is not None]
        before = self._rollback_point(model) if limit is not None else None
        m, s = self._run_updates(batch, model, self.actor_optim, loss_of, a.ppo_epochs, a.grad_clip, "actor",
                                 stats_of, target_kl=min(stops) if stops else None,
                                 step_scale=a.get("step_scale", "none"))
        metrics.update(m)
        skipped += s
        if m.get("actor/kl_stop"):
            self.log(f"[kl] step {self.step + 1}: a mini-batch's approx KL passed {min(stops)} (actor_rollout_ref."
                     f"actor.target_kl / max_update_kl): {int(m['actor/minibatches_stepped'])} mini-batch(es) "
                     f"stepped, the rest of the update skipped")
        rolled_back = self._roll_back_past(limit, batch, model, before, metrics) if limit is not None else False
        return self._after_update(metrics, skipped, rolled_back)

    # -------------------------------------------------------------------------------- one step
    def train_step(self) -> Dict[str, float]:
        t0 = time.time()
        reused0 = getattr(self.sampler, "cached_tokens_reused", 0)
        batch = self.rollout(self.step)
        t_roll = time.time() - t0
        metrics = episode_metrics(batch)
        if collapse_due(self.cfg, self.step + 1):
            t1 = time.time()
            metrics.update(collapse_metrics(self.actor, self.tokenizer, batch.episodes, self.device,
                                            self.cfg.trainer.get("collapse_num_samples", 64),
                                            self.cfg.micro_batch_size_per_gpu,
                                            derived_seed(self.cfg.seed, self.step, 11)))
            metrics["perf/collapse_s"] = time.time() - t1
        batch = self.filter_groups(batch)
        metrics.update(self.filter_metrics)
        if batch.batch_size == 0:
            return self._empty_step(metrics, t0, t_roll)
        self.empty_filtered_steps = 0
        self.score(batch)
        metrics.update(self.compute_advantages(batch))
        if self.critic is not None:
            metrics["critic/explained_var"] = explained_variance(*self.value_targets(batch))
        if self.tracer is not None:
            self.tracer.begin(batch, trace_rows(batch.group_ids.tolist(), self.tracer.n))
        adv = batch.advantages[batch.response_mask.bool()]
        metrics.update(advantage_metrics(batch.advantages, batch.response_mask, batch.turn_ids,
                                         self.cfg.actor_rollout_ref.rollout.response_length))
        if not torch.isfinite(adv).all():
            self.nonfinite_in_a_row += 1
            self.log(f"[warn] step {self.step + 1}: non-finite advantages, update skipped")
            if self.nonfinite_in_a_row >= self.cfg.trainer.max_nonfinite_steps:
                raise TrainingStopped(f"non-finite advantages in {self.nonfinite_in_a_row} steps in a row "
                                      f"(trainer.max_nonfinite_steps={self.cfg.trainer.max_nonfinite_steps}); "
                                      f"check the rewards. {self.checkpoint_note()}")
        else:
            t1 = time.time()
            metrics.update(self.sound_update(batch))  # update() with the weights' soundness check
            metrics["perf/update_s"] = time.time() - t1
        dt = time.time() - t0
        metrics["perf/rollout_s"] = t_roll
        metrics["perf/step_s"] = dt
        metrics["perf/tokens_per_s"] = float(batch.attention_mask.sum()) / max(dt, 1e-9)
        metrics["perf/sampled_tokens_per_s"] = float(batch.response_mask.sum()) / max(t_roll, 1e-9)
        metrics["perf/prefix_cache_tokens"] = float(getattr(self.sampler, "cached_tokens_reused", 0) - reused0)
        metrics["env/kept_episodes"] = float(batch.batch_size)
        if self.tracer is not None:
            self.tracer.write(self.step + 1)
        return metrics

    def _empty_step(self, metrics: Dict[str, float], t0: float, t_roll: float) -> Dict[str, float]:
        """A step whose filter kept no group (RAGEN's ``rollout/empty_after_filter``): no update, the weights stay."""
        self.empty_filtered_steps = getattr(self, "empty_filtered_steps", 0) + 1
        self.log(f"[warn] step {self.step + 1}: the rollout filter kept no env group (no reward spread in any group); "
                 f"no update ({self.empty_filtered_steps} such step(s) in a row)")
        metrics.update({"rollout/empty_after_filter": 1.0,
                        "rollout/consecutive_empty_after_filter_steps": float(self.empty_filtered_steps),
                        "perf/rollout_s": t_roll, "perf/step_s": time.time() - t0, "env/kept_episodes": 0.0})
        return metrics

    def fit(self) -> Dict[str, Any]:
        """Train to ``trainer.total_training_steps`` (or the time budget); returns the last step's metrics and,
        under ``summary``, the end-of-run numbers (held-out before / last / best, elapsed). A full disk stops the
        run naming the file and the checkpoint to resume from."""
        try:
            return self._fit()
        except DiskFull as e:
            e.args = (f"{e}; {self.checkpoint_note()}",)
            raise

    def _fit(self) -> Dict[str, Any]:
        cfg = self.cfg.trainer
        total = cfg.total_training_steps
        if run_complete(self.step, total):  # a finished run resumed: nothing to train (nothing was written)
            text, summary = self.summary(note="run already complete")
            self.log(text + "\n  to train on: the same command with "
                            f"trainer.total_training_steps=<more than {total}> trainer.resume=true "
                            "(the step count is not part of the run's name)")
            return {"step": self.step, "summary": summary}
        self.log(run_header(self.cfg, type(self).__name__, self.step, len(self.train_envs), self.out_dir, self.device))
        last: Dict[str, Any] = {}
        budget = cfg.get("time_budget_s")
        loop_start = started = time.time()
        first = self.step
        if self.step == 0 and cfg.val_before_train:
            then = f"every {cfg.test_freq} steps and at the end" if cfg.test_freq else "at the end"
            self.log(f"[ragen_turn] {val_split_name(self.cfg)} evaluation before RL: {len(self.val_envs)} episodes "
                     f"(then {then})")
            t = time.time()
            m = {"step": 0, **self.evaluate()}
            m["perf/val_s"] = time.time() - t
            self._write_metrics(m)
            self.log(progress_line(m, total, f"{val_split_name(self.cfg)} eval {fmt_duration(m['perf/val_s'])}"))
            last = m
            started = time.time()  # the ETA counts training steps (and their evaluations) only
        while self.step < total:
            metrics = self.train_step()
            self.step += 1
            metrics["step"] = self.step
            if self.unconfirmed is not None and self.nonfinite_in_a_row == 0:  # its weights updated soundly
                ckpt.confirm(self.ckpt_dir, self.unconfirmed)
            self.unconfirmed = None
            final = self.step == total
            if budget is not None and not final and time.time() - loop_start >= float(budget):
                self.log(f"[ragen_turn] trainer.time_budget_s={budget} spent after step {self.step}: "
                         f"final evaluation and checkpoint (resume with trainer.resume=true)")
                final = True
            if (cfg.test_freq and self.step % cfg.test_freq == 0) or final:
                t = time.time()
                metrics.update(self.evaluate())
                metrics["perf/val_s"] = time.time() - t
            self._write_metrics(metrics)
            self.log(progress_line(metrics, total, eta(self.step - first, total - first, time.time() - started)))
            if (cfg.save_freq and self.step % cfg.save_freq == 0) or final:
                self.save_checkpoint()
            last = metrics
            if final:
                break
        text, last["summary"] = self.summary()
        self.log(text)
        return last

    def summary(self, note: str = ""):
        """The end-of-run block (held-out before / last / best, elapsed, paths, next commands) and its numbers."""
        return run_summary(self.cfg, self.out_dir, None if note else time.time() - self.started,
                           ckpt.newest_complete(self.ckpt_dir), note)

    # -------------------------------------------------------------------------------- logging
    def _write_metrics(self, metrics: Dict[str, float]) -> None:
        append_metrics(self.metrics_path, metrics)
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
        self.wandb.log(with_ragen_names(metrics), step=int(metrics.get("step", self.step)))  # ours and RAGEN's


def build_trainer(cfg: DictConfig, log=print) -> StarPOTrainer:
    """The local engine's trainer for ``cfg`` (every algorithm: one class)."""
    return StarPOTrainer(cfg, log=log)
