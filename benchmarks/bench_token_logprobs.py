"""verl's log-probs of the sampled tokens without flash-attn: its row-by-row loop against ours by chunks.

    .venv-verl/bin/python benchmarks/bench_token_logprobs.py [--device cpu|cuda] [--tokens 7040] [--vocab 1024 49152]

verl's FSDP engine hands ``logprobs_from_logits`` every token of a micro-batch as one row of ``logits [N, V]`` (16
episodes: 5,598 tokens in the CI-size Sokoban run; 7,040, the default here). Without flash-attn verl loops over the
rows in Python; ``ragen_turn/engines/verl/token_logprobs.py`` computes the same values in chunks. For each vocabulary
size this prints microseconds per token of each, forward (old log-probs) and forward + backward (the update), their
ratio, and the largest difference of the values and of the gradients (0 on CPU for the tiny vocabulary; float rounding
where a chunk's rows reduce in another order than single rows).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def timed(fn, sync, repeats: int) -> float:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def one_pass(f, x: torch.Tensor, y: torch.Tensor, label: str):
    """The old log-probs' pass (no graph) or the update's (forward and backward to the logits)."""
    if label == "forward":
        def run():
            with torch.no_grad():
                f(x, y)
    else:
        def run():
            torch.autograd.grad(f(x, y).sum(), x)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=7040)
    ap.add_argument("--vocab", type=int, nargs="+", default=[1024, 49152])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from ragen_turn.engines.verl import token_logprobs  # puts ours in verl's place; verl's is kept

    verl_rows, ours = token_logprobs._VERL_V2, token_logprobs.logprobs_by_chunks
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"device {name}, torch {torch.__version__}, {args.tokens} tokens a micro-batch, float32")
    print(f"{'vocab':>6} {'pass':>9} {'verl us/tok':>12} {'ours us/tok':>12} {'ratio':>7}  max |diff| values, grads")
    g = torch.Generator(device=dev).manual_seed(0)
    for V in args.vocab:
        x = torch.randn(args.tokens, V, device=dev, generator=g).requires_grad_(True)
        y = torch.randint(0, V, (args.tokens,), device=dev, generator=g)
        vals = [f(x, y) for f in (verl_rows, ours)]
        grads = [torch.autograd.grad(v.sum(), x)[0] for v in vals]
        diff = f"{(vals[0] - vals[1]).abs().max().item():.1e}, {(grads[0] - grads[1]).abs().max().item():.1e}"
        for label in ("forward", "fwd+bwd"):
            t_verl, t_ours = (timed(one_pass(f, x, y, label), sync, args.repeats) for f in (verl_rows, ours))
            n = args.tokens
            print(f"{V:>6} {label:>9} {t_verl / n * 1e6:>12.2f} {t_ours / n * 1e6:>12.2f} "
                  f"{t_verl / t_ours:>6.1f}x  {diff}")


if __name__ == "__main__":
    main()
