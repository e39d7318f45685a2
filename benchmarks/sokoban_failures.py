"""Where a Sokoban policy fails: success by each room's optimal solution length, how many failed episodes end in a
deadlock (the solver finds no solution from the episode's last state: a box that can no longer reach a target), and,
with ``--samples K``, how many rooms the policy solves in at least one of K tries (pass@k).

    python benchmarks/sokoban_failures.py <run dir | checkpoint | model dir> [--samples K] [overrides]

The policy plays every val room once, as ``eval.sh`` does (a run's own settings plus the overrides, e.g.
``es_manager.val.seeds=dev``, at
``actor_rollout_ref.rollout.val_temperature``), so its success equals the run's evaluation at that checkpoint. With
``--samples K`` it plays each room K times (``es_manager.val.group_size=K``) and prints pass@1 ... pass@K with the
unbiased estimator of Chen et al. 2021 (``1 - C(n - c, k) / C(n, k)`` for c successes in n tries, averaged over rooms):
pass@k of a warm start bounds what RL can reach by making the policy pick, every time, what it already finds in k
tries. Each room is then built again from its seed and solved. Prints ``L:solved/rooms`` per optimal length L and the
deadlocked share of the failures per length (with K > 1, counted over all tries). Slow part: the evaluation (about
30 s for 256 rooms of the tiny model on one thread; K times that with ``--samples K``).
"""
from __future__ import annotations

import math
import sys
from collections import Counter, defaultdict

from omegaconf import OmegaConf


def pass_at_k(tries: list[int], solved: list[int], k: int) -> float:
    """Mean over rooms of the chance that k of a room's n tries, drawn without replacement, hold a success."""
    return sum(1.0 - math.comb(n - c, k) / math.comb(n, k) for n, c in zip(tries, solved)) / len(tries)


def main(argv: list[str]) -> None:
    from ragen_turn.evaluate import config_for_eval, evaluate_checkpoint
    from ragen_turn.compose import compose_config
    from ragen_turn.runtime import quiet_transformers

    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    samples = 1
    if "--samples" in argv:
        i = argv.index("--samples")
        try:
            samples = int(argv[i + 1])
        except (IndexError, ValueError):
            sys.exit("--samples needs a whole number of tries per room")
        if samples < 1:
            sys.exit("--samples must be >= 1")
        argv = argv[:i] + argv[i + 2:]
    quiet_transformers()
    quoted = argv[0].replace("\\", "\\\\").replace("'", "\\'")  # run names hold '=' and ',' (as eval.sh quotes)
    overrides = ([f"+checkpoint='{quoted}'"] + argv[1:]
                 + ([f"es_manager.val.group_size={samples}"] if samples > 1 else []))
    cfg = config_for_eval(compose_config(["env=sokoban", "algo=turn_ppo"] + overrides), overrides)
    OmegaConf.resolve(cfg)
    played = []
    m = evaluate_checkpoint(cfg, on_envs=played.append)
    by_room = defaultdict(list)
    for slot in played[0].slots:
        by_room[slot.seed].append(slot.env)
    rooms, solved, failed, dead = Counter(), Counter(), Counter(), Counter()
    for seed, envs in by_room.items():
        fresh = type(envs[0])(envs[0].config)
        fresh.reset(seed=seed)
        length = len(fresh.solve())
        rooms[length] += 1
        solved[length] += any(env.success for env in envs)
        for env in envs:
            if not env.success:
                failed[length] += 1
                dead[length] += env.solve() is None
    tries = [len(envs) for envs in by_room.values()]
    print(f"success {m['val/success']:.3f} over {sum(tries)} episodes of {len(by_room)} rooms ({m['checkpoint']})")
    if samples > 1:
        wins = [sum(env.success for env in envs) for envs in by_room.values()]
        ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64, samples) if k <= samples})
        print("pass@k:                    " + " ".join(f"{k}:{pass_at_k(tries, wins, k):.3f}" for k in ks))
    label = "solved by optimal length: " if samples == 1 else f"solved in {samples} tries:   "
    print(label + " " + " ".join(f"{k}:{solved[k]}/{rooms[k]}" for k in sorted(rooms)))
    print("deadlocked failures:       " + " ".join(f"{k}:{dead[k]}/{failed[k]}" for k in sorted(failed))
          + f"  all: {sum(dead.values())}/{sum(failed.values())}")


if __name__ == "__main__":
    main(sys.argv[1:])
