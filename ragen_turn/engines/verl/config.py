"""``engine=verl``: our Hydra config -> verl 0.9.1's config (``actor_rollout_ref``, ``critic``, ``algorithm``, ``trainer``).

verl's full default config is the ``_generated_ppo_trainer.yaml`` that verl ships (what its Hydra
``ppo_trainer`` composes to). :func:`to_verl_config` overlays our keys on it, RAGEN's names going
to the same names where verl has them, and stores our whole config under ``ragen`` (the trainer and
the agent loop read env groups, turn/critic settings and the reward normalisation from there).
verl's own sections only get keys verl's config classes accept: :func:`check_verl_config` builds
them through verl's dataclasses and its ``validate_config``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from omegaconf import DictConfig, OmegaConf, open_dict
from verl.workers.config import PolicyLossConfig

from ragen_turn.config import kept_batch_size, validate_config

EXTERNAL_MODULES = "ragen_turn.engines.verl.register,ragen_turn.engines.verl.agent_loop"
AGENT_LOOP_NAME = "ragen_turn_env"


@dataclass
class RagenPolicyLossConfig(PolicyLossConfig):
    """verl's ``actor.policy_loss`` plus the knobs of our losses (SPEC.md).

    ``loss_agg_mode`` here is the policy loss's own aggregation (null = the loss's default:
    ``turn-mean`` for turn_ppo, ``token-mean`` otherwise); verl's ``actor.loss_agg_mode`` stays
    ``token-mean`` and only aggregates the entropy and KL terms.
    """

    ratio_mode: Optional[str] = None
    clip_bias: bool = False
    clip_bias_level: str = "sample"
    clip_bias_stat: str = "mass"
    clip_bias_threshold: Optional[float] = None
    loss_agg_mode: Optional[str] = None


def verl_default_config() -> DictConfig:
    """verl's full PPO trainer config, as it ships it (no Hydra run needed)."""
    import verl

    path = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    return OmegaConf.load(path)


def _plain(x: Any) -> Any:
    return OmegaConf.to_container(x, resolve=True) if OmegaConf.is_config(x) else x


def check_ragen_config(cfg: DictConfig) -> None:
    """Our config checks (``ragen_turn.config``) plus what verl's batching needs; ValueError naming the key."""
    validate_config(_without_device(cfg))
    v = cfg.engine.verl
    n_gpus = int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes)
    if n_gpus < 1:
        raise ValueError("trainer.n_gpus_per_node x trainer.nnodes must be >= 1 for engine=verl")
    kept = kept_batch_size(cfg)
    bm = int(cfg.ppo_mini_batch_size)
    if kept % bm:
        raise ValueError(f"ppo_mini_batch_size={bm} must divide the rollout batch after filtering ({kept} = "
                         "es_manager.train.env_groups x group_size x rollout_filter_ratio): verl splits it evenly")
    if v.strategy in ("fsdp", "fsdp2"):
        dp = n_gpus // int(v.get("ulysses_sequence_parallel_size", 1) or 1)
        if bm % dp or kept % dp:
            raise ValueError(f"ppo_mini_batch_size={bm} and the kept batch ({kept}) must be multiples of the data "
                             f"parallel size {dp} (trainer.n_gpus_per_node x trainer.nnodes)")
    pl = cfg.actor_rollout_ref.actor.policy_loss
    from ragen_turn.algos import needs_minibatch_stats

    if needs_minibatch_stats(str(pl.loss_mode), _plain(pl)) and (n_gpus > 1 or int(cfg.micro_batch_size_per_gpu) < bm):
        raise ValueError("actor_rollout_ref.actor.policy_loss.clip_bias_level=batch on engine=verl needs "
                         f"micro_batch_size_per_gpu ({cfg.micro_batch_size_per_gpu}) >= ppo_mini_batch_size ({bm}) "
                         f"on one GPU (here {n_gpus}): verl back-propagates each micro-batch before it has seen the "
                         "next, so the mini-batch statistic cannot be gathered first (engine=local does); "
                         "or use clip_bias_level=sample")
    if v.rollout_name not in ("vllm", "sglang"):
        raise ValueError(f"engine.verl.rollout_name must be vllm or sglang, got {v.rollout_name!r}")
    if int(v.prompt_length) < 1:
        raise ValueError("engine.verl.prompt_length must be >= 1")


def _without_device(cfg: DictConfig) -> DictConfig:
    """validate_config checks ``device`` against this process; verl always trains on its GPUs."""
    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    c.device = "cpu"
    return c


def to_verl_config(cfg: DictConfig, model_path: Optional[str] = None) -> DictConfig:
    """Map our resolved config onto verl's. ``model_path`` defaults to ``model.path`` / ``model_path``."""
    check_ragen_config(cfg)
    if cfg.model.get("warmstart", {}).get("enable", False):
        print("[ragen_turn] engine=verl: model.warmstart is not run on verl (start from a trained checkpoint)")
    if cfg.critic.level != "none" and cfg.critic.get("shared_backbone", False):
        raise ValueError("critic.shared_backbone=true runs on engine=local only: verl trains a separate critic model")
    if cfg.algorithm.get("bootstrap_truncated", False):
        raise ValueError("algorithm.bootstrap_truncated=true runs on engine=local only: verl's critic returns the values "
                         "before each response token and drops the one after the last token, which the bootstrap reads")
    if cfg.trainer.get("time_budget_s") is not None:
        raise ValueError("trainer.time_budget_s runs on engine=local only: on verl, set trainer.total_training_steps")
    v = cfg.engine.verl
    ar = cfg.actor_rollout_ref
    a, r = ar.actor, ar.rollout
    path = str(model_path or cfg.get("model_path") or cfg.model.get("path") or "")
    if not path:
        raise ValueError("engine=verl needs model.path (a local Hugging Face checkpoint directory; "
                         "`python -m ragen_turn.models export tiny DIR` writes a tiny one)")
    n_gpus = int(cfg.trainer.n_gpus_per_node)
    nnodes = int(cfg.trainer.nnodes)
    kept = kept_batch_size(cfg)
    mb = int(cfg.micro_batch_size_per_gpu)
    critic_on = cfg.critic.level != "none"
    out_dir = str(Path(cfg.trainer.default_local_dir).expanduser().resolve())
    keep = int(cfg.trainer.keep_checkpoints) if cfg.trainer.keep_checkpoints else None
    model = {
        "path": path,
        "external_lib": "ragen_turn.engines.verl.register",
        "enable_gradient_checkpointing": bool(v.gradient_checkpointing),
        "use_remove_padding": True,
        "trust_remote_code": bool(v.trust_remote_code),
    }
    fsdp = {"param_offload": bool(v.param_offload), "optimizer_offload": bool(v.optimizer_offload)}
    over = {
        "data": {
            "train_batch_size": kept,
            "max_prompt_length": int(v.prompt_length),
            # verl's response = every token after the first prompt (all turns and env replies)
            "max_response_length": int(cfg.agent_proxy.max_context_tokens),
            "return_raw_chat": True,
        },
        "actor_rollout_ref": {
            "model": model,
            "actor": {
                "strategy": v.strategy,
                "ppo_mini_batch_size": int(cfg.ppo_mini_batch_size),
                "ppo_micro_batch_size_per_gpu": mb,
                "ppo_epochs": int(a.ppo_epochs),
                "shuffle": False,  # the turn-mean normaliser relies on verl's fixed mini-batch order
                "clip_ratio": float(a.clip_ratio_low),
                "clip_ratio_low": float(a.clip_ratio_low),
                "clip_ratio_high": float(a.clip_ratio_high),
                "clip_ratio_c": float(a.clip_ratio_c),  # dual clip: verl's own key, read by our losses too
                "entropy_coeff": float(a.entropy_coeff),
                "use_kl_loss": bool(a.use_kl_loss),
                "kl_loss_coef": float(a.kl_loss_coef),
                "kl_loss_type": str(a.kl_loss_type),
                "loss_agg_mode": "token-mean",
                "grad_clip": float(a.grad_clip),
                "ulysses_sequence_parallel_size": int(v.ulysses_sequence_parallel_size),
                "optim": {"lr": float(a.optim.lr), "weight_decay": float(a.optim.weight_decay),
                          "betas": list(a.optim.betas)},
                "policy_loss": {
                    "_target_": f"{__name__}.RagenPolicyLossConfig",
                    "loss_mode": str(a.policy_loss.loss_mode),
                    "ratio_mode": a.policy_loss.get("ratio_mode"),
                    "clip_bias": bool(a.policy_loss.get("clip_bias", False)),
                    "clip_bias_level": str(a.policy_loss.get("clip_bias_level", "sample")),
                    "clip_bias_stat": str(a.policy_loss.get("clip_bias_stat", "mass")),
                    "clip_bias_threshold": a.policy_loss.get("clip_bias_threshold"),
                    "loss_agg_mode": a.policy_loss.get("loss_agg_mode"),
                },
                "fsdp_config": fsdp,
            },
            "ref": {"log_prob_micro_batch_size_per_gpu": mb, "fsdp_config": {"param_offload": True}},
            "rollout": {
                "name": str(v.rollout_name),
                "n": 1,  # our G rollouts per group are separate samples with one env seed
                "temperature": float(r.temperature),
                "top_p": float(r.top_p),
                "tensor_model_parallel_size": int(v.rollout_tp),
                "gpu_memory_utilization": float(v.gpu_memory_utilization),
                "log_prob_micro_batch_size_per_gpu": mb,
                "calculate_log_probs": True,
                "val_kwargs": {"temperature": float(r.val_temperature), "do_sample": float(r.val_temperature) > 0,
                               "top_p": float(r.top_p) if float(r.val_temperature) > 0 else 1.0},
                "multi_turn": {"enable": True},
                "agent": {"num_workers": int(v.agent_num_workers), "default_agent_loop": AGENT_LOOP_NAME},
            },
        },
        "critic": {
            "enable": critic_on,
            "strategy": v.strategy,
            "ppo_mini_batch_size": int(cfg.ppo_mini_batch_size),
            "ppo_micro_batch_size_per_gpu": mb,
            "ppo_epochs": int(cfg.critic.ppo_epochs),
            "cliprange_value": float(cfg.critic.cliprange_value),
            "grad_clip": float(cfg.critic.grad_clip),
            "loss_agg_mode": "token-mean",
            "optim": {"lr": float(cfg.critic.optim.lr), "weight_decay": float(cfg.critic.optim.weight_decay)},
            "model": dict(model),
            "fsdp": fsdp,
        },
        "algorithm": {
            "adv_estimator": str(cfg.algorithm.adv_estimator),
            "gamma": float(cfg.algorithm.gamma),
            "lam": float(cfg.algorithm.lam),
            "norm_adv_by_std_in_grpo": bool(cfg.algorithm.norm_adv_by_std_in_grpo),
            "use_kl_in_reward": False,
        },
        "trainer": {
            "use_v1": False,
            "n_gpus_per_node": n_gpus,
            "nnodes": nnodes,
            "total_training_steps": int(cfg.trainer.total_training_steps),
            "project_name": str(cfg.wandb.project),
            "experiment_name": str(cfg.trainer.experiment_name),
            "logger": ["console", "wandb"] if cfg.logger == "wandb" else ["console"],
            "default_local_dir": out_dir,
            "resume_mode": "auto" if cfg.trainer.resume else "disable",
            "val_before_train": bool(cfg.trainer.val_before_train),
            "save_freq": int(cfg.trainer.save_freq),
            "test_freq": int(cfg.trainer.test_freq),
            "max_actor_ckpt_to_keep": keep,
            "max_critic_ckpt_to_keep": keep,
            "balance_batch": True,
            "critic_warmup": 0,
        },
        "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {
            "VERL_USE_EXTERNAL_MODULES": EXTERNAL_MODULES,
            "TOKENIZERS_PARALLELISM": "true",
        }}}},
    }
    vcfg = verl_default_config()
    OmegaConf.set_struct(vcfg, False)
    vcfg = OmegaConf.merge(vcfg, OmegaConf.create(over))
    extra = _plain(v.get("overrides")) or {}
    if extra:  # raw verl keys, merged last (e.g. actor_rollout_ref.actor.fsdp_config.param_offload)
        vcfg = OmegaConf.merge(vcfg, OmegaConf.create(extra))
    ragen = OmegaConf.to_container(cfg, resolve=True)
    ragen.setdefault("model", {})["path"] = path
    ragen["trainer"]["default_local_dir"] = out_dir
    with open_dict(vcfg):
        vcfg.ragen = ragen
    return vcfg


def check_verl_config(vcfg: DictConfig) -> Dict[str, Any]:
    """Build verl's config objects from ``vcfg`` with verl's own classes (raises on anything they reject).

    Returns the built objects (``actor``, ``critic``, ``rollout``, ``model``, ``algorithm``) for inspection.
    This loads the model's config and tokenizer from ``model.path`` (local files only), as verl does.
    """
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    validate_config(vcfg, use_reference_policy=need_reference_policy(vcfg), use_critic=need_critic(vcfg))
    built = {
        "actor": omega_conf_to_dataclass(vcfg.actor_rollout_ref.actor),
        "rollout": omega_conf_to_dataclass(vcfg.actor_rollout_ref.rollout),
        "model": omega_conf_to_dataclass(vcfg.actor_rollout_ref.model),
        "algorithm": omega_conf_to_dataclass(vcfg.algorithm),
    }
    if need_critic(vcfg):
        built["critic"] = omega_conf_to_dataclass(vcfg.critic)
    return built

