"""ragen_turn.report.intervals: IQM, probability of improvement and the stratified bootstrap against hand cases,
scipy's Mann-Whitney U and a slow numpy resampler."""
from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("scipy")
from scipy.stats import mannwhitneyu  # noqa: E402

from ragen_turn.report import intervals as I  # noqa: E402


@pytest.mark.parametrize("tasks, expected", [
    ([[1, 2, 3, 4, 100]], 3.0),                    # 5 runs: the middle 3
    ([[5, 1, 4, 2, 3]], 3.0),                      # order does not matter
    ([[1, 2, 3, 4, 5, 6, 7, 8]], 4.5),             # 8 runs: 2 cut at each end, mean of 3..6
    ([[1, 2], [3, 4, 5, 6, 7, 8]], 4.5),           # tasks pooled before trimming
    ([[0.25, 0.5, 0.75]], 0.5),                    # 3 runs: int(0.75) = 0 cut, the plain mean
    ([[7.0]], 7.0),
])
def test_iqm_hand_cases(tasks, expected):
    assert float(I.iqm(*[np.array(t, dtype=float) for t in tasks])) == pytest.approx(expected)


def test_iqm_is_vectorised_over_resamples():
    x = np.array([[1, 2, 3, 4, 100], [0, 0, 1, 1, 1]], dtype=float)
    np.testing.assert_allclose(I.iqm(x), [3.0, 2 / 3])


@pytest.mark.parametrize("x, y, expected", [
    ([3, 4], [1, 2], 1.0),                          # every run of x beats every run of y
    ([1, 2], [3, 4], 0.0),
    ([1, 2], [1, 2], 0.5),                          # same runs: no difference
    ([1, 2, 3], [2], 0.5),                          # 3 > 2, 2 = 2 (half), 1 < 2: (1 + 0.5) / 3
    ([0.3, 0.4, 0.5, 0.6, 0.7], [0.1, 0.2, 0.3, 0.4, 0.5], 0.82),  # 19 wins + 3 ties of 25 pairs
])
def test_probability_of_improvement_hand_cases(x, y, expected):
    p = float(I.probability_of_improvement(np.array(x, float), np.array(y, float)))
    assert p == pytest.approx(expected)
    # and the other way round
    assert float(I.probability_of_improvement(np.array(y, float), np.array(x, float))) == pytest.approx(1 - expected)


def test_probability_of_improvement_equals_mann_whitney_u():
    rng = np.random.default_rng(3)
    for _ in range(20):
        x = rng.integers(0, 6, size=rng.integers(2, 9)).astype(float)  # small integers: many ties
        y = rng.integers(0, 6, size=rng.integers(2, 9)).astype(float)
        u = mannwhitneyu(x, y).statistic
        assert float(I.probability_of_improvement(x, y)) == pytest.approx(u / (len(x) * len(y)))


def test_probability_of_improvement_averages_tasks():
    x1, y1 = np.array([3.0, 4.0]), np.array([1.0, 2.0])   # 1.0
    x2, y2 = np.array([1.0, 2.0]), np.array([1.0, 2.0])   # 0.5
    assert float(I.probability_of_improvement(x1, y1, x2, y2)) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="pairs"):
        I.probability_of_improvement(x1, y1, x2)


def test_interval_contains_point_and_is_seeded():
    x = np.array([0.31, 0.45, 0.40, 0.52, 0.38])
    point, lo, hi = I.interval(I.iqm, [x], reps=2000)
    assert point == pytest.approx((0.38 + 0.40 + 0.45) / 3)
    assert x.min() <= lo <= point <= hi <= x.max()
    assert I.interval(I.iqm, [x], reps=2000) == (point, lo, hi)          # same seed, same interval
    z = np.random.default_rng(0).normal(size=12)
    assert I.interval(I.mean, [z], reps=500, seed=1) != I.interval(I.mean, [z], reps=500)  # other seed, other draws


def test_interval_edge_cases():
    assert I.interval(I.iqm, [[0.5] * 5]) == (0.5, 0.5, 0.5)             # no spread: the interval is the point
    point, lo, hi = I.interval(I.iqm, [[0.4]])
    assert point == 0.4 and math.isnan(lo) and math.isnan(hi)          # one run: no interval
    assert all(math.isnan(v) for v in I.interval(I.iqm, [[]]))
    with pytest.raises(ValueError, match="finite"):
        I.interval(I.iqm, [[0.1, float("nan")]])
    np.testing.assert_array_equal(I.finite([0.1, float("nan"), None, float("inf"), 0.2]), [0.1, 0.2])


def test_bootstrap_is_stratified():
    """Task A's runs all score 0 and task B's all 1: a stratified resample always holds 5 of each, so the pooled
    IQM is 0.5 in every resample; resampling the 10 pooled runs together would spread it."""
    a, b = np.zeros(5), np.ones(5)
    assert I.interval(I.iqm, [a, b], reps=2000) == (0.5, 0.5, 0.5)
    point, lo, hi = I.interval(I.iqm, [np.concatenate([a, b])], reps=2000)
    assert point == 0.5 and lo < 0.3 and hi > 0.7


def test_percentile_interval_matches_a_slow_resampler():
    """scipy's percentile bootstrap of the mean vs a plain numpy loop over resamples (different random draws:
    the endpoints agree within Monte Carlo error)."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.5, 0.1, size=12)
    _, lo, hi = I.interval(I.mean, [x], reps=20_000)
    draws = np.array([rng.choice(x, size=x.size, replace=True).mean() for _ in range(20_000)])
    ref_lo, ref_hi = np.percentile(draws, [2.5, 97.5])
    assert lo == pytest.approx(ref_lo, abs=0.005) and hi == pytest.approx(ref_hi, abs=0.005)


def test_improvement_interval():
    x = np.array([0.6, 0.62, 0.65, 0.7, 0.71])
    y = np.array([0.4, 0.42, 0.45, 0.5, 0.51])
    assert I.interval(I.probability_of_improvement, [x, y], reps=2000) == (1.0, 1.0, 1.0)  # x always ahead
    point, lo, hi = I.interval(I.probability_of_improvement, [x, x + 0.001], reps=2000)
    assert point == pytest.approx(0.4) and lo < 0.5 < hi     # x_i > y_j for the 10 pairs i > j of 25: the CI holds 0.5


def test_t_interval_hand_cases():
    """Five values 1..5: mean 3, s = sqrt(2.5), t(4, 0.975) = 2.7764 -> 3 -+ 1.9632; t(1, 0.975) = 12.706."""
    m, lo, hi = I.t_interval([1, 2, 3, 4, 5])
    assert m == 3.0 and lo == pytest.approx(3 - 2.776445 * math.sqrt(2.5) / math.sqrt(5), rel=1e-6)
    assert hi - m == pytest.approx(m - lo) and hi == pytest.approx(4.963243, rel=1e-6)
    m, lo, hi = I.t_interval([0.0, 1.0])
    assert (m, lo, hi) == pytest.approx((0.5, 0.5 - 12.706205 * 0.5, 0.5 + 12.706205 * 0.5), rel=1e-6)
    assert I.t_interval([0.2, 0.2, 0.2]) == (pytest.approx(0.2), pytest.approx(0.2), pytest.approx(0.2))
    m, lo, hi = I.t_interval([0.4])
    assert m == 0.4 and math.isnan(lo) and math.isnan(hi)
    assert all(math.isnan(x) for x in I.t_interval([]))
    with pytest.raises(ValueError):
        I.t_interval([1.0, float("nan")])
    # 90 % is narrower than 95 %
    assert I.t_interval([1, 2, 4], confidence=0.9)[2] < I.t_interval([1, 2, 4])[2]
