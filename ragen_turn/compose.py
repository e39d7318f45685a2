"""The one config pipeline: from command-line overrides (or a composed config) to the config a run uses.

Every entry point (``train``, ``evaluate``, ``sweeps``, ``engines/verl/check.py``, the tests'
``micro_config``) goes through it, in one order:

1. before Hydra composes (:func:`prepare_cli` for a command line, :func:`compose_with_hydra` in a program):
   the config files parse, RAGEN's keys are moved aside (``ragen_keys.move_ragen_overrides``: a table entry's
   rename and config-group choice, e.g. ``model_path=<dir>`` -> ``model.path=<dir> model=hf``, said in one
   line), the ``env_module=`` modules are imported and the config choices (``env=``, ``algo=``,
   ``--config-name``) checked;
2. Hydra composes (the typed schema, :func:`ragen_turn.schema.register`, is the first default);
3. :func:`finalize`: RAGEN's keys mapped onto ours (``ragen_keys.apply_ragen_keys``) -> interpolations
   resolved (the resolvers below: ``mul``, ``critic_level``, ``run_overrides``, ``ragen_quiet_keys``) -> the
   checks (``config.check_resolved``: ``env_module`` imported, required keys, the schema, cross-key rules).

:func:`compose_config` is 1-3 for an override list, outside a Hydra app.
"""
from __future__ import annotations

import contextvars
import hashlib
import math
import re
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from ragen_turn import schema
from ragen_turn.config import critic_level_of

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "config")
schema.register()  # config/base.yaml's first default: the typed schema, enforced as Hydra composes

# ${mul:a,b}: products in configs (e.g. the critic lr as a multiple of the actor's in sweep=critic_lr)
if not OmegaConf.has_resolver("mul"):
    OmegaConf.register_new_resolver("mul", lambda *xs: math.prod(float(x) for x in xs))

# ${critic_level:<estimator>}: critic.level, the critic the advantage estimator's registry entry names
if not OmegaConf.has_resolver("critic_level"):
    OmegaConf.register_new_resolver("critic_level", lambda adv: critic_level_of(adv))

# the override_dirname of a config composed outside a Hydra app (compose_config), read by ${run_overrides:}
_COMPOSED_OVERRIDES: contextvars.ContextVar[str | None] = contextvars.ContextVar("composed_overrides", default=None)
MAX_SUFFIX = 120  # longer override lists are cut and keep a hash of the whole list (file names stay < 255 bytes)


def run_name_suffix(override_dirname: str) -> str:
    """``_<k=v,...>`` for a run name from Hydra's ``override_dirname`` (``''`` when empty): characters other
    than letters, digits and ``._=,+-`` become ``_`` (a ``/`` in a path value would nest directories)."""
    if not override_dirname:
        return ""
    safe = re.sub(r"[^A-Za-z0-9._=,+\-]", "_", override_dirname)
    if len(safe) > MAX_SUFFIX:
        safe = safe[:MAX_SUFFIX - 9] + "-" + hashlib.sha256(override_dirname.encode()).hexdigest()[:8]
    return "_" + safe


def _run_overrides() -> str:
    """``${run_overrides:}``: the run name's suffix from this command's overrides (see ``run_name_suffix``)."""
    from hydra.core.hydra_config import HydraConfig

    composed = _COMPOSED_OVERRIDES.get()
    if composed is not None:
        return run_name_suffix(composed)
    return run_name_suffix(HydraConfig.get().job.override_dirname) if HydraConfig.initialized() else ""


if not OmegaConf.has_resolver("run_overrides"):
    OmegaConf.register_new_resolver("run_overrides", _run_overrides)


def _ragen_quiet_keys(ours):
    from ragen_turn.ragen_keys import quiet_keys

    return quiet_keys(ours)


if not OmegaConf.has_resolver("ragen_quiet_keys"):  # the run name leaves out RAGEN keys that change nothing here
    OmegaConf.register_new_resolver("ragen_quiet_keys", _ragen_quiet_keys)


def _env_modules_in(overrides: list[str]) -> list:
    """The ``env_module=`` values among command-line overrides (a name or a list of names)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if "env_module" in o])
    except Exception:  # a malformed override: Hydra reports it when it composes
        return []
    out: list = []
    for o in parsed:
        if o.key_or_group.lstrip("+~") == "env_module" and not o.is_delete():
            v = o.value()
            out += list(v) if isinstance(v, (list, tuple)) else [v]
    return [str(v) for v in out if v]


def registered_env_config(name: str) -> dict:
    """The ``env=<name>`` config group entry of a registered env that has no ``config/env/<name>.yaml``:
    one tag (the env type) for train and val, its config dataclass's defaults as ``env_config``."""
    import dataclasses

    from ragen_turn.envs import REGISTERED_ENV_CONFIGS

    env_config: dict = {}
    cfg_cls = REGISTERED_ENV_CONFIGS.get(name)
    try:  # defaults that OmegaConf can hold; else none (the dataclass fills them in)
        env_config = OmegaConf.to_container(OmegaConf.create(dataclasses.asdict(cfg_cls())))
    except Exception:
        env_config = {}
    return {
        "env": {"name": name, "train_tags": [name], "train_n_groups": ["${es_manager.train.env_groups}"],
                "val_tags": [name], "val_n_groups": ["${es_manager.val.env_groups}"]},
        "custom_envs": {name: {"env_type": name, "max_actions_per_traj": None, "env_instruction": None,
                               "env_config": env_config}},
    }


def prepare_envs(overrides: list[str]) -> None:
    """Before Hydra composes: import the ``env_module=`` modules (they call ``register_env``) and offer every
    registered env without a ``config/env/<name>.yaml`` as an ``env=<name>`` choice."""
    from hydra.core.config_store import ConfigStore

    from ragen_turn.envs import REGISTERED_ENVS, import_env_modules

    given = _env_modules_in(list(overrides))  # an empty name is left to the config check (an error line)
    if given:
        import_env_modules(given)
    cs = ConfigStore.instance()
    dirs = [Path(CONFIG_DIR), *_searchpath_dirs(list(overrides))]
    for name in REGISTERED_ENVS:  # a group file of that name (here or on hydra.searchpath) is the env's entry
        if not any((d / "env" / f"{name}.yaml").is_file() for d in dirs):
            cs.store(group="env", name=name, node=registered_env_config(name), package="_global_")
        else:  # and replaces a generated entry an earlier composition in this process stored
            cs.repo.get("env", {}).pop(f"{name}.yaml", None)


def group_choices(group: str, dirs: list[Path]) -> list[str]:
    """The names ``<group>=<name>`` can take: ``<group>/*.yaml`` under ``dirs`` (ours first), and for ``env``
    every env registered (``register_env``, an ``env_module=``)."""
    names = {p.stem for d in dirs for p in (Path(d) / group).glob("*.yaml")}
    if group == "env":
        from ragen_turn.envs import REGISTERED_ENVS

        names |= set(REGISTERED_ENVS)
    return sorted(names)


def check_group_choices(overrides: list[str], dirs: list[Path] = ()) -> None:
    """Every config choice on the command line (``env=sokban``, ``algo=turnppo``, ``+sweep=...``) names a
    ``config/<group>/<name>.yaml`` (or a registered env); else a ``ValueError`` naming the closest one and the
    choices (Hydra would print its own list without a suggestion). Sweeps (``algo=grpo,turn_ppo``) are checked
    value by value; Hydra's functions (``choice(...)``) and interpolations are left to Hydra."""
    from ragen_turn.ragen_keys import CONFIG_GROUPS
    from ragen_turn.schema import did_you_mean

    if any(o.lstrip("+").startswith("hydra.searchpath=") and "pkg://" in o for o in overrides):
        return  # config groups inside a package: Hydra knows them, this check does not
    dirs = [Path(CONFIG_DIR), *_searchpath_dirs(list(overrides)), *dirs]
    for o in overrides:
        key, eq, value = o.partition("=")
        group = key.lstrip("+")
        if not eq or group not in CONFIG_GROUPS or re.search(r"[()\[\]${}*]", value):
            continue
        known = group_choices(group, dirs)
        for name in (v.strip().strip("'\"") for v in value.split(",")):
            if not name:
                raise ValueError(f"{group}={value}: names no config ({group} choices: {', '.join(known)})")
            if name != "null" and name not in known:
                where = f"config/{group}/{name}.yaml" + (" (nor an env registered by env_module=)"
                                                         if group == "env" else "")
                raise ValueError(f"{group}={name}: no {where}{did_you_mean(name, known, group + '=')} "
                                 f"({group} choices: {', '.join(known)})")


def _searchpath_dirs(overrides: list[str]) -> list[Path]:
    """The ``file://`` directories of a ``hydra.searchpath=[...]`` override (where a user keeps config groups of
    their own, e.g. ``env/<name>.yaml`` holding RAGEN ``envs.yaml`` entries)."""
    out = []
    for o in overrides:
        if o.lstrip("+").startswith("hydra.searchpath="):
            value = o.split("=", 1)[1].strip("[]")
            out += [Path(v.strip().strip("'\"")[len("file://"):]) for v in value.split(",")
                    if v.strip().strip("'\"").startswith("file://")]
    return out


def named_configs() -> list[str]:
    """The configs ``--config-name`` can pick: ``base`` (ours, the default) and RAGEN's named runs (``_N_<env>``)."""
    return sorted(p.stem for p in Path(CONFIG_DIR).glob("*.yaml"))


def check_config_name(name: str | None) -> None:
    """``--config-name <name>`` names a config here, and the env group it selects exists (RAGEN's ``_1_bandit`` needs
    ``config/env/bandit.yaml``); else a ``ValueError`` that lists what there is."""
    from ragen_turn.ragen_keys import check_named_config

    if name is None or name == "base":
        return
    name = name[:-5] if name.endswith(".yaml") else name
    check_named_config(name)  # RAGEN's named configs with no counterpart here: what to use instead
    path = Path(CONFIG_DIR) / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"--config-name {name}: no config/{name}.yaml; available: {', '.join(named_configs())} "
                         f"(RAGEN's named runs are _N_<env>; ours is base, the default)")
    from ragen_turn.envs import REGISTERED_ENVS

    for line in path.read_text().splitlines():
        m = re.match(r"\s*-\s*override\s+/env:\s*(\S+)", line)
        if m and not (Path(CONFIG_DIR) / "env" / f"{m.group(1)}.yaml").is_file() and m.group(1) not in REGISTERED_ENVS:
            shipped = [n for n in named_configs() if n != "base" and _env_of(n) in (None, *_shipped_envs())]
            env = m.group(1)
            raise ValueError(f"--config-name {name}: RAGEN's run needs env={env} (config/env/{env}.yaml), which "
                             f"this checkout does not ship yet (nor does an env_module= register it); the named "
                             f"runs that work here: {', '.join(shipped)}")


def _env_of(name: str) -> str | None:
    m = re.search(r"override\s+/env:\s*(\S+)", (Path(CONFIG_DIR) / f"{name}.yaml").read_text())
    return m.group(1) if m else None


def _shipped_envs() -> list[str]:
    return [p.stem for p in (Path(CONFIG_DIR) / "env").glob("*.yaml")]


def compose_with_hydra(overrides: list[str] | None = None, config_name: str = "base") -> DictConfig:
    """The composed config for ``overrides`` (as on the command line) with its ``hydra`` node, unresolved: what
    ``compose_config`` resolves; sweep values (``a=1,2``) are not allowed here (see ``ragen_turn.sweeps``).
    ``config_name``: ``base`` or one of RAGEN's named runs (``_2_sokoban``; :func:`named_configs`)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ragen_turn.ragen_keys import algo_for_named_run, move_ragen_overrides

    overrides = move_ragen_overrides(algo_for_named_run(list(overrides or []), config_name))
    prepare_envs(overrides)
    check_group_choices(overrides)
    check_config_name(config_name)
    if GlobalHydra.instance().is_initialized():  # inside a @hydra.main app (e.g. eval re-composing a run)
        return compose(config_name=config_name, overrides=list(overrides or []), return_hydra_config=True)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides or []), return_hydra_config=True)


def compose_config(overrides: list[str] | None = None, config_name: str = "base",
                   check: bool = False) -> DictConfig:
    """The config for ``overrides`` (as on the command line), without starting a run: composed
    (:func:`compose_with_hydra`) and :func:`finalize`-d, its checks only with ``check=True`` (by default
    they are left to the caller: ``sweeps`` lists a refused job's run directory, tests check bad configs)."""
    cfg = compose_with_hydra(overrides, config_name)
    token = _COMPOSED_OVERRIDES.set(str(cfg.hydra.job.override_dirname))
    try:
        with open_dict(cfg):
            del cfg["hydra"]
        finalize(cfg, check=check)
    finally:
        _COMPOSED_OVERRIDES.reset(token)
    return cfg


def finalize(cfg: DictConfig, check: bool = True) -> DictConfig:
    """A composed config (without its ``hydra`` node), in place, as every engine reads it; returns it.

    1. RAGEN's keys mapped onto ours (:func:`ragen_turn.ragen_keys.apply_ragen_keys`), before resolving, so
       that interpolations (the run name's seed, ``${mul:...}`` lrs) see the mapped values;
    2. resolved (the resolvers of this module);
    3. with ``check``: :func:`ragen_turn.config.check_resolved` (the ``env_module`` modules imported,
       required keys and optional packages, the schema, the cross-key rules): a ``ValueError`` naming each
       bad key.

    Idempotent: a finalized config passes through unchanged (the engines check again with
    ``config.validate_config``, for programs that build a trainer from a config of their own)."""
    from ragen_turn.config import check_resolved
    from ragen_turn.ragen_keys import apply_ragen_keys

    apply_ragen_keys(cfg)
    OmegaConf.resolve(cfg)
    if check:
        check_resolved(cfg)
    return cfg


def config_dirs(argv: list[str]) -> list[Path]:
    """The config directories a command composes from: ours, and those named by Hydra's ``--config-path`` /
    ``-cp`` and ``--config-dir`` / ``-cd``."""
    dirs = [Path(CONFIG_DIR)]
    for i, a in enumerate(argv):
        for flag in ("--config-path", "-cp", "--config-dir", "-cd"):
            if a == flag and i + 1 < len(argv):
                dirs.append(Path(argv[i + 1]))
            elif a.startswith(flag + "="):
                dirs.append(Path(a.split("=", 1)[1]))
    return [d for d in dirs if d.is_dir()]


def check_config_files(dirs: list[Path]) -> None:
    """Every ``*.yaml`` under ``dirs`` parses as YAML; else one ``ValueError`` naming the file, line and column
    (Hydra would stop with a long traceback of its own)."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    for path in sorted(p for d in dirs for p in Path(d).rglob("*.yaml")):
        try:
            yaml.load(path.read_text(), Loader=get_yaml_loader())
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            what = "; ".join(x for x in (e.context, e.problem) if x)
            raise ValueError(f"{path}{where}: malformed YAML ({what})") from None
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: malformed YAML ({type(e).__name__}: {e})") from None


def _config_name_arg(argv: list[str]) -> str | None:
    """The value of Hydra's ``--config-name`` / ``-cn`` in ``argv`` (None when absent)."""
    for i, a in enumerate(argv):
        if a in ("--config-name", "-cn") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--config-name="):
            return a.split("=", 1)[1]
    return None


def prepare_cli() -> None:
    """Before ``@hydra.main`` composes ``sys.argv``: the config files parse, RAGEN's keys moved aside
    (``model_path`` says what it chose, in one line), ``env_module=`` imported, the config choices (``env=``,
    ``algo=``, ...) and a ``--config-name`` checked."""
    from ragen_turn.ragen_keys import algo_for_named_run, move_ragen_overrides, ragen_config_name

    check_config_files(config_dirs(sys.argv[1:]))
    notes: list[str] = []  # what the mapping chose for RAGEN's keys, one line each, printed once below
    sys.argv[1:] = ragen_config_name(sys.argv[1:], notes)  # RAGEN's --config-name base: its PPO run, our _2_sokoban
    name = _config_name_arg(sys.argv[1:])
    sys.argv[1:] = move_ragen_overrides(algo_for_named_run(sys.argv[1:], name, notes), notes)
    prepare_envs(sys.argv[1:])
    check_group_choices(sys.argv[1:], config_dirs(sys.argv[1:]))
    check_config_name(name)
    for line in dict.fromkeys(notes):
        print(line)

