"""Where a Sokoban policy fails: success by each room's optimal solution length, and how many failed episodes end
in a deadlock (the solver finds no solution from the episode's last state: a box that can no longer reach a target).

    python benchmarks/sokoban_failures.py <run dir | checkpoint | model dir> [overrides, e.g. es_manager.val.seeds=dev]

The policy plays every val room once, as ``eval.sh`` does (a run's own settings plus the overrides, at
``actor_rollout_ref.rollout.val_temperature``), so its success equals the run's evaluation at that checkpoint. Each room
is then built again from its seed and solved. Prints ``L:solved/rooms`` per optimal length L and the deadlocked share of
the failures per length. Slow part: the evaluation (about 30 s for 256 rooms of the tiny model on one thread).
"""
from __future__ import annotations

import sys
from collections import Counter

from omegaconf import OmegaConf


def main(argv: list[str]) -> None:
    from ragen_turn.evaluate import config_for_eval, evaluate_checkpoint
    from ragen_turn.train import compose_config, quiet_transformers

    if not argv:
        sys.exit(__doc__)
    quiet_transformers()
    quoted = argv[0].replace("\\", "\\\\").replace("'", "\\'")  # run names hold '=' and ',' (as eval.sh quotes)
    overrides = [f"+checkpoint='{quoted}'"] + argv[1:]
    cfg = config_for_eval(compose_config(["env=sokoban", "algo=turn_ppo"] + overrides), overrides)
    OmegaConf.resolve(cfg)
    played = []
    m = evaluate_checkpoint(cfg, on_envs=played.append)
    rooms, solved, failed, dead = Counter(), Counter(), Counter(), Counter()
    for slot in played[0].slots:
        fresh = type(slot.env)(slot.env.config)
        fresh.reset(seed=slot.seed)
        length = len(fresh.solve())
        rooms[length] += 1
        if slot.env.success:
            solved[length] += 1
        else:
            failed[length] += 1
            dead[length] += slot.env.solve() is None
    print(f"success {m['val/success']:.3f} over {sum(rooms.values())} rooms ({m['checkpoint']})")
    print("solved by optimal length:  " + " ".join(f"{k}:{solved[k]}/{rooms[k]}" for k in sorted(rooms)))
    print("deadlocked failures:       " + " ".join(f"{k}:{dead[k]}/{failed[k]}" for k in sorted(failed))
          + f"  all: {sum(dead.values())}/{sum(failed.values())}")


if __name__ == "__main__":
    main(sys.argv[1:])
