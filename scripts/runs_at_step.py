"""One markdown row per run of a comparison: held-out success at its last evaluation, the same seed's run of a
reference comparison at that step, and means over the training steps of the trust-region statistics.

    python scripts/runs_at_step.py RUNS_DIR REF_RUNS_DIR [--algos turn_ppo,st_ppo]

Runs are found under each dir by the report (fresh runs of scripts/compare.sh or kept copies, ``<algo>_s<seed>``),
matched by their config's ``algo.name`` and ``seed``, and read with the report's reader (one row per step, the last
line of a repeated step wins).
"""
from __future__ import annotations

import argparse
import math

from ragen_turn.cfg_get import cfg_get
from ragen_turn.report import VAL_SUCCESS, find_runs, load_run

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


def by_algo_seed(root):
    """{(algo, seed): run} of the runs under ``root`` (the first found of a pair wins)."""
    out = {}
    for d in find_runs([root]):
        run = load_run(d)
        out.setdefault((cfg_get(run.config, "algo.name"), cfg_get(run.config, "seed")), run)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs")
    ap.add_argument("ref")
    ap.add_argument("--algos", default="turn_ppo,turn_ppo_geo,st_ppo,so_grpo,token_ppo,grpo,bi_level_gae")
    a = ap.parse_args()
    print("| algo | seed | held-out success (step) | reference at that step | "
          + " | ".join(label for _, label, _ in KEYS) + " |")
    print("|---" * (4 + len(KEYS)) + "|")
    runs, refs = by_algo_seed(a.runs), by_algo_seed(a.ref)
    for algo in a.algos.split(","):
        for seed in sorted(s for al, s in runs if al == algo):
            run = runs[(algo, seed)]
            step, val = last_val(run)
            ref = refs.get((algo, seed))
            rv = val_at(ref, step) if ref is not None and step is not None else None
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
