"""``FrozenLakeEnvConfig``: RAGEN's FrozenLake settings (field names and defaults as RAGEN's)."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

# RAGEN's symbols: 0 player, 1 frozen floor, 2 hole, 3 goal, 4 player in a hole, 5 player on the goal
DEFAULT_GRID_LOOKUP = {0: "P", 1: "_", 2: "O", 3: "G", 4: "X", 5: "√"}
DEFAULT_GRID_VOCAB = {"P": "player", "_": "empty", "O": "hole", "G": "goal", "X": "player in hole",
                      "√": "player on goal"}
DEFAULT_ACTION_LOOKUP = {1: "Left", 2: "Down", 3: "Right", 4: "Up"}
DEFAULT_ACTION_MAP = {1: 0, 2: 1, 3: 2, 4: 3}  # our id -> gymnasium's (0 left, 1 down, 2 right, 3 up)


def _int_map(name: str, d: Any, value) -> Dict[int, Any]:
    try:
        return {int(k): value(v) for k, v in dict(d).items()}
    except (TypeError, ValueError):
        raise ValueError(f"frozen_lake env_config.{name} must map integer ids to values, got {d!r}") from None


@dataclass
class FrozenLakeEnvConfig:
    size: int = 4                    # the map is size x size
    p: float = 0.9                   # probability that a cell is frozen floor (else a hole)
    success_rate: float = 0.8        # slippery ice: the intended move w.p. success_rate, else one of the two
                                     # perpendicular moves (each (1 - success_rate) / 2); gymnasium's rule
    is_slippery: bool = True
    map_seed: Optional[int] = None   # RAGEN's: the seed of the last reset's map (written by reset)
    render_mode: str = "text"
    observation_format: str = "grid"  # RAGEN's grid | coord (board size, entity cells) | grid_coord (both)
    action_map: Dict[int, int] = field(default_factory=lambda: dict(DEFAULT_ACTION_MAP))
    grid_lookup: Dict[int, str] = field(default_factory=lambda: dict(DEFAULT_GRID_LOOKUP))
    grid_vocab: Dict[str, str] = field(default_factory=lambda: dict(DEFAULT_GRID_VOCAB))
    action_lookup: Dict[int, str] = field(default_factory=lambda: dict(DEFAULT_ACTION_LOOKUP))
    format_penalty: float = -0.1     # not RAGEN's (its env raises): reward of an unknown action, a no-op

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, numbers.Integral) or self.size < 2:
            raise ValueError(f"frozen_lake env_config.size must be an integer >= 2, got {self.size!r}")
        for name in ("p", "success_rate", "format_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ValueError(f"frozen_lake env_config.{name} must be a number, got {v!r}")
        if not 0.0 < self.p <= 1.0:
            raise ValueError(f"frozen_lake env_config.p must be in (0, 1] (1 = no holes), got {self.p}")
        if not 0.0 <= self.success_rate <= 1.0:
            raise ValueError(f"frozen_lake env_config.success_rate must be in [0, 1], got {self.success_rate}")
        if not isinstance(self.is_slippery, bool):
            raise ValueError(f"frozen_lake env_config.is_slippery must be true or false, got {self.is_slippery!r}")
        if self.observation_format not in ("grid", "coord", "grid_coord"):
            raise ValueError(f"frozen_lake env_config.observation_format must be grid, coord or grid_coord, got "
                             f"{self.observation_format!r}")
        if self.render_mode != "text":
            raise ValueError(f"frozen_lake env_config.render_mode must be 'text', got {self.render_mode!r}")
        self.action_map = _int_map("action_map", self.action_map, int)
        self.grid_lookup = _int_map("grid_lookup", self.grid_lookup, str)
        self.action_lookup = _int_map("action_lookup", self.action_lookup, str)
        if set(self.action_map) != set(self.action_lookup) or not set(self.action_map.values()) <= {0, 1, 2, 3}:
            raise ValueError(f"frozen_lake env_config.action_map must map each id of action_lookup "
                             f"{sorted(self.action_lookup)} to a gymnasium move 0..3, got {self.action_map}")
        names = [v.strip().lower() for v in self.action_lookup.values()]
        if len(set(names)) != len(names) or any(n.isdigit() or not n for n in names):
            raise ValueError(f"frozen_lake env_config.action_lookup names must be distinct words: {self.action_lookup}")
        if self.grid_vocab is not None:
            self.grid_vocab = {str(k): str(v) for k, v in dict(self.grid_vocab).items()}
