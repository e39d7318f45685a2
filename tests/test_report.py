"""ragen_turn.report on synthetic runs: hand-computed table cells, a crashed run, null / NaN values, plots."""
from __future__ import annotations

import json
import math
import statistics
import sys

import pytest
import yaml

from ragen_turn import report

N = None  # null in metrics.jsonl


def write_run(root, name, algo, seed, rows, total=4, tail="", env="sokoban"):
    """A run directory as the trainers write it: config.yaml + metrics.jsonl (rows = dicts, one per step)."""
    d = root / name
    d.mkdir(parents=True)
    cfg = {"seed": seed, "algo": {"name": algo}, "env": {"name": env}, "model": {"name": "tiny"},
           "algorithm": {"gamma": 0.99, "lam": 0.9}, "trainer": {"total_training_steps": total}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    if rows is not None:
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return d


def train_row(step, env_success, clip=0.0, kl=0.01, step_s=2.0, clip_turn=None, **val):
    row = {"step": step, "env/success": env_success, "env/reward": 0.0, "actor/clip_frac_token": clip,
           "actor/clip_frac_turn": clip if clip_turn is None else clip_turn, "actor/approx_kl": kl,
           "perf/step_s": step_s}
    row.update({f"val/{k}": v for k, v in val.items()})
    return row


def val_row(step, success, reward):
    return {"step": step, "val/success": success, "val/reward": reward, "val/turns": 3.0}


@pytest.fixture
def runs_dir(tmp_path):
    root = tmp_path / "runs"
    # turn_ppo: three finished seeds (evals at steps 0, 2, 4)
    for seed, vs, vr, env, clip in [(0, (0.0, 0.5, 0.75), (-1.0, 1.0, 2.0), (0.2, 0.6, 0.3, 0.5), 0.1),
                                    (1, (0.25, 0.25, 0.5), (-0.5, 0.0, 1.0), (0.4, 0.4, 0.4, 0.4), 0.2),
                                    (2, (0.0, 0.25, 0.25), (-1.0, -0.5, 0.0), (0.2, 0.1, 0.3, 0.0), 0.3)]:
        rows = [val_row(0, vs[0], vr[0])]
        for step in range(1, 5):
            val = dict(success=vs[step // 2], reward=vr[step // 2]) if step % 2 == 0 else {}
            rows.append(train_row(step, env[step - 1], clip=clip, clip_turn=0.05, **val))
        write_run(root, f"sokoban_turn_ppo_tiny_s{seed}", "turn_ppo", seed, rows)
    # grpo seed 0: finished, a null training success and a null / NaN final eval
    rows = [val_row(0, 0.25, 0.0), train_row(1, 0.5, kl=0.02, step_s=1.0),
            train_row(2, N, kl=0.02, step_s=1.0, success=0.5, reward=0.5), train_row(3, 0.25, kl=0.02, step_s=1.0),
            train_row(4, 0.75, kl=0.02, step_s=1.0, success=N, reward=float("nan"))]
    write_run(root, "sokoban_grpo_tiny_s0", "grpo", 0, rows)
    # grpo seed 1: crashed in step 3, its last line cut off
    rows = [val_row(0, 0.0, -1.0), train_row(1, 0.25, clip=0.1, kl=0.04, step_s=3.0),
            train_row(2, 0.5, clip=0.1, kl=0.04, step_s=3.0, success=0.25, reward=-0.5)]
    write_run(root, "sokoban_grpo_tiny_s1", "grpo", 1, rows, tail='{"step": 3, "env/succ')
    # token_ppo: stopped before its first metrics line (config.yaml only)
    write_run(root, "sokoban_token_ppo_tiny_s0", "token_ppo", 0, None)
    return root


EXPECTED_ROWS = [
    "| grpo | 2 (1 running or crashed: seed 1: last step 2 of 4) | 0.125 ± 0.177 | 0.250 | 0.375 ± 0.177 | -0.500 | "
    "0.000 ± 0.707 | 0.438 ± 0.088 | 2 (1/2) | 0.125 ± 0.177 | 0.0500 ± 0.0707 | 0.0500 ± 0.0707 | "
    "0.03000 ± 0.01414 | 2.0 ± 1.4 | 3 (+1 bad lines) |",
    "| token_ppo | 1 (1 running or crashed: seed 0: no metrics yet, of 4 steps) | - | - | - | - | - | - | "
    "not reached (0/1) | - | - | - | - | - | 0 |",
    "| turn_ppo | 3 | 0.083 ± 0.144 | 0.500 ± 0.250 | 0.500 ± 0.250 | 1.000 ± 1.000 | 1.000 ± 1.000 | "
    "0.317 ± 0.144 | 3 ± 1 (2/3) | 0.200 ± 0.173 | 0.2000 ± 0.1000 | 0.0500 ± 0.0000 | 0.01000 ± 0.00000 | "
    "2.0 ± 0.0 | 0 |",
]


def test_table_on_synthetic_runs(runs_dir, tmp_path):
    out = tmp_path / "out"
    text = report.build_report([str(runs_dir)], out, plots=False)
    assert (out / "results.md").read_text() == text
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| algo.name |"))
    assert lines[head] == ("| algo.name | runs | init val success | final val success | best val success | "
                           "final val reward | best val reward | train success (last 5) | steps to 0.5 | collapse | "
                           "clip token | clip turn | KL | s/step | NaN |")
    assert lines[head + 2: head + 5] == EXPECTED_ROWS  # grpo, token_ppo, turn_ppo: the algo order of the papers
    assert "6 runs in 3 groups" in text and "2 running or crashed" in text
    # every column is defined above the table
    for word in ("**success**", "**reward**", "**held-out**", "**train**", "**init**", "**final**", "**best**",
                 "**steps to 0.5**", "**collapse**", "**clip token / clip turn**", "**KL**", "**NaN**"):
        assert word in text
    assert "Plots: skipped (--no-plots)" in text
    # the per-run section marks the crashed run and the cut-off line
    run_line = next(ln for ln in lines if "sokoban_grpo_tiny_s1" in ln)
    assert "running or crashed: last step 2 of 4" in run_line and run_line.endswith("| 1 |")


def test_loading_crashed_run_and_nan(runs_dir):
    run = report.load_run(runs_dir / "sokoban_grpo_tiny_s1")
    assert run.bad_lines == 1 and run.last_step == 2 and not run.complete
    assert run.status() == "running or crashed: last step 2 of 4"
    run = report.load_run(runs_dir / "sokoban_grpo_tiny_s0")
    assert run.complete and run.nan_counts["val/success"] == 1 and run.nan_counts["val/reward"] == 1
    assert math.isnan(report.final_eval(run, "val/success"))
    assert report.best_eval(run, "val/success") == 0.5
    assert report.steps_to_threshold(run, 0.5) == 2 and report.steps_to_threshold(run, 0.9) is None


def test_resumed_run_last_line_per_step_wins(tmp_path):
    rows = [val_row(0, 0.0, 0.0), train_row(1, 0.1), train_row(2, 0.9), train_row(1, 0.3), train_row(2, 0.4)]
    run = report.load_run(write_run(tmp_path, "r", "turn_ppo", 0, rows, total=2))
    assert [r["step"] for r in run.rows] == [0, 1, 2]
    assert run.series("env/success")[1] == [0.3, 0.4]


def test_wall_minutes_per_run(runs_dir, tmp_path):
    # the logged steps' and evaluations' seconds: 2 steps of 3 s; with evaluations of 30 s and 42 s, 78 s
    assert report.wall_minutes(report.load_run(runs_dir / "sokoban_grpo_tiny_s1")) == pytest.approx(0.1)
    rows = [dict(val_row(0, 0.0, 0.0), **{"perf/val_s": 30.0}), train_row(1, 0.1, step_s=3.0),
            dict(train_row(2, 0.2, step_s=3.0, success=0.5, reward=0.0), **{"perf/val_s": 42.0})]
    assert report.wall_minutes(report.load_run(write_run(tmp_path, "r", "grpo", 0, rows, total=2))) == \
        pytest.approx(78 / 60)
    assert math.isnan(report.wall_minutes(report.load_run(runs_dir / "sokoban_token_ppo_tiny_s0")))
    text = report.build_report([str(runs_dir)], tmp_path / "o", plots=False)
    assert "| final val success | wall min | NaN | bad lines |" in text
    line = next(ln for ln in text.splitlines() if "sokoban_grpo_tiny_s1" in ln)
    assert line.endswith("| 0.250 | 0.1 | 0 | 1 |")


def test_max_drop_and_smoothing():
    assert report.max_drop([0.1, 0.5, 0.2, 0.6, 0.55]) == pytest.approx(0.3)
    assert report.max_drop([0.1, 0.2, 0.3]) == 0.0
    assert report.max_drop([float("nan"), 0.5, float("nan"), 0.1]) == pytest.approx(0.4)
    assert math.isnan(report.max_drop([float("nan")]))
    assert report.smooth([0.0, 1.0, 0.0, 1.0], 2) == [0.0, 0.5, 0.5, 0.5]


def test_group_by_several_keys_and_duplicate_seeds(runs_dir, tmp_path):
    text = report.build_report([str(runs_dir)], tmp_path / "o", ["algorithm.gamma", "algorithm.lam"], plots=False)
    assert "| algorithm.gamma, algorithm.lam | runs |" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| 0.99, 0.9 |"))
    assert row.startswith("| 0.99, 0.9 | 6 (2 running or crashed")  # every run in one group
    assert "Warning: group `0.99, 0.9` holds several runs with seed 0, 1" in text


def test_threshold_option(runs_dir, tmp_path):
    text = report.build_report([str(runs_dir)], tmp_path / "o", threshold=0.25, plots=False)
    assert "steps to 0.25" in text
    turn = next(ln for ln in text.splitlines() if ln.startswith("| turn_ppo |"))
    assert "| 2 ± 0 (3/3) |" in turn  # evaluated at 0 (above 0.25: the warm start), 2, 2: step 0 does not count


def test_plots_written(runs_dir, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "o"
    text = report.build_report([str(runs_dir / "sokoban_turn_ppo_tiny_s0"), str(runs_dir / "sokoban_grpo_tiny_s1")],
                               out)
    for name in ("success.png", "reward.png", "clip_kl.png"):
        assert (out / name).stat().st_size > 1000
        assert f"[{name}]({name})" in text


def test_without_matplotlib_table_still_written(runs_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "o"
    text = report.build_report([str(runs_dir)], out)
    assert "Plots: skipped (matplotlib is not installed" in text
    assert EXPECTED_ROWS[2] in (out / "results.md").read_text()
    assert not (out / "success.png").exists()


def test_cli(runs_dir, tmp_path, capsys):
    out = tmp_path / "cli"
    assert report.main(["--no-plots", str(runs_dir), "--out", str(out), "--group-by", "algo.name"]) == 0
    printed = capsys.readouterr().out
    assert EXPECTED_ROWS[0] in printed and (out / "results.md").is_file()
    assert report.main([str(tmp_path / "missing"), "--out", str(out)]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report.main([str(empty), "--out", str(out)]) == 2


def test_run_discovery_skips_hydra_and_checkpoints(runs_dir):
    run = runs_dir / "sokoban_turn_ppo_tiny_s0"
    (run / "hydra" / ".hydra").mkdir(parents=True)
    (run / "hydra" / ".hydra" / "config.yaml").write_text("trainer: {total_training_steps: 1}\n")
    (run / "checkpoints" / "step_000004" / "actor").mkdir(parents=True)
    (run / "checkpoints" / "step_000004" / "actor" / "config.yaml").write_text("trainer: {}\n")
    found = report.find_runs([str(runs_dir)])
    assert len(found) == 6 and run in found
    assert report.find_runs([str(run / "metrics.jsonl")]) == [run]


def test_extra_evals_become_columns(runs_dir, tmp_path):
    """eval.sh outputs saved as <run>/eval_<name>.json give a '<name> success' column (mean ± std over the
    runs that have one; a broken file is skipped)."""
    for seed, s in [(0, 0.5), (1, 0.75)]:
        (runs_dir / f"sokoban_turn_ppo_tiny_s{seed}" / "eval_greedy.json").write_text(
            json.dumps({"val/success": s, "episodes": 256}))
    (runs_dir / "sokoban_turn_ppo_tiny_s2" / "eval_greedy.json").write_text("{not json")
    text = report.build_report([str(runs_dir)], tmp_path / "out", plots=False)
    lines = text.splitlines()
    head = next(ln for ln in lines if ln.startswith("| algo.name |"))
    assert head.endswith("| NaN | greedy success |")
    rows = {ln.split(" | ")[0][2:]: ln for ln in lines if ln.startswith("| ") and " | " in ln}
    assert rows["turn_ppo"].endswith("| 0 | 0.625 ± 0.177 |")
    assert rows["grpo"].endswith("| - |")
    assert "**<name> success**" in text


def test_pass_at_k_and_collapse_columns_appear_when_logged(tmp_path):
    root = tmp_path / "runs"
    for seed, passk, mi in [(0, (0.5, 0.75), (0.4, 0.2)), (1, (0.25, 0.25), (0.6, 0.3))]:
        rows = [{**val_row(0, 0.0, 0.0), "val/pass@4": passk[0]},
                {**train_row(1, 0.5), "collapse/mi_estimate": mi[0], "collapse/mi_zscore": 2 * mi[0],
                 "collapse/conditional_entropy_est": 1.0},
                {**train_row(2, 0.5, success=0.5, reward=0.0), "val/pass@4": passk[1],
                 "collapse/mi_estimate": mi[1], "collapse/mi_zscore": 2 * mi[1],
                 "collapse/conditional_entropy_est": 3.0}]
        write_run(root, f"sokoban_turn_ppo_tiny_s{seed}", "turn_ppo", seed, rows, total=2)
    text = report.build_report([str(root)], out=tmp_path / "out", plots=False)
    head = next(line for line in text.splitlines() if line.startswith("| algo.name"))
    assert head.endswith("| final val pass@k | MI | MI z | H(Z|X) |")
    row = next(line for line in text.splitlines() if line.startswith("| turn_ppo"))
    assert row.endswith("| 0.500 ± 0.354 | 0.250 ± 0.071 | 0.500 ± 0.141 | 3.000 ± 0.000 |")
    assert "**MI / MI z / H(Z|X)**" in text


def test_out_defaults_beside_the_runs_never_the_docs(runs_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert report.main([str(runs_dir), "--no-plots"]) == 0
    assert (runs_dir / "report" / "results.md").is_file() and not (tmp_path / "docs").exists()
    assert report.main([str(runs_dir / "sokoban_turn_ppo_tiny_s0"), "--no-plots"]) == 0
    assert (runs_dir / "sokoban_turn_ppo_tiny_s0" / "report" / "results.md").is_file()
    assert report.default_out([str(runs_dir / "a"), str(runs_dir / "b" / "c")]) == runs_dir.resolve() / "report"
    # the report folder is not taken for a run the next time
    assert len(report.find_runs([str(runs_dir)])) == 6


def test_runs_of_two_envs_are_never_one_group(tmp_path):
    root = tmp_path / "runs"
    for env, vs in (("sokoban", 0.5), ("webshop", 0.1)):
        write_run(root, f"{env}_turn_ppo_tiny_s0", "turn_ppo", 0, [val_row(0, 0.0, 0.0), val_row(4, vs, 0.0)], env=env)
    text = report.build_report([str(root)], tmp_path / "o", plots=False)
    assert "| sokoban, turn_ppo | 1 |" in text and "| webshop, turn_ppo | 1 |" in text
    assert "holds several runs with seed" not in text


def _section(text, title):
    lines = text.splitlines()
    start = lines.index(title)
    return lines[start:]


def test_interval_estimates_on_synthetic_runs(runs_dir, tmp_path):
    """IQM [95% CI] per group, hand-computed: turn_ppo's final held-out successes 0.75, 0.5, 0.25 (IQM of 3 runs =
    their mean 0.5); steps to 0.5: 2, 4 and a run that never reached it, censored at its last step 4 + 1 (no
    trainer.test_freq in its config) -> IQM 11/3, a lower bound; collapse 0.3, 0, 0.3 -> 0.2. grpo has one finite
    final success (0.25): no interval. P(turn_ppo > grpo) = (2 wins + 0.5 tie) / 3."""
    pytest.importorskip("scipy")
    text = report.build_report([str(runs_dir)], tmp_path / "out", plots=False, reps=2000)
    sec = _section(text, "## Interval estimates")
    head = next(ln for ln in sec if ln.startswith("| algo.name | runs |"))
    assert head == ("| algo.name | runs | final val success: IQM [95% CI] | best val success: IQM [95% CI] | "
                    "steps to 0.5: IQM [95% CI] | collapse: IQM [95% CI] |")  # no MI column: none logged
    row = next(ln for ln in sec if ln.startswith("| `turn_ppo` |")).split(" | ")
    assert row[2].startswith("0.500 [0.250") and row[2].endswith("0.750]")
    assert row[4].startswith("≥ 3.7 [") and row[4].endswith("(1/3 censored)")
    assert row[5] == "0.200 [0.000, 0.300] |"
    grpo = next(ln for ln in sec if ln.startswith("| `grpo` |")).split(" | ")
    assert grpo[2] == "0.250 [no CI]"
    assert next(ln for ln in sec if ln.startswith("| `token_ppo` |")).endswith("| - | - | - | - |")
    poi = next(ln for ln in sec if ln.startswith("| `turn_ppo` |") and "0.83" in ln)
    assert poi == "| `turn_ppo` | 0.83 [no CI] | - | - |"
    assert "| `grpo` | - | - | 0.17 [no CI] |" in sec
    # the main table's rows are unchanged by the section below it
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| algo.name | runs | init"))
    assert lines[head + 2: head + 5] == EXPECTED_ROWS


def test_interval_plot_and_strata(runs_dir, tmp_path):
    pytest.importorskip("scipy")
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    text = report.build_report([str(runs_dir)], out, reps=500, strata=["seed"])
    assert (out / "intervals.png").stat().st_size > 1000 and "[intervals.png](intervals.png)" in text
    assert "stratified by `seed`" in text
    # each seed its own stratum: one run per stratum, nothing to resample: the pooled IQM and no interval
    row = next(ln for ln in _section(text, "## Interval estimates") if ln.startswith("| `turn_ppo` |"))
    assert row.startswith("| `turn_ppo` | 3 | 0.500 [no CI] |")


def test_interval_section_without_scipy(runs_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy", None)
    text = report.build_report([str(runs_dir)], tmp_path / "out", plots=False)
    assert "Skipped: scipy is not installed" in text and "| algo.name | runs | init" in text


def test_window_means_script(tmp_path):
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "window_means", os.path.join(os.path.dirname(__file__), "..", "scripts", "window_means.py"))
    wm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wm)
    # one line per step, as the trainers write it; step 6 also holds an evaluation, step 3's entropy is null
    rows = [{"step": 0, "val/success": 0.1}] + [{"step": s, "actor/entropy": float(s)} for s in range(1, 6)] \
        + [{"step": 6, "actor/entropy": 6.0, "val/success": 0.25}]
    rows[3]["actor/entropy"] = None
    run = write_run(tmp_path, "run_a", "st_ppo", 0, rows)
    got = wm.window_means(report.load_run(run), "actor/entropy", wm.parse_windows("1-5,6-10,11-20"))
    assert got == [(1 + 2 + 4 + 5) / 4, 6.0, None]
    out = wm.table([str(run)], ["actor/entropy"], wm.parse_windows("1-5,6"), digits=1)
    assert out.splitlines()[-1] == "| run_a | 3.0 / 6.0 | 0.250 |"


def test_stability_plot_only_when_logged(runs_dir, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "o"
    report.build_report([str(runs_dir / "sokoban_turn_ppo_tiny_s0")], out)
    assert not (out / "stability.png").exists()  # the fixture's runs log no entropy, format errors or lengths
    rows = [val_row(0, 0.25, 0.0)] + [dict(train_row(s, 0.5), **{"actor/entropy": 0.1 * s,
                                                                  "env/format_error_rate": 0.05 * s,
                                                                  "env/response_tokens": 100.0 + s})
                                      for s in range(1, 5)]
    run = write_run(tmp_path / "r", "sokoban_st_ppo_tiny_s0", "st_ppo", 0, rows)
    text = report.build_report([str(run)], out)
    assert (out / "stability.png").stat().st_size > 1000 and "[stability.png](stability.png)" in text


def _table(text):
    """The table lines above the per-run section (which names each run's path)."""
    return [ln for ln in text.split("## Runs")[0].splitlines() if ln.startswith("| ")]


def test_kept_runs_rebuild_the_same_report(runs_dir, tmp_path):
    """--keep-runs: the report rebuilt from <out>/runs alone (the runs gone) has the same table and intervals, but
    for the torn-line count, which the copies no longer carry; the copies hold only the keys the report reads."""
    out = tmp_path / "out"
    first = report.build_report([str(runs_dir)], out, plots=False, keep=True)
    kept = out / "runs"
    # plain names, <algo>_s<seed>
    assert sorted(p.name for p in kept.iterdir()) == ["grpo_s0", "grpo_s1", "token_ppo_s0", "turn_ppo_s0",
                                                       "turn_ppo_s1", "turn_ppo_s2"]
    rows = [json.loads(x) for x in (kept / "grpo_s0" / "metrics.jsonl").read_text().splitlines()]
    assert rows[4]["val/success"] is None and rows[4]["val/reward"] is None  # NaN / null stay null
    assert set().union(*rows) <= set(report.KEPT_KEYS) | {"step", "val/turns"}
    import shutil
    shutil.rmtree(runs_dir)
    again = report.build_report([str(kept)], tmp_path / "out2", plots=False)
    assert "## Interval estimates" in first  # the intervals' tables are among the lines compared
    assert _table(again) == [ln.replace("3 (+1 bad lines)", "3") for ln in _table(first)]


def test_a_run_found_twice_counts_once(runs_dir, tmp_path):
    """The kept copies and the live runs given together (a sweep resumed after a report): each run once, the copy
    that got furthest."""
    out = tmp_path / "out"
    first = report.build_report([str(runs_dir)], out, plots=False, keep=True)
    # the live turn_ppo seed 0 goes one eval further than its kept copy
    live = runs_dir / "sokoban_turn_ppo_tiny_s0" / "metrics.jsonl"
    live.write_text(live.read_text() + json.dumps(val_row(4, 1.0, 3.0) | {"step": 5}) + "\n")
    both = report.build_report([str(out / "runs"), str(runs_dir)], tmp_path / "out2", plots=False)
    assert "6 runs in 3 groups" in both and "6 runs in 3 groups" in first
    turn = next(ln for ln in _table(both) if ln.startswith("| turn_ppo"))
    assert turn.split(" | ")[3] == "0.583 ± 0.382"  # final val success: seed 0's 1.0 (live copy), 0.5, 0.25


def test_runs_of_one_name_with_different_configs_both_count(tmp_path):
    """Two sweeps' runs may share a directory name (sokoban_turn_ppo_tiny_s0): different configs, two runs."""
    for sweep, success in (("sweep_a", 0.25), ("sweep_b", 0.75)):
        d = write_run(tmp_path / sweep, "sokoban_turn_ppo_tiny_s0", "turn_ppo", 0,
                      [val_row(0, 0.0, 0.0), train_row(1, 0.5, success=success, reward=0.0)], total=1)
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["trainer"]["default_local_dir"] = str(d)
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    text = report.build_report([str(tmp_path)], tmp_path / "out", plots=False)
    assert "2 runs in 1 group" in text
    turn = next(ln for ln in _table(text) if ln.startswith("| turn_ppo"))
    assert turn.split(" | ")[3] == "0.500 ± 0.354"


def test_kept_runs_of_one_algo_and_seed_with_different_configs_get_a_config_hash(tmp_path):
    """Two experiments' runs of turn_ppo seed 0 kept in one folder: neither takes the plain name, each gets
    `_<config hash>`; keeping one again (a resumed run) replaces its copy; a third config beside an existing plain
    copy gets a hash too, and the plain copy stays."""
    runs = []
    for sweep, gamma in (("sweep_a", 0.9), ("sweep_b", 0.99)):
        d = write_run(tmp_path / sweep, "sokoban_turn_ppo_tiny_s0", "turn_ppo", 0,
                      [val_row(0, 0.0, 0.0), train_row(1, 0.5, success=0.5, reward=0.0)], total=1)
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["algorithm"]["gamma"] = gamma
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
        runs.append(report.load_run(d))
    kept = tmp_path / "kept"
    report.keep_runs(runs, kept)
    names = sorted(p.name for p in kept.iterdir())
    assert len(names) == 2 and all(n.startswith("turn_ppo_s0_") and len(n) == len("turn_ppo_s0_") + 8 for n in names)
    report.keep_runs(runs[:1], kept)
    assert sorted(p.name for p in kept.iterdir()) == names
    solo = tmp_path / "solo"
    report.keep_runs(runs[:1], solo)
    report.keep_runs(runs[1:], solo)
    got = sorted(p.name for p in solo.iterdir())
    assert got[0] == "turn_ppo_s0" and got[1].startswith("turn_ppo_s0_") and len(got) == 2
    gammas = {yaml.safe_load((solo / n / "config.yaml").read_text())["algorithm"]["gamma"] for n in got}
    assert gammas == {0.9, 0.99}


def test_kept_runs_of_the_results_pages_are_not_gitignored():
    """`--keep-runs` writes results/<setting>/runs/ to be committed; the top-level runs/ stays ignored."""
    import shutil
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=repo).returncode == 0

    kept = sorted(str(p.relative_to(repo)) for p in (repo / "results").rglob("runs") if p.is_dir())
    assert "results/long_turns/warmstart_a/runs" in kept, kept
    for d in kept + ["results/long_turns/runs"]:
        assert not ignored(f"{d}/some_run/metrics.jsonl"), d
    assert ignored("runs/some_run/metrics.jsonl")


def _experiment_runs(root, gammas=(0.99,), totals=(4,), seeds=(0, 1), logger=("console",)):
    """turn_ppo runs of the given gammas, step counts and seeds (every run trains its whole length; evals at 0
    and at the end, success = seed / 4); ``logger`` alternates over the runs (run control, not the
    experiment)."""
    i = 0
    for gamma in gammas:
        for total in totals:
            for seed in seeds:
                rows = [val_row(0, 0.0, 0.0)] + [train_row(s, 0.5) for s in range(1, total)] + \
                       [train_row(total, 0.5, success=seed / 4, reward=0.0)]
                d = write_run(root, f"g{gamma}_t{total}_s{seed}", "turn_ppo", seed, rows, total=total)
                cfg = yaml.safe_load((d / "config.yaml").read_text())
                cfg["algorithm"]["gamma"] = gamma
                cfg["logger"] = logger[i % len(logger)]
                cfg["trainer"]["default_local_dir"] = str(d)
                (d / "config.yaml").write_text(yaml.safe_dump(cfg))
                i += 1
    return root


def test_runs_of_different_step_counts_are_warned_about_and_get_no_intervals(tmp_path):
    """A newcomer's runs/: a 20-step run, two 2-step runs and a killed 20-step run of one config: one group by
    the config, but not one experiment for the intervals (final success at step 2 vs 20)."""
    pytest.importorskip("scipy")
    root = _experiment_runs(tmp_path / "runs", totals=(2, 20), seeds=(0, 1))
    killed = root / "g0.99_t20_s1" / "metrics.jsonl"
    killed.write_text("".join(killed.read_text().splitlines(keepends=True)[:8]))  # killed after step 7
    text = report.build_report([str(root)], tmp_path / "out", plots=False, reps=200)
    assert "4 runs in 1 group" in text
    assert ("Warning: group `turn_ppo` mixes different experiments (trainer.total_training_steps: 2, 20): "
            "its row averages over them and it gets no interval estimates") in text
    sec = _section(text, "## Interval estimates")
    assert not any(ln.startswith("| `turn_ppo`") for ln in sec)
    assert "Not estimated (mixed experiments, see the warnings above): `turn_ppo`." in sec


def test_up_to_step_compares_runs_of_different_lengths_at_one_step(tmp_path):
    """--up-to-step: a 4-step and a 2-step run of one config are one experiment read up to step 2 (no warning,
    intervals), the longer run's final success is its step-2 value and it counts as complete; a run that has not
    reached the step stays partial; the kept copies keep every step."""
    pytest.importorskip("scipy")
    root = tmp_path / "runs"
    write_run(root, "long_s0", "turn_ppo", 0, [val_row(0, 0.0, 0.0), train_row(1, 0.5),
                                               train_row(2, 0.5, success=0.25, reward=1.0, clip=0.5), train_row(3, 0.5),
                                               train_row(4, 0.5, success=1.0, reward=2.0, clip=0.9)], total=4)
    write_run(root, "short_s1", "turn_ppo", 1, [val_row(0, 0.0, 0.0), train_row(1, 0.5),
                                                train_row(2, 0.5, success=0.75, reward=0.0, clip=0.1)], total=2)
    write_run(root, "cut_s2", "turn_ppo", 2, [val_row(0, 0.0, 0.0), train_row(1, 0.5, clip=0.2)], total=4)
    (root / "long_s0" / "eval_greedy.json").write_text(json.dumps({"val/success": 1.0}))
    whole = report.build_report([str(root)], tmp_path / "a", plots=False, reps=200)
    assert "mixes different experiments (trainer.total_training_steps: 2, 4)" in whole
    out = tmp_path / "b"
    text = report.build_report([str(root)], out, plots=False, reps=200, keep=True, up_to_step=2)
    assert f"3 runs in 1 group from `{root}`, each read up to step 2; 1 running or crashed" in text
    assert "Warning" not in text
    assert "greedy success" not in text and "greedy success" in whole  # the eval of step 4's checkpoint is not step 2's
    assert "seed 2: last step 1 of 2" in text
    (row,) = [ln for ln in text.splitlines() if ln.startswith("| turn_ppo |")]
    header = next(ln for ln in text.splitlines() if ln.startswith("| algo.name |")).split(" | ")
    cells = dict(zip(header, row.split(" | ")))
    # final held-out success: 0.25 (s0 at step 2, not its 1.0 at step 4), 0.75 (s1), 0.0 (s2's last, at step 0);
    # turns clipped over training steps: s0 (0 + 0.5) / 2 (not with steps 3-4), s1 (0 + 0.1) / 2, s2 0.2
    assert cells["final val success"] == "0.333 ± 0.382"
    assert cells["clip turn"] == f"{(0.25 + 0.05 + 0.2) / 3:.4f} ± {statistics.stdev([0.25, 0.05, 0.2]):.4f}"
    runs = {r.path.name: r for r in map(report.load_run, report.find_runs([str(root)]))}
    cut = report.cut_at(runs["long_s0"], 2)
    assert cut.complete and cut.total_steps == 2 and [r["step"] for r in cut.rows] == [0, 1, 2]
    assert runs["long_s0"].complete and runs["long_s0"].total_steps == 4  # the run itself is untouched
    assert any(ln.startswith("| `turn_ppo` | 3 |") for ln in _section(text, "## Interval estimates"))
    kept = [json.loads(x)["step"] for x in (out / "runs" / "turn_ppo_s0" / "metrics.jsonl").read_text().splitlines()]
    assert kept == [0, 1, 2, 3, 4]


def test_default_groups_are_experiments_and_a_given_grouping_that_mixes_them_is_warned(tmp_path):
    pytest.importorskip("scipy")
    root = _experiment_runs(tmp_path / "runs", gammas=(0.9, 0.99), seeds=(0, 1, 2),
                            logger=("console", "wandb"))
    text = report.build_report([str(root)], tmp_path / "out", plots=False, reps=200)
    assert "6 runs in 2 groups" in text and "| algo.name, algorithm.gamma | runs |" in text
    assert "mixes different experiments" not in text  # logger, run dirs and seeds are not the experiment
    rows = [ln for ln in _section(text, "## Interval estimates") if ln.startswith("| `turn_ppo, 0.")]
    assert [r.split(" | ")[:3] for r in rows[:2]] == [["| `turn_ppo, 0.9`", "3", "0.250 [0.000, 0.500]"],
                                                  ["| `turn_ppo, 0.99`", "3", "0.250 [0.000, 0.500]"]]
    mixed = report.build_report([str(root)], tmp_path / "out2", ["algo.name"], plots=False, reps=200)
    assert "Warning: group `turn_ppo` mixes different experiments (algorithm.gamma: 0.9, 0.99)" in mixed
    assert not any(ln.startswith("| `turn_ppo`") for ln in _section(mixed, "## Interval estimates"))


def test_runs_before_and_after_issue_48s_renames_are_one_experiment(tmp_path):
    """Runs from before issue #48 hold algo.trainer / algo.critic_level (now null: derived from the estimator) and
    read committed weights from docs/results/... (now assets/...): one experiment, one group, no warning. A real
    difference beside them is still one."""
    rows = [val_row(0, 0.0, 0.0), train_row(1, 0.5, success=0.5, reward=0.0)]
    for seed, (trainer, level, pinned, gamma) in enumerate([("turn", "turn", "docs/results/x/cache", 0.99),
                                                            (None, None, "assets/x", 0.99),
                                                            (None, None, "assets/x", 0.9)]):
        d = write_run(tmp_path / "runs", f"run{seed}", "turn_ppo", seed, rows, total=1)
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["algo"].update(trainer=trainer, critic_level=level)
        cfg["model"]["pinned_cache"] = pinned
        cfg["algorithm"]["gamma"] = gamma
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    runs = [report.load_run(d) for d in sorted((tmp_path / "runs").iterdir())]
    assert report.experiment_differences(runs[:2]) == {}
    assert list(report.experiment_differences(runs)) == ["algorithm.gamma"]


def test_plots_have_integer_step_ticks_and_the_interval_plot_marks_every_run(tmp_path, monkeypatch):
    pytest.importorskip("scipy")
    pytest.importorskip("matplotlib")
    import matplotlib.axes
    import matplotlib.pyplot as plt

    figures, drawn = [], []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *a, **k: (drawn.append((a, k)), plot(self, *a, **k))[1])
    root = _experiment_runs(tmp_path / "runs", totals=(2,), seeds=(0, 1, 2))
    text = report.build_report([str(root)], tmp_path / "out", reps=200)
    assert "[intervals.png](intervals.png)" in text
    for fig in figures[:-1]:  # the learning curves: steps 0..2
        for ax in fig.axes:
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert ticks and all(float(t).is_integer() for t in ticks), (fig, ticks)
    marks = [a for a, k in drawn if k.get("marker") == "|"]
    assert sorted(marks[0][0]) == [0.0, 0.25, 0.5]  # final val success: one mark per run of the group


def test_run_control_keys_are_the_run_names_exclusions():
    """The report's run-control keys are config/base.yaml's run-name exclusions (one list, read from its
    text)."""
    from omegaconf import OmegaConf

    import ragen_turn.compose  # noqa: F401  (registers ${ragen_quiet_keys:...})

    node = OmegaConf.load(report.BASE_YAML).hydra.job.config.override_dirname
    resolved = OmegaConf.to_container(node, resolve=True)["exclude_keys"]
    keys = report.run_control_keys()
    assert {"trainer.total_training_steps", "logger", "trainer.resume", "trainer.time_budget_s"} <= set(keys)
    assert keys == resolved[:len(keys)]  # RAGEN's quiet keys follow (held under ragen_keys: never compared)
    assert report.run_control_keys(report.BASE_YAML.parent / "nope.yaml") == []


def test_runs_that_differ_in_a_list_valued_key_are_grouped(tmp_path):
    """The README's `report runs` after a named RAGEN run: configs that differ in a list (env tags) are two
    experiments, labelled by the list, not a crash on an unhashable value."""
    root = _experiment_runs(tmp_path / "runs", seeds=(0, 1))
    for i, d in enumerate(sorted(root.iterdir())):
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg.setdefault("env", {})["train_tags"] = ["SimpleSokoban"] if i == 0 else ["CoordSokoban", "SimpleSokoban"]
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    text = report.build_report([str(root)], tmp_path / "out", plots=False, reps=50)
    assert "2 runs in 2 groups" in text and "env.train_tags" in text
    assert '["CoordSokoban", "SimpleSokoban"]' in text


def test_a_config_groups_keys_are_the_experiment_though_its_choice_is_run_control(tmp_path):
    """`model` is in the run-name exclusions as the choice `model=tiny` (named in the run's name); the model's own
    keys (a wider model) are still the experiment."""
    root = _experiment_runs(tmp_path / "runs", seeds=(0, 1))
    for i, d in enumerate(sorted(root.iterdir())):
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["model"]["hidden_size"] = 64 * (i + 1)
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    text = report.build_report([str(root)], tmp_path / "out", plots=False, reps=50)
    assert "2 runs in 2 groups" in text and "model.hidden_size" in text


def test_paired_by_seed_differences_are_hand_computed(tmp_path):
    """--paired: each group's final held-out success minus the reference group's on the seeds both have, with the
    mean and its Student's t interval (t(0.975, 2) = 4.302653 for three pairs), and the same for the mean train
    success of the last 5 steps; a seed only one group ran is left out."""
    root = tmp_path / "runs"
    finals = {"turn_ppo": {10: 0.25, 11: 0.5, 12: 0.5, 13: 0.75}, "token_ppo": {10: 0.125, 11: 0.5, 12: 0.25}}
    for algo, by_seed in finals.items():
        for seed, v in by_seed.items():
            train = 0.5 if algo == "token_ppo" else 0.5 + v  # train success minus token_ppo's = the final value
            write_run(root, f"{algo}_s{seed}", algo, seed, [val_row(0, 0.0, 0.0), train_row(1, train),
                                                             train_row(2, train, success=v, reward=0.0)], total=2)
    text = report.build_report([str(root)], tmp_path / "out", plots=False, paired=["token_ppo"])
    diffs = [0.125, 0.0, 0.25]
    m, s = statistics.mean(diffs), statistics.stdev(diffs)
    half = 4.302653 * s / math.sqrt(3)
    row = next(ln for ln in text.splitlines() if ln.startswith("| `turn_ppo` | 10, 11, 12 |"))
    final = f"{m:+.3f} [{m - half:+.3f}, {m + half:+.3f}]"
    train = statistics.mean([0.5 + v for v in (0.25, 0.5, 0.5)]) - 0.5  # turn_ppo's train minus token_ppo's, by seed
    train_half = 4.302653 * statistics.stdev([0.25, 0.5, 0.5]) / math.sqrt(3)
    assert row == (f"| `turn_ppo` | 10, 11, 12 | +0.125 / +0.000 / +0.250 | {final} | "
                   f"{train:+.3f} [{train - train_half:+.3f}, {train + train_half:+.3f}] |")
    assert "## Paired by seed against `token_ppo`" in text
    assert "## Paired by seed" not in report.build_report([str(root)], tmp_path / "out2", plots=False)
    with pytest.raises(ValueError, match="no such group"):
        report.build_report([str(root)], tmp_path / "out3", plots=False, paired=["ppo"])
    assert not (tmp_path / "out3" / "results.md").exists()  # a wrong label stops before anything is written
    assert report.main([str(root), "--out", str(tmp_path / "out4"), "--no-plots", "--paired", "grpo"]) == 2
