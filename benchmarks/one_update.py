"""One update, then a fresh rollout: how far one actor update moves each variant's policy, on one batch.

From one warm start and one seed, the local engine rolls out one batch, then for each variant (a label and config
overrides, e.g. another algo or trust-region setting) builds a fresh trainer from the same weights, scores that same
batch, computes the advantages (its own, or one variant's shared with all: ``--shared-adv``), applies one update
(critic, then actor) and rolls out again with the same env and sampling seeds. It prints, per variant:

- per actor mini-batch: approx KL before its step, turns and tokens clipped, the share of tokens still getting
  gradient (``live``), dual-clipped tokens, grad norm before clipping, the step's scale, whether it was stepped;
- after the update: approx KL over the batch (k3 per response token), and the fresh rollout's format errors,
  sampled tokens per turn and success; with ``--dev N``, success on N dev rooms (``es_manager.val.seeds=dev``).

Settings are chosen on the dev seeds (``es_manager.val.seeds=dev``, the default here); held-out seeds are for
reporting. Deterministic for a seed on one CPU type.

    python benchmarks/one_update.py                       # the long_turns study's variants, seed 1
    python benchmarks/one_update.py --setting long_horizon --only token_ppo turn_ppo   # another setting
    python benchmarks/one_update.py --variant 'tp: algo=turn_ppo' --variant 'tp_kl: algo=turn_ppo \
        actor_rollout_ref.actor.target_kl=0.02' -- seed=0     # your own variants; overrides after -- go to all
    python benchmarks/one_update.py --shared-adv token_ppo    # every variant trains on token_ppo's advantages
"""
from __future__ import annotations

import argparse
import copy
import json
import os
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
COMMON = ["es_manager.val.seeds=dev", "seed=1"]

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
    trainer = build(overrides, os.path.join(root, label.replace("/", "_")), log)
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
    return "-" if x is None else f"{x:.{p}f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", default="long_turns", choices=sorted(SETTINGS))
    ap.add_argument("--variant", action="append", default=[], help="'label: overrides' (repeat); default: the study's")
    ap.add_argument("--only", nargs="*", default=None, help="run only these labels of the default variants")
    ap.add_argument("--shared-adv", default=None, help="the label of a variant whose advantages every variant uses")
    ap.add_argument("--dev", type=int, default=0, help="also evaluate on N dev rooms after the update (0: off)")
    ap.add_argument("--out", default=None, help="write one JSON line per variant here")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("overrides", nargs="*", help="overrides for every variant (after --), e.g. seed=0")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    variants = dict(parse_variant(v) for v in args.variant) if args.variant else \
        {k: shlex.split(v) for k, v in DEFAULT_VARIANTS.items() if args.only is None or k in args.only}
    base = SETTINGS[args.setting] + COMMON + list(args.overrides)
    if args.dev:
        base.append(f"es_manager.val.env_groups={args.dev}")
    root = tempfile.mkdtemp(prefix="one_update_")
    log = print if args.verbose else (lambda *a, **k: None)

    # the batch: rolled out once by the warm start (any variant's trainer rolls out the same one: same weights
    # and seeds), with the fresh-rollout numbers of the warm start itself as the "before" row
    first = next(iter(variants.values()))
    t0 = time.time()
    trainer = build(base + first, os.path.join(root, "_batch"), log)
    batch0 = trainer.rollout(0)
    before = fresh_rollout(trainer, args.dev)
    print(f"# one_update: {' '.join(base)}; batch of {batch0.batch_size} episodes, "
          f"{int(batch0.response_mask.sum())} sampled tokens ({time.time() - t0:.0f} s)")
    print(f"# before the update: format errors {fmt(before['format_errors'])}, tokens/turn "
          f"{fmt(before['tokens_per_turn'], 1)}, success {fmt(before['success'])}"
          + (f", dev success {fmt(before['dev_success'])}" if args.dev else ""))
    shared = None
    if args.shared_adv is not None:
        if args.shared_adv not in variants:
            raise SystemExit(f"--shared-adv {args.shared_adv!r}: not one of the variants {sorted(variants)}")
        t = build(base + variants[args.shared_adv], os.path.join(root, "_shared"), log)
        b = t.filter_groups(copy.deepcopy(batch0))
        t.score(b)
        t.compute_advantages(b)
        shared = b.advantages
        print(f"# advantages: {args.shared_adv}'s, shared by every variant")
    del trainer

    rows = [dict(before, label="(warm start)", update_kl=0.0, minibatches=[])]
    out = open(args.out, "w") if args.out else None
    head = f"{'variant':28s} {'mini-batches: kl / turns clipped / live / grad norm / scale':60s} " \
           f"{'KL':>6s} {'fmt err':>7s} {'tok/turn':>8s} {'success':>7s}" + (f" {'dev':>6s}" if args.dev else "")
    print(head)
    for label, ov in variants.items():
        row = one_variant(label, base + ov, batch0, shared, args.dev, root, not args.verbose)
        rows.append(row)
        mbs = " | ".join(f"{fmt(m['kl'])}/{fmt(m['turns_clip'], 2)}/{fmt(m['live'], 2)}/{fmt(m['gnorm'], 2)}"
                         + ("" if m['scale'] is None else f"/{fmt(m['scale'], 2)}") + ("" if m['stepped'] else "x")
                         for m in row["minibatches"])
        print(f"{label:28s} {mbs:60s} {fmt(row['update_kl']):>6s} {fmt(row['format_errors']):>7s} "
              f"{fmt(row['tokens_per_turn'], 1):>8s} {fmt(row['success']):>7s}"
              + (f" {fmt(row.get('dev_success')):>6s}" if args.dev else ""), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
    if out:
        out.write(json.dumps(rows[0]) + "\n")
        out.close()
    return rows


if __name__ == "__main__":
    main()
