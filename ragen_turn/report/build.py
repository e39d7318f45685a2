"""A results page from run directories: :func:`build_report` reads the runs, groups them, and writes
``results.md`` (and the figures) to ``out``."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Sequence, Tuple

from ragen_turn.report.groups import DEFAULT_GROUP_BY, group_keys, group_runs, mixed_groups, run_control_keys
from ragen_turn.report.plots import write_interval_plot, write_plots
from ragen_turn.report.runs import Run, cut_at, dedupe_runs, find_runs, keep_runs, load_run
from ragen_turn.report.stats import IMPROVEMENT_METRIC, interval_estimates, run_scores
from ragen_turn.report.tables import (duplicate_seed_warnings, header_notes, improvement_table, interval_table,
                                      markdown_table, paired_table, runs_table, TRAIN_TAIL)


def interval_section(groups: Sequence[Tuple[str, List[Run]]], keys: Sequence[str], threshold: float,
                     smooth_window: int, out: Path, plots: bool, strata: Sequence[str] = (),
                     reps: int = 10_000) -> List[str]:
    """The report's "Interval estimates" section (Markdown lines); writes intervals.png when ``plots``."""
    try:
        import scipy  # noqa: F401
    except ImportError:
        return ["## Interval estimates", "", "Skipped: scipy is not installed (pip install -e '.[stats]').", ""]
    estimates = interval_estimates(groups, threshold, smooth_window, strata, reps)
    strat = (f"stratified by `{', '.join(strata)}` (each stratum's runs resampled separately)" if strata else
             "runs resampled with replacement within each group")
    lines = ["## Interval estimates", "",
             "Per group: the interquartile mean (IQM: the mean of the middle 50% of the runs; of 5 runs, the middle "
             f"3) and a 95% percentile bootstrap confidence interval ({reps} resamples, {strat}; "
             "`scipy.stats.bootstrap`, seeded). A CI from 5 seeds is wide: two groups whose intervals overlap are "
             "not shown to differ. **steps to** counts a run that never reached the threshold as its last step + "
             "`trainer.test_freq` (censored): such a cell is a lower bound (≥). **collapse** is the column of the "
             "table above; **final MI** is RAGEN-2's `collapse/mi_estimate` at its last computation (thinking runs "
             "only). `[no CI]`: a group (or a stratum) with a single run: nothing to resample.", "",
             interval_table(groups, keys, estimates), ""]
    if plots and estimates:
        try:
            scores = run_scores(groups, threshold, smooth_window)
            name = write_interval_plot(groups, estimates, out, scores=scores)
            lines += [f"Plot: [{name}]({name}) (IQM and CI per group; a mark per run).", ""]
        except ImportError:
            lines += ["Plot: skipped (matplotlib is not installed).", ""]
    if len(groups) > 1:
        lines += ["### Probability of improvement", "",
                  f"P(X > Y) + 0.5 P(X = Y) for the {IMPROVEMENT_METRIC} X of a run of the row's group and Y of a run "
                  "of the column's group (the Mann-Whitney U statistic over n*m; averaged over strata), with a 95% "
                  "bootstrap CI resampling both groups' runs. 0.5 = no difference; a CI holding 0.5 does not show "
                  "one.", "", improvement_table(groups, threshold, smooth_window, strata, reps), ""]
    return lines


def trace_section(runs: Sequence[Run], out: Path) -> List[str]:
    """Each run with a trajectory trace (``trainer.trace_episodes``): its credit inspector page, written to
    ``out/inspect/<run>.html`` (``python -m ragen_turn.inspect``), linked. None: no section."""
    from ragen_turn.inspect import build_page, has_trace

    traced = [r for r in runs if has_trace(r.path)]
    if not traced:
        return []
    lines = ["## Trajectory traces", "", "Per run, which turns got which credit and which were clipped "
             "(one HTML page each, offline):", ""]
    for r in traced:
        page = build_page(r.path, out=out / "inspect" / f"{r.path.name}.html")
        lines.append(f"- [{r.path.name}](inspect/{page.name})")
    return lines + [""]


def default_out(paths: Sequence[str]) -> Path:
    """``<the paths' common directory>/report``: beside the runs, never in the repository's docs."""
    common = Path(os.path.commonpath([str(Path(p).resolve()) for p in paths]))
    if common.is_file():
        common = common.parent
    return common / "report"


def build_report(paths: Sequence[str], out: str | Path | None = None, group_by: Sequence[str] | None = None,
                 threshold: float = 0.5, smooth_window: int = 1, plots: bool = True, intervals: bool = True,
                 strata: Sequence[str] = (), reps: int = 10_000, keep: bool = False,
                 up_to_step: int | None = None, paired: Sequence[str] = ()) -> str:
    """Read the runs under ``paths`` (a run found twice by name counts once: :func:`dedupe_runs`), write
    ``results.md`` (and the PNGs) to ``out`` (default :func:`default_out`) and, with ``keep``, the runs' kept
    copies to ``out/runs`` (:func:`keep_runs`); return the Markdown. ``group_by`` None: ``algo.name`` and the
    keys the runs' experiments differ in (:func:`group_keys`); a group given by ``group_by`` that mixes
    experiments is warned about and gets no interval estimates (:func:`mixed_groups`). ``up_to_step``: every run
    read up to that step (:func:`cut_at`; the kept copies keep every step). ``paired``: groups' labels; for each, every
    other group's final held-out success (and late train success) minus its own, paired by seed
    (:func:`paired_table`); an unknown label raises ValueError before anything is written."""
    run_dirs = find_runs(paths)
    if not run_dirs:
        raise FileNotFoundError(f"no runs (directories with metrics.jsonl) under {', '.join(map(str, paths))}")
    runs = dedupe_runs([load_run(d) for d in run_dirs], log=lambda line: print(line, file=sys.stderr))
    out = Path(out) if out is not None else default_out(paths)
    out.mkdir(parents=True, exist_ok=True)
    if keep:
        keep_runs(runs, out / "runs")
    if up_to_step is not None:
        runs = [cut_at(r, up_to_step) for r in runs]
    keys = group_keys(runs, DEFAULT_GROUP_BY if group_by is None else group_by, experiments=group_by is None)
    groups = group_runs(runs, keys)
    mixed = mixed_groups(groups, run_control_keys())
    paired = [paired] if isinstance(paired, str) else list(paired)
    unknown = [ref for ref in paired if ref not in dict(groups)]
    if unknown:  # before anything is written
        raise ValueError(f"--paired {unknown[0]!r}: no such group; the groups are "
                         + ", ".join(repr(label) for label, _ in groups))

    plot_note = "Plots: skipped (--no-plots)."
    if plots:
        try:
            names = write_plots(groups, out, smooth_window)
            plot_note = "Plots: " + ", ".join(f"[{n}]({n})" for n in names) + \
                        " (mean over seeds, shaded ± 1 std over seeds)."
        except ImportError:
            plot_note = "Plots: skipped (matplotlib is not installed: pip install matplotlib)."
    n_partial = sum(not r.complete for r in runs)
    lines = ["# Results", "",
             f"{len(runs)} run{'s' * (len(runs) != 1)} in {len(groups)} group{'s' * (len(groups) != 1)} from "
             + ", ".join(f"`{p}`" for p in paths)
             + (f", each read up to step {up_to_step}" if up_to_step is not None else "")
             + (f"; {n_partial} running or crashed (marked below, their data used as it is)." if n_partial else "."),
             ""]
    lines += header_notes(keys, threshold, smooth_window)
    lines += ["", markdown_table(groups, keys, threshold, smooth_window), ""]
    for w in duplicate_seed_warnings(groups):
        lines += [f"Warning: {w}.", ""]
    for label, why in mixed.items():
        lines += [f"Warning: group `{label}` mixes different experiments ({why}): its row averages over them "
                  "and it gets no interval estimates; group by those keys (--group-by) to compare them.", ""]
    lines += [plot_note, ""]
    if intervals:
        same = [(label, rs) for label, rs in groups if label not in mixed]
        lines += (interval_section(same, keys, threshold, smooth_window, out, plots, strata, reps)
                  if same else ["## Interval estimates", ""])
        if mixed:
            lines += ["Not estimated (mixed experiments, see the warnings above): "
                      + ", ".join(f"`{label}`" for label in mixed) + ".", ""]
    for ref in paired:
        lines += [f"## Paired by seed against `{ref}`", "",
                  "Final held-out success of each group minus this group's, run by run on the seeds both have (runs "
                  "of one seed train on the same rooms and start from the same first batch, so the difference leaves "
                  "out what the seed alone decides); the mean over seeds and its 95% Student's t interval; then the "
                  f"same for the train success of the last {TRAIN_TAIL} steps. An interval holding 0 does not show a "
                  "difference.", "", paired_table(groups, ref), ""]
    lines += ["## Runs", "", runs_table(groups), ""]
    lines += trace_section(runs, out)
    text = "\n".join(lines)
    (out / "results.md").write_text(text)
    return text
