"""``engine=verl``: our Hydra config -> verl 0.9.1's config (``actor_rollout_ref``, ``critic``, ``algorithm``,
``trainer``).

verl's full default config is the ``_generated_ppo_trainer.yaml`` that verl ships (what its Hydra
``ppo_trainer`` composes to). :func:`to_verl_config` overlays our keys on it, RAGEN's names going
to the same names where verl has them, and stores our whole config under ``ragen`` (the trainer and
the agent loop read env groups, turn/critic settings and the reward normalisation from there).
verl's own sections only get keys verl's config classes accept: :func:`check_verl_config` builds
them through verl's dataclasses and its ``validate_config``.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, FrozenSet, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from ragen_turn.config import kept_batch_size, policy_loss_config, validate_config
from ragen_turn.schema import policy_loss_knobs

# every Ray worker imports these at `import verl` (VERL_USE_EXTERNAL_MODULES); the CPU platform first, so it
# exists before anything asks verl for one
EXTERNAL_MODULES = ",".join("ragen_turn.engines.verl." + m for m in (
    "cpu_platform", "value_model", "token_logprobs", "hf_rollout", "register", "agent_loop"))
AGENT_LOOP_NAME = "ragen_turn_env"
DEVICES = ("auto", "cpu", "cuda")
ROLLOUTS = ("hf", "vllm", "sglang")
STRATEGIES = ("fsdp", "fsdp2", "megatron")
INSTALL = {"cpu": "pip install -e '.[verl]'", "cuda": "pip install -e '.[gpu]'"}


OPTIONAL_PACKAGES = ("vllm", "sglang", "flash_attn")  # what a GPU machine may or may not have
NO_VALUE_CLIP = 1e30  # verl's value loss always clips: a range no update reaches stands for critic.cliprange_value=null


def verl_cliprange_value(value: Optional[float]) -> float:
    """``critic.cliprange_value`` for verl's critic: the same range, or :data:`NO_VALUE_CLIP` for null (no value
    clipping: then verl's max of the clipped and unclipped errors is the unclipped one)."""
    return NO_VALUE_CLIP if value is None else float(value)


@dataclass(frozen=True)
class Host:
    """The machine verl will run on, as far as the mapping needs it: CUDA devices and optional packages.

    :meth:`this_machine` probes the running process (what ``launch`` uses). A test, or a check of a GPU
    config on a machine without a GPU, passes another:
    ``Host(cuda_devices=8, installed=frozenset({"vllm"}))``.
    """

    cuda_devices: int                      # visible CUDA devices (0: no GPU)
    installed: FrozenSet[str] = frozenset()  # the importable names of OPTIONAL_PACKAGES

    @staticmethod
    def this_machine() -> "Host":
        import importlib.util

        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return Host(gpus, frozenset(m for m in OPTIONAL_PACKAGES if importlib.util.find_spec(m) is not None))


@dataclass(frozen=True)
class Placement:
    """Where and how verl runs: the ``engine.verl`` keys left null, resolved for the device."""

    device: str           # cpu | cuda
    rollout: str          # hf | vllm | sglang
    strategy: str         # fsdp | fsdp2 | megatron
    n_gpus_per_node: int  # FSDP workers per node (on cpu: worker processes)
    nnodes: int
    agent_workers: int
    gradient_checkpointing: bool

    @property
    def world_size(self) -> int:
        return self.n_gpus_per_node * self.nnodes


def resolve_placement(cfg: DictConfig, host: Optional[Host] = None) -> Placement:
    """``engine.verl.device`` (auto: cuda when ``host`` has a GPU, else cpu) and the defaults that follow.

    ``host`` defaults to :meth:`Host.this_machine`. Raises ValueError naming the key for an unknown device /
    rollout / strategy, cuda without a GPU, vllm or sglang on cpu or not installed, FSDP1 on cpu, more GPUs
    per node than a one-node cuda host has, and a non-positive worker count.
    """
    host = host or Host.this_machine()
    v = cfg.engine.verl
    device = str(v.get("device") or "auto")
    if device.startswith("cuda:"):
        device = "cuda"
    if device not in DEVICES:
        raise ValueError(f"engine.verl.device must be one of {DEVICES}, got {device!r}")
    if device == "auto":
        device = "cuda" if host.cuda_devices > 0 else "cpu"
    elif device == "cuda" and host.cuda_devices < 1:
        raise ValueError("engine.verl.device=cuda but torch sees no GPU: use engine.verl.device=cpu (or auto)")
    rollout = v.get("rollout") or ("hf" if device == "cpu" else "vllm")
    if rollout not in ROLLOUTS:
        raise ValueError(f"engine.verl.rollout must be one of {ROLLOUTS}, got {rollout!r}")
    if rollout != "hf":
        if device == "cpu":
            raise ValueError(f"engine.verl.rollout={rollout} needs a GPU; on cpu use engine.verl.rollout=hf")
        if rollout not in host.installed:
            raise ValueError(f"engine.verl.rollout={rollout} but {rollout} is not installed "
                             f"({INSTALL['cuda']} installs vllm); or use engine.verl.rollout=hf")
    strategy = v.get("strategy") or ("fsdp2" if device == "cpu" else "fsdp")
    if strategy not in STRATEGIES:
        raise ValueError(f"engine.verl.strategy must be one of {STRATEGIES}, got {strategy!r}")
    if device == "cpu" and strategy != "fsdp2":
        raise ValueError(f"engine.verl.strategy={strategy} does not run on cpu (FSDP1 refuses CPU parameters, "
                         "Megatron needs GPUs): use engine.verl.strategy=fsdp2")
    n = cfg.trainer.get("n_gpus_per_node")
    n = int(n) if n is not None else (1 if device == "cpu" else host.cuda_devices)
    nnodes = int(cfg.trainer.get("nnodes") or 1)
    if n < 1 or nnodes < 1:
        raise ValueError(f"trainer.n_gpus_per_node ({n}) and trainer.nnodes ({nnodes}) must be >= 1 for engine=verl")
    if device == "cuda" and nnodes == 1 and n > host.cuda_devices:
        raise ValueError(f"trainer.n_gpus_per_node={n} but this machine has {host.cuda_devices} GPU(s): Ray "
                         f"would wait for GPUs that never come; set trainer.n_gpus_per_node<="
                         f"{host.cuda_devices} (or null)")
    if device == "cpu" and nnodes != 1:
        raise ValueError("engine.verl.device=cpu runs on this machine only: trainer.nnodes must be 1")
    workers = v.get("agent_num_workers")
    workers = int(workers) if workers is not None else (1 if device == "cpu" else 8)
    if workers < 1:
        raise ValueError(f"engine.verl.agent_num_workers must be >= 1, got {workers}")
    gc = v.get("gradient_checkpointing")
    gc = bool(gc) if gc is not None else device != "cpu"
    return Placement(device, rollout, strategy, n, nnodes, workers, gc)




def verl_default_config() -> DictConfig:
    """verl's full PPO trainer config, as it ships it (no Hydra run needed)."""
    import verl

    path = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    return OmegaConf.load(path)


def _plain(x: Any) -> Any:
    return OmegaConf.to_container(x, resolve=True) if OmegaConf.is_config(x) else x


def check_ragen_config(cfg: DictConfig, host: Optional[Host] = None) -> Placement:
    """Our config checks (``ragen_turn.config``) plus everything verl's step needs; ValueError naming the key.

    Runs before Ray starts. Besides the shared checks: the placement (:func:`resolve_placement`, on
    ``host``), verl's batching: the kept batch is split evenly into ``ppo_mini_batch_size`` mini-batches, both
    over the data-parallel workers, and each worker's share of a mini-batch into micro-batches of
    ``micro_batch_size_per_gpu`` (verl's ``workers/engine/utils.py`` asserts this mid-step otherwise); and the
    rollout engines: ``rollout_tp`` GPUs each must tile the workers (verl's actor worker asserts this when it
    builds the rollout), ``gpu_memory_utilization`` a fraction.
    """
    validate_config(_without_device(cfg))
    p = resolve_placement(cfg, host)
    # keys only the local engine has: said before the warm start and Ray (not when mapping onto verl's)
    if cfg.critic.level != "none" and cfg.critic.get("shared_backbone", False):
        raise ValueError("critic.shared_backbone=true runs on engine=local only: verl trains a separate critic model")
    if cfg.algorithm.get("bootstrap_truncated", False):
        raise ValueError("algorithm.bootstrap_truncated=true runs on engine=local only: verl's critic returns the "
                         "values "
                         "before each response token and drops the one after the last token, which the bootstrap reads")
    if cfg.critic.level != "none" and cfg.critic.get("head_init", "zero") != "zero":
        raise ValueError(f"critic.head_init={cfg.critic.head_init} runs on engine=local only: verl's critic worker "
                         "starts from a new zero head (set critic.head_init=zero)")
    if cfg.trainer.get("time_budget_s") is not None:
        raise ValueError("trainer.time_budget_s runs on engine=local only: on verl, set trainer.total_training_steps")
    v = cfg.engine.verl
    bm = int(cfg.ppo_mini_batch_size)
    kept = kept_batch_size(cfg) or bm  # a filter of reward-dependent size: each step's kept rows are padded to a
                                       # multiple of lcm(ppo_mini_batch_size, data-parallel size) (RAGEN's copy mode)
    mb = int(cfg.micro_batch_size_per_gpu)
    if kept % bm:
        raise ValueError(f"ppo_mini_batch_size={bm} must divide the rollout batch after filtering ({kept} = "
                         "es_manager.train.env_groups x group_size x rollout_filter_ratio): verl splits it evenly")
    dp = p.world_size // int(v.get("ulysses_sequence_parallel_size", 1) or 1)
    if p.strategy in ("fsdp", "fsdp2"):
        if bm % dp or kept % dp:
            raise ValueError(f"ppo_mini_batch_size={bm} and the kept batch ({kept}) must be multiples of the data "
                             f"parallel size {dp} (trainer.n_gpus_per_node x trainer.nnodes)")
        if (bm // dp) % mb:
            raise ValueError(f"micro_batch_size_per_gpu={mb} must divide each worker's share of a mini-batch "
                             f"(ppo_mini_batch_size / data parallel size = {bm} / {dp} = {bm // dp}): "
                             f"e.g. micro_batch_size_per_gpu={math.gcd(mb, bm // dp)}")
    tp = int(v.rollout_tp)
    if p.rollout == "hf" and tp != 1:
        raise ValueError(f"engine.verl.rollout=hf runs one server per worker: engine.verl.rollout_tp must be 1, "
                         f"got {v.rollout_tp}")
    if tp < 1 or p.world_size % tp:
        raise ValueError(f"engine.verl.rollout_tp={tp} must divide the FSDP workers (trainer.n_gpus_per_node "
                         f"x trainer.nnodes = {p.world_size}): verl runs world_size / rollout_tp rollout "
                         f"engines of rollout_tp GPUs each; e.g. "
                         f"engine.verl.rollout_tp={math.gcd(max(tp, 1), p.world_size)}")
    if tp > p.n_gpus_per_node and tp % p.n_gpus_per_node:
        raise ValueError(f"engine.verl.rollout_tp={tp} spans nodes: it must be a multiple of "
                         f"trainer.n_gpus_per_node ({p.n_gpus_per_node})")
    decode = str(cfg.actor_rollout_ref.rollout.get("decode", "dynamic"))
    if decode != "dynamic" and p.rollout != "hf":
        raise ValueError(f"actor_rollout_ref.rollout.decode={decode} is the local engine's and the hf rollout's "
                         f"cache; engine.verl.rollout={p.rollout} keeps its own (vLLM captures CUDA graphs unless "
                         "told not to): set it to dynamic, or use engine.verl.rollout=hf")
    gmu = float(v.gpu_memory_utilization)
    if p.rollout != "hf" and not 0 < gmu <= 1:
        raise ValueError(f"engine.verl.gpu_memory_utilization={gmu} must be in (0, 1]: the share of each "
                         f"GPU's memory {p.rollout} may take for weights and KV cache")
    pl = cfg.actor_rollout_ref.actor.policy_loss
    from ragen_turn.algos import needs_minibatch_stats

    if needs_minibatch_stats(str(pl.loss_mode), _plain(pl)) and (p.world_size > 1 or mb < bm):
        raise ValueError("actor_rollout_ref.actor.policy_loss.clip_bias_level=batch on engine=verl needs "
                         f"micro_batch_size_per_gpu ({mb}) >= ppo_mini_batch_size ({bm}) on one worker (here "
                         f"{p.world_size}): verl back-propagates each micro-batch before it has seen the next, so "
                         "the mini-batch statistic cannot be gathered first (engine=local does); or use "
                         "clip_bias_level=sample")
    if int(v.prompt_length) < 1:
        raise ValueError("engine.verl.prompt_length must be >= 1")
    return p


def _without_device(cfg: DictConfig) -> DictConfig:
    """validate_config checks ``device`` against this process; verl always trains on its GPUs."""
    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    c.device = "cpu"
    return c


def attn_implementation(device: str, host: Optional[Host] = None) -> str:
    """``flash_attention_2`` on cuda when ``host`` has flash-attn, else ``sdpa`` (see :mod:`.value_model`)."""
    from .value_model import FLASH_ATTENTION, SDPA

    host = host or Host.this_machine()
    return FLASH_ATTENTION if device != "cpu" and "flash_attn" in host.installed else SDPA


def trust_region_optim(actor: Any) -> Dict[str, Any]:
    """``actor.target_kl`` / ``actor.step_scale`` -> verl's optimizer keys: our AdamW (``trust_region.AdamW``) with
    them as arguments; nothing (verl's ``torch.optim.AdamW``) when neither is set."""
    target_kl, scale = actor.get("target_kl"), str(actor.get("step_scale") or "none")
    if target_kl is None and scale == "none":
        return {}
    return {"optimizer_impl": "ragen_turn.engines.verl.trust_region", "optimizer": "AdamW",
            "override_optimizer_config": {"target_kl": None if target_kl is None else float(target_kl),
                                          "step_scale": scale}}


def mixed_precision(dtype: str) -> Dict[str, str]:
    """FSDP's parameter / reduce / buffer dtypes for our ``dtype`` key (verl's default is bf16 parameters)."""
    names = {"float32": "fp32", "bfloat16": "bf16"}
    if dtype not in names:
        raise ValueError(f"dtype must be float32 or bfloat16 for engine=verl, got {dtype!r}")
    return {"param_dtype": names[dtype], "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def worker_env(p: Placement) -> Dict[str, str]:
    """Environment of every Ray worker: our modules in verl's registries, and the platform on cpu."""
    env = {"VERL_USE_EXTERNAL_MODULES": EXTERNAL_MODULES, "TOKENIZERS_PARALLELISM": "true"}
    if p.device == "cpu":
        env["VERL_PLATFORM"] = "cpu"
    return env


def ray_resources(p: Placement, num_cpus: Optional[int] = None) -> Dict[str, Any]:
    """``ray.init`` resources of the local cluster the run starts.

    On cpu, verl's resource pools place each FSDP worker on a ``{GPU: 1, CPU: 3}`` bundle and check
    that the cluster has GPUs, so the cluster gets ``num_gpus`` = workers (logical slots, nothing
    runs on a GPU) and ``num_cpus`` = enough for those bundles plus the task runner, agent-loop,
    reward-loop and load-balancer actors. On cuda, Ray counts the machine's own.
    """
    if p.device != "cpu":
        return {"num_cpus": int(num_cpus) if num_cpus else None}
    need = 3 * p.world_size + p.agent_workers + 6
    return {"num_cpus": int(num_cpus) if num_cpus else max(need, os.cpu_count() or 1), "num_gpus": p.world_size}


def lora_model_keys(ar: DictConfig) -> Dict[str, Any]:
    """The actor's LoRA in verl's keys (``actor_rollout_ref.model.lora_rank / lora_alpha / target_modules``: verl's
    FSDP engine wraps the actor with peft and computes the reference log-probs with the adapter off). The weights
    go to the rollout merged (verl's ``model.lora.merge``: the base plus the adapter, as plain named tensors), which
    every rollout takes (the hf rollout takes no adapters). Rank 0: no keys (full fine-tuning)."""
    m = ar.get("model") or {}
    rank = int(m.get("lora_rank", 0) or 0)
    if rank <= 0:
        return {}
    alpha = float(m.get("lora_alpha", 16))
    target = m.get("target_modules", "all-linear")
    return {"lora_rank": rank, "lora_alpha": int(alpha) if alpha.is_integer() else alpha,
            "target_modules": target if isinstance(target, str) else list(target), "lora": {"merge": True}}


def verl_policy_loss_knobs(cfg: DictConfig) -> Dict[str, Any]:
    """Our losses' knobs for verl's ``actor.policy_loss`` (``register.RagenPolicyLossConfig`` takes them): every
    knob of the schema's ``PolicyLossConfig``, as the local engine's loss reads them (``policy_loss_config``:
    ``loss_scale_factor``'s null is max_turn x response_length there)."""
    loss = policy_loss_config(cfg)
    return {k: loss.get(k) for k in policy_loss_knobs()}


def model_section(cfg: DictConfig, p: Placement, path: str, attn: str) -> Dict[str, Any]:
    """``actor_rollout_ref.model`` (LoRA keys aside) and the critic's ``model``: the checkpoint and how to load it."""
    return {
        "path": path,
        "external_lib": "ragen_turn.engines.verl.register",
        "enable_gradient_checkpointing": p.gradient_checkpointing,
        # verl packs a micro-batch into one row; flash-attn's varlen kernel keeps the sequences apart cheaply,
        # sdpa needs a (tokens x tokens) block mask, quadratic in the whole micro-batch: pad rows instead
        "use_remove_padding": attn == "flash_attention_2",
        "trust_remote_code": bool(cfg.engine.verl.trust_remote_code),
        # verl defaults to flash_attention_2; sdpa unless flash-attn is installed (and on cpu)
        "override_config": {"attn_implementation": attn},
    }


def fsdp_section(cfg: DictConfig, p: Placement) -> Dict[str, Any]:
    """The actor's ``fsdp_config`` and the critic's ``fsdp`` (the reference's: the same, offloaded off the CPU)."""
    v = cfg.engine.verl
    return {"param_offload": bool(v.param_offload), "optimizer_offload": bool(v.optimizer_offload),
            "strategy": p.strategy, "mixed_precision": mixed_precision(cfg.dtype),
            "use_torch_compile": p.device != "cpu"}


def data_section(cfg: DictConfig) -> Dict[str, Any]:
    """``data``: the batch verl trains on (the episodes the rollout filter keeps) and its lengths."""
    kept = kept_batch_size(cfg) or cfg.es_manager.train.env_groups * cfg.es_manager.train.group_size
    return {
        "train_batch_size": kept,
        "max_prompt_length": int(cfg.engine.verl.prompt_length),
        # verl's response = every token after the first prompt (all turns and env replies)
        "max_response_length": int(cfg.agent_proxy.max_context_tokens),
        "return_raw_chat": True,
    }


def actor_section(cfg: DictConfig, p: Placement, fsdp: Dict[str, Any]) -> Dict[str, Any]:
    """``actor_rollout_ref.actor``: PPO's batch split, clip ranges, entropy / KL terms, optimizer and our policy
    loss (``policy_loss``: ``register.RagenPolicyLossConfig`` with every knob of the schema's)."""
    a = cfg.actor_rollout_ref.actor
    return {
        "strategy": p.strategy,
        "ppo_mini_batch_size": int(cfg.ppo_mini_batch_size),
        "ppo_micro_batch_size_per_gpu": int(cfg.micro_batch_size_per_gpu),
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
        "ulysses_sequence_parallel_size": int(cfg.engine.verl.ulysses_sequence_parallel_size),
        "optim": {"lr": float(a.optim.lr), "weight_decay": float(a.optim.weight_decay),
                  "betas": list(a.optim.betas), "clip_grad": float(a.grad_clip),
                  "lr_warmup_steps": int(a.optim.get("lr_warmup_steps", -1)),
                  "lr_warmup_steps_ratio": float(a.optim.get("lr_warmup_steps_ratio", 0.0)),
                  **trust_region_optim(a)},
        "policy_loss": {
            "_target_": "ragen_turn.engines.verl.register.RagenPolicyLossConfig",
            "loss_mode": str(a.policy_loss.loss_mode),
            **verl_policy_loss_knobs(cfg),
        },
        "fsdp_config": fsdp,
    }


def ref_section(cfg: DictConfig, p: Placement, fsdp: Dict[str, Any]) -> Dict[str, Any]:
    """``actor_rollout_ref.ref``: the reference policy's log-probs (KL terms)."""
    return {"strategy": p.strategy, "log_prob_micro_batch_size_per_gpu": int(cfg.micro_batch_size_per_gpu),
            "fsdp_config": dict(fsdp, param_offload=p.device != "cpu")}


def rollout_section(cfg: DictConfig, p: Placement) -> Dict[str, Any]:
    """``actor_rollout_ref.rollout``: the sampler (hf / vllm / sglang), its sampling and our agent loop."""
    v, r = cfg.engine.verl, cfg.actor_rollout_ref.rollout
    return {
        "name": p.rollout,
        "n": 1,  # our G rollouts per group are separate samples with one env seed
        "temperature": float(r.temperature),
        "top_p": float(r.top_p),
        "top_k": int(r.get("top_k", -1)),
        "tensor_model_parallel_size": int(v.rollout_tp),
        "gpu_memory_utilization": float(v.gpu_memory_utilization),
        "dtype": str(cfg.dtype),  # sampling in the actor's dtype (verl's default: bf16)
        "log_prob_micro_batch_size_per_gpu": int(cfg.micro_batch_size_per_gpu),
        "calculate_log_probs": True,
        "val_kwargs": {"temperature": float(r.val_temperature), "do_sample": float(r.val_temperature) > 0,
                       "top_p": float(r.top_p) if float(r.val_temperature) > 0 else 1.0},
        "multi_turn": {"enable": True},
        "agent": {"num_workers": p.agent_workers, "default_agent_loop": AGENT_LOOP_NAME},
        # our hf server's options sit where vLLM's and SGLang's sit (engine_kwargs.vllm / .sglang)
        **({"engine_kwargs": {"hf": {"decode": str(r.get("decode", "dynamic"))}}} if p.rollout == "hf" else {}),
    }


def critic_section(cfg: DictConfig, p: Placement, model: Dict[str, Any], fsdp: Dict[str, Any]) -> Dict[str, Any]:
    """``critic``: on when the estimator has one (``critic.level``), its PPO split, value clip and optimizer."""
    c = cfg.critic
    return {
        "enable": c.level != "none",
        "strategy": p.strategy,
        "ppo_mini_batch_size": int(cfg.ppo_mini_batch_size),
        "ppo_micro_batch_size_per_gpu": int(cfg.micro_batch_size_per_gpu),
        "ppo_epochs": int(c.ppo_epochs),
        "cliprange_value": verl_cliprange_value(c.cliprange_value),
        "grad_clip": float(c.grad_clip),
        "loss_agg_mode": "token-mean",
        "optim": {"lr": float(c.optim.lr), "weight_decay": float(c.optim.weight_decay),
                  "clip_grad": float(c.grad_clip),
                  "lr_warmup_steps": int(c.optim.get("lr_warmup_steps", -1)),
                  "lr_warmup_steps_ratio": float(c.optim.get("lr_warmup_steps_ratio", 0.0))},
        "model": dict(model),  # no LoRA keys: the critic is fully fine-tuned
        "fsdp": fsdp,
    }


def algorithm_section(cfg: DictConfig) -> Dict[str, Any]:
    """``algorithm``: the advantage estimator (ours by name, registered in verl) and the in-reward KL."""
    al = cfg.algorithm
    return {
        "adv_estimator": str(al.adv_estimator),
        "gamma": float(al.gamma),
        "lam": float(al.lam),
        "norm_adv_by_std_in_grpo": bool(al.norm_adv_by_std_in_grpo),
        # the in-reward KL: verl builds the reference worker for it (need_reference_policy); our trainer
        # applies it (engines/advantages.reward_kl_penalty, both engines), not verl's apply_kl_penalty
        "use_kl_in_reward": bool(al.get("use_kl_in_reward", False)),
        "kl_penalty": str(al.get("kl_penalty", "kl")),
        "kl_ctrl": {k: al.kl_ctrl[k] for k in ("type", "kl_coef", "target_kl", "horizon")} if "kl_ctrl" in al else {},
    }


def trainer_section(cfg: DictConfig, p: Placement, out_dir: str) -> Dict[str, Any]:
    """``trainer``: the placement, steps, logging, checkpoints and the run directory."""
    t = cfg.trainer
    return {
        "use_v1": False,
        "n_gpus_per_node": p.n_gpus_per_node,
        "nnodes": p.nnodes,
        "device": p.device,
        "total_training_steps": int(t.total_training_steps),
        "project_name": str(cfg.wandb.project),
        "experiment_name": str(t.experiment_name),
        "logger": ["console", "wandb"] if cfg.logger == "wandb" else ["console"],
        "default_local_dir": out_dir,
        "resume_mode": "auto" if t.resume else "disable",
        "val_before_train": bool(t.val_before_train),
        "save_freq": int(t.save_freq),
        "test_freq": int(t.test_freq),
        # rotation is the driver's (trainer._save_checkpoint: every global_step_* in the run dir, also after a
        # resume); verl's workers only know the paths their own process saved
        "max_actor_ckpt_to_keep": None,
        "max_critic_ckpt_to_keep": None,
        "balance_batch": True,
        "critic_warmup": int(t.critic_warmup),
    }


def to_verl_config(cfg: DictConfig, model_path: Optional[str] = None,
                   host: Optional[Host] = None) -> DictConfig:
    """Map our resolved config onto verl's, one builder per section (above). ``model_path`` defaults to
    ``model.path``; ``engine.verl.overrides`` (raw verl keys) are merged last.

    ``host``: the machine the run is for (default: this one; see :class:`Host`).
    """
    host = host or Host.this_machine()
    p = check_ragen_config(cfg, host)
    v = cfg.engine.verl
    path = str(model_path or cfg.model.get("path") or "")
    if not path:
        raise ValueError("engine=verl needs model.path (a local Hugging Face checkpoint directory; "
                         "`python -m ragen_turn.models export tiny DIR` writes a tiny one)")
    out_dir = str(Path(cfg.trainer.default_local_dir).expanduser().resolve())
    model = model_section(cfg, p, path, attn_implementation(p.device, host))
    fsdp = fsdp_section(cfg, p)
    over = {
        "data": data_section(cfg),
        "actor_rollout_ref": {
            "model": {**model, **lora_model_keys(cfg.actor_rollout_ref)},
            "actor": actor_section(cfg, p, fsdp),
            "ref": ref_section(cfg, p, fsdp),
            "rollout": rollout_section(cfg, p),
        },
        "critic": critic_section(cfg, p, model, fsdp),
        "algorithm": algorithm_section(cfg),
        "trainer": trainer_section(cfg, p, out_dir),
        "reward": {"num_workers": 1 if p.device == "cpu" else 8},  # our agent loop scores episodes itself
        "ray_kwargs": {"ray_init": dict(ray_resources(p, v.get("ray_num_cpus")),
                                        runtime_env={"env_vars": worker_env(p)})},
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
    """Build verl's config objects from ``vcfg`` with verl's own classes and checks (raises what they raise).

    What verl's trainer runs before it starts workers: ``validate_config`` (its batch arithmetic, which builds
    and validates the actor and critic configs) and the dataclasses of the actor, rollout, model, algorithm
    and critic (their ``__post_init__`` checks). Then what the workers build first, where verl's code can run
    without a GPU: the reference config as the actor worker renames it (when a reference model is used), and
    verl's ``RolloutReplica`` set-up of every rollout engine (world size / GPUs per node); plus the actor
    worker's check that the rollout engines tile the workers, which verl asserts only inside the worker.

    Returns the built objects (``actor``, ``rollout``, ``model``, ``algorithm``, ``critic``, ``ref``,
    ``replicas``) for inspection. This loads the model's config and tokenizer from ``model.path`` (local files
    only), as verl does.
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
    if need_reference_policy(vcfg):
        built["ref"] = omega_conf_to_dataclass(reference_section(vcfg))
    built["replicas"] = rollout_replicas(vcfg, built["rollout"], built["model"])
    return built


def reference_section(vcfg: DictConfig) -> DictConfig:
    """``actor_rollout_ref.ref`` as verl's ``ActorRolloutRefWorker.init_model`` hands it to
    ``FSDPActorConfig``: the actor's mini-batch size, the ``log_prob_*`` keys under the ``ppo_*`` names."""
    ref = OmegaConf.create(OmegaConf.to_container(vcfg.actor_rollout_ref.ref, resolve=True))
    with open_dict(ref):
        ref.ppo_mini_batch_size = vcfg.actor_rollout_ref.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    return ref


def rollout_replicas(vcfg: DictConfig, rollout: Any, model: Any) -> list:
    """verl's ``RolloutReplica.__init__`` for each rollout engine the run starts (no server is launched).

    verl's ``LLMServerManager`` starts ``world_size // (tp x dp x pp)`` engines; its actor worker asserts that
    they cover the workers exactly. ValueError naming ``engine.verl.rollout_tp`` when they do not.
    """
    from verl.workers.rollout.replica import RolloutReplica

    class ConfigOnlyReplica(RolloutReplica):
        async def launch_servers(self):
            raise NotImplementedError("a replica built to check its config only")

    world = int(vcfg.trainer.n_gpus_per_node) * int(vcfg.trainer.nnodes)
    per_engine = (rollout.tensor_model_parallel_size * rollout.data_parallel_size
                  * rollout.pipeline_model_parallel_size)
    if per_engine < 1 or world % per_engine:
        raise ValueError(f"a rollout engine spans {per_engine} GPUs (engine.verl.rollout_tp x verl's data "
                         f"and pipeline parallel sizes), which must divide the {world} FSDP workers")
    return [ConfigOnlyReplica(replica_rank=r, config=vcfg.actor_rollout_ref.rollout, model_config=model,
                              gpus_per_node=int(rollout.n_gpus_per_node)) for r in range(world // per_engine)]
