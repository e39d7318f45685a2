#!/usr/bin/env python
"""Write the synthetic knowledge base and questions shipped with the search-QA env (nothing is downloaded).

The worlds, passages and questions come from ``ragen_turn.envs.search_qa.kb`` (see its docstring). Files, in
Search-R1's formats (gzip with a fixed header, so the bytes depend only on the content):

* ``corpus.jsonl.gz``: ``{"id", "contents": "<title>\\n<text>", "split"}`` (``split`` is informational)
* ``{train,val,test}.jsonl.gz``: ``{"id", "question", "golden_answers": [...], "hops", "queries", "support"}``

    python scripts/make_search_qa_data.py                        # the shipped data (150 countries, seed 0)
    python scripts/make_search_qa_data.py --countries 50000 --out /tmp/kb_1m --corpus-only --plain   # 1M passages
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import os
from typing import Iterator

from ragen_turn.envs.search_qa.kb import DEFAULT_COUNTRIES, DEFAULT_SEED, generate

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "envs", "search_qa", "data")


def _write_jsonl_gz(path: str, records: Iterator[dict]) -> None:
    """gzip with a fixed header (mtime 0, no file name), so the bytes depend only on the records."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8", newline="\n") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n")
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--countries", type=int, default=DEFAULT_COUNTRIES, help="worlds (20 passages each)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--corpus-only", action="store_true", help="write corpus.jsonl.gz only (benchmarks)")
    ap.add_argument("--plain", action="store_true", help="write corpus.jsonl (uncompressed) instead of .gz")
    args = ap.parse_args()
    corpus, questions = generate(args.countries, args.seed, with_questions=not args.corpus_only)
    os.makedirs(args.out, exist_ok=True)
    if args.plain:
        with open(os.path.join(args.out, "corpus.jsonl"), "w", encoding="utf-8") as f:
            for r in corpus:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    else:
        _write_jsonl_gz(os.path.join(args.out, "corpus.jsonl.gz"), iter(corpus))
    counts = []
    if not args.corpus_only:
        for split, qs in questions.items():
            _write_jsonl_gz(os.path.join(args.out, f"{split}.jsonl.gz"), iter(qs))
            counts.append(f"{split} {len(qs)} ({sum(q['hops'] == 2 for q in qs)} two-hop)")
    print(f"wrote {len(corpus)} passages" + (", questions: " + ", ".join(counts) if counts else "") + f" to {args.out}")


if __name__ == "__main__":
    main()
