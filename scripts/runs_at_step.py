"""One markdown row per run of a comparison: held-out success at its last evaluation, the same seed's run of a
reference comparison at that step, and means over the training steps of the trust-region statistics.

    python scripts/runs_at_step.py RUNS_DIR REF_RUNS_DIR [--setting long_turns] [--algos turn_ppo,st_ppo]

Runs are found as ``<dir>/sokoban_<setting>_<algo>_tiny_s<seed>*`` (scripts/compare.sh's names) and read with the
report's reader (one row per step, the last line of a repeated step wins).
"""
from __future__ import annotations

import argparse
import glob
import math

from ragen_turn.report import VAL_SUCCESS, load_run

KEYS = (("env/format_error_rate", "format errors, last 5 steps", "{:.3f}"), ("actor/live_frac", "live share", "{:.3f}"),
        ("actor/approx_kl", "approx KL", "{:.4f}"), ("critic/explained_var", "critic explained var", "{:.3f}"),
        ("actor/clip_frac_turn", "turns clipped", "{:.3f}"))


def mean(xs):
    xs = [x for x in xs if math.isfinite(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def last_val(run):
    steps, vals = run.series(VAL_SUCCESS)
    pairs = [(s, v) for s, v in zip(steps, vals) if math.isfinite(v)]
    return pairs[-1] if pairs else (None, None)


def val_at(run, step):
    steps, vals = run.series(VAL_SUCCESS)
    return next((v for s, v in zip(steps, vals) if s == step and math.isfinite(v)), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs")
    ap.add_argument("ref")
    ap.add_argument("--setting", default="long_turns")
    ap.add_argument("--algos", default="turn_ppo,turn_ppo_geo,st_ppo,so_grpo,token_ppo,grpo,bi_level_gae")
    a = ap.parse_args()
    print("| algo | seed | held-out success (step) | reference at that step | "
          + " | ".join(label for _, label, _ in KEYS) + " |")
    print("|---" * (4 + len(KEYS)) + "|")
    for algo in a.algos.split(","):
        for seed in range(10):
            found = glob.glob(f"{a.runs}/sokoban_{a.setting}_{algo}_tiny_s{seed}_*")
            if not found:
                continue
            run = load_run(found[0])
            step, val = last_val(run)
            ref = glob.glob(f"{a.ref}/sokoban_{a.setting}_{algo}_tiny_s{seed}_*")
            rv = val_at(load_run(ref[0]), step) if ref and step is not None else None
            cells = []
            for key, _, fmt in KEYS:
                steps, vals = run.series(key)
                if key == "env/format_error_rate":
                    top = max(steps) if steps else 0
                    vals = [v for s, v in zip(steps, vals) if s > top - 5]
                cells.append(fmt.format(mean(vals)).replace("nan", "-"))
            shown = "-" if val is None else f"{val:.3f} ({step})"
            print(f"| {algo} | {seed} | {shown} | {'-' if rv is None else f'{rv:.3f}'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
