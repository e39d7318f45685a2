"""Environment adapters and RAGEN's env registry.

``REGISTERED_ENVS[env_type]`` is the env class and ``REGISTERED_ENV_CONFIGS[env_type]`` its
config dataclass, as in RAGEN's ``ragen.env``. Environments whose optional
dependencies are missing are simply not registered; ``get_env_class`` says how to get them.
"""
from __future__ import annotations

from typing import Any, Dict

from .base import BaseDiscreteActionEnv, BaseEnv, BaseLanguageBasedEnv

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


def get_env_class(name: str) -> type:
    if name not in REGISTERED_ENVS:
        why = f": {_IMPORT_ERRORS[name]}" if name in _IMPORT_ERRORS else ""
        raise ValueError(f"unknown env_type {name!r}{why}; registered: {sorted(REGISTERED_ENVS)}")
    return REGISTERED_ENVS[name]


def make_env(name: str, env_config: Dict[str, Any] | None = None) -> BaseEnv:
    """Build env ``name`` from a plain dict of its config dataclass's fields."""
    cls = get_env_class(name)
    cfg_cls = REGISTERED_ENV_CONFIGS[name]
    env_config = dict(env_config or {})
    known = set(getattr(cfg_cls, "__dataclass_fields__", {}))
    unknown = sorted(set(env_config) - known) if known else []
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in env_config for {name!r}; known: {sorted(known)}")
    return cls(cfg_cls(**env_config))


__all__ = [
    "BaseEnv", "BaseDiscreteActionEnv", "BaseLanguageBasedEnv", "REGISTERED_ENVS",
    "REGISTERED_ENV_CONFIGS", "register_env", "get_env_class", "make_env",
]
