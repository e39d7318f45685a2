"""``VerlStarPOTrainer`` on verl (every algorithm): a subclass of verl's ``RayPPOTrainer`` (the v0 path).

Like RAGEN's ``RayAgentTrainer`` there is no dataset: every step plays ``es_manager.train`` env groups
through the registered agent loop ``ragen_turn_env`` (:mod:`.agent_loop`), then runs the PPO step
with the trainer's own helpers (``_compute_old_log_prob``, ``_compute_ref_log_prob``,
``_compute_values``, ``_update_critic``, ``_update_actor``, ``_save_checkpoint`` ...)::

    rollout     agent loop -> verl layout (prompts | responses, response_mask, turn ids, turn rewards)
    filter      the rollout filter (engines/rollout_filter.py, both engines): keep env groups by a score
    score       old log-probs, reference log-probs (KL on), critic values
    advantages  engines.advantages (both engines): the registry's grpo | token_gae | bi_level_gae | turn_gae
    critic      engines.advantages.critic_targets (both engines): every response token, or the turn starts only
                for the turn critic (see below)
    actor       verl's ppo_loss calling our registered policy loss (see register.py)

verl's stock ``compute_advantage`` never passes critic values to a custom estimator, so advantages
are computed here. verl's critic gives ``values[:, i]`` from the hidden state just before response
token i, so V(s_h) is the value at the first token of turn h; the turn critic is trained with verl's
own value loss on a batch whose ``response_mask`` is the turn-start mask and whose ``returns`` hold
the turn returns there (verl then normalises by the number of turns in the mini-batch).

Started by :func:`ragen_turn.engines.verl.launch` via ``verl.trainer.main_ppo.run_ppo(config,
task_runner_class=TaskRunner)``.
"""
from __future__ import annotations

import os
import shutil
from functools import partial
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np
import ray
import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.core_algos import agg_loss
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics

from ragen_turn.algos import (check_turn_ids, kl_controller, place_turn_rewards, scatter_turns, turn_boundaries,
                              turn_mask_from_ids, value_norm)
from ragen_turn.config import FilterSpec, policy_loss_config
from ragen_turn.engines import checkpoints as ckpt
from ragen_turn.engines.advantages import (advantage_metrics, compute_advantages, critic_targets,
                                           heldout_critic_explained_var, normalised_critic_batch,
                                           normalized_turn_rewards, reward_kl_penalty)
from ragen_turn.engines.rollout_filter import filter_rows, pad_rows
from ragen_turn.engines.rundir import crash_point, identity_of, record_config, run_complete, writing
from ragen_turn.engines.trace import EpisodeTracer, trace_rows
from ragen_turn.runfiles import GENERATIONS_FILE, METRICS_FILE, TRACE_FILE, VALUE_NORM_FILE
from ragen_turn.runtime import derived_seed
from ragen_turn.engines.runlog import (
    append_metrics, episode_metrics, progress_line, record_provenance, run_header, truncate_metrics,
    with_ragen_names, write_generations,
)
from ragen_turn.rollout import EnvSlot, Trajectory
from ragen_turn.rollout.env_manager import EnvGroupManager

from . import register  # noqa: F401  (our losses / estimators in the driver's registries too)
from .agent_loop import episode_from_summary
from .config import AGENT_LOOP_NAME
from .trust_region import UPDATE_FIELD, stepped_minibatches
from .turn_counts import TURNS_FIELD, minibatch_turn_counts, ppo_loss_with_turn_counts

TRACE_SLOT = "ragen_trace_slot"  # trainer.trace_episodes: each rollout row's number (copies share it)
TRAIN_KEYS = ("input_ids", "attention_mask", "position_ids", "prompts", "responses", "response_mask")


# ------------------------------------------------------------------------------------------------
# pure helpers (CPU-testable): env plan, rollout batch <-> our tensors, filtering, critic batch
def update_metrics(raw: Dict[str, Any], target_kl: Optional[float], step_scale: str = "none") -> Dict[str, float]:
    """An actor update's metrics from verl's per-mini-batch lists, as the local engine logs them: with
    ``target_kl``, the mean over the mini-batches that stepped (``trust_region.AdamW`` skipped the rest), plus
    ``actor/kl_stop`` and ``actor/minibatches_stepped``; with ``step_scale=live``, ``actor/step_scale`` (the mean
    over those mini-batches of the factor their lr was scaled by: their live share, 1 where a loss has none)."""
    stepped = None
    if target_kl is not None and "actor/approx_kl" in raw:
        kls = list(raw["actor/approx_kl"])
        stepped = stepped_minibatches(kls, float(target_kl))
        raw = {k: [x for x, s in zip(v, stepped) if s] if isinstance(v, list) and len(v) == len(kls) else v
               for k, v in raw.items()}
    # a new dict: verl's reduce_metrics writes its means into the one it is given
    out = reduce_metrics({k: v for k, v in raw.items() if not (isinstance(v, list) and not v)})
    if stepped is not None:
        out["actor/kl_stop"] = float(not all(stepped))
        out["actor/minibatches_stepped"] = float(sum(stepped))
    if step_scale == "live" and (target_kl is None or out.get("actor/minibatches_stepped", 1.0) > 0):
        out["actor/step_scale"] = float(out.get("actor/live_frac", 1.0))
    return out


# ------------------------------------------------------------------------------------------------
def SeedPlan(custom_envs, split_cfg, split: str = "train") -> EnvGroupManager:
    """The local engine's env groups and seeds without building envs (those live in the agent-loop workers)."""
    return EnvGroupManager(custom_envs, split_cfg, split, build_envs=False)


def gen_batch(slots: Sequence[EnvSlot], split: str, step: int, seed: int = 0) -> DataProto:
    """The agent loop's input: one sample per env slot (no tensors; verl passes the fields to ``run``).

    ``sample_seed`` (from ``seed``, the split, the step and the slot) seeds the episode's sampling.
    """
    n = len(slots)
    split_id = {"train": 0, "val": 1}.get(split, 2)
    seeds = np.random.SeedSequence([int(seed), split_id, int(step)]).generate_state(max(n, 1), dtype=np.uint64)

    def arr(values, dtype=object):
        return np.array(list(values), dtype=dtype)

    return DataProto.from_dict(non_tensors={
        "agent_name": arr([AGENT_LOOP_NAME] * n),
        "env_tag": arr(s.tag for s in slots),
        "env_seed": arr((s.seed for s in slots), np.int64),
        "group_id": arr((s.group_id for s in slots), np.int64),
        "uid": arr(f"{split}-{step}-{s.group_id}" for s in slots),
        "raw_prompt": arr(f"{s.tag} seed={s.seed}" for s in slots),
        "sample_seed": arr((int(x % 2**63) for x in seeds[:n]), np.int64),
    })


def to_trajectory(batch: DataProto) -> Trajectory:
    """Our ``Trajectory`` in verl's response coordinates (column i = response token i).

    Reads ``responses``, ``attention_mask``, ``response_mask`` and the agent loop's ``turn_ids``,
    ``turn_rewards`` and ``ragen_episode`` fields; ``values`` too when present.
    """
    responses = batch.batch["responses"]
    B, R = responses.shape
    response_mask = batch.batch["response_mask"].float()
    turn_ids = torch.full((B, R), -1, dtype=torch.long)
    for i, ids in enumerate(batch.non_tensor_batch["turn_ids"]):
        ids = list(ids)[:R]
        turn_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    check_turn_ids(turn_ids, response_mask)
    episodes = [episode_from_summary(d) for d in batch.non_tensor_batch["ragen_episode"]]
    H = max(max(e.num_turns for e in episodes), 1)
    turn_rewards = torch.zeros(B, H)
    turn_mask = torch.zeros(B, H)
    for i, e in enumerate(episodes):
        turn_rewards[i, : e.num_turns] = torch.tensor(e.turn_rewards, dtype=torch.float32)
        turn_mask[i, : e.num_turns] = 1.0
    if not torch.equal(turn_mask, turn_mask_from_ids(turn_ids, H)):
        raise ValueError("turn_rewards and turn_ids disagree on the number of turns of some episode")
    prompt_len = batch.batch["prompts"].shape[1]
    traj = Trajectory(
        input_ids=responses, attention_mask=batch.batch["attention_mask"][:, prompt_len:], response_mask=response_mask,
        turn_ids=turn_ids, turn_rewards=turn_rewards, turn_mask=turn_mask,
        group_ids=torch.tensor([e.group_id for e in episodes], dtype=torch.long),
        success=torch.tensor([float(e.success) for e in episodes]),
        episode_rewards=torch.tensor([e.total_reward for e in episodes]), episodes=episodes)
    if "values" in batch.batch.keys():
        traj.values = batch.batch["values"].float() * response_mask
    return traj


def mix_within_ranks(n: int, dp: int, seed: int) -> torch.Tensor:
    """A row order ``[n]`` that shuffles each data-parallel rank's contiguous chunk of ``n / dp`` rows in place.

    verl's ``_balance_batch`` gives every rank rows of similar total length, then sorts each rank's rows by
    length, and the update walks them in that order in mini-batches (``actor.shuffle=false``): every
    mini-batch holds episodes of like length, which in Sokoban means all solved or all failed. Shuffling
    within a rank keeps each rank's rows (and so the balance) and gives mixed mini-batches, as the local
    engine's random ones are.
    """
    if dp < 1 or n % dp:
        raise ValueError(f"{n} rows do not split evenly over {dp} data-parallel ranks")
    g = torch.Generator().manual_seed(int(seed))
    size = n // dp
    return torch.cat([r * size + torch.randperm(size, generator=g) for r in range(dp)])


def turn_start_mask(turn_ids: torch.Tensor, turn_mask: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` 1 at the first token of every turn (where verl's critic reads V(s_h))."""
    H = turn_mask.shape[1]
    starts, _ = turn_boundaries(turn_ids, H)
    out = torch.zeros(turn_ids.shape, dtype=torch.float32)
    return out.scatter_add(1, starts, turn_mask.float()).clamp(max=1.0)


def critic_batch(batch: DataProto, traj: Trajectory, level: str, normalised: bool = False) -> DataProto:
    """The batch verl's critic update trains on: :func:`~ragen_turn.engines.advantages.critic_targets` (the local
    engine's too) in verl's token layout.

    ``token``: values/returns on every response token (``response_mask`` as sampled).
    ``turn``: ``response_mask`` = the turn-start mask, ``returns`` = return_h at turn h's first token,
    so verl's value loss is exactly ours on the turn positions (clipped, 0.5 * max, mean over turns).
    ``normalised`` (``critic.target_norm``): ``traj`` is
    :func:`~ragen_turn.engines.advantages.normalised_critic_batch`'s, and its values and returns are the batch's.
    """
    tensors = {k: batch.batch[k] for k in TRAIN_KEYS}
    tensors["values"] = traj.values.to(batch.batch["values"].dtype) if normalised else batch.batch["values"]
    if level == "turn":
        tmask, _, turn_returns = critic_targets(traj, level)
        starts, _ = turn_boundaries(traj.turn_ids, tmask.shape[1])
        starts_mask = turn_start_mask(traj.turn_ids, tmask)
        tensors["response_mask"] = starts_mask.to(batch.batch["response_mask"].dtype)
        tensors["returns"] = torch.zeros_like(traj.response_mask).scatter_add(1, starts,
                                                                             turn_returns * tmask.float())
    else:
        tensors["returns"] = traj.returns.to(batch.batch["returns"].dtype) if normalised else batch.batch["returns"]
    return DataProto.from_dict(tensors=tensors, meta_info=dict(batch.meta_info))


# ------------------------------------------------------------------------------------------------
class _NoDataLoader:
    """Stands in for verl's train dataloader: checkpoints save/restore its state, and there is no dataset."""

    def __init__(self, steps: int):
        self.steps = max(1, int(steps))

    def __len__(self) -> int:
        return self.steps

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None


class VerlStarPOTrainer(RayPPOTrainer):
    """RAGEN's StarPO loop on verl, for every algorithm: the estimator and the policy loss by name, the critic
    (none, token or turn) from the estimator's registry entry (``critic.level``)."""

    _update_count = 0  # actor updates so far in this process: each one's id for trust_region (a batch field)

    def __init__(self, config: DictConfig, tokenizer, role_worker_mapping, resource_pool_manager,
                 ray_worker_group_cls, processor=None):
        self.rcfg = OmegaConf.create(OmegaConf.to_container(config.ragen, resolve=True))
        super().__init__(config=config, tokenizer=tokenizer, role_worker_mapping=role_worker_mapping,
                         resource_pool_manager=resource_pool_manager, ray_worker_group_cls=ray_worker_group_cls,
                         processor=processor)
        self.train_plan = SeedPlan(self.rcfg.custom_envs, self.rcfg.es_manager.train, "train")
        self.val_plan = SeedPlan(self.rcfg.custom_envs, self.rcfg.es_manager.val, "val")
        self.out_dir = Path(self.rcfg.trainer.default_local_dir)
        self.metrics_path = self.out_dir / METRICS_FILE
        self.tracer = EpisodeTracer(self.rcfg, self.out_dir / TRACE_FILE, "verl", tokenizer,
                                    policy_loss_config(self.rcfg)) if self.rcfg.trainer.trace_episodes else None
        self.reward_kl_ctrl = kl_controller(self.rcfg.algorithm)  # ours, shared with the local engine (None: off)
        self.value_norm = value_norm(self.rcfg.critic)  # critic.target_norm (None: off), as the local engine's

    def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler):
        total = int(self.config.trainer.total_training_steps)
        self.total_training_steps = total
        self.train_dataset = self.val_dataset = None
        self.train_dataloader = self.val_dataloader = _NoDataLoader(total)
        with open_dict(self.config):
            self.config.actor_rollout_ref.actor.optim.total_training_steps = max(total, 1)
            self.config.critic.optim.total_training_steps = max(total, 1)

    def init_workers(self):
        super().init_workers()
        from verl.utils.config import omega_conf_to_dataclass

        actor_cfg = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(partial(ppo_loss_with_turn_counts, config=actor_cfg))

    # ---------------------------------------------------------------------------------- rollout
    def rollout(self, slots: Sequence[EnvSlot], split: str, step: int) -> tuple[DataProto, Dict[str, float]]:
        batch = gen_batch(slots, split, step, int(self.rcfg.seed))
        batch.meta_info.update(validate=split == "val", global_steps=step)
        padded, pad = pad_dataproto_to_divisor(batch, int(self.config.actor_rollout_ref.rollout.agent.num_workers))
        out = self.async_rollout_manager.generate_sequences(padded)
        out = unpad_dataproto(out, pad)
        timing = out.meta_info.pop("timing", {})
        out.meta_info = {}
        return out, timing

    def _validate(self, merged: bool = False) -> Dict[str, float]:
        out, _ = self.rollout(self.val_plan.assign_seeds(self.rcfg.seed, 0), "val", self.global_steps)
        traj = to_trajectory(out)
        n = int(self.rcfg.trainer.get("log_val_generations") or 0)
        if n:  # verl's input_ids: the first prompt, then the response (later turns' prompts are in it)
            ids, am = out.batch["input_ids"][:n], out.batch["attention_mask"][:n].bool()
            write_generations(self.out_dir / GENERATIONS_FILE, self.global_steps, traj.episodes[:n],
                              [self.tokenizer.decode(ids[i][am[i]].tolist()) for i in range(ids.shape[0])])
        metrics = episode_metrics(traj, "val")
        if self.use_critic:  # the critic on the held-out episodes, replicas asleep as for a training step's scoring
            self.checkpoint_manager.sleep_replicas()
            out.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature  # verl's engine reads it
            traj.values = self.denormalized(self._compute_values(out).batch["values"].float()) * traj.response_mask
            self.checkpoint_manager.update_weights(self.global_steps)  # awake again, at the actor's weights
            metrics["val/critic_explained_var"] = heldout_critic_explained_var(traj, self.rcfg)
        return metrics

    # ---------------------------------------------------------------------------------- one step
    def compute_advantages(self, batch: DataProto, traj: Trajectory) -> Dict[str, float]:
        """Our advantage step (both engines'), with the in-reward KL penalty when on (returns its metrics);
        verl's ``token_level_scores`` / ``token_level_rewards`` (scores minus the penalty) for its data metrics."""
        if self.reward_kl_ctrl is not None:
            traj.old_logp, traj.ref_logp = batch.batch["old_log_probs"], batch.batch["ref_log_prob"]
        penalty, kl_metrics = reward_kl_penalty(traj, self.rcfg, self.reward_kl_ctrl)
        compute_advantages(traj, self.rcfg, penalty)
        mask = batch.batch["response_mask"].float()
        batch.batch["advantages"] = traj.advantages.float() * mask
        # verl's critic/returns/* metrics read token returns: a turn critic's return_h on each token of turn h
        returns = traj.returns if traj.turn_returns is None else \
            scatter_turns(traj.turn_returns, traj.turn_ids)
        batch.batch["returns"] = returns.float() * mask
        rewards = place_turn_rewards(normalized_turn_rewards(traj, self.rcfg), traj.turn_ids)
        batch.batch["token_level_scores"] = rewards
        batch.batch["token_level_rewards"] = rewards if penalty is None else rewards + penalty.to(rewards)
        return kl_metrics

    def score(self, batch: DataProto, metrics: Dict[str, float], timing: Dict[str, float]) -> DataProto:
        """Old log-probs (actor worker), reference log-probs (KL on) and critic values (critic worker)."""
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["images_seqlens"] = []
        with marked_timer("old_log_prob", timing):
            old, mfu = self._compute_old_log_prob(batch)
            entropys = old.batch.pop("entropys")
            a = self.config.actor_rollout_ref.actor
            metrics["actor/entropy"] = agg_loss(loss_mat=entropys, loss_mask=batch.batch["response_mask"],
                                                loss_agg_mode=a.loss_agg_mode).item()
            metrics["perf/mfu/actor_infer"] = mfu
            batch = batch.union(old)
        if self.use_reference_policy:
            with marked_timer("ref", timing):
                batch = batch.union(self._compute_ref_log_prob(batch))
        if self.use_critic:
            with marked_timer("values", timing):
                batch = batch.union(self._compute_values(batch))
                if self.value_norm is not None:  # the critic worker's outputs on the return scale
                    v = batch.batch["values"]
                    batch.batch["values"] = (self.denormalized(v.float()) * batch.batch["response_mask"]).to(v.dtype)
        return batch

    def denormalized(self, out: torch.Tensor) -> torch.Tensor:
        """The critic's outputs on the return scale: as they are, or de-normalised (``critic.target_norm``)."""
        return out if self.value_norm is None else self.value_norm.denormalize(out)

    def update_critic(self, batch: DataProto, traj: Trajectory) -> Dict[str, float]:
        """verl's critic update (its value loss) on :func:`critic_batch` (turn starts only for a turn critic); with
        ``critic.target_norm`` on the normalised values and targets (the local engine's
        :func:`~ragen_turn.engines.advantages.normalised_critic_batch`)."""
        level, metrics = self.rcfg.critic.level, {}
        if self.value_norm is None:
            cb = critic_batch(batch, traj, level)
        else:
            ntraj, metrics = normalised_critic_batch(self.value_norm, traj, level)
            cb = critic_batch(batch, ntraj, level, normalised=True)
        out = self._update_critic(cb)
        metrics.update(reduce_metrics(out.meta_info["metrics"]))
        if "critic/vf_loss" in metrics:  # our name for verl's
            metrics["critic/value_loss"] = metrics["critic/vf_loss"]
        return metrics

    def update_actor(self, batch: DataProto, traj: Trajectory) -> Dict[str, float]:
        """verl's actor update (its ``ppo_loss`` calling our registered policy loss), with the turn counts."""
        dp = self._get_dp_size(self.actor_rollout_wg, "actor")
        mini = int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size)
        keys = list(TRAIN_KEYS) + ["old_log_probs", "advantages"]
        if "ref_log_prob" in batch.batch.keys():
            keys.append("ref_log_prob")
        actor_batch = DataProto.from_dict(tensors={k: batch.batch[k] for k in keys}, meta_info=dict(batch.meta_info))
        actor_batch.batch[TURNS_FIELD] = minibatch_turn_counts(traj.turn_mask.sum(dim=1), mini, dp)
        actor_batch.batch[UPDATE_FIELD] = torch.full((len(actor_batch),), float(self._update_count))
        self._update_count += 1
        raw = self._update_actor(actor_batch).meta_info["metrics"]
        a = self.rcfg.actor_rollout_ref.actor
        return update_metrics(raw, a.get("target_kl"), str(a.get("step_scale") or "none"))

    def order_rows(self, batch: DataProto, metrics: Dict[str, float], step: int) -> None:
        """The row order the updates walk: verl's ``_balance_batch`` (``trainer.balance_batch``), then each
        rank's rows shuffled (:func:`mix_within_ranks`), so mini-batches mix short and long episodes."""
        if self.config.trainer.balance_batch:
            self._balance_batch(batch, metrics=metrics)
        dp = self._get_dp_size(self.actor_rollout_wg, "actor")
        batch.reorder(mix_within_ranks(len(batch), dp, derived_seed(self.rcfg.seed, step, 11)))

    def train_step(self) -> Dict[str, float]:
        metrics: Dict[str, float] = {}
        timing: Dict[str, float] = {}
        step = self.global_steps
        with marked_timer("step", timing):
            with marked_timer("gen", timing):
                batch, gen_timing = self.rollout(self.train_plan.assign_seeds(self.rcfg.seed, step), "train", step)
                self.checkpoint_manager.sleep_replicas()
            timing.update(gen_timing)
            if self.tracer is not None:  # each rollout row's number, through filtering and copy-mode padding
                batch.non_tensor_batch[TRACE_SLOT] = np.arange(len(batch), dtype=object)
            traj = to_trajectory(batch)
            metrics.update(episode_metrics(traj, "env"))
            spec = FilterSpec.from_config(self.rcfg.actor_rollout_ref.rollout)
            keep, filter_metrics = filter_rows(traj.group_ids, traj.episode_rewards, spec)
            metrics.update(filter_metrics)
            if len(keep) == 0:  # no group kept (RAGEN's empty_after_filter): no update this step
                with marked_timer("update_weights", timing):
                    self.checkpoint_manager.update_weights(step + 1)
                return self._empty_step(metrics, timing)
            if not spec.fixed_count:  # RAGEN's copy mode: repeat kept rows up to a size verl splits evenly
                dp = self._get_dp_size(self.actor_rollout_wg, "actor")
                keep = pad_rows(keep, int(np.lcm(int(self.rcfg.ppo_mini_batch_size), dp)),
                                derived_seed(self.rcfg.seed, step, 13))
            self.empty_filtered_steps = 0
            if len(keep) != len(batch):
                batch = batch.select_idxs(keep)
            self.order_rows(batch, metrics, step)
            batch = self.score(batch, metrics, timing)

            with marked_timer("adv", timing):
                traj = to_trajectory(batch)  # after filtering / balancing: same rows as the batch
                metrics.update(self.compute_advantages(batch, traj))
                adv = batch.batch["advantages"][batch.batch["response_mask"].bool()]
                metrics.update(advantage_metrics(batch.batch["advantages"], batch.batch["response_mask"],
                                                 traj.turn_ids, self.rcfg.actor_rollout_ref.rollout.response_length))
            if not torch.isfinite(adv).all():
                raise RuntimeError(f"step {step}: non-finite advantages (check the rewards and the critic)")
            traced = self.trace_begin(batch, traj)
            if self.use_critic:
                with marked_timer("update_critic", timing):
                    metrics.update(self.update_critic(batch, traj))
            if self.rcfg.trainer.critic_warmup > step + 1:  # verl's rule (steps from 1): critic only
                metrics["actor/critic_warmup"] = 1.0
            else:
                with marked_timer("update_actor", timing):
                    metrics.update(self.update_actor(batch, traj))
                if traced:
                    with marked_timer("trace", timing):
                        self.trace_update(batch, traj, traced)
            with marked_timer("update_weights", timing):
                self.checkpoint_manager.update_weights(step + 1)

        metrics.update(compute_data_metrics(batch=batch, use_critic=self.use_critic))
        if "critic/vf_explained_var" in metrics:
            metrics["critic/explained_var"] = metrics["critic/vf_explained_var"]
        metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing))
        metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing,
                                                  n_gpus=self.resource_pool_manager.get_n_gpus()))
        metrics["perf/step_s"] = timing["step"]
        metrics["perf/rollout_s"] = timing["gen"]
        metrics["perf/tokens_per_s"] = float(batch.batch["attention_mask"].sum()) / max(timing["step"], 1e-9)
        metrics["env/kept_episodes"] = float(len(batch))
        if self.tracer is not None:
            self.tracer.write(step + 1)
        return metrics

    def trace_begin(self, batch: DataProto, traj: Trajectory) -> list:
        """``trainer.trace_episodes``: the traced rows' records (``engines/trace.py``), copies (copy-mode padding)
        left out; returns the rows ([] when off)."""
        if self.tracer is None:
            return []
        slots = batch.non_tensor_batch[TRACE_SLOT].tolist()  # the rollout's row: copy-mode copies share it
        rows = trace_rows(traj.group_ids.tolist(), self.tracer.n, slots)
        prompts, pam = batch.batch["prompts"], batch.batch["attention_mask"][:, :batch.batch["prompts"].shape[1]]
        self.tracer.begin(traj, rows, [prompts[i][pam[i].bool()].tolist() for i in rows])
        return rows

    def trace_update(self, batch: DataProto, traj: Trajectory, rows: list) -> None:
        """The traced rows' turn ratios and clip flags after the actor's update: one forward of those rows
        (``_compute_old_log_prob``) against the rollout's log-probs (verl's loss runs in its workers)."""
        sub = batch.select_idxs(rows)  # padded as verl's forward needs: a multiple of dp x micro-batch rows
        dp = self._get_dp_size(self.actor_rollout_wg, "actor")
        padded, pad = pad_dataproto_to_divisor(sub, dp * int(self.rcfg.micro_batch_size_per_gpu))
        new = unpad_dataproto(self._compute_old_log_prob(padded)[0], pad)
        self.tracer.observe([traj.episodes[r] for r in rows], sub.batch["old_log_probs"], new.batch["old_log_probs"],
                            traj.advantages[rows], traj.response_mask[rows], traj.turn_ids[rows], "after_update")

    def _empty_step(self, metrics: Dict[str, float], timing: Dict[str, float]) -> Dict[str, float]:
        """The metrics of a step whose rollout filter kept no env group (the weights stay)."""
        self.empty_filtered_steps = getattr(self, "empty_filtered_steps", 0) + 1
        print(f"[warn] step {self.global_steps + 1}: the rollout filter kept no env group; no update "
              f"({self.empty_filtered_steps} such step(s) in a row)", flush=True)
        metrics.update({"rollout/empty_after_filter": 1.0, "env/kept_episodes": 0.0,
                        "rollout/consecutive_empty_after_filter_steps": float(self.empty_filtered_steps),
                        "perf/rollout_s": timing.get("gen", 0.0)})
        return metrics

    def fit(self) -> Dict[str, float]:
        rt = self.rcfg.trainer
        total = self.total_training_steps
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._tracker = self._make_tracker()
        self.global_steps = 0
        self._load_checkpoint()
        if not run_complete(self.global_steps, total):  # a finished run resumed: its files are left alone
            record_config(self.out_dir, OmegaConf.to_yaml(self.rcfg), self.global_steps)  # + configs.jsonl
            record_provenance(self.out_dir, self.global_steps,  # host and versions (weights: in the workers)
                              identity=identity_of(self.rcfg))
            truncate_metrics(self.metrics_path, self.global_steps)  # fresh run: a fresh log; resumed: <= step
            truncate_metrics(self.out_dir / GENERATIONS_FILE, self.global_steps)
            truncate_metrics(self.out_dir / TRACE_FILE, self.global_steps)
        self.checkpoint_manager.update_weights(self.global_steps)
        print(run_header(self.rcfg, type(self).__name__, self.global_steps, len(self.train_plan),
                         self.out_dir), flush=True)
        last: Dict[str, float] = {}
        if self.global_steps == 0 and rt.val_before_train:
            last = {"step": 0, **self._validate()}
            self._log(last)
        while self.global_steps < total:
            metrics = self.train_step()
            self.global_steps += 1
            final = self.global_steps == total
            if (rt.test_freq and self.global_steps % rt.test_freq == 0) or final:
                metrics.update(self._validate())
            metrics["step"] = self.global_steps
            # the step's line (and evaluation) first, then its checkpoint: a kill between the two resumes from the
            # checkpoint before, whose resume drops the line and plays the step again (the local engine's order)
            self._log(metrics)
            if (rt.save_freq and self.global_steps % rt.save_freq == 0) or final:
                self._save_checkpoint()
            last = metrics
        return last

    # ---------------------------------------------------------------------------------- checkpoints
    def _save_checkpoint(self) -> Path:
        """verl's checkpoint of this step, written so that a crash at any moment leaves the previous ones
        loadable (``engines/checkpoints.py``): the workers write into ``.tmp_global_step_N``, the driver adds
        ``data.pt`` and ``complete.json`` (sizes, sha256), renames it to ``global_step_N`` and replaces verl's
        tracker file atomically; then the rotation (``trainer.keep_checkpoints``) over every ``global_step_*``
        in the run directory, this process's or not."""
        step = self.global_steps
        name = ckpt.verl_dir_name(step)
        tmp = ckpt.begin(self.out_dir, step, name=name)
        try:
            with writing(tmp / "actor"):  # a worker's full disk arrives as a Ray error holding the words
                self.actor_rollout_wg.save_checkpoint(str(tmp / "actor"), None, step, max_ckpt_to_keep=None)
            crash_point("actor written")
            if self.use_critic:
                with writing(tmp / "critic"):
                    self.critic_wg.save_checkpoint(str(tmp / "critic"), None, step, max_ckpt_to_keep=None)
                crash_point("critic written")
            with writing(tmp / "data.pt"):
                torch.save(self.train_dataloader.state_dict(), tmp / "data.pt")
            crash_point("data.pt written")
            if self.value_norm is not None:
                with writing(tmp / VALUE_NORM_FILE):
                    torch.save(self.value_norm.state_dict(), tmp / VALUE_NORM_FILE)
            final = ckpt.commit(tmp, step, name=name, pointer=ckpt.VERL_TRACKER, pointer_text=str(step))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed write frees its space; the older checkpoints stay
            raise
        gone = ckpt.rotate(self.out_dir, int(self.rcfg.trainer.keep_checkpoints or 0))
        if gone:
            print(f"[ragen_turn] rotation (trainer.keep_checkpoints={self.rcfg.trainer.keep_checkpoints}) removed "
                  + ", ".join(p.name for p in gone), flush=True)
        return final

    def _load_checkpoint(self) -> int:
        """What a start does to the run directory's checkpoints: remove what a killed writer left (staging,
        half-deleted and incomplete ``global_step_*``); a fresh start (``trainer.resume=false``) removes the
        earlier run's checkpoints; a resume loads the newest complete checkpoint whose files match their sha256
        (verl's tracker file is read first; a missing, empty, garbage or stale one is said in one line and passed
        over, and a checkpoint that fails its checksum or its load is said and the next older one tried), then
        removes the checkpoints after it; ``trainer.resume_from`` (``global_step_N`` or ``latest``) names the one
        to load instead. Returns the step resumed from (0: none)."""
        log = partial(print, flush=True)
        ckpt.clean(self.out_dir, log=log)
        if self.config.trainer.resume_mode == "disable":
            old = ckpt.remove_all(self.out_dir)
            if old:
                log(f"[ragen_turn] removed the checkpoints of the earlier run in {self.out_dir} (a fresh start)")
            return 0
        unverified = bool(self.rcfg.trainer.get("load_unverified", False))
        name = self.rcfg.trainer.get("resume_from")
        if name:  # a named checkpoint (global_step_N or latest), verified; no fallback
            path = ckpt.find(self.out_dir, str(name), verify=True, allow_unverified=unverified, engine="verl")
            self._load_workers(path)
        tried: tuple = ()
        while not name:
            path = ckpt.resume_point(self.out_dir, log=log, pointer=ckpt.VERL_TRACKER, skip=tried, engine="verl",
                                     allow_unverified=unverified)
            if path is None:
                if ckpt.step_dirs(self.out_dir):
                    raise FileNotFoundError(f"trainer.resume=true: no checkpoint in {self.out_dir} loads (see the "
                                            "lines above); trainer.overwrite=true starts the run over")
                log(f"[ragen_turn] trainer.resume=true but no checkpoint in {self.out_dir}: starting fresh")
                return 0
            try:
                self._load_workers(path)
                break
            except Exception as e:  # e.g. a file the checksum did not catch (a checkpoint without sha256)
                log(f"[ragen_turn] checkpoint {path} failed to load ({type(e).__name__}: "
                    f"{str(e).strip().splitlines()[-1][:200] if str(e).strip() else ''}); trying an older one")
                tried += (path.name,)
        self.global_steps = ckpt.step_of(path)
        ckpt.drop_after(self.out_dir, self.global_steps, log=log)
        log(f"[ragen_turn] resumed from {path} at step {self.global_steps}")
        return self.global_steps

    def _load_workers(self, path: Path) -> None:
        """The actor's (and critic's) state from checkpoint ``path``, by verl's workers (their loader unpickles:
        ``path`` has been verified against its ``complete.json`` first)."""
        self.actor_rollout_wg.load_checkpoint(str(path / "actor"), del_local_after_load=False)
        if self.use_critic:
            self.critic_wg.load_checkpoint(str(path / "critic"), del_local_after_load=False)
        if self.value_norm is not None:
            if not (path / VALUE_NORM_FILE).exists():
                raise FileNotFoundError(f"{path} holds no {VALUE_NORM_FILE}: it was written without "
                                        "critic.target_norm=true, which this run has (resume with the same setting)")
            self.value_norm.load_state_dict(torch.load(path / VALUE_NORM_FILE, weights_only=True))

    # ---------------------------------------------------------------------------------- logging
    def _make_tracker(self):
        if self.rcfg.logger != "wandb":
            return None
        from verl.utils.tracking import Tracking

        os.environ.setdefault("WANDB_MODE", str(self.rcfg.wandb.mode))
        return Tracking(project_name=self.config.trainer.project_name,
                        experiment_name=self.config.trainer.experiment_name, default_backend=["wandb"],
                        config=OmegaConf.to_container(self.rcfg, resolve=True))

    def _log(self, metrics: Dict[str, Any]) -> None:
        append_metrics(self.metrics_path, metrics)
        if self._tracker is not None:
            self._tracker.log(data=with_ragen_names(metrics), step=int(metrics.get("step", self.global_steps)))
        print(progress_line(metrics), flush=True)


class TrainerBuilder(BaseTaskRunner):
    """verl's v0 TaskRunner steps without datasets: roles, resource pools, workers, then our trainer.

    :class:`TaskRunner` (a Ray actor) runs :meth:`run` for ``run_ppo``; tests call
    :meth:`build_trainer` in their own process to drive the same workers step by step.
    """

    def use_gloo_workers(self) -> None:
        """On cpu: verl's same workers, opening a plain gloo process group first (see :mod:`.workers`)."""
        from verl.trainer.ppo.ray_trainer import Role

        from .workers import GlooActorRolloutRefWorker, GlooTrainingWorker

        for role in list(self.role_worker_mapping):
            cls = GlooTrainingWorker if role == Role.Critic else GlooActorRolloutRefWorker
            self.role_worker_mapping[role] = ray.remote(cls)

    def build_trainer(self, config: DictConfig) -> VerlStarPOTrainer:
        """Our trainer with verl's worker groups, rollout servers and agent-loop workers started."""
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config

        OmegaConf.resolve(config)
        _, ray_worker_group_cls = self.add_actor_rollout_worker(config)
        if need_critic(config):
            self.add_critic_worker(config)
        if config.trainer.device == "cpu":
            self.use_gloo_workers()
        self.add_reward_model_resource_pool(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
        tokenizer = omega_conf_to_dataclass(config.actor_rollout_ref.model).tokenizer
        pools = self.init_resource_pool_mgr(config)
        trainer = VerlStarPOTrainer(config=config, tokenizer=tokenizer,
                                role_worker_mapping=self.role_worker_mapping, resource_pool_manager=pools,
                                ray_worker_group_cls=ray_worker_group_cls)
        trainer.init_workers()
        return trainer

    def run(self, config: DictConfig) -> Dict[str, float]:
        return self.build_trainer(config).fit()


TaskRunner = ray.remote(num_cpus=1)(TrainerBuilder)
