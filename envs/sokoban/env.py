"""``SokobanEnv``: RAGEN's text Sokoban (reset/step/render on a grid of symbols)."""
from __future__ import annotations

import copy as _copy
import numbers
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..base import BaseDiscreteActionEnv, EpisodeStatus, check_seed, config_from
from .config import SokobanEnvConfig
from .generation import generate_flat, normalize_seed
from .room import (
    BOX, BOX_ON_TARGET, DEFAULT_ACTION_LOOKUP, DEFAULT_GRID_LOOKUP, PLAYER,
    PLAYER_ON_TARGET, TARGET, flat_deltas, from_arrays, has_wall_border, to_arrays,
)
from .solver import solve_flat


def build_instruction(config: SokobanEnvConfig) -> str:
    """A short statement of the rules, symbols and action words, for an LLM system prompt."""
    g = config.grid_lookup
    names = [config.action_lookup[k] for k in sorted(config.action_lookup)]
    sym = lambda i: g[i].strip() or repr(g[i])  # noqa: E731
    example = f" {config.action_sep} ".join([names[0], names[-1]]) if config.action_sep else names[0]
    many = (f" You may give up to {config.max_actions_per_turn} actions in one answer, separated by "
            f"{config.action_sep!r}, e.g. {example}." if config.action_sep and config.max_actions_per_turn > 1 else "")
    return (
        "You are playing Sokoban. You are the player on a grid and must push every box onto a target. "
        f"Symbols: {sym(0)} wall, {sym(1)} floor, {sym(2)} target, {sym(4)} box, {sym(3)} box on a target, "
        f"{sym(5)} you, {sym(6)} you standing on a target. "
        "Walking into a box pushes it one cell the same way, but only if the cell beyond it is floor or a "
        "target; you cannot pull boxes, push two boxes at once, or walk through walls. A box pushed into "
        "a corner can never be moved out again, so plan ahead. "
        f"Valid actions: {', '.join(names)}.{many}"
        + ("" if config.observation_format == "grid" else
           " The state lists the zero-indexed (row, column) cells of the targets, boxes and player, "
           "row 0 being the top wall row and column 0 the left wall column.")
    )


class SokobanEnv(EpisodeStatus, BaseDiscreteActionEnv):
    """RAGEN-compatible Sokoban with a text observation (rows joined by newlines, one symbol per cell).

    Rewards as gym-sokoban / RAGEN: -0.1 per step, +1 when the number of boxes on targets rose since
    the last step, -1 when it fell, +10 more when every box is on a target (the episode then ends).
    As in RAGEN that count starts at 0 at reset, so boxes already on a target are paid (+1, and +10
    with success if all are) on the first step, and no episode ends at reset. A malformed or
    unknown action changes nothing, costs ``config.format_penalty`` and reports
    ``info['action_is_valid'] = False``. Every call to :meth:`step` (valid or not) counts towards
    ``max_steps``. A string holding ``config.action_sep`` is run as several actions (at most
    ``config.max_actions_per_turn``): rewards are summed, ``action_is_valid`` is true only if every
    one was valid, ``action_is_effective`` if any moved the player.
    """

    GRID_LOOKUP: Dict[int, str] = dict(DEFAULT_GRID_LOOKUP)
    ACTION_LOOKUP: Dict[int, str] = dict(DEFAULT_ACTION_LOOKUP)
    INVALID_ACTION = 0
    PENALTY_FOR_STEP = -0.1
    PENALTY_BOX_OFF_TARGET = -1.0
    REWARD_BOX_ON_TARGET = 1.0
    REWARD_FINISHED = 10.0
    INSTRUCTION: str = build_instruction(SokobanEnvConfig())

    def __init__(self, config: SokobanEnvConfig | Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        config = config_from(SokobanEnvConfig, config, kwargs)
        super().__init__(config)
        self.config: SokobanEnvConfig = config
        self.GRID_LOOKUP = dict(config.grid_lookup)
        self.ACTION_LOOKUP = dict(config.action_lookup)
        self.dim_room: Tuple[int, int] = tuple(config.dim_room)
        self.max_steps = config.max_steps
        self.num_boxes = config.num_boxes
        self.search_depth = config.search_depth
        self.render_mode = config.render_mode
        self._format_penalty = config.format_penalty
        self._deadlock_penalty = float(config.deadlock_penalty)
        self._end_on_deadlock = config.end_on_deadlock
        self._shaping = float(config.distance_shaping)
        self._check_dead = bool(self._deadlock_penalty or self._end_on_deadlock or self._shaping)
        self._sep = config.action_sep
        self._max_actions = config.max_actions_per_turn
        self._valid_ids = frozenset(config.action_lookup)
        self._name_to_id: Dict[str, int] = {}
        for k, v in config.action_lookup.items():
            self._name_to_id[v.strip().lower()] = k
            self._name_to_id[str(k)] = k
        self._instruction = build_instruction(config)
        self._sym_cache: Dict[Tuple[int, int], list] = {}
        self.seed: Optional[int] = None
        self._rows = 0
        self._player = -1
        self._boxes: set = set()
        self._done = True
        self._success = False
        self._steps = 0
        self._on = 0
        self._paid = 0
        self._dead = False
        self._dist = 0
        self._targets: List[int] = []
        self._nb = 0
        self._optimal = -1
        self.reward_last = 0.0
        self._obs = ""

    # ------------------------------------------------------------------ episode setup
    @property
    def instruction(self) -> str:
        return self._instruction

    def reset(self, seed: int | None = None, mode: str | None = None) -> str:
        """New room from ``seed`` (same seed, same room on any machine); returns the grid text."""
        cfg = self.config
        seed = normalize_seed(check_seed(seed))
        fr = generate_flat(cfg.dim_room, cfg.num_boxes, cfg.search_depth, seed, cfg.p_change_directions,
                           cfg.num_gen_steps, max_solution_steps=cfg.max_steps)
        self.seed = seed
        self._load(fr.rows, fr.cols, fr.fixed, fr.player, fr.boxes, fr.optimal)
        return self._obs

    def set_room(self, room_fixed, room_state=None) -> str:
        """Start an episode on a given room (RAGEN arrays, or text: see ``room.text_to_grid``)."""
        if isinstance(room_fixed, str) and room_state is None:
            from .room import text_to_grid
            room_fixed, room_state = text_to_grid(room_fixed, self.config.grid_lookup, self.config.cell_sep)
        rows, cols, fixed, player, boxes = from_arrays(room_fixed, room_state)
        if not has_wall_border(rows, cols, fixed):
            raise ValueError("the room's outer ring must be walls")
        n_targets = sum(1 for v in fixed if v == TARGET)
        if not boxes or n_targets < len(boxes):
            raise ValueError(f"need >= 1 box and at least as many targets ({n_targets}) as boxes ({len(boxes)})")
        self.seed = None
        self._load(rows, cols, fixed, player, boxes)
        return self._obs

    def _cell_symbols(self, rows: int, cols: int) -> list:
        key = (rows, cols)
        cs = self._sym_cache.get(key)
        if cs is None:
            g = self.config.grid_lookup
            sep = self.config.cell_sep
            mid = tuple(g[i] + sep for i in range(7))
            end = tuple(g[i] + "\n" for i in range(7))
            last = tuple(g[i] for i in range(7))
            cs = [(last if r == rows - 1 else end) if c == cols - 1 else mid
                  for r in range(rows) for c in range(cols)]
            self._sym_cache[key] = cs
        return cs

    def _load(self, rows: int, cols: int, fixed: bytearray, player: int, boxes, optimal: int = -1) -> None:
        self._rows, self._cols = rows, cols
        self.dim_room = (rows, cols)
        self._fixed = fixed
        self._deltas = flat_deltas(cols)
        self._cs = cs = self._cell_symbols(rows, cols)
        self._base = [cs[i][fixed[i]] for i in range(rows * cols)]
        self._player = player
        self._boxes = set(boxes)
        self._nb = len(self._boxes)
        self.num_boxes = self._nb
        self._on = sum(1 for b in self._boxes if fixed[b] == TARGET)
        # RAGEN's rule: the counter of boxes on targets starts at 0 whatever the room, and an episode
        # never ends at reset; the first step pays +1 for boxes already on targets (and +10 if all are)
        self._paid = 0
        self._dead = False
        self._steps = 0
        self._targets = [i for i, v in enumerate(fixed) if v == TARGET]
        self._success = False
        self._done = False
        self.reward_last = 0.0
        self._optimal = optimal
        if optimal < 0 and (self.config.compute_optimal or self._shaping):
            sol = solve_flat(rows, cols, fixed, player, self._boxes)
            self._optimal = -1 if sol is None else len(sol)
        self._dist = self._optimal if self._optimal >= 0 else rows * cols  # distance_shaping's d(s)
        self._obs = self._observe()

    # ------------------------------------------------------------------ stepping
    def parse_action(self, action: Any) -> int:
        """Action id (1..4) of an int / numeric string / name (case and spaces ignored); 0 if invalid."""
        t = type(action)
        if t is int:
            return action if action in self._valid_ids else 0
        if t is str or isinstance(action, str):
            return self._name_to_id.get(action.strip().lower(), 0)
        if isinstance(action, bytes):
            return self._name_to_id.get(action.decode("utf-8", "replace").strip().lower(), 0)
        if isinstance(action, numbers.Integral) and not isinstance(action, (bool, np.bool_)):
            a = int(action)
            return a if a in self._valid_ids else 0
        return 0

    def parse_actions(self, text: str) -> List[int]:
        """Split ``text`` on ``action_sep`` (at most ``max_actions_per_turn`` parts) into action ids."""
        parts = text.split(self._sep) if self._sep else [text]
        return [self.parse_action(p) for p in parts[: self._max_actions]]

    def step(self, action: Any):
        if type(action) is str and self._sep and self._sep in action:
            return self._step_many(action)
        return self._step_id(self.parse_action(action))

    def _step_many(self, text: str):
        total = 0.0
        valid = True
        effective = False
        n = 0
        done = self._done
        info: Dict[str, Any] = {}
        for a in self.parse_actions(text):
            _, r, done, info = self._step_id(a)
            total += r
            valid = valid and info["action_is_valid"]
            effective = effective or info["action_is_effective"]
            n += 1
            if done:
                break
        info = {"success": self._success, "action_is_valid": valid, "action_is_effective": effective,
                "optimal_steps": self._optimal, "num_actions": n}
        self.reward_last = total
        return self._obs, total, done, info

    def _step_id(self, a: int):
        if self._done:  # episode over (or never reset): nothing moves, nothing is paid
            if self._rows == 0:
                raise RuntimeError("call reset() before step()")
            return self._obs, 0.0, True, {"success": self._success, "action_is_valid": a != 0,
                                          "action_is_effective": False, "optimal_steps": self._optimal}
        self._steps += 1
        moved = pushed = False
        if a == 0:
            reward = self._format_penalty
        else:
            reward = self.PENALTY_FOR_STEP
            d = self._deltas[a]
            p = self._player
            q = p + d
            fixed = self._fixed
            if fixed[q]:
                boxes = self._boxes
                if q in boxes:
                    r = q + d
                    if fixed[r] and r not in boxes:
                        boxes.remove(q)
                        boxes.add(r)
                        self._on += (fixed[r] == TARGET) - (fixed[q] == TARGET)
                        self._player = q
                        moved = pushed = True
                else:
                    self._player = q
                    moved = True
            if moved:
                self._obs = self._observe()
                # only a push can make the room unsolvable, and nothing makes it solvable again
                if self._check_dead and not self._dead and (pushed or self._shaping):
                    sol = [] if self._on == self._nb else solve_flat(self._rows, self._cols, fixed, q, self._boxes)
                    if sol is None:
                        self._dead = True  # paid once: later pushes cannot make it more unsolvable
                        reward += self._deadlock_penalty
                        dist = self._rows * self._cols
                    else:
                        dist = len(sol)
                    if self._shaping:
                        reward += self._shaping * (self._dist - dist)
                        self._dist = dist
        on = self._on
        if on != self._paid:  # gym-sokoban's count: +1 when it rises, -1 when it falls, from the last step's
            reward += self.REWARD_BOX_ON_TARGET if on > self._paid else self.PENALTY_BOX_OFF_TARGET
            self._paid = on
        if on == self._nb:
            reward += self.REWARD_FINISHED
            self._success = True
        done = self._success or self._steps >= self.max_steps or (self._dead and self._end_on_deadlock)
        self._done = done
        self.reward_last = reward
        return self._obs, reward, done, {"success": self._success, "action_is_valid": a != 0,
                                         "action_is_effective": moved, "optimal_steps": self._optimal}

    # ------------------------------------------------------------------ views
    def _render(self, cs=None, base=None) -> str:
        cs = cs or self._cs
        pieces = list(base or self._base)
        fixed = self._fixed
        for b in self._boxes:
            pieces[b] = cs[b][BOX_ON_TARGET if fixed[b] == TARGET else BOX]
        p = self._player
        pieces[p] = cs[p][PLAYER_ON_TARGET if fixed[p] == TARGET else PLAYER]
        return "".join(pieces)

    def _observe(self) -> str:
        """The observation in ``config.observation_format`` (RAGEN's grid / coord / grid_coord)."""
        fmt = self.config.observation_format
        if fmt == "grid":
            return self._render()
        cols = self._cols
        fixed = self._fixed
        on = sorted(b for b in self._boxes if fixed[b] == TARGET)
        off = sorted(b for b in self._boxes if fixed[b] != TARGET)
        p = self._player
        lines = [f"Board size: {self._rows} rows x {cols} cols (zero-indexed)."]
        for label, cells in (("Targets", self._targets), ("Boxes", off), ("Boxes on target", on),
                             ("Player", [] if fixed[p] == TARGET else [p]),
                             ("Player on target", [p] if fixed[p] == TARGET else [])):
            if cells:
                lines.append(f"{label}: " + ", ".join(f"({c // cols}, {c % cols})" for c in cells))
        coords = "\n".join(lines)
        return coords if fmt == "coord" else "Coordinates: \n" + coords + "\nGrid Map: \n" + self._render()

    def render(self, mode: str | None = "text") -> str:
        """``text`` / ``ansi`` / ``grid``: the observation; ``spaced``: cells separated by spaces."""
        if self._rows == 0:
            raise RuntimeError("call reset() before render()")
        if mode in (None, "text", "ansi", "grid"):
            return self._obs
        if mode in ("spaced", "tokens"):
            g = self.config.grid_lookup
            rows, cols = self._rows, self._cols
            cs = [tuple(g[i] + ("\n" if c == cols - 1 and r < rows - 1 else (" " if c < cols - 1 else ""))
                        for i in range(7)) for r in range(rows) for c in range(cols)]
            return self._render(cs, [cs[i][self._fixed[i]] for i in range(rows * cols)])
        raise ValueError(f"unsupported render mode {mode!r}; use 'text' or 'spaced'")

    def get_all_actions(self) -> List[int]:
        return sorted(self.ACTION_LOOKUP)

    def close(self) -> None:
        self._sym_cache = {}

    def solve(self, max_depth: Optional[int] = None, max_nodes: Optional[int] = None) -> Optional[List[int]]:
        """Shortest action-id sequence from the current state (None if unsolvable)."""
        if self._rows == 0:
            raise RuntimeError("call reset() before solve()")
        kw = {} if max_nodes is None else {"max_nodes": max_nodes}
        return solve_flat(self._rows, self._cols, self._fixed, self._player, self._boxes,
                          max_depth=max_depth, **kw)

    def copy(self) -> "SokobanEnv":
        """An independent env in the same state (for search / tree rollouts)."""
        new = _copy.copy(self)
        new._boxes = set(self._boxes)
        return new

    def get_state(self) -> tuple:
        return (self._player, frozenset(self._boxes), self._steps, self._on, self._paid, self._done, self._success,
                self.reward_last, self._obs, self._dead, self._dist)

    def set_state(self, state: tuple) -> None:
        (self._player, boxes, self._steps, self._on, self._paid, self._done, self._success,
         self.reward_last, self._obs, self._dead, self._dist) = state
        self._boxes = set(boxes)

    # RAGEN / gym-sokoban attribute names
    @property
    def room_fixed(self) -> np.ndarray:
        return to_arrays(self._rows, self._cols, self._fixed, self._player, ())[0]

    @property
    def room_state(self) -> np.ndarray:
        return to_arrays(self._rows, self._cols, self._fixed, self._player, self._boxes)[1]

    @property
    def player_position(self) -> np.ndarray:
        return np.array(divmod(self._player, self._cols))

    @property
    def num_env_steps(self) -> int:
        return self._steps

    @property
    def boxes_on_target(self) -> int:
        """RAGEN's counter: boxes on targets as of the last step (0 right after reset)."""
        return self._paid

    @property
    def optimal_steps(self) -> int:
        """Length of the shortest solution from the reset state (-1 if not computed)."""
        return self._optimal


__all__ = ["SokobanEnv", "build_instruction"]
