#!/usr/bin/env python
"""WebShop env speed: BM25 index build time, search latency (p50 / p99) and env steps per second.

Catalogs of 1k and 100k products are generated with scripts/make_webshop_catalog.py into a temporary
folder (written in WebShop's JSON format and read back by the env's own loader). Targets: p50 search
< 5 ms at 100k products; a non-search env step < 1 ms.

    python benchmarks/bench_webshop.py [--sizes 1000 100000] [--queries 300]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_generator():
    path = os.path.join(REPO, "scripts", "make_webshop_catalog.py")
    spec = importlib.util.spec_from_file_location("make_webshop_catalog", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def bench_size(n: int, n_queries: int, tmp: str, gen) -> dict:
    from ragen_turn.envs.webshop import WebShopEnv, catalog as C, search as S

    data_dir = os.path.join(tmp, f"ws{n}")
    t0 = time.perf_counter()
    gen.write_catalog(data_dir, num_products=n, seed=1)
    t_gen = time.perf_counter() - t0
    size_mb = sum(os.path.getsize(os.path.join(data_dir, f)) for f in os.listdir(data_dir)) / 2 ** 20

    t0 = time.perf_counter()
    cat = C.load_catalog(data_dir)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    eng = S.BM25SearchEngine(cat, cache_dir=os.path.join(tmp, "cache"))
    t_index = time.perf_counter() - t0
    t0 = time.perf_counter()
    eng2 = S.BM25SearchEngine(cat, cache_dir=os.path.join(tmp, "cache"))
    t_index_cached = time.perf_counter() - t0
    assert eng2.loaded_from_cache

    rng = random.Random(0)
    goals = cat.goals
    queries = []
    for i in range(n_queries):
        g = goals[rng.randrange(len(goals))]
        queries.append([g["query"], g["instruction_text"], cat.product(rng.randrange(len(cat))).name][i % 3].lower())
    for q in queries[:20]:  # warm-up
        eng.search(q)
    lat = []
    for q in queries:
        t = time.perf_counter()
        eng.search(q, k=50)
        lat.append((time.perf_counter() - t) * 1e3)
    lat_cached = []
    for q in queries:
        t = time.perf_counter()
        eng2.search(q, k=50)
        lat_cached.append((time.perf_counter() - t) * 1e3)

    # env steps: a fixed non-search episode pattern on the item page, and whole episodes with searches
    env = WebShopEnv({"data_dir": data_dir, "cache_dir": os.path.join(tmp, "cache"), "max_turns": 10 ** 6})
    env.reset(seed=0)
    env.step(f"search[{env.goal['query']}]")
    item = [a for a in env.get_available_actions() if a.startswith("click[b0")][0]
    env.step(item)
    opts = [a for a in env.get_available_actions() if a not in (
        "click[back to search]", "click[< prev]", "click[description]", "click[features]", "click[reviews]",
        "click[buy now]")]
    cycle = ["click[description]", "click[< prev]", "click[features]", "click[< prev]"] + opts[:2] + [
        "click[< prev]", item, "click[not-a-label]"]
    n_steps = 0
    step_times = []
    t_all = time.perf_counter()
    while n_steps < 5000:
        for a in cycle:
            t = time.perf_counter()
            env.step(a)
            step_times.append((time.perf_counter() - t) * 1e3)
            n_steps += 1
    steps_per_s = n_steps / (time.perf_counter() - t_all)

    n_ep, ep_steps = 0, 0
    t_all = time.perf_counter()
    while time.perf_counter() - t_all < 2.0:
        env.reset(seed=n_ep)
        g = env.goal
        env.step(f"search[{g['query']}]")
        clicks = [a for a in env.get_available_actions() if a.startswith("click[b0")]
        env.step(clicks[0] if clicks else "click[back to search]")
        env.step("click[buy now]")
        n_ep += 1
        ep_steps += 3
    ep_steps_per_s = ep_steps / (time.perf_counter() - t_all)
    return dict(n=len(cat), goals=len(goals), size_mb=size_mb, t_gen=t_gen, t_load=t_load, t_index=t_index,
                t_index_cached=t_index_cached, p50=_pct(lat, 50), p99=_pct(lat, 99), p50_mmap=_pct(lat_cached, 50),
                p99_mmap=_pct(lat_cached, 99), step_p50=_pct(step_times, 50), step_p99=_pct(step_times, 99),
                steps_per_s=steps_per_s, episode_steps_per_s=ep_steps_per_s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 100000])
    ap.add_argument("--queries", type=int, default=300)
    args = ap.parse_args(argv)
    gen = _load_generator()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_webshop_") as tmp:
        for n in args.sizes:
            r = bench_size(n, args.queries, tmp, gen)
            rows.append(r)
            print(f"[{r['n']:>6} products, {r['goals']} goals, {r['size_mb']:.1f} MiB JSON] "
                  f"generate {r['t_gen']:.2f}s  "
                  f"load {r['t_load']:.2f}s  index build {r['t_index']:.2f}s  index load (cached, mmap) "
                  f"{r['t_index_cached'] * 1e3:.0f} ms", flush=True)
            print(f"    search (top 50): p50 {r['p50']:.3f} ms  p99 {r['p99']:.3f} ms   "
                  f"[mmap index: p50 {r['p50_mmap']:.3f} ms  p99 {r['p99_mmap']:.3f} ms]", flush=True)
            print(f"    env step (non-search): p50 {r['step_p50'] * 1e3:.1f} us  p99 {r['step_p99'] * 1e3:.1f} us  "
                  f"{r['steps_per_s']:,.0f} steps/s;  episodes with search: {r['episode_steps_per_s']:,.0f} steps/s",
                  flush=True)
    ok = True
    big = [r for r in rows if r["n"] >= 100000]
    if big:
        passed = big[0]["p50"] < 5.0
        ok &= passed
        print(f"target p50 search < 5 ms at 100k: {big[0]['p50']:.3f} ms -> {'PASS' if passed else 'FAIL'}")
    worst_step = max(r["step_p50"] for r in rows)
    passed = worst_step < 1.0
    ok &= passed
    print(f"target non-search env step < 1 ms: p50 {worst_step * 1e3:.1f} us -> {'PASS' if passed else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
