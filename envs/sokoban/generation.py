"""Sokoban room generation by reverse play, with the distribution of RAGEN's generator.

RAGEN (``ragen/env/sokoban/utils.py``, adapted from gym-sokoban) builds a room in four stages; this
module follows each stage's rules (so rooms are as hard as RAGEN's: mean optimal solution length
within 10% of RAGEN's at 6x6 / 1 box and 8x8 / 2 boxes, docs/sokoban.md) with its own code and
random stream:

1. Topology: a random walk of ``num_steps`` steps (default ``int(1.7 * (rows + cols))``) starting
   at a random cell with row in [1, rows-1] and column in [1, cols-1]; at each step the walk turns
   to a random direction with probability ``p_change_directions`` (0.35), moves one cell (clamped
   to the interior) and carves one of five small floor stamps around its position. The outer ring
   is always wall.
2. Placement: the player on a random floor cell, then ``num_boxes`` targets on other floor cells;
   every box starts on its target (the solved position).
3. Reverse play: a depth-first search from the solved position, trying the moves up, down, left,
   right in that order, in which the player moves onto a free cell and pulls a box it stands in
   front of. A state (player cell, box cells, and which boxes were ever pulled) is expanded once,
   when first reached; states deeper than ``search_depth - 2`` moves are not reached, and the search
   stops after 300,000 states. A state with no box and no player on a target scores ``(number of
   times the pulled box changed) * (sum of Manhattan distances of each box from its own target)``;
   the room is the first state reached with the highest score (a score of 0 tries a new topology).
4. Player shuffle: with probability 0.8 when the boxes' total displacement is 1, else 0.5, the
   player walks 1 to 3 steps onto free cells it has not stood on, going on after each step with
   probability 0.5.

Playing the shuffle back and the reverse path forwards solves the room, so every room is solvable.
If an attempt is degenerate (too few floor cells, or no candidate with a positive score), or its
solution is longer than ``max_solution_steps``, the next attempt uses the derived seed ``(seed,
attempt)``. Randomness is drawn only as raw 64-bit outputs of ``numpy.random.default_rng(seed)``'s
PCG64 and mapped to ranges with integer arithmetic, so the same seed gives the same room on any
machine and numpy version.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from .room import FLOOR, OPPOSITE_ACTION, TARGET, flat_deltas, to_arrays
from .solver import solve_flat

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
_P50, _P80 = _TWO64 // 2, (_TWO64 * 4) // 5
MAX_REVERSE_STATES = 300_000  # as RAGEN / gym-sokoban: stop exploring after this many states


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
    optimal: int = -1             # shortest solution length when generation had to compute it, else -1


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
    r = 1 + ((draws[1] * (rows - 1)) >> 64)  # as RAGEN: the start may be on the far wall row / column;
    c = 1 + ((draws[2] * (cols - 1)) >> 64)  # the first step clamps it inside
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
                  search_depth: int):
    """RAGEN's depth-first reverse play from the solved position (see the module docstring).

    Returns ``(score, player, boxes, displacement, solution)`` of the best state; score 0 means none.
    """
    n = rows * cols
    deltas = flat_deltas(cols)[1:]                    # RAGEN's order: up, down, left, right
    fwd_action = tuple(OPPOSITE_ACTION[a] for a in (1, 2, 3, 4))  # a reverse move is undone by the opposite
    tmask = 0
    for t in targets:
        tmask |= 1 << t
    R, C = _row_col(rows, cols)
    trc = [(R[t], C[t]) for t in targets]
    max_depth = search_depth - 2                      # RAGEN's ttl: the root is depth 0
    # moves from each cell, pushed in reverse so that up (RAGEN's first) is explored first:
    # (cell moved to, cell behind the player, forward action that undoes the move)
    moves: List[tuple] = [()] * n
    order = [(deltas[k], fwd_action[k]) for k in (3, 2, 1, 0)]
    for p in range(cols + 1, n - cols - 1):
        if fixed[p]:
            moves[p] = tuple([(p + d, p - d, f) for d, f in order if fixed[p + d]])
    # a stack entry: (state key, player, box mask, pulled-box mask, boxes in target order, swaps,
    #                 last pulled box, displacement, depth, parent node, forward action)
    stack = [(tmask * n + player, player, tmask, 0, targets, 0, -1, 0, 0, -1, 0)]
    seen = set()
    nodes: List[Tuple[int, int, int]] = []            # explored nodes: (parent node, forward action, box mask)
    best_score, best = 0, None
    pop, push, add, record = stack.pop, stack.append, seen.add, nodes.append
    idx = -1
    while stack:
        entry = pop()
        key, p, m, mp, bx, sw, li, di, depth, parent, act = entry
        if key in seen:  # a state is expanded once, when first reached
            continue
        add(key)
        idx += 1
        record((parent, act, m))
        if sw and not ((m | (1 << p)) & tmask):
            sc = sw * di
            if sc > best_score:
                best_score, best = sc, (idx, entry)
        if idx + 1 >= MAX_REVERSE_STATES:
            break
        if depth >= max_depth:
            continue
        d1 = depth + 1
        for q, b, fwd in moves[p]:
            if (m >> q) & 1:
                continue
            if (m >> b) & 1:                          # pull the box behind the player onto the player's cell
                m2 = m ^ (1 << b) ^ (1 << p)
                mp2 = (mp & ~(1 << b)) | (1 << p)
                k2 = ((mp2 << n | m2) * n) + q
                if k2 in seen:
                    continue
                i = bx.index(b)
                tr, tc = trc[i]
                push((k2, q, m2, mp2, bx[:i] + (p,) + bx[i + 1:], sw + (i != li), i,
                      di + abs(R[p] - tr) + abs(C[p] - tc) - abs(R[b] - tr) - abs(C[b] - tc), d1, idx, fwd))
            else:
                k2 = ((mp << n | m) * n) + q
                if k2 not in seen:
                    push((k2, q, m, mp, bx, sw, li, di, d1, idx, fwd))
    if best is None:
        return 0, -1, (), 0, []
    idx, (_, p, _, _, bx, _, _, di, _, _, _) = best
    solution = []  # forwards: undo the reverse moves until every box is back on a target
    x = idx
    while nodes[x][2] != tmask:
        solution.append(nodes[x][1])
        x = nodes[x][0]
    return best_score, p, bx, di, solution


def _random_walk(fixed: bytearray, cols: int, player: int, boxes: Tuple[int, ...], displacement: int,
                 rs: _Stream) -> Tuple[int, List[int]]:
    """RAGEN's player shuffle after reverse play: with probability 0.8 (box displacement 1) or 0.5,
    1 to 3 steps onto free cells not visited before, going on after each with probability 0.5.
    Returns the new player cell and the actions that walk it back."""
    if rs.raw() >= (_P80 if displacement == 1 else _P50):
        return player, []
    deltas = flat_deltas(cols)[1:]
    visited = [player]
    back: List[int] = []
    for _ in range(3):
        moves = [k for k in range(4) if fixed[player + deltas[k]] and player + deltas[k] not in boxes
                 and player + deltas[k] not in visited]
        if not moves:
            break
        k = moves[rs.below(len(moves))]
        player += deltas[k]
        visited.append(player)
        back.append(OPPOSITE_ACTION[k + 1])
        if len(back) == 3 or rs.raw() >= _P50:
            break
    back.reverse()
    return player, back


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
        score, p, boxes, disp, solution = _reverse_play(rows, cols, fixed, player, targets_t, search_depth)
        if score <= 0:
            continue
        p, back = _random_walk(fixed, cols, p, boxes, disp, rs)
        solution = back + solution
        optimal = -1
        if max_solution_steps is not None and len(solution) > max_solution_steps:
            plan = solve_flat(rows, cols, fixed, p, set(boxes), max_depth=int(max_solution_steps))
            if plan is None:
                continue
            optimal = len(plan)
        return FlatRoom(rows, cols, fixed, p, boxes, targets_t, solution, score, attempt, optimal)
    raise RuntimeError(f"no solvable {rows}x{cols} room with {num_boxes} box(es) found in {max_attempts} "
                       f"attempts (seed {seed}); the room is probably too small for that many boxes")


def generate_room(dim_room=(6, 6), num_boxes: int = 1, search_depth: int = 300, seed=None,
                  p_change_directions: float = 0.35, num_steps: Optional[int] = None,
                  max_solution_steps: Optional[int] = None, max_attempts: int = 200) -> GeneratedRoom:
    """Generate a solvable room; the same ``seed`` gives the same room on any machine.

    ``search_depth`` is RAGEN's: the reverse play reaches states at most ``search_depth - 2`` moves
    deep. ``max_solution_steps`` rejects rooms with no solution of at most that many steps (the env
    passes ``max_steps``); a room whose generated solution is short enough is never solved here.
    Returns :class:`GeneratedRoom` ``(room_fixed, room_state, box_mapping, action_sequence)``.
    """
    fr = generate_flat(dim_room, num_boxes, search_depth, seed, p_change_directions, num_steps,
                       max_solution_steps, max_attempts)
    room_fixed, room_state = to_arrays(fr.rows, fr.cols, fr.fixed, fr.player, fr.boxes)
    c = fr.cols
    mapping = {(t // c, t % c): (b // c, b % c) for t, b in zip(fr.targets, fr.boxes)}
    return GeneratedRoom(room_fixed, room_state, mapping, list(fr.solution))
