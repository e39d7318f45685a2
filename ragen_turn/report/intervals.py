"""Interval estimates for comparing algorithms over a few seeds (Agarwal et al. 2021, "Deep RL at the edge of the
statistical precipice"), on scipy: the interquartile mean, a stratified bootstrap confidence interval, and the
probability of improvement.

Scores come as ``tasks``: a list with one 1-D array per task (stratum), each holding one score per run (seed).
A comparison on one setting has a single task; a report over several settings can pass one array per setting so
that the bootstrap resamples the runs of each setting separately (stratified), never mixing them. Scores are
finite: a run that never reached a threshold is given a censored value by the caller (the report uses a lower
bound and says so).

- :func:`iqm`: mean of the middle 50% of all runs of all tasks pooled (``scipy.stats.trim_mean`` cutting 25% at each
  end; with 5 runs, the mean of the middle 3).
- :func:`interval`: a statistic's point estimate and percentile bootstrap CI from ``scipy.stats.bootstrap``: each
  task's runs are resampled with replacement, independently of the other tasks' (``paired=False``), which is
  rliable's stratified bootstrap.
- :func:`t_interval`: a mean and its Student's t interval, for a handful of scores (a tuning harness's dev batches:
  with 5 values a percentile bootstrap's interval is too narrow, it never reaches past the sample's range).
- :func:`probability_of_improvement`: P(X > Y) + 0.5 P(X = Y) for a run X of algorithm x and a run Y of algorithm
  y on the same task (the Mann-Whitney U statistic over n*m), averaged over tasks; :func:`interval` gives its CI,
  resampling x's and y's runs independently.

rliable itself is not used: its 1.2.0 needs ``arch < 8``, and arch 7.2.0 fails at import with pandas 3
(``deprecate_kwarg``), so it installs only by pinning pandas < 3, plus arch, statsmodels, seaborn and absl, for
what scipy's bootstrap does. The point estimates here equal rliable's ``aggregate_iqm`` and
``probability_of_improvement`` (hand cases in tests/test_intervals.py); on one example (3 algorithms x 5 runs x 2
tasks, rliable 1.2.0 with pandas 2.3 in a separate venv) the points were identical and the CI ends within 0.002 (IQM,
50,000 resamples) and 0.02 (probability of improvement, 20,000) of rliable's.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence, Tuple

import numpy as np

NAN = float("nan")
DEFAULT_REPS = 10_000       # bootstrap resamples
DEFAULT_CONFIDENCE = 0.95


def finite(values: Sequence[float]) -> np.ndarray:
    """The finite values as a float array (NaN / null scores of crashed or unlogged runs are left out)."""
    a = np.asarray(list(values), dtype=float).ravel()
    return a[np.isfinite(a)]


def iqm(*tasks: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean of the runs of all ``tasks`` pooled along ``axis``: ``scipy.stats.trim_mean(.., 0.25)``.

    Shapes: each task ``[..., n_i]``; returns ``[...]``. Vectorised over leading axes (for the bootstrap)."""
    from scipy.stats import trim_mean

    pooled = np.concatenate([np.moveaxis(np.asarray(t, dtype=float), axis, -1) for t in tasks], axis=-1)
    return trim_mean(pooled, 0.25, axis=-1)


def mean(*tasks: np.ndarray, axis: int = -1) -> np.ndarray:
    """Plain mean of the runs of all tasks pooled (for comparison with the IQM)."""
    pooled = np.concatenate([np.moveaxis(np.asarray(t, dtype=float), axis, -1) for t in tasks], axis=-1)
    return pooled.mean(axis=-1)


def _improvement_one(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + 0.5 P(X = Y) over all pairs of runs; x ``[..., n]``, y ``[..., m]`` -> ``[...]``."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    gt = (x[..., :, None] > y[..., None, :]).mean(axis=(-2, -1))
    eq = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return gt + 0.5 * eq


def probability_of_improvement(*xy: np.ndarray, axis: int = -1) -> np.ndarray:
    """``probability_of_improvement(x_1, y_1, x_2, y_2, ...)``: the average over tasks k of P(X_k > Y_k) +
    0.5 P(X_k = Y_k), X_k a run of algorithm x and Y_k a run of algorithm y on task k (the Mann-Whitney U
    statistic divided by n_k m_k). 0.5 = no difference; 1 = every run of x beats every run of y."""
    if len(xy) % 2:
        raise ValueError("probability_of_improvement takes (x, y) pairs, one per task")
    xy = [np.moveaxis(np.asarray(a, dtype=float), axis, -1) for a in xy]
    per_task = [_improvement_one(xy[i], xy[i + 1]) for i in range(0, len(xy), 2)]
    return np.mean(per_task, axis=0)


def interval(statistic: Callable[..., np.ndarray], samples: Sequence[Sequence[float]], reps: int = DEFAULT_REPS,
             confidence: float = DEFAULT_CONFIDENCE, seed: int = 0) -> Tuple[float, float, float]:
    """``(point, low, high)``: ``statistic(*samples)`` and its percentile bootstrap CI (``scipy.stats.bootstrap``,
    every sample resampled with replacement, independently of the others: stratified). ``statistic`` must take
    ``axis=`` (vectorised over resamples). Samples hold finite scores (see :func:`finite`).

    NaN for all three when a sample is empty; the CI is NaN when a sample has a single run (no spread to
    resample). The resampling is seeded: the same inputs give the same interval."""
    from scipy.stats import bootstrap

    samples = [np.asarray(s, dtype=float).ravel() for s in samples]
    if not samples or any(s.size == 0 for s in samples):
        return NAN, NAN, NAN
    if not all(np.all(np.isfinite(s)) for s in samples):
        raise ValueError("interval() takes finite scores only; drop or censor the others first")
    point = float(statistic(*samples))
    if any(s.size < 2 for s in samples):
        return point, NAN, NAN
    res = bootstrap(tuple(samples), statistic, n_resamples=int(reps), confidence_level=confidence,
                    method="percentile", paired=False, vectorized=True, axis=-1, rng=np.random.default_rng(seed))
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)


def t_interval(values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> Tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` and Student's t interval ``mean -+ t(n-1) s / sqrt(n)`` (s: the
    sample standard deviation). NaN for all three when there are no values; the interval is NaN for one value,
    and zero-width when all values are equal. Values must be finite."""
    from scipy.stats import t

    a = np.asarray(list(values), dtype=float).ravel()
    if a.size == 0:
        return NAN, NAN, NAN
    if not np.all(np.isfinite(a)):
        raise ValueError("t_interval() takes finite values only")
    m = float(a.mean())
    if a.size < 2:
        return m, NAN, NAN
    half = float(t.ppf(0.5 + confidence / 2, a.size - 1) * a.std(ddof=1) / math.sqrt(a.size))
    return m, m - half, m + half
