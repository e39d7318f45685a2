"""RAGEN's config keys, mapped onto ours: the one table (:data:`ALIASES`) and where it is applied.

A RAGEN user types RAGEN's keys (``algorithm.bi_level_gae=True``, ``seed.train=5``,
``trainer.logger=[console,wandb]``, ...). Each key in the table has an ``outcome``: honoured (RAGEN's meaning,
done directly: ``system.CUDA_VISIBLE_DEVICES``), aliased (sets our key(s)), unused (accepted; the handler answers
``{UNUSED: why}`` and :func:`unused_lines` lists them once in the run's log) or refused (RAGEN's default accepted,
any other value stops the run before any work with a message naming what to use). It is applied twice:

1. :func:`move_ragen_overrides`, before Hydra composes: a command-line override of a table key is moved under
   ``ragen_keys.`` (many RAGEN keys do not exist in our config, so Hydra would refuse them); any other key the
   schema lacks stops here with our message (:func:`unknown_override_problems`), never Hydra's;
2. :func:`apply_ragen_keys`, on the composed config: every table key given (under ``ragen_keys``, or at its own
   path from a yaml file) is mapped; what was mapped is recorded in ``ragen_aliases`` (``config.yaml`` shows it).

``docs/ragen_keys.md`` lists the table by outcome; ``tests/test_ragen_first_hour.py`` walks RAGEN's whole key list.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

HOLD = "ragen_keys"        # where command-line RAGEN keys wait for apply_ragen_keys
RECORD = "ragen_aliases"   # RAGEN key=value -> what it set
UNUSED = "__unused__"      # a handler's answer for a key accepted without effect here: {UNUSED: why}
UNUSED_TAG = "unused here: "  # how ragen_aliases marks those (the run's log lists them once: unused_lines)
DONE = "__done__"          # a handler's answer for an effect that is no config key: {DONE: what it did}


def _bool(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes")
    return bool(v)


def _engine(cfg: DictConfig) -> str:
    return str(OmegaConf.select(cfg, "engine.name", default="local"))


@dataclass(frozen=True)
class Alias:
    key: str                                            # RAGEN's key
    ours: str                                           # our key(s), for the docs table
    apply: Callable[[Any, Mapping[str, Any], DictConfig], Dict[str, Any]]  # (value, all RAGEN keys given, cfg)
    note: str = ""                                      # meaning / what stops
    rename: Optional[str] = None                        # a plain rename done on the command line already, so that
                                                        # what Hydra derives before our code runs (its run dir) sees it
    outcome: str = "aliased"                            # for the docs: honoured | aliased | unused | refused
    choose: Optional[str] = None                        # a config-group choice (group=name) the key makes on the
                                                        # command line unless that group is given ...
    why: str = ""                                       # ... and what it brings, said in one line (the notes)


def _stop(key: str, msg: str):
    raise ValueError(f"{key}: {msg}")


def _set(our_key: str, fn: Callable[[Any], Any] = lambda v: v):
    return lambda v, given, cfg: {our_key: fn(v)}


def _noop_if(key: str, ok: Callable[[Any], bool], msg: str):
    def apply(v, given, cfg):
        return {} if ok(v) else _stop(f"{key}={v}", msg)
    return apply


# ---------------------------------------------------------------- the handlers that need more than a rename
# the algo= that carries each advantage estimator (with its critic), for the message that names it
ALGO_OF_ADV = {"token_gae": "token_ppo", "bi_level_gae": "bi_level_gae", "grpo": "grpo", "turn_gae": "turn_ppo"}


def _adv_estimator(v, given, cfg):
    """RAGEN's ``gae`` is token-level GAE (bi-level with ``algorithm.bi_level_gae=True``). An estimator whose critic
    the chosen ``algo=`` does not build stops here, naming the algo that does (before the critic checks would)."""
    adv = str(v)
    if adv == "gae":  # RAGEN's PPO: token GAE, or bi-level GAE with algorithm.bi_level_gae=True
        adv = "bi_level_gae" if _bool(given.get("algorithm.bi_level_gae")) else "token_gae"
    algo = OmegaConf.select(cfg, "algo.name", default=None)
    own = OmegaConf.select(cfg, "algo.adv_estimator", default=None)
    want = ALGO_OF_ADV.get(adv)
    if own is not None and want is not None and adv != own and _critic_of(adv) != _critic_of(str(own)):
        others = ", ".join(f"algo={a} ({e})" for e, a in ALGO_OF_ADV.items() if a not in (want, algo))
        _stop(f"algorithm.adv_estimator={v}", f"algo={algo} trains with {own} ({_critic_words(str(own))}); for "
              f"{adv} ({_critic_words(adv)}) use algo={want} (or {others}), e.g. bash train.sh <env> {want}")
    return {"algorithm.adv_estimator": adv}


def _critic_words(adv: str) -> str:
    """``no critic`` / ``a token critic`` / ``a turn critic``: what ``adv``'s registry entry needs."""
    level = _critic_of(adv)
    return "no critic" if level == "none" else f"a {level} critic"


def _critic_of(adv: str) -> str:
    """The critic level on ``adv``'s registry entry (``?`` for a name not registered)."""
    from ragen_turn.algos import ADV_ESTIMATOR_REGISTRY, adv_estimator_spec

    return adv_estimator_spec(adv).critic_level if adv in ADV_ESTIMATOR_REGISTRY else "?"


def _bi_level_gae(v, given, cfg):
    if not _bool(v):
        return {}
    adv = given.get("algorithm.adv_estimator")
    if adv not in (None, "gae", "token_gae", "bi_level_gae"):
        _stop(f"algorithm.bi_level_gae={v}", "RAGEN's bi-level GAE replaces GAE: it needs algorithm.adv_estimator=gae, "
              f"got {adv} (or pick algo=bi_level_gae)")
    return {"algorithm.adv_estimator": "bi_level_gae", "algorithm.bi_level_gae_turn_ends": "rewards"}


def _logger(v, given, cfg):
    names = [str(x) for x in (v if isinstance(v, (list, tuple)) or OmegaConf.is_list(v) else [v])]
    other = sorted(set(names) - {"console", "wandb"})
    if other:
        _stop(f"trainer.logger={names}", f"{other} not supported; our key is logger (console | wandb)")
    return {"logger": "wandb" if "wandb" in names else "console"}


def _val_temperature(v, given, cfg):
    if not _bool(given.get("actor_rollout_ref.rollout.val_kwargs.do_sample", True)):
        return {"actor_rollout_ref.rollout.val_temperature": 0.0}
    return {"actor_rollout_ref.rollout.val_temperature": float(v)}


def _val_do_sample(v, given, cfg):
    return {} if _bool(v) else {"actor_rollout_ref.rollout.val_temperature": 0.0}


def _loss_agg(v, given, cfg):
    """verl's aggregation modes are ours (``algos.losses``: token units, and turn units for turn losses); the policy
    loss's check then says which fit the chosen loss."""
    from ragen_turn.algos.losses import TOKEN_AGG_MODES, TURN_AGG_MODES

    modes = list(dict.fromkeys(TOKEN_AGG_MODES + TURN_AGG_MODES))
    if str(v) not in modes:
        _stop(f"loss_agg_mode={v}", f"our key actor_rollout_ref.actor.policy_loss.loss_agg_mode takes {modes}")
    return {"actor_rollout_ref.actor.policy_loss.loss_agg_mode": str(v)}


_KL = {"kl": "kl", "k1": "kl", "abs": "abs", "mse": "mse", "k2": "mse", "low_var_kl": "low_var_kl",
       "low-var-kl": "low_var_kl", "k3": "low_var_kl"}


def _kl_type(v, given, cfg):
    if str(v) not in _KL:
        _stop(f"actor_rollout_ref.actor.kl_loss_type={v}", "our key actor_rollout_ref.actor.kl_loss_type takes "
              "kl (k1), abs, mse (k2) or low_var_kl (low-var-kl, k3)")
    return {"actor_rollout_ref.actor.kl_loss_type": _KL[str(v)]}


def _filter_value(v, given, cfg):
    """RAGEN's filter value is our rollout_filter_ratio; with no strategy set, RAGEN's default strategy (top_p)."""
    out = {"actor_rollout_ref.rollout.rollout_filter_ratio": float(v)}
    if OmegaConf.select(cfg, "actor_rollout_ref.rollout.rollout_filter_strategy") is None:
        out["actor_rollout_ref.rollout.rollout_filter_strategy"] = "top_p"
    return out


def _kl_in_reward_type(v, given, cfg):
    """verl's in-reward KL estimator names (k1 / k2 / k3, low-var-kl, a "+" suffix: a straight-through gradient,
    the same value in a reward) -> ours; ``full`` (verl 0.9.1 raises NotImplementedError for it) stops."""
    name = str(v)[:-1] if str(v).endswith("+") else str(v)
    if name not in _KL:
        _stop(f"algorithm.kl_penalty={v}", "our key algorithm.kl_penalty takes kl (k1), abs, mse (k2) or low_var_kl "
              "(low-var-kl, k3); verl itself does not implement full")
    return {"algorithm.kl_penalty": _KL[name]}


def _same_as(key: str, ours: str):
    def apply(v, given, cfg):
        if int(v) != int(OmegaConf.select(cfg, ours)):
            _stop(f"{key}={v}", f"the critic trains on the actor's batches: set {ours} (now "
                  f"{OmegaConf.select(cfg, ours)}) instead")
        return {}
    return apply


def _verl_only(key: str, ours: str, cast=float, local_ok: Callable[[Any], bool] = lambda v: True):
    """A vLLM / Ray setting: our ``ours`` on engine=verl; on the local engine unused where ``local_ok``, else
    stopped."""
    def apply(v, given, cfg):
        if _engine(cfg) != "verl":
            if local_ok(v):
                return {UNUSED: f"a vLLM / Ray setting; engine=verl reads it as {ours}"}
            _stop(f"{key}={v}", f"a vLLM setting: our key is {ours}, with engine=verl (the local engine has no vLLM)")
        return {ours: cast(v)}
    return apply


def _n_gpus(v, given, cfg):
    if _engine(cfg) == "verl":
        return {"trainer.n_gpus_per_node": int(v)}
    if int(v) != 1:
        _stop(f"trainer.n_gpus_per_node={v}", "the local engine runs on one device (device=...); several GPUs need "
              "engine=verl, where our key is trainer.n_gpus_per_node")
    return {}


LORA_RANK = "actor_rollout_ref.model.lora_rank"  # ours (verl's name); RAGEN's lora.* keys set the actor's


def _lora_rank_given(given, cfg) -> int:
    """The actor's LoRA rank this command asks for: RAGEN's ``lora.rank`` if given, else ours."""
    v = given.get("lora.rank", OmegaConf.select(cfg, LORA_RANK, default=0))
    return int(v or 0)


def _lora(key: str, ours: str, cast=lambda v: v):
    """RAGEN's ``lora.<x>`` is the actor's ``actor_rollout_ref.model.<ours>``; at rank 0 alpha and target_modules
    change nothing (unused). RAGEN's lora.* also give its critic LoRA: the critic is fully fine-tuned here."""
    def apply(v, given, cfg):
        if key != "lora.rank" and _lora_rank_given(given, cfg) == 0:
            return {UNUSED: "LoRA is off (rank 0): full fine-tuning"}
        return {f"actor_rollout_ref.model.{ours}": cast(v)}
    return apply


def _critic_lora(key):
    def apply(v, given, cfg):
        if key == "critic.model.lora_rank" and int(v or 0) != 0:
            _stop(f"{key}={v}", "the critic is fully fine-tuned here (LoRA is the actor's: "
                  "actor_rollout_ref.model.lora_rank, or RAGEN's lora.rank); leave critic.model.lora_rank at 0")
        return {UNUSED: "the critic is fully fine-tuned (no critic LoRA)"}
    return apply


def _modules(v):
    return OmegaConf.to_container(v) if OmegaConf.is_list(v) else v


def _collapse_samples(v, given, cfg):
    return {"trainer.collapse_num_samples": None if str(v).lower() == "all" else int(v)}




# ---------------------------------------------------------------- keys accepted without effect, or refused
def _unused(why: str, ok: Optional[Callable[[Any], bool]] = None, refuse: str = ""):
    """A key accepted and reported as unused (``why``); where ``ok`` is given, a value it rejects stops the run
    with ``refuse`` (the message naming what to use instead)."""
    def apply(v, given, cfg):
        if ok is not None and not ok(v):
            raise ValueError(refuse.replace("{v}", str(v)))
        return {UNUSED: why}
    return apply


def _falsy(v: Any) -> bool:
    return v is None or not _bool(v) or str(v).lower() in ("none", "null")


def _null(v: Any) -> bool:
    return v is None or str(v).lower() in ("null", "none", "~")


def _refused_unless(key: str, ok: Callable[[Any], bool], why_unused: str, instead: str):
    """Accepted (and unused) at RAGEN's default; any other value stops naming ``instead``."""
    return _unused(why_unused, ok, key + "={v}: " + instead)


def _cuda_visible_devices(v, given, cfg):
    """RAGEN's ``system.CUDA_VISIBLE_DEVICES``: set in this process's environment before torch or Ray looks at the
    GPUs (the command line's value is set by :func:`move_ragen_overrides`, before anything else runs)."""
    from ragen_turn.runtime import set_cuda_visible_devices

    value = ",".join(str(x) for x in v) if isinstance(v, (list, tuple)) else str(v)
    set_cuda_visible_devices(value)
    return {DONE: f"CUDA_VISIBLE_DEVICES={value} (the process's environment)"}


def _keep_ckpts(key: str):
    def apply(v, given, cfg):
        other = [k for k in ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep")
                 if k in given and k != key]
        if other and int(given[other[0]] or 0) != int(v or 0):
            _stop(f"{key}={v}", f"actor and critic checkpoints are kept together here: give {other[0]} the same "
                  "value, or set trainer.keep_checkpoints")
        return {"trainer.keep_checkpoints": 0 if v is None or int(v) < 0 else int(v)}
    return apply


def _resume_mode(v, given, cfg):
    mode = str(v)
    if mode == "disable":
        return {"trainer.resume": False}
    if mode == "auto":
        return {"trainer.resume": True}
    _stop(f"trainer.resume_mode={v}", "a run resumes from its own directory here: trainer.resume=true "
          "trainer.default_local_dir=<run dir> [trainer.resume_from=<step dir name | last_good | latest>]")


def _critic_model_path(v, given, cfg):
    path = given.get("actor_rollout_ref.model.path") or given.get("model_path") or \
        OmegaConf.select(cfg, "model.path", default=None)
    if path is None or str(path) != str(v):
        _stop(f"critic.model.path={v}", f"the critic starts from the actor's model here: set model_path (now {path})")
    return {UNUSED: "the critic starts from model.path"}


def _critic_betas(v, given, cfg):
    betas = [float(x) for x in (v if isinstance(v, (list, tuple)) else OmegaConf.to_container(v))]
    if betas != [0.9, 0.999]:
        _stop(f"critic.optim.betas={betas}", "the critic's AdamW uses RAGEN's (0.9, 0.999); only the actor's betas "
              "are a key here (actor_rollout_ref.actor.optim.betas)")
    return {}


def _top_k_sampling(v, given, cfg):
    """RAGEN's generation config's top_k (its default: verl's ``actor_rollout_ref.rollout.top_k``, ours too)."""
    return {"actor_rollout_ref.rollout.top_k": -1 if _null(v) else int(v)}


def _rollout_n(v, given, cfg):
    """verl's samples per prompt: RAGEN's group size (``es_manager.train.group_size``); 1 (verl's default, which
    RAGEN's files keep) leaves the group size to es_manager."""
    if int(v) == 1:
        return {UNUSED: "verl's one sample per prompt; the rollouts per env group are es_manager.train.group_size"}
    return {"es_manager.train.group_size": int(v)}


def _gradient_checkpointing(v, given, cfg):
    """verl's ``enable_gradient_checkpointing`` (actor or critic model): ours is one switch for both models, per
    engine; an actor and a critic value that differ stop."""
    keys = [k for k in GC_KEYS if k in given]
    if len({_bool(given[k]) for k in keys}) > 1:
        _stop(f"{keys[0]}={given[keys[0]]}", f"{keys[1]}={given[keys[1]]} differs: gradient checkpointing is one "
              "switch for the actor and the critic here (engine.gradient_checkpointing; engine=verl: "
              "engine.verl.gradient_checkpointing)")
    ours = "engine.verl.gradient_checkpointing" if _engine(cfg) == "verl" else "engine.gradient_checkpointing"
    return {ours: _bool(v)}


GC_KEYS = ("actor_rollout_ref.model.enable_gradient_checkpointing", "critic.model.enable_gradient_checkpointing")


def _offload(ours: str):
    """verl's FSDP offload of the actor's / critic's parameters or optimizer: ``engine.verl.<ours>`` on engine=verl
    (one switch for both models); the local engine has no FSDP."""
    def apply(v, given, cfg):
        if _engine(cfg) != "verl":
            return {UNUSED: f"no FSDP on the local engine (engine=verl: engine.verl.{ours})"}
        return {f"engine.verl.{ours}": _bool(v)}
    return apply


def _ray_cpus(v, given, cfg):
    if _engine(cfg) == "verl":
        return {"engine.verl.ray_num_cpus": int(v)}
    return {UNUSED: "no Ray on the local engine (engine=verl: engine.verl.ray_num_cpus)"}


def _rollout_name(v, given, cfg):
    if _engine(cfg) == "verl":
        if str(v) not in ("hf", "vllm", "sglang"):
            _stop(f"actor_rollout_ref.rollout.name={v}", "engine.verl.rollout takes hf, vllm or sglang")
        return {"engine.verl.rollout": str(v)}
    return {UNUSED: "the local engine samples with the training model (engine=verl: engine.verl.rollout)"}


def _validation_steps(v, given, cfg):
    if int(v) != 1:
        _stop(f"trainer.validation_steps={v}", "held-out episodes per evaluation are es_manager.val.env_groups x "
              "es_manager.val.group_size: raise es_manager.val.env_groups instead")
    return {UNUSED: "one pass over es_manager.val"}


def _model_path(v, given, cfg):
    if _null(v):
        return {}
    if OmegaConf.select(cfg, "model.name", default=None) == "tiny":
        _stop(f"model_path={v}", "model=tiny builds its own small model and reads no path: add model=hf (a local "
              "Hugging Face checkpoint, with a real model's lrs and lengths)")
    return {"model.path": str(v)}


VLLM = "a vLLM / memory setting (engine=verl sets its own)"
NOT_HERE = "not implemented here"
MORE: List[Alias] = [
    Alias("system.CUDA_VISIBLE_DEVICES", "the process's CUDA_VISIBLE_DEVICES, set before torch / Ray start",
          _cuda_visible_devices, outcome="honoured"),
    Alias("model_path", "model.path, and model=hf (a real model's defaults) unless model= is given",
          _model_path, "says so in one line", rename="model.path", outcome="aliased", choose="model=hf",
          why="a Hugging Face checkpoint with a real model's defaults (actor lr 1e-6, critic lr 1e-5, RAGEN's "
              "response_length 400 and context 3600 tokens; no warm-start SFT unless model.warmstart.enable=true)"),
    Alias("log_prob_micro_batch_size_per_gpu", "(unused: log-probs use micro_batch_size_per_gpu)",
          _unused("log-probs are computed in micro_batch_size_per_gpu batches"), outcome="unused"),
    Alias("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "(unused)",
          _unused("log-probs are computed in micro_batch_size_per_gpu batches"), outcome="unused"),
    Alias("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "(unused)",
          _unused("log-probs are computed in micro_batch_size_per_gpu batches"), outcome="unused"),
    Alias("grpo_advantage_length_weight", "(false only)",
          _refused_unless("grpo_advantage_length_weight", _falsy, "off", f"{NOT_HERE}; the nearest is the loss's "
                          "aggregation: actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"), outcome="refused"),
    Alias("actor_rollout_ref.actor.grpo_advantage_length_weight", "(false only)",
          _refused_unless("actor_rollout_ref.actor.grpo_advantage_length_weight", _falsy, "off",
                          f"{NOT_HERE}; the nearest is actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"),
          outcome="refused"),
    Alias("critic.model.lora_rank", "(0 only: the critic is fully fine-tuned)", _critic_lora("critic.model.lora_rank"),
          outcome="refused"),
    Alias("critic.model.lora_alpha", "(unused: no critic LoRA)", _critic_lora("x"), outcome="unused"),
    Alias("critic.model.target_modules", "(unused: no critic LoRA)", _critic_lora("x"), outcome="unused"),
    Alias("critic.model.path", "(must equal model_path: the critic starts from the actor's model)",
          _critic_model_path, outcome="unused"),
    Alias("critic.optim.betas", "(RAGEN's [0.9, 0.999] only: the critic's AdamW default)", _critic_betas,
          outcome="honoured"),
    Alias("actor_rollout_ref.actor.use_ref", "(unused: the reference model is built when use_kl_loss or "
          "algorithm.use_kl_in_reward is true)",
          _unused("the reference model is built when actor_rollout_ref.actor.use_kl_loss=true or "
                  "algorithm.use_kl_in_reward=true"), outcome="unused"),
    Alias("actor_rollout_ref.actor.filter_loss_scaling", "(none only)",
          _refused_unless("actor_rollout_ref.actor.filter_loss_scaling", lambda v: str(v).lower() == "none",
                          "no loss scaling by the filter's kept fraction", f"{NOT_HERE}; the loss is the mean over "
                          "the kept groups' tokens (actor_rollout_ref.actor.loss_agg_mode)"), outcome="refused"),
    Alias("actor_rollout_ref.actor.entropy_from_logits_with_chunking", "(unused: a memory setting)",
          _unused("a memory setting of verl's actor"), outcome="unused"),
    Alias("actor_rollout_ref.actor.checkpoint.save_contents", "(unused: checkpoints hold model, optimizer, state)",
          _unused("a checkpoint holds the weights, optimizer and trainer state"), outcome="unused"),
    Alias("critic.checkpoint.save_contents", "(unused)",
          _unused("a checkpoint holds the weights, optimizer and trainer state"), outcome="unused"),
    Alias("actor_rollout_ref.rollout.name", "engine.verl.rollout (engine=verl; unused on the local engine)",
          _rollout_name),
    Alias("actor_rollout_ref.rollout.load_format", "(unused)", _unused(VLLM), outcome="unused"),
    Alias("actor_rollout_ref.rollout.prompt_length", "(unused; engine.verl.prompt_length on engine=verl)",
          _unused("RAGEN's own note: not used"), outcome="unused"),
    Alias("actor_rollout_ref.rollout.max_num_batched_tokens", "(unused)", _unused(VLLM), outcome="unused"),
    Alias("actor_rollout_ref.rollout.enforce_eager", "(unused)", _unused(VLLM), outcome="unused"),
    Alias("actor_rollout_ref.rollout.free_cache_engine", "(unused)", _unused(VLLM), outcome="unused"),
    Alias("actor_rollout_ref.rollout.gradient_analysis_num_buckets", "(unused: no gradient analysis)",
          _unused("read by RAGEN's gradient analysis (trainer.gradient_analysis_mode), not implemented here"),
          outcome="unused"),
    Alias("actor_rollout_ref.rollout.gradient_analysis_bucket_mode", "(unused)",
          _unused("read by RAGEN's gradient analysis (trainer.gradient_analysis_mode), not implemented here"),
          outcome="unused"),
    Alias("actor_rollout_ref.rollout.rollout_filter_empty_stop_steps", "(unused)",
          _unused("RAGEN's early stop after N steps that keep no group is not implemented (such a step makes no "
                  "update, rollout/empty_after_filter)"), outcome="unused"),
    Alias("data.max_prompt_length", "(null only: agent_proxy.max_context_tokens)",
          _refused_unless("data.max_prompt_length", _null, "RAGEN sets it itself", "the context is bounded by "
                          "agent_proxy.max_context_tokens (RAGEN's actor_rollout_ref.rollout.max_model_len)"),
          outcome="refused"),
    Alias("data.max_response_length", "(null only: actor_rollout_ref.rollout.response_length)",
          _refused_unless("data.max_response_length", _null, "RAGEN sets it itself", "a turn's answer is bounded by "
                          "actor_rollout_ref.rollout.response_length"), outcome="refused"),
    Alias("data.train_batch_size", "(null only: es_manager.train.env_groups x group_size)",
          _refused_unless("data.train_batch_size", _null, "RAGEN sets it itself", "the rollout batch is "
                          "es_manager.train.env_groups x es_manager.train.group_size"), outcome="refused"),
    Alias("algorithm.zero_task_advantage", "(false only)",
          _refused_unless("algorithm.zero_task_advantage", _falsy, "off", f"{NOT_HERE} (RAGEN's ablation that drops "
                          "the task's advantage); the entropy / KL terms alone: actor_rollout_ref.actor.entropy_coeff"),
          outcome="refused"),
    Alias("algorithm.soft_advantage_reweight", "(false only)",
          _refused_unless("algorithm.soft_advantage_reweight", _falsy, "off", f"{NOT_HERE}; low-variance groups are "
                          "dropped by the rollout filter: actor_rollout_ref.rollout.rollout_filter_ratio"),
          outcome="refused"),
    Alias("trainer.local_log_dir", "(unused: logs go to trainer.default_local_dir)",
          _unused("logs, metrics and checkpoints go to trainer.default_local_dir (under trainer.runs_dir)"),
          outcome="unused"),
    Alias("trainer.validation_steps", "(1 only: es_manager.val.env_groups)", _validation_steps, outcome="refused"),
    Alias("trainer.generations_to_log_to_wandb.val", "trainer.log_val_generations",
          _set("trainer.log_val_generations", int)),
    Alias("trainer.max_actor_ckpt_to_keep", "trainer.keep_checkpoints", _keep_ckpts("trainer.max_actor_ckpt_to_keep")),
    Alias("trainer.max_critic_ckpt_to_keep", "trainer.keep_checkpoints (equal to the actor's)",
          _keep_ckpts("trainer.max_critic_ckpt_to_keep")),
    Alias("trainer.log_group_rv_table", "(unused)",
          _unused("the per-group reward table is not logged; metrics.jsonl has the filter's numbers"),
          outcome="unused"),
    Alias("trainer.gradient_analysis_mode", "(false only)",
          _refused_unless("trainer.gradient_analysis_mode", _falsy, "off", f"RAGEN's gradient analysis is {NOT_HERE}; "
                          "per-step gradient norms are in metrics.jsonl (actor/grad_norm)"), outcome="refused"),
    Alias("trainer.gradient_analysis_every", "(unused)", _unused("no gradient analysis"), outcome="unused"),
    Alias("trainer.gradient_analysis_env_groups", "(unused)", _unused("no gradient analysis"), outcome="unused"),
    Alias("trainer.gradient_analysis_group_size", "(unused)", _unused("no gradient analysis"), outcome="unused"),
    Alias("trainer.gradient_analysis_log_prefilter", "(unused)", _unused("no gradient analysis"), outcome="unused"),
    Alias("trainer.gradient_analysis_only", "(false only)",
          _refused_unless("trainer.gradient_analysis_only", _falsy, "off", f"RAGEN's gradient analysis is {NOT_HERE}"),
          outcome="refused"),
    Alias("trainer.exit_after_gradient_analysis", "(false only)",
          _refused_unless("trainer.exit_after_gradient_analysis", _falsy, "off",
                          f"RAGEN's gradient analysis is {NOT_HERE}"), outcome="refused"),
    Alias("trainer.resume_mode", "trainer.resume (auto -> true, disable -> false)", _resume_mode),
    Alias("trainer.resume_from_path", "(refused: trainer.resume_from names a step of the run dir)",
          _unused("", lambda v: _null(v), "trainer.resume_from_path={v}: a run resumes from its own directory "
                  "here: trainer.resume=true trainer.default_local_dir=<run dir> "
                  "trainer.resume_from=<step dir name | last_good | latest>"), outcome="refused"),
    Alias("agent_proxy.batch_adjust_mode", "(unused: batch sizes must divide, checked before work)",
          _unused("batch sizes must divide evenly here (checked before any work)"), outcome="unused"),
    Alias("collapse_detection.micro_batch_size", "(unused)", _unused("cross-scoring uses micro_batch_size_per_gpu"),
          outcome="unused"),
    Alias("collapse_detection.first_turn_enabled", "(unused: trainer.collapse_freq=0 turns the measures off)",
          _unused("the collapse measures are first-turn ones; trainer.collapse_freq=0 turns them off"),
          outcome="unused"),
    Alias("collapse_detection.multi_turn_enabled", "(unused)",
          _unused("the collapse measures are first-turn ones; trainer.collapse_freq=0 turns them off"),
          outcome="unused"),
    Alias("ctx_manager.generation.gen_config.response_length", "actor_rollout_ref.rollout.response_length",
          _set("actor_rollout_ref.rollout.response_length", int)),
    Alias("ctx_manager.generation.gen_config.temperature", "actor_rollout_ref.rollout.temperature",
          _set("actor_rollout_ref.rollout.temperature", float)),
    Alias("ctx_manager.generation.gen_config.top_p", "actor_rollout_ref.rollout.top_p",
          _set("actor_rollout_ref.rollout.top_p", float)),
    Alias("ctx_manager.generation.gen_config.top_k", "actor_rollout_ref.rollout.top_k (null -> -1: off)",
          _top_k_sampling),
    Alias("ctx_manager.generation.gen_config.kwargs", "(null only)",
          _refused_unless("ctx_manager.generation.gen_config.kwargs", _null, "no extra sampling arguments",
                          "extra sampling arguments are not passed on; the sampler's keys are "
                          "actor_rollout_ref.rollout.{temperature, top_p, response_length}"), outcome="refused"),
    Alias("ray_kwargs.ray_init.num_cpus", "engine.verl.ray_num_cpus (engine=verl; unused on the local engine)",
          _ray_cpus),
]

ALIASES: List[Alias] = [
    Alias("algorithm.adv_estimator", "algorithm.adv_estimator (gae -> token_gae, or bi_level_gae with "
          "algorithm.bi_level_gae=True)", _adv_estimator),
    Alias("algorithm.bi_level_gae", "algorithm.adv_estimator=bi_level_gae, algorithm.bi_level_gae_turn_ends=rewards",
          _bi_level_gae, "RAGEN's bi-level GAE (turn ends at the tokens with a non-zero reward); needs "
          "algorithm.adv_estimator=gae when that is given, and a token critic (algo=bi_level_gae or token_ppo)"),
    Alias("actor_rollout_ref.rollout.val_kwargs.temperature", "actor_rollout_ref.rollout.val_temperature",
          _val_temperature),
    Alias("actor_rollout_ref.rollout.val_kwargs.do_sample", "actor_rollout_ref.rollout.val_temperature=0 when false",
          _val_do_sample),
    Alias("actor_rollout_ref.actor.loss_agg_mode", "actor_rollout_ref.actor.policy_loss.loss_agg_mode", _loss_agg,
          "verl's modes (token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm) and ours "
          "for turn losses"),
    Alias("actor_rollout_ref.actor.kl_loss_type", "actor_rollout_ref.actor.kl_loss_type (low-var-kl -> low_var_kl, "
          "k1/k2/k3)", _kl_type, "checked before work"),
    Alias("trainer.logger", "logger (console or wandb)", _logger, "other loggers stop"),
    Alias("trainer.project_name", "wandb.project", _set("wandb.project", str)),
    Alias("seed.train", "seed (the run seed; train env seeds are drawn from it)", _set("seed", int), rename="seed"),
    Alias("seed.val", "(unused: held-out seeds are fixed, es_manager.val.seeds)",
          _unused("held-out episodes use fixed seeds here (1e9 + group, never drawn for training; "
                  "es_manager.val.seeds=heldout | dev)"), outcome="unused"),
    Alias("agent_proxy.max_context_window", "(full history: -1 only)",
          _noop_if("agent_proxy.max_context_window", lambda v: v is None or int(v) < 0,
                   "every turn sees the whole history here (RAGEN's -1); the context is bounded by "
                   "agent_proxy.max_context_tokens"), outcome="refused"),
    Alias("agent_proxy.context_window_mode", "(full only)",
          _noop_if("agent_proxy.context_window_mode", lambda v: str(v) == "full",
                   "only RAGEN's full mode (the whole history, bounded by agent_proxy.max_context_tokens)"),
          outcome="refused"),
    Alias("actor_rollout_ref.rollout.rollout_filter_value", "actor_rollout_ref.rollout.rollout_filter_ratio (and "
          "rollout_filter_strategy=top_p, RAGEN's default, when none is set)", _filter_value),
    Alias("actor_rollout_ref.rollout_filter_strategy", "actor_rollout_ref.rollout.rollout_filter_strategy (the path "
          "in RAGEN's README)", _set("actor_rollout_ref.rollout.rollout_filter_strategy", str)),
    Alias("actor_rollout_ref.model.path", "model.path", _set("model.path", str)),
    Alias("enable_response_mask", "(true only: the loss is always on the model's own tokens)",
          _noop_if("enable_response_mask", _bool, "the loss is always on the tokens the model sampled "
                   "(response_mask); training on environment tokens is not supported"), outcome="honoured"),
    Alias("algorithm.kl_penalty", "algorithm.kl_penalty (k1/k2/k3, low-var-kl, a '+' suffix -> ours)",
          _kl_in_reward_type, "full stops (verl does not implement it)"),
    Alias("critic.ppo_mini_batch_size", "ppo_mini_batch_size (must be equal)",
          _same_as("critic.ppo_mini_batch_size", "ppo_mini_batch_size")),
    Alias("critic.ppo_micro_batch_size_per_gpu", "micro_batch_size_per_gpu (must be equal)",
          _same_as("critic.ppo_micro_batch_size_per_gpu", "micro_batch_size_per_gpu")),
    Alias("actor_rollout_ref.actor.ppo_mini_batch_size", "ppo_mini_batch_size", _set("ppo_mini_batch_size", int)),
    Alias("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "micro_batch_size_per_gpu",
          _set("micro_batch_size_per_gpu", int)),
    Alias("actor_rollout_ref.rollout.gpu_memory_utilization", "engine.verl.gpu_memory_utilization (engine=verl)",
          _verl_only("actor_rollout_ref.rollout.gpu_memory_utilization", "engine.verl.gpu_memory_utilization")),
    Alias("actor_rollout_ref.rollout.tensor_model_parallel_size", "engine.verl.rollout_tp (engine=verl; 1 on the "
          "local engine)", _verl_only("actor_rollout_ref.rollout.tensor_model_parallel_size", "engine.verl.rollout_tp",
                                      int, local_ok=lambda v: int(v) == 1)),
    Alias("actor_rollout_ref.rollout.max_model_len", "agent_proxy.max_context_tokens (an episode ends when its "
          "next turn would not fit; RAGEN drops old turns)", _set("agent_proxy.max_context_tokens", int)),
    Alias("trainer.n_gpus_per_node", "trainer.n_gpus_per_node (engine=verl; 1 on the local engine)", _n_gpus),
    Alias("lora.rank", "actor_rollout_ref.model.lora_rank (the actor's; the critic stays fully fine-tuned)",
          _lora("lora.rank", "lora_rank", int)),
    Alias("lora.alpha", "actor_rollout_ref.model.lora_alpha (at rank 0: unused)", _lora("lora.alpha", "lora_alpha",
                                                                                         float), outcome="unused"),
    Alias("lora.target_modules", "actor_rollout_ref.model.target_modules (at rank 0: unused)",
          _lora("lora.target_modules", "target_modules", _modules), outcome="unused"),
    Alias("collapse_detection.compute_freq", "trainer.collapse_freq", _set("trainer.collapse_freq", int)),
    Alias("collapse_detection.num_samples", "trainer.collapse_num_samples (all -> null)", _collapse_samples),
]

# verl keys RAGEN's configs carry (its Sept 2025 base.yaml composes verl's ppo_trainer.yaml) and its run lines pass
VERL_PADDING = "verl's padding-free forward (a speed setting): ours pads and masks, the same log-probs"
VERL_KEYS: List[Alias] = [
    Alias("actor_rollout_ref.actor.micro_batch_size_per_gpu", "micro_batch_size_per_gpu (RAGEN's Sept 2025 "
          "base.yaml)", _set("micro_batch_size_per_gpu", int)),
    Alias("actor_rollout_ref.rollout.n", "es_manager.train.group_size (1, verl's default: unused)", _rollout_n),
    Alias("actor_rollout_ref.rollout.tp_size_check", "(unused: engine.verl.rollout_tp is checked against the GPUs)",
          _unused("RAGEN's check of the vLLM tensor-parallel size; engine.verl.rollout_tp is checked against the "
                  "GPUs before work"), outcome="unused"),
    Alias("actor_rollout_ref.model.enable_gradient_checkpointing", "engine.gradient_checkpointing (engine=verl: "
          "engine.verl.gradient_checkpointing)", _gradient_checkpointing),
    Alias("critic.model.enable_gradient_checkpointing", "the same key as the actor's (one switch for both)",
          _gradient_checkpointing),
    Alias("actor_rollout_ref.model.use_remove_padding", "(unused)", _unused(VERL_PADDING), outcome="unused"),
    Alias("critic.model.use_remove_padding", "(unused)", _unused(VERL_PADDING), outcome="unused"),
    Alias("actor_rollout_ref.actor.fsdp_config.param_offload", "engine.verl.param_offload (engine=verl; unused on "
          "the local engine)", _offload("param_offload")),
    Alias("actor_rollout_ref.actor.fsdp_config.optimizer_offload", "engine.verl.optimizer_offload (engine=verl; "
          "unused on the local engine)", _offload("optimizer_offload")),
    Alias("critic.model.fsdp_config.param_offload", "engine.verl.param_offload (one switch for both models)",
          _offload("param_offload")),
    Alias("critic.model.fsdp_config.optimizer_offload", "engine.verl.optimizer_offload (one switch for both models)",
          _offload("optimizer_offload")),
    Alias("actor_rollout_ref.ref.fsdp_config.param_offload", "(unused: the reference model's placement is ours)",
          _unused("the reference model is offloaded on GPUs and kept on CPU otherwise (engine=verl)"),
          outcome="unused"),
    Alias("trainer.default_hdfs_dir", "(unused: checkpoints go to trainer.default_local_dir)",
          _unused("checkpoints are not copied to HDFS; they go to trainer.default_local_dir"), outcome="unused"),
    Alias("trainer.generations_to_log_to_wandb.train", "(unused: trainer.log_val_generations logs held-out ones)",
          _unused("training generations are not logged (RAGEN's Sept 2025 TODO); held-out ones: "
                  "trainer.log_val_generations"), outcome="unused"),
    Alias("data.shuffle", "(unused: no dataset, env seeds are drawn per step)",
          _unused("there is no prompt dataset: each step draws new env seeds from the run seed"), outcome="unused"),
    Alias("actor_rollout_ref.rollout.val_kwargs.top_k", "(-1 or 0 only: held-out episodes sample without top-k)",
          _refused_unless("actor_rollout_ref.rollout.val_kwargs.top_k", lambda v: _null(v) or int(v) in (-1, 0),
                          "held-out episodes sample without top-k (verl's default)", "held-out episodes sample "
                          "without top-k here; their temperature is actor_rollout_ref.rollout.val_temperature"),
          outcome="refused"),
    Alias("actor_rollout_ref.rollout.val_kwargs.top_p", "(1.0 only: held-out episodes sample without top-p)",
          _refused_unless("actor_rollout_ref.rollout.val_kwargs.top_p", lambda v: float(v) >= 1.0,
                          "held-out episodes sample without top-p (verl's default)", "held-out episodes sample "
                          "without top-p here; their temperature is actor_rollout_ref.rollout.val_temperature"),
          outcome="refused"),
]
ALIASES += MORE + VERL_KEYS
BY_KEY: Dict[str, Alias] = {a.key: a for a in ALIASES}


def _override_key(override: str) -> str:
    head = override.split("=", 1)[0]
    return head.lstrip("+~")


def move_ragen_overrides(overrides: List[str], notes: Optional[List[str]] = None) -> List[str]:
    """Command-line overrides with every RAGEN table key moved under ``ragen_keys.`` (before Hydra composes).

    Also, before anything else runs: ``system.CUDA_VISIBLE_DEVICES`` is exported; a key's ``rename`` is added
    (``seed.train=5`` -> ``seed=5``, ``model_path=<dir>`` -> ``model.path=<dir>``) and its ``choose`` unless that
    config group is given (``model_path`` -> ``model=hf``, a real model's defaults; one line appended to
    ``notes``, the lines the command line prints, says so). A key that neither the table nor the schema knows
    stops here with our message (:func:`unknown_override_problems`), never Hydra's."""
    problems = unknown_override_problems(overrides)
    if problems:
        raise ValueError(problems[0] if len(problems) == 1 else
                         f"{len(problems)} unknown keys:\n  " + "\n  ".join(problems))
    groups_given = {_override_key(o) for o in overrides if "=" in o}
    out = []
    for o in overrides:
        key = _override_key(o)
        if "=" in o and re.fullmatch(r"custom_envs\.[^.]+\..+", key) and not o.startswith(("+", "~")):
            out.append("++" + o)  # RAGEN's scripts set keys our entry may not list, or of a tag the config lacks
            continue             # (add_ragen_env_entries completes it): add or override
        if "=" in o and key in BY_KEY and not o.startswith("~"):
            value = o.split("=", 1)[1]
            out.append(f"++{HOLD}.{key}={value}")
            if BY_KEY[key].rename:
                out.append(f"{BY_KEY[key].rename}={value}")
            if key == "system.CUDA_VISIBLE_DEVICES":  # before anything looks at a GPU (runtime does it)
                from ragen_turn.runtime import set_cuda_visible_devices

                set_cuda_visible_devices(value.strip("'\""))
            choose = BY_KEY[key].choose
            if choose and choose.split("=", 1)[0] not in groups_given:
                out.append(choose)
                _note(notes, f"[ragen_turn] {key}={value}: {choose}, {BY_KEY[key].why}")
        else:
            out.append(o)
    return out


def _note(notes: Optional[List[str]], line: str) -> None:
    if notes is not None:
        notes.append(line)


def algo_for_named_run(overrides: List[str], config_name: Optional[str],
                       notes: Optional[List[str]] = None) -> List[str]:
    """RAGEN's named runs (``--config-name _N_<env>``, ``base-lora``) choose the algorithm with
    ``algorithm.adv_estimator`` (RAGEN's scripts: ``... --config-name _2_sokoban algorithm.adv_estimator=grpo``): with
    no ``algo=`` given, the algo that carries that estimator is added (and a line in ``notes`` says so). Other
    configs keep their algo (a mismatch stops naming the algo to use)."""
    if not config_name or not re.match(r"_\d+_|base-lora$", str(config_name)):
        return overrides
    given = {_override_key(o): o.split("=", 1)[1] for o in overrides if "=" in o}
    if "algo" in given or "algorithm.adv_estimator" not in given:
        return overrides
    adv = given["algorithm.adv_estimator"].strip("'\"")
    if adv == "gae":
        adv = "bi_level_gae" if _bool(given.get("algorithm.bi_level_gae", "false")) else "token_gae"
    algo = ALGO_OF_ADV.get(adv)
    if algo is None:
        return overrides
    _note(notes, f"[ragen_turn] algorithm.adv_estimator={given['algorithm.adv_estimator']}: algo={algo} "
                 f"({config_name} picks the algo from RAGEN's estimator)")
    return [*overrides, f"algo={algo}"]


CONFIG_GROUPS = ("model", "env", "algo", "engine", "paper", "sweep", "setting", "env_model")

# RAGEN's --config-name base (both commits: PPO with GAE on Sokoban; its April 2026 base.yaml is its _2_sokoban) is
# our _2_sokoban on the command line; our own base (turn_ppo) stays the default without --config-name
NAMED_AS = {"base": "_2_sokoban"}
EVAL_LOCAL = "bash eval.sh --config-name _2_sokoban model_path=<a local Hugging Face model dir or a run dir>"
# RAGEN's named configs with no counterpart here -> what to use (docs/ragen_keys.md)
NAMED_REFUSED = {
    "_5_metamathqa": "RAGEN's MetamathQA (single-turn math questions from a dataset) is not an env here; the "
                     "single-turn text env here is Countdown: bash train.sh --config-name _4_countdown (or register "
                     "an env with env_module=, README \"Bring your own env\")",
    "evaluate_api_llm": "RAGEN's evaluation of API models (OpenAI, Together, ...) is not here; eval.sh evaluates a "
                        f"local model on RAGEN's envs: {EVAL_LOCAL}",
    "stream": "RAGEN's one-episode streaming demo is not here; one held-out episode of a local model: "
              f"{EVAL_LOCAL} es_manager.val.env_groups=1 (a training run writes episodes' text with "
              "trainer.log_val_generations=N)",
    "eval": f"RAGEN's eval config: here {EVAL_LOCAL} (the named config's envs, or a run's own)",
    "eval_webshop": "RAGEN's WebShop eval config: here bash eval.sh --config-name _6_webshop model_path=<dir>",
    "webshop_full": "RAGEN's full WebShop catalog is not shipped; the WebShop run here: bash train.sh --config-name "
                    "_6_webshop (env=webshop, its shipped catalog)",
    "webshop_3b_train": "an older RAGEN WebShop config (its train_all.sh names it; its repository has none); the "
                        "WebShop run here: bash train.sh --config-name _6_webshop",
    "_9_search": "RAGEN's search env (a retrieval server) is not here; search QA with a local retriever: "
                 "bash train.sh search_qa <algo> (README \"Environments\")",
}
for _name in ("_7_lean", "_8_sudoku", "_9_2048", "_10_deepcoder", "_10_rubikscube"):
    NAMED_REFUSED[_name] = (f"RAGEN's {_name.split('_', 2)[2]} env is not here; the named runs here are _1_bandit, "
                            "_2_sokoban, _3_frozen_lake, _4_countdown and _6_webshop, or register the env with "
                            "env_module= (README \"Bring your own env\")")


def check_named_config(name: Optional[str]) -> None:
    """A RAGEN named config with no counterpart here (:data:`NAMED_REFUSED`) stops naming what to use."""
    name = None if name is None else str(name).removesuffix(".yaml")
    if name in NAMED_REFUSED:
        raise ValueError(f"--config-name {name}: {NAMED_REFUSED[name]}")


def ragen_config_name(argv: List[str], notes: Optional[List[str]] = None) -> List[str]:
    """``argv`` with RAGEN's ``--config-name base`` (``-cn base``, ``--config-name=base``) as ours
    (:data:`NAMED_AS`: ``_2_sokoban``, RAGEN's PPO with GAE), said in one line appended to ``notes``."""
    out = list(argv)
    for i, a in enumerate(out):
        if a in ("--config-name", "-cn") and i + 1 < len(out) and out[i + 1].removesuffix(".yaml") in NAMED_AS:
            old, out[i + 1] = out[i + 1], NAMED_AS[out[i + 1].removesuffix(".yaml")]
        elif a.startswith("--config-name=") and a.split("=", 1)[1].removesuffix(".yaml") in NAMED_AS:
            old = a.split("=", 1)[1]
            out[i] = "--config-name=" + NAMED_AS[old.removesuffix(".yaml")]
        else:
            continue
        new = NAMED_AS[old.removesuffix(".yaml")]
        _note(notes, f"[ragen_turn] --config-name {old}: RAGEN's base run (PPO with GAE: algo=token_ppo) is "
                     f"--config-name {new} here (our own default, without --config-name, is algo=turn_ppo)")
    return out


def unknown_override_problems(overrides: List[str]) -> List[str]:
    """Our message for each ``key=value`` override whose key the schema (``ragen_turn/schema.py``) lacks, walking the
    typed sections (open mappings such as ``custom_envs`` and ``engine.verl.overrides`` end the walk). Keys added
    with ``+`` and Hydra's own are left to the later checks."""
    import dataclasses
    import typing

    from ragen_turn.schema import RunConfig, _field_each, _inner, _unknown_key

    out = []
    for o in overrides:
        if "=" not in o or o.startswith(("+", "~", "-")):
            continue
        key = _override_key(o)
        if key in BY_KEY or key.split(".")[0].split("/")[0] in ("hydra", HOLD, *CONFIG_GROUPS) and \
                ("/" in key or "." not in key or key.startswith(("hydra", HOLD))):
            continue
        parts, cls = key.split("."), RunConfig
        for i, part in enumerate(parts):
            if not dataclasses.is_dataclass(cls):
                break
            hints = typing.get_type_hints(cls)
            if part not in hints:
                near = [k for k in BY_KEY if k.startswith(".".join(parts[:i + 1]) + ".")]
                if near:  # under a section only RAGEN has
                    out.append(f"{key}: unknown key (RAGEN's keys under {'.'.join(parts[:i + 1])}: "
                               f"{', '.join(sorted(near)[:4])}; docs/ragen_keys.md)")
                    break
                where = _unknown_key(".".join(parts[:i + 1]))
                out.append(f"{key}: {where}" if i < len(parts) - 1 else where)
                break
            if _field_each(cls, part) is not None:
                break
            cls = _inner(hints[part])
    return out


def _select(cfg: DictConfig, key: str) -> Any:
    try:
        v = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    except Exception:  # a path through a value (seed.train when seed is a number)
        return None
    return OmegaConf.to_container(v) if OmegaConf.is_config(v) else v


def apply_ragen_keys(cfg: DictConfig) -> Dict[str, str]:
    """Map every RAGEN key given onto ours (or stop naming our key); record it in ``ragen_aliases``.

    A key counts as given on the command line (under ``ragen_keys``) or at its own path (a yaml file; our own
    keys among them, such as ``algorithm.adv_estimator``, are read there too, so RAGEN's values map). RAGEN's env
    tags the config names but lacks are added first (:func:`add_ragen_env_entries`)."""
    add_ragen_env_entries(cfg)
    given: Dict[str, Any] = {}
    held = set()
    for a in ALIASES:
        v = _select(cfg, f"{HOLD}.{a.key}")
        if v is not None:
            held.add(a.key)
        else:
            v = _select(cfg, a.key)
        if v is not None:
            given[a.key] = v
    updates: Dict[str, Any] = {}
    record: Dict[str, str] = {}
    for a in ALIASES:
        if a.key not in given:
            continue
        set_ = dict(a.apply(given[a.key], given, cfg) or {})
        unused, done = set_.pop(UNUSED, None), set_.pop(DONE, None)
        changed = any(_select(cfg, k) != v for k, v in set_.items())
        updates.update(set_)
        if a.key in held or changed or unused or done:
            what = ", ".join(f"{k}={v}" for k, v in set_.items()) or done or "(no change)"
            record[f"{a.key}={given[a.key]}"] = f"{UNUSED_TAG}{unused}" if unused else what
    with open_dict(cfg):
        for k, v in updates.items():
            OmegaConf.update(cfg, k, v, force_add=True)
        prev = _select(cfg, RECORD) or {}
        cfg[RECORD] = {**prev, **record}
    return record


# ---------------------------------------------------------------- RAGEN's envs.yaml tags
CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"
TAG_GROUPS = ("sokoban", "frozen_lake", "bandit", "countdown")  # env groups holding RAGEN's text tags


def ragen_env_library() -> tuple:
    """(RAGEN's text tags -> our entry, RAGEN's image tags -> the text tag with the same rules): the entries of the
    env groups :data:`TAG_GROUPS` (``config/env/<group>.yaml``) and of ``config/ragen/envs.yaml``."""
    entries: Dict[str, Any] = {}
    for group in TAG_GROUPS:
        entries.update(OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "env" / f"{group}.yaml").custom_envs))
    lib = OmegaConf.load(CONFIG_DIR / "ragen" / "envs.yaml")
    entries.update(OmegaConf.to_container(lib.custom_envs))
    return entries, OmegaConf.to_container(lib.visual_tags)


def add_ragen_env_entries(cfg: DictConfig) -> List[str]:
    """RAGEN's text tags that ``cfg`` names (``es_manager.*.env_configs.tags``, a command-line
    ``custom_envs.<Tag>.<key>``) but whose entry it lacks, or holds only in part (no ``env_type``: the command line's
    keys), completed from :func:`ragen_env_library` in place, the given keys on top; returns the tags added. An
    image tag stops naming the text one."""
    custom = _select(cfg, "custom_envs") or {}
    named = [t for split in ("train", "val") for t in (_select(cfg, f"es_manager.{split}.env_configs.tags") or [])]
    named += list(custom)
    entries, visual = ragen_env_library()
    added = []
    for tag in dict.fromkeys(str(t) for t in named):
        if tag in visual:
            raise ValueError(f"{tag}: RAGEN's image env (render_mode rgb_array); envs here are text: use "
                             f"{visual[tag]}, the same game as text (es_manager.*.env_configs.tags=[{visual[tag]}])")
        if (custom.get(tag) or {}).get("env_type") is not None:
            continue
        if tag not in entries:
            if tag in custom:  # keys of a tag that is nowhere (a command-line custom_envs.<Tag>.<key>)
                known = sorted(set(entries) | {t for t, e in custom.items() if (e or {}).get("env_type")})
                raise ValueError(f"custom_envs.{tag}: no such env tag here ({', '.join(known)}); a new tag needs "
                                 f"its env: custom_envs.{tag}.env_type=<sokoban | bandit | ... | an env_module= env>")
            continue
        with open_dict(cfg):
            given = cfg.custom_envs.get(tag) if tag in custom else {}
            cfg.custom_envs[tag] = OmegaConf.merge(entries[tag], given or {})
        added.append(tag)
    return added


# ---------------------------------------------------------------- what the run's log says once
ENV_ENTRY_UNUSED = {  # keys of RAGEN's envs.yaml entries that mean nothing here -> why
    "max_workers": "envs step in this process (no env worker pool)",
    "parallel_friendly": "envs step in this process (no env worker pool)",
    "max_tokens": "RAGEN writes it into the prompt as a length hint; the answer's limit here is "
                  "actor_rollout_ref.rollout.response_length",
}


RAGEN_ONLY_ENTRY_KEYS = ("max_workers", "parallel_friendly")  # an entry with one of these was pasted from RAGEN


def unused_lines(cfg: DictConfig) -> List[str]:
    """The run log's lines naming every RAGEN key given that has no effect here (at most two lines: the config's
    keys, then the ``custom_envs`` keys of the RAGEN entries (those with ``max_workers`` / ``parallel_friendly``)
    of the tags this run plays)."""
    out = []
    aliases = _select(cfg, RECORD) or {}
    unused = [f"{k} ({v[len(UNUSED_TAG):]})" for k, v in aliases.items() if str(v).startswith(UNUSED_TAG)]
    if unused:
        out.append("[ragen_turn] RAGEN keys accepted but unused here: " + "; ".join(unused))
    tags = []
    for split in ("train", "val"):
        tags += [t for t in (_select(cfg, f"es_manager.{split}.env_configs.tags") or []) if t not in tags]
    entries = _select(cfg, "custom_envs") or {}
    per_key: Dict[str, List[str]] = {}
    for tag in tags:
        entry = entries.get(tag) or {}
        if all(entry.get(k) is None for k in RAGEN_ONLY_ENTRY_KEYS):
            continue  # our own entries carry max_tokens (part of warm-start cache keys): not a RAGEN entry's key
        for k in ENV_ENTRY_UNUSED:
            if entry.get(k) is not None:
                per_key.setdefault(k, []).append(f"{tag}={entry[k]}")
    if per_key:
        out.append("[ragen_turn] custom_envs keys accepted but unused here: " + "; ".join(
            f"{k} [{', '.join(v)}]: {ENV_ENTRY_UNUSED[k]}" for k, v in per_key.items()))
    return out


QUIET = ("system.CUDA_VISIBLE_DEVICES", "trainer.project_name", "trainer.logger", "trainer.local_log_dir",
         "trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep", "trainer.generations_to_log_to_wandb.val",
         "trainer.resume_mode", "trainer.n_gpus_per_node", "ray_kwargs.ray_init.num_cpus",
         "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.gpu_memory_utilization",
         "actor_rollout_ref.rollout.tensor_model_parallel_size")


def quiet_keys(ours: Any) -> List[str]:
    """``${ragen_quiet_keys:[...]}`` (config/base.yaml): the run name's excluded keys plus RAGEN's keys that change
    nothing here (unused ones, and refused ones, whose accepted values are RAGEN's no-op defaults) or only where /
    how the run is logged and placed (:data:`QUIET`), as they are held on the command line (``ragen_keys.<key>``)."""
    base = list(ours)
    return base + [f"{HOLD}.{a.key}" for a in ALIASES if a.outcome in ("unused", "refused") or a.key in QUIET]
