"""The run configuration: its checks before any work, and the values derived from it that every engine reads.

:func:`check_resolved` holds the checks the config pipeline (``ragen_turn/compose.py``: ``finalize``) runs
before building anything; :func:`validate_config` (RAGEN's keys mapped, then the same checks) is what both
engines call again on the config they are given. Each bad value raises a ``ValueError`` naming its key. The
keys, their types and their rules are the schema's (``ragen_turn/schema.py``); the checks here are the
ones that read several keys.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any, Dict, List

from omegaconf import DictConfig, OmegaConf

from ragen_turn.algos import ADV_ESTIMATOR_REGISTRY, adv_estimator_spec, bootstrapping_estimators
from ragen_turn.schema import ConfigError, check_schema

LOGGERS = ("console", "wandb")


def critic_level_of(adv_estimator: str) -> str:
    """The critic ``adv_estimator`` reads (``none`` / ``token`` / ``turn``), on its registry entry: the value
    of ``critic.level`` (``${critic_level:${algorithm.adv_estimator}}`` in config/base.yaml). An unknown name
    gives ``none``: the schema reports it (``algorithm.adv_estimator``'s choices) before anything is built."""
    name = str(adv_estimator)
    return adv_estimator_spec(name).critic_level if name in ADV_ESTIMATOR_REGISTRY else "none"


# keys the algo= group no longer has: (the value the estimator implies, what replaced the key)
REMOVED_ALGO_KEYS = {
    "trainer": (lambda spec: "turn" if spec.critic_level == "turn" else "starpo",
                "one trainer runs every algorithm; the turn critic follows from algorithm.adv_estimator's "
                "critic level (turn_gae: turn)"),
    "critic_level": (lambda spec: spec.critic_level,
                     "the critic level is algorithm.adv_estimator's (its registry entry, ragen_turn/algos); "
                     "critic.level follows it"),
}
_noted: set = set()


def kept_group_count(n_groups: int, ratio: float) -> int:
    """How many of ``n_groups`` env groups a top-``ratio`` filter keeps: RAGEN's ``int(ratio x n_groups)`` (a floor:
    0.7 x 8 keeps 5), at least one, at most all."""
    return max(1, min(n_groups, int(ratio * n_groups)))


FILTER_STRATEGIES = ("top_p", "top_k", "top_k_abs", "min_p")
FILTER_METRICS = {"reward_variance": "reward_variance", "reward_std": "reward_variance", "reward": "reward",
                  "reward_sum": "reward_sum"}
_LEGACY_TYPES = {"std": ("largest", "reward_variance"), "mean": ("largest", "reward")}  # our earlier values


@dataclass(frozen=True)
class FilterSpec:
    """RAGEN-2's rollout filter (``actor_rollout_ref.rollout.rollout_filter_*``): which env groups a step trains on.

    ``strategy``: ``top_p`` keeps groups in order of score until their share of the scores' sum reaches ``value``
    (SNR-adaptive filtering on the in-group reward std); ``top_k`` the ``floor(value x groups)`` best (at least 1);
    ``top_k_abs`` the ``value`` best; ``min_p`` those within ``value`` of the best (largest: score >= value x max).
    ``direction``: ``largest`` or ``smallest`` scores first. ``metric``: the group's reward std (``reward_variance``,
    RAGEN's name), mean (``reward``) or sum (``reward_sum``) of episode rewards. ``include_zero=False`` drops groups
    scoring 0 before selecting. ``value >= 1`` with ``top_p`` keeps every group."""

    value: float = 1.0
    strategy: str = "top_k"
    direction: str = "largest"
    metric: str = "reward_variance"
    include_zero: bool = True
    top_p_prob_mode: str = "linear"
    selection_eps: float = 0.01

    @classmethod
    def from_config(cls, rollout: Any) -> "FilterSpec":
        """From ``actor_rollout_ref.rollout`` (a strategy of null is ``top_k``; type std / mean: largest on the
        reward std / mean, the values before RAGEN's names)."""
        get = rollout.get if hasattr(rollout, "get") else lambda k, d=None: getattr(rollout, k, d)
        direction = str(get("rollout_filter_type", "largest"))
        metric = FILTER_METRICS.get(str(get("rollout_filter_metric", "reward_variance")))
        if direction in _LEGACY_TYPES:
            direction, metric = _LEGACY_TYPES[direction]
        return cls(value=float(get("rollout_filter_ratio", 1.0)),
                   strategy=str(get("rollout_filter_strategy") or "top_k"), direction=direction, metric=str(metric),
                   include_zero=bool(get("rollout_filter_include_zero", True)),
                   top_p_prob_mode=str(get("rollout_filter_top_p_prob_mode", "linear")),
                   selection_eps=float(get("rollout_filter_selection_eps", 0.01)))

    @property
    def keeps_all(self) -> bool:
        """Whether every group is kept whatever the rewards (RAGEN skips its filter then)."""
        return self.include_zero and ((self.strategy == "top_p" and self.value >= 1.0)
                                      or (self.strategy == "top_k" and self.value >= 1.0))

    @property
    def fixed_count(self) -> bool:
        """Whether the number of kept groups depends on the group count only (top_k, top_k_abs, with zeros)."""
        return self.keeps_all or (self.include_zero and self.strategy in ("top_k", "top_k_abs"))


def kept_batch_size(cfg: DictConfig) -> int | None:
    """Episodes per step after the rollout filter (what the actor and critic train on); None when the filter's
    count depends on the rewards (top_p below 1, min_p, rollout_filter_include_zero=false)."""
    tr = cfg.es_manager.train
    spec = FilterSpec.from_config(cfg.actor_rollout_ref.rollout)
    if spec.keeps_all:
        return tr.env_groups * tr.group_size
    if not spec.fixed_count:
        return None
    if spec.strategy == "top_k":
        return kept_group_count(tr.env_groups, spec.value) * tr.group_size
    return max(1, min(tr.env_groups, int(spec.value))) * tr.group_size


def model_config(cfg: DictConfig) -> Dict[str, Any]:
    """The ``model`` section as a plain dict (RAGEN's ``model_path`` is ``model.path`` by then: the alias table)."""
    return OmegaConf.to_container(cfg.model, resolve=True)


ACTOR_LOSS_KEYS = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")  # loss keys that live on the actor, as in verl


def policy_loss_config(cfg: DictConfig) -> Dict[str, Any]:
    """The policy loss's config (``ragen_turn.algos.loss_settings`` reads it): ``actor_rollout_ref.actor.policy_loss``
    plus the clip ratios, which sit on the actor as in verl."""
    a = cfg.actor_rollout_ref.actor
    out = OmegaConf.to_container(a.policy_loss, resolve=True)
    out.update({k: a.get(k) for k in ACTOR_LOSS_KEYS if a.get(k) is not None})
    if out.get("loss_scale_factor") is None:  # seq-mean-token-sum-norm's constant: the most tokens a row can sample
        out["loss_scale_factor"] = float(cfg.agent_proxy.max_turn * cfg.actor_rollout_ref.rollout.response_length)
    return out


def _check_policy_loss(cfg: DictConfig) -> None:
    from ragen_turn.algos import loss_settings

    try:
        loss_settings(policy_loss_config(cfg))
    except ValueError as e:  # its message starts with the key's name: give the key's full path
        key = str(e).split()[0]
        where = "actor_rollout_ref.actor." + ("" if key in ACTOR_LOSS_KEYS else "policy_loss.")
        raise ValueError(where + str(e)) from None


def check_missing_and_optional(cfg: DictConfig) -> None:
    """Mandatory values left unset (``???``), and packages an option needs that are not installed, before any
    work."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if "model.path" in missing:
        raise ValueError(f"model.path is required for model={cfg.model.get('name', '?')}: "
                         "model.path=/path/to/a/local/huggingface/checkpoint (nothing is downloaded)")
    if missing:  # the keys a user sets first: paper_data.* before the env configs that copy them
        own = [k for k in missing if not k.startswith("custom_envs.")] or missing
        raise ValueError(f"{', '.join(own)} {'is' if len(own) == 1 else 'are'} required (no default): "
                         + " ".join(f"{k}=..." for k in own))
    if cfg.logger not in LOGGERS:
        raise ValueError(f"logger must be one of {list(LOGGERS)}, got {cfg.logger!r}")
    if cfg.logger == "wandb" and find_spec("wandb") is None:
        raise ValueError("logger=wandb needs the wandb package, which is not installed: bash scripts/install.sh "
                         "installs it (or .venv/bin/pip install wandb)")
    rank = OmegaConf.select(cfg, "actor_rollout_ref.model.lora_rank", default=0)
    if rank and find_spec("peft") is None:
        raise ValueError(f"actor_rollout_ref.model.lora_rank={rank} needs the peft package, which is not installed: "
                         "bash scripts/install.sh installs it (or pip install 'ragen_turn[lora]')")


def validate_config(cfg: DictConfig) -> None:
    """Check a composed config before any work; raise ``ValueError`` (a :class:`ConfigError`) naming each bad key,
    its value and the rule: RAGEN's keys mapped onto ours (:mod:`ragen_turn.ragen_keys`; a key without our meaning
    stops here), then :func:`check_resolved`. The entry points get the same through ``compose.finalize``; the
    engines call this again for programs that build a trainer from a config of their own."""
    from ragen_turn.ragen_keys import apply_ragen_keys

    apply_ragen_keys(cfg)
    check_resolved(cfg)


def check_resolved(cfg: DictConfig) -> None:
    """The checks of a config whose RAGEN keys are mapped: the ``env_module`` modules are imported first, so the
    envs they register are known when ``custom_envs`` is checked; then required keys and optional packages, the
    schema (``ragen_turn/schema.py``: unknown keys, types, each key's range or choices, paths), then what no
    single key can say: keys that must agree, batch sizes that must divide, each env's ``env_config`` against its
    config dataclass, the device against this machine."""
    from ragen_turn.envs import import_env_modules

    import_env_modules(cfg.get("env_module"))
    check_missing_and_optional(cfg)
    typed = check_schema(cfg)
    problems = [p for check in CROSS_CHECKS for p in check(typed)]
    if problems:
        raise ConfigError(problems)


# ------------------------------------------------------------------------------------------------ cross-key checks
# Each takes the config and returns its problems (``key=value: rule`` lines); validate_config runs them all.
def check_removed_algo_keys(cfg: DictConfig) -> List[str]:
    """An old config's ``algo`` keys that are gone (:data:`REMOVED_ALGO_KEYS`): a value that agrees with
    ``algorithm.adv_estimator``'s registry entry is ignored with a one-line note (an old run's config.yaml
    still loads); one that does not is a problem naming what replaced the key."""
    spec = adv_estimator_spec(cfg.algorithm.adv_estimator)
    out = []
    for name, (implied, replaced_by) in REMOVED_ALGO_KEYS.items():
        value = cfg.algo.get(name)
        if value is None:
            continue
        where = f"algo.{name}={value}"
        if str(value) != implied(spec):
            out.append(f"{where}: this key was removed and {replaced_by}; with algorithm.adv_estimator="
                       f"{cfg.algorithm.adv_estimator} it would be {implied(spec)}: delete the key (and pick "
                       f"the algo= whose estimator you want)")
        elif where not in _noted:
            _noted.add(where)
            print(f"[config] note: {where} is ignored (removed: {replaced_by}); delete the key",
                  file=sys.stderr)
    return out


def _algorithm_pieces(cfg: DictConfig) -> List[str]:
    adv, level = cfg.algorithm.adv_estimator, cfg.critic.level
    spec = adv_estimator_spec(adv)  # the schema has checked that adv is registered
    out = check_removed_algo_keys(cfg)
    if level != spec.critic_level:
        out.append(f"critic.level={level}: algorithm.adv_estimator={adv} needs "
                   f"critic.level={spec.critic_level}")
    try:
        _check_policy_loss(cfg)
    except ValueError as e:
        out.append(str(e))
    if cfg.algorithm.bootstrap_truncated and not spec.bootstraps:
        out.append(f"algorithm.bootstrap_truncated=true: needs a critic's GAE (adv_estimator "
                   f"{' or '.join(bootstrapping_estimators())}), got algorithm.adv_estimator={adv}")
    if cfg.critic.shared_backbone and level != "none" and \
            cfg.critic.ppo_epochs != cfg.actor_rollout_ref.actor.ppo_epochs:
        out.append(f"critic.ppo_epochs={cfg.critic.ppo_epochs}: critic.shared_backbone=true trains the critic inside "
                   f"the actor's update, so it must equal actor_rollout_ref.actor.ppo_epochs="
                   f"{cfg.actor_rollout_ref.actor.ppo_epochs}")
    if cfg.trainer.critic_warmup > 1 and (level == "none" or cfg.critic.shared_backbone):
        why = (f"algorithm.adv_estimator={adv} has no critic" if level == "none"
               else "critic.shared_backbone=true trains the critic inside the actor's update")
        out.append(f"trainer.critic_warmup={cfg.trainer.critic_warmup}: warms up a separate critic, and {why}; "
                   f"set it to 0")
    if cfg.engine.name != "local":  # keys that only the local engine reads
        a = cfg.actor_rollout_ref.actor
        for name, value in (("actor_rollout_ref.actor.max_update_kl", a.max_update_kl),):
            if value is not None:
                out.append(f"{name}={value}: engine=local only (set it to null for engine={cfg.engine.name})")
    if cfg.es_manager.train.group_size < spec.min_group_size:
        out.append(f"es_manager.train.group_size={cfg.es_manager.train.group_size}: {adv} needs >= "
                   f"{spec.min_group_size} (its baseline is the group mean)")
    return out


def _batches(cfg: DictConfig) -> List[str]:
    """Both engines: the mini-batch divides the (filtered) rollout batch (verl's split over its GPUs is checked by
    ``engines.verl.check_config`` before Ray starts). A filter whose kept count depends on the rewards (top_p < 1,
    min_p, include_zero=false) leaves a batch of any size: the mini-batch must fit the whole rollout batch."""
    kept = kept_batch_size(cfg)
    mini = cfg.ppo_mini_batch_size
    if kept is None:
        full = cfg.es_manager.train.env_groups * cfg.es_manager.train.group_size
        if mini > full:
            return [f"ppo_mini_batch_size={mini}: must be <= {full} (es_manager.train.env_groups x group_size)"]
        return []
    where = ("the rollout batch after filtering: es_manager.train.env_groups x group_size x "
             "rollout_filter_ratio = " + str(kept))
    if mini > kept:
        return [f"ppo_mini_batch_size={mini}: must be <= {kept} ({where})"]
    if kept % mini:
        return [f"ppo_mini_batch_size={mini}: must divide {kept} ({where}); a smaller last mini-batch would take "
                "a full optimizer step"]
    return []


def _rollout_filter(cfg: DictConfig) -> List[str]:
    """The filter's value means a fraction (top_k, min_p), a share (top_p: >= 1 keeps all) or a count (top_k_abs)."""
    spec = FilterSpec.from_config(cfg.actor_rollout_ref.rollout)
    key = f"actor_rollout_ref.rollout.rollout_filter_ratio={spec.value}"
    if spec.strategy in ("top_k", "min_p") and spec.value > 1:
        return [f"{key}: rollout_filter_strategy={spec.strategy} takes a fraction in (0, 1]"]
    if spec.strategy == "top_k_abs" and spec.value != int(spec.value):
        return [f"{key}: rollout_filter_strategy=top_k_abs takes a whole number of env groups"]
    return []


def _env_splits(cfg: DictConfig) -> List[str]:
    """The tags each split names exist, their group counts add up, and each tag's env_config builds."""
    from ragen_turn.envs import make_env_config
    from ragen_turn.rollout.env_manager import parse_split

    out: List[str] = []
    used: Dict[str, Any] = {}
    for split in ("train", "val"):
        try:
            groups, _, _ = parse_split(cfg.custom_envs, cfg.es_manager[split], split)
        except ValueError as e:
            out.append(str(e))
            continue
        used.update({tag: spec for tag, _, spec in groups})
    for tag, spec in used.items():
        try:
            make_env_config(spec["env_type"], dict(spec.get("env_config") or {}))
        except (ValueError, TypeError, OSError) as e:
            out.append(f"custom_envs.{tag}.env_config: {e}")
    return out


def _tiny_model(cfg: DictConfig) -> List[str]:
    m = cfg.model
    if m.hidden_size is None or m.num_attention_heads is None:
        return []
    out = []
    if m.hidden_size % m.num_attention_heads:
        out.append(f"model.num_attention_heads={m.num_attention_heads}: must divide model.hidden_size={m.hidden_size}")
    if m.num_key_value_heads is not None and m.num_attention_heads % m.num_key_value_heads:
        out.append(f"model.num_key_value_heads={m.num_key_value_heads}: must divide "
                   f"model.num_attention_heads={m.num_attention_heads}")
    return out


def _lora(cfg: DictConfig) -> List[str]:
    """``target_modules``: ``all-linear`` or a non-empty list of module names (verl's and peft's forms)."""
    t = cfg.actor_rollout_ref.model.target_modules
    if isinstance(t, str) or (OmegaConf.is_list(t) and len(t) and all(isinstance(x, str) for x in t)):
        return []
    return [f"actor_rollout_ref.model.target_modules={t}: must be all-linear or a list of module names "
            "([q_proj, v_proj])"]


def _device(cfg: DictConfig) -> List[str]:
    if str(cfg.device).startswith("cuda") and cfg.engine.name == "local":
        import torch

        if not torch.cuda.is_available():
            return [f"device={cfg.device}: CUDA is not available on this machine"]
    return []


def _lengths(cfg: DictConfig) -> List[str]:
    """A response must fit the context with at least one prompt token (the exact check, which needs the
    tokenizer, runs when it loads: ``rollout.context.check_context_fits``); this one runs before anything is
    copied into the cache or the run directory."""
    r, m = cfg.actor_rollout_ref.rollout.response_length, cfg.agent_proxy.max_context_tokens
    if r >= m:
        return [f"actor_rollout_ref.rollout.response_length={r}: must be < agent_proxy.max_context_tokens={m} (a "
                "turn's prompt and its response share the context)"]
    return []


def _run_name(cfg: DictConfig) -> List[str]:
    """``trainer.experiment_name`` names one directory under ``trainer.runs_dir``: no path separator, not ``.`` or
    ``..`` (``../../x`` wrote two levels above the runs). An explicit ``trainer.default_local_dir`` stays free."""
    name = str(cfg.trainer.experiment_name)
    seps = [s for s in ("/", "\\", os.sep, os.altsep) if s and s in name]
    if seps or name in (".", "..") or "\0" in name:
        return [f"trainer.experiment_name={name!r}: must name one directory under trainer.runs_dir (no "
                f"{'path separator ' + repr(seps[0]) if seps else repr(name)}); to write a run elsewhere, set "
                "trainer.default_local_dir=<dir>"]
    return []


CROSS_CHECKS = (_algorithm_pieces, _batches, _rollout_filter, _env_splits, _tiny_model, _lora, _device, _lengths,
                _run_name)


def env_config_lines(cfg: DictConfig) -> List[str]:
    """One log line per env tag this run plays: the env class and the config it is built with (the keys the tag's
    ``env_config`` gives, as the config holds them, and other fields that differ from the class's defaults), so
    a pasted RAGEN ``envs.yaml`` entry can be seen to reach the class, also one registered by ``env_module=``."""
    import dataclasses

    from ragen_turn.envs import REGISTERED_ENV_CONFIGS, get_env_class, make_env_config

    tags: List[str] = []
    for split in ("train", "val"):
        split_tags = OmegaConf.select(cfg, f"es_manager.{split}.env_configs.tags") or []
        tags += [t for t in split_tags if t not in tags]
    out = []
    for tag in tags:
        spec = cfg.custom_envs.get(tag)
        if spec is None:
            continue
        given = OmegaConf.to_container(spec.get("env_config") or {}, resolve=True)
        try:
            made = make_env_config(spec.env_type, given)
            default = REGISTERED_ENV_CONFIGS[spec.env_type]()
        except Exception:  # the checks before this report a config that does not build
            continue
        if dataclasses.is_dataclass(made):  # as the instance holds them; a key its __post_init__ consumed (RAGEN's
            held = vars(made)                 # Sokoban turns dim_x, dim_y into dim_room and deletes them) is marked
            fields = [f.name for f in dataclasses.fields(made) if f.name in held]
            shown_items = [f"{k}={held[k]!r}" if k in held else f"{k}={given[k]!r} (read by its __post_init__)"
                           for k in given]
            shown_items += [f"{k}={held[k]!r}" for k in fields if k not in given
                            and (not hasattr(default, k) or held[k] != getattr(default, k))]
        else:
            shown_items = [f"{k}={v!r}" for k, v in given.items()]
        cls = get_env_class(spec.env_type)
        shown = ", ".join(shown_items) or "its defaults"
        out.append(f"[ragen_turn] env {tag}: {cls.__module__}.{cls.__name__} with "
                   f"{type(made).__name__}({shown})")
    return out
