"""Finding and reading run directories: :class:`Run` (a run's config, one metrics row per step, its extra
evaluations), :func:`find_runs`, :func:`load_run`, :func:`dedupe_runs` (a run found twice counts once) and
:func:`keep_runs` (``--keep-runs``: the compact copy a results page is rebuilt from)."""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ragen_turn.cfg_get import cfg_get
from ragen_turn.runfiles import (CHECKPOINTS_DIR, CLIP_TOKEN, CLIP_TURN, CONFIG_FILE, ENTROPY, EVAL_PREFIX,
                                 FORMAT_ERRORS, KL, METRICS_FILE, PROVENANCE_FILE, RESPONSE_TOKENS, STEP_S,
                                 TRAIN_REWARD, TRAIN_SUCCESS, VAL_REWARD, VAL_S, VAL_SUCCESS, as_number, read_step_rows)

# the keys whose null / non-finite values each run counts (the NaN column)
USED_KEYS = (VAL_SUCCESS, VAL_REWARD, TRAIN_SUCCESS, TRAIN_REWARD, CLIP_TOKEN, CLIP_TURN, KL, STEP_S)
# what --keep-runs keeps of a run's metrics: every key the report reads
KEPT_KEYS = frozenset(USED_KEYS + (VAL_S, ENTROPY, FORMAT_ERRORS, RESPONSE_TOKENS))
KEPT_PREFIXES = ("val/", "collapse/")


@dataclass
class Run:
    path: Path
    config: Dict[str, Any]
    rows: List[Dict[str, Any]]          # one per step, sorted by step; values float (NaN for null) or raw
    bad_lines: int = 0                  # lines not JSON objects, or without a step (runfiles.read_step_rows)
    nan_counts: Dict[str, int] = field(default_factory=dict)  # null / non-finite values per used key
    evals: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # eval_<name>.json in the run dir (eval.sh)
    up_to: Optional[int] = None         # read up to this step only (cut_at): its steps count as the run's total

    @property
    def last_step(self) -> Optional[int]:
        return int(self.rows[-1]["step"]) if self.rows else None

    @property
    def total_steps(self) -> Optional[int]:
        v = cfg_get(self.config, "trainer.total_training_steps")
        total = int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        return total if self.up_to is None or total is None else min(total, self.up_to)

    @property
    def complete(self) -> bool:
        total, last = self.total_steps, self.last_step
        return total is not None and last is not None and last >= total

    def status(self) -> str:
        total = self.total_steps if self.total_steps is not None else "?"
        if not self.rows:
            return f"running or crashed: no metrics yet, of {total} steps"
        if self.complete:
            return "complete"
        return f"running or crashed: last step {self.last_step} of {total}"

    def series(self, key: str) -> Tuple[List[int], List[float]]:
        """(steps, values) of ``key`` over the rows that have it; values may be NaN (null in the log)."""
        steps, vals = [], []
        for r in self.rows:
            if key in r:
                steps.append(int(r["step"]))
                vals.append(_num(r[key]))
        return steps, vals


_num = as_number  # a metric value as a float (NaN for null and non-numbers): ragen_turn.runfiles.as_number


def _finite(v: float) -> bool:
    return isinstance(v, float) and math.isfinite(v)


def load_config(path: Path) -> Dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
    except Exception:  # noqa: BLE001 - an unreadable config only loses the grouping keys
        try:
            from omegaconf import OmegaConf

            data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        except Exception:  # noqa: BLE001
            return {}
    return data if isinstance(data, dict) else {}


def load_run(run_dir: Path) -> Run:
    """A run directory as a :class:`Run`: its ``config.yaml`` (``{}`` when unreadable), one row per step of
    its ``metrics.jsonl`` (:func:`ragen_turn.runfiles.read_step_rows`, the parser the trainers use too: the
    last line of a repeated step wins; lines that are not JSON objects are counted as ``bad_lines``) and its
    ``eval_<name>.json`` files."""
    run_dir = Path(run_dir)
    config = load_config(run_dir / CONFIG_FILE)
    rows, bad = read_step_rows(run_dir / METRICS_FILE)
    evals = {}
    for f in sorted(run_dir.glob(f"{EVAL_PREFIX}*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict):
            evals[f.stem[len(EVAL_PREFIX):]] = data
    return Run(path=run_dir, config=config, rows=rows, bad_lines=bad, nan_counts=_nan_counts(rows), evals=evals)


def _nan_counts(rows: Sequence[Dict[str, Any]]) -> Dict[str, int]:
    return {k: sum(1 for r in rows if k in r and not _finite(r[k])) for k in USED_KEYS}


def cut_at(run: Run, step: int) -> Run:
    """``run`` read up to ``step`` (``--up-to-step``: runs of different lengths compared at one step; unless a warm-up
    ratio ties the learning rate to the length, a 30-step run's first 20 steps are a 20-step run's): its rows after
    ``step`` left out, ``step`` its total (a run that reached it is complete), its ``eval_<name>.json`` (made on
    the last checkpoint) dropped when it went further."""
    rows = [r for r in run.rows if int(r["step"]) <= step]
    evals = run.evals if (run.last_step or 0) <= step else {}
    return replace(run, rows=rows, nan_counts=_nan_counts(rows), evals=evals, up_to=step)


def _is_run_dir(d: Path) -> bool:
    if d.name == ".hydra" or CHECKPOINTS_DIR in d.parts:
        return False
    if (d / METRICS_FILE).is_file():
        return True
    cfg = d / CONFIG_FILE  # a run that stopped before its first metrics line still has its config
    return cfg.is_file() and "trainer" in load_config(cfg)


def find_runs(paths: Iterable[str]) -> List[Path]:
    """Run directories (holding metrics.jsonl, or config.yaml of a run that logged nothing yet) under ``paths``."""
    found: List[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_file() and p.name in (METRICS_FILE, CONFIG_FILE):
            p = p.parent
        if not p.exists():
            raise FileNotFoundError(f"{str(p)!r} does not exist")
        if _is_run_dir(p):
            found.append(p)
            continue
        for root, dirs, files in os.walk(p):
            dirs[:] = sorted(x for x in dirs if x not in (".hydra", CHECKPOINTS_DIR))
            d = Path(root)
            if (METRICS_FILE in files or CONFIG_FILE in files) and _is_run_dir(d):
                found.append(d)
                dirs[:] = [x for x in dirs if x != "hydra"]
    seen, out = set(), []
    for d in found:
        key = d.resolve()
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def dedupe_runs(runs: Sequence[Run], log=print) -> List[Run]:
    """A run found twice counts once, as the copy that got furthest (the first found on a tie). Twice = the same
    config (a kept copy, ``<out>/runs/<algo>_s<seed>``, holds its run's ``config.yaml``, whose resolved
    ``trainer.experiment_name`` and ``trainer.default_local_dir`` name the run and its sweep dir); a run without a
    readable config is known by its directory name."""
    best: Dict[Tuple[str, str], Run] = {}
    for r in runs:
        key = ("" if r.config else r.path.name, json.dumps(r.config, sort_keys=True, default=str))
        old = best.get(key)
        if old is None:
            best[key] = r
            continue
        keep, drop = (r, old) if (r.last_step or -1) > (old.last_step or -1) else (old, r)
        log(f"[report] {r.path.name}: using {keep.path} (last step {keep.last_step}), "
            f"not {drop.path} ({drop.last_step})")
        best[key] = keep
    return list(best.values())


def _json_value(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def kept_name(r: Run) -> str:
    """The plain folder name of a kept run: ``<algo>_s<seed>`` from its config (letters, digits, ``_ . -``; a run
    without them keeps its directory name, made plain)."""
    algo, seed = cfg_get(r.config, "algo.name"), cfg_get(r.config, "seed")
    base = f"{algo}_s{seed}" if algo is not None and seed is not None else r.path.name
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-") or "run"


def _config_id(config: Dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:8]


def keep_runs(runs: Sequence[Run], dest: Path) -> Path:
    """``--keep-runs``: each run's config, provenance (host, versions, starting weights) and its metrics cut to the
    keys the report reads (a few KB a run) into ``dest/<algo>_s<seed>/`` (:func:`kept_name`; two different
    configs that would share a name, in ``runs`` or already in ``dest``, get ``_<config hash>`` appended), so the
    report can be rebuilt from ``dest`` alone, after the runs themselves are gone (``results/<setting>/runs/`` is
    committed; a later sweep's runs are added beside them, and a run kept again replaces its copy)."""
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    existing: Dict[str, Path] = {}  # config hash -> its folder already in dest
    claims: Dict[str, set] = {}     # plain name -> the configs that claim it, in dest and in runs
    for d in sorted(p for p in dest.iterdir() if p.is_dir()):
        kept = load_run(d)
        existing[_config_id(kept.config)] = d
        claims.setdefault(kept_name(kept), set()).add(_config_id(kept.config))
    todo = [r for r in runs if r.path.resolve().parent != dest.resolve()]
    for r in todo:
        claims.setdefault(kept_name(r), set()).add(_config_id(r.config))
    for r in todo:
        name, cid = kept_name(r), _config_id(r.config)
        d = existing.get(cid) or dest / (name if len(claims[name]) == 1 else f"{name}_{cid}")
        d.mkdir(parents=True, exist_ok=True)
        rows = [{k: _json_value(v) for k, v in row.items()
                 if k == "step" or k in KEPT_KEYS or k.startswith(KEPT_PREFIXES)} for row in r.rows]
        (d / METRICS_FILE).write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in rows))
        for f in [r.path / CONFIG_FILE, r.path / PROVENANCE_FILE, *sorted(r.path.glob(f"{EVAL_PREFIX}*.json"))]:
            if f.is_file():
                shutil.copyfile(f, d / f.name)
    return dest
