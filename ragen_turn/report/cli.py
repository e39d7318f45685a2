"""Compare runs: ``python -m ragen_turn.report RUN_OR_DIR [...] [--group-by KEY[,KEY]] [--out DIR]``.

The command line of :mod:`ragen_turn.report` (what it reads and writes is told there); its first paragraph
above is the ``--help`` description."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from ragen_turn.report.build import build_report, default_out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ragen_turn.report", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="run directories or directories holding runs (searched recursively); "
                                             "with --list-jobs: Hydra overrides")
    ap.add_argument("--group-by", default=None,
                    help="comma-separated dotted config keys that label a group, e.g. "
                         "algo.name,algorithm.gamma,algorithm.lam (env.name and model.name are added when "
                         "the runs differ in them); default: algo.name and every config key the runs' "
                         "experiments differ in (not the seed or run-control keys such as "
                         "trainer.total_training_steps or logger)")
    ap.add_argument("--threshold", type=float, default=0.5, help="held-out success level for 'steps to' (0.5)")
    ap.add_argument("--smooth", type=int, default=1,
                    help="moving-average window over training steps for the collapse measure and train curves (1)")
    ap.add_argument("--out", default=None, help="output directory (default: <the runs' common directory>/report)")
    ap.add_argument("--no-plots", action="store_true", help="write the table only")
    ap.add_argument("--keep-runs", action="store_true",
                    help="also copy each run's config and metrics (the keys the report reads) to <out>/runs, so "
                         "the report can be rebuilt from there once the runs are gone; a run found twice by name "
                         "counts once")
    ap.add_argument("--no-intervals", action="store_true", help="leave out the interval estimates (IQM, bootstrap CIs)")
    ap.add_argument("--strata", default="",
                    help="comma-separated config keys that split a group's runs into tasks for the stratified "
                         "bootstrap (e.g. env.train_tags when one report holds several settings); default: none")
    ap.add_argument("--up-to-step", type=int, default=None,
                    help="read every run up to this step (runs of different lengths compared at one step; "
                         "--keep-runs still keeps every step)")
    ap.add_argument("--paired", action="append", default=[], metavar="GROUP",
                    help="also each group's final held-out success minus GROUP's (a label of the table), paired by "
                         "seed, with a 95%% t interval; repeat for several references")
    ap.add_argument("--reps", type=int, default=10_000, help="bootstrap resamples for the intervals (10000)")
    ap.add_argument("--list-jobs", action="store_true",
                    help="list the jobs a --multirun with these overrides launches (no training), e.g. "
                         "--list-jobs env=sokoban algo=turn_ppo +sweep=gamma_lambda")
    ap.add_argument("--no-check", action="store_true", help="with --list-jobs: skip the config checks")
    args = ap.parse_intermixed_args(argv)
    if args.list_jobs:
        from ragen_turn.sweeps import list_jobs

        return list_jobs(args.paths, validate=not args.no_check)
    if not args.paths:
        ap.error("give at least one run directory (or a directory of runs)")
    keys = None if args.group_by is None else [k.strip() for k in args.group_by.split(",") if k.strip()]
    out = Path(args.out) if args.out else default_out(args.paths)
    try:
        text = build_report(args.paths, out, keys, args.threshold, max(1, args.smooth), plots=not args.no_plots,
                            intervals=not args.no_intervals, reps=args.reps,
                            strata=[k.strip() for k in args.strata.split(",") if k.strip()], keep=args.keep_runs,
                            up_to_step=args.up_to_step, paired=args.paired)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"wrote {out / 'results.md'}", file=sys.stderr)
    return 0

