"""What the trajectory trace costs (``trainer.trace_episodes``, docs/usage.md "Seeing the credit").

``cost RUN_DIR``: the local tracer's own time (its ``begin``, ``observe`` and ``write``) against the training
steps' time, on the sokoban default with 4 env groups, 2 steps (results/inspector/'s setting).
``page TRACE``: 60-step traces made from the last line of a real ``trace.jsonl`` (as it is, and a worst case: every
episode with ``agent_proxy.max_turn`` = 5 turns of ``response_length`` = 64 tokens, every per-token field, a
600-character observation): bytes per step, trace and page sizes, the page's build time.

    python benchmarks/bench_trace.py cost /tmp/trace_cost_run
    python benchmarks/bench_trace.py page results/inspector/runs/sokoban_token_ppo/trace.jsonl
"""
from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from pathlib import Path


def cost(run_dir: str) -> None:
    from ragen_turn.compose import compose_config
    from ragen_turn.engines import trace
    from ragen_turn.engines.local.trainer import StarPOTrainer

    spent = {"begin": 0.0, "observe": 0.0, "write": 0.0}
    for name in spent:
        def timed(self, *a, _f=getattr(trace.EpisodeTracer, name), _n=name, **k):
            t = time.perf_counter()
            out = _f(self, *a, **k)
            spent[_n] += time.perf_counter() - t
            return out
        setattr(trace.EpisodeTracer, name, timed)
    cfg = compose_config(["env=sokoban", "algo=turn_ppo", "trainer.total_training_steps=2",
                          "es_manager.train.env_groups=4", "ppo_mini_batch_size=16", "es_manager.val.env_groups=8",
                          "trainer.val_before_train=false", f"trainer.default_local_dir={run_dir}"])
    StarPOTrainer(cfg, log=lambda *a: None).fit()
    steps = [json.loads(x) for x in open(Path(run_dir) / "metrics.jsonl")]
    total = sum(s["perf/step_s"] for s in steps if "perf/step_s" in s)
    print(f"tracer {sum(spent.values()):.3f} s ({ {k: round(v, 3) for k, v in spent.items()} }) of {total:.1f} s of "
          f"steps: {100 * sum(spent.values()) / total:.2f}%")


def worst(line: dict, turns: int = 5, tokens: int = 64) -> dict:
    line = copy.deepcopy(line)
    for e in line["episodes"]:
        t0 = e["turns"][0]
        e["turns"] = []
        for h in range(turns):
            t = dict(copy.deepcopy(t0), h=h, n_tokens=tokens, tokens=["tok_"] * tokens, obs="x" * 600)
            t.update({k: [0.0012345] * tokens for k in ("tok_log_ratio", "tok_adv", "tok_value", "tok_return")})
            e["turns"].append(t)
    return line


def page(trace_path: str) -> None:
    from ragen_turn.inspect import build_page

    real = json.loads(Path(trace_path).read_text().splitlines()[-1])
    for name, line in (("as traced", real), ("worst case", worst(real))):
        d = Path(tempfile.mkdtemp(prefix="bench_trace_"))
        with open(d / "trace.jsonl", "w") as f:
            for s in range(1, 61):
                f.write(json.dumps(dict(line, step=s), separators=(",", ":")) + "\n")
        t = time.time()
        p = build_page(d, out=d / "inspect.html")
        print(f"{name}: {len(json.dumps(line, separators=(',', ':'))) / 1e3:.1f} kB per step; 60 steps: trace "
              f"{(d / 'trace.jsonl').stat().st_size / 1e6:.2f} MB, page {p.stat().st_size / 1e6:.2f} MB built in "
              f"{time.time() - t:.2f} s ({p})")


if __name__ == "__main__":
    {"cost": cost, "page": page}[sys.argv[1]](sys.argv[2])
