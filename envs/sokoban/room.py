"""Room representation shared by the generator, the solver and the env.

Rooms are stored flat: cell ``i`` is row ``i // cols``, column ``i % cols``. The fixed part is a
``bytearray`` with ``WALL`` / ``FLOOR`` / ``TARGET``; the movable part is the player's cell and the
boxes' cells. Array views use RAGEN's (gym-sokoban's) ids: 0 wall, 1 floor, 2 empty target, 3 box on
target, 4 box, 5 player, 6 player on target (6 only in renders; ``room_state`` keeps 5 as gym does).
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Sequence, Tuple

import numpy as np

WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)

DEFAULT_GRID_LOOKUP: Dict[int, str] = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
DEFAULT_GRID_VOCAB: Dict[str, str] = {
    "#": "wall", "_": "empty", "O": "target", "√": "box on target", "X": "box", "P": "player",
    "S": "player on target",
}
DEFAULT_ACTION_LOOKUP: Dict[int, str] = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}
# (d_row, d_col) of RAGEN's action ids; 0 is the invalid action.
ACTION_DELTAS: Dict[int, Tuple[int, int]] = {1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}
OPPOSITE_ACTION = {1: 2, 2: 1, 3: 4, 4: 3}


def flat_deltas(cols: int) -> Tuple[int, int, int, int, int]:
    """Flat index offset of each action id (index 0 unused)."""
    return (0, -cols, cols, -1, 1)


def to_arrays(rows: int, cols: int, fixed: Sequence[int], player: int,
              boxes: Iterable[int]) -> Tuple[np.ndarray, np.ndarray]:
    """Flat room -> ``(room_fixed, room_state)`` int arrays with RAGEN's ids."""
    room_fixed = np.frombuffer(bytes(fixed), dtype=np.uint8).astype(np.int64).reshape(rows, cols)
    room_state = room_fixed.copy().reshape(-1)
    for b in boxes:
        room_state[b] = BOX_ON_TARGET if fixed[b] == TARGET else BOX
    room_state[player] = PLAYER
    return room_fixed, room_state.reshape(rows, cols)


def from_arrays(room_fixed, room_state) -> Tuple[int, int, bytearray, int, Tuple[int, ...]]:
    """``(room_fixed, room_state)`` (arrays or nested lists, RAGEN ids) -> flat room.

    A target counts if either array marks it (2 in ``room_fixed``; 2, 3 or 6 in ``room_state``).
    Raises ``ValueError`` on shapes that differ, unknown ids, or a player count other than one.
    """
    fx = np.asarray(room_fixed, dtype=np.int64)
    st = np.asarray(room_state, dtype=np.int64)
    if fx.ndim != 2 or fx.shape != st.shape:
        raise ValueError(f"room_fixed {fx.shape} and room_state {st.shape} must be 2-D and the same shape")
    if fx.min(initial=0) < 0 or fx.max(initial=0) > 6 or st.min(initial=0) < 0 or st.max(initial=0) > 6:
        raise ValueError("room ids must be in 0..6")
    rows, cols = fx.shape
    fx_flat = fx.reshape(-1).tolist()
    st_flat = st.reshape(-1).tolist()
    fixed = bytearray(rows * cols)
    player = -1
    boxes: List[int] = []
    for i, (f, s) in enumerate(zip(fx_flat, st_flat)):
        if f == WALL or s == WALL:
            continue
        is_target = f in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET) or s in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET)
        fixed[i] = TARGET if is_target else FLOOR
        if s in (BOX, BOX_ON_TARGET):
            boxes.append(i)
        elif s in (PLAYER, PLAYER_ON_TARGET):
            if player >= 0:
                raise ValueError("room_state has more than one player")
            player = i
    if player < 0:
        raise ValueError("room_state has no player")
    return rows, cols, fixed, player, tuple(boxes)


def has_wall_border(rows: int, cols: int, fixed: Sequence[int]) -> bool:
    if any(fixed[c] or fixed[(rows - 1) * cols + c] for c in range(cols)):
        return False
    return not any(fixed[r * cols] or fixed[r * cols + cols - 1] for r in range(rows))


def pad_with_walls(rows: int, cols: int, fixed: Sequence[int], player: int, boxes: Iterable[int]):
    """Surround a flat room with one ring of walls (so moves never leave the array)."""
    c2 = cols + 2
    new = bytearray((rows + 2) * c2)
    remap = lambda i: (i // cols + 1) * c2 + i % cols + 1  # noqa: E731
    for i in range(rows * cols):
        new[remap(i)] = fixed[i]
    return rows + 2, c2, new, remap(player), tuple(remap(b) for b in boxes)


def grid_to_text(room_fixed, room_state, grid_lookup: Dict[int, str] | None = None,
                 cell_sep: str = "") -> str:
    """Render a room as text: one symbol per cell, ``cell_sep`` between the cells of a row, rows
    joined by newlines. With the default single-character symbols and ``cell_sep=""`` every cell is
    one character; ``cell_sep=" "`` makes BPE tokenizers emit one token per cell (" #", " _", ...)."""
    lookup = grid_lookup or DEFAULT_GRID_LOOKUP
    rows, cols, fixed, player, boxes = from_arrays(room_fixed, room_state)
    ids = list(fixed)
    for b in boxes:
        ids[b] = BOX_ON_TARGET if fixed[b] == TARGET else BOX
    ids[player] = PLAYER_ON_TARGET if fixed[player] == TARGET else PLAYER
    return "\n".join(cell_sep.join(lookup[ids[r * cols + c]] for c in range(cols)) for r in range(rows))


def text_to_grid(text: str, grid_lookup: Dict[int, str] | None = None,
                 cell_sep: str = "") -> Tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`grid_to_text`: text -> ``(room_fixed, room_state)``.

    Also accepts gym-sokoban/XSB-style symbols (``#`` wall, space or ``-`` floor, ``.`` target,
    ``$`` box, ``*`` box on target, ``@`` player, ``+`` player on target) for hand-made rooms.
    """
    lookup = grid_lookup or DEFAULT_GRID_LOOKUP
    sym2id = {v: k for k, v in lookup.items()}
    for k, v in {" ": 1, "-": 1, ".": 2, "$": 4, "*": 3, "@": 5, "+": 6}.items():
        sym2id.setdefault(k, v)
    lines = [ln for ln in text.strip("\n").split("\n")]
    rows_cells: List[List[str]] = []
    for ln in lines:
        if cell_sep:
            cells = ln.split(cell_sep)
        elif all(len(v) == 1 for v in lookup.values()):
            cells = list(ln)
        else:  # multi-character symbols (e.g. RAGEN's " # "): greedy longest match
            cells, i, syms = [], 0, sorted(sym2id, key=len, reverse=True)
            while i < len(ln):
                s = next((s for s in syms if ln.startswith(s, i)), None)
                if s is None:
                    raise ValueError(f"unknown symbol at {ln[i:]!r}")
                cells.append(s)
                i += len(s)
        rows_cells.append(cells)
    cols = max(len(r) for r in rows_cells)
    fixed = np.zeros((len(rows_cells), cols), dtype=np.int64)
    state = np.zeros_like(fixed)
    for r, cells in enumerate(rows_cells):
        for c, s in enumerate(cells):
            if s not in sym2id:
                raise ValueError(f"unknown symbol {s!r} in row {r}")
            i = sym2id[s]
            fixed[r, c] = TARGET if i in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET) else (WALL if i == WALL else FLOOR)
            state[r, c] = PLAYER if i == PLAYER_ON_TARGET else i
    return fixed, state
