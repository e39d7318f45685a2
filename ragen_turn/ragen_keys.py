"""RAGEN's config keys, mapped onto ours: the one table (:data:`ALIASES`) and where it is applied.

A RAGEN user types RAGEN's keys (``algorithm.bi_level_gae=True``, ``seed.train=5``,
``trainer.logger=[console,wandb]``, ...). Each key in the table either takes effect with RAGEN's meaning, by
setting our key(s), or stops the run before any work with a message naming our key. It is applied twice:

1. :func:`move_ragen_overrides`, before Hydra composes: a command-line override of a table key is moved under
   ``ragen_keys.`` (many RAGEN keys do not exist in our config, so Hydra would refuse them);
2. :func:`apply_ragen_keys`, on the composed config: every table key given (under ``ragen_keys``, or at its own
   path from a yaml file) is mapped; what was mapped is recorded in ``ragen_aliases`` (``config.yaml`` shows it).

``docs/ragen_keys.md`` lists the table (a test keeps it complete).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

HOLD = "ragen_keys"        # where command-line RAGEN keys wait for apply_ragen_keys
RECORD = "ragen_aliases"   # RAGEN key=value -> what it set


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


def _stop(key: str, msg: str):
    raise ValueError(f"{key}: {msg}")


def _set(our_key: str, fn: Callable[[Any], Any] = lambda v: v):
    return lambda v, given, cfg: {our_key: fn(v)}


def _noop_if(key: str, ok: Callable[[Any], bool], msg: str):
    def apply(v, given, cfg):
        return {} if ok(v) else _stop(f"{key}={v}", msg)
    return apply


# ---------------------------------------------------------------- the handlers that need more than a rename
def _adv_estimator(v, given, cfg):
    if v == "gae":  # RAGEN's PPO: token GAE, or bi-level GAE with algorithm.bi_level_gae=True
        return {"algorithm.adv_estimator": "bi_level_gae" if _bool(given.get("algorithm.bi_level_gae")) else "token_gae"}
    return {"algorithm.adv_estimator": v}


def _bi_level_gae(v, given, cfg):
    if not _bool(v):
        return {}
    adv = given.get("algorithm.adv_estimator")
    if adv not in (None, "gae", "token_gae", "bi_level_gae"):
        _stop(f"algorithm.bi_level_gae={v}", f"RAGEN's bi-level GAE replaces GAE: it needs algorithm.adv_estimator=gae, "
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


_AGG = ("token-mean", "seq-mean-token-mean", "turn-mean")


def _loss_agg(v, given, cfg):
    if v not in _AGG:
        _stop(f"loss_agg_mode={v}", f"our key actor_rollout_ref.actor.policy_loss.loss_agg_mode takes {list(_AGG)}")
    return {"actor_rollout_ref.actor.policy_loss.loss_agg_mode": v}


_KL = {"kl": "kl", "k1": "kl", "abs": "abs", "mse": "mse", "k2": "mse", "low_var_kl": "low_var_kl",
       "low-var-kl": "low_var_kl", "k3": "low_var_kl"}


def _kl_type(v, given, cfg):
    if str(v) not in _KL:
        _stop(f"actor_rollout_ref.actor.kl_loss_type={v}", f"our key actor_rollout_ref.actor.kl_loss_type takes "
              f"kl (k1), abs, mse (k2) or low_var_kl (low-var-kl, k3)")
    return {"actor_rollout_ref.actor.kl_loss_type": _KL[str(v)]}


def _filter_value(v, given, cfg):
    """RAGEN's filter value is our rollout_filter_ratio; with no strategy set, RAGEN's default strategy (top_p)."""
    out = {"actor_rollout_ref.rollout.rollout_filter_ratio": float(v)}
    if OmegaConf.select(cfg, "actor_rollout_ref.rollout.rollout_filter_strategy") is None:
        out["actor_rollout_ref.rollout.rollout_filter_strategy"] = "top_p"
    return out


def _kl_ctrl(key):
    def apply(v, given, cfg):
        coef = float(given.get("algorithm.kl_ctrl.kl_coef", 0.0) or 0.0)
        if coef != 0.0:
            _stop(f"algorithm.kl_ctrl.kl_coef={coef}", "a KL penalty in the reward is not implemented; use the KL "
                  "loss: actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=<coef>")
        if key == "algorithm.kl_ctrl.type" and str(v) not in ("fixed",):
            _stop(f"{key}={v}", "only a fixed (here: zero) in-reward KL; use actor_rollout_ref.actor.kl_loss_coef")
        return {}
    return apply


def _same_as(key: str, ours: str):
    def apply(v, given, cfg):
        if int(v) != int(OmegaConf.select(cfg, ours)):
            _stop(f"{key}={v}", f"the critic trains on the actor's batches: set {ours} (now "
                  f"{OmegaConf.select(cfg, ours)}) instead")
        return {}
    return apply


def _verl_only(key: str, ours: str, cast=float):
    def apply(v, given, cfg):
        if _engine(cfg) != "verl":
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


def _lora(key):
    def apply(v, given, cfg):
        if int(given.get("lora.rank", 0) or 0) != 0:
            _stop(f"lora.rank={given.get('lora.rank')}", "LoRA is not implemented: full fine-tuning only (lora.rank=0)")
        return {}
    return apply


def _collapse_samples(v, given, cfg):
    return {"trainer.collapse_num_samples": None if str(v).lower() == "all" else int(v)}


def _seed_val(v, given, cfg):
    _stop(f"seed.val={v}", "held-out episodes use fixed seeds here (es_manager.val groups get seeds 1e9 + group, "
          "never drawn for training); the run's seed is `seed` (seed.train maps to it)")


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
          "seq-mean-token-sum stops"),
    Alias("actor_rollout_ref.actor.kl_loss_type", "actor_rollout_ref.actor.kl_loss_type (low-var-kl -> low_var_kl, "
          "k1/k2/k3)", _kl_type, "checked before work"),
    Alias("trainer.logger", "logger (console or wandb)", _logger, "other loggers stop"),
    Alias("trainer.project_name", "wandb.project", _set("wandb.project", str)),
    Alias("seed.train", "seed (the run seed; train env seeds are drawn from it)", _set("seed", int), rename="seed"),
    Alias("seed.val", "(stops: held-out seeds are fixed)", _seed_val),
    Alias("agent_proxy.max_context_window", "(full history: -1 only)",
          _noop_if("agent_proxy.max_context_window", lambda v: v is None or int(v) < 0,
                   "every turn sees the whole history here (RAGEN's -1); the context is bounded by "
                   "agent_proxy.max_context_tokens")),
    Alias("agent_proxy.context_window_mode", "(full only)",
          _noop_if("agent_proxy.context_window_mode", lambda v: str(v) == "full",
                   "only RAGEN's full mode (the whole history, bounded by agent_proxy.max_context_tokens)")),
    Alias("actor_rollout_ref.rollout.rollout_filter_value", "actor_rollout_ref.rollout.rollout_filter_ratio (and "
          "rollout_filter_strategy=top_p, RAGEN's default, when none is set)", _filter_value),
    Alias("actor_rollout_ref.rollout_filter_strategy", "actor_rollout_ref.rollout.rollout_filter_strategy (the path "
          "in RAGEN's README)", _set("actor_rollout_ref.rollout.rollout_filter_strategy", str)),
    Alias("actor_rollout_ref.model.path", "model.path", _set("model.path", str)),
    Alias("enable_response_mask", "(true only: the loss is always on the model's own tokens)",
          _noop_if("enable_response_mask", _bool, "the loss is always on the tokens the model sampled "
                   "(response_mask); training on environment tokens is not supported")),
    Alias("algorithm.kl_ctrl.kl_coef", "(0 only; a KL loss: actor_rollout_ref.actor.use_kl_loss / kl_loss_coef)",
          _kl_ctrl("algorithm.kl_ctrl.kl_coef")),
    Alias("algorithm.kl_ctrl.type", "(fixed, with kl_coef 0)", _kl_ctrl("algorithm.kl_ctrl.type")),
    Alias("algorithm.kl_penalty", "(in-reward KL estimator: unused with kl_coef 0)", _kl_ctrl("algorithm.kl_penalty")),
    Alias("critic.ppo_mini_batch_size", "ppo_mini_batch_size (must be equal)",
          _same_as("critic.ppo_mini_batch_size", "ppo_mini_batch_size")),
    Alias("critic.ppo_micro_batch_size_per_gpu", "micro_batch_size_per_gpu (must be equal)",
          _same_as("critic.ppo_micro_batch_size_per_gpu", "micro_batch_size_per_gpu")),
    Alias("actor_rollout_ref.actor.ppo_mini_batch_size", "ppo_mini_batch_size", _set("ppo_mini_batch_size", int)),
    Alias("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "micro_batch_size_per_gpu",
          _set("micro_batch_size_per_gpu", int)),
    Alias("actor_rollout_ref.rollout.gpu_memory_utilization", "engine.verl.gpu_memory_utilization (engine=verl)",
          _verl_only("actor_rollout_ref.rollout.gpu_memory_utilization", "engine.verl.gpu_memory_utilization")),
    Alias("actor_rollout_ref.rollout.tensor_model_parallel_size", "engine.verl.rollout_tp (engine=verl)",
          _verl_only("actor_rollout_ref.rollout.tensor_model_parallel_size", "engine.verl.rollout_tp", int)),
    Alias("actor_rollout_ref.rollout.max_model_len", "agent_proxy.max_context_tokens (an episode ends when its "
          "next turn would not fit; RAGEN drops old turns)", _set("agent_proxy.max_context_tokens", int)),
    Alias("trainer.n_gpus_per_node", "trainer.n_gpus_per_node (engine=verl; 1 on the local engine)", _n_gpus),
    Alias("lora.rank", "(0 only: full fine-tuning)", _lora("lora.rank")),
    Alias("lora.alpha", "(with lora.rank 0: unused)", _lora("lora.alpha")),
    Alias("lora.target_modules", "(with lora.rank 0: unused)", _lora("lora.target_modules")),
    Alias("collapse_detection.compute_freq", "trainer.collapse_freq", _set("trainer.collapse_freq", int)),
    Alias("collapse_detection.num_samples", "trainer.collapse_num_samples (all -> null)", _collapse_samples),
]
BY_KEY: Dict[str, Alias] = {a.key: a for a in ALIASES}


def _override_key(override: str) -> str:
    head = override.split("=", 1)[0]
    return head.lstrip("+~")


def move_ragen_overrides(overrides: List[str]) -> List[str]:
    """Command-line overrides with every RAGEN table key moved under ``ragen_keys.`` (before Hydra composes)."""
    out = []
    for o in overrides:
        key = _override_key(o)
        if "=" in o and key in BY_KEY and not o.startswith("~"):
            value = o.split("=", 1)[1]
            out.append(f"++{HOLD}.{key}={value}")
            if BY_KEY[key].rename:
                out.append(f"{BY_KEY[key].rename}={value}")
        else:
            out.append(o)
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
    keys among them, such as ``algorithm.adv_estimator``, are read there too, so RAGEN's values map)."""
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
        set_ = a.apply(given[a.key], given, cfg) or {}
        changed = any(_select(cfg, k) != v for k, v in set_.items())
        updates.update(set_)
        if a.key in held or changed:
            record[f"{a.key}={given[a.key]}"] = ", ".join(f"{k}={v}" for k, v in set_.items()) or "(no change)"
    with open_dict(cfg):
        for k, v in updates.items():
            OmegaConf.update(cfg, k, v, force_add=True)
        prev = _select(cfg, RECORD) or {}
        cfg[RECORD] = {**prev, **record}
    return record
