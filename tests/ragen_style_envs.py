"""Test envs written here in RAGEN's discrete-action style (not RAGEN's code): integer actions, an
``ACTION_LOOKUP`` of id -> name (also on ``config.action_lookup``, where RAGEN's env-state manager reads
it), an assertion on ids they do not know, no ``solve()``. Importing this module registers them, as
``env_module=ragen_style_envs`` does for ``bash train.sh``.

- ``two_doors``: one turn; the lookup is drawn at each reset (like RAGEN's Bandit), so the rollout must
  read it every turn. Opening the ``Gold`` door pays 1.
- ``corridor``: walk ``Left`` / ``Right`` along a corridor to its right end (+1, success), -0.01 a step.

``STEPS`` counts the actions each env class received (tests check that ids, never names, reach ``step``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np

from ragen_turn.envs import BaseDiscreteActionEnv, register_env

STEPS: Counter = Counter()


@dataclass
class TwoDoorsConfig:
    action_lookup: Optional[Dict[int, str]] = None  # set at reset
    render_mode: str = "text"


class TwoDoorsEnv(BaseDiscreteActionEnv):
    def __init__(self, config: Optional[TwoDoorsConfig] = None):
        self.config = config or TwoDoorsConfig()
        self.rng = np.random.default_rng(0)
        self.ACTION_LOOKUP: Dict[int, str] = {}
        self.text = ""

    def reset(self, seed=None, mode=None):
        self.rng = np.random.default_rng(seed)
        names = ["Gold", "Stone"] if self.rng.random() < 0.5 else ["Stone", "Gold"]
        self.ACTION_LOOKUP = {1: names[0], 2: names[1]}
        self.config.action_lookup = self.ACTION_LOOKUP
        self.text = f"Two doors: {names[0]} and {names[1]}. Open one."
        return self.text

    def step(self, action: int):
        assert action in self.ACTION_LOOKUP, f"Invalid action: {action}"
        STEPS["two_doors"] += 1
        gold = self.ACTION_LOOKUP[action] == "Gold"
        self.text = f"You opened {self.ACTION_LOOKUP[action]}."
        return self.text, float(gold), True, {"action_is_valid": True, "action_is_effective": True, "success": gold}

    def render(self):
        return self.text

    def get_all_actions(self):
        return [1, 2]


@dataclass
class CorridorConfig:
    length: int = 4
    max_steps: int = 10
    action_lookup: Dict[int, str] = field(default_factory=lambda: {1: "Left", 2: "Right"})


class CorridorEnv(BaseDiscreteActionEnv):
    def __init__(self, config: Optional[CorridorConfig] = None):
        self.config = config or CorridorConfig()
        self.ACTION_LOOKUP = dict(self.config.action_lookup)
        self.pos = 0
        self.steps = 0

    def reset(self, seed=None, mode=None):
        self.pos = int(np.random.default_rng(seed).integers(0, self.config.length - 1))
        self.steps = 0
        return self.render()

    def render(self, mode=None):
        cells = ["_"] * self.config.length
        cells[-1] = "G"
        cells[self.pos] = "P"
        return "".join(cells)

    def step(self, action: int):
        assert isinstance(action, int) and action in self.ACTION_LOOKUP, f"Invalid action: {action}"
        STEPS["corridor"] += 1
        self.steps += 1
        old = self.pos
        self.pos = max(0, min(self.config.length - 1, self.pos + (1 if action == 2 else -1)))
        success = self.pos == self.config.length - 1
        done = success or self.steps >= self.config.max_steps
        info = {"action_is_valid": True, "action_is_effective": self.pos != old, "success": success}
        return self.render(), (1.0 if success else -0.01), done, info

    def get_all_actions(self):
        return [1, 2]


register_env("two_doors", TwoDoorsEnv, TwoDoorsConfig)
register_env("corridor", CorridorEnv, CorridorConfig)
