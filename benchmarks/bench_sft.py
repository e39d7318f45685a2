"""Warm-start SFT step time: float32 vs ``model.warmstart.autocast=bfloat16``, for a few tiny-model sizes.

    python benchmarks/bench_sft.py [--steps 20] [--threads 2] [--sizes 128x2 256x2] [--set KEY=VALUE ...]

For each size (hidden x layers; intermediate = 4 x hidden) it builds the tiny model, collects one batch of Sokoban
solver demonstrations (the default warm start's format) and times ``ragen_turn.warmstart.sft`` for ``--steps`` steps
in float32 and under bf16 autocast, from the same initial weights. It prints seconds per step, the ratio
(autocast / float32) and the NLL each reached, so a speed-up that costs accuracy shows. Autocast pays off only
where the CPU has bf16 matmul support (AVX512-BF16 or AMX); elsewhere the ratio can exceed 1.
"""
from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
from omegaconf import open_dict

from ragen_turn.config import model_config
from ragen_turn.models import load_model_and_tokenizer
from ragen_turn.compose import compose_config
from ragen_turn.runtime import quiet_transformers
from ragen_turn.warmstart import collect_demonstrations, sft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--episodes", type=int, default=256, help="demonstrations to draw batches from")
    ap.add_argument("--sizes", nargs="+", default=["128x2", "256x2"], help="HIDDENxLAYERS")
    ap.add_argument("--set", action="append", default=[], help="extra Hydra override (repeatable)")
    args = ap.parse_args()
    quiet_transformers()
    torch.set_num_threads(args.threads)
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    flags = [f for f in ("avx512_bf16", "amx_bf16") if f in cpuinfo]
    print(f"torch {torch.__version__}, {args.threads} threads, cpu bf16 flags: {' '.join(flags) or 'none'}")
    print(f"{'size':>8} {'params':>8} {'fp32 s/step':>12} {'bf16 s/step':>12} {'ratio':>6} "
          f"{'fp32 nll':>9} {'bf16 nll':>9}")
    for size in args.sizes:
        hidden, layers = (int(x) for x in size.split("x"))
        cfg = compose_config(["env=sokoban", "model.copy_pretrain_steps=0", f"model.hidden_size={hidden}",
                              f"model.intermediate_size={4 * hidden}", f"model.num_hidden_layers={layers}",
                              f"model.warmstart.steps={args.steps}"] + args.set)
        model, tok = load_model_and_tokenizer(model_config(cfg), device="cpu", dtype="float32")
        tok.padding_side = "left"
        demos = collect_demonstrations(cfg, tok, args.episodes, seed=0)
        row = {}
        for mode in (None, "bfloat16"):
            run_cfg = copy.deepcopy(cfg)
            with open_dict(run_cfg):
                run_cfg.model.warmstart.autocast = mode
            m = copy.deepcopy(model)
            stats = sft(m, demos, run_cfg, torch.device("cpu"), log=lambda line: None)
            row[mode] = (stats["sft/seconds"] / args.steps, stats["sft/final_nll"])
        n = sum(p.numel() for p in model.parameters())
        (f32, nll32), (b16, nll16) = row[None], row["bfloat16"]
        print(f"{size:>8} {n / 1e6:>7.2f}M {f32:>12.3f} {b16:>12.3f} {b16 / f32:>6.2f} {nll32:>9.3f} {nll16:>9.3f}")


if __name__ == "__main__":
    main()
