"""RAGEN's text-environment interface.

An environment is reset with a seed and stepped with one action; it returns
``(observation: str, reward: float, done: bool, info: dict)``. ``info`` carries at
least ``success``, ``action_is_valid`` and ``action_is_effective``. The same seed must
give the same episode on any machine. A RAGEN environment class drops in unchanged:
the rollout layer only calls ``reset``, ``step``, ``render``, ``close`` and reads
``ACTION_LOOKUP`` / ``get_all_actions`` / ``instruction`` when present.
"""
from __future__ import annotations

import dataclasses
import os
from abc import ABC, abstractmethod
import numbers
from typing import Any, Dict, List, Mapping, Optional, Tuple

StepResult = Tuple[Any, float, bool, Dict[str, Any]]


def check_seed(seed: Any, name: str = "seed") -> Optional[int]:
    """``reset(seed)``'s argument as an int: None, an int or a numpy integer; anything else (a float such as 1.5,
    a bool, a string) raises ``TypeError`` naming the argument instead of being truncated."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"reset({name}={seed!r}): {name} must be an int (or numpy integer) or None, "
                        f"got {type(seed).__name__}")
    return int(seed)


SPLIT_ALIASES = {"eval": "val", "validation": "val", "dev": "val"}


def normalize_split(split: Any, splits: Tuple[str, ...], env_name: str) -> str:
    """``split`` lower-cased with RAGEN's aliases (``eval`` / ``validation`` / ``dev`` = ``val``); None = ``train``."""
    s = str(split).strip().lower() if split is not None else "train"
    s = SPLIT_ALIASES.get(s, s)
    if s not in splits:
        raise ValueError(f"{env_name}: unknown split {split!r}; expected one of {list(splits)} (or 'eval' for 'val')")
    return s


def env_cache_dir(name: str) -> str:
    """Where env ``name`` caches on disk (search indexes): ``$RAGEN_TURN_CACHE_DIR/<name>``, else
    ``~/.cache/ragen_turn/<name>``."""
    root = os.environ.get("RAGEN_TURN_CACHE_DIR") or os.path.join("~", ".cache", "ragen_turn")
    return os.path.join(os.path.expanduser(root), name)


class BaseEnv(ABC):
    """Base of every environment (RAGEN ``ragen.env.base.BaseEnv``)."""

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        self.config = config

    @abstractmethod
    def reset(self, seed: int | None = None, mode: str | None = None) -> Any:
        """Start an episode; the same ``seed`` gives the same episode. Returns the rendered observation."""

    @abstractmethod
    def step(self, action: Any) -> StepResult:
        """Apply one action. Invalid actions are a no-op with a penalty, never an exception."""

    def render(self, mode: str = "text") -> Any:
        """Text of the current state."""
        return None

    def compute_reward(self, action: Any, **kwargs: Any) -> float:
        return 0.0

    def close(self) -> None:
        """Release resources."""


class EpisodeStatus:
    """``success`` and ``done`` as read-only properties over ``self._success`` / ``self._done``, which the env's
    ``reset`` / ``step`` keep (bandit, countdown, sokoban: ``class XEnv(EpisodeStatus, BaseDiscreteActionEnv)``)."""

    @property
    def success(self) -> bool:
        return self._success

    @property
    def done(self) -> bool:
        return self._done


class BaseDiscreteActionEnv(BaseEnv, ABC):
    """Environments with a small discrete action set (Sokoban, FrozenLake).

    ``ACTION_LOOKUP`` maps RAGEN's action ids (1..n; 0 is the invalid action) to names.
    """

    GRID_LOOKUP: Dict[int, str] = {}
    ACTION_LOOKUP: Dict[int, str] = {}
    INVALID_ACTION = 0

    @abstractmethod
    def step(self, action: Any) -> StepResult:
        ...

    @abstractmethod
    def get_all_actions(self) -> List[int]:
        """Ids of all valid actions."""


class BaseLanguageBasedEnv(BaseEnv, ABC):
    """Environments whose action is free text (WebShop's ``search[...]`` / ``click[...]``).

    ``response_format`` says what the rollout hands to ``step``: ``"answer"`` (RAGEN's, the default) the actions
    inside the response's ``<answer>a || b</answer>``; ``"raw"`` the whole response text, which the env parses
    itself (Search-R1's ``<search>`` / ``<answer>`` tags) and scores, format penalty included.
    """

    response_format: str = "answer"

    @abstractmethod
    def step(self, action: str) -> StepResult:
        ...


def coerce_config(cls: Any, config: Any, kwargs: Mapping[str, Any]) -> Any:
    """An env's ``__init__(config=None, **kwargs)`` argument as a ``cls`` instance: None (keywords only), a mapping
    (merged with the keywords, read by ``cls.from_dict``) or a ``cls``; anything else is a ``TypeError``."""
    if config is None:
        return cls(**kwargs)
    if isinstance(config, Mapping):
        return cls.from_dict({**config, **kwargs})
    if kwargs:
        raise TypeError(f"pass either a {cls.__name__} or keyword arguments, not both")
    if not isinstance(config, cls):
        raise TypeError(f"config must be a {cls.__name__} or a dict, got {type(config).__name__}")
    return config


def known_keys_config(cls: Any, d: Optional[Mapping[str, Any]], env_name: str) -> Any:
    """``cls(**d)`` for a dataclass env config, refusing keys it lacks first (``<env_name>: unknown config key(s)
    [...]; known: [...]``): the envs' ``from_dict``."""
    d = dict(d or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"{env_name}: unknown config key(s) {unknown}; known: {sorted(known)}")
    return cls(**d)


def config_from(cls: Any, config: Any, kwargs: Mapping[str, Any], copy: bool = False) -> Any:
    """A dataclass env config from an env's ``__init__(config=None, **kwargs)``: keywords only, a mapping merged
    with the keywords, or a ``cls`` instance with the keywords replaced (a copy when there are keywords, or always
    with ``copy``: for envs whose ``reset`` writes into their config)."""
    if config is None:
        return cls(**kwargs)
    if isinstance(config, Mapping):
        return cls(**{**dict(config), **kwargs})
    return dataclasses.replace(config, **kwargs) if (kwargs or copy) else config
