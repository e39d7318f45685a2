"""RAGEN's import paths for its env base classes, as thin aliases to ours, for env files written as RAGEN's docs
teach (``from ragen.env.base import BaseLanguageBasedEnv``) when RAGEN itself is not installed.

:func:`install` (called by :func:`ragen_turn.envs.import_env_modules` before an ``env_module=`` is imported) puts
into ``sys.modules``: ``ragen``, ``ragen.env``, ``ragen.env.base`` (``BaseEnv``, ``BaseDiscreteActionEnv``,
``BaseLanguageBasedEnv``: ours; ``BaseEnvConfig``: RAGEN's empty config base) and ``ragen.utils`` (``all_seed``).
These are the names RAGEN's own env files import from RAGEN itself (both RAGEN commits the docs name), besides
other envs' configs. A real ``ragen`` (importable from the path) is never shadowed: then nothing is installed.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import random
import sys
import types
from abc import ABC
from contextlib import contextmanager

import numpy as np

from .base import BaseDiscreteActionEnv, BaseEnv, BaseLanguageBasedEnv

MARK = "__ragen_turn_alias__"  # set on the modules installed here


class BaseEnvConfig(ABC):
    """RAGEN's base of env configs: the text and score of an invalid action (``invalid_act``, ``invalid_act_score``)."""

    def __init__(self):
        self.invalid_act = ""
        self.invalid_act_score = 0


@contextmanager
def all_seed(seed):
    """Python's and numpy's global generators seeded with ``seed`` inside the block, their states restored after
    (RAGEN's ``ragen.utils.all_seed``, which its envs use to draw a level from a seed)."""
    saved = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name, f"ragen_turn's alias of RAGEN's {name} (ragen_turn.envs.ragen_aliases)")
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=name.count(".") < 2)
    mod.__path__ = []  # a package: ``import ragen.env.base`` walks it
    setattr(mod, MARK, True)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


def ragen_installed() -> bool:
    """Whether a real ``ragen`` can be imported (our aliases, once installed, do not count)."""
    mod = sys.modules.get("ragen")
    if mod is not None:
        return not getattr(mod, MARK, False)
    try:
        return importlib.util.find_spec("ragen") is not None
    except (ImportError, ValueError):
        return False


def install() -> bool:
    """Install the aliases unless RAGEN is importable or they are there already; returns whether they are in
    ``sys.modules`` now."""
    if ragen_installed():
        return False
    if "ragen.env.base" not in sys.modules:
        base = _module("ragen.env.base", BaseEnv=BaseEnv, BaseDiscreteActionEnv=BaseDiscreteActionEnv,
                       BaseLanguageBasedEnv=BaseLanguageBasedEnv, BaseEnvConfig=BaseEnvConfig)
        utils = _module("ragen.utils", all_seed=all_seed)
        env = _module("ragen.env", base=base)
        top = _module("ragen", env=env, utils=utils)
        sys.modules.update({"ragen": top, "ragen.env": env, "ragen.env.base": base, "ragen.utils": utils})
    return True
