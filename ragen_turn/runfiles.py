"""What a run directory holds, read one way by the trainers (resume, the closing summary) and the report: the
file names, the metric keys both read, and the one parser of ``metrics.jsonl``.

``metrics.jsonl`` holds one JSON object per logged step, keys sorted, non-finite numbers written as ``null``
(``engines/runlog.append_metrics``). Every reader parses it with :func:`parse_metrics`, on these rules:

- blank lines are skipped;
- a line that is not a JSON object (not JSON, or a list / number / string) is a bad line; a bad line with no
  non-blank line after it is *torn* (a crash cut the last write);
- ``NaN`` / ``Infinity`` literals parse (Python's ``json`` accepts them); ``null`` stays ``None`` here;
- a step may appear twice: a resumed run truncates its log to its checkpoint's step before it logs
  again (``engines/runlog.truncate_metrics``), so a log written now holds one line per step, but an older
  log (or one joined by hand) may repeat a step; its last line is the step's.

Two rules of what to do with bad lines, over that one parser:

- :func:`read_metrics` (the trainers': resume and the run summary): every line in file order; a torn last line
  is dropped with a warning naming the file; any other bad line raises ``ValueError`` naming the file and line
  (a resume that rewrites the log must not drop history silently).
- :func:`read_step_rows` (the report's): one row per step, sorted by step, the last line of a repeated step
  winning; numbers as floats (``null`` -> NaN); bad lines, and objects without a finite numeric ``step``, are
  counted and left out (a crashed or hand-edited run is still reported, its bad lines shown).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

# the files of a run directory (both engines write them; the report reads them): every name of them is here
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"  # this start's config (resolved)
CONFIGS_FILE = "configs.jsonl"  # one line per start or resume (engines/rundir.py)
PROVENANCE_FILE = "provenance.json"
LOCK_FILE = "run.lock"  # held by the run that trains into the directory (engines/rundir.py)
GENERATIONS_FILE = "val_generations.jsonl"  # trainer.log_val_generations: held-out episodes as text, per eval
TRACE_FILE = "trace.jsonl"  # trainer.trace_episodes: sampled episodes of each step, turn by turn (engines/trace.py)
CHECKPOINTS_DIR = "checkpoints"  # the local engine's checkpoints (verl's global_step_N sit in the run directory)
TRAINER_STATE_FILE = "trainer_state.pt"  # in each local checkpoint: step, optimizer moments, RNG states
VALUE_NORM_FILE = "value_norm.pt"  # in each verl checkpoint with critic.target_norm: the targets' running stats
ERROR_LOG = "error.log"  # engine=verl: a failed run's traceback
INSPECT_PAGE = "inspect.html"  # python -m ragen_turn.inspect RUN: the credit inspector's page
EVAL_PREFIX = "eval_"  # <run>/eval_<name>.json: a held-out evaluation of the run's checkpoint (eval.sh)

# metric keys (written by both engines' trainers; read by the run summary and the report)
STEP = "step"
VAL_SUCCESS, VAL_REWARD = "val/success", "val/reward"
TRAIN_SUCCESS, TRAIN_REWARD = "env/success", "env/reward"
CLIP_TOKEN, CLIP_TURN, KL = "actor/clip_frac_token", "actor/clip_frac_turn", "actor/approx_kl"
STEP_S, VAL_S = "perf/step_s", "perf/val_s"
ENTROPY, FORMAT_ERRORS, RESPONSE_TOKENS = "actor/entropy", "env/format_error_rate", "env/response_tokens"

NAN = float("nan")


@dataclass(frozen=True)
class BadLine:
    """A line of ``metrics.jsonl`` that is not a JSON object: its 1-based number, length, the parser's error,
    and whether it is torn (no non-blank line after it)."""
    number: int
    chars: int
    error: str
    torn: bool


def parse_metrics(text: str) -> Tuple[List[Dict[str, Any]], List[BadLine]]:
    """``(rows, bad)``: the JSON objects of ``text`` in file order (values as parsed) and its bad lines."""
    lines = text.splitlines()
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    rows: List[Dict[str, Any]] = []
    bad: List[BadLine] = []
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        try:
            row = json.loads(ln)
            if not isinstance(row, dict):
                raise ValueError(f"a {type(row).__name__}, not an object")
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            bad.append(BadLine(number=i + 1, chars=len(ln), error=str(e), torn=i == last))
            continue
        rows.append(row)
    return rows, bad


def _read_text(path: Path) -> str:
    return Path(path).read_text(errors="replace")


def read_metrics(path: Path, log: Callable[[str], None] = print) -> List[Dict[str, Any]]:
    """The lines of ``metrics.jsonl`` as dicts, in file order. A torn last line (a crash mid-write) is dropped
    with a warning naming the file; an unreadable line before the last raises ``ValueError`` naming the file
    and line. A missing file raises ``FileNotFoundError``."""
    path = Path(path)
    rows, bad = parse_metrics(_read_text(path))
    for b in bad:
        if not b.torn:
            raise ValueError(f"{path} line {b.number} is not a JSON object ({b.error}); "
                             "fix or remove that line")
    for b in bad:
        log(f"[warn] {path}: dropped its torn last line {b.number} ({b.chars} chars: {b.error})")
    return rows


def as_number(v: Any) -> float:
    """A metric value as a float: NaN for ``null``, booleans and anything that is not a number."""
    if v is None or isinstance(v, bool):
        return NAN
    try:
        return float(v)
    except (TypeError, ValueError):
        return NAN


def _step_of(row: Dict[str, Any]) -> float:
    s = row.get(STEP)
    return float(s) if isinstance(s, (int, float)) and not isinstance(s, bool) else NAN


def read_step_rows(path: Path) -> Tuple[List[Dict[str, Any]], int]:
    """``(rows, bad_lines)``: one row per step of ``metrics.jsonl``, sorted by step (a repeated step: its last
    line wins); every value that is a number or ``null`` as a float (``null`` -> NaN), ``step`` as written,
    other values as they are. ``bad_lines`` counts the lines that are not JSON objects and the objects without
    a finite numeric ``step``, all left out. A missing file: ``([], 0)`` (a run that stopped before its first
    line)."""
    path = Path(path)
    if not path.is_file():
        return [], 0
    parsed, bad = parse_metrics(_read_text(path))
    n_bad = len(bad)
    by_step: Dict[int, Dict[str, Any]] = {}
    for row in parsed:
        if not math.isfinite(_step_of(row)):
            n_bad += 1
            continue
        row = {k: (as_number(v) if (v is None or isinstance(v, (int, float))) and k != STEP else v)
               for k, v in row.items()}
        by_step[int(row[STEP])] = row
    return [by_step[s] for s in sorted(by_step)], n_bad


def read_trace(path: Path) -> List[Dict[str, Any]]:
    """The lines of ``trace.jsonl`` (``trainer.trace_episodes``: one per training step, ``engines/trace.py``),
    one per step, sorted by step (a repeated step: its last line wins); bad lines (a torn last write) and lines
    without a finite ``step`` are left out. A missing file: ``[]``."""
    path = Path(path)
    if not path.is_file():
        return []
    rows, _ = parse_metrics(_read_text(path))
    by_step = {int(_step_of(r)): r for r in rows if math.isfinite(_step_of(r)) and isinstance(r.get("episodes"), list)}
    return [by_step[s] for s in sorted(by_step)]
