"""The run configuration: its checks before any work, and the values derived from it that every engine reads.

:func:`validate_config` is the one entry point both engines (and ``evaluate`` / ``report``) call on a
composed config before building anything: each bad value raises a ``ValueError`` naming its key.
"""
from __future__ import annotations

from typing import Any, Dict

from omegaconf import DictConfig, OmegaConf

TRAINER_NAMES = ("starpo", "turn")
# the critic each advantage estimator reads (none: no critic is built)
CRITIC_LEVEL_OF = {"grpo": "none", "token_gae": "token", "bi_level_gae": "token", "turn_gae": "turn"}


def kept_group_count(n_groups: int, ratio: float) -> int:
    """StarPO-S: how many of ``n_groups`` env groups the rollout filter keeps (the top ``ratio``, at least one)."""
    return max(1, int(round(n_groups * ratio)))


def kept_batch_size(cfg: DictConfig) -> int:
    """Episodes per step after StarPO-S group filtering (what the actor and critic train on)."""
    tr = cfg.es_manager.train
    return kept_group_count(tr.env_groups, cfg.actor_rollout_ref.rollout.rollout_filter_ratio) * tr.group_size


def model_config(cfg: DictConfig) -> Dict[str, Any]:
    """The ``model`` section as a plain dict, with RAGEN's top-level ``model_path`` as ``path`` when set."""
    m = OmegaConf.to_container(cfg.model, resolve=True)
    if cfg.get("model_path"):
        m["path"] = cfg.model_path
    return m


def validate_config(cfg: DictConfig) -> None:
    """Check a composed config before any work; raise ``ValueError`` naming the bad key.

    First RAGEN's keys are mapped onto ours (:mod:`ragen_turn.ragen_keys`; a key without our meaning stops here)
    and the ``env_module`` modules are imported, so the envs they register are known when ``custom_envs`` is checked.
    """
    import torch

    from ragen_turn.algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
    from ragen_turn.envs import import_env_modules
    from ragen_turn.ragen_keys import apply_ragen_keys
    from ragen_turn.rollout.env_manager import parse_split

    apply_ragen_keys(cfg)
    import_env_modules(cfg.get("env_module"))

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
    needs = CRITIC_LEVEL_OF[adv]
    if level != needs:
        raise ValueError(f"algorithm.adv_estimator={adv} needs critic.level={needs}, got {level!r}")
    trainer = cfg.algo.get("trainer", "starpo")
    if trainer not in TRAINER_NAMES:
        raise ValueError(f"algo.trainer must be one of {list(TRAINER_NAMES)}, got {trainer!r}")
    if (trainer == "turn") != (adv == "turn_gae"):
        raise ValueError(f"algo.trainer={trainer} with algorithm.adv_estimator={adv}: the turn trainer is the turn "
                         "critic + turn GAE (adv_estimator=turn_gae); every other estimator runs on "
                         "algo.trainer=starpo")
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
    kept = kept_batch_size(cfg)
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
    ends = cfg.algorithm.get("bi_level_gae_turn_ends", "mask")
    if ends not in ("mask", "rewards"):
        raise ValueError(f"algorithm.bi_level_gae_turn_ends must be mask or rewards, got {ends!r}")
    freq = cfg.trainer.get("collapse_freq", 0)
    if not isinstance(freq, int) or isinstance(freq, bool) or freq < 0:
        raise ValueError(f"trainer.collapse_freq must be an integer >= 0 (0 = never), got {freq!r}")
    n = cfg.trainer.get("collapse_num_samples", None)
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 2):
        raise ValueError(f"trainer.collapse_num_samples must be null (all) or an integer >= 2, got {n!r}")
    ws = cfg.model.get("warmstart", {}).get("enable", False)
    if ws not in (True, False, "auto"):
        raise ValueError(f"model.warmstart.enable must be true, false or auto, got {ws!r}")
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
