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
  another's (:mod:`ragen_turn.report.intervals`). ``--strata KEY`` splits a group's runs into tasks for the bootstrap.
  A group (from ``--group-by``) whose runs are different experiments, or were set to train different numbers
  of steps, is warned about and gets no interval estimates.
- with ``--paired GROUP``, a "Paired by seed" section: every other group's final held-out success minus GROUP's,
  seed by seed (runs of one seed share their training rooms and first batch), with a 95% t interval.

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

The package, one module per job (each imports only those above it):

- ``runs.py``: finding and reading run directories (:class:`Run`, :func:`load_run`, :func:`keep_runs`); it
  parses ``metrics.jsonl`` with :func:`ragen_turn.runfiles.read_step_rows`, on the parser the trainers' resume
  uses too, and takes the file names and metric keys from :mod:`ragen_turn.runfiles`;
- ``intervals.py``: IQM, stratified bootstrap CIs, probability of improvement (on scipy);
- ``stats.py``: per-run and per-group numbers; ``groups.py``: one group per experiment;
- ``tables.py``: the Markdown; ``plots.py``: the figures; ``build.py``: :func:`build_report`; ``cli.py``: ``main``.
"""
from ragen_turn.report.build import build_report, default_out, interval_section
from ragen_turn.report.cli import main
from ragen_turn.report.groups import (BASE_YAML, DEFAULT_GROUP_BY, experiment_differences, group_keys,
                                      group_runs, mixed_groups, run_control_keys)
from ragen_turn.report.runs import (KEPT_KEYS, KEPT_PREFIXES, USED_KEYS, VAL_REWARD, VAL_SUCCESS, Run,
                                    cut_at, dedupe_runs, find_runs, keep_runs, load_config, load_run)
from ragen_turn.report.stats import (best_eval, final_eval, init_eval, interval_estimates, max_drop, mean_std,
                                     smooth, steps_to_threshold, train_mean, wall_minutes)
from ragen_turn.report.tables import markdown_table, runs_table

__all__ = [
    "BASE_YAML", "DEFAULT_GROUP_BY", "KEPT_KEYS", "KEPT_PREFIXES", "USED_KEYS", "VAL_REWARD", "VAL_SUCCESS",
    "Run", "best_eval", "build_report", "cut_at", "dedupe_runs", "default_out", "experiment_differences",
    "final_eval", "find_runs", "group_keys", "group_runs", "init_eval", "interval_estimates", "interval_section",
    "keep_runs", "load_config", "load_run", "main", "markdown_table", "max_drop", "mean_std", "mixed_groups",
    "run_control_keys", "runs_table", "smooth", "steps_to_threshold", "train_mean", "wall_minutes",
]
