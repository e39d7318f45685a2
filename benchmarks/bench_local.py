"""Local engine speed: batched vs one-at-a-time sampling, update throughput, turn vs token step time.

    python benchmarks/bench_local.py [--model tiny|smollm2-135m] [--batch 64] [--new-tokens 32]

- sampling: ``--batch`` real Sokoban first prompts, ``--new-tokens`` sampled tokens each (stop
  strings off so every row samples the same count), as one left-padded KV-cache batch and one
  prompt at a time; sampled tokens per second and the ratio (target >= 8x at batch 64).
- rollout: one multi-turn Sokoban rollout batch with a fresh prefill every turn and with the
  prefix cache (earlier turns' keys/values kept); wall times and the ratio.
- update: one rollout batch of the default Sokoban setting, then the full PPO update (critic +
  actor) with ``turn_ppo`` and with ``token_ppo`` on the same tokens; tokens per second and the
  ratio of the two step times (target turn / token <= 1.10).
- checkpointing: the same ``turn_ppo`` update with ``engine.gradient_checkpointing`` off and on: step
  time and, on a GPU, the peak memory allocated during the update.

``--device cuda`` runs it all on a GPU; ``--set KEY=VALUE`` (repeatable) adds Hydra overrides, e.g.
``--set model.hidden_size=512 --set micro_batch_size_per_gpu=64``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ragen_turn.engines.local.sampler import LocalSampler
from ragen_turn.engines.local.trainer import build_trainer
from ragen_turn.compose import compose_config
from ragen_turn.runtime import quiet_transformers


def prompts_for(trainer, n: int):
    from ragen_turn.rollout import system_prompt, user_message

    out = []
    slots = trainer.train_envs.assign_seeds(0, 0)
    for i in range(n):
        slot = slots[i % len(slots)]
        obs = slot.env.reset(seed=slot.seed + i)
        out.append(trainer.formatter.first_prompt(system_prompt(slot.instruction, trainer.ctx),
                                                  user_message(str(obs), 0, trainer.ctx)))
    return out


def bench_sampling(trainer, batch: int, new_tokens: int) -> None:
    prompts = prompts_for(trainer, batch)
    sampler = LocalSampler(trainer.actor, trainer.tokenizer, temperature=1.0, stop_strings=(), device=trainer.device,
                           generator=torch.Generator().manual_seed(0))
    sampler.stop_ids = set()
    sampler._stop_ids_t = torch.tensor([], dtype=torch.long)
    t = time.perf_counter()
    outs = sampler.generate(prompts, new_tokens)
    t_batch = time.perf_counter() - t
    n_batch = sum(len(o) for o in outs)
    k = min(8, batch)  # one at a time on a subset, scaled
    t = time.perf_counter()
    n_single = 0
    for p in prompts[:k]:
        n_single += len(sampler.generate([p], new_tokens)[0])
    t_single = time.perf_counter() - t
    tps_batch, tps_single = n_batch / t_batch, n_single / t_single
    print(f"sampling  batch {batch}: {tps_batch:8.0f} tok/s ({t_batch:.2f} s)   one at a time: {tps_single:8.0f} tok/s"
          f"   ratio {tps_batch / tps_single:.1f}x (target >= 8x)")


def bench_rollout(trainer, repeats: int) -> None:
    """One multi-turn rollout batch (the config's env groups x group size), fresh prefill every turn
    vs the prefix cache (same seeds, same generator seed); wall time and the ratio."""
    from ragen_turn.rollout import context_config, run_episodes

    times = {}
    for cached in (False, True):
        ts = []
        for _ in range(repeats):
            sampler = LocalSampler(trainer.actor, trainer.tokenizer, temperature=1.0, device=trainer.device,
                                   generator=torch.Generator().manual_seed(0), prefix_cache=cached)
            t = time.perf_counter()
            eps = run_episodes(trainer.train_envs.assign_seeds(0, 0), sampler, trainer.formatter,
                               context_config(trainer.cfg))
            ts.append(time.perf_counter() - t)
        times[cached] = statistics.median(ts)
        turns = sum(e.num_turns for e in eps)
        print(f"rollout   prefix_cache={str(cached):5s}: {times[cached]:.2f} s for {len(eps)} episodes, {turns} turns, "
              f"{sum(len(e.token_ids) for e in eps)} tokens; reused {sampler.cached_tokens_reused} prompt tokens")
    print(f"rollout time fresh prefill / prefix cache: {times[False] / times[True]:.2f}x")


def base_overrides(a) -> list:
    out = ["model.warmstart.enable=false", f"device={a.device}",
           "trainer.default_local_dir=/tmp/ragen_turn_bench_local", "trainer.overwrite=true"]
    if a.model != "tiny":
        out.append(f"model={a.model}")
    return out + list(a.set)


def scored(tr, batch):
    """A fresh copy of ``batch`` with old log-probs, values and advantages from ``tr``: ready for ``tr.update``."""
    b = batch.select(torch.arange(batch.batch_size))
    tr.score(b)
    tr.compute_advantages(b)
    return b


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def bench_update(a) -> None:
    times = {}
    tokens = 0
    batch = None
    for algo in ("turn_ppo", "token_ppo"):
        tr = build_trainer(compose_config(base_overrides(a) + [f"algo={algo}"]), log=lambda *a: None)
        if batch is None:
            batch = tr.rollout(0)
            tokens = int(batch.attention_mask.sum())
        ts = []
        for i in range(a.repeats + 1):  # the first pass warms up (allocator, kernels) and is not timed
            t = time.perf_counter()
            tr.update(scored(tr, batch))
            sync(a.device)
            if i > 0:
                ts.append(time.perf_counter() - t)
        times[algo] = statistics.median(ts)
        print(f"update    {algo:9s}: {times[algo]:.2f} s per step (score + advantages + critic + actor), "
              f"{tokens / times[algo]:.0f} tok/s over {batch.batch_size} episodes, {tokens} tokens")
    print(f"step time turn_ppo / token_ppo: {times['turn_ppo'] / times['token_ppo']:.3f} (target <= 1.10)")


def bench_checkpointing(a) -> None:
    batch, res = None, {}
    cuda = str(a.device).startswith("cuda")
    for gc in (False, True):
        tr = build_trainer(compose_config(base_overrides(a) + ["algo=turn_ppo", f"engine.gradient_checkpointing={gc}"]),
                           log=lambda *a: None)
        if batch is None:
            batch = tr.rollout(0)
        b = scored(tr, batch)
        sync(a.device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        tr.update(b)
        sync(a.device)
        res[gc] = (time.perf_counter() - t, (torch.cuda.max_memory_allocated() - base) / 2 ** 30 if cuda else None)
        # above what was allocated before the update (weights); gradients and AdamW's state are created in it
        mem = f", peak {res[gc][1]:.2f} GiB above the weights (incl. gradients, optimizer state)" if cuda else ""
        print(f"checkpointing {'on ' if gc else 'off'}: update {res[gc][0]:.2f} s{mem}")
        del tr
        if cuda:
            torch.cuda.empty_cache()
    ratio = f", memory on / off {res[True][1] / res[False][1]:.2f}" if cuda else ""
    print(f"checkpointing: update time on / off {res[True][0] / res[False][0]:.2f}{ratio}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra Hydra override")
    p.add_argument("--only", default="sampling,rollout,update,checkpointing")
    a = p.parse_args()
    quiet_transformers()
    only = set(a.only.split(","))
    tr = build_trainer(compose_config(base_overrides(a)), log=lambda *a: None)
    print(f"model {a.model}: {sum(p.numel() for p in tr.actor.parameters()) / 1e6:.1f}M parameters, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if "sampling" in only:
        bench_sampling(tr, a.batch, a.new_tokens)
    if "rollout" in only:
        bench_rollout(tr, a.repeats)
    del tr
    if "update" in only:
        bench_update(a)
    if "checkpointing" in only:
        bench_checkpointing(a)


if __name__ == "__main__":
    main()
