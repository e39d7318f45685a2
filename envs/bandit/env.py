"""``BanditEnv``: RAGEN's two-armed bandit, one pull per episode.

The arms are named after jobs: one safe (a fixed small pay), one risky (rarely a large pay, else nothing). The
model is told only the names and must guess from them which arm pays more on average; with RAGEN's defaults the
risky arm's mean (0.25) beats the safe arm's (0.1), so picking it is a ``success``.

Same seed, same episode as RAGEN's class: the reset seed plus the env's ``internal_seed`` seeds gymnasium's
generator, whose draws pick the pair of names, which name is arm ``action_space_start`` and the risky arm's pay,
in that order. The observation texts are RAGEN's.
"""
from __future__ import annotations

import itertools
import numbers
from typing import Any, Dict, List, Mapping, Optional

from gymnasium.utils import seeding

from ..base import BaseDiscreteActionEnv, EpisodeStatus, check_seed, config_from
from .config import ARM_PAIRS, BanditEnvConfig

# RAGEN's first observation, to the character (its trailing spaces included)
PROMPT = ("You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull. \n"
          "Game Rules: \n"
          "1. There are 2 arms, named {a} and {b}\n"
          "2. Each arm has its own reward distribution, related to their names. \n"
          "3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution might behave.\n"
          "4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher "
          "rewards on average? Choose between {a} and {b}, and output like <answer> {a} </answer> or "
          "<answer> {b} </answer>.\n")


class BanditEnv(EpisodeStatus, BaseDiscreteActionEnv):
    """Two arms, ids ``start`` and ``start + 1``; one valid pull ends the episode.

    ``step`` takes an arm id (int or numpy integer), the arm's name or its id as text (case and spaces ignored).
    Anything else is an invalid move: nothing happens, it costs ``config.format_penalty`` and the episode goes on
    (RAGEN's class asserts instead). After the pull, further steps pay nothing.
    """

    _built = itertools.count()  # RAGEN's per-process count of envs built: the n-th env's seeds are offset by n

    def __init__(self, config: BanditEnvConfig | Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        config = config_from(BanditEnvConfig, config, kwargs, copy=True)  # a copy: reset writes into it
        super().__init__(config)
        self.config: BanditEnvConfig = config
        n = next(BanditEnv._built)
        self.internal_seed = config.internal_seed if config.internal_seed is not None else n
        self.ACTION_LOOKUP: Dict[int, str] = {}
        self.lo_arm_name = self.hi_arm_name = ""
        self._rng = None
        self._obs: Optional[str] = None
        self._done = True
        self._success = False

    def set_slot(self, index: int) -> None:
        """Called by the env manager with the env's index in its split: with ``internal_seed`` unset, that index is
        the offset (RAGEN's count when a split's envs are the first built), so a split's episodes do not depend on
        what else the process built (a warm start, the train envs before the held-out ones)."""
        if self.config.internal_seed is None:
            self.internal_seed = int(index)

    @property
    def instruction(self) -> str:
        return ("You are playing a two-armed bandit: pull one of two arms, named in the observation, once. "
                "Answer with the arm's name, e.g. <answer>ArmName</answer>.")

    # ------------------------------------------------------------------ episode
    def reset(self, seed: int | None = None, mode: str | None = None) -> str:
        """Draw the pair of names and their arm ids from ``seed + internal_seed``; returns the rules text."""
        seed = check_seed(seed)
        if seed is not None or self._rng is None:
            self._rng, _ = seeding.np_random(None if seed is None else seed + self.internal_seed)
        if self.config.lo_arm_name is not None:  # RAGEN's Sept 2025 entries: one fixed pair of names
            self.lo_arm_name, self.hi_arm_name = self.config.lo_arm_name, self.config.hi_arm_name
        else:
            pairs = ARM_PAIRS[self.config.split]
            self.lo_arm_name, self.hi_arm_name = pairs[int(self._rng.random() * len(pairs))]
        start = self.config.action_space_start
        first, second = ((self.lo_arm_name, self.hi_arm_name) if self._rng.random() < 0.5
                         else (self.hi_arm_name, self.lo_arm_name))
        self.ACTION_LOOKUP = {start: first, start + 1: second}
        self.config.action_lookup = dict(self.ACTION_LOOKUP)  # where RAGEN's env-state manager reads the names
        self._obs = PROMPT.format(a=first, b=second)
        self._done = False
        self._success = False
        return self._obs

    def parse_action(self, action: Any) -> int:
        """The arm id ``action`` names (id, numpy integer, name or id as text); ``start - 1`` (no arm) if none."""
        none = self.config.action_space_start - 1
        if isinstance(action, bytes):
            action = action.decode("utf-8", "replace")
        if isinstance(action, str):
            text = action.strip().lower()
            for k, name in self.ACTION_LOOKUP.items():
                if text in (name.lower(), str(k)):
                    return k
            return none
        if isinstance(action, numbers.Integral) and not isinstance(action, bool):
            return int(action) if int(action) in self.ACTION_LOOKUP else none
        return none

    def step(self, action: Any):
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        arm = self.parse_action(action)
        if self._done:
            return self._obs, 0.0, True, {"success": self._success, "action_is_valid": arm in self.ACTION_LOOKUP,
                                          "action_is_effective": False}
        if arm not in self.ACTION_LOOKUP:
            return self._obs, float(self.config.format_penalty), False, {
                "success": False, "action_is_valid": False, "action_is_effective": False}
        reward = self.compute_reward(arm)
        name = self.ACTION_LOOKUP[arm]
        self._obs = f"{name}: {reward} points"
        self._done = True
        self._success = name == self.hi_arm_name
        return self._obs, reward, True, {"success": self._success, "action_is_valid": True,
                                         "action_is_effective": True}

    def compute_reward(self, action: Any, **kwargs: Any) -> float:
        """Pay of arm ``action``: the safe arm's fixed score, or one draw of the risky arm."""
        cfg = self.config
        if self.ACTION_LOOKUP[action] == self.lo_arm_name:
            return cfg.lo_arm_score
        return cfg.hi_arm_hiscore if self._rng.random() < cfg.hi_arm_hiscore_prob else cfg.hi_arm_loscore

    # ------------------------------------------------------------------ views
    def render(self, mode: str | None = "text") -> str:
        if self._obs is None:
            raise RuntimeError("call reset() before render()")
        return self._obs

    def get_all_actions(self) -> List[int]:
        start = self.config.action_space_start
        return [start, start + 1]

    def solve(self) -> Optional[List[int]]:
        """The expert's pull: the arm with the higher mean pay ([] once the episode is over)."""
        if self._obs is None:
            raise RuntimeError("call reset() before solve()")
        if self._done:
            return []
        cfg = self.config
        hi_mean = cfg.hi_arm_hiscore_prob * cfg.hi_arm_hiscore + (1 - cfg.hi_arm_hiscore_prob) * cfg.hi_arm_loscore
        best = self.hi_arm_name if hi_mean >= cfg.lo_arm_score else self.lo_arm_name
        return [k for k, name in self.ACTION_LOOKUP.items() if name == best]

    def get_state(self) -> tuple:
        return (self._rng.bit_generator.state if self._rng is not None else None, self.lo_arm_name, self.hi_arm_name,
                dict(self.ACTION_LOOKUP), self._obs, self._done, self._success)

    def set_state(self, state: tuple) -> None:
        rng_state, self.lo_arm_name, self.hi_arm_name, lookup, self._obs, self._done, self._success = state
        if rng_state is not None:
            if self._rng is None:
                self._rng, _ = seeding.np_random(0)
            self._rng.bit_generator.state = rng_state
        self.ACTION_LOOKUP = dict(lookup)
        self.config.action_lookup = dict(lookup)


__all__ = ["BanditEnv", "PROMPT"]
