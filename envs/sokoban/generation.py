"""Sokoban room generation by reverse play (the scheme of gym-sokoban, which RAGEN uses).

1. Topology: a random walk of ``num_steps`` steps (default ``int(1.7 * (rows + cols))``) inside the
   border; at each step the walk turns to a random direction with probability
   ``p_change_directions`` (0.35), moves one cell (clamped to the interior) and carves one of five
   small floor stamps around its position. The outer ring is always wall.
2. Placement: the player on a random floor cell, then ``num_boxes`` targets on other floor cells;
   every box starts on its target (the solved position).
3. Reverse play: a breadth-first search from the solved position in which the player moves or
   *pulls* a box it stands next to, for at most ``search_depth`` reverse steps. Every reached state
   with no box and no player on a target is a candidate, scored as
   ``(number of pulls on its path) * (sum of Manhattan distances of each box from its own target)``;
   the room is one of the best-scoring candidates (ties broken by the seeded stream). Playing the
   reverse path forwards solves the room, so every room is solvable, in at most as many steps as the
   candidate's depth.

If an attempt is degenerate (too few floor cells, or no candidate with a positive score), the next
attempt uses the derived seed ``(seed, attempt)``. Randomness is drawn only as raw 64-bit outputs of
``numpy.random.default_rng(seed)``'s PCG64 and mapped to ranges with integer arithmetic, so the same
seed gives the same room on any machine and numpy version.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from .room import FLOOR, OPPOSITE_ACTION, TARGET, to_arrays

# Floor stamps carved around the walker, as (d_row, d_col) offsets (same shapes as gym-sokoban).
_STAMPS: Tuple[Tuple[Tuple[int, int], ...], ...] = (
    ((0, -1), (0, 0), (0, 1)),             # horizontal bar
    ((-1, 0), (0, 0), (1, 0)),             # vertical bar
    ((0, -1), (0, 0), (1, 0)),             # corner left-down
    ((0, -1), (0, 0), (1, -1), (1, 0)),    # 2x2 block
    ((0, 0), (0, 1), (1, 0)),              # corner right-down
)
_WALK_DIRS = ((1, 0), (0, 1), (-1, 0), (0, -1))
_TWO64 = 1 << 64
MAX_REVERSE_STATES = 300_000  # as gym-sokoban: stop exploring after this many states


class GeneratedRoom(NamedTuple):
    """What :func:`generate_room` returns (unpacks like RAGEN's 4-tuple)."""
    room_fixed: np.ndarray        # 0 wall, 1 floor, 2 target
    room_state: np.ndarray        # 0 wall, 1 floor, 2 empty target, 3 box on target, 4 box, 5 player
    box_mapping: Dict[Tuple[int, int], Tuple[int, int]]  # target (row, col) -> its box's (row, col)
    action_sequence: List[int]    # a (not necessarily shortest) forward solution, action ids 1..4


@dataclass
class FlatRoom:
    rows: int
    cols: int
    fixed: bytearray              # WALL / FLOOR / TARGET per cell
    player: int
    boxes: Tuple[int, ...]        # box i started on targets[i]
    targets: Tuple[int, ...]
    solution: List[int]           # forward solution from the reverse path
    score: int
    attempt: int                  # 0 = first try with the plain seed


class _Stream:
    """Raw 64-bit outputs of ``default_rng(entropy)``, mapped with integer maths only."""

    __slots__ = ("_bg", "_buf", "_i")

    def __init__(self, entropy) -> None:
        self._bg = np.random.default_rng(entropy).bit_generator
        self._buf: List[int] = self._bg.random_raw(96).tolist()
        self._i = 0

    def raw(self) -> int:
        i = self._i
        if i >= len(self._buf):
            self._buf = self._bg.random_raw(96).tolist()
            i = 0
        self._i = i + 1
        return self._buf[i]

    def take(self, k: int) -> List[int]:
        """The next ``k`` raw values."""
        i = self._i
        if i + k > len(self._buf):
            self._buf = self._buf[i:] + self._bg.random_raw(max(96, k)).tolist()
            i = 0
        self._i = i + k
        return self._buf[i:i + k]

    def below(self, n: int) -> int:
        """Uniform integer in [0, n)."""
        return (self.raw() * n) >> 64


def normalize_seed(seed) -> int:
    """Any int-like seed -> a non-negative int accepted by ``numpy.random.default_rng``."""
    if seed is None:
        return int(np.random.SeedSequence().entropy)
    seed = int(seed)
    return seed if seed >= 0 else seed % (1 << 128)


def _topology(rows: int, cols: int, num_steps: int, p_change: float, rs: _Stream) -> bytearray:
    """Random-walk floor carving. Uses exactly ``3 + 3 * num_steps`` raw draws: start direction,
    row and column, then per step (turn?, new direction, stamp)."""
    floor = bytearray(rows * cols)
    thresh = int(p_change * _TWO64)
    draws = rs.take(3 + 3 * num_steps)
    d = _WALK_DIRS[(draws[0] * 4) >> 64]
    rmax, cmax = rows - 2, cols - 2
    r = 1 + ((draws[1] * rmax) >> 64)
    c = 1 + ((draws[2] * cmax) >> 64)
    stamps = _flat_stamps(cols)
    for j in range(3, 3 + 3 * num_steps, 3):
        if draws[j] < thresh:
            d = _WALK_DIRS[(draws[j + 1] * 4) >> 64]
        r += d[0]
        c += d[1]
        r = 1 if r < 1 else (rmax if r > rmax else r)
        c = 1 if c < 1 else (cmax if c > cmax else c)
        centre = r * cols + c
        for off in stamps[(draws[j + 2] * 5) >> 64]:
            floor[centre + off] = FLOOR
    last = (rows - 1) * cols
    for x in range(cols):
        floor[x] = 0
        floor[last + x] = 0
    for y in range(0, rows * cols, cols):
        floor[y] = 0
        floor[y + cols - 1] = 0
    return floor


_STAMP_CACHE: Dict[int, tuple] = {}
_RC_CACHE: Dict[Tuple[int, int], tuple] = {}


def _flat_stamps(cols: int) -> tuple:
    st = _STAMP_CACHE.get(cols)
    if st is None:
        st = _STAMP_CACHE[cols] = tuple(tuple(dr * cols + dc for dr, dc in stamp) for stamp in _STAMPS)
    return st


def _row_col(rows: int, cols: int) -> tuple:
    rc = _RC_CACHE.get((rows, cols))
    if rc is None:
        n = rows * cols
        rc = _RC_CACHE[(rows, cols)] = ([i // cols for i in range(n)], [i % cols for i in range(n)])
    return rc


def _reverse_play(rows: int, cols: int, fixed: bytearray, player: int, targets: Tuple[int, ...],
                  search_depth: int, cand_depth: int, rs: _Stream):
    """BFS over reverse moves from the solved position; returns (score, player, boxes, solution)."""
    n = rows * cols
    deltas = (-cols, cols, -1, 1)
    fwd_action = (OPPOSITE_ACTION[1], OPPOSITE_ACTION[2], OPPOSITE_ACTION[3], OPPOSITE_ACTION[4])
    tmask = 0
    for t in targets:
        tmask |= 1 << t
    R, C = _row_col(rows, cols)
    trc = [(R[t], C[t]) for t in targets]

    # a state: (player, box mask, boxes in target order, pulls, displacement, parent, forward action)
    states = [(player, tmask, targets, 0, 0, -1, 0)]
    seen = {tmask * n + player}
    best_score = 0
    best: List[int] = []
    frontier = [0]
    depth = 0
    limit = MAX_REVERSE_STATES
    append = states.append
    while frontier and depth < search_depth and len(states) < limit:
        depth += 1
        is_cand_depth = depth <= cand_depth
        nxt: List[int] = []
        for s in frontier:
            p, m, bx, pu, di, _, _ = states[s]
            for k in range(4):
                d = deltas[k]
                q = p + d
                if not fixed[q] or (m >> q) & 1:
                    continue
                key = m * n + q
                if key not in seen:  # plain move
                    seen.add(key)
                    idx = len(states)
                    append((q, m, bx, pu, di, s, fwd_action[k]))
                    nxt.append(idx)
                    if pu and is_cand_depth and not ((m | (1 << q)) & tmask):
                        sc = pu * di
                        if sc > best_score:
                            best_score, best = sc, [idx]
                        elif sc == best_score:
                            best.append(idx)
                b = p - d
                if (m >> b) & 1:  # pull the box behind the player onto the player's cell
                    m2 = m ^ (1 << b) ^ (1 << p)
                    key = m2 * n + q
                    if key in seen:
                        continue
                    seen.add(key)
                    i = bx.index(b)
                    tr, tc = trc[i]
                    di2 = di + abs(R[p] - tr) + abs(C[p] - tc) - abs(R[b] - tr) - abs(C[b] - tc)
                    idx = len(states)
                    append((q, m2, bx[:i] + (p,) + bx[i + 1:], pu + 1, di2, s, fwd_action[k]))
                    nxt.append(idx)
                    if is_cand_depth and not ((m2 | (1 << q)) & tmask):
                        sc = (pu + 1) * di2
                        if sc > best_score:
                            best_score, best = sc, [idx]
                        elif sc == best_score and sc:
                            best.append(idx)
        frontier = nxt
    if not best:
        return 0, -1, (), []
    c = best[rs.below(len(best))] if len(best) > 1 else best[0]
    solution = []  # forwards: undo the reverse moves until every box is back on a target
    x = c
    while states[x][5] >= 0:
        solution.append(states[x][6])
        x = states[x][5]
        if states[x][1] == tmask:
            break
    return best_score, states[c][0], states[c][2], solution


def validate_room_params(dim_room, num_boxes: int) -> Tuple[int, int]:
    try:
        rows, cols = (int(v) for v in dim_room)
    except (TypeError, ValueError):
        raise ValueError(f"dim_room must be two integers (rows, cols), got {dim_room!r}") from None
    if rows < 3 or cols < 3:
        raise ValueError(f"dim_room {rows}x{cols} is too small: each side needs >= 3 (a wall ring and a floor)")
    if max(rows, cols) < 5:
        raise ValueError(f"dim_room {rows}x{cols} is too small: one side needs >= 5 so a box can be moved")
    if int(num_boxes) < 1:
        raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
    if (rows - 2) * (cols - 2) < int(num_boxes) + 2:
        raise ValueError(f"dim_room {rows}x{cols} has {(rows - 2) * (cols - 2)} inner cells: too few for "
                         f"{num_boxes} box(es), the player and a free cell")
    return rows, cols


def generate_flat(dim_room=(6, 6), num_boxes: int = 1, search_depth: int = 300, seed=None,
                  p_change_directions: float = 0.35, num_steps: Optional[int] = None,
                  max_solution_steps: Optional[int] = None, max_attempts: int = 200) -> FlatRoom:
    """Generate a room in the flat representation (the fast path used by the env)."""
    rows, cols = validate_room_params(dim_room, num_boxes)
    num_boxes = int(num_boxes)
    if search_depth < 1:
        raise ValueError(f"search_depth must be >= 1, got {search_depth}")
    if not 0.0 <= p_change_directions <= 1.0:
        raise ValueError(f"p_change_directions must be in [0, 1], got {p_change_directions}")
    if num_steps is None:
        num_steps = int(1.7 * (rows + cols))
    cand_depth = search_depth if max_solution_steps is None else min(search_depth, int(max_solution_steps))
    seed = normalize_seed(seed)
    for attempt in range(max_attempts):
        rs = _Stream(seed if attempt == 0 else [seed, attempt])
        fixed = _topology(rows, cols, num_steps, p_change_directions, rs)
        cells = [i for i in range(rows * cols) if fixed[i]]
        if len(cells) <= num_boxes + 1:
            continue
        player = cells.pop(rs.below(len(cells)))
        targets = []
        for _ in range(num_boxes):
            t = cells.pop(rs.below(len(cells)))
            targets.append(t)
            fixed[t] = TARGET
        targets_t = tuple(targets)
        score, p, boxes, solution = _reverse_play(rows, cols, fixed, player, targets_t,
                                                  search_depth, cand_depth, rs)
        if score > 0:
            return FlatRoom(rows, cols, fixed, p, boxes, targets_t, solution, score, attempt)
    raise RuntimeError(f"no solvable {rows}x{cols} room with {num_boxes} box(es) found in {max_attempts} "
                       f"attempts (seed {seed}); the room is probably too small for that many boxes")


def generate_room(dim_room=(6, 6), num_boxes: int = 1, search_depth: int = 300, seed=None,
                  p_change_directions: float = 0.35, num_steps: Optional[int] = None,
                  max_solution_steps: Optional[int] = None, max_attempts: int = 200) -> GeneratedRoom:
    """Generate a solvable room; the same ``seed`` gives the same room on any machine.

    ``search_depth`` bounds the reverse play (in player steps); ``max_solution_steps`` additionally
    restricts the candidates to rooms solvable in that many steps (the env passes ``max_steps``).
    Returns :class:`GeneratedRoom` ``(room_fixed, room_state, box_mapping, action_sequence)``.
    """
    fr = generate_flat(dim_room, num_boxes, search_depth, seed, p_change_directions, num_steps,
                       max_solution_steps, max_attempts)
    room_fixed, room_state = to_arrays(fr.rows, fr.cols, fr.fixed, fr.player, fr.boxes)
    c = fr.cols
    mapping = {(t // c, t % c): (b // c, b % c) for t, b in zip(fr.targets, fr.boxes)}
    return GeneratedRoom(room_fixed, room_state, mapping, list(fr.solution))
