"""The typed schema of the whole run config: every key, its type and its rule, one line each.

The dataclasses below are registered in Hydra's ConfigStore as ``ragen_turn_schema``, the first entry of
``config/base.yaml``'s defaults list, so Hydra enforces the types while it composes (``ppo_epochs=abc`` stops
there) and refuses keys the schema lacks (``algorithm.gama=0.9``). :func:`check_schema` runs again on the
composed config, before any work: it merges the config into the schema (catching keys added with ``+``,
which Hydra lets through, and values that interpolations produced), then checks each key's rule. Every
problem names the key, the value and the rule.

Adding a key: one line in the dataclass of its section, ``name: type = key(<rule>)`` (its default stays in
the yaml; ``key()`` with no default means the yaml must set it, ``key(None)`` that it is optional). Rules:
``gt / ge / lt / le`` (numbers; every float must also be finite), ``choices`` (a tuple, or a function that
returns the names, e.g. a registry), ``pattern`` (a regex the string must match), ``exists`` (a path that must
exist when set), ``nonempty``, ``length`` and ``each`` (a rule for every element of a list).
Free-form sections stay open: ``custom_envs.<Tag>.env_config`` (checked against the env's own config
dataclass by ``ragen_turn.config.validate_config``) and ``engine.verl.overrides`` (raw verl keys).
"""
import dataclasses
import difflib
import math
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

SCHEMA_NAME = "ragen_turn_schema"


# ------------------------------------------------------------------------------------------------ rules
@dataclass(frozen=True)
class Rule:
    """What a key's value must satisfy (besides its type). :meth:`broken` says which part a value breaks."""

    gt: Optional[float] = None
    ge: Optional[float] = None
    lt: Optional[float] = None
    le: Optional[float] = None
    choices: Union[Tuple[Any, ...], Callable[[], Iterable[Any]], None] = None
    pattern: Optional[str] = None
    exists: bool = False
    nonempty: bool = False
    length: Optional[int] = None
    each: Optional["Rule"] = None

    def broken(self, v: Any, registries: bool = True) -> Optional[str]:
        """None when ``v`` follows the rule, else the rule it breaks (``must be > 0``). ``registries=False`` skips
        choices given by a function (a registry: reading it imports torch)."""
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if (self.gt is not None and not v > self.gt) or (self.ge is not None and not v >= self.ge) or \
                    (self.lt is not None and not v < self.lt) or (self.le is not None and not v <= self.le):
                return f"must be {self.range_text()}"
        if self.choices is not None and (registries or not callable(self.choices)):
            known = list(self.choices() if callable(self.choices) else self.choices)
            if v not in known:
                return f"must be one of {known}"
        if self.pattern is not None and not re.fullmatch(self.pattern, str(v)):
            return f"must match {self.pattern!r}"
        if self.nonempty and (v is None or len(v) == 0):
            return "must not be empty"
        if self.exists and not os.path.exists(os.path.expanduser(str(v))):
            return "must be an existing path (nothing is downloaded)"
        if self.length is not None and len(v) != self.length:
            return f"must have {self.length} elements, has {len(v)}"
        if self.each is not None:
            for i, x in enumerate(v):
                why = self.each.broken(x)
                if why:
                    return f"element {i} ({x!r}) {why}"
        return None

    def range_text(self) -> str:
        lo = f"[{self.ge}" if self.ge is not None else f"({self.gt}" if self.gt is not None else None
        hi = f"{self.le}]" if self.le is not None else f"{self.lt})" if self.lt is not None else None
        if lo and hi:
            return f"in {lo}, {hi}"
        if lo:
            return f"{'>=' if self.ge is not None else '>'} {lo[1:]}"
        return f"{'<=' if self.le is not None else '<'} {hi[:-1]}"


def key(default: Any = MISSING, **rule: Any) -> Any:
    """A schema field: ``default`` (``MISSING``: the yaml must set it) and its :class:`Rule`."""
    meta = {"rule": Rule(**rule)} if rule else {}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type) -> Any:
    """A nested section (its own dataclass)."""
    return field(default_factory=cls)


UNIT = dict(ge=0.0, le=1.0)
POSITIVE = dict(gt=0)
COUNT = dict(ge=1)
NON_NEGATIVE = dict(ge=0)
# sane maxima: a value past these is a typo (trainer.total_training_steps=99999999999999999999 trained until killed;
# response_length=1000000000 copied the model into the cache before the context check refused it)
STEPS = dict(ge=0, le=10_000_000)
TOKENS = dict(ge=1, le=1_000_000)  # a length in tokens
TURNS = dict(ge=1, le=10_000)  # turns, actions, epochs
EPISODES = dict(ge=1, le=1_000_000)  # env groups, episodes per group


def _adv_estimators() -> List[str]:
    from ragen_turn.algos import ADV_ESTIMATOR_REGISTRY

    return sorted(ADV_ESTIMATOR_REGISTRY)


def _policy_losses() -> List[str]:
    from ragen_turn.algos import POLICY_LOSS_REGISTRY

    return sorted(POLICY_LOSS_REGISTRY)


def _loss_agg_modes() -> List[str]:
    from ragen_turn.algos.losses import TOKEN_AGG_MODES, TURN_AGG_MODES

    return sorted(set(TOKEN_AGG_MODES + TURN_AGG_MODES))


def _turn_bands() -> List[str]:
    from ragen_turn.algos.losses import TURN_BANDS

    return list(TURN_BANDS)


# ------------------------------------------------------------------------------------------------ sections
@dataclass
class WandbConfig:
    project: str = key(nonempty=True)
    mode: str = key(choices=("offline", "online", "disabled"))


@dataclass
class EnvConfigsConfig:
    tags: List[str] = key(nonempty=True)
    n_groups: List[int] = key(each=Rule(ge=0))


@dataclass
class SplitConfig:
    env_groups: int = key(**EPISODES)
    group_size: int = key(**EPISODES)
    env_configs: EnvConfigsConfig = section(EnvConfigsConfig)
    seeds: str = key("heldout", choices=("heldout", "dev"))  # val: heldout, or dev (a second range for tuning)


@dataclass
class EsManagerConfig:
    format_penalty: float = key(le=0)  # a penalty: the reward of a malformed answer
    train: SplitConfig = section(SplitConfig)
    val: SplitConfig = section(SplitConfig)


@dataclass
class RewardNormalizationConfig:
    grouping: str = key(choices=("state", "batch"))
    method: str = key(choices=("identity", "mean_std", "mean"))


@dataclass
class AgentProxyConfig:
    max_turn: int = key(**TURNS)
    action_sep: str = key(nonempty=True)
    max_actions_per_turn: int = key(**TURNS)
    enable_think: bool = key()
    max_context_tokens: int = key(**TOKENS)
    include_env_instruction: bool = key()
    use_turn_scores: bool = key()
    reward_normalization: RewardNormalizationConfig = section(RewardNormalizationConfig)


@dataclass
class RolloutConfig:
    temperature: float = key(**POSITIVE)
    top_p: float = key(gt=0, le=1)
    top_k: int = key(-1, ge=-1)  # top-k sampling (verl's key): -1 or 0 = off
    response_length: int = key(**TOKENS)
    val_temperature: float = key(**NON_NEGATIVE)  # 0 = greedy
    rollout_filter_ratio: float = key(gt=0)  # the filter's value (RAGEN's rollout_filter_value); per strategy below
    rollout_filter_strategy: Optional[str] = key(None, choices=("top_p", "top_k", "top_k_abs", "min_p"))
    rollout_filter_type: str = key("largest", choices=("largest", "smallest", "std", "mean"))
    rollout_filter_metric: str = key("reward_variance", choices=("reward_variance", "reward_std", "reward",
                                                                  "reward_sum"))
    rollout_filter_include_zero: bool = key(True)
    rollout_filter_top_p_prob_mode: str = key("linear", choices=("linear", "softmax"))
    rollout_filter_selection_eps: float = key(0.01, ge=0)
    micro_batch_size: int = key(**NON_NEGATIVE)  # 0 = the whole env batch
    prefix_cache: bool = key()
    decode: str = key("dynamic", choices=("dynamic", "static", "compiled"))  # decode cache: local and verl's hf rollout
    lean_forward: bool = key(True)  # local sampler: its own forward of Qwen2/Llama models (models/lean.py)
    sampler_logprobs: bool = key(False)  # local engine: old log-probs from the sampler's logits (lean_forward only)


@dataclass
class ActorOptimConfig:
    lr: float = key(**POSITIVE)
    weight_decay: float = key(**NON_NEGATIVE)
    betas: List[float] = key(length=2, each=Rule(ge=0, lt=1))
    lr_warmup_steps: int = key(-1, ge=-1)  # verl's keys: linear warm-up over this many training steps;
    lr_warmup_steps_ratio: float = key(0.0, ge=0, le=1)  # <= 0: this ratio x trainer.total_training_steps


@dataclass
class PolicyLossConfig:
    """``actor_rollout_ref.actor.policy_loss``: the policy loss and its knobs, each knob's default here and only here.

    Every other list of the knobs is derived from these fields (:func:`policy_loss_knobs`): verl's
    ``RagenPolicyLossConfig`` (``engines/verl/register.py``) and the ``policy_loss`` section ``to_verl_config``
    writes. ``ragen_turn.algos.loss_settings`` reads each knob (``algos`` imports no config module; its own
    defaults, for a direct call, are checked equal to these by ``tests/test_policy_loss_options.py``).
    """

    loss_mode: str = key(choices=_policy_losses)  # the yaml sets it: ${algo.policy_loss}
    ratio_mode: str = key(choices=("sum", "geo_mean"))  # the yaml sets it: ${algo.ratio_mode}
    loss_agg_mode: Optional[str] = key(None, choices=_loss_agg_modes)  # null = the loss's default (docs/SPEC.md)
    turn_band: str = key("fixed", choices=_turn_bands)  # fixed | sqrt_len: a turn ratio's clip band (SPEC)
    token_band: bool = key(False)  # inside a turn ratio, tokens outside token PPO's band get no gradient (SPEC)
    token_clip_low: float = key(0.2, ge=0, lt=1)  # token_band's band (token PPO's), not the turn's clip range
    token_clip_high: float = key(0.28, **NON_NEGATIVE)
    loss_scale_factor: Optional[float] = key(None, **POSITIVE)  # seq-mean-token-sum-norm's constant (verl's key;
    #                                                             null: max_turn x response_length)
    clip_bias: bool = key(False)  # the clipping-bias correction (the s_ppo and st_ppo losses force it)
    clip_bias_level: str = key("sample", choices=("sample", "batch"))  # batch: one scale from the mini-batch
    clip_bias_stat: str = key("mass", choices=("mass", "rms"))  # mass (SPEC's reading) | rms (SORL's code)
    clip_bias_threshold: Optional[float] = key(None, **POSITIVE)  # scale by 1/r only where r > this; null = the
    #                                                               stat's default (1 for mass, 5 for rms)


def policy_loss_knobs() -> Dict[str, Tuple[Any, Any]]:
    """``name -> (type, default)`` of every :class:`PolicyLossConfig` knob (all its fields but ``loss_mode``,
    which verl's own ``PolicyLossConfig`` has); a default the yaml must set (``ratio_mode``) reads None."""
    return {f.name: (f.type, None if f.default is MISSING else f.default)
            for f in dataclasses.fields(PolicyLossConfig) if f.name != "loss_mode"}


@dataclass
class ActorConfig:
    clip_ratio_low: float = key(**NON_NEGATIVE)
    clip_ratio_high: float = key(**NON_NEGATIVE)
    clip_ratio_c: Optional[float] = key(None)  # dual clip; loss_settings checks it is > 1
    entropy_coeff: float = key(**NON_NEGATIVE)
    use_kl_loss: bool = key()
    kl_loss_coef: float = key(**NON_NEGATIVE)
    kl_loss_type: str = key(choices=("kl", "abs", "mse", "low_var_kl"))
    ppo_epochs: int = key(**TURNS)
    grad_clip: float = key(**NON_NEGATIVE)  # 0 = no clipping
    max_update_kl: Optional[float] = key(None, **POSITIVE)  # null = no update-size guard
    target_kl: Optional[float] = key(None, **POSITIVE)  # null = no early stop (CleanRL's / SB3's target_kl)
    step_scale: str = key("none", choices=("none", "live"))  # live: a mini-batch's step x its live share
    optim: ActorOptimConfig = section(ActorOptimConfig)
    policy_loss: PolicyLossConfig = section(PolicyLossConfig)


@dataclass
class ActorModelConfig:
    """verl's LoRA keys (``actor_rollout_ref.model.*``): rank 0 = full fine-tuning (ragen_turn/models/lora.py)."""

    lora_rank: int = key(0, ge=0)
    lora_alpha: float = key(16.0, gt=0)
    target_modules: Any = key("all-linear")  # all-linear, or a list of module names (q_proj, v_proj, ...)


@dataclass
class ActorRolloutRefConfig:
    rollout: RolloutConfig = section(RolloutConfig)
    actor: ActorConfig = section(ActorConfig)
    model: ActorModelConfig = section(ActorModelConfig)


@dataclass
class CriticOptimConfig:
    lr: float = key(**POSITIVE)
    weight_decay: float = key(**NON_NEGATIVE)
    lr_warmup_steps: int = key(-1, ge=-1)  # as the actor's
    lr_warmup_steps_ratio: float = key(0.0, ge=0, le=1)


@dataclass
class CriticConfig:
    level: str = key(choices=("none", "token", "turn"))  # derived: algorithm.adv_estimator's registry entry
    shared_backbone: bool = key()
    vf_coef: float = key(**NON_NEGATIVE)
    cliprange_value: Optional[float] = key(**POSITIVE)  # null = no value clipping
    head_init: str = key(choices=("zero", "fit"))  # fit: least squares on the first batch (local engine)
    target_norm: bool = key(False)  # the critic fits standardised returns (algos/value_norm.py), both engines
    target_norm_beta: float = key(0.99, ge=0.0, lt=1.0)  # the running stats' weight on the past
    grad_clip: float = key(**NON_NEGATIVE)
    ppo_epochs: int = key(**TURNS)
    optim: CriticOptimConfig = section(CriticOptimConfig)


@dataclass
class KLCtrlConfig:
    """verl's ``algorithm.kl_ctrl``: the in-reward KL coefficient (read with ``algorithm.use_kl_in_reward``)."""

    type: str = key("fixed", choices=("fixed", "adaptive"))
    kl_coef: float = key(0.001, **NON_NEGATIVE)
    target_kl: float = key(0.1, **POSITIVE)  # adaptive only
    horizon: int = key(10000, **COUNT)       # adaptive only


@dataclass
class AlgorithmConfig:
    adv_estimator: str = key(choices=_adv_estimators)
    use_kl_in_reward: bool = key(False)  # verl's: each response token's reward loses beta x its KL to the reference
    kl_penalty: str = key("kl", choices=("kl", "abs", "mse", "low_var_kl"))  # the in-reward KL estimator
    kl_ctrl: KLCtrlConfig = section(KLCtrlConfig)
    gamma: float = key(**UNIT)
    lam: float = key(**UNIT)
    high_level_gamma: float = key(**UNIT)
    bi_level_gae_turn_ends: str = key(choices=("mask", "rewards"))
    bootstrap_truncated: bool = key()
    norm_adv: bool = key()
    norm_adv_by_std_in_grpo: bool = key()


@dataclass
class AlgoConfig:
    """The ``algo=`` group: names the pieces that ``algorithm`` / ``actor`` / ``critic`` read. What each piece
    needs (its critic, ...) is on its registry entry (``ragen_turn/algos/registry.py``), not here."""

    name: str = key(nonempty=True)
    adv_estimator: str = key(choices=_adv_estimators)
    policy_loss: str = key(choices=_policy_losses)
    ratio_mode: str = key(choices=("sum", "geo_mean"))
    gamma: float = key(**UNIT)
    lam: float = key(**UNIT)
    # removed keys, kept only so an old config still composes: config.check_removed_algo_keys accepts a value
    # that agrees with the estimator's registry entry (with a note) and stops on one that does not
    trainer: Optional[str] = key(None)
    critic_level: Optional[str] = key(None)


@dataclass
class EnvGroupConfig:
    """The ``env=`` group: which ``custom_envs`` tags train and validate."""

    name: str = key(nonempty=True)
    train_tags: List[str] = key(nonempty=True)
    train_n_groups: List[int] = key(each=Rule(ge=0))
    val_tags: List[str] = key(nonempty=True)
    val_n_groups: List[int] = key(each=Rule(ge=0))


@dataclass
class CustomEnvConfig:
    env_type: str = key(nonempty=True)
    max_actions_per_traj: Optional[int] = key(None, **COUNT)
    env_instruction: Optional[str] = key(None)
    max_tokens: Optional[int] = key(None, **COUNT)  # RAGEN's prompt length hint: accepted, unused (listed in the log)
    parallel_friendly: Optional[bool] = key(None)  # RAGEN's env worker pool: accepted, unused (listed in the log)
    max_workers: Optional[int] = key(None, **COUNT)  # likewise
    env_config: Optional[Dict[str, Any]] = key({})  # the env's config dataclass checks it (make_env_config); null = {}


@dataclass
class TrainerConfig:
    total_training_steps: int = key(**STEPS)
    experiment_name: str = key(nonempty=True)
    runs_dir: str = key("runs", nonempty=True)  # where runs go ($RAGEN_TURN_RUNS_DIR)
    default_local_dir: str = key(nonempty=True)  # writable: checked before the run (engines/rundir.py)
    save_freq: int = key(**NON_NEGATIVE)
    test_freq: int = key(**NON_NEGATIVE)
    val_before_train: bool = key()
    resume: bool = key()
    resume_from: Optional[str] = key(None, nonempty=True)
    overwrite: bool = key()
    load_unverified: bool = key(False)  # resume from a checkpoint without checksums (engines/checkpoints.py)
    time_budget_s: Optional[float] = key(None, **POSITIVE)
    max_nonfinite_steps: int = key(**COUNT)
    critic_warmup: int = key(0, **NON_NEGATIVE)  # verl's: no actor update while critic_warmup > step (1-based)
    keep_checkpoints: int = key(**NON_NEGATIVE)  # 0 = keep all
    collapse_freq: int = key(**NON_NEGATIVE)  # 0 = never
    collapse_num_samples: Optional[int] = key(None, ge=2)  # null = all
    log_val_generations: int = key(0, **NON_NEGATIVE)  # held-out episodes written as text per eval (verl's key)
    trace_episodes: int = key(8, **NON_NEGATIVE)  # episodes per step (whole groups) in trace.jsonl; 0 = off
    n_gpus_per_node: Optional[int] = key(None, **COUNT)  # engine=verl
    nnodes: Optional[int] = key(None, **COUNT)


@dataclass
class WarmstartConfig:
    enable: Union[bool, str] = key(choices=(True, False, "auto"))
    seed: Optional[int] = key(None, **NON_NEGATIVE)
    episodes: int = key(**COUNT)
    steps: int = key(**NON_NEGATIVE)
    batch_size: int = key(**COUNT)
    micro_batch_size: int = key(0, **NON_NEGATIVE)  # episodes per forward/backward, length-sorted (0 = the batch)
    lr: float = key(**POSITIVE)
    lr_schedule: str = key("constant", choices=("constant", "cosine"))  # after warmup_steps of linear warm-up
    warmup_steps: int = key(0, **NON_NEGATIVE)
    actions_per_turn: List[int] = key(nonempty=True, each=Rule(ge=1))
    # the <think> of demonstrations (agent_proxy.enable_think)
    think: str = key("plan", choices=("plan", "state_plan", "simulate", "state_simulate"))
    fit_turn_budget: bool = key(False)  # each answer gives at least ceil(solution left / turns left) actions
    actions_as_shown: bool = key(False)  # demonstrations write each action as the page shows it (env.as_shown)
    autocast: Optional[str] = key(None, choices=("bfloat16",))  # mixed-precision SFT forward (weights stay as loaded)


@dataclass
class ModelConfig:
    name: str = key(nonempty=True)
    path: Optional[str] = key(exists=True)  # every model yaml sets it (null, or ??? where it must be given)
    cache_dir: Optional[str] = key(None)
    pinned_cache: Optional[str] = key(None)  # committed cache entries copied in first (models.seed_cache)
    dtype: Optional[str] = key(None, choices=("float32", "bfloat16"))
    # the tiny model's architecture (model=tiny)
    arch: Optional[str] = key(None, choices=("qwen2", "llama"))
    hidden_size: Optional[int] = key(None, **COUNT)
    num_hidden_layers: Optional[int] = key(None, **COUNT)
    num_attention_heads: Optional[int] = key(None, **COUNT)
    num_key_value_heads: Optional[int] = key(None, **COUNT)
    intermediate_size: Optional[int] = key(None, **COUNT)
    max_position_embeddings: Optional[int] = key(None, **COUNT)
    tie_word_embeddings: Optional[bool] = key(None)
    seed: Optional[int] = key(None, **NON_NEGATIVE)
    tokenizer_corpus: Optional[str] = key(None, choices=("agents", "search_qa"))  # model=tiny's tokenizer text
    copy_pretrain_steps: Optional[int] = key(None, **NON_NEGATIVE)  # model=tiny: synthetic copy task after init
    copy_pretrain_max_gap: Optional[int] = key(None, **NON_NEGATIVE)  # its longest span-to-repeat distance
    copy_pretrain_small_alphabet: Optional[float] = key(None, ge=0.0, le=1.0)  # its rows drawn from a few tokens
    rl_lr: Optional[float] = key(None, gt=0)  # model=tiny: its RL actor lr (actor_rollout_ref.actor.optim.lr reads it)
    warmstart: WarmstartConfig = section(WarmstartConfig)


@dataclass
class VerlEngineConfig:
    device: str = key("auto")  # auto | cpu | cuda[:N]; checked with the top-level device
    rollout: Optional[str] = key(None, choices=("hf", "vllm", "sglang"))  # null: hf on cpu, vllm on cuda
    strategy: Optional[str] = key(None, choices=("fsdp", "fsdp2", "megatron"))  # null: fsdp2 on cpu, fsdp on cuda
    rollout_tp: int = key(**COUNT)
    gpu_memory_utilization: float = key(gt=0, le=1)
    prompt_length: int = key(**TOKENS)
    agent_num_workers: Optional[int] = key(None, **COUNT)  # null: 1 on cpu, 8 on cuda
    env_threads: int = key(**COUNT)
    gradient_checkpointing: Optional[bool] = key(None)  # null: on for cuda, off on cpu
    param_offload: bool = key()
    optimizer_offload: bool = key()
    ulysses_sequence_parallel_size: int = key(**COUNT)
    trust_remote_code: bool = key()
    ray_num_cpus: Optional[int] = key(None, **COUNT)  # null: enough for verl's placement (cpu), Ray's count (cuda)
    overrides: Dict[str, Any] = key({})  # raw verl keys, merged last (verl checks them)


@dataclass
class EngineConfig:
    name: str = key(choices=("local", "verl"))
    gradient_checkpointing: bool = key(False)  # local engine
    causal_attention: bool = key(True)  # local engine: right-padded rows without a padding mask (models.logprobs)
    last_layer_where_read: bool = key(True)  # local engine: the last layer only where its output is read (last_layer)
    micro_batch_split: str = key("padding", choices=("rows", "padding"))  # local engine: Trajectory.micro_batches
    verl: Optional[VerlEngineConfig] = key(None)


@dataclass
class PaperDataConfig:
    """``+paper=stppo_*``: the user's copies of the paper's data (nothing is downloaded)."""

    corpus_path: str = key(exists=True)
    train_path: str = key(exists=True)
    val_path: str = key(exists=True)


@dataclass
class RunConfig:
    """The root: ``config/base.yaml`` and its groups (model, env, algo, engine, paper, sweep) compose into it."""

    seed: int = key(**NON_NEGATIVE)
    env_module: Any = key(None)  # module name(s) imported before the checks (they register envs)
    ragen_keys: Dict[str, Any] = key({})  # RAGEN's keys from the command line (ragen_turn/ragen_keys.py maps them)
    ragen_aliases: Dict[str, str] = key({})  # what they set
    device: str = key(pattern=r"auto|cpu|cuda(:\d+)?")
    dtype: str = key(choices=("float32", "bfloat16"))
    logger: str = key(choices=("console", "wandb"))
    wandb: WandbConfig = section(WandbConfig)
    model_path: Optional[str] = key(None, exists=True)  # RAGEN's key: same as model.path
    ppo_mini_batch_size: int = key(**COUNT)
    micro_batch_size_per_gpu: int = key(**COUNT)
    ppo_epochs: int = key(**TURNS)
    es_manager: EsManagerConfig = section(EsManagerConfig)
    agent_proxy: AgentProxyConfig = section(AgentProxyConfig)
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig)
    critic: CriticConfig = section(CriticConfig)
    algo: AlgoConfig = section(AlgoConfig)
    algorithm: AlgorithmConfig = section(AlgorithmConfig)
    env: EnvGroupConfig = section(EnvGroupConfig)
    # each tag is checked as a CustomEnvConfig; the node itself stays an open mapping, so a new tag can be added
    # on the command line (OmegaConf cannot add a plain dict to a Dict[str, dataclass] node)
    paper_data: Optional[PaperDataConfig] = key(None)  # +paper=stppo_*
    custom_envs: Dict[str, Any] = field(default_factory=dict, metadata={"each": CustomEnvConfig})
    trainer: TrainerConfig = section(TrainerConfig)
    model: ModelConfig = section(ModelConfig)
    engine: EngineConfig = section(EngineConfig)
    critic_lr_ratio: Optional[float] = key(None, **POSITIVE)  # sweep=critic_lr
    checkpoint: Optional[str] = key(None, exists=True)  # evaluate: the checkpoint / run dir
    eval_output: Optional[str] = key(None)  # evaluate: where the JSON goes


# ------------------------------------------------------------------------------------------------ checks
class ConfigError(ValueError):
    """Bad config values; ``problems`` holds one ``key=value: rule`` line each."""

    def __init__(self, problems: List[str]):
        self.problems = list(problems)
        head = self.problems[0] if len(self.problems) == 1 else \
            f"{len(self.problems)} config problems:\n  " + "\n  ".join(self.problems)
        super().__init__(head)


def register() -> None:
    """Put :class:`RunConfig` in Hydra's ConfigStore (``config/base.yaml`` names it first in its defaults)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=RunConfig)


def _omegaconf_problem(e: OmegaConfBaseException) -> str:
    """One line from an OmegaConf type / key error: the key, the value and what was wrong."""
    full_key = getattr(e, "full_key", None) or "?"
    msg = str(e).split("\n")[0]
    if "not in" in msg and "Key " in msg:
        return _unknown_key(full_key)
    return f"{full_key}: {msg}"


def _schema_at(dotted: str) -> Optional[type]:
    """The dataclass of section ``dotted`` (``actor_rollout_ref.actor``, ``custom_envs.<Tag>``), or None."""
    cls: Any = RunConfig
    parts = [p for p in dotted.split(".") if p]
    i = 0
    while i < len(parts):
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        if parts[i] not in hints:
            return None
        each = _field_each(cls, parts[i])
        cls = _inner(hints[parts[i]])
        if each is not None:
            cls = each
            i += 1
        elif typing.get_origin(cls) in (dict, Dict):  # the next part is a key of the mapping
            cls = _inner(typing.get_args(cls)[1])
            i += 1
        i += 1
    return cls if dataclasses.is_dataclass(cls) else None


def _field_each(cls: Any, name: str) -> Optional[type]:
    """The dataclass every value of mapping field ``name`` is checked against (``metadata['each']``), or None."""
    if not dataclasses.is_dataclass(cls):
        return None
    f = {f.name: f for f in dataclasses.fields(cls)}.get(name)
    return f.metadata.get("each") if f is not None else None


def _inner(tp: Any) -> Any:
    """``Optional[X]`` -> ``X``."""
    if typing.get_origin(tp) is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def did_you_mean(name: str, known: List[str], prefix: str = "") -> str:
    """``"; did you mean <prefix><closest>?"`` for a mistyped ``name`` among ``known`` (``""`` when none is
    close): the one suggestion for keys (``algorithm.gama``) and config choices (``env=sokban``,
    ``algo=turnppo``)."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def _unknown_key(full_key: str) -> str:
    parent, _, name = full_key.rpartition(".")
    node = _schema_at(parent)
    known = sorted(f.name for f in dataclasses.fields(node)) if node is not None else []
    hint = did_you_mean(name, known, (parent + ".") if parent else "")
    return f"{full_key}: unknown key (the schema, ragen_turn/schema.py, has no such key){hint}"


def _walk(node: DictConfig, schema: type, prefix: str, out: List[str], registries: bool) -> None:
    hints = typing.get_type_hints(schema)
    # a key added with + to a typed node: Hydra's force-add lets it through, and a merge keeps it
    out += [_unknown_key(f"{prefix}{k}") for k in node.keys() if k not in hints]
    for f in dataclasses.fields(schema):
        name = f"{prefix}{f.name}"
        if f.name not in node:  # an untyped entry (a custom_envs tag added on the command line): its defaults hold
            if f.default is MISSING and f.default_factory is dataclasses.MISSING:
                out.append(f"{name}: must be set (give it on the command line: {name}=...)")
            continue
        if OmegaConf.is_missing(node, f.name):
            out.append(f"{name}: must be set (it is ??? in the config; give it on the command line: {name}=...)")
            continue
        try:
            v = node[f.name]
        except OmegaConfBaseException as e:
            out.append(_omegaconf_problem(e))
            continue
        if v is None:
            continue
        tp = _inner(hints[f.name])
        if f.metadata.get("each") is not None:
            for k in v:
                _walk(v[k], f.metadata["each"], f"{name}.{k}.", out, registries)
            continue
        if dataclasses.is_dataclass(tp):
            _walk(v, tp, name + ".", out, registries)
            continue
        if typing.get_origin(tp) in (dict, Dict) and dataclasses.is_dataclass(_inner(typing.get_args(tp)[1])):
            for k in v:
                _walk(v[k], _inner(typing.get_args(tp)[1]), f"{name}.{k}.", out, registries)
            continue
        plain = OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig, ListConfig)) else v
        floats = [plain] if tp is float else plain if typing.get_args(tp) == (float,) else []
        if any(not math.isfinite(x) for x in floats):
            out.append(f"{name}={plain!r}: must be a finite number")
            continue
        rule: Optional[Rule] = f.metadata.get("rule")
        why = rule.broken(plain, registries) if rule is not None else None
        if why:
            out.append(f"{name}={plain!r}: {why}")


def check_schema(cfg: Any) -> DictConfig:
    """Check a composed (or plain) config against :class:`RunConfig`: unknown keys, types, missing values and each
    key's rule. Returns the typed config; raises :class:`ConfigError` listing every problem."""
    if OmegaConf.is_config(cfg):  # a merge keeps the schema's default under a ??? value: look first
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise ConfigError([f"{k}: must be set (it is ??? in the config; give it on the command line: {k}=...)"
                               for k in missing])
    try:
        typed = OmegaConf.merge(OmegaConf.structured(RunConfig), cfg)
    except OmegaConfBaseException as e:
        raise ConfigError([_omegaconf_problem(e)]) from None
    for registries in (False, True):  # the registries' names last: most mistakes are reported before torch loads
        problems: List[str] = []
        _walk(typed, RunConfig, "", problems, registries)
        if problems:
            raise ConfigError(problems)
    return typed
