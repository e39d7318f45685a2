"""One update, then a fresh rollout: how far one actor update moves each variant's policy, over several dev batches.

From one warm start, for each dev seed (a run seed, ``--seeds``; default 100-104) the local engine rolls out that
seed's first batch (the step-1 batch a run ``seed=S`` would train on), then for each variant (a label and config
overrides, e.g. another algo or trust-region setting) builds a fresh trainer from the same weights, scores that same
batch, computes the advantages (its own, or one variant's shared with all: ``--shared-adv``), applies one update
(critic, then actor) and rolls out again with the same env and sampling seeds. It prints, per variant and batch:

- per actor mini-batch: approx KL before its step, turns and tokens clipped, the share of tokens still getting
  gradient (``live``), dual-clipped tokens, grad norm before clipping, the step's scale, whether it was stepped;
- after the update: approx KL over the batch (k3 per response token), and the fresh rollout's format errors,
  sampled tokens per turn and success; with ``--dev N``, success on N dev rooms (``es_manager.val.seeds=dev``);

then, per variant, the mean over the batches and its 95% t interval (``report.intervals.t_interval``) of format
errors, success (and dev success), update KL and live share, the paired difference to ``--ref``'s format errors,
and per group of variants (an algorithm's grid: the label before the first space) the one the rule picks
(:func:`choose`: the best mean ``--objective`` among those whose mean format errors are within ``--tol`` of
``--ref``'s). ``--tune ALGO ...`` builds the grid (``--lrs`` x ``--clips``) every algorithm gets: the equal-tuning
procedure of results/tuning/README.md.

Seeds. A run's step-t batch is drawn from (run seed, t) alone (env seeds ``rollout.env_manager.train_env_seed``,
sampling ``derived_seed(seed, t, 7)``), so the harness's batch for seed S is the step-1 batch of a run with seed S.
Run seeds 0-99 are evaluation seeds (the comparisons: scripts/compare.sh runs seeds 0-4, fresh comparisons 10-14);
the harness refuses them (exit 2) unless ``--allow-eval-seeds``. ``--dev`` rooms are the dev range
(``es_manager.val.seeds=dev``), never the held-out rooms. Deterministic for a seed on one CPU type.

    python benchmarks/one_update.py                       # the long_turns study's variants, dev seeds 100-104
    python benchmarks/one_update.py --setting long_horizon --only token_ppo turn_ppo   # another setting
    python benchmarks/one_update.py --variant 'tp: algo=turn_ppo' --variant 'tp_kl: algo=turn_ppo \
        actor_rollout_ref.actor.target_kl=0.02' --seeds 100 101 102 103 104   # your own variants
    python benchmarks/one_update.py --shared-adv token_ppo    # every variant trains on token_ppo's advantages
    python benchmarks/one_update.py --tune token_ppo turn_ppo grpo st_ppo --out tune.jsonl   # the tuning grid
    python benchmarks/one_update.py --summarize tune.jsonl    # the table and choices again, from the rows
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# each setting from its committed warm start (as scripts/compare.sh runs it), dev seeds, seed 1
SETTINGS = {
    "long_turns": ["env=sokoban", "+setting=long_turns", "model.pinned_cache=assets/long_turns",
                   "model.warmstart.seed=0"],
    "long_horizon": ["env=sokoban", "+setting=long_horizon", "model.pinned_cache=assets/long_horizon",
                     "model.warmstart.seed=0"],
    "sokoban": ["env=sokoban"],  # the default job (its committed warm start: config/env_model/sokoban_tiny.yaml)
    # long_turns at the turn lengths of real models (issue #45's check at 200+ tokens): LargerSokoban (8x8, 2 boxes),
    # 3-5 moves an answer, and a think that writes the grid after each move but the last (think=simulate: about 75
    # tokens a grid at 8x8, so 150-300 sampled tokens a turn); its own warm start (built on first use, not committed)
    "long_turns_200": ["env=sokoban", "+setting=long_turns", "env.train_tags=[LargerSokoban]",
                       "env.val_tags=[LargerSokoban]", "model.warmstart.think=simulate",
                       "model.warmstart.actions_per_turn=[3,5]", "agent_proxy.max_actions_per_turn=5",
                       "agent_proxy.max_turn=3", "actor_rollout_ref.rollout.response_length=384",
                       "model.warmstart.seed=0"],
    # the same with the grid restated first in every think (think=state_simulate: one grid more a turn, so 200+
    # sampled tokens a turn on average, up to about 450); its own warm start
    "long_turns_300": ["env=sokoban", "+setting=long_turns", "env.train_tags=[LargerSokoban]",
                       "env.val_tags=[LargerSokoban]", "model.warmstart.think=state_simulate",
                       "model.warmstart.actions_per_turn=[3,5]", "agent_proxy.max_actions_per_turn=5",
                       "agent_proxy.max_turn=3", "actor_rollout_ref.rollout.response_length=512",
                       "model.warmstart.seed=0"],
}
COMMON = ["es_manager.val.seeds=dev"]
DEV_SEEDS = (100, 101, 102, 103, 104)  # the harness's run seeds: each one's step-1 batch
FIRST_DEV_SEED = 100  # run seeds below are evaluation seeds (the comparisons'); the harness refuses them

A = "actor_rollout_ref.actor"
PL = f"{A}.policy_loss"
GSPO = f"{A}.clip_ratio_low=0.0003 {A}.clip_ratio_high=0.0004"
# the papers' clip range, no trust-region option (the shipped defaults, config/algo/*.yaml, differ: docs/SPEC.md)
PAPER = f"{A}.clip_ratio_low=0.2 {A}.clip_ratio_high=0.28 {PL}.token_band=false {A}.step_scale=none"
TURN_MEAN = f"{PL}.loss_agg_mode=turn-mean"  # turn_ppo's aggregation before the trust-region study
# label: overrides. "X@paper" is algo X at the papers' clip range with no option (turn_ppo: with turn-mean, as the
# 5-seed comparisons ran it); "+option" adds one option to it; a bare "X" is X's shipped default.
DEFAULT_VARIANTS = {
    "token_ppo": "algo=token_ppo",
    "grpo": "algo=grpo",
    "s_ppo": "algo=s_ppo",
    "turn_ppo@paper": f"algo=turn_ppo {PAPER} {TURN_MEAN}",
    "turn_ppo@paper+token_band": f"algo=turn_ppo {PAPER} {TURN_MEAN} {PL}.token_band=true",
    "turn_ppo@paper+sqrt_len": f"algo=turn_ppo {PAPER} {TURN_MEAN} {PL}.turn_band=sqrt_len",
    "turn_ppo@paper+live_step": f"algo=turn_ppo {PAPER} {TURN_MEAN} {A}.step_scale=live",
    "turn_ppo@paper+target_kl": f"algo=turn_ppo {PAPER} {TURN_MEAN} {A}.target_kl=0.02",
    "turn_ppo@paper+paper_agg": f"algo=turn_ppo {PAPER} {PL}.loss_agg_mode=seq-mean-turn-sum-token-norm",
    "turn_ppo@paper+token_band+live_step": f"algo=turn_ppo {PAPER} {TURN_MEAN} {PL}.token_band=true "
                                           f"{A}.step_scale=live",
    "turn_ppo@paper+token_band+sqrt_len": f"algo=turn_ppo {PAPER} {TURN_MEAN} {PL}.token_band=true "
                                          f"{PL}.turn_band=sqrt_len",
    "turn_ppo@paper+token_band+paper_agg": f"algo=turn_ppo {PAPER} {PL}.token_band=true "
                                           f"{PL}.loss_agg_mode=seq-mean-turn-sum-token-norm",
}
for _algo in ("turn_ppo_geo", "turn_is", "st_ppo", "so_ppo", "so_grpo"):
    DEFAULT_VARIANTS.update({
        f"{_algo}@paper": f"algo={_algo} {PAPER}",
        f"{_algo}@paper+token_band": f"algo={_algo} {PAPER} {PL}.token_band=true",
        f"{_algo}+gspo": f"algo={_algo} {GSPO} {PL}.token_band=false",
        f"{_algo}+gspo+token_band": f"algo={_algo} {GSPO} {PL}.token_band=true",
    })
DEFAULT_VARIANTS["so_grpo+gspo+token_band+target_kl"] = f"algo=so_grpo {GSPO} {PL}.token_band=true {A}.target_kl=0.05"
SHIPPED = ["token_ppo", "grpo", "s_ppo", "turn_ppo", "turn_ppo_geo", "turn_is", "st_ppo", "so_ppo", "so_grpo"]
DEFAULT_VARIANTS.update({f"{a}": f"algo={a}" for a in SHIPPED if a not in DEFAULT_VARIANTS})

TRACE_KEYS = [("kl", "actor/approx_kl"), ("turns_clip", "actor/clip_frac_turn"), ("tok_clip", "actor/clip_frac_token"),
              ("live", "actor/live_frac"), ("dual", "actor/dual_clip_frac"), ("gnorm", "actor/grad_norm"),
              ("scale", "actor/step_scale"), ("stepped", "actor/stepped")]


def parse_variant(text: str) -> tuple[str, list[str]]:
    label, _, overrides = text.partition(":")
    if not overrides.strip():
        raise SystemExit(f"--variant {text!r}: expected 'label: override override ...'")
    return label.strip(), shlex.split(overrides)


def build(overrides: list[str], run_dir: str, log):
    """A local-engine trainer for ``overrides`` in its own run dir (a fresh start every time)."""
    from ragen_turn.config import validate_config
    from ragen_turn.engines.local.trainer import build_trainer
    from ragen_turn.compose import compose_config

    cfg = compose_config(overrides + [f"trainer.default_local_dir={run_dir}", "trainer.overwrite=true"])
    validate_config(cfg)
    return build_trainer(cfg, log=log)


def fresh_rollout(trainer, dev_rooms: int) -> dict:
    """The same env and sampling seeds as the first batch (step 0), played by the trainer's current actor."""
    from ragen_turn.engines.runlog import episode_metrics

    batch = trainer.rollout(0)
    m = episode_metrics(batch)
    out = {"format_errors": m["env/format_error_rate"], "success": m["env/success"],
           "tokens_per_turn": m["env/response_tokens"] / max(m["env/turns"], 1e-9)}
    if dev_rooms:
        out["dev_success"] = trainer.evaluate()["val/success"]
    return out


def one_variant(label: str, overrides: list[str], batch0, shared_adv, dev_rooms: int, root: str, quiet: bool):
    log = (lambda *a, **k: None) if quiet else print
    t0 = time.time()
    trainer = build(overrides, os.path.join(root, re.sub(r"[^A-Za-z0-9_.-]", "_", label)), log)
    batch = copy.deepcopy(batch0)
    batch = trainer.filter_groups(batch)
    trainer.score(batch)
    trainer.compute_advantages(batch)
    if shared_adv is not None:
        batch.advantages = shared_adv.clone()
    metrics = trainer.update(batch)
    trace = trainer.update_trace.get("actor", [])
    kl = trainer.update_kl(batch)
    after = fresh_rollout(trainer, dev_rooms)
    row = {"label": label, "overrides": overrides, "update_kl": kl,
           "minibatches": [{k: mb.get(key) for k, key in TRACE_KEYS} for mb in trace],
           "kl_stop": metrics.get("actor/kl_stop"), **after, "seconds": time.time() - t0}
    del trainer
    return row


def fmt(x, p=3):
    return "-" if x is None or x != x else f"{x:.{p}f}"


def check_seeds(seeds, overrides, allow_eval: bool) -> None:
    """Dev seeds only: a seed below ``FIRST_DEV_SEED`` is a comparison's batch (exit 2, ``error:`` line), and the
    seed goes in ``--seeds``, not in the overrides."""
    if any(o.split("=", 1)[0].lstrip("+~") == "seed" for o in overrides):
        _fail("seed= in the overrides: give the run seeds with --seeds (dev seeds, >= 100)")
    bad = sorted(s for s in seeds if s < FIRST_DEV_SEED)
    if bad and not allow_eval:
        _fail(f"--seeds {bad}: run seeds < {FIRST_DEV_SEED} are evaluation seeds (a comparison run with seed S trains "
              f"on the batch seed S gives here); tune on dev seeds (default {list(DEV_SEEDS)}), or pass "
              "--allow-eval-seeds to look at an evaluation batch on purpose")
    if bad:
        print(f"# warning: --seeds {bad} are evaluation seeds; nothing chosen here may be called tuned on dev seeds")


def _fail(msg: str):
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


# ------------------------------------------------------------------------------------------- aggregation
SUMMARY_KEYS = (("format_errors", "fmt err"), ("success", "success"), ("dev_success", "dev"), ("update_kl", "KL"),
                ("live", "live"))


def live_share(minibatches) -> float | None:
    """The mean over an update's actor mini-batches of the share of tokens still getting gradient (None: none)."""
    vals = [m["live"] for m in minibatches if m.get("live") is not None]
    return sum(vals) / len(vals) if vals else None


def summarize(rows, confidence: float = 0.95) -> dict:
    """Per variant label: ``{key: (mean, low, high, n)}`` over its rows (one per batch) for ``SUMMARY_KEYS``, the
    t interval of ``report.intervals.t_interval``; a key no row has is left out."""
    from ragen_turn.report.intervals import t_interval

    out: dict = {}
    for label in dict.fromkeys(r["label"] for r in rows):
        own = [r for r in rows if r["label"] == label]
        out[label] = {}
        for key, _ in SUMMARY_KEYS:
            vals = [r[key] for r in own if r.get(key) is not None]
            if vals:
                out[label][key] = (*t_interval(vals, confidence), len(vals))
    return out


def paired_difference(rows, label: str, ref: str, key: str = "format_errors", confidence: float = 0.95):
    """``label``'s ``key`` minus ``ref``'s on the same batches (seeds both have): ``(mean, low, high, n)``."""
    from ragen_turn.report.intervals import t_interval

    mine = {r["seed"]: r.get(key) for r in rows if r["label"] == label}
    theirs = {r["seed"]: r.get(key) for r in rows if r["label"] == ref}
    diffs = [mine[s] - theirs[s] for s in mine if s in theirs and mine[s] is not None and theirs[s] is not None]
    return (*t_interval(diffs, confidence), len(diffs))


def group_of(label: str) -> str:
    """The group a variant is chosen within: its label's first word (``--tune``'s labels: ``algo lr=.. clip=..``)."""
    return label.split(" ", 1)[0]


def choose(summary: dict, labels, ref: str, tol: float = 0.1, objective: str = "success"):
    """The rule: among ``labels`` measured on as many batches as ``ref`` (a grid point a stopped call left with fewer
    is not compared on other batches), those whose mean format errors are at most ``ref``'s mean + ``tol``; of those,
    the best mean ``objective`` (ties: fewer format errors, then the label's order). Returns ``(label, why)``;
    label None when no candidate is within ``tol`` (or ``ref`` has no rows)."""
    if ref not in summary or "format_errors" not in summary[ref]:
        return None, f"no rows of the reference {ref!r}"
    bound = summary[ref]["format_errors"][0] + tol
    n_ref = summary[ref]["format_errors"][3]
    complete = [lb for lb in labels if lb in summary and summary[lb].get("format_errors", (0, 0, 0, 0))[3] >= n_ref]
    ok = [lb for lb in complete if summary[lb]["format_errors"][0] <= bound + 1e-12]
    if not ok:
        return None, f"no variant within {tol} of {ref}'s format errors ({bound - tol:.3f})"
    best = max(ok, key=lambda lb: (summary[lb].get(objective, (float("-inf"),))[0],
                                   -summary[lb]["format_errors"][0], -list(labels).index(lb)))
    left = len(labels) - len(complete)
    return best, (f"best mean {objective} {summary[best][objective][0]:.3f} of {len(ok)} within {tol} of {ref}'s "
                  f"format errors ({bound - tol:.3f})" + (f"; {left} with fewer batches not compared" if left else ""))


def print_summary(rows, ref: str, tol: float, objective: str) -> dict:
    """The per-variant table (mean [95% interval] over the batches) and each group's choice; returns the choices."""
    summary = summarize(rows)
    n_seeds = sorted({r["seed"] for r in rows})
    print(f"\n# over {len(n_seeds)} batches (run seeds {n_seeds}): mean [95% t interval]")
    keys = [(k, name) for k, name in SUMMARY_KEYS if any(k in v for v in summary.values())]
    print(f"{'variant':34s} {'n':>2s} " + " ".join(f"{name:>21s}" for _, name in keys) + f" {'fmt err - ' + ref:>24s}")
    for label, stats in summary.items():
        cells = []
        for k, _ in keys:
            m, lo, hi, _n = stats.get(k, (None, None, None, 0))
            cells.append(f"{fmt(m)} [{fmt(lo)}, {fmt(hi)}]" if m is not None else "-")
        d = paired_difference(rows, label, ref) if label != ref else None
        diff = f"{fmt(d[0], 3)} [{fmt(d[1])}, {fmt(d[2])}]" if d and d[3] else "-"
        n = max((v[3] for v in stats.values()), default=0)
        print(f"{label:34s} {n:>2d} " + " ".join(f"{c:>21s}" for c in cells) + f" {diff:>24s}")
    choices = {}
    groups = dict.fromkeys(group_of(lb) for lb in summary)
    print(f"\n# the rule: best mean {objective} among a group's variants with mean format errors <= {ref}'s + {tol}")
    for g in groups:
        labels = [lb for lb in summary if group_of(lb) == g]
        choices[g], why = choose(summary, labels, ref, tol, objective)
        print(f"{g:16s} -> {choices[g] or '(none)'}: {why}")
    return choices


def markdown_table(rows, ref: str, choices: dict) -> str:
    """The summary as a Markdown table (the tuning page's): a row per variant, mean [95% interval] per key."""
    summary = summarize(rows)
    keys = [(k, name) for k, name in SUMMARY_KEYS if any(k in v for v in summary.values())]
    names = " | ".join(name for _, name in keys)
    lines = [f"| grid point | batches | {names} | fmt err - {ref} (paired) | chosen |",
             "|---|---|" + "---|" * len(keys) + "---|---|"]
    for label, stats in summary.items():
        cells = [f"{fmt(stats[k][0])} [{fmt(stats[k][1])}, {fmt(stats[k][2])}]" if k in stats else "-" for k, _ in keys]
        d = paired_difference(rows, label, ref) if label != ref else None
        diff = f"{fmt(d[0])} [{fmt(d[1])}, {fmt(d[2])}]" if d and d[3] else "(reference)"
        n = max((v[3] for v in stats.values()), default=0)
        chosen = "**yes**" if choices.get(group_of(label)) == label else ""
        lines.append(f"| `{label}` | {n} | " + " | ".join(cells) + f" | {diff} | {chosen} |")
    return "\n".join(lines)


def read_rows(path: str) -> list:
    """The rows a run wrote to ``--out`` (one JSON object a line; the warm start's rows are labelled so)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------------------------------- the grid
def tune_variants(algos, lrs, clips, compose=None) -> dict:
    """The equal-tuning grid: for every algorithm the same actor lrs x clip multipliers (times the algorithm's
    shipped ``clip_ratio_low/high``: token PPO's 0.2 / 0.28, GSPO's 3e-4 / 4e-4, ...). Labels ``algo lr=.. clip=x..``.
    ``compose(overrides)`` gives a config (default: ``compose_config``; a test passes its own)."""
    if compose is None:
        from ragen_turn.compose import compose_config as compose
    actors = {algo: compose([f"algo={algo}"]).actor_rollout_ref.actor for algo in algos}
    out = {}
    for lr in lrs:  # grid points outer, algorithms inner: a call stopped early has every algorithm at its first points
        for c in clips:
            for algo, a in actors.items():
                out[f"{algo} lr={lr:g} clip=x{c:g}"] = [
                    f"algo={algo}", f"{A}.optim.lr={lr:g}", f"{A}.clip_ratio_low={float(a.clip_ratio_low) * c:.6g}",
                    f"{A}.clip_ratio_high={float(a.clip_ratio_high) * c:.6g}"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", default="long_turns", choices=sorted(SETTINGS))
    ap.add_argument("--variant", action="append", default=[], help="'label: overrides' (repeat); default: the study's")
    ap.add_argument("--only", nargs="*", default=None, help="run only these labels of the default variants")
    ap.add_argument("--tune", nargs="*", default=None, metavar="ALGO", help="the tuning grid for these algorithms")
    ap.add_argument("--lrs", nargs="*", type=float, default=[1e-4, 2e-4, 4e-4], help="--tune's actor lrs")
    ap.add_argument("--clips", nargs="*", type=float, default=[1.0], help="--tune's clip multipliers")
    ap.add_argument("--seeds", nargs="*", type=int, default=list(DEV_SEEDS),
                    help="dev run seeds (>= 100), one batch each")
    ap.add_argument("--allow-eval-seeds", action="store_true", help="allow run seeds < 100 (a comparison's batches)")
    ap.add_argument("--ref", default=None, help="the reference of the rule (default: token_ppo's shipped label)")
    ap.add_argument("--tol", type=float, default=0.1, help="the rule's bound on mean format errors above --ref's")
    ap.add_argument("--objective", default="success", choices=("success", "dev_success"))
    ap.add_argument("--summarize", nargs="+", default=None, metavar="JSONL",
                    help="only print the table and choices of the rows in these files (--out of one or more calls)")
    ap.add_argument("--markdown", action="store_true", help="with --summarize: the table in Markdown too")
    ap.add_argument("--shared-adv", default=None, help="the label of a variant whose advantages every variant uses")
    ap.add_argument("--dev", type=int, default=0, help="also evaluate on N dev rooms after the update (0: off)")
    ap.add_argument("--out", default=None, help="append one JSON line per variant and batch here; rows already "
                                                "there (label, seed) are not run again (resume)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("overrides", nargs="*", help="overrides for every variant (after --)")
    args = ap.parse_args(argv)

    if args.summarize:
        rows = [r for path in args.summarize for r in read_rows(path) if r["label"] != "(warm start)"]
        ref = args.ref or _default_ref(rows)
        choices = print_summary(rows, ref, args.tol, args.objective)
        if args.markdown:
            print("\n" + markdown_table(rows, ref, choices))
        return choices
    check_seeds(args.seeds, args.overrides, args.allow_eval_seeds)

    import torch

    torch.set_num_threads(args.threads)
    base = SETTINGS[args.setting] + COMMON + list(args.overrides)
    if args.tune is not None:
        variants = {lb: ov for lb, ov in tune_variants(args.tune, args.lrs, args.clips).items()}
    else:
        variants = dict(parse_variant(v) for v in args.variant) if args.variant else \
            {k: shlex.split(v) for k, v in DEFAULT_VARIANTS.items() if args.only is None or k in args.only}
    if args.dev:
        base.append(f"es_manager.val.env_groups={args.dev}")
    ref = args.ref or _default_ref([{"label": lb} for lb in variants])
    root = tempfile.mkdtemp(prefix="one_update_")
    log = print if args.verbose else (lambda *a, **k: None)
    done = {(r["label"], r["seed"]) for r in read_rows(args.out)} if args.out and os.path.exists(args.out) else set()
    rows = [r for r in read_rows(args.out) if r["label"] != "(warm start)"] if done else []
    out = open(args.out, "a") if args.out else None
    print(f"# one_update: {' '.join(base)}; {len(variants)} variants x run seeds {args.seeds}"
          + (f"; {len(done)} rows already in {args.out}" if done else ""))
    for seed in args.seeds:
        todo = {lb: ov for lb, ov in variants.items() if (lb, seed) not in done}
        if todo:
            rows += one_batch(seed, base + [f"seed={seed}"], todo, args, root, log, out)
    if out:
        out.close()
    return print_summary(rows, ref, args.tol, args.objective)


def _default_ref(rows) -> str:
    """token_ppo's shipped setting among the labels: ``token_ppo``, or the grid's ``token_ppo lr=0.0002 clip=x1``."""
    labels = [r["label"] for r in rows]
    for lb in ("token_ppo", "token_ppo lr=0.0002 clip=x1"):
        if lb in labels:
            return lb
    return labels[0] if labels else "token_ppo"


def one_batch(seed: int, base, variants: dict, args, root: str, log, out) -> list:
    """Every variant on run seed ``seed``'s first batch; prints a line per variant, returns the rows."""
    from ragen_turn.engines.runlog import episode_metrics

    first = next(iter(variants.values()))
    t0 = time.time()
    trainer = build(base + first, os.path.join(root, f"_batch{seed}"), log)
    batch0 = trainer.rollout(0)
    m = episode_metrics(batch0)  # the warm start's own numbers: its rollout is this batch (same weights and seeds)
    before = {"format_errors": m["env/format_error_rate"], "success": m["env/success"],
              "tokens_per_turn": m["env/response_tokens"] / max(m["env/turns"], 1e-9)}
    if args.dev:
        before["dev_success"] = trainer.evaluate()["val/success"]
    print(f"# seed {seed}: batch of {batch0.batch_size} episodes, {int(batch0.response_mask.sum())} sampled tokens "
          f"({time.time() - t0:.0f} s); before the update: format errors {fmt(before['format_errors'])}, tokens/turn "
          f"{fmt(before['tokens_per_turn'], 1)}, success {fmt(before['success'])}"
          + (f", dev success {fmt(before['dev_success'])}" if args.dev else ""))
    shared = None
    if args.shared_adv is not None:
        if args.shared_adv not in variants:
            raise SystemExit(f"--shared-adv {args.shared_adv!r}: not one of the variants {sorted(variants)}")
        t = build(base + variants[args.shared_adv], os.path.join(root, f"_shared{seed}"), log)
        b = t.filter_groups(copy.deepcopy(batch0))
        t.score(b)
        t.compute_advantages(b)
        shared = b.advantages
        print(f"# advantages: {args.shared_adv}'s, shared by every variant")
    del trainer
    if out:
        out.write(json.dumps(dict(before, label="(warm start)", seed=seed, update_kl=0.0, minibatches=[])) + "\n")
    print(f"{'variant':34s} {'seed':>4s} {'mini-batches: kl / turns clipped / live / grad norm / scale':60s} "
          f"{'KL':>6s} {'fmt err':>7s} {'tok/turn':>8s} {'success':>7s}" + (f" {'dev':>6s}" if args.dev else ""))
    rows = []
    for label, ov in variants.items():
        row = one_variant(label, base + ov, batch0, shared, args.dev, root, not args.verbose)
        row["seed"], row["live"] = seed, live_share(row["minibatches"])
        rows.append(row)
        mbs = " | ".join(f"{fmt(m['kl'])}/{fmt(m['turns_clip'], 2)}/{fmt(m['live'], 2)}/{fmt(m['gnorm'], 2)}"
                         + ("" if m['scale'] is None else f"/{fmt(m['scale'], 2)}") + ("" if m['stepped'] else "x")
                         for m in row["minibatches"])
        print(f"{label:34s} {seed:>4d} {mbs:60s} {fmt(row['update_kl']):>6s} {fmt(row['format_errors']):>7s} "
              f"{fmt(row['tokens_per_turn'], 1):>8s} {fmt(row['success']):>7s}"
              + (f" {fmt(row.get('dev_success')):>6s}" if args.dev else "") + f"  ({row['seconds']:.0f} s)", flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
    return rows


if __name__ == "__main__":
    main()
