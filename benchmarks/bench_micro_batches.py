"""Length-sorted micro-batches: tokens computed on and step time, against micro-batches in row order.

    python benchmarks/bench_micro_batches.py [--threads 2] [--repeats 2] [--sft-steps 10] [--set KEY=VALUE ...]

Both the warm start's SFT and the local engine's PPO update run a batch as micro-batches whose losses add up to the
batch's (gradient accumulation). Which rows share a micro-batch changes only the padding each forward computes on:
``Trajectory.micro_batches`` puts rows of similar length together. The batch here is Sokoban solver demonstrations in
the default warm start's format (the RL batch's lengths after a few steps are like theirs: 1-5 turns). It prints:

- tokens: padded tokens and attention cells (sum of squared widths) of the chunks, sorted / row order.
- sft: seconds per SFT step of ``model.warmstart.batch_size`` episodes in one forward, and in micro-batches of
  16 / 8 / 4 in row order and sorted, with the NLL each reached (the same up to float rounding: same batches).
- update: score (old log-probs + values) + turn-level GAE + critic and actor updates of the default RL batch
  (``es_manager.train.env_groups`` x ``group_size`` demonstration episodes, ``ppo_mini_batch_size``,
  ``micro_batch_size_per_gpu``), row order against sorted, with the ratio.

Row order is what the engines did before sorting (the benchmark patches ``Trajectory.micro_batches`` to get it).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from contextlib import contextmanager

import torch
from omegaconf import open_dict

from ragen_turn.config import model_config
from ragen_turn.engines.local.trainer import build_trainer
from ragen_turn.models import load_model_and_tokenizer
from ragen_turn.rollout import Trajectory
from ragen_turn.compose import compose_config
from ragen_turn.runtime import quiet_transformers
from ragen_turn.warmstart import collect_demonstrations, sft

SORTED = Trajectory.micro_batches


def row_order(self: Trajectory, size: int):
    return [torch.arange(i, min(i + size, self.batch_size)) for i in range(0, self.batch_size, max(1, size))]


@contextmanager
def chunking(kind: str):
    Trajectory.micro_batches = SORTED if kind == "sorted" else row_order
    try:
        yield
    finally:
        Trajectory.micro_batches = SORTED


def padding(batch: Trajectory, mini: int, micro: int, kind: str, draws: int = 200):
    """Padded tokens and attention cells over ``draws`` random mini-batches of ``mini`` rows in chunks of ``micro``."""
    g = torch.Generator().manual_seed(0)
    tokens = cells = 0
    with chunking(kind):
        for _ in range(draws):
            mb = batch.select(torch.randperm(batch.batch_size, generator=g)[:mini])
            for idx in mb.micro_batches(micro):
                w = int(mb.attention_mask[idx].sum(dim=1).max())
                tokens += w * len(idx)
                cells += w * w * len(idx)
    return tokens, cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="timed updates per setting (after one untimed)")
    ap.add_argument("--sft-steps", type=int, default=10)
    ap.add_argument("--set", action="append", default=[], help="extra Hydra override (repeatable)")
    a = ap.parse_args()
    quiet_transformers()
    torch.set_num_threads(a.threads)
    cfg = compose_config(["model.warmstart.enable=false", "trainer.default_local_dir=/tmp/ragen_turn_bench_micro",
                          "trainer.overwrite=true", f"model.warmstart.steps={a.sft_steps}"] + a.set)
    model, tok = load_model_and_tokenizer(model_config(cfg), device="cpu", dtype="float32")
    n_rl = int(cfg.es_manager.train.env_groups) * int(cfg.es_manager.train.group_size)
    demos = collect_demonstrations(cfg, tok, max(n_rl, 512), seed=0)
    lengths = demos.attention_mask.sum(dim=1).float()
    print(f"torch {torch.__version__}, {a.threads} threads; {demos.batch_size} demonstration episodes, "
          f"{lengths.mean():.0f} tokens on average (max {lengths.max():.0f})")

    bs = int(cfg.model.warmstart.batch_size)
    for mini, micro in ((bs, 16), (bs, 8), (int(cfg.ppo_mini_batch_size), int(cfg.micro_batch_size_per_gpu))):
        (t_row, c_row), (t_s, c_s) = padding(demos, mini, micro, "row"), padding(demos, mini, micro, "sorted")
        print(f"tokens    {mini} rows in chunks of {micro}: padded tokens sorted / row order {t_s / t_row:.3f}, "
              f"attention cells {c_s / c_row:.3f}")

    base = None
    for micro, kind in ((0, "row"), (16, "row"), (16, "sorted"), (8, "row"), (8, "sorted"), (4, "sorted")):
        run_cfg = copy.deepcopy(cfg)
        with open_dict(run_cfg):
            run_cfg.model.warmstart.micro_batch_size = micro
        with chunking(kind):
            stats = sft(copy.deepcopy(model), demos, run_cfg, torch.device("cpu"), log=lambda line: None)
        s = stats["sft/seconds"] / a.sft_steps
        base = base or s
        name = "one forward" if micro == 0 else f"micro {micro:2d} {kind}"
        print(f"sft       {bs} episodes, {name:16s}: {s:.3f} s/step ({s / base:.2f}x), "
              f"nll {stats['sft/final_nll']:.5f}")

    tr = build_trainer(cfg, log=lambda *x: None)
    batch = demos.select(torch.arange(n_rl))
    times = {}
    for kind in ("row", "sorted"):
        ts = []
        with chunking(kind):
            for i in range(a.repeats + 1):  # the first pass warms up and is not timed
                state = copy.deepcopy((tr.actor.state_dict(), tr.critic.state_dict()))
                b = batch.select(torch.arange(batch.batch_size))
                t = time.perf_counter()
                tr.score(b)
                tr.compute_advantages(b)
                tr.update(b)
                if i > 0:
                    ts.append(time.perf_counter() - t)
                tr.actor.load_state_dict(state[0])
                tr.critic.load_state_dict(state[1])
        times[kind] = statistics.median(ts)
        print(f"update    {n_rl} episodes, mini-batch {cfg.ppo_mini_batch_size}, micro {cfg.micro_batch_size_per_gpu}, "
              f"{kind:6s}: {times[kind]:.2f} s (score + advantages + critic + actor)")
    print(f"update time sorted / row order: {times['sorted'] / times['row']:.2f}")


if __name__ == "__main__":
    main()
