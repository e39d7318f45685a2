"""Window means of training metrics, one markdown row per run.

    python scripts/window_means.py RUN_DIR [...] [--keys actor/entropy,actor/approx_kl] [--windows 1-5,6-10,11-20]

Each cell is ``a / b / c``: the mean of the key over the logged training steps in each window (``-`` where the
window has none). The last column is the ``val/success`` of the run's last held-out evaluation. Runs are read
with ``ragen_turn.report.load_run`` (one row per step, the last line of a repeated step wins).
"""
from __future__ import annotations

import argparse
import math
import os
from typing import List, Optional, Sequence, Tuple

from ragen_turn.report import VAL_SUCCESS, Run, final_eval, load_run

DEFAULT_KEYS = ("actor/entropy", "actor/approx_kl", "actor/token_outside_kept_frac", "actor/clip_frac_turn",
                "env/format_error_rate", "response_length/capped_turn_frac", "adv/capped_turn_mean",
                "adv/other_turn_mean", "env/response_tokens")


def window_means(run: Run, key: str, windows: Sequence[Tuple[int, int]]) -> List[Optional[float]]:
    """Mean of ``key``'s finite values over the steps in each inclusive window (None: no such value)."""
    steps, vals = run.series(key)
    out: List[Optional[float]] = []
    for a, b in windows:
        xs = [v for s, v in zip(steps, vals) if a <= s <= b and math.isfinite(v)]
        out.append(sum(xs) / len(xs) if xs else None)
    return out


def parse_windows(text: str) -> List[Tuple[int, int]]:
    windows = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        windows.append((int(a), int(b or a)))
    return windows


def table(run_dirs: Sequence[str], keys: Sequence[str], windows: Sequence[Tuple[int, int]], digits: int = 3) -> str:
    span = " / ".join(f"{a}-{b}" for a, b in windows)
    lines = [f"| run | {' | '.join(keys)} | val/success |", "|" + "---|" * (len(keys) + 2),
             f"| (steps) | {' | '.join([span] * len(keys))} | last |"]
    for d in run_dirs:
        run = load_run(d)
        cells = [" / ".join("-" if v is None else f"{v:.{digits}f}" for v in window_means(run, k, windows))
                 for k in keys]
        val = final_eval(run, VAL_SUCCESS)
        lines.append(f"| {os.path.basename(os.path.normpath(d))} | {' | '.join(cells)} | "
                     f"{'-' if not math.isfinite(val) else f'{val:.3f}'} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run directories (each with a metrics.jsonl)")
    p.add_argument("--keys", default=",".join(DEFAULT_KEYS), help="comma-separated metric keys")
    p.add_argument("--windows", default="1-5,6-10,11-20", help="comma-separated inclusive step windows")
    p.add_argument("--digits", type=int, default=3)
    args = p.parse_args(argv)
    print(table(args.runs, args.keys.split(","), parse_windows(args.windows), args.digits))


if __name__ == "__main__":
    main()
