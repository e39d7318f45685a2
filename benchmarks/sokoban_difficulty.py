"""Room difficulty: mean optimal solution length (our solver) of our rooms and, when a RAGEN checkout is
given, of rooms from RAGEN's own ``generate_room``, at RAGEN's settings.

    python benchmarks/sokoban_difficulty.py [--rooms 1000] \
        [--ragen-utils /path/to/RAGEN/ragen/env/sokoban/utils.py --ragen-python /tmp/gymsok/bin/python]

RAGEN's side runs in a subprocess of ``--ragen-python`` (any Python with numpy): its ``utils.py`` is loaded by
file path (its plotting imports are stubbed) and called as RAGEN's ``SokobanEnv.reset`` calls it: seeded with
``random.seed(s); np.random.seed(s)``, ``num_steps = int(1.7 * (rows + cols))``; a seed whose generation fails
is skipped (RAGEN re-seeds). Its rooms come back as arrays and are solved here with our solver.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np

from ragen_turn.envs.sokoban import SokobanEnv
from ragen_turn.envs.sokoban.room import from_arrays
from ragen_turn.envs.sokoban.solver import solve_flat

# (dim_room, num_boxes, search_depth): RAGEN's SimpleSokoban (default depth), LargerSokoban, and 8x8 at the default
SETTINGS = [((6, 6), 1, 300), ((8, 8), 2, 10), ((8, 8), 2, 300)]

RAGEN_SCRIPT = r"""
import importlib.util, json, random, sys, types
import numpy as np
for name in ("matplotlib", "matplotlib.pyplot", "matplotlib.animation"):
    sys.modules[name] = types.ModuleType(name)
spec = importlib.util.spec_from_file_location("ragen_sokoban_utils", sys.argv[1])
ru = importlib.util.module_from_spec(spec); spec.loader.exec_module(ru)
rows, cols, nb, depth, n = (int(x) for x in sys.argv[2:7])
seed = made = 0
while made < n:
    s, seed = seed, seed + 1
    random.seed(s); np.random.seed(s)
    try:
        fixed, state, _, _ = ru.generate_room(dim=(rows, cols), num_steps=int(1.7 * (rows + cols)),
                                               num_boxes=nb, search_depth=depth)
    except (RuntimeError, RuntimeWarning):
        continue
    made += 1
    print(json.dumps([np.asarray(fixed).astype(int).tolist(), np.asarray(state).astype(int).tolist()]))
"""


def summary(lengths) -> dict:
    a = np.asarray(lengths, dtype=float)
    return {"rooms": len(a), "mean": float(a.mean()), "se": float(a.std() / np.sqrt(len(a))),
            "max": int(a.max()), "unsolved": int((a < 0).sum())}


def ours(dims, nb, depth, n) -> dict:
    env = SokobanEnv({"dim_room": dims, "num_boxes": nb, "search_depth": depth})
    lengths = []
    for seed in range(n):
        env.reset(seed=seed)
        lengths.append(env.optimal_steps)
    return summary(lengths)


def ragens(python, utils, dims, nb, depth, n) -> dict:
    res = subprocess.run([python, "-c", RAGEN_SCRIPT, utils, str(dims[0]), str(dims[1]), str(nb), str(depth), str(n)],
                         capture_output=True, text=True, check=True)
    lengths = []
    for line in res.stdout.splitlines():
        fixed, state = json.loads(line)
        rows, cols, fx, player, boxes = from_arrays(fixed, state)
        sol = solve_flat(rows, cols, fx, player, set(boxes))
        lengths.append(-1 if sol is None else len(sol))
    return summary(lengths)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rooms", type=int, default=1000)
    ap.add_argument("--ragen-utils", help="RAGEN's ragen/env/sokoban/utils.py")
    ap.add_argument("--ragen-python", default=sys.executable, help="a Python with numpy for RAGEN's side")
    args = ap.parse_args(argv)
    print(f"{'setting':<22}{'ours mean':>10}{'(se)':>8}{'max':>5}"
          f"{'RAGEN mean':>12}{'(se)':>8}{'max':>5}{'ours/RAGEN':>12}")
    for dims, nb, depth in SETTINGS:
        o = ours(dims, nb, depth, args.rooms)
        r = ragens(args.ragen_python, args.ragen_utils, dims, nb, depth, args.rooms) if args.ragen_utils else None
        tail = (f"{r['mean']:>12.3f}{r['se']:>8.3f}{r['max']:>5d}{o['mean'] / r['mean']:>12.3f}" if r else
                f"{'-':>12}{'':>8}{'':>5}{'-':>12}")
        print(f"{dims[0]}x{dims[1]}/{nb} depth {depth:<8}{o['mean']:>10.3f}{o['se']:>8.3f}{o['max']:>5d}" + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
