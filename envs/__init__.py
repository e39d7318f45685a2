"""Environment adapters and RAGEN's env registry.

``REGISTERED_ENVS[env_type]`` is the env class and ``REGISTERED_ENV_CONFIGS[env_type]`` its
config dataclass, as in RAGEN's ``ragen.env``. Environments whose optional
dependencies are missing are simply not registered; ``get_env_class`` says how to get them.

Bring your own env: a module that calls :func:`register_env` is imported by ``env_module=<module>``
(``bash train.sh <env_type> <algo> env_module=my_pkg.envs``), or by an installed package's entry point
in the ``ragen_turn.envs`` group (``entry_points={"ragen_turn.envs": ["my_envs = my_pkg.envs"]}``),
which is loaded when this package is imported.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, Iterable

from .base import BaseDiscreteActionEnv, BaseEnv, BaseLanguageBasedEnv, check_seed

REGISTERED_ENVS: Dict[str, type] = {}
REGISTERED_ENV_CONFIGS: Dict[str, type] = {}
_IMPORT_ERRORS: Dict[str, str] = {}


def register_env(name: str, env_cls: type, config_cls: type) -> None:
    REGISTERED_ENVS[name] = env_cls
    REGISTERED_ENV_CONFIGS[name] = config_cls


try:
    from .sokoban import SokobanEnv, SokobanEnvConfig

    register_env("sokoban", SokobanEnv, SokobanEnvConfig)
except ImportError as e:  # pragma: no cover - only while the adapter is missing
    _IMPORT_ERRORS["sokoban"] = str(e)

try:  # RAGEN's simple envs: gymnasium (a core dependency) is all they need
    from .bandit import BanditEnv, BanditEnvConfig
    from .countdown import CountdownEnv, CountdownEnvConfig
    from .frozen_lake import FrozenLakeEnv, FrozenLakeEnvConfig

    register_env("bandit", BanditEnv, BanditEnvConfig)
    register_env("frozen_lake", FrozenLakeEnv, FrozenLakeEnvConfig)
    register_env("countdown", CountdownEnv, CountdownEnvConfig)
except ImportError as e:  # pragma: no cover
    for _name in ("bandit", "frozen_lake", "countdown"):
        _IMPORT_ERRORS[_name] = str(e)

try:
    from .webshop import WebShopEnv, WebShopEnvConfig

    register_env("webshop", WebShopEnv, WebShopEnvConfig)
except ImportError as e:
    _IMPORT_ERRORS["webshop"] = f"{e} (install with: pip install -e '.[webshop]')"


try:
    from .search_qa import SearchQAEnv, SearchQAEnvConfig

    register_env("search_qa", SearchQAEnv, SearchQAEnvConfig)
except ImportError as e:
    _IMPORT_ERRORS["search_qa"] = f"{e} (install with: pip install -e '.[search_qa]')"


def import_env_modules(modules: str | Iterable[str] | None) -> list:
    """Import the modules named by ``env_module`` (one name, a comma-separated string or a list); each
    registers its envs when imported. Importing runs the module's code: it must be code you trust. A module that
    cannot be imported is a ``ValueError`` naming it; so is a value that names no module (``env_module=''``,
    an empty name in a list): leave the key out (null) for none."""
    if modules is None:
        return []
    given = modules
    if isinstance(modules, str):
        modules = [m for m in modules.split(",")]
    names = [str(m).strip() for m in modules]
    if not names or not all(names):
        raise ValueError(f"env_module={given!r}: names no module (an empty name); leave env_module out (or set "
                         "env_module=null) for none, or name the importable module(s) that register your envs")
    # env files written as RAGEN's docs teach import RAGEN's base classes: ours, unless RAGEN is installed
    from .ragen_aliases import install

    install()
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                raise ValueError(f"env_module={name!r} cannot be imported ({e}); the module must be importable "
                                 f"(installed, or its directory on PYTHONPATH)") from None
            raise ValueError(import_failure(name, e)) from None  # a module it imports is missing
        except Exception as e:  # SyntaxError, or anything its body raises
            raise ValueError(import_failure(name, e)) from None
    return names


def import_failure(name: str, e: BaseException) -> str:
    """One line for an ``env_module`` whose import raised ``e``: the error and where (file, line)."""
    import traceback

    if isinstance(e, SyntaxError):
        where = f"{e.filename}, line {e.lineno}" + (f", column {e.offset}" if e.offset else "")
        return f"env_module={name!r} has a syntax error: {e.msg} ({where})"
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if "importlib" not in f.filename and "<frozen" not in f.filename] or frames
    where = f" ({mine[-1].filename}, line {mine[-1].lineno})" if mine else ""
    return f"env_module={name!r} failed while being imported: {type(e).__name__}: {e}{where}"


def _load_entry_points() -> None:
    """Import every ``ragen_turn.envs`` entry point (a module, or a function called with no arguments)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="ragen_turn.envs"):
        try:
            obj = ep.load()
            if callable(obj):
                obj()
        except Exception as e:  # a broken plugin must not break the built-in envs
            _IMPORT_ERRORS[ep.name] = f"entry point {ep.value!r} failed: {type(e).__name__}: {e}"


_load_entry_points()


def get_env_class(name: str) -> type:
    if name not in REGISTERED_ENVS:
        why = f": {_IMPORT_ERRORS[name]}" if name in _IMPORT_ERRORS else ""
        raise ValueError(f"unknown env_type {name!r}{why}; registered: {sorted(REGISTERED_ENVS)} (register your own "
                         f"with ragen_turn.envs.register_env in a module named by env_module=...)")
    return REGISTERED_ENVS[name]


def make_env_config(name: str, env_config: Dict[str, Any] | None = None) -> Any:
    """Env ``name``'s config dataclass from a plain dict of its fields (unknown keys refused; the dataclass checks
    its values). Cheap: configs are checked with it before any work."""
    get_env_class(name)
    cfg_cls = REGISTERED_ENV_CONFIGS[name]
    env_config = {str(k) if isinstance(k, str) else k: _plain(v) for k, v in dict(env_config or {}).items()}
    known = set(getattr(cfg_cls, "__dataclass_fields__", {}))
    unknown = sorted(set(env_config) - known) if known else []
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in env_config for {name!r}; known: {sorted(known)}")
    try:
        return cfg_cls(**env_config)
    except TypeError as e:  # a config class that is not a dataclass, or a bad argument
        raise ValueError(f"env_config for {name!r}: {e}") from None


def _plain(v: Any) -> Any:
    """A config node (an env_config value from the yaml: a mapping such as RAGEN's ``action_lookup``, a list
    such as ``dim_room``) as the plain dict / list an env class written for RAGEN expects."""
    try:
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return v
    return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v


def make_env(name: str, env_config: Dict[str, Any] | None = None) -> BaseEnv:
    """Build env ``name`` from a plain dict of its config dataclass's fields."""
    return get_env_class(name)(make_env_config(name, env_config))


__all__ = [
    "BaseEnv", "BaseDiscreteActionEnv", "BaseLanguageBasedEnv", "REGISTERED_ENVS",
    "REGISTERED_ENV_CONFIGS", "register_env", "get_env_class", "make_env", "make_env_config", "check_seed",
    "import_env_modules",
]
