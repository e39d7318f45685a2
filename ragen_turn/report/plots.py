"""The report's figures (matplotlib, optional: each function raises ImportError without it): learning curves
per group (mean over seeds, shaded +-1 std) and the interval plot (IQM and CI per group, a mark per run)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ragen_turn.report.runs import Run, _finite
from ragen_turn.report.stats import smooth
from ragen_turn.runfiles import (CLIP_TOKEN, CLIP_TURN, ENTROPY, FORMAT_ERRORS, KL, RESPONSE_TOKENS, TRAIN_REWARD,
                                 TRAIN_SUCCESS, VAL_REWARD, VAL_SUCCESS)


def _curve(runs: Sequence[Run], key: str, smooth_window: int = 1) -> Tuple[List[int], List[float], List[float]]:
    """Per step: mean and std over the runs that logged a finite value there."""
    per_step: Dict[int, List[float]] = {}
    for r in runs:
        steps, vals = r.series(key)
        for s, v in zip(steps, smooth(vals, smooth_window)):
            if _finite(v):
                per_step.setdefault(s, []).append(v)
    steps = sorted(per_step)
    means = [sum(per_step[s]) / len(per_step[s]) for s in steps]
    stds = [math.sqrt(sum((v - m) ** 2 for v in per_step[s]) / len(per_step[s])) for s, m in zip(steps, means)]
    return steps, means, stds


def write_plots(groups: Sequence[Tuple[str, List[Run]]], out: Path, smooth_window: int = 1) -> List[str]:
    """success.png, reward.png, clip_kl.png and (when logged) stability.png under ``out``. Returns the file names;
    ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figures = {
        "success.png": [(VAL_SUCCESS, "held-out success (val/success)", 1),
                        (TRAIN_SUCCESS, "train success (env/success)", smooth_window)],
        "reward.png": [(VAL_REWARD, "held-out reward (val/reward)", 1),
                       (TRAIN_REWARD, "train reward (env/reward)", smooth_window)],
        "clip_kl.png": [(CLIP_TOKEN, "clip fraction, tokens", smooth_window),
                        (CLIP_TURN, "clip fraction, turns", smooth_window),
                        (KL, "approx KL (actor/approx_kl)", smooth_window)],
    }
    stability = [(ENTROPY, "policy entropy (actor/entropy)", smooth_window),
                 (FORMAT_ERRORS, "format-error rate (env/format_error_rate)", smooth_window),
                 (RESPONSE_TOKENS, "sampled tokens per episode (env/response_tokens)", smooth_window)]
    if any(r.series(key)[0] for _, runs in groups for r in runs for key, _, _ in stability):
        figures["stability.png"] = stability
    written = []
    for name, panels in figures.items():
        fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
        for ax, (key, title, w) in zip(axes[0], panels):
            for i, (label, runs) in enumerate(groups):
                steps, means, stds = _curve(runs, key, w)
                if not steps:
                    continue
                color = f"C{i % 10}"
                ax.plot(steps, means, color=color, marker="o" if len(steps) < 30 else None, markersize=3,
                        label=f"{label} (n={len(runs)})")
                ax.fill_between(steps, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                                color=color, alpha=0.2, linewidth=0)
            ax.set_title(title + (f", {w}-step avg" if w > 1 else ""))
            if key in (VAL_SUCCESS, TRAIN_SUCCESS):
                ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def write_interval_plot(groups: Sequence[Tuple[str, List[Run]]], estimates: Dict[str, Dict[str, Any]],
                        out: Path, name: str = "intervals.png",
                        scores: Optional[Dict[str, Dict[str, List[float]]]] = None) -> str:
    """One panel per metric: each group's IQM (dot) and 95% CI (bar), and with ``scores`` every run's score
    (small marks on the group's row, :func:`run_scores`). ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = list(estimates)
    labels = [label for label, _ in groups]
    fig, axes = plt.subplots(1, len(titles), figsize=(3.6 * len(titles), 0.45 * len(labels) + 1.4), squeeze=False,
                             sharey=True)
    for ax, t in zip(axes[0], titles):
        for i, label in enumerate(labels):
            point, lo, hi, cen, _ = estimates[t][label]
            if not _finite(point):
                continue
            color = f"C{i % 10}"
            if _finite(lo):
                ax.plot([lo, hi], [i, i], color=color, linewidth=6, alpha=0.45, solid_capstyle="butt")
            ax.plot([point], [i], marker=">" if cen else "o", color=color, markersize=6)
            runs_at = (scores or {}).get(t, {}).get(label, [])
            if runs_at:  # every run of the group, spread a little around its row
                offsets = [0.25 * (k / max(len(runs_at) - 1, 1) - 0.5) for k in range(len(runs_at))]
                ax.plot(runs_at, [i + o for o in offsets], linestyle="none", marker="|", color=color,
                        markersize=7, alpha=0.9)
        ax.set_title(f"{t}\n(IQM, 95% CI{'; > = lower bound' if any(v[3] for v in estimates[t].values()) else ''})",
                     fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels)
    axes[0][0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name
