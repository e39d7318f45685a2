"""``CountdownEnvConfig``: RAGEN's Countdown settings, with problems generated here instead of read from a file."""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Optional


def _int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise ValueError(f"countdown env_config.{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


@dataclass
class CountdownEnvConfig:
    train_path: Optional[str] = None  # RAGEN's parquet of problems (columns target, nums; needs pyarrow); null =
                                      # generate each problem from the seed (no download)
    max_instances: int = 20000        # RAGEN's: the file's first rows used (then those without a +/- solution dropped)
    render_mode: str = "text"
    score: float = 1                  # RAGEN's rewards: a correct equation; one that uses the numbers but misses the
    format_score: float = 0.1         # target; else 0
    min_numbers: int = 3              # generated problems (not RAGEN's keys): 3 or 4 numbers in 1..max_number, and
    max_numbers: int = 4              # a target in 1..max_target reached by adding or subtracting every number, as
    max_number: int = 99              # in RAGEN's (TinyZero's) data after its solvability filter
    max_target: int = 100
    format_penalty: float = -0.1      # not RAGEN's: reward of an action that is not text (a no-op)

    def __post_init__(self) -> None:
        if self.train_path is not None and not isinstance(self.train_path, str):
            raise ValueError(f"countdown env_config.train_path must be a path or null, got {self.train_path!r}")
        self.max_instances = _int("max_instances", self.max_instances, 1)
        self.min_numbers = _int("min_numbers", self.min_numbers, 1)
        self.max_numbers = _int("max_numbers", self.max_numbers, self.min_numbers)
        self.max_number = _int("max_number", self.max_number, 1)
        self.max_target = _int("max_target", self.max_target, 1)
        for name in ("score", "format_score", "format_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ValueError(f"countdown env_config.{name} must be a number, got {v!r}")
        if self.render_mode != "text":
            raise ValueError(f"countdown env_config.render_mode must be 'text', got {self.render_mode!r}")
