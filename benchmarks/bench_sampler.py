"""The local engine's rollout sampler: tokens/s of a multi-turn Sokoban rollout per decode mode, against the
memory-bandwidth bound of the device.

    python benchmarks/bench_sampler.py [--model tiny|smollm2-135m] [--batch 64 256] [--turns 5]
                                       [--decode dynamic static compiled] [--device cpu|cuda] [--repeats 2]

For each batch size and ``actor_rollout_ref.rollout.decode`` mode: one rollout of ``batch`` episodes (groups of 8)
of up to ``--turns`` turns, with the prefix cache (the default), timed after one untimed warm-up rollout (which
also compiles, for ``compiled``); the median of ``--repeats``. It prints sampled tokens per second, the time per
decode step, and, on a GPU, the bound a decode step cannot beat: every step reads all weights once, and each row
its keys/values, so ``steps/s <= bandwidth / (weight bytes + rows x cached tokens x kv bytes per token)``; tokens/s
is that times the rows still sampling. ``--bandwidth`` (GB/s) sets it; by default the card's is looked up
(H100 SXM 3,350, H200 4,800). The samples of every mode are checked equal to ``dynamic``'s (same seed).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ragen_turn.compose import compose_config
from ragen_turn.engines.local.sampler import LocalSampler
from ragen_turn.engines.local.trainer import build_trainer
from ragen_turn.models.kv_cache import DECODES
from ragen_turn.rollout import ChatFormatter, context_config, run_episodes
from ragen_turn.runtime import quiet_transformers

CARDS_GBS = {"H100": 3350.0, "H200": 4800.0, "A100": 2039.0}  # HBM bandwidth, GB/s (the makers' figures)


def bandwidth_of(device: str, given: float | None) -> float | None:
    if given:
        return given
    if not str(device).startswith("cuda"):
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in CARDS_GBS.items() if k in name), None)


def sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def rollout(tr, decode: str, steps_seen: list):
    sampler = LocalSampler(tr.actor, tr.tokenizer, temperature=1.0, device=tr.device, decode=decode,
                           generator=torch.Generator().manual_seed(0), prefix_cache=True)
    sample = sampler._sample

    def counted(logits):  # one call per decode step (the prefill's included): the rows sampled then
        steps_seen.append(logits.shape[0])
        return sample(logits)

    sampler._sample = counted
    sync(tr.device)
    t = time.perf_counter()
    eps = run_episodes(tr.train_envs.assign_seeds(0, 0), sampler, ChatFormatter(tr.tokenizer), context_config(tr.cfg))
    sync(tr.device)
    return eps, time.perf_counter() - t


def bound(tr, eps, bandwidth_gbs: float) -> float:
    """Sampled tokens/s a decode step could reach at ``bandwidth_gbs``, for these episodes' mean context."""
    c = tr.actor.config
    p_bytes = sum(p.numel() * p.element_size() for p in tr.actor.parameters())
    elt = next(tr.actor.parameters()).element_size()
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * elt
    rows = len(eps)
    mean_ctx = statistics.mean(len(e.token_ids) for e in eps) / 2  # a decode step sees half the final context
    step_bytes = p_bytes + rows * mean_ctx * kv_per_token
    return bandwidth_gbs * 1e9 / step_bytes * rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--decode", nargs="+", default=list(DECODES), choices=DECODES)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--bandwidth", type=float, default=None, help="GB/s for the bound (default: the card's)")
    ap.add_argument("--set", action="append", default=[], help="more Hydra overrides")
    a = ap.parse_args()
    quiet_transformers()
    bw = bandwidth_of(a.device, a.bandwidth)
    where = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(f"[bench_sampler] {a.model} on {where}, torch {torch.__version__}, {a.turns} turns, prefix cache on")
    for batch in a.batch:
        over = [f"device={a.device}", "model.warmstart.enable=false", f"agent_proxy.max_turn={a.turns}",
                f"es_manager.train.env_groups={batch // 8}", "es_manager.train.group_size=8",
                f"ppo_mini_batch_size={min(batch, 64)}",  # the config must hold; no update runs here
                "trainer.default_local_dir=/tmp/ragen_turn_bench_sampler", "trainer.overwrite=true", *a.set]
        if a.model != "tiny":
            over.append(f"model={a.model}")
        tr = build_trainer(compose_config(over), log=lambda *_: None)
        tr.actor.eval()
        base, base_tps = None, None
        for decode in a.decode:
            with torch.no_grad():
                rollout(tr, decode, [])  # warm-up (allocator, kernels; torch.compile for compiled)
                runs = []
                for _ in range(a.repeats):
                    steps: list = []
                    eps, dt = rollout(tr, decode, steps)
                    runs.append((dt, eps, steps))
            dt, eps, steps = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
            tokens = sum(sum(e.response_mask) for e in eps)
            tps = tokens / dt
            same = "" if base is None else f"   samples == dynamic's: {[e.token_ids for e in eps] == base}"
            if decode == "dynamic":
                base, base_tps = [e.token_ids for e in eps], tps
            ratio = f" ({tps / base_tps:.2f}x dynamic)" if base_tps and decode != "dynamic" else ""
            line = (f"batch {batch:4d} {decode:9s}: {tokens:7d} tokens in {dt:6.2f} s = {tps:9.0f} tok/s{ratio}, "
                    f"{len(steps)} sampling steps, {dt / max(len(steps), 1) * 1e3:6.2f} ms a step")
            if bw:
                b = bound(tr, eps, bw)
                line += f"; bound at {bw:.0f} GB/s {b:.0f} tok/s ({tps / b:.1%} of it)"
            print(line + same, flush=True)


if __name__ == "__main__":
    main()
