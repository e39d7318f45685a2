"""Grouping runs: one group per experiment (``algo.name`` and every config key the runs differ in, other
than the seed and the run-control keys), its runs the seeds; :func:`mixed_groups` finds a group given by ``--group-by``
whose runs are different experiments."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from ragen_turn.cfg_get import cfg_get
from ragen_turn.report.runs import Run


ALGO_ORDER = ("grpo", "token_ppo", "bi_level_gae", "turn_ppo", "turn_ppo_geo", "turn_is", "s_ppo", "st_ppo",
              "so_ppo", "so_grpo")


# ------------------------------------------------------------------------------------------------ grouping
def _label_value(v: Any) -> str:
    if v is None:
        return "?"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return repr(v)  # 1.0 stays 1.0 (as in the config and the run name)
    return str(v)


def _hashable(v: Any) -> Any:
    """A config value as a group key: lists and mappings (``env.train_tags``, RAGEN's ``trainer.logger``) as their
    JSON text, other values as they are."""
    return json.dumps(v, sort_keys=True, default=str) if isinstance(v, (list, tuple, dict)) else v


def group_runs(runs: Sequence[Run], keys: Sequence[str]) -> List[Tuple[str, List[Run]]]:
    groups: Dict[Tuple[Any, ...], List[Run]] = {}
    for r in runs:
        groups.setdefault(tuple(_hashable(cfg_get(r.config, k)) for k in keys), []).append(r)

    def sort_key(item):
        out = []
        for v in item[0]:
            if isinstance(v, str) and v in ALGO_ORDER:
                out.append((0, ALGO_ORDER.index(v), ""))
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append((1, float(v), ""))
            else:
                out.append((2, 0.0, str(v)))
        return out

    return [(", ".join(_label_value(v) for v in vals), sorted(rs, key=lambda r: (str(cfg_get(r.config, "seed")),
                                                                                 str(r.path))))
            for vals, rs in sorted(groups.items(), key=sort_key)]


# ------------------------------------------------------------------------------------------------ experiments
DEFAULT_GROUP_BY = ("algo.name",)
SEPARATE_BY = ("env.name", "model.name")  # never averaged together: added to the group keys when runs differ in them
# never part of the experiment: the seed (the runs of a group), where / how a run is logged and recorded
# config keys that never tell two experiments apart: the seed; RAGEN's keys as given (their values are mapped onto
# ours); where committed weights are read from (model.pinned_cache, model.cache_dir: the weights themselves are in
# provenance.json's start_weights_sha256); and algo.trainer / algo.critic_level, removed in issue #48 (what they said
# follows from algo.adv_estimator's registry entry; runs before that hold a value, later ones null)
NOT_EXPERIMENT = ("seed", "ragen_keys", "ragen_aliases", "hydra", "model.pinned_cache", "model.cache_dir",
                  "algo.trainer", "algo.critic_level")
BASE_YAML = Path(__file__).resolve().parents[2] / "config" / "base.yaml"


def run_control_keys(base_yaml: Path = BASE_YAML) -> List[str]:
    """The run-control keys: those ``config/base.yaml`` leaves out of the run name
    (``hydra.job.config.override_dirname.exclude_keys``: the step count, the logger, run dirs, resume, time
    budget, checkpointing ...), read from its text (one list for both); ``[]`` when the file is not there."""
    import re

    try:
        text = base_yaml.read_text()
    except OSError:
        return []
    m = re.search(r"exclude_keys:\s*\$\{ragen_quiet_keys:\[(.*?)\]\}", text, re.S)
    return [k.strip() for k in m.group(1).split(",") if k.strip()] if m else []


def _flat(cfg: Any, prefix: str = "") -> Dict[str, Any]:
    if not isinstance(cfg, dict):
        return {prefix[:-1]: cfg}
    out: Dict[str, Any] = {}
    for k, v in cfg.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def _config_groups(base_yaml: Path = BASE_YAML) -> set:
    """The Hydra config groups (``env``, ``algo``, ``model``, ...): the folders beside ``config/base.yaml``."""
    try:
        return {p.name for p in base_yaml.parent.iterdir() if p.is_dir()}
    except OSError:
        return set()


def _controls(control_key: str, key: str) -> bool:
    """Whether run-control key ``control_key`` covers config key ``key``: itself, and the keys under it, except
    for a config group's name (``env`` in the run-name list is the choice ``env=sokoban``, named in the run's name;
    ``env.train_tags`` or ``model.hidden_size`` are the experiment)."""
    return key == control_key or (key.startswith(control_key + ".") and control_key not in _config_groups())


def experiment_differences(runs: Sequence[Run], control: Sequence[str] = ()) -> Dict[str, List[str]]:
    """``{key: its values}`` for each config key whose value differs between ``runs`` (their experiment: the
    config without the seed and the run-control keys ``control``, see :func:`run_control_keys`). A key that
    some run's config lacks (written before the key existed) is not a difference."""
    skip = tuple(NOT_EXPERIMENT) + tuple(control)
    flats = [_flat(r.config) for r in runs if r.config]
    out: Dict[str, List[str]] = {}
    for key in sorted(set().union(*flats)) if flats else []:
        if any(_controls(k, key) for k in skip) or not all(key in f for f in flats):
            continue
        values = sorted({json.dumps(f[key], sort_keys=True, default=str) for f in flats})
        if len(values) > 1:
            out[key] = values
    return out


def mixed_groups(groups: Sequence[Tuple[str, List[Run]]], control: Sequence[str]) -> Dict[str, str]:
    """``{group label: why}`` for the groups whose runs are not one experiment run with several seeds: their
    configs differ beyond the seed and run control, or they were set to train different numbers of steps."""
    out = {}
    for label, runs in groups:
        why = [f"{k}: {', '.join(v)}" for k, v in experiment_differences(runs, control).items()]
        totals = sorted({r.total_steps for r in runs if r.total_steps is not None})
        if len(totals) > 1:
            why.append(f"trainer.total_training_steps: {', '.join(map(str, totals))}")
        if why:
            out[label] = "; ".join(why)
    return out


def group_keys(runs: Sequence[Run], group_by: Sequence[str], experiments: bool = False) -> List[str]:
    """``group_by`` with ``env.name`` / ``model.name`` in front when the runs differ in them (a Sokoban and a
    WebShop ``turn_ppo`` run are two groups, not one average); with ``experiments`` (the default grouping),
    also every other config key the runs of a group differ in (:func:`experiment_differences`): one group per
    experiment, its runs the seeds."""
    keys = list(group_by)
    for k in reversed(SEPARATE_BY):
        if k not in keys and len({str(cfg_get(r.config, k)) for r in runs}) > 1:
            keys.insert(0, k)
    if experiments:
        control = run_control_keys()
        for _, rs in group_runs(runs, keys):
            keys += [k for k in experiment_differences(rs, control) if k not in keys]
    return keys
