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
"""
from __future__ import annotations

import contextlib
import copy
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

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
    turn_boundaries,
    value_loss,
    value_norm,
    values_before_tokens,
)
from ragen_turn.config import model_config, policy_loss_config, validate_config
from ragen_turn.engines import checkpoints as ckpt
from ragen_turn.config import FilterSpec
from ragen_turn.engines.advantages import (advantage_metrics, compute_advantages, critic_targets, critic_values,
                                           heldout_critic_explained_var, normalised_critic_batch, reward_kl_penalty,
                                           score_metrics)
from ragen_turn.engines.rollout_filter import filter_rows
from ragen_turn.engines.trace import EpisodeTracer, trace_rows
from ragen_turn.engines.rundir import (
    DiskFull,
    TrainingStopped,
    crash_point,
    identity_of,
    record_config,
    run_complete,
    take_run_dir,
    writing,
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
    write_generations,
)
from ragen_turn.runfiles import CHECKPOINTS_DIR, GENERATIONS_FILE, METRICS_FILE, TRACE_FILE
from ragen_turn.runtime import derived_seed, eta, fmt_duration, pick_device, seed_everything
from ragen_turn.models import CriticModel, load_model_and_tokenizer, logprobs_and_hidden, sequence_logprobs
from ragen_turn.models.lora import lora_of
from ragen_turn.rollout import ChatFormatter, EnvGroupManager, Trajectory, context_config, run_episodes, throttled
from ragen_turn.rollout.context import check_context_fits

from .collapse import collapse_due, collapse_metrics
from .sampler import LocalSampler, NonFiniteSampling


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


ROLLOUT_PROGRESS_S = 30.0  # a training rollout's progress line at most this often (none in a shorter rollout)
UPDATE_PROGRESS_S = 30.0  # the same for an update (its mini-batches), which can take minutes too


# ------------------------------------------------------------------------------------------------
class StarPOTrainer:
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
        a, c = cfg.actor_rollout_ref.actor, cfg.critic
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
        self.loss_fn = get_policy_loss_fn(a.policy_loss.loss_mode)
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

    # -------------------------------------------------------------------------------- critic
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

    # -------------------------------------------------------------------------------- update
    def _minibatches(self, n: int, epoch: int) -> List[torch.Tensor]:
        g = torch.Generator().manual_seed(derived_seed(self.cfg.seed, self.step, epoch, 11))
        perm = torch.randperm(n, generator=g)
        bm = self.cfg.ppo_mini_batch_size
        return [perm[i:i + bm] for i in range(0, n, bm) if len(perm[i:i + bm]) > 0]

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

    @torch.no_grad()
    def update_kl(self, batch: Trajectory) -> float:
        """How far the actor's update moved the policy: approx KL (k3, per response token, capped at 10) between
        the rollout policy and the updated one over the whole batch (one extra forward)."""
        self.actor.eval()
        new = self._forward_all(lambda *a: self.logprobs(self.actor, *a), batch)
        return float(masked_mean(kl_penalty(batch.old_logp, new, "low_var_kl"), batch.response_mask.float()))


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

    # -------------------------------------------------------------------------------- checkpoints
    def checkpoint_note(self) -> str:
        """Which checkpoint to go back to, for the line that stops a run."""
        good, newest = ckpt.last_good(self.ckpt_dir), ckpt.newest_complete(self.ckpt_dir)
        if good is not None:
            return (f"The last good checkpoint (the step after it updated soundly) is {good}: resume from it with "
                    f"trainer.resume=true trainer.resume_from={ckpt.LAST_GOOD}")
        if newest is not None:
            return f"The last complete checkpoint is {newest} (resume with trainer.resume=true)"
        return f"No checkpoint was written in {self.ckpt_dir}"

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step_N`` so that a crash at any moment leaves the previous checkpoints loadable:
        staged in ``.tmp_step_N``, renamed into place, ``latest`` replaced atomically, old ones rotated
        (``engines/checkpoints.py``)."""
        tmp = ckpt.begin(self.ckpt_dir, self.step)
        try:
            with writing(tmp / "actor"):
                if self.lora:  # actor/: the merged model (plain transformers); actor_adapter/: the adapter (peft)
                    self.lora.save(tmp / "actor", tmp / ckpt.ADAPTER_DIR)
                else:
                    self.actor.save_pretrained(tmp / "actor")
                crash_point("actor written")
                self.tokenizer.save_pretrained(tmp / "actor")
                crash_point("tokenizer written")
            state = {"format": TRAINER_STATE_FORMAT, "step": self.step, "nonfinite_in_a_row": self.nonfinite_in_a_row,
                     "kl_ctrl": None if self.kl_ctrl is None else float(self.kl_ctrl.value),
                     "actor_optim": self.actor_optim.state_dict(), "rng": rng_states()}
            with writing(tmp / "critic"):
                if self.shared_critic:
                    self.critic.save_value_head(tmp / "critic")
                elif self.critic is not None:
                    self.critic.save_pretrained(tmp / "critic")
                    state["critic_optim"] = self.critic_optim.state_dict()
                if self.value_norm is not None:
                    state["value_norm"] = self.value_norm.state_dict()
                crash_point("critic written")
            with writing(tmp / "trainer_state.pt"):
                torch.save(state, tmp / "trainer_state.pt")
            crash_point("trainer state written")
            final = ckpt.commit(tmp, self.step)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed write frees its space; the older checkpoints stay
            raise
        ckpt.rotate(self.ckpt_dir, self.cfg.trainer.keep_checkpoints)
        self.unconfirmed = final
        return final

    def _load_optimizer(self, optim: torch.optim.Optimizer, state: dict, name: str) -> None:
        """The optimizer's moments from a checkpoint; its hyperparameters (lr, weight decay, betas) stay the
        config's (``load_state_dict`` alone would bring back the checkpoint's and ignore, e.g., a new lr)."""
        mine = [{k: g[k] for k in HYPERPARAMS if k in g} for g in optim.param_groups]
        optim.load_state_dict(state)
        for i, (g, want) in enumerate(zip(optim.param_groups, mine)):
            saved = {**g, "lr": g.get("initial_lr", g["lr"])}  # its config lr, not where a warm-up had it
            changed = {k: (saved[k], v) for k, v in want.items() if saved[k] != v}
            g.update(want)
            g["initial_lr"] = g["lr"]
            if changed:
                self.log(f"[ragen_turn] resume: {name} optimizer group {i} takes the config's "
                         + ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items()))

    def load_checkpoint(self) -> bool:
        """Resume: ``trainer.resume_from`` when set, else the newest complete checkpoint whose files match their
        sha256 (``latest`` is read first; a missing, empty, garbage or stale one is said and passed over); one that
        fails its checksum or its load is said and the next older one tried. Checkpoints after the loaded step
        are removed."""
        name = self.cfg.trainer.get("resume_from")
        self.load_unverified = bool(self.cfg.trainer.get("load_unverified", False))
        if name:
            path = ckpt.find(self.ckpt_dir, name, verify=True, allow_unverified=self.load_unverified)
            self._load_state(path)
        else:
            tried: tuple = ()
            while True:
                path = ckpt.resume_point(self.ckpt_dir, log=self.log, skip=tried,
                                         allow_unverified=self.load_unverified)
                if path is None:
                    if ckpt.step_dirs(self.ckpt_dir):
                        raise FileNotFoundError(
                            f"trainer.resume=true: no checkpoint in {self.ckpt_dir} loads (see the lines above); "
                            "trainer.overwrite=true starts the run over")
                    self.log(f"[ragen_turn] trainer.resume=true but no checkpoint in {self.ckpt_dir}: starting fresh")
                    return False
                try:
                    self._load_state(path)
                    break
                except Exception as e:  # a file the checksum did not catch (no sha256 in its manifest)
                    self.log(f"[ragen_turn] checkpoint {path} failed to load ({type(e).__name__}: "
                             f"{str(e).strip()[:200]}); trying an older one")
                    tried += (path.name,)
        ckpt.drop_after(self.ckpt_dir, self.step, log=self.log)
        self.unconfirmed = path
        self.log(f"[ragen_turn] resumed from {path} at step {self.step}")
        return True

    def _load_state(self, path: Path) -> None:
        """Weights, optimizer moments, step and RNG states from checkpoint directory ``path``."""
        from transformers import AutoModelForCausalLM

        state = load_trainer_state(path / "trainer_state.pt")
        if self.lora:  # the frozen base is the one this run built (model.path, warm start); the adapter is saved
            if not (path / ckpt.ADAPTER_DIR).is_dir():
                raise FileNotFoundError(f"{path} has no {ckpt.ADAPTER_DIR}/: a full fine-tuning checkpoint cannot "
                                        "resume a LoRA run (actor_rollout_ref.model.lora_rank=0 resumes it)")
            self.lora.load_adapter(path / ckpt.ADAPTER_DIR)
        else:
            loaded = AutoModelForCausalLM.from_pretrained(path / "actor", dtype=self.dtype, local_files_only=True)
            self.actor.load_state_dict(loaded.state_dict())
        self._load_optimizer(self.actor_optim, state["actor_optim"], "actor")
        if self.shared_critic:
            self.critic.load_value_head(path / "critic")
        elif self.critic is not None:
            loaded_c = CriticModel.from_pretrained(path / "critic", dtype=self.cfg.dtype)
            self.critic.load_state_dict(loaded_c.state_dict())
            self._load_optimizer(self.critic_optim, state["critic_optim"], "critic")
        if self.value_norm is not None:
            if "value_norm" not in state:
                raise ValueError(f"{path} holds no value-target statistics: it was written without "
                                 "critic.target_norm=true, which this run has (resume it with the same setting)")
            self.value_norm.load_state_dict(state["value_norm"])
        self.step = int(state["step"])
        self.nonfinite_in_a_row = int(state["nonfinite_in_a_row"])
        if self.kl_ctrl is not None and state.get("kl_ctrl") is not None:  # the adaptive coefficient goes on
            self.kl_ctrl.value = float(state["kl_ctrl"])
        restore_rng_states(state["rng"])


# trainer_state.pt holds tensors and plain types only (loads with torch.load(weights_only=True): no pickle from a
# run dir); format 1 (before issue #59) held numpy's RNG state as an ndarray, which loads with numpy's array
# reconstruction allowed (NUMPY_ARRAY_GLOBALS) and nothing else
TRAINER_STATE_FORMAT = 2


def rng_states() -> Dict[str, Any]:
    """Python's, numpy's and torch's global RNG states as tensors and plain types (``weights_only`` loadable)."""
    name, key, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "numpy": {"name": str(name), "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}


def restore_rng_states(rng: Dict[str, Any]) -> None:
    """Set the global RNGs from :func:`rng_states` (or a format-1 state: numpy's tuple)."""
    random.setstate(tuple(rng["python"][:1]) + (tuple(rng["python"][1]),) + tuple(rng["python"][2:]))
    n = rng["numpy"]
    if isinstance(n, dict):
        n = (n["name"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    np.random.set_state(n)
    torch.set_rng_state(rng["torch"])


def _numpy_array_globals() -> list:
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_trainer_state(path: Path) -> Dict[str, Any]:
    """``trainer_state.pt`` with ``torch.load(weights_only=True)``: tensors and plain types, never code. A format-1
    file (numpy's RNG state as an ndarray) loads with numpy's array reconstruction allowed and nothing else."""
    with torch.serialization.safe_globals(_numpy_array_globals()):
        return torch.load(path, weights_only=True)


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


HYPERPARAMS = ("lr", "weight_decay", "betas")  # an optimizer's settings that come from the config, also on resume


def build_trainer(cfg: DictConfig, log=print) -> StarPOTrainer:
    """The local engine's trainer for ``cfg`` (every algorithm: one class)."""
    return StarPOTrainer(cfg, log=log)
