"""Advantage + policy loss + backward: token-PPO path vs Turn-PPO path on one batch (CPU).

    python benchmarks/bench_algos.py [--batch 256 --tokens 4096 --turns 10 --repeats 5]

Token path: token GAE over response tokens + ``token_ppo``. Turn path: V(s_h) gather + turn GAE +
scatter to tokens + ``turn_ppo``. Both take the same log-probs (a leaf tensor, so backward costs
only the loss's own graph). Prints the median time of each and the ratio turn / token
(target <= 1.10).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ragen_turn.algos import (
    compute_token_gae,
    compute_turn_gae,
    masked_whiten,
    place_turn_rewards,
    policy_loss,
    scatter_turns,
    turn_ids_from_mask,
    turn_start_values,
)


def make_batch(B: int, T: int, H: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T)
    seg = T // (H + 1)  # per turn: an env/prompt segment then a response segment
    for h in range(H):
        start = seg * (h + 1) - seg // 2
        mask[:, start:start + seg // 2] = 1
    old = -torch.rand(B, T, generator=g) * 2
    logp = (old + 0.05 * torch.randn(B, T, generator=g)).requires_grad_(True)
    values = torch.randn(B, T, generator=g)
    turn_rewards = torch.randn(B, H, generator=g)
    return mask, old, logp, values, turn_rewards


def token_path(mask, old, logp, values, turn_rewards):
    tid = turn_ids_from_mask(mask)
    adv, _ = compute_token_gae(place_turn_rewards(turn_rewards, tid), values * mask, mask, 1.0, 1.0)
    adv = masked_whiten(adv, mask)
    loss, _ = policy_loss("token_ppo", logp, old, adv, mask, turn_ids=tid)
    loss.backward()


def turn_path(mask, old, logp, values, turn_rewards):
    tid = turn_ids_from_mask(mask)
    H = turn_rewards.shape[1]
    tmask = torch.ones_like(turn_rewards)
    adv, _ = compute_turn_gae(turn_rewards, turn_start_values(values, tid, H), tmask, 0.99, 0.9)
    adv = scatter_turns(masked_whiten(adv, tmask), tid)
    loss, _ = policy_loss("turn_ppo", logp, old, adv, mask, turn_ids=tid)
    loss.backward()


def timeit(fn, args, repeats: int) -> float:
    fn(*args)  # warm up
    times = []
    for _ in range(repeats):
        args[2].grad = None
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    args = make_batch(a.batch, a.tokens, a.turns)
    n_resp = int(args[0].sum())
    print(f"batch {a.batch} x {a.tokens} tokens, {a.turns} turns per row, {n_resp} response tokens, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    # interleave the two paths so both see the same machine load
    tok, turn = [], []
    for _ in range(a.repeats):
        tok.append(timeit(token_path, args, 1))
        turn.append(timeit(turn_path, args, 1))
    t_tok, t_turn = statistics.median(tok), statistics.median(turn)
    print(f"token path (token GAE + token_ppo + backward): {t_tok * 1e3:8.1f} ms")
    print(f"turn path  (turn GAE + turn_ppo + backward):   {t_turn * 1e3:8.1f} ms")
    ratio = t_turn / t_tok
    print(f"ratio turn / token: {ratio:.3f}  (target <= 1.10: {'MET' if ratio <= 1.10 else 'NOT MET'})")


if __name__ == "__main__":
    main()
