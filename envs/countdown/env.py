"""``CountdownEnv``: RAGEN's Countdown (TinyZero's numbers game), one answer per episode.

The observation gives a target and a list of numbers; the answer is an arithmetic expression that uses every
number once. RAGEN's rewards: ``score`` (1) when it equals the target, ``format_score`` (0.1) when it uses exactly
the numbers but misses, 0 otherwise. RAGEN reads its problems from TinyZero's parquet file; here each problem is
generated from the seed (``train_path`` reads RAGEN's file instead, with RAGEN's seed -> row rule).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from ..base import BaseLanguageBasedEnv, EpisodeStatus, check_seed, config_from
from .arith import equals_target, has_plus_minus_solution, plus_minus_equation, uses_numbers
from .config import CountdownEnvConfig


def generate_problem(seed: int, cfg: CountdownEnvConfig) -> Dict[str, Any]:
    """``{"target", "nums"}`` for ``seed``: ``min_numbers..max_numbers`` numbers in ``1..max_number`` and random
    signs, drawn again until the signed sum (the target) is in ``1..max_target``. Same seed, same problem."""
    rng = np.random.default_rng(int(seed) % 2**64)
    while True:
        n = int(rng.integers(cfg.min_numbers, cfg.max_numbers + 1))
        nums = [int(x) for x in rng.integers(1, cfg.max_number + 1, size=n)]
        signs = rng.choice((-1, 1), size=n)
        target = int(sum(int(s) * x for s, x in zip(signs, nums)))
        if 1 <= target <= cfg.max_target:
            return {"target": target, "nums": nums}


def load_problems(path: str, max_instances: int) -> List[Dict[str, Any]]:
    """RAGEN's problem list: the first ``max_instances`` rows of a parquet file (``target``, ``nums``), keeping
    those with a +/- solution."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("countdown env_config.train_path needs pyarrow (pip install -e '.[parquet]'), or set it to "
                         "null to generate problems") from None
    rows = pq.read_table(path, columns=["target", "nums"]).slice(0, max_instances).to_pylist()
    rows = [{"target": r["target"], "nums": list(r["nums"])} for r in rows]
    rows = [r for r in rows if has_plus_minus_solution(r["nums"], r["target"])]
    if not rows:
        raise ValueError(f"countdown env_config.train_path={path!r}: no problem with a +/- solution")
    return rows


class CountdownEnv(EpisodeStatus, BaseLanguageBasedEnv):
    """The action is the expression text (RAGEN hands the env the text inside ``<answer>``); one answer ends the
    episode. The expression is parsed, never ``eval``-ed: numbers, + - * / // % **, unary signs and parentheses
    (powers above 64 count as wrong). An action that is not text is an invalid move: nothing happens, it costs
    ``config.format_penalty``."""

    def __init__(self, config: CountdownEnvConfig | Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        config = config_from(CountdownEnvConfig, config, kwargs)
        super().__init__(config)
        self.config: CountdownEnvConfig = config
        self.data = load_problems(config.train_path, config.max_instances) if config.train_path else None
        self.problem: Optional[Dict[str, Any]] = None
        self.index: Optional[int] = None
        self._obs: Optional[str] = None
        self._done = True
        self._success = False

    @property
    def instruction(self) -> str:
        return ("You are playing Countdown: write one arithmetic expression that uses every listed number exactly "
                "once (with + - * / and parentheses) and equals the target, e.g. <answer>2 + 5 - 3</answer>.")

    def reset(self, seed: int | None = None, mode: str | None = None) -> str:
        seed = check_seed(seed)
        if seed is None:
            seed = int(np.random.default_rng().integers(2**31))
        if self.data is not None:  # RAGEN's rule on its file
            self.index = seed % len(self.data)
            self.problem = self.data[self.index]
        else:
            self.problem = generate_problem(seed, self.config)
        self._obs = f"Target: {self.problem['target']}, nums: {self.problem['nums']}"
        self._done = False
        self._success = False
        return self._obs

    def compute_reward(self, action: str, ground_truth: Optional[Dict[str, Any]] = None, **kwargs: Any):
        """RAGEN's score of an expression for a problem (the current one by default)."""
        gt = ground_truth or self.problem
        if not uses_numbers(action, gt["nums"]):
            return 0
        return self.config.score if equals_target(action, gt["target"]) else self.config.format_score

    def step(self, action: Any):
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        if isinstance(action, bytes):
            action = action.decode("utf-8", "replace")
        if not isinstance(action, str):
            reward = 0.0 if self._done else float(self.config.format_penalty)
            return self._obs, reward, self._done, {"success": self._success, "action_is_valid": False,
                                                   "action_is_effective": False}
        if self._done:
            return self._obs, 0.0, True, {"success": self._success, "action_is_valid": True,
                                          "action_is_effective": False}
        reward = self.compute_reward(action)
        self._obs = f"Your answer get {reward} points."
        self._done = True
        self._success = reward == self.config.score
        return self._obs, reward, True, {"success": self._success, "action_is_valid": True,
                                         "action_is_effective": reward > 0}

    def render(self, mode: str | None = "text") -> str:
        if self._obs is None:
            raise RuntimeError("call reset() before render()")
        return self._obs

    def solve(self) -> Optional[List[str]]:
        """The expert's answer: an equation of the numbers with + and - that equals the target ([] once answered)."""
        if self.problem is None:
            raise RuntimeError("call reset() before solve()")
        if self._done:
            return []
        eq = plus_minus_equation(self.problem["nums"], self.problem["target"])
        return None if eq is None else [eq]

    def get_state(self) -> tuple:
        return (dict(self.problem) if self.problem else None, self.index, self._obs, self._done, self._success)

    def set_state(self, state: tuple) -> None:
        problem, self.index, self._obs, self._done, self._success = state
        self.problem = dict(problem) if problem else None


__all__ = ["CountdownEnv", "generate_problem", "load_problems"]
