#!/usr/bin/env python
"""Search-QA env speed: corpus load, BM25 index build, index load from the disk cache, search latency (p50 / p99)
and env steps per second, at the shipped corpus size and on larger synthetic corpora.

The larger corpora are written by scripts/make_search_qa_data.py (more worlds of the same generator, 20 passages
each, as an uncompressed Search-R1 JSONL in a temporary folder) and read by the env's own loader. Queries are
entity names (what the expert searches) and whole questions (what a model often searches), half each.

    python benchmarks/bench_search_qa.py                        # shipped (3000 passages) and 1M passages
    python benchmarks/bench_search_qa.py --sizes 100000 --queries 500
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import runpy
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pct(xs, q) -> float:
    return float(np.percentile(np.asarray(xs), q))


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # peak, KiB on Linux


def _corpus_file(n: int, tmp: str, gen) -> tuple:
    """(path, seconds to generate) of a corpus of about ``n`` passages (0 = the shipped one)."""
    from ragen_turn.envs.search_qa import SHIPPED_DATA_DIR

    if n == 0:
        return os.path.join(SHIPPED_DATA_DIR, "corpus.jsonl.gz"), 0.0
    out = os.path.join(tmp, f"kb{n}")
    t0 = time.perf_counter()
    # seed 0: the first 150 worlds are the shipped ones (same text), so the shipped questions have their passages
    corpus, _ = gen["generate"](countries=max(1, n // 20), seed=gen["DEFAULT_SEED"], with_questions=False)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "corpus.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for r in corpus:
            f.write(json.dumps(r) + "\n")
    del corpus
    return path, time.perf_counter() - t0


def bench(n: int, n_queries: int, tmp: str, gen, topk: int) -> dict:
    from ragen_turn.envs.search_qa import Corpus, SearchQAEnv, clear_data_cache, clear_retriever_cache
    from ragen_turn.envs.search_qa.retrieval import BM25Retriever

    path, t_gen = _corpus_file(n, tmp, gen)
    cache = os.path.join(tmp, "cache")
    t0 = time.perf_counter()
    corpus = Corpus(path)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = BM25Retriever(corpus, cache_dir=cache)
    t_index = time.perf_counter() - t0
    rss_build = _rss_gib()
    t0 = time.perf_counter()
    r2 = BM25Retriever(corpus, cache_dir=cache)
    t_cached = time.perf_counter() - t0
    assert r2.loaded_from_cache

    rng = random.Random(0)
    rows = [rng.randrange(len(corpus)) for _ in range(n_queries)]
    queries = []
    for i, row in enumerate(rows):
        p = corpus.passage(row)
        queries.append(p.title if i % 2 == 0 else f"In what year was {p.title} founded?")
    for q in queries[:20]:
        r.search(q, topk)
    lat = []
    for q in queries:
        t = time.perf_counter()
        r.search(q, topk)
        lat.append((time.perf_counter() - t) * 1e3)
    lat_mmap = []
    for q in queries:
        t = time.perf_counter()
        r2.search(q, topk)
        lat_mmap.append((time.perf_counter() - t) * 1e3)

    # env steps: whole expert episodes (searches + answer) on the shipped questions over this corpus
    clear_retriever_cache()
    clear_data_cache()
    env = SearchQAEnv(corpus_path=path, split="val", cache_dir=cache, topk=topk)
    steps, eps, em = 0, 0, 0.0
    t_all = time.perf_counter()
    while time.perf_counter() - t_all < 3.0:
        env.reset(seed=eps)
        done = False
        while not done:
            _, _, done, info = env.step(env.solve()[0])
            steps += 1
        eps += 1
        em += info["em"]
    ep_steps_per_s = steps / (time.perf_counter() - t_all)
    t_all, n_bad = time.perf_counter(), 0
    env.reset(seed=0)
    while n_bad < 20000:
        env.step("no tags here")  # invalid turns: parsing only
        n_bad += 1
        if env.done:
            env.reset(seed=n_bad)
    bad_steps_per_s = n_bad / (time.perf_counter() - t_all)
    return dict(n=len(corpus), mib=os.path.getsize(path) / 2 ** 20, t_gen=t_gen, t_load=t_load, t_index=t_index,
                t_cached=t_cached, rss=rss_build, p50=_pct(lat, 50), p99=_pct(lat, 99), p50_mmap=_pct(lat_mmap, 50),
                p99_mmap=_pct(lat_mmap, 99), ep_steps_per_s=ep_steps_per_s, bad_steps_per_s=bad_steps_per_s,
                expert_em=em / eps, episodes=eps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[0, 1_000_000],
                    help="passages (0 = the shipped corpus); others are generated")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--topk", type=int, default=3)
    args = ap.parse_args(argv)
    gen = runpy.run_path(os.path.join(REPO, "scripts", "make_search_qa_data.py"))  # its functions, by name
    with tempfile.TemporaryDirectory(prefix="bench_search_qa_") as tmp:
        for n in args.sizes:
            r = bench(n, args.queries, tmp, gen, args.topk)
            print(f"[{r['n']:>9,} passages, {r['mib']:.1f} MiB{' (shipped, gzip)' if n == 0 else ''}] "
                  f"generate {r['t_gen']:.1f}s  load {r['t_load']:.2f}s  index build {r['t_index']:.2f}s  "
                  f"index load (cached, mmap) {r['t_cached'] * 1e3:.0f} ms  peak RSS so far {r['rss']:.2f} GiB",
                  flush=True)
            print(f"    search (top {args.topk}, {args.queries} queries): p50 {r['p50']:.3f} ms  p99 {r['p99']:.3f} ms"
                  f"   [mmap index: p50 {r['p50_mmap']:.3f} ms  p99 {r['p99_mmap']:.3f} ms]", flush=True)
            print(f"    env: expert episodes {r['ep_steps_per_s']:,.0f} steps/s (searches and answers; expert EM "
                  f"{r['expert_em']:.3f} over {r['episodes']} episodes on the val questions);  invalid responses "
                  f"{r['bad_steps_per_s']:,.0f} steps/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
