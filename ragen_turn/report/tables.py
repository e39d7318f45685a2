"""The Markdown of a results page: the notes that define every column, the table of groups, the table of runs,
the interval-estimate and probability-of-improvement tables, and
the paired-by-seed differences."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ragen_turn.cfg_get import cfg_get
from ragen_turn.report.runs import Run, _finite, _num
from ragen_turn.report.stats import (INTERVAL_METRICS, IMPROVEMENT_METRIC, _strata, best_eval, final_eval,
                                     init_eval, max_drop, mean_std, smooth, steps_to_threshold, train_mean,
                                     wall_minutes)
from ragen_turn.runfiles import CLIP_TOKEN, CLIP_TURN, KL, NAN, STEP_S, TRAIN_SUCCESS, VAL_REWARD, VAL_SUCCESS


TRAIN_TAIL = 5  # "final train success" = mean over the last TRAIN_TAIL training steps


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
            seed = cfg_get(r.config, "seed")
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


def runs_table(groups: Sequence[Tuple[str, List[Run]]]) -> str:
    lines = ["| run | group | seed | status | evals | final val success | wall min | NaN | bad lines |",
             "|" + "---|" * 9]
    for label, runs in groups:
        for r in runs:
            n_eval = len(r.series(VAL_SUCCESS)[0])
            lines.append(f"| `{r.path}` | {label} | {cfg_get(r.config, 'seed', '?')} | {r.status()} | {n_eval} | "
                         f"{_fmt(final_eval(r, VAL_SUCCESS))} | {_fmt(wall_minutes(r), digits=1)} | "
                         f"{sum(r.nan_counts.values())} | {r.bad_lines} |")
    return "\n".join(lines)


def duplicate_seed_warnings(groups: Sequence[Tuple[str, List[Run]]]) -> List[str]:
    out = []
    for label, runs in groups:
        seeds = [cfg_get(r.config, "seed") for r in runs]
        dup = sorted({str(s) for s in seeds if seeds.count(s) > 1})
        if dup:
            out.append(f"group `{label}` holds several runs with seed {', '.join(dup)}: add the key that tells them "
                       "apart to --group-by (e.g. env.name, model.name)")
    return out


def _interval_cell(est: Tuple[float, float, float], censored: int, n: int, digits: int) -> str:
    point, lo, hi = est
    if not _finite(point):
        return "-"
    ge = "≥ " if censored else ""
    txt = f"{ge}{point:.{digits}f}"
    txt += f" [{lo:.{digits}f}, {hi:.{digits}f}]" if _finite(lo) else " [no CI]"
    return txt + (f" ({censored}/{n} censored)" if censored else "")


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
    from ragen_turn.report import intervals

    metric = [t for t, _ in INTERVAL_METRICS].index(IMPROVEMENT_METRIC)
    scores = {}
    for label, runs in groups:  # per stratum (by name), so that x and y are paired task by task
        by = {}
        for part in _strata(runs, strata):
            vals = [v for v in (INTERVAL_METRICS[metric][1](r, threshold, smooth_window)[0] for r in part)
                    if _finite(v)]
            if vals:
                by[tuple(str(cfg_get(part[0].config, k)) for k in strata)] = vals
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


def paired_table(groups: Sequence[Tuple[str, List[Run]]], ref: str, digits: int = 3) -> str:
    """Each group's final held-out success minus ``ref``'s, paired by seed: runs of one seed share their training
    rooms and their first batch, so the per-seed difference removes what the seed alone decides. Per group: the
    seeds both have, each difference, their mean and 95% Student's t interval (``intervals.t_interval``: with 3-5
    pairs a bootstrap's interval is too narrow); then the same mean and interval for the train success of the last
    ``TRAIN_TAIL`` steps (the same training rooms for both runs of a seed, more episodes than one evaluation). A seed
    with more than one run in a group, or a NaN value, is left out."""
    from ragen_turn.report import intervals

    def by_seed(runs, score):
        seeds = [str(cfg_get(r.config, "seed")) for r in runs]
        return {s: score(r) for s, r in zip(seeds, runs) if seeds.count(s) == 1}

    def diffs(mine, base):
        seeds = sorted((s for s in mine if s in base and _finite(mine[s]) and _finite(base[s])),
                       key=lambda s: (len(s), s))
        return seeds, [mine[s] - base[s] for s in seeds]

    def mean_cell(ds):
        if not ds:
            return "-"
        m, lo, hi = intervals.t_interval(ds)
        return f"{m:+.{digits}f}" + (f" [{lo:+.{digits}f}, {hi:+.{digits}f}]" if _finite(lo) else " [no CI]")

    final = lambda r: final_eval(r, VAL_SUCCESS)  # noqa: E731
    train = lambda r: train_mean(r, TRAIN_SUCCESS, TRAIN_TAIL)  # noqa: E731
    labels = [label for label, _ in groups]
    if ref not in labels:
        raise ValueError(f"--paired {ref!r}: no such group; the groups are {', '.join(map(repr, labels))}")
    runs_of = dict(groups)
    base_final, base_train = by_seed(runs_of[ref], final), by_seed(runs_of[ref], train)
    lines = [f"| group - `{ref}` | seeds | final val success, by seed | final val success: mean [95% t interval] | "
             f"train success (last {TRAIN_TAIL}): mean [95% t interval] |", "|---|---|---|---|---|"]
    for label, runs in groups:
        if label == ref:
            continue
        seeds, d_final = diffs(by_seed(runs, final), base_final)
        _, d_train = diffs(by_seed(runs, train), base_train)
        lines.append(f"| `{label}` | {', '.join(seeds) or '-'} | "
                     + (" / ".join(f"{d:+.{digits}f}" for d in d_final) or "-")
                     + f" | {mean_cell(d_final)} | {mean_cell(d_train)} |")
    return "\n".join(lines)
