"""Optimal Sokoban solver: A* over (player cell, box cells) states, counting player steps.

The heuristic is the sum over boxes of the box's push distance to the nearest target, with the
player and the other boxes ignored (computed once per room by a backwards search from the
targets). A step changes at most one box's distance by at most one, so the heuristic is consistent
and the first goal taken off the queue is a shortest solution. Cells from which a box can never
reach a target (dead squares: most corners and wall edges without a target) are the cells that
backwards search never reaches; pushes onto them are pruned.
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

import numpy as np

from .room import TARGET, flat_deltas, from_arrays, has_wall_border, pad_with_walls

DEFAULT_MAX_NODES = 2_000_000


def push_distances(cols: int, fixed: Sequence[int]) -> List[int]:
    """Fewest pushes to move a lone box from each cell to any target (-1: dead square or wall)."""
    n = len(fixed)
    dist = [-1] * n
    queue = [i for i in range(n) if fixed[i] == TARGET]
    for t in queue:
        dist[t] = 0
    deltas = flat_deltas(cols)[1:]  # up, down, left, right
    for x in queue:  # the list grows while iterating: a plain FIFO
        dx = dist[x] + 1
        for d in deltas:
            y = x - d          # the box came from y ...
            if fixed[y] and dist[y] < 0 and fixed[y - d]:  # ... pushed by a player standing at y - d
                dist[y] = dx
                queue.append(y)
    return dist


def dead_squares(room_fixed) -> np.ndarray:
    """Boolean array: floor cells from which a box can never be pushed onto any target."""
    fx = np.asarray(room_fixed, dtype=np.int64)
    if fx.ndim != 2:
        raise ValueError(f"room_fixed must be 2-D, got shape {fx.shape}")
    rows, cols = fx.shape
    fixed = bytearray(np.where(fx == 0, 0, np.where(np.isin(fx, (2, 3, 6)), TARGET, 1)).astype(np.uint8).tobytes())
    padded = not has_wall_border(rows, cols, fixed)
    if padded:
        rows, cols, fixed, _, _ = pad_with_walls(rows, cols, fixed, 0, ())
    dist = push_distances(cols, fixed)
    dead = np.array([bool(fixed[i]) and dist[i] < 0 for i in range(rows * cols)]).reshape(rows, cols)
    return dead[1:-1, 1:-1] if padded else dead


def solve_flat(rows: int, cols: int, fixed: Sequence[int], player: int, boxes: Iterable[int],
               max_depth: Optional[int] = None, max_nodes: int = DEFAULT_MAX_NODES) -> Optional[List[int]]:
    """Shortest action-id sequence (1 Up, 2 Down, 3 Left, 4 Right) that puts every box on a target.

    ``fixed`` must have a wall ring (see :func:`solve` for arbitrary rooms). Returns ``[]`` when
    already solved and ``None`` when no solution of at most ``max_depth`` steps exists, or when more
    than ``max_nodes`` states were expanded.
    """
    n = rows * cols
    boxes = tuple(boxes)
    dist = push_distances(cols, fixed)
    tmask = 0
    for i in range(n):
        if fixed[i] == TARGET:
            tmask |= 1 << i
    m0 = 0
    h0 = 0
    for b in boxes:
        if dist[b] < 0:
            return None
        m0 |= 1 << b
        h0 += dist[b]
    if len(boxes) > bin(tmask).count("1"):
        return None
    notarget = ~tmask
    if not (m0 & notarget):
        return []
    limit = float("inf") if max_depth is None else int(max_depth)
    if h0 > limit:
        return None
    deltas = flat_deltas(cols)[1:]  # up, down, left, right
    key0 = m0 * n + player
    best_g = {key0: 0}
    parent = {key0: (-1, 0)}
    buckets = {h0: [(key0, 0, h0)]}
    f = h0
    expanded = 0
    max_f = h0
    while f <= max_f and f <= limit:
        bucket = buckets.pop(f, None)
        if not bucket:
            f += 1
            continue
        while bucket:
            key, g, h = bucket.pop()
            if best_g[key] != g:
                continue  # a shorter path to this state was found after this entry was queued
            m, p = divmod(key, n)
            if not (m & notarget):
                path = []
                while True:
                    pk, a = parent[key]
                    if pk < 0:
                        break
                    path.append(a)
                    key = pk
                path.reverse()
                return path
            expanded += 1
            if expanded > max_nodes:
                return None
            g2 = g + 1
            for a in (1, 2, 3, 4):
                d = deltas[a - 1]
                q = p + d
                if not fixed[q]:
                    continue
                if (m >> q) & 1:
                    r = q + d
                    if not fixed[r] or (m >> r) & 1 or dist[r] < 0:
                        continue
                    m2 = m ^ (1 << q) ^ (1 << r)
                    h2 = h + dist[r] - dist[q]
                else:
                    m2 = m
                    h2 = h
                f2 = g2 + h2
                if f2 > limit:
                    continue
                key2 = m2 * n + q
                old = best_g.get(key2)
                if old is not None and old <= g2:
                    continue
                best_g[key2] = g2
                parent[key2] = (key, a)
                if f2 == f:
                    bucket.append((key2, g2, h2))
                else:
                    lst = buckets.get(f2)
                    if lst is None:
                        buckets[f2] = [(key2, g2, h2)]
                        if f2 > max_f:
                            max_f = f2
                    else:
                        lst.append((key2, g2, h2))
        f += 1
    return None


def solve(room_fixed, room_state, max_depth: Optional[int] = None,
          max_nodes: int = DEFAULT_MAX_NODES) -> Optional[List[int]]:
    """Shortest solution of a room given as RAGEN arrays (``room_fixed``, ``room_state``).

    Returns a list of action ids (1 Up, 2 Down, 3 Left, 4 Right), ``[]`` if solved, ``None`` if
    unsolvable within ``max_depth`` steps (or the search gave up after ``max_nodes`` expansions).
    """
    rows, cols, fixed, player, boxes = from_arrays(room_fixed, room_state)
    if not has_wall_border(rows, cols, fixed):
        rows, cols, fixed, player, boxes = pad_with_walls(rows, cols, fixed, player, boxes)
    return solve_flat(rows, cols, fixed, player, boxes, max_depth=max_depth, max_nodes=max_nodes)


__all__ = ["solve", "solve_flat", "push_distances", "dead_squares"]
