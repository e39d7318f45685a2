"""Env groups (RAGEN's es_manager): BR groups x G rollouts, every rollout of a group on one seed.

``custom_envs.<Tag>`` says what a tag is (``env_type``, ``env_config``, ``env_instruction``,
``max_actions_per_traj``); ``es_manager.{train,val}`` says how many groups of which tags to run.
Train seeds are drawn per step from the run seed; val seeds are a fixed held-out range that train
seeds never reach. ``es_manager.val.seeds=dev`` evaluates on a second fixed range (``DEV_SEED_OFFSET``),
disjoint from both, for choosing settings without looking at the held-out seeds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping

import numpy as np

from ragen_turn.envs import get_env_class, make_env

VAL_SEED_OFFSET = 1_000_000_000  # train seeds are < this, val seeds >= this
DEV_SEED_OFFSET = 2_000_000_000  # es_manager.val.seeds=dev: a validation range for tuning, never held-out or train
VAL_SEED_RANGES = {"heldout": VAL_SEED_OFFSET, "dev": DEV_SEED_OFFSET}


def train_env_seed(run_seed: int, step: int, group_id: int) -> int:
    """The env seed of train group ``group_id`` at ``step`` (0-based) of run ``seed=run_seed``: a hash of the
    three (numpy's ``SeedSequence``) into ``[0, VAL_SEED_OFFSET)``. So a run seed's batches are its own: run seed
    100's step-0 batch is no batch of any run whose seed is not 100 (``benchmarks/one_update.py``'s dev seeds)."""
    ss = np.random.SeedSequence([int(run_seed), int(step), int(group_id)])
    return int(ss.generate_state(1, dtype=np.uint64)[0] % VAL_SEED_OFFSET)


@dataclass
class EnvSlot:
    """One environment instance in the batch and where its episode comes from."""

    env: Any
    tag: str
    group_id: int
    instruction: str
    max_actions: int
    seed: int = 0

    @classmethod
    def of(cls, tag: str, spec: Any, env: Any, group_id: int, seed: int = 0) -> "EnvSlot":
        """The slot for one env of ``custom_envs.<tag>`` (``spec``). Its instruction is the entry's
        ``env_instruction``: ``null`` (or absent) = the env's own rules text (``env.instruction``), a string = that
        string, ``""`` included (RAGEN's Bandit entry: no rules in the system prompt, as in RAGEN)."""
        given = spec.get("env_instruction")
        instruction = getattr(env, "instruction", "") if given is None else given
        return cls(env=env, tag=tag, group_id=int(group_id), instruction=str(instruction),
                   max_actions=int(spec.get("max_actions_per_traj") or 10**9), seed=int(seed))


def _plain(x: Any) -> Any:
    """OmegaConf containers -> plain python (lists for tuples are fine for env configs)."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(x):
            return OmegaConf.to_container(x, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return x


def parse_split(custom_envs: Mapping[str, Any], split_cfg: Mapping[str, Any], split: str):
    """Check ``es_manager.<split>`` against ``custom_envs``; returns ([(tag, n_groups, spec)], BR, G)."""
    custom_envs = _plain(custom_envs) or {}
    split_cfg = _plain(split_cfg)
    env_groups = int(split_cfg.get("env_groups", 1))
    group_size = int(split_cfg.get("group_size", 1))
    if env_groups < 1 or group_size < 1:
        raise ValueError(f"es_manager.{split}.env_groups and group_size must be >= 1")
    if env_groups * group_size > DEV_SEED_OFFSET - VAL_SEED_OFFSET:
        raise ValueError(f"es_manager.{split}: at most {DEV_SEED_OFFSET - VAL_SEED_OFFSET} episodes")
    seeds = split_cfg.get("seeds", "heldout")
    if split != "train" and seeds not in VAL_SEED_RANGES:
        raise ValueError(f"es_manager.{split}.seeds must be one of {sorted(VAL_SEED_RANGES)}, got {seeds!r}")
    env_configs = split_cfg.get("env_configs") or {}
    tags = list(env_configs.get("tags") or [])
    n_groups = [int(n) for n in (env_configs.get("n_groups") or [])]
    if not tags:
        raise ValueError(f"es_manager.{split}.env_configs.tags is empty")
    if len(n_groups) != len(tags):
        raise ValueError(f"es_manager.{split}.env_configs.n_groups must have one entry per tag ({tags})")
    if sum(n_groups) != env_groups:
        raise ValueError(f"es_manager.{split}.env_configs.n_groups sums to {sum(n_groups)} but "
                         f"es_manager.{split}.env_groups is {env_groups}")
    out = []
    for tag, n in zip(tags, n_groups):
        if tag not in custom_envs:
            raise ValueError(f"es_manager.{split}.env_configs.tags names {tag!r}, which is not in custom_envs "
                             f"({sorted(custom_envs)})")
        spec = custom_envs[tag]
        try:
            get_env_class(spec.get("env_type"))
        except ValueError as e:
            raise ValueError(f"custom_envs.{tag}.env_type: {e}") from None
        out.append((tag, n, spec))
    return out, env_groups, group_size


class EnvGroupManager:
    """Builds the env slots of one split (``train`` or ``val``) once and re-seeds them each step."""

    def __init__(self, custom_envs: Mapping[str, Any], split_cfg: Mapping[str, Any], split: str = "train",
                 build_envs: bool = True):
        """``build_envs=False`` plans slots and seeds only (engines whose envs live in remote workers)."""
        self.split = split
        groups, self.env_groups, self.group_size = parse_split(custom_envs, split_cfg, split)
        self.seed_offset = VAL_SEED_RANGES[(_plain(split_cfg) or {}).get("seeds", "heldout")]
        self.slots: List[EnvSlot] = []
        gid = 0
        for tag, n, spec in groups:
            for _ in range(n):
                for _ in range(self.group_size):
                    env = make_env(spec["env_type"], dict(spec.get("env_config") or {})) if build_envs else None
                    if hasattr(env, "set_slot"):  # an env whose episodes depend on its place (RAGEN's Bandit)
                        env.set_slot(len(self.slots))
                    self.slots.append(EnvSlot.of(tag, spec, env, gid))
                gid += 1

    def __len__(self) -> int:
        return len(self.slots)

    def assign_seeds(self, run_seed: int, step: int) -> List[EnvSlot]:
        """Give every group a seed: train seeds from (run_seed, step, group); val seeds fixed
        (held-out: ``VAL_SEED_OFFSET + group``; ``seeds=dev``: ``DEV_SEED_OFFSET + group``)."""
        for slot in self.slots:
            if self.split == "val":
                slot.seed = self.seed_offset + slot.group_id
            else:
                slot.seed = train_env_seed(run_seed, step, slot.group_id)
        return self.slots

    def close(self) -> None:
        for s in self.slots:
            if s.env is not None:
                s.env.close()
