"""What each critic can learn from a setting's data: offline fits of the turn and the token critic, held-out
explained variance per epoch.

From a setting's committed warm start (``one_update.SETTINGS``, its trainers built by ``one_update.build``), the
local engine rolls out a fixed training set (``--train-steps`` training batches, env seeds of run seed
``--seed``, a dev seed: 100+) and plays a disjoint held-out set (``--heldout`` dev rooms, ``es_manager.val.seeds=dev``,
one episode each). Each variant then fits a fresh critic over ``--epochs`` epochs: one epoch is one pass of the
trainer's own critic update (``StarPOTrainer._run_updates`` with ``critic_step_loss``: its mini-batches,
micro-batches, value loss, clipping and grad clip) over each training batch in turn, its "old" values read at the
start of the epoch, as a training step reads them before its update. The targets are the realised returns
(``engines.advantages.realised_returns``: the estimator's returns at lambda = 1, the run's gamma), the critic of
``algo=turn_ppo`` (turn critic: V(s_h) at the turn starts, gamma 0.99) and of ``algo=token_ppo`` (token critic: V at
every response token, gamma 1). After each epoch: explained variance on the training set and on the held-out set
(``heldout_critic_explained_var``, what ``val/critic_explained_var`` logs), on the returns' raw scale.

Variants (``--variants``; each a label and options):

- ``lr=X``: the critic's lr (AdamW, the trainer's critic optimizer settings otherwise);
- ``clip=X|none``: ``critic.cliprange_value`` (none: null, no value clipping);
- ``norm``: targets standardised by the training set's mean and std (the critic fits (G - mean) / std; its values
  are mapped back before the explained variance);
- ``start=actor`` (the actor's weights and a new zero head, as verl and the trainers start) | ``start=probe`` (the
  same, then the head fitted by least squares on the frozen backbone's features of the training set: epoch 0 is
  that linear probe) | ``start=shared`` (the backbone at the actor's lr, the head at the critic's: what a value
  head on the actor's backbone gets from its value loss, the actor's own loss left out);
- ``frozen``: only the head trains (the backbone frozen).

One epoch = ``train_steps x (batch / ppo_mini_batch_size)`` critic optimizer steps, i.e. what ``train_steps``
training steps give the critic at ``critic.ppo_epochs=1``.

    python benchmarks/critic_fit.py --setting long_turns --epochs 8 --out /tmp/critic_fit_long_turns.jsonl
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
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

from one_update import SETTINGS, build  # noqa: E402  (the settings' warm starts and trainers, one place)

DEFAULT_VARIANTS = {
    "lr=1e-3": "lr=1e-3",          # the tiny model's shipped critic lr (config/model/tiny.yaml), clip 0.5
    "lr=1e-2": "lr=1e-2",
    "lr=1e-2 clip=none": "lr=1e-2 clip=none",
    "lr=1e-3 start=probe": "lr=1e-3 start=probe",
}
CRITICS = {"turn": "algo=turn_ppo", "token": "algo=token_ppo"}


def parse_options(text: str) -> dict:
    opts = {"lr": None, "clip": "config", "norm": False, "start": "actor", "frozen": False}
    for tok in shlex.split(text):
        key, _, val = tok.partition("=")
        if key in ("norm", "frozen"):
            opts[key] = True
        elif key == "lr":
            opts["lr"] = float(val)
        elif key == "clip":
            opts["clip"] = val
        elif key == "start":
            if val not in ("actor", "probe", "shared"):
                raise SystemExit(f"start={val}: actor | probe | shared")
            opts["start"] = val
        else:
            raise SystemExit(f"unknown variant option {tok!r} (lr=, clip=, norm, start=, frozen)")
    return opts


def set_targets(batch, cfg, mean: float = 0.0, std: float = 1.0):
    """The critic's training targets on ``batch``: the realised returns (standardised by ``mean``/``std``) in the
    estimator's layout (``returns`` [B, T] or ``turn_returns`` [B, H])."""
    from ragen_turn.engines.advantages import realised_returns

    g = (realised_returns(batch, cfg) - mean) / std
    if cfg.critic.level == "turn":
        batch.returns, batch.turn_returns = None, g
    else:
        batch.returns, batch.turn_returns = g, None


def masked_targets(batch, cfg):
    """Realised returns at the positions the critic is trained on, flattened."""
    from ragen_turn.engines.advantages import realised_returns

    mask = batch.turn_mask if cfg.critic.level == "turn" else batch.response_mask
    return realised_returns(batch, cfg)[mask.bool()]


def read_values(trainer, batch, mean: float, std: float):
    """The critic's values on ``batch``: ``[B, T]`` in the shared layout on the scale it fits, and at its training
    positions (flattened) mapped back to the returns' raw scale."""
    from ragen_turn.algos import values_before_tokens
    from ragen_turn.engines.advantages import critic_values

    trainer.critic.eval()
    after = trainer._forward_all(lambda ids, am, pos, _: trainer.critic(ids, am, pos), batch)
    v = values_before_tokens(after) * batch.response_mask  # the critic's own (fitted) scale
    level = trainer.cfg.critic.level
    mask = batch.turn_mask if level == "turn" else batch.response_mask
    return v, critic_values(v, batch, level)[mask.bool()] * std + mean


def explained_var(trainer, batches, cfg, mean, std) -> float:
    from ragen_turn.algos import explained_variance

    vs, gs = zip(*[(read_values(trainer, b, mean, std)[1], masked_targets(b, cfg)) for b in batches])
    v, g = torch.cat(vs), torch.cat(gs)
    return explained_variance(v, g, torch.ones_like(v))


def fit_probe(trainer, batches) -> None:
    """The value head by ridge least squares (``CriticModel.fit_head``, what ``critic.head_init=fit`` does) on the
    frozen backbone's states at the training positions of every batch (``StarPOTrainer.critic_features``), against
    the targets set on them (standardised as the variant's)."""
    X, y = zip(*[trainer.critic_features(b) for b in batches])
    trainer.critic.fit_head(torch.cat(X).to(trainer.device), torch.cat(y).to(trainer.device))


def run_variant(label: str, opts: dict, trainer, train, heldout, epochs: int, clip0) -> list:
    """Fit a fresh critic on ``train`` (a list of batches) for ``epochs``; one row per epoch (0 = the start).
    ``clip0``: the config's ``critic.cliprange_value`` (each variant sets its own on the trainer's config)."""
    from ragen_turn.models import CriticModel

    cfg = trainer.cfg
    c = cfg.critic
    lr = opts["lr"] if opts["lr"] is not None else float(c.optim.lr)
    # value clipping: the trainer's loss reads critic.cliprange_value (set per variant; "config": the setting's)
    c.cliprange_value = clip0 if opts["clip"] == "config" else (None if opts["clip"] == "none" else float(opts["clip"]))
    torch.manual_seed(0)
    trainer.critic = CriticModel.from_causal_lm(trainer.actor).to(trainer.device)
    head = list(trainer.critic.value_head.parameters())
    body = [p for n, p in trainer.critic.named_parameters() if not n.startswith("value_head.")]
    if opts["frozen"]:
        for p in body:
            p.requires_grad_(False)
        groups = [{"params": head}]
    elif opts["start"] == "shared":
        groups = [{"params": head}, {"params": body, "lr": float(cfg.actor_rollout_ref.actor.optim.lr)}]
    else:
        groups = [{"params": head}, {"params": body}]
    optim = torch.optim.AdamW(groups, lr=lr, weight_decay=float(c.optim.weight_decay))
    mean, std = 0.0, 1.0
    if opts["norm"]:
        g = torch.cat([masked_targets(b, cfg) for b in train])
        mean, std = float(g.mean()), float(g.std().clamp(min=1e-6))
    for b in train:
        set_targets(b, cfg, mean, std)
    if opts["start"] == "probe":
        fit_probe(trainer, train)
    from ragen_turn.algos import explained_variance

    rows = []
    t0 = time.time()
    m: dict = {}
    for epoch in range(epochs + 1):
        # the values after the last epoch: this epoch's training-set explained variance and the next one's
        # "old" values (the fitted scale), as a training step reads them before its update
        vs = [read_values(trainer, b, mean, std) for b in train]
        v, g = torch.cat([x[1] for x in vs]), torch.cat([masked_targets(b, cfg) for b in train])
        row = {"label": label, "level": c.level, "epoch": epoch, "lr": lr,
               **{k: val for k, val in opts.items() if k != "lr"},
               "train_ev": explained_variance(v, g, torch.ones_like(v)),
               "heldout_ev": explained_var(trainer, [heldout], cfg, mean, std),
               "value_loss": m.get("critic/value_loss"), "vf_clipfrac": m.get("critic/vf_clipfrac"),
               "seconds": time.time() - t0}
        rows.append(row)
        if epoch == epochs:
            break
        for i, (b, (old, _)) in enumerate(zip(train, vs)):
            b.values = old
            trainer.step = epoch * len(train) + i  # its mini-batch shuffle
            m, _ = trainer._run_updates(b, trainer.critic, optim, trainer.critic_step_loss, int(c.ppo_epochs),
                                        float(c.grad_clip), "critic")
    return rows


def collect(trainer, steps: int):
    """``steps`` training batches (steps 0..steps-1 of the run's seed) and the held-out (dev) batch."""
    from ragen_turn.engines.local.trainer import evaluate_policy

    train = [trainer.rollout(s) for s in range(steps)]
    seen = []
    evaluate_policy(trainer.actor, trainer.tokenizer, trainer.cfg, trainer.val_envs, trainer.device,
                    on_batch=seen.append)
    return train, seen[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", default="long_turns", choices=sorted(SETTINGS))
    ap.add_argument("--critics", nargs="*", default=list(CRITICS), choices=list(CRITICS))
    ap.add_argument("--variant", action="append", default=[], help="'label: options' (repeat); default: the study's")
    ap.add_argument("--only", nargs="*", default=None, help="run only these labels of the default variants")
    ap.add_argument("--train-steps", type=int, default=2, help="training batches in the fixed training set")
    ap.add_argument("--heldout", type=int, default=64, help="held-out dev rooms (one episode each)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=100, help="the run seed of the training set (dev seeds: 100+)")
    ap.add_argument("--out", default=None, help="write one JSON line per variant and epoch here")
    ap.add_argument("--data", default=None, help="keep the rollouts here (a torch file): loaded when it exists, "
                    "else written; it must come from the same setting, seed and sizes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("overrides", nargs="*", help="overrides for every trainer (after --)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    variants = {}
    for v in args.variant:
        label, _, text = v.partition(":")
        variants[label.strip()] = parse_options(text)
    if not variants:
        variants = {k: parse_options(v) for k, v in DEFAULT_VARIANTS.items() if args.only is None or k in args.only}
    base = SETTINGS[args.setting] + ["es_manager.val.seeds=dev", f"seed={args.seed}",
                                     f"es_manager.val.env_groups={args.heldout}", "es_manager.val.group_size=1"] \
        + list(args.overrides)
    root = tempfile.mkdtemp(prefix="critic_fit_")
    quiet = lambda *a, **k: None  # noqa: E731
    out = open(args.out, "a") if args.out else None
    train = heldout = None
    all_rows = []
    for level in args.critics:
        trainer = build(base + [CRITICS[level]], os.path.join(root, level), quiet)
        if train is None:  # one data set for both critics (same warm start and seeds: the same episodes)
            t0 = time.time()
            if args.data and os.path.exists(args.data):
                train, heldout = torch.load(args.data, weights_only=False)
            else:
                train, heldout = collect(trainer, args.train_steps)
                if args.data:
                    torch.save((train, heldout), args.data)
            n_train = sum(b.batch_size for b in train)
            print(f"# critic_fit {args.setting}: {' '.join(base)}; {n_train} training episodes "
                  f"({args.train_steps} batches), {heldout.batch_size} held-out; rollouts {time.time() - t0:.0f} s",
                  flush=True)
        for b in train + [heldout]:
            b.values = None
        G = torch.cat([masked_targets(b, trainer.cfg) for b in train])
        Gh = masked_targets(heldout, trainer.cfg)
        print(f"# {level} critic ({CRITICS[level]}, gamma {trainer.cfg.algorithm.gamma}): training targets "
              f"{len(G)}, mean {G.mean():.3f} std {G.std():.3f} range [{G.min():.2f}, {G.max():.2f}]; held-out "
              f"{len(Gh)}, mean {Gh.mean():.3f} std {Gh.std():.3f}", flush=True)
        print(f"{'variant':24s} held-out explained variance by epoch (train at the last)")
        clip0 = trainer.cfg.critic.cliprange_value
        for label, opts in variants.items():
            rows = run_variant(label, opts, trainer, [copy.deepcopy(b) for b in train], copy.deepcopy(heldout),
                               args.epochs, clip0)
            for r in rows:
                r.update(setting=args.setting, seed=args.seed)
            all_rows.extend(rows)
            print(f"{level + ' ' + label:24s} " + " ".join(f"{r['heldout_ev']:6.3f}" for r in rows)
                  + f" | train {rows[-1]['train_ev']:.3f} | {rows[-1]['seconds']:.0f} s", flush=True)
            if out:
                for r in rows:
                    out.write(json.dumps(r) + "\n")
                out.flush()
        del trainer
    if out:
        out.close()
    return all_rows


if __name__ == "__main__":
    main()
