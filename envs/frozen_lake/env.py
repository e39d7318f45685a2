"""``FrozenLakeEnv``: RAGEN's text FrozenLake, on gymnasium's FrozenLake dynamics.

Each reset draws a ``size x size`` map from the seed (RAGEN's rule: cells frozen with probability ``p``, a start
and a different goal, redrawn until the goal can be reached from the start without crossing a hole), then runs
gymnasium's ``FrozenLakeEnv`` on it, seeded with the same seed. So a seed gives RAGEN's map, RAGEN's slips and
RAGEN's observation text. Reward 1 on reaching the goal, 0 otherwise; the episode ends in a hole or on the goal.
"""
from __future__ import annotations

import copy as _copy
import numbers
from collections import deque
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.utils import seeding

from ..base import BaseDiscreteActionEnv, check_seed, config_from
from .config import FrozenLakeEnvConfig

GYM_MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}  # gymnasium's left, down, right, up as (drow, dcol)


def goal_reachable(board: np.ndarray) -> bool:
    """Whether a 4-neighbour walk from ``S`` reaches ``G`` without entering an ``H`` cell."""
    rows, cols = board.shape
    start = tuple(int(x) for x in np.argwhere(board == "S")[0])
    seen, todo = {start}, [start]
    while todo:
        r, c = todo.pop()
        for dr, dc in GYM_MOVES.values():
            q = (r + dr, c + dc)
            if 0 <= q[0] < rows and 0 <= q[1] < cols and q not in seen:
                if board[q] == "G":
                    return True
                if board[q] != "H":
                    seen.add(q)
                    todo.append(q)
    return False


def generate_map(size: int, p: float, seed: Optional[int]) -> List[str]:
    """RAGEN's random map for ``seed``: rows of ``S`` start, ``F`` frozen, ``H`` hole, ``G`` goal.

    Draw order (gymnasium's generator on ``seed``): the frozen/hole cells, the start cell, the goal cell; the whole
    draw repeats while start and goal coincide or the goal cannot be reached."""
    rng, _ = seeding.np_random(seed)
    while True:
        board = np.array(["F", "H"])[rng.choice(2, (size, size), p=[p, 1 - p])]
        start = tuple(rng.integers(size, size=2))
        goal = tuple(rng.integers(size, size=2))
        if start == goal:
            continue
        board[start], board[goal] = "S", "G"
        if goal_reachable(board):
            return ["".join(row) for row in board]


class FrozenLakeEnv(BaseDiscreteActionEnv):
    """RAGEN-compatible FrozenLake with a text observation (rows of symbols, or coordinates).

    ``step`` takes an action id (1 Left, 2 Down, 3 Right, 4 Up by default), its name or its id as text (case and
    spaces ignored). Anything else is an invalid move: nothing moves, no random draw is spent, it costs
    ``config.format_penalty`` and ``info['action_is_valid']`` is false (RAGEN's class raises instead).
    ``action_is_effective`` is true when the player's cell changed (a slip into a wall changes nothing).
    There is no step limit of its own: the trajectory's action budget (``max_actions_per_traj``) ends it.
    """

    GRID_LOOKUP: Dict[int, str] = {}
    ACTION_LOOKUP: Dict[int, str] = {}
    INVALID_ACTION = 0

    def __init__(self, config: FrozenLakeEnvConfig | Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        config = config_from(FrozenLakeEnvConfig, config, kwargs, copy=True)  # a copy: reset writes into it
        super().__init__(config)
        self.config: FrozenLakeEnvConfig = config
        self.GRID_LOOKUP = dict(config.grid_lookup)
        self.ACTION_LOOKUP = dict(config.action_lookup)
        self._names = {name.strip().lower(): k for k, name in config.action_lookup.items()}
        self._names.update({str(k): k for k in config.action_lookup})
        self._gym: Optional[GymFrozenLake] = None
        self._done = True

    @property
    def instruction(self) -> str:
        g = self.config.grid_lookup
        names = [self.config.action_lookup[k] for k in sorted(self.config.action_lookup)]
        return ("You are playing FrozenLake: walk from your cell to the goal without falling into a hole. The ice is "
                "slippery: a move may take you to one side of the way you chose. "
                f"Symbols: {g[0]} you, {g[1]} frozen floor, {g[2]} hole, {g[3]} goal, {g[4]} you in a hole, "
                f"{g[5]} you on the goal. Valid actions: {', '.join(names)}.")

    # ------------------------------------------------------------------ episode
    def reset(self, seed: int | None = None, mode: str | None = None) -> str:
        """New map from ``seed`` and gymnasium's generator seeded with it; returns the observation."""
        seed = check_seed(seed)
        cfg = self.config
        cfg.map_seed = seed
        self._gym = GymFrozenLake(desc=generate_map(cfg.size, cfg.p, seed), is_slippery=cfg.is_slippery,
                                  success_rate=cfg.success_rate)
        self._gym.reset(seed=seed)
        self._done = False
        return self.render()

    def parse_action(self, action: Any) -> int:
        """Action id of an int / numpy integer / name / id as text; 0 if it names no action."""
        if isinstance(action, bytes):
            action = action.decode("utf-8", "replace")
        if isinstance(action, str):
            return self._names.get(action.strip().lower(), 0)
        if isinstance(action, numbers.Integral) and not isinstance(action, bool):
            return int(action) if int(action) in self.config.action_map else 0
        return 0

    def step(self, action: Any):
        if self._gym is None:
            raise RuntimeError("call reset() before step()")
        a = self.parse_action(action)
        if a == 0:
            reward = 0.0 if self._done else float(self.config.format_penalty)
            return self.render(), reward, self._done, {"success": self.success, "action_is_valid": False,
                                                       "action_is_effective": False}
        before = int(self._gym.s)
        _, r, terminated, _, _ = self._gym.step(self.config.action_map[a])
        self._done = bool(terminated)
        return self.render(), float(r), self._done, {"success": self.success, "action_is_valid": True,
                                                     "action_is_effective": before != int(self._gym.s)}

    # ------------------------------------------------------------------ views
    @property
    def desc(self) -> np.ndarray:
        """The map as gymnasium holds it (bytes, ``S F H G``)."""
        return self._gym.desc

    @property
    def player_pos(self) -> Tuple[int, int]:
        return divmod(int(self._gym.s), int(self._gym.ncol))

    @property
    def success(self) -> bool:
        return self._gym is not None and self._gym.desc[self.player_pos] == b"G"

    @property
    def done(self) -> bool:
        return self._done

    def _grid(self) -> str:
        g = self.config.grid_lookup
        code = {b"S": 1, b"F": 1, b"H": 2, b"G": 3}
        rows = [[code[bytes(x)] for x in row] for row in self._gym.desc]
        r, c = self.player_pos
        rows[r][c] = {2: 4, 3: 5}.get(rows[r][c], 0)
        return "\n".join("".join(g.get(x, "?") for x in row) for row in rows)

    def _coords(self) -> str:
        desc = self._gym.desc
        cells = lambda ch: [(int(r), int(c)) for r, c in np.argwhere(desc == ch)]  # noqa: E731
        pos = self.player_pos
        here = bytes(desc[pos])
        player_label = {b"G": "Player on goal", b"H": "Player in hole"}.get(here, "Player")
        rows, cols = desc.shape
        lines = [f"Board size: {rows} rows x {cols} cols (zero-indexed)."]
        for label, where in (("Start", cells(b"S")), ("Goal", cells(b"G")), ("Player", [pos]),
                             ("Player on goal", [pos]), ("Player in hole", [pos]), ("Holes", cells(b"H"))):
            if label.startswith("Player") and label != player_label:
                continue
            if where:
                lines.append(f"{label}: " + ", ".join(f"({r}, {c})" for r, c in where))
        return "\n".join(lines)

    def render(self, mode: str | None = None) -> str:
        """The observation in ``config.observation_format``, or in ``mode`` (grid | coord | grid_coord)."""
        if self._gym is None:
            raise RuntimeError("call reset() before render()")
        fmt = mode if mode in ("grid", "coord", "grid_coord") else self.config.observation_format
        if mode not in (None, "text", "ansi", "grid", "coord", "grid_coord"):
            raise ValueError(f"unsupported render mode {mode!r}; use text, grid, coord or grid_coord")
        if fmt == "grid":
            return self._grid()
        if fmt == "coord":
            return self._coords()
        return "Coordinates: \n" + self._coords() + "\nGrid Map: \n" + self._grid()

    def get_all_actions(self) -> List[int]:
        return sorted(self.ACTION_LOOKUP)

    def solve(self) -> Optional[List[int]]:
        """A shortest walk (action ids) from the player's cell to the goal around the holes, as if the ice held
        (replan after a slip); [] on the goal, None in a hole."""
        if self._gym is None:
            raise RuntimeError("call reset() before solve()")
        desc = self._gym.desc
        rows, cols = desc.shape
        start = self.player_pos
        if desc[start] == b"G":
            return []
        if desc[start] == b"H":
            return None
        moves = [(k, GYM_MOVES[self.config.action_map[k]]) for k in sorted(self.config.action_map)]
        prev: Dict[Tuple[int, int], Tuple[Tuple[int, int], int]] = {start: (start, 0)}
        todo = deque([start])
        while todo:
            cell = todo.popleft()
            for k, (dr, dc) in moves:
                q = (cell[0] + dr, cell[1] + dc)
                if 0 <= q[0] < rows and 0 <= q[1] < cols and q not in prev and desc[q] != b"H":
                    prev[q] = (cell, k)
                    if desc[q] == b"G":
                        path = []
                        while q != start:
                            q, k = prev[q]
                            path.append(k)
                        return path[::-1]
                    todo.append(q)
        return None

    def copy(self) -> "FrozenLakeEnv":
        """An independent env in the same state (its random generator too)."""
        return _copy.deepcopy(self)

    def get_state(self) -> tuple:
        g = self._gym
        return (tuple(bytes(b"".join(row)).decode() for row in g.desc), int(g.s), g.lastaction,
                _copy.deepcopy(g.np_random.bit_generator.state), self._done, self.config.map_seed)

    def set_state(self, state: tuple) -> None:
        rows, s, last, rng_state, self._done, self.config.map_seed = state
        if self._gym is None or tuple(bytes(b"".join(r)).decode() for r in self._gym.desc) != tuple(rows):
            self._gym = GymFrozenLake(desc=list(rows), is_slippery=self.config.is_slippery,
                                      success_rate=self.config.success_rate)
            self._gym.reset(seed=0)
        self._gym.s, self._gym.lastaction = s, last
        self._gym.np_random.bit_generator.state = rng_state

    def close(self) -> None:
        pass


__all__ = ["FrozenLakeEnv", "generate_map", "goal_reachable"]
