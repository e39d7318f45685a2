"""``SokobanEnvConfig``: RAGEN's field names and defaults (6x6 room, 1 box, 100 steps)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from .generation import validate_room_params
from .room import ACTION_DELTAS, DEFAULT_ACTION_LOOKUP, DEFAULT_GRID_LOOKUP, DEFAULT_GRID_VOCAB


def _int_keyed(name: str, d: Any) -> Dict[int, str]:
    try:
        items = dict(d).items()
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a mapping id -> string, got {d!r}") from None
    out: Dict[int, str] = {}
    for k, v in items:
        try:
            ik = int(k)
        except (TypeError, ValueError):
            raise ValueError(f"{name} key {k!r} is not an integer id") from None
        if not isinstance(v, str) or not v:
            raise ValueError(f"{name}[{ik}] must be a non-empty string, got {v!r}")
        out[ik] = v
    return out


def _as_int(name: str, v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    try:
        iv = int(v)
        ok = iv == v or (isinstance(v, str) and iv == int(v.strip()))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be an integer, got {v!r}")
    return iv


@dataclass
class SokobanEnvConfig:
    dim_room: Tuple[int, int] = (6, 6)          # (rows, cols), outer wall ring included
    max_steps: int = 100                        # env steps per episode (invalid actions count)
    num_boxes: int = 1
    search_depth: int = 300                     # RAGEN's: reverse play reaches search_depth - 2 moves deep
    grid_lookup: Dict[int, str] = field(default_factory=lambda: dict(DEFAULT_GRID_LOOKUP))
    grid_vocab: Dict[str, str] = field(default_factory=lambda: dict(DEFAULT_GRID_VOCAB))
    action_lookup: Dict[int, str] = field(default_factory=lambda: dict(DEFAULT_ACTION_LOOKUP))
    dim_x: Optional[int] = None                 # RAGEN: dim_room = (dim_x, dim_y) when both are set
    dim_y: Optional[int] = None
    render_mode: str = "text"
    observation_format: str = "grid"            # RAGEN's: grid | coord (board size, entity cells) | grid_coord
    format_penalty: float = -0.1                # reward of a malformed / unknown action
    action_sep: str = "||"                      # separator of several actions in one string
    max_actions_per_turn: int = 5               # at most this many actions of one string are run
    cell_sep: str = ""                          # text between the cells of a row ("" = one char per cell)
    p_change_directions: float = 0.35           # room topology random walk
    num_gen_steps: Optional[int] = None         # walk length; None = int(1.7 * (rows + cols))
    compute_optimal: bool = True                # solve each room at reset for info['optimal_steps']
    deadlock_penalty: float = 0.0               # not RAGEN's: added once to the reward of the push that leaves the room
                                                # unsolvable (a box that can no longer reach a target);
                                                # 0 = gym-sokoban's rewards
    end_on_deadlock: bool = False               # not RAGEN's: that push ends the episode (success unchanged: the room
                                                # could not be solved any more)
    distance_shaping: float = 0.0               # not RAGEN's: adds c * (d(s) - d(s')) to each step's reward, d = the
                                                # solver's moves left (the room's cell count once unsolvable); 0 = off

    def __post_init__(self) -> None:
        if (self.dim_x is None) != (self.dim_y is None):
            raise ValueError("set both dim_x and dim_y, or neither")
        if self.dim_x is not None:
            self.dim_room = (int(self.dim_x), int(self.dim_y))
        if isinstance(self.dim_room, (str, bytes)):
            raise ValueError(f"dim_room must be two integers, got {self.dim_room!r}")
        try:
            dim = tuple(self.dim_room)
        except TypeError:
            raise ValueError(f"dim_room must be two integers, got {self.dim_room!r}") from None
        if len(dim) != 2:
            raise ValueError(f"dim_room must be two integers (rows, cols), got {self.dim_room!r}")
        dim = tuple(_as_int("dim_room", v) for v in dim)
        for name in ("max_steps", "num_boxes", "search_depth", "max_actions_per_turn"):
            setattr(self, name, _as_int(name, getattr(self, name)))
        self.dim_room = validate_room_params(dim, self.num_boxes)
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.search_depth < 1:
            raise ValueError(f"search_depth must be >= 1, got {self.search_depth}")
        if self.max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn must be >= 1, got {self.max_actions_per_turn}")
        try:
            self.format_penalty = float(self.format_penalty)
            self.p_change_directions = float(self.p_change_directions)
            self.deadlock_penalty = float(self.deadlock_penalty)
            self.distance_shaping = float(self.distance_shaping)
        except (TypeError, ValueError):
            raise ValueError("format_penalty, p_change_directions, deadlock_penalty and distance_shaping must be "
                             "numbers") from None
        if not isinstance(self.end_on_deadlock, bool):
            raise ValueError(f"end_on_deadlock must be true or false, got {self.end_on_deadlock!r}")
        if not 0.0 <= self.p_change_directions <= 1.0:
            raise ValueError(f"p_change_directions must be in [0, 1], got {self.p_change_directions}")
        if self.num_gen_steps is not None:
            self.num_gen_steps = _as_int("num_gen_steps", self.num_gen_steps)
            if self.num_gen_steps < 1:
                raise ValueError(f"num_gen_steps must be >= 1, got {self.num_gen_steps}")
        self.grid_lookup = _int_keyed("grid_lookup", self.grid_lookup)
        missing = sorted(set(range(7)) - set(self.grid_lookup))
        if missing:
            raise ValueError(f"grid_lookup lacks id(s) {missing} (0 wall, 1 floor, 2 target, 3 box on "
                             f"target, 4 box, 5 player, 6 player on target)")
        if any("\n" in s for s in self.grid_lookup.values()):
            raise ValueError("grid_lookup symbols must not contain newlines")
        self.action_lookup = _int_keyed("action_lookup", self.action_lookup)
        bad = sorted(set(self.action_lookup) - set(ACTION_DELTAS))
        if bad or not self.action_lookup:
            raise ValueError(f"action_lookup ids must be a non-empty subset of 1 Up, 2 Down, 3 Left, "
                             f"4 Right; got {sorted(self.action_lookup)}")
        names = [v.strip().lower() for v in self.action_lookup.values()]
        if len(set(names)) != len(names) or any(n.isdigit() for n in names):
            raise ValueError(f"action names must be distinct and not numbers: {self.action_lookup}")
        if self.grid_vocab is not None:
            self.grid_vocab = dict(self.grid_vocab)
        if not isinstance(self.action_sep, str):
            raise ValueError(f"action_sep must be a string, got {self.action_sep!r}")
        if self.observation_format not in ("grid", "coord", "grid_coord"):
            raise ValueError(f"observation_format must be grid, coord or grid_coord, got {self.observation_format!r}")
        if not isinstance(self.cell_sep, str) or "\n" in self.cell_sep:
            raise ValueError(f"cell_sep must be a string without newlines, got {self.cell_sep!r}")
        if self.render_mode not in ("text", "ansi", "grid"):
            raise ValueError(f"render_mode must be 'text' (or 'ansi' / 'grid'), got {self.render_mode!r}")
        self.compute_optimal = bool(self.compute_optimal)
