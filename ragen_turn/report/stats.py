"""Per-run and per-group numbers: held-out success at the first / last / best evaluation, steps to a
threshold, the collapse measure (largest drop below the running maximum), means over training steps, wall
time, and each run's scores for the interval estimates (IQM and bootstrap CI per group,
:mod:`ragen_turn.report.intervals`)."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ragen_turn.cfg_get import cfg_get
from ragen_turn.report.runs import Run, _finite
from ragen_turn.runfiles import NAN, STEP_S, TRAIN_SUCCESS, VAL_S, VAL_SUCCESS


def mean_std(values: Sequence[float]) -> Tuple[float, float, int]:
    """Mean and sample std (n-1) of the finite values, and how many there were."""
    vals = [v for v in values if _finite(v)]
    n = len(vals)
    if n == 0:
        return NAN, NAN, 0
    m = sum(vals) / n
    s = math.sqrt(sum((v - m) ** 2 for v in vals) / (n - 1)) if n > 1 else NAN
    return m, s, n


def final_eval(run: Run, key: str) -> float:
    """The value of ``key`` at the run's last held-out evaluation (NaN if it was null, or no eval)."""
    _, vals = run.series(key)
    return vals[-1] if vals else NAN


def init_eval(run: Run, key: str) -> float:
    steps, vals = run.series(key)
    return vals[0] if steps and steps[0] == 0 else NAN


def best_eval(run: Run, key: str) -> float:
    """Max of ``key`` over the run's held-out evaluations after step 0 (the best evaluated checkpoint)."""
    steps, vals = run.series(key)
    vals = [v for s, v in zip(steps, vals) if s > 0 and _finite(v)]
    return max(vals) if vals else NAN


def steps_to_threshold(run: Run, threshold: float, key: str = VAL_SUCCESS) -> Optional[int]:
    """First evaluated step after step 0 where ``key`` >= threshold, or None (a warm start already above the
    threshold does not count as reaching it at step 0)."""
    for s, v in zip(*run.series(key)):
        if s > 0 and _finite(v) and v >= threshold:
            return s
    return None


def max_drop(values: Sequence[float]) -> float:
    """Largest fall of a curve below its running maximum (NaN points skipped); 0 for a curve that never falls."""
    best, drop, seen = -math.inf, 0.0, False
    for v in values:
        if not _finite(v):
            continue
        seen = True
        best = max(best, v)
        drop = max(drop, best - v)
    return drop if seen else NAN


def smooth(values: Sequence[float], window: int) -> List[float]:
    """Trailing moving average over the finite values of the last ``window`` points (NaN where none)."""
    if window <= 1:
        return list(values)
    out = []
    for i in range(len(values)):
        m, _, n = mean_std(values[max(0, i - window + 1): i + 1])
        out.append(m if n else NAN)
    return out


def train_mean(run: Run, key: str, tail: Optional[int] = None) -> float:
    _, vals = run.series(key)
    vals = [v for v in vals if _finite(v)]
    if tail:
        vals = vals[-tail:]
    return sum(vals) / len(vals) if vals else NAN


def wall_minutes(run: Run) -> float:
    """Minutes the run's logged steps and evaluations took: the sum of ``perf/step_s`` and ``perf/val_s`` (process
    start, model load and the warm start are not in it). NaN when it logged neither."""
    vals = [v for key in (STEP_S, VAL_S) for v in run.series(key)[1] if _finite(v)]
    return sum(vals) / 60 if vals else NAN


# ------------------------------------------------------------------------------------------------ interval estimates
# Per group: the interquartile mean (IQM) over its runs and a 95% stratified bootstrap CI (report/intervals.py, on
# scipy), and the probability that a run of one group beats a run of another. Each metric is
# ``(title, fn(run, threshold, smooth_window) -> (score, censored))``; a censored score is a lower bound.
def _steps_to_censored(run: Run, threshold: float, smooth_window: int) -> Tuple[float, bool]:
    """Steps to the threshold; a run that never reached it counts as its last step + ``trainer.test_freq`` (the
    first evaluation it did not have), a lower bound, marked censored."""
    hit = steps_to_threshold(run, threshold)
    if hit is not None:
        return float(hit), False
    if run.last_step is None:
        return NAN, False
    freq = cfg_get(run.config, "trainer.test_freq")
    freq = int(freq) if isinstance(freq, int) and not isinstance(freq, bool) and freq > 0 else 1
    return float(run.last_step + freq), True


INTERVAL_METRICS = [
    ("final val success", lambda r, thr, w: (final_eval(r, VAL_SUCCESS), False)),
    ("best val success", lambda r, thr, w: (best_eval(r, VAL_SUCCESS), False)),
    ("steps to {thr}", _steps_to_censored),
    ("collapse", lambda r, thr, w: (max_drop(smooth(r.series(TRAIN_SUCCESS)[1], w)), False)),
    ("final MI", lambda r, thr, w: (final_eval(r, "collapse/mi_estimate"), False)),
]
IMPROVEMENT_METRIC = "final val success"


def _strata(runs: Sequence[Run], strata: Sequence[str]) -> List[List[Run]]:
    """The runs of a group split by the ``strata`` config keys (one list when there are none)."""
    by: Dict[Tuple[str, ...], List[Run]] = {}
    for r in runs:
        by.setdefault(tuple(str(cfg_get(r.config, k)) for k in strata), []).append(r)
    return [by[k] for k in sorted(by)]


def metric_scores(runs: Sequence[Run], metric: int, threshold: float, smooth_window: int,
                  strata: Sequence[str] = ()) -> Tuple[List[List[float]], int]:
    """Finite scores of ``INTERVAL_METRICS[metric]`` per stratum, and how many of them are censored."""
    fn = INTERVAL_METRICS[metric][1]
    tasks, censored = [], 0
    for part in _strata(runs, strata):
        vals = []
        for r in part:
            v, cen = fn(r, threshold, smooth_window)
            if _finite(v):
                vals.append(v)
                censored += cen
        tasks.append(vals)
    return tasks, censored


def interval_estimates(groups: Sequence[Tuple[str, List[Run]]], threshold: float, smooth_window: int = 1,
                       strata: Sequence[str] = (), reps: int = 10_000) -> Dict[str, Dict[str, Any]]:
    """``{metric title: {group label: (point, low, high, censored, n)}}`` for the metrics some run has."""
    from ragen_turn.report import intervals

    out: Dict[str, Dict[str, Any]] = {}
    for i, (title, _) in enumerate(INTERVAL_METRICS):
        title = title.format(thr=f"{threshold:g}")
        per = {}
        for label, runs in groups:
            tasks, cen = metric_scores(runs, i, threshold, smooth_window, strata)
            tasks = [t for t in tasks if t]
            n = sum(len(t) for t in tasks)
            per[label] = (*intervals.interval(intervals.iqm, tasks, reps=reps), cen, n) if n else (NAN, NAN, NAN, 0, 0)
        if any(_finite(v[0]) for v in per.values()):
            out[title] = per
    return out


def run_scores(groups: Sequence[Tuple[str, List[Run]]], threshold: float,
               smooth_window: int = 1) -> Dict[str, Dict[str, List[float]]]:
    """``{metric title: {group label: every run's finite score}}`` (drawn by :func:`write_interval_plot`)."""
    out: Dict[str, Dict[str, List[float]]] = {}
    for i, (title, _) in enumerate(INTERVAL_METRICS):
        out[title.format(thr=f"{threshold:g}")] = {
            label: [v for task in metric_scores(runs, i, threshold, smooth_window)[0] for v in task]
            for label, runs in groups}
    return out
