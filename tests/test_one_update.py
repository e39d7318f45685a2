"""benchmarks/one_update.py's testable pieces (the harness itself is a benchmark, not a test): the seed rule (dev
seeds apart from every comparison's batches), the aggregation over batches, the choice rule and the tuning grid."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from ragen_turn.rollout.env_manager import train_env_seed

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("one_update", REPO / "benchmarks" / "one_update.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(label, fmt_errs, successes, kls=None, lives=None, seeds=None):
    seeds = seeds or list(range(100, 100 + len(fmt_errs)))
    kls = kls or [0.01] * len(fmt_errs)
    lives = lives or [1.0] * len(fmt_errs)
    return [{"label": label, "seed": s, "format_errors": f, "success": w, "update_kl": k, "live": li}
            for s, f, w, k, li in zip(seeds, fmt_errs, successes, kls, lives)]


def test_dev_batches_are_no_comparison_batch(bench):
    """The harness's batch for run seed S is step 0's of a run with seed S (env seeds from (S, step, group)): the
    dev seeds' env seeds meet none of the evaluation seeds' (0-19 here, every step of a 60-step run, 16 groups)."""
    groups = range(16)
    dev = {train_env_seed(s, 0, g) for s in bench.DEV_SEEDS for g in groups}
    evaluation = {train_env_seed(s, t, g) for s in range(20) for t in range(60) for g in groups}
    assert len(dev) == len(bench.DEV_SEEDS) * len(groups) and not dev & evaluation
    # and the mapping is the env manager's: seed S's step-0 batch is the harness's seed-S batch
    assert train_env_seed(1, 0, 3) == train_env_seed(1, 0, 3) != train_env_seed(0, 1, 3)
    assert min(bench.DEV_SEEDS) >= bench.FIRST_DEV_SEED == 100


def test_the_harness_refuses_evaluation_seeds(bench, capsys):
    bench.check_seeds([100, 104], [], allow_eval=False)  # dev seeds: fine
    with pytest.raises(SystemExit) as e:
        bench.check_seeds([0, 1, 100], [], allow_eval=False)
    assert e.value.code == 2 and "error: --seeds [0, 1]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench.check_seeds([100], ["algo=turn_ppo", "seed=2"], allow_eval=False)
    assert e.value.code == 2 and "--seeds" in capsys.readouterr().err
    bench.check_seeds([3], [], allow_eval=True)
    assert "warning: --seeds [3]" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # the command line says so too, before any work
        bench.main(["--seeds", "0", "1", "--only", "token_ppo"])
    assert e.value.code == 2


def test_summary_is_the_mean_and_t_interval_over_batches(bench):
    """Five batches: format errors 0.1..0.5 -> mean 0.3, t(4) interval 0.3 -+ 2.776 x 0.158 / sqrt 5."""
    rows = _rows("a", [0.1, 0.2, 0.3, 0.4, 0.5], [0.2] * 5, lives=[0.5, 0.7, 0.9, 1.0, 0.9])
    s = bench.summarize(rows)["a"]
    m, lo, hi, n = s["format_errors"]
    assert (m, n) == (pytest.approx(0.3), 5)
    assert hi - m == pytest.approx(2.776445 * math.sqrt(0.025) / math.sqrt(5), rel=1e-5)
    assert m - lo == pytest.approx(hi - m)
    assert s["success"][:3] == (pytest.approx(0.2), pytest.approx(0.2), pytest.approx(0.2))  # no spread: no width
    assert s["live"][0] == pytest.approx(0.8) and "dev_success" not in s
    assert bench.live_share([{"live": 0.5}, {"live": None}, {"live": 1.0}]) == pytest.approx(0.75)
    assert bench.live_share([]) is None


def test_paired_difference_uses_the_same_batches(bench):
    rows = _rows("ref", [0.3, 0.5, 0.1], [0, 0, 0]) + _rows("b", [0.4, 0.6, 0.2, 0.9], [0] * 4)
    m, lo, hi, n = bench.paired_difference(rows, "b", "ref")
    assert n == 3 and m == pytest.approx(0.1) and lo == pytest.approx(0.1) and hi == pytest.approx(0.1)


def test_the_rule_picks_the_best_mean_success_within_tol_of_the_reference(bench):
    rows = (_rows("token_ppo", [0.20, 0.30, 0.25], [0.10, 0.20, 0.15])
            + _rows("x lr=1", [0.30, 0.40, 0.35], [0.40, 0.40, 0.40])    # +0.10: inside, best success
            + _rows("x lr=2", [0.50, 0.60, 0.55], [0.90, 0.90, 0.90])    # +0.30: outside, whatever its success
            + _rows("x lr=3", [0.10, 0.10, 0.10], [0.30, 0.30, 0.30]))
    summary = bench.summarize(rows)
    labels = ["x lr=1", "x lr=2", "x lr=3"]
    assert bench.choose(summary, labels, "token_ppo", tol=0.1)[0] == "x lr=1"
    assert bench.choose(summary, labels, "token_ppo", tol=0.05)[0] == "x lr=3"
    assert bench.choose(summary, ["x lr=2"], "token_ppo", tol=0.1)[0] is None
    assert bench.choose(summary, labels, "missing", tol=0.1)[0] is None
    # a grid point on fewer batches than the reference (a stopped call) is not compared
    short = bench.summarize(rows + _rows("x lr=4", [0.1, 0.1], [0.9, 0.9]))
    assert bench.choose(short, labels + ["x lr=4"], "token_ppo", tol=0.1)[0] == "x lr=1"
    # ties in success: fewer format errors wins
    tie = bench.summarize(_rows("r", [0.3], [0.1]) + _rows("p", [0.2], [0.5]) + _rows("q", [0.1], [0.5]))
    assert bench.choose(tie, ["p", "q"], "r")[0] == "q"
    assert bench.group_of("turn_ppo lr=0.0002 clip=x1") == "turn_ppo" and bench.group_of("grpo") == "grpo"


def test_the_grid_is_the_same_for_every_algorithm(bench):
    """Every algorithm gets the same lrs x clip multipliers, each multiplier on its own shipped clip range."""
    shipped = {"token_ppo": (0.2, 0.28), "st_ppo": (3e-4, 4e-4)}

    def compose(overrides):
        low, high = shipped[overrides[0].split("=")[1]]
        return SimpleNamespace(actor_rollout_ref=SimpleNamespace(actor=SimpleNamespace(clip_ratio_low=low,
                                                                                       clip_ratio_high=high)))

    grid = bench.tune_variants(["token_ppo", "st_ppo"], [1e-4, 2e-4], [0.5, 1.0], compose=compose)
    assert len(grid) == 8
    assert grid["token_ppo lr=0.0002 clip=x1"] == ["algo=token_ppo", "actor_rollout_ref.actor.optim.lr=0.0002",
                                                   "actor_rollout_ref.actor.clip_ratio_low=0.2",
                                                   "actor_rollout_ref.actor.clip_ratio_high=0.28"]
    assert grid["st_ppo lr=0.0001 clip=x0.5"][2:] == ["actor_rollout_ref.actor.clip_ratio_low=0.00015",
                                                      "actor_rollout_ref.actor.clip_ratio_high=0.0002"]
    assert {bench.group_of(lb) for lb in grid} == {"token_ppo", "st_ppo"}
    assert bench._default_ref([{"label": lb} for lb in grid]) == "token_ppo lr=0.0002 clip=x1"


def test_summarize_reads_the_rows_back(bench, tmp_path, capsys):
    import json

    path = tmp_path / "rows.jsonl"
    rows = _rows("token_ppo", [0.2, 0.3], [0.1, 0.2]) + _rows("turn_ppo", [0.25, 0.3], [0.3, 0.3])
    rows.append({"label": "(warm start)", "seed": 100, "format_errors": 0.5, "success": 0.0, "update_kl": 0.0})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    choices = bench.main(["--summarize", str(path), "--markdown"])
    out = capsys.readouterr().out
    assert choices == {"token_ppo": "token_ppo", "turn_ppo": "turn_ppo"} and "(warm start)" not in out
    assert "0.250 [" in out  # token_ppo's mean format errors with its interval
    # the Markdown row: turn_ppo's paired difference to token_ppo, +0.05 and +0.0 on the two batches
    assert "| `turn_ppo` | 2 | 0.275 [" in out and "| 0.025 [" in out and "| **yes** |" in out
