"""ragen_turn.runfiles: the one parser of metrics.jsonl, under the trainers' rule (read_metrics: resume, run
summary) and the report's (read_step_rows), on hand-written logs: torn last lines, bad lines in the middle,
null / NaN, repeated steps, objects without a step."""
import ast
import json
import math
from pathlib import Path

import pytest

from ragen_turn import runfiles
from ragen_turn.engines import runlog
from ragen_turn.report import load_run


def _write(tmp_path, text):
    path = tmp_path / runfiles.METRICS_FILE
    path.write_text(text)
    return path


def test_the_trainers_and_the_report_share_one_reader_and_its_names():
    assert runlog.read_metrics is runfiles.read_metrics
    assert runlog.PROVENANCE_FILE == runfiles.PROVENANCE_FILE == "provenance.json"
    from ragen_turn.report import runs

    assert runs.read_step_rows is runfiles.read_step_rows and runs.VAL_SUCCESS is runfiles.VAL_SUCCESS


def test_every_run_file_name_comes_from_runfiles():
    """No module of the package or envs/ spells a run directory's file name (``"metrics.jsonl"``,
    ``"checkpoints"``, ...) as a string of its own: each takes it from ``runfiles`` (issue #62 item 3).
    Prose may name them (docstrings, a message's ``<run>/checkpoints/latest``): only a string that is exactly a
    name counts."""
    names = {v for k, v in vars(runfiles).items() if k.endswith(("_FILE", "_DIR", "_LOG", "_PAGE"))}
    assert {"metrics.jsonl", "run.lock", "checkpoints", "val_generations.jsonl"} <= names
    root = Path(runfiles.__file__).resolve().parents[1]
    found = []
    for path in sorted([*(root / "ragen_turn").rglob("*.py"), *(root / "envs").rglob("*.py")]):
        if path.name == "runfiles.py" and path.parent.name == "ragen_turn":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_parse_marks_only_the_last_non_blank_bad_line_torn():
    rows, bad = runfiles.parse_metrics('{"step": 0}\n[1, 2]\n\n{"step": 2}\n{"step": 3, "x\n  \n\n')
    assert rows == [{"step": 0}, {"step": 2}]
    assert [(b.number, b.torn) for b in bad] == [(2, False), (5, True)]
    assert "a list, not an object" in bad[0].error and bad[1].chars == len('{"step": 3, "x')


def test_a_clean_log_reads_the_same_under_both_rules(tmp_path):
    lines = [{"step": 0, "val/success": 0.25, "env/success": None},
             {"step": 1, "env/success": 0.5, "tag": "a"}]
    path = _write(tmp_path, "".join(json.dumps(r) + "\n" for r in lines))
    strict = runfiles.read_metrics(path, log=pytest.fail)
    rows, bad = runfiles.read_step_rows(path)
    assert strict == lines and bad == 0 and [r["step"] for r in rows] == [0, 1]
    assert rows[0]["val/success"] == 0.25 and math.isnan(rows[0]["env/success"]) and rows[1]["tag"] == "a"


def test_torn_last_line_trainers_warn_and_drop_report_counts_it(tmp_path):
    path = _write(tmp_path, '{"step": 0}\n{"step": 1}\n{"step": 2, "env/rew')
    said = []
    assert [r["step"] for r in runfiles.read_metrics(path, log=said.append)] == [0, 1]
    assert len(said) == 1 and str(path) in said[0] and "torn last line 3" in said[0]
    rows, bad = runfiles.read_step_rows(path)
    assert [r["step"] for r in rows] == [0, 1] and bad == 1
    assert load_run(tmp_path).bad_lines == 1


def test_bad_middle_line_trainers_refuse_report_counts_it(tmp_path):
    path = _write(tmp_path, '{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=rf"{path} line 2 is not a JSON object .*fix or remove that line"):
        runfiles.read_metrics(path)
    rows, bad = runfiles.read_step_rows(path)
    assert [r["step"] for r in rows] == [0, 2] and bad == 1


def test_nan_literals_and_nulls_are_nan_in_the_report_and_as_written_for_the_trainers(tmp_path):
    path = _write(tmp_path, '{"step": 0, "a": NaN, "b": null, "c": Infinity, "d": true, "e": 3}\n')
    raw = runfiles.read_metrics(path)[0]
    assert math.isnan(raw["a"]) and raw["b"] is None and raw["c"] == math.inf and raw["d"] is True
    row = runfiles.read_step_rows(path)[0][0]
    assert all(math.isnan(row[k]) for k in "abd") and row["c"] == math.inf and row["e"] == 3.0
    assert isinstance(row["e"], float) and row["step"] == 0 and isinstance(row["step"], int)


def test_a_repeated_step_is_kept_in_order_by_the_trainers_and_the_last_wins_in_the_report(tmp_path):
    """A log from before the resume truncation (or two logs joined by hand): step 1 twice."""
    path = _write(tmp_path, '{"step": 0, "v": 0}\n{"step": 1, "v": 1}\n'
                            '{"step": 1, "v": 2}\n{"step": 2, "v": 3}\n')
    assert [r["v"] for r in runfiles.read_metrics(path)] == [0, 1, 2, 3]
    rows, bad = runfiles.read_step_rows(path)
    assert [(r["step"], r["v"]) for r in rows] == [(0, 0.0), (1, 2.0), (2, 3.0)] and bad == 0


def test_report_counts_objects_without_a_finite_numeric_step(tmp_path):
    path = _write(tmp_path, '{"v": 1}\n{"step": null}\n{"step": NaN}\n{"step": Infinity}\n{"step": true}\n'
                            '{"step": "3"}\n{"step": 4}\n')
    assert len(runfiles.read_metrics(path)) == 7  # objects all: the trainers' rule keeps them
    rows, bad = runfiles.read_step_rows(path)
    assert [r["step"] for r in rows] == [4] and bad == 6


def test_a_missing_log(tmp_path):
    assert runfiles.read_step_rows(tmp_path / "nope.jsonl") == ([], 0)
    with pytest.raises(FileNotFoundError):
        runfiles.read_metrics(tmp_path / "nope.jsonl")
