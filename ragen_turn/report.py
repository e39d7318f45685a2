"""Compare runs: ``python -m ragen_turn.report RUN_OR_DIR [...] [--group-by KEY[,KEY]] [--out DIR]``.

Reads ``metrics.jsonl`` and ``config.yaml`` of every run found under the given paths (a run directory,
a sweep directory such as ``runs/sweep_gamma_lambda``, or ``runs/``), groups the runs by config keys
(default: by experiment, ``algo.name`` and every config key the runs differ in other than the seed and the
run-control keys that ``config/base.yaml`` leaves out of run names, such as ``trainer.total_training_steps``
or ``logger``; the seeds are the runs of a group), and writes

- ``results.md``: one Markdown table row per group, every column defined in a note above the table,
  then one line per run (status, last step, NaN count);
- ``success.png``, ``reward.png``, ``clip_kl.png``: learning curves, one line per group (mean over seeds,
  shaded +-1 std over seeds); ``stability.png`` (when the runs log them): policy entropy, format-error rate and
  sampled tokens per episode, where a drift of the policy shows first. matplotlib is optional: without it the
  table is still written and the report says the plots were skipped.
- an "Interval estimates" section (with scipy, the ``stats`` extra): per group the interquartile mean over its runs
  and a 95% stratified bootstrap CI of the final and best held-out success, steps to the threshold, the collapse
  measure (and RAGEN-2's MI when logged), ``intervals.png``, and the probability that one group's run beats
  another's (``ragen_turn.intervals``). ``--strata KEY`` splits a group's runs into tasks for the bootstrap.
  A group (from ``--group-by``) whose runs are different experiments, or were set to train different numbers
  of steps, is warned about and gets no interval estimates.

``--keep-runs`` also copies each run's config, its ``provenance.json`` and the metrics the report reads to
``<out>/runs/`` (a few KB a run), so a results page can be rebuilt, and added to, once the run directories are gone;
a run found twice by name (its kept copy and the live run) counts once, as the copy that got furthest.

Runs that crashed or are still going are used as they are, counted and marked with their last step;
``null`` / NaN values (the trainers write non-finite numbers as ``null``) are left out of every mean and
counted. The table is also printed.

``python -m ragen_turn.report --list-jobs OVERRIDES...`` lists the jobs a Hydra sweep would launch,
without training: ``--list-jobs env=sokoban algo=turn_ppo +sweep=gamma_lambda`` prints the 48 jobs of
``--multirun +sweep=gamma_lambda``, each job's run directory, and any job whose config would be refused
(the same as ``python -m ragen_turn.sweeps OVERRIDES...``, see :mod:`ragen_turn.sweeps`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

# metric keys (written by both engines' trainers)
VAL_SUCCESS, VAL_REWARD = "val/success", "val/reward"
TRAIN_SUCCESS, TRAIN_REWARD = "env/success", "env/reward"
CLIP_TOKEN, CLIP_TURN, KL = "actor/clip_frac_token", "actor/clip_frac_turn", "actor/approx_kl"
STEP_S, VAL_S = "perf/step_s", "perf/val_s"
ENTROPY, FORMAT_ERRORS, RESPONSE_TOKENS = "actor/entropy", "env/format_error_rate", "env/response_tokens"
USED_KEYS = (VAL_SUCCESS, VAL_REWARD, TRAIN_SUCCESS, TRAIN_REWARD, CLIP_TOKEN, CLIP_TURN, KL, STEP_S)
# what --keep-runs keeps of a run's metrics: every key the report reads
KEPT_KEYS = frozenset(USED_KEYS + (VAL_S, ENTROPY, FORMAT_ERRORS, RESPONSE_TOKENS))
KEPT_PREFIXES = ("val/", "collapse/")
TRAIN_TAIL = 5  # "final train success" = mean over the last TRAIN_TAIL training steps
ALGO_ORDER = ("grpo", "token_ppo", "bi_level_gae", "turn_ppo", "turn_ppo_geo", "turn_is", "s_ppo", "st_ppo",
              "so_ppo", "so_grpo")
NAN = float("nan")


# ------------------------------------------------------------------------------------------------ reading runs
@dataclass
class Run:
    path: Path
    config: Dict[str, Any]
    rows: List[Dict[str, Any]]          # one per step, sorted by step; values float (NaN for null) or raw
    bad_lines: int = 0                  # lines that were not JSON (a write cut off by a crash)
    nan_counts: Dict[str, int] = field(default_factory=dict)  # null / non-finite values per used key
    evals: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # eval_<name>.json in the run dir (eval.sh)

    @property
    def last_step(self) -> Optional[int]:
        return int(self.rows[-1]["step"]) if self.rows else None

    @property
    def total_steps(self) -> Optional[int]:
        v = get_key(self.config, "trainer.total_training_steps")
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

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


def _num(v: Any) -> float:
    if v is None or isinstance(v, bool):
        return NAN
    try:
        return float(v)
    except (TypeError, ValueError):
        return NAN


def _finite(v: float) -> bool:
    return isinstance(v, float) and math.isfinite(v)


def get_key(cfg: Dict[str, Any], dotted: str, default: Any = None) -> Any:
    cur: Any = cfg
    for part in dotted.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return default
    return cur


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
    run_dir = Path(run_dir)
    config = load_config(run_dir / "config.yaml")
    by_step: Dict[int, Dict[str, Any]] = {}
    bad = 0
    mpath = run_dir / "metrics.jsonl"
    text = mpath.read_text(errors="replace") if mpath.is_file() else ""
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)  # json accepts NaN / Infinity too
        except json.JSONDecodeError:
            bad += 1
            continue
        if not isinstance(row, dict) or _num(row.get("step")) != _num(row.get("step")):
            bad += 1
            continue
        row = {k: (_num(v) if (v is None or isinstance(v, (int, float))) and k != "step" else v)
               for k, v in row.items()}
        by_step[int(row["step"])] = row  # a resumed run may repeat steps: the last line wins
    rows = [by_step[s] for s in sorted(by_step)]
    nan_counts = {k: sum(1 for r in rows if k in r and not _finite(r[k])) for k in USED_KEYS}
    evals = {}
    for f in sorted(run_dir.glob("eval_*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict):
            evals[f.stem[len("eval_"):]] = data
    return Run(path=run_dir, config=config, rows=rows, bad_lines=bad, nan_counts=nan_counts, evals=evals)


def _is_run_dir(d: Path) -> bool:
    if d.name == ".hydra" or "checkpoints" in d.parts:
        return False
    if (d / "metrics.jsonl").is_file():
        return True
    cfg = d / "config.yaml"  # a run that stopped before its first metrics line still has its config
    return cfg.is_file() and "trainer" in load_config(cfg)


def find_runs(paths: Iterable[str]) -> List[Path]:
    """Run directories (holding metrics.jsonl, or config.yaml of a run that logged nothing yet) under ``paths``."""
    found: List[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_file() and p.name in ("metrics.jsonl", "config.yaml"):
            p = p.parent
        if not p.exists():
            raise FileNotFoundError(f"{str(p)!r} does not exist")
        if _is_run_dir(p):
            found.append(p)
            continue
        for root, dirs, files in os.walk(p):
            dirs[:] = sorted(x for x in dirs if x not in (".hydra", "checkpoints"))
            d = Path(root)
            if ("metrics.jsonl" in files or "config.yaml" in files) and _is_run_dir(d):
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
    directory name and the same config (a kept copy, ``<out>/runs/<name>``, holds its run's ``config.yaml``, whose
    resolved ``trainer.default_local_dir`` tells runs of one name in different sweep dirs apart)."""
    best: Dict[Tuple[str, str], Run] = {}
    for r in runs:
        key = (r.path.name, json.dumps(r.config, sort_keys=True, default=str))
        old = best.get(key)
        if old is None:
            best[key] = r
            continue
        keep, drop = (r, old) if (r.last_step or -1) > (old.last_step or -1) else (old, r)
        log(f"[report] {key[0]}: using {keep.path} (last step {keep.last_step}), not {drop.path} ({drop.last_step})")
        best[key] = keep
    return list(best.values())


def _json_value(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def keep_runs(runs: Sequence[Run], dest: Path) -> Path:
    """``--keep-runs``: each run's config, provenance (host, versions, starting weights) and its metrics cut to the
    keys the report reads (a few KB a run) into ``dest/<run name>/``, so the report can be rebuilt from ``dest``
    alone, after the runs themselves are gone (``results/<setting>/runs/`` is committed; a later sweep's runs
    are added beside them)."""
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for r in runs:
        d = dest / r.path.name
        if d.resolve() == r.path.resolve():
            continue
        d.mkdir(parents=True, exist_ok=True)
        rows = [{k: _json_value(v) for k, v in row.items()
                 if k == "step" or k in KEPT_KEYS or k.startswith(KEPT_PREFIXES)} for row in r.rows]
        (d / "metrics.jsonl").write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in rows))
        for f in [r.path / "config.yaml", r.path / "provenance.json", *sorted(r.path.glob("eval_*.json"))]:
            if f.is_file():
                shutil.copyfile(f, d / f.name)
    return dest


# ------------------------------------------------------------------------------------------------ statistics
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


# ------------------------------------------------------------------------------------------------ grouping
def _label_value(v: Any) -> str:
    if v is None:
        return "?"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return repr(v)  # 1.0 stays 1.0 (as in the config and the run name)
    return str(v)


def group_runs(runs: Sequence[Run], keys: Sequence[str]) -> List[Tuple[str, List[Run]]]:
    groups: Dict[Tuple[Any, ...], List[Run]] = {}
    for r in runs:
        groups.setdefault(tuple(get_key(r.config, k) for k in keys), []).append(r)

    def sort_key(item):
        out = []
        for v in item[0]:
            if isinstance(v, str) and v in ALGO_ORDER:
                out.append((0, ALGO_ORDER.index(v), ""))
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append((1, float(v), ""))
            else:
                out.append((2, 0.0, str(v)))
        return out

    return [(", ".join(_label_value(v) for v in vals), sorted(rs, key=lambda r: (str(get_key(r.config, "seed")),
                                                                                 str(r.path))))
            for vals, rs in sorted(groups.items(), key=sort_key)]


# ------------------------------------------------------------------------------------------------ table
def _fmt(m: float, s: float = NAN, n: int = 1, digits: int = 3) -> str:
    if not _finite(m):
        return "-"
    txt = f"{m:.{digits}f}"
    if n > 1 and _finite(s):
        txt += f" ± {s:.{digits}f}"
    return txt


def _cell(values: Sequence[float], digits: int = 3) -> str:
    m, s, n = mean_std(values)
    return _fmt(m, s, n, digits)


def _threshold_cell(runs: Sequence[Run], threshold: float) -> str:
    hits = [steps_to_threshold(r, threshold) for r in runs]
    reached = [h for h in hits if h is not None]
    if not reached:
        return f"not reached (0/{len(runs)})"
    m, s, n = mean_std([float(h) for h in reached])
    return f"{_fmt(m, s, n, 0)} ({len(reached)}/{len(runs)})"


def _runs_cell(runs: Sequence[Run]) -> str:
    txt = str(len(runs))
    partial = [r for r in runs if not r.complete]
    if partial:
        notes = []
        for r in partial:
            seed = get_key(r.config, "seed")
            who = f"seed {seed}" if seed is not None else r.path.name
            total = r.total_steps if r.total_steps is not None else "?"
            if r.last_step is None:
                notes.append(f"{who}: no metrics yet, of {total} steps")
            else:
                notes.append(f"{who}: last step {r.last_step} of {total}")
        txt += f" ({len(partial)} running or crashed: " + "; ".join(notes) + ")"
    return txt


def _nan_cell(runs: Sequence[Run]) -> str:
    n = sum(sum(r.nan_counts.values()) for r in runs)
    bad = sum(r.bad_lines for r in runs)
    return str(n) + (f" (+{bad} bad lines)" if bad else "")


def header_notes(keys: Sequence[str], threshold: float, smooth_window: int) -> List[str]:
    sm = f" (after a trailing moving average over {smooth_window} steps)" if smooth_window > 1 else ""
    return [
        f"Groups: runs with the same `{', '.join(keys)}`; the runs of a group are its seeds. "
        "`a ± b` = mean ± sample std (n-1) over the group's runs; values that are null/NaN are left out of "
        "means and counted in the NaN column.",
        "",
        "- **success**: fraction of episodes that solved the task (`success`), in [0, 1]. "
        "**reward**: mean episode score, the sum of the episode's rewards (format penalties included).",
        "- **held-out** (`val/*`): the held-out env seeds (`es_manager.val`), never trained on, evaluated every "
        "`trainer.test_freq` steps, at step 0 (before RL) and at the last step. "
        "**train** (`env/*`): the episodes sampled for training at that step.",
        "- **runs**: number of runs (seeds); runs that have not reached `trainer.total_training_steps` are marked "
        "`running or crashed` with their last logged step, and their data is used as it is.",
        "- **init**: held-out success at step 0, before RL.",
        "- **final**: value at the run's last held-out evaluation (for a finished run, its last step).",
        "- **best**: the best held-out value over a run's evaluations after step 0 (the best evaluated "
        "checkpoint), then mean ± std over runs.",
        f"- **train success (last {TRAIN_TAIL})**: mean of `env/success` over a run's last {TRAIN_TAIL} "
        "training steps.",
        f"- **steps to {threshold:g}**: first evaluated step after step 0 at which held-out success >= {threshold:g}; "
        "mean ± std over the runs that reached it, (reached/runs); `not reached` if none did.",
        f"- **collapse**: largest drop of the training success curve (`env/success`){sm} below its running "
        "maximum, max over steps; 0 = never fell. Mean ± std over runs.",
        "- **clip token / clip turn**: mean over training steps of the fraction of tokens / turns whose PPO ratio "
        "was clipped (`actor/clip_frac_token`, `actor/clip_frac_turn`). **KL**: mean `actor/approx_kl`.",
        "- **s/step**: mean wall-clock seconds per training step (`perf/step_s`). **wall min** (runs table): the "
        "minutes a run's logged steps and held-out evaluations took (`perf/step_s` + `perf/val_s`; a resumed run's "
        "steps from every call; process start, model load and the warm start not included).",
        "- **NaN**: null/NaN values of the metrics above in the group's logs (+ lines that were not JSON).",
        "- **final val pass@k** (when logged): share of held-out env groups (k episodes on one seed, "
        "`es_manager.val.group_size`) with at least one success (`val/pass@k`), at the last evaluation.",
        "- **MI / MI z / H(Z|X)** (when logged: `agent_proxy.enable_think`, every `trainer.collapse_freq` steps): "
        "RAGEN-2's collapse measures of the first turn's reasoning at the last step that computed them: the "
        "mutual-information estimate between prompts and reasoning (`collapse/mi_estimate`, at most log of the "
        "number of prompts; low = the reasoning ignores the input), its z-score (`collapse/mi_zscore`) and the "
        "conditional entropy H(Z|X) (`collapse/conditional_entropy_est`, per token; low = deterministic).",
        "- **<name> success** (only when runs have them): held-out success from `<run>/eval_<name>.json`, written by "
        "`bash eval.sh <env> <run> +eval_output=<run>/eval_<name>.json [overrides]` on the run's last checkpoint "
        "(e.g. `greedy`: `actor_rollout_ref.rollout.val_temperature=0`); mean ± std over the runs that have one.",
    ]


def pass_at_key(run: Run) -> Optional[str]:
    """The run's held-out pass@k key (``val/pass@<G>``, G = the val group size), if it logged one."""
    for row in reversed(run.rows):
        for k in row:
            if k.startswith("val/pass@") and k[len("val/pass@"):].isdigit():
                return k
    return None


# columns shown only when some run logged them: (title, key of a run or None)
OPTIONAL_COLUMNS = [
    ("final val pass@k", pass_at_key),
    ("MI", lambda r: "collapse/mi_estimate"),
    ("MI z", lambda r: "collapse/mi_zscore"),
    ("H(Z|X)", lambda r: "collapse/conditional_entropy_est"),
]


def optional_columns(groups: Sequence[Tuple[str, List[Run]]]) -> List[Tuple[str, Any]]:
    def has(r: Run, key: Optional[str]) -> bool:
        return key is not None and any(_finite(v) for v in r.series(key)[1])

    return [(t, k) for t, k in OPTIONAL_COLUMNS if any(has(r, k(r)) for _, runs in groups for r in runs)]


TABLE_COLUMNS = ["runs", "init val success", "final val success", "best val success", "final val reward",
                 "best val reward", f"train success (last {TRAIN_TAIL})", "steps to {thr}", "collapse",
                 "clip token", "clip turn", "KL", "s/step", "NaN"]


def group_row(runs: Sequence[Run], threshold: float, smooth_window: int) -> List[str]:
    return [
        _runs_cell(runs),
        _cell([init_eval(r, VAL_SUCCESS) for r in runs]),
        _cell([final_eval(r, VAL_SUCCESS) for r in runs]),
        _cell([best_eval(r, VAL_SUCCESS) for r in runs]),
        _cell([final_eval(r, VAL_REWARD) for r in runs]),
        _cell([best_eval(r, VAL_REWARD) for r in runs]),
        _cell([train_mean(r, TRAIN_SUCCESS, TRAIN_TAIL) for r in runs]),
        _threshold_cell(runs, threshold),
        _cell([max_drop(smooth(r.series(TRAIN_SUCCESS)[1], smooth_window)) for r in runs]),
        _cell([train_mean(r, CLIP_TOKEN) for r in runs], 4),
        _cell([train_mean(r, CLIP_TURN) for r in runs], 4),
        _cell([train_mean(r, KL) for r in runs], 5),
        _cell([train_mean(r, STEP_S) for r in runs], 1),
        _nan_cell(runs),
    ]


def eval_names(groups: Sequence[Tuple[str, List[Run]]]) -> List[str]:
    """Names of the extra evaluations (``<run>/eval_<name>.json``) found in any run."""
    return sorted({name for _, runs in groups for r in runs for name in r.evals})


def markdown_table(groups: Sequence[Tuple[str, List[Run]]], keys: Sequence[str], threshold: float,
                   smooth_window: int = 1) -> str:
    extra = eval_names(groups)
    optional = optional_columns(groups)
    cols = [", ".join(keys)] + [c.format(thr=f"{threshold:g}") for c in TABLE_COLUMNS] + \
        [title for title, _ in optional] + [f"{name} success" for name in extra]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for label, runs in groups:
        cells = group_row(runs, threshold, smooth_window) + \
            [_cell([final_eval(r, key(r)) for r in runs if key(r)]) for _, key in optional] + \
            [_cell([_num(r.evals.get(name, {}).get(VAL_SUCCESS)) for r in runs if name in r.evals]) for name in extra]
        lines.append("| " + " | ".join([label] + cells) + " |")
    return "\n".join(lines)


def wall_minutes(run: Run) -> float:
    """Minutes the run's logged steps and evaluations took: the sum of ``perf/step_s`` and ``perf/val_s`` (process
    start, model load and the warm start are not in it). NaN when it logged neither."""
    vals = [v for key in (STEP_S, VAL_S) for v in run.series(key)[1] if _finite(v)]
    return sum(vals) / 60 if vals else NAN


def runs_table(groups: Sequence[Tuple[str, List[Run]]]) -> str:
    lines = ["| run | group | seed | status | evals | final val success | wall min | NaN | bad lines |",
             "|" + "---|" * 9]
    for label, runs in groups:
        for r in runs:
            n_eval = len(r.series(VAL_SUCCESS)[0])
            lines.append(f"| `{r.path}` | {label} | {get_key(r.config, 'seed', '?')} | {r.status()} | {n_eval} | "
                         f"{_fmt(final_eval(r, VAL_SUCCESS))} | {_fmt(wall_minutes(r), digits=1)} | "
                         f"{sum(r.nan_counts.values())} | {r.bad_lines} |")
    return "\n".join(lines)


def duplicate_seed_warnings(groups: Sequence[Tuple[str, List[Run]]]) -> List[str]:
    out = []
    for label, runs in groups:
        seeds = [get_key(r.config, "seed") for r in runs]
        dup = sorted({str(s) for s in seeds if seeds.count(s) > 1})
        if dup:
            out.append(f"group `{label}` holds several runs with seed {', '.join(dup)}: add the key that tells them "
                       "apart to --group-by (e.g. env.name, model.name)")
    return out


# ------------------------------------------------------------------------------------------------ plots
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


# ------------------------------------------------------------------------------------------------ interval estimates
# Per group: the interquartile mean (IQM) over its runs and a 95% stratified bootstrap CI (ragen_turn.intervals, on
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
    freq = get_key(run.config, "trainer.test_freq")
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
        by.setdefault(tuple(str(get_key(r.config, k)) for k in strata), []).append(r)
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


def _interval_cell(est: Tuple[float, float, float], censored: int, n: int, digits: int) -> str:
    point, lo, hi = est
    if not _finite(point):
        return "-"
    ge = "≥ " if censored else ""
    txt = f"{ge}{point:.{digits}f}"
    txt += f" [{lo:.{digits}f}, {hi:.{digits}f}]" if _finite(lo) else " [no CI]"
    return txt + (f" ({censored}/{n} censored)" if censored else "")


def interval_estimates(groups: Sequence[Tuple[str, List[Run]]], threshold: float, smooth_window: int = 1,
                       strata: Sequence[str] = (), reps: int = 10_000) -> Dict[str, Dict[str, Any]]:
    """``{metric title: {group label: (point, low, high, censored, n)}}`` for the metrics some run has."""
    from ragen_turn import intervals

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


def interval_table(groups: Sequence[Tuple[str, List[Run]]], keys: Sequence[str],
                   estimates: Dict[str, Dict[str, Any]]) -> str:
    titles = list(estimates)
    lines = ["| " + " | ".join([", ".join(keys), "runs"] + [f"{t}: IQM [95% CI]" for t in titles]) + " |",
             "|" + "---|" * (len(titles) + 2)]
    for label, runs in groups:
        cells = [_interval_cell(estimates[t][label][:3], estimates[t][label][3], estimates[t][label][4],
                                1 if t.startswith("steps to") else 3) for t in titles]
        lines.append("| " + " | ".join([f"`{label}`", str(len(runs))] + cells) + " |")
    return "\n".join(lines)


def improvement_table(groups: Sequence[Tuple[str, List[Run]]], threshold: float, smooth_window: int = 1,
                      strata: Sequence[str] = (), reps: int = 10_000) -> str:
    """P(a run of the row's group beats a run of the column's group) on ``IMPROVEMENT_METRIC``, [95% CI]."""
    from ragen_turn import intervals

    metric = [t for t, _ in INTERVAL_METRICS].index(IMPROVEMENT_METRIC)
    scores = {}
    for label, runs in groups:  # per stratum (by name), so that x and y are paired task by task
        by = {}
        for part in _strata(runs, strata):
            vals = [v for v in (INTERVAL_METRICS[metric][1](r, threshold, smooth_window)[0] for r in part)
                    if _finite(v)]
            if vals:
                by[tuple(str(get_key(part[0].config, k)) for k in strata)] = vals
        scores[label] = by
    labels = [label for label, _ in groups]
    lines = ["| P(row > column) | " + " | ".join(f"`{x}`" for x in labels) + " |", "|" + "---|" * (len(labels) + 1)]
    for x in labels:
        cells = []
        for y in labels:
            common = sorted(set(scores[x]) & set(scores[y]))
            if x == y or not common:
                cells.append("-")
                continue
            samples = [a for k in common for a in (scores[x][k], scores[y][k])]
            cells.append(_interval_cell(intervals.interval(intervals.probability_of_improvement, samples, reps=reps),
                                        0, 0, 2))
        lines.append("| " + " | ".join([f"`{x}`"] + cells) + " |")
    return "\n".join(lines)


def run_scores(groups: Sequence[Tuple[str, List[Run]]], threshold: float,
               smooth_window: int = 1) -> Dict[str, Dict[str, List[float]]]:
    """``{metric title: {group label: every run's finite score}}`` (drawn by :func:`write_interval_plot`)."""
    out: Dict[str, Dict[str, List[float]]] = {}
    for i, (title, _) in enumerate(INTERVAL_METRICS):
        out[title.format(thr=f"{threshold:g}")] = {
            label: [v for task in metric_scores(runs, i, threshold, smooth_window)[0] for v in task]
            for label, runs in groups}
    return out


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


# ------------------------------------------------------------------------------------------------ experiments
DEFAULT_GROUP_BY = ("algo.name",)
SEPARATE_BY = ("env.name", "model.name")  # never averaged together: added to the group keys when runs differ in them
# never part of the experiment: the seed (the runs of a group), where / how a run is logged and recorded
NOT_EXPERIMENT = ("seed", "ragen_keys", "ragen_aliases", "hydra")
BASE_YAML = Path(__file__).resolve().parent.parent / "config" / "base.yaml"


def run_control_keys(base_yaml: Path = BASE_YAML) -> List[str]:
    """The run-control keys: those ``config/base.yaml`` leaves out of the run name
    (``hydra.job.config.override_dirname.exclude_keys``: the step count, the logger, run dirs, resume, time
    budget, checkpointing ...), read from its text (one list for both); ``[]`` when the file is not there."""
    import re

    try:
        text = base_yaml.read_text()
    except OSError:
        return []
    m = re.search(r"exclude_keys:\s*\$\{ragen_quiet_keys:\[(.*?)\]\}", text, re.S)
    return [k.strip() for k in m.group(1).split(",") if k.strip()] if m else []


def _flat(cfg: Any, prefix: str = "") -> Dict[str, Any]:
    if not isinstance(cfg, dict):
        return {prefix[:-1]: cfg}
    out: Dict[str, Any] = {}
    for k, v in cfg.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def experiment_differences(runs: Sequence[Run], control: Sequence[str] = ()) -> Dict[str, List[str]]:
    """``{key: its values}`` for each config key whose value differs between ``runs`` (their experiment: the
    config without the seed and the run-control keys ``control``, see :func:`run_control_keys`). A key that
    some run's config lacks (written before the key existed) is not a difference."""
    skip = tuple(NOT_EXPERIMENT) + tuple(control)
    flats = [_flat(r.config) for r in runs if r.config]
    out: Dict[str, List[str]] = {}
    for key in sorted(set().union(*flats)) if flats else []:
        if any(key == k or key.startswith(k + ".") for k in skip) or not all(key in f for f in flats):
            continue
        values = sorted({json.dumps(f[key], sort_keys=True, default=str) for f in flats})
        if len(values) > 1:
            out[key] = values
    return out


def mixed_groups(groups: Sequence[Tuple[str, List[Run]]], control: Sequence[str]) -> Dict[str, str]:
    """``{group label: why}`` for the groups whose runs are not one experiment run with several seeds: their
    configs differ beyond the seed and run control, or they were set to train different numbers of steps."""
    out = {}
    for label, runs in groups:
        why = [f"{k}: {', '.join(v)}" for k, v in experiment_differences(runs, control).items()]
        totals = sorted({r.total_steps for r in runs if r.total_steps is not None})
        if len(totals) > 1:
            why.append(f"trainer.total_training_steps: {', '.join(map(str, totals))}")
        if why:
            out[label] = "; ".join(why)
    return out


# ------------------------------------------------------------------------------------------------ report


def default_out(paths: Sequence[str]) -> Path:
    """``<the paths' common directory>/report``: beside the runs, never in the repository's docs."""
    common = Path(os.path.commonpath([str(Path(p).resolve()) for p in paths]))
    if common.is_file():
        common = common.parent
    return common / "report"


def group_keys(runs: Sequence[Run], group_by: Sequence[str], experiments: bool = False) -> List[str]:
    """``group_by`` with ``env.name`` / ``model.name`` in front when the runs differ in them (a Sokoban and a
    WebShop ``turn_ppo`` run are two groups, not one average); with ``experiments`` (the default grouping),
    also every other config key the runs of a group differ in (:func:`experiment_differences`): one group per
    experiment, its runs the seeds."""
    keys = list(group_by)
    for k in reversed(SEPARATE_BY):
        if k not in keys and len({str(get_key(r.config, k)) for r in runs}) > 1:
            keys.insert(0, k)
    if experiments:
        control = run_control_keys()
        for _, rs in group_runs(runs, keys):
            keys += [k for k in experiment_differences(rs, control) if k not in keys]
    return keys


def build_report(paths: Sequence[str], out: str | Path | None = None, group_by: Sequence[str] | None = None,
                 threshold: float = 0.5, smooth_window: int = 1, plots: bool = True, intervals: bool = True,
                 strata: Sequence[str] = (), reps: int = 10_000, keep: bool = False) -> str:
    """Read the runs under ``paths`` (a run found twice by name counts once: :func:`dedupe_runs`), write
    ``results.md`` (and the PNGs) to ``out`` (default :func:`default_out`) and, with ``keep``, the runs' kept
    copies to ``out/runs`` (:func:`keep_runs`); return the Markdown. ``group_by`` None: ``algo.name`` and the
    keys the runs' experiments differ in (:func:`group_keys`); a group given by ``group_by`` that mixes
    experiments is warned about and gets no interval estimates (:func:`mixed_groups`)."""
    run_dirs = find_runs(paths)
    if not run_dirs:
        raise FileNotFoundError(f"no runs (directories with metrics.jsonl) under {', '.join(map(str, paths))}")
    runs = dedupe_runs([load_run(d) for d in run_dirs], log=lambda line: print(line, file=sys.stderr))
    keys = group_keys(runs, DEFAULT_GROUP_BY if group_by is None else group_by, experiments=group_by is None)
    groups = group_runs(runs, keys)
    mixed = mixed_groups(groups, run_control_keys())
    out = Path(out) if out is not None else default_out(paths)
    out.mkdir(parents=True, exist_ok=True)
    if keep:
        keep_runs(runs, out / "runs")

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
    lines += ["## Runs", "", runs_table(groups), ""]
    text = "\n".join(lines)
    (out / "results.md").write_text(text)
    return text


# ------------------------------------------------------------------------------------------------ CLI
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ragen_turn.report", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="run directories or directories holding runs (searched recursively); "
                                             "with --list-jobs: Hydra overrides")
    ap.add_argument("--group-by", default=None,
                    help="comma-separated dotted config keys that label a group, e.g. "
                         "algo.name,algorithm.gamma,algorithm.lam (env.name and model.name are added when "
                         "the runs differ in them); default: algo.name and every config key the runs' "
                         "experiments differ in (not the seed or run-control keys such as "
                         "trainer.total_training_steps or logger)")
    ap.add_argument("--threshold", type=float, default=0.5, help="held-out success level for 'steps to' (0.5)")
    ap.add_argument("--smooth", type=int, default=1,
                    help="moving-average window over training steps for the collapse measure and train curves (1)")
    ap.add_argument("--out", default=None, help="output directory (default: <the runs' common directory>/report)")
    ap.add_argument("--no-plots", action="store_true", help="write the table only")
    ap.add_argument("--keep-runs", action="store_true",
                    help="also copy each run's config and metrics (the keys the report reads) to <out>/runs, so "
                         "the report can be rebuilt from there once the runs are gone; a run found twice by name "
                         "counts once")
    ap.add_argument("--no-intervals", action="store_true", help="leave out the interval estimates (IQM, bootstrap CIs)")
    ap.add_argument("--strata", default="",
                    help="comma-separated config keys that split a group's runs into tasks for the stratified "
                         "bootstrap (e.g. env.train_tags when one report holds several settings); default: none")
    ap.add_argument("--reps", type=int, default=10_000, help="bootstrap resamples for the intervals (10000)")
    ap.add_argument("--list-jobs", action="store_true",
                    help="list the jobs a --multirun with these overrides launches (no training), e.g. "
                         "--list-jobs env=sokoban algo=turn_ppo +sweep=gamma_lambda")
    ap.add_argument("--no-check", action="store_true", help="with --list-jobs: skip the config checks")
    args = ap.parse_intermixed_args(argv)
    if args.list_jobs:
        from ragen_turn.sweeps import list_jobs

        return list_jobs(args.paths, validate=not args.no_check)
    if not args.paths:
        ap.error("give at least one run directory (or a directory of runs)")
    keys = None if args.group_by is None else [k.strip() for k in args.group_by.split(",") if k.strip()]
    out = Path(args.out) if args.out else default_out(args.paths)
    try:
        text = build_report(args.paths, out, keys, args.threshold, max(1, args.smooth), plots=not args.no_plots,
                            intervals=not args.no_intervals, reps=args.reps,
                            strata=[k.strip() for k in args.strata.split(",") if k.strip()], keep=args.keep_runs)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"wrote {out / 'results.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
