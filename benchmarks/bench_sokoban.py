"""Sokoban env speed: rooms generated per second, resets (generate + optimal solve), env steps per
second, solver rate; and, when a Python with gym-sokoban is available, gym-sokoban's
``generate_room`` at the same settings with the ratio.

    python benchmarks/bench_sokoban.py [--seconds 3] [--gym-sokoban-python /tmp/gymsok/bin/python]

The gym-sokoban side needs a scratch venv (it pulls the old ``gym``):
    python3 -m venv /tmp/gymsok && /tmp/gymsok/bin/pip install gym-sokoban==0.0.6
Its ``room_utils`` module is loaded by file path in a subprocess, so only numpy is imported there.
Targets (issue): >= 10x gym-sokoban's generation rate at equal settings, >= 50k env steps/s.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from ragen_turn.envs.sokoban import SokobanEnv, generate_room
from ragen_turn.envs.sokoban.generation import generate_flat
from ragen_turn.envs.sokoban.solver import solve_flat

SETTINGS = [((6, 6), 1), ((8, 8), 2)]
DEFAULT_GYM_PY = "/tmp/gymsok/bin/python"

GYM_SCRIPT = r"""
import importlib.util, json, os, random, sys, time
import numpy as np
spec = importlib.util.find_spec("gym_sokoban")
if spec is None:
    print(json.dumps({"error": "gym_sokoban is not installed in " + sys.executable})); sys.exit(0)
path = os.path.join(os.path.dirname(spec.origin), "envs", "room_utils.py")
mspec = importlib.util.spec_from_file_location("gs_room_utils", path)
ru = importlib.util.module_from_spec(mspec); mspec.loader.exec_module(ru)
seconds = float(sys.argv[1]); out = {}
for dims, nb in json.loads(sys.argv[2]):
    dims = tuple(dims); ok = fail = seed = 0; t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        random.seed(seed); np.random.seed(seed); seed += 1
        try:
            ru.generate_room(dim=dims, num_steps=int(1.7 * (dims[0] + dims[1])), num_boxes=nb)
            ok += 1
        except (RuntimeError, RuntimeWarning):
            fail += 1
    el = time.perf_counter() - t0
    out["%dx%d/%d" % (dims[0], dims[1], nb)] = {"rooms_per_s": ok / el, "rooms": ok, "failed": fail}
print(json.dumps(out))
"""


def rate(fn, seconds: float) -> tuple[float, int]:
    """Calls of fn(i) per second over about ``seconds`` (after a short warm-up)."""
    for i in range(20):
        fn(i)
    n, t0 = 0, time.perf_counter()
    while True:
        for _ in range(50):
            fn(n)
            n += 1
        el = time.perf_counter() - t0
        if el >= seconds:
            return n / el, n


def bench_generation(seconds: float, rounds: int, gym_python: str | None) -> tuple[dict, dict | None]:
    """Our generation rate and, interleaved with it round by round (so that load from other
    processes hits both alike), gym-sokoban's; each side reports its best round."""
    out, gym = {}, ({} if gym_python else None)
    per = seconds / rounds
    for dims, nb in SETTINGS:
        key = f"{dims[0]}x{dims[1]}/{nb}"
        best, n_total = 0.0, 0
        for _ in range(rounds):
            r, n = rate(lambda i: generate_room(dims, nb, seed=i), per)
            best, n_total = max(best, r), n_total + n
            if gym is not None and "error" not in gym:
                g = bench_gym_sokoban(gym_python, per, [(dims, nb)])
                if "error" in g:
                    gym = g
                else:
                    prev = gym.get(key)
                    if prev is None or g[key]["rooms_per_s"] > prev["rooms_per_s"]:
                        gym[key] = g[key]
        env = SokobanEnv({"dim_room": dims, "num_boxes": nb})
        rst, _ = rate(lambda i: env.reset(seed=i), per)
        rooms = [generate_flat(dims, nb, seed=i) for i in range(200)]
        args = [(r.rows, r.cols, r.fixed, r.player, r.boxes) for r in rooms]
        slv, _ = rate(lambda i: solve_flat(*args[i % 200]), per)
        opt = [len(solve_flat(*a)) for a in args]
        out[key] = {"rooms_per_s": best, "rooms": n_total, "resets_per_s": rst, "solves_per_s": slv,
                    "mean_optimal_steps": float(np.mean(opt)), "max_optimal_steps": int(np.max(opt))}
    return out, gym


def bench_steps(seconds: float) -> dict:
    out = {}
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 5, 100_000).tolist()
    words = ["Up", "down", " Left ", "RIGHT", "jump"]
    texts = [words[i] for i in rng.integers(0, 5, 100_000).tolist()]
    for name, actions in (("int ids", ids), ("text", texts)):
        env = SokobanEnv()
        env.reset(seed=0)
        seeds = iter(range(1, 10**9))
        step, n, resets, spent = env.step, 0, 0, 0.0
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            for a in actions:
                if step(a)[2]:
                    spent += time.perf_counter() - t0  # resets are not timed
                    env.reset(seed=next(seeds))
                    resets += 1
                    t0 = time.perf_counter()
            spent += time.perf_counter() - t0
            n += len(actions)
        out[name] = {"steps_per_s": n / spent, "steps": n, "episodes": resets}
    return out


def bench_gym_sokoban(python: str, seconds: float, settings) -> dict:
    try:
        res = subprocess.run([python, "-c", GYM_SCRIPT, str(seconds), json.dumps(settings)],
                             capture_output=True, text=True, timeout=600)
        data = json.loads(res.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, json.JSONDecodeError, IndexError, OSError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the generation timings")
    ap.add_argument("--gym-sokoban-python", default=DEFAULT_GYM_PY,
                    help="python of a venv with gym-sokoban (comparison skipped if absent)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)

    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} CPU(s); {args.seconds:g} s per measurement")
    gym_py = args.gym_sokoban_python if args.gym_sokoban_python and os.path.exists(args.gym_sokoban_python) else None
    gen, gym = bench_generation(args.seconds, max(1, args.rounds), gym_py)
    steps = bench_steps(args.seconds)

    print(f"\n== room generation (generate_room, numpy arrays out; best of {args.rounds} interleaved rounds) ==")
    print(f"{'setting':<10}{'rooms/s':>12}{'resets/s':>12}{'solves/s':>12}{'mean opt':>10}{'max opt':>9}"
          f"{'gym-sok rooms/s':>17}{'ratio':>9}")
    ok = True
    for key, g in gen.items():
        other = (gym or {}).get(key, {}).get("rooms_per_s") if gym and "error" not in gym else None
        ratio = g["rooms_per_s"] / other if other else None
        if ratio is not None:
            ok &= ratio >= 10
        print(f"{key:<10}{g['rooms_per_s']:>12,.0f}{g['resets_per_s']:>12,.0f}{g['solves_per_s']:>12,.0f}"
              f"{g['mean_optimal_steps']:>10.1f}{g['max_optimal_steps']:>9d}"
              f"{(f'{other:,.1f}' if other else '-'):>17}{(f'{ratio:.1f}x' if ratio else '-'):>9}")
    print("  (resets = generate + optimal solve for info['optimal_steps']; 'opt' = optimal solution length)")
    if gym is None:
        print(f"  gym-sokoban comparison skipped: {args.gym_sokoban_python} not found "
              f"(python3 -m venv /tmp/gymsok && /tmp/gymsok/bin/pip install gym-sokoban==0.0.6)")
    elif "error" in gym:
        print(f"  gym-sokoban comparison skipped: {gym['error']}")

    print("\n== env steps (6x6, 1 box; step() incl. parsing, rules, text render, info) ==")
    for name, s in steps.items():
        ok &= s["steps_per_s"] >= 50_000
        print(f"{name:<10}{s['steps_per_s']:>12,.0f} steps/s   ({s['steps']:,} steps, {s['episodes']:,} episodes)")

    print(f"\ntargets (>= 10x gym-sokoban generation where measured, >= 50k steps/s): "
          f"{'MET' if ok else 'NOT MET'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"generation": gen, "steps": steps, "gym_sokoban": gym}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
