"""Retrievers: ``search(query, k) -> [passage row, ...]`` over a :class:`~.data.Corpus`, behind a registry.

``bm25`` (the default) scores passages with BM25 through ``bm25s``: Lucene's variant with pyserini's defaults
(k1 = 0.9, b = 0.4), as Search-R1's BM25 server (pyserini) does. The indexed text of a passage is its title and
text; ``bm25s``' tokenizer lower-cases, keeps words of two or more letters/digits and drops English stop words
(pyserini's analyser also stems; this one does not). Passages with score 0 are not returned; ties go to the
lower row. The index is built once per corpus and saved under ``cache_dir`` (memory-mapped when loaded back),
keyed by the corpus file's path, size and mtime and the BM25 parameters.

Another retriever (a dense one, say) plugs in with ``register_retriever(name, factory)`` where
``factory(corpus, cache_dir=..., **params) -> Retriever``, and ``env_config.retriever=name``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from array import array
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

import numpy as np

from .data import Corpus

INDEX_VERSION = 1
log = logging.getLogger(__name__)


class Retriever(Protocol):
    corpus: Corpus

    def search(self, query: str, k: int) -> List[int]:
        """Rows of the top-``k`` passages for ``query``, best first (fewer when fewer match)."""


def top_k_rows(scores: np.ndarray, k: int) -> List[int]:
    """Rows of the ``k`` highest positive scores, best first; equal scores in row order."""
    hits = np.flatnonzero(scores > 0)
    if k <= 0 or hits.size == 0:
        return []
    if hits.size > k:
        kth = np.partition(scores[hits], hits.size - k)[hits.size - k]
        hits = hits[scores[hits] >= kth]
    return hits[np.lexsort((hits, -scores[hits]))][:k].tolist()


def _require_bm25s():
    try:
        import bm25s
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the search_qa env's BM25 retriever needs bm25s: pip install -e '.[search_qa]'") from e
    return bm25s


class BM25Retriever:
    """BM25 over a corpus with ``bm25s``; the index is cached on disk (see the module docstring)."""

    def __init__(self, corpus: Corpus, cache_dir: Optional[str] = None, k1: float = 0.9, b: float = 0.4):
        bm25s = _require_bm25s()
        from bm25s.tokenization import Tokenizer

        self.corpus = corpus
        self.k1, self.b = float(k1), float(b)
        self.key = hashlib.sha1(repr((corpus.key, self.k1, self.b, INDEX_VERSION, bm25s.__version__))
                                .encode()).hexdigest()[:16]
        self.cache_path = os.path.join(cache_dir, f"bm25_{self.key}") if cache_dir else None
        self.tokenizer = Tokenizer(lower=True, stopwords="en")
        self.loaded_from_cache = False
        self.index = self._load(bm25s) if self.cache_path and os.path.isdir(self.cache_path) else None
        if self.index is None:
            self.index = self._build(bm25s)
            if self.cache_path:
                self._save()
        else:
            self.loaded_from_cache = True
        self.vocab: Dict[str, int] = self.tokenizer.word_to_id
        self._n_scored = len(self.index.scores["indptr"]) - 1

    def _build(self, bm25s):
        ids: List[array] = []
        stream = self.tokenizer.streaming_tokenize((f"{p.title} {p.text}" for p in self.corpus.iter_passages()),
                                                   update_vocab=True, allow_empty=False)
        for doc in stream:
            ids.append(array("i", doc))
        vocab = self.tokenizer.word_to_id
        if not vocab:
            vocab["__empty__"] = 0
        index = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        index.index((ids, vocab), show_progress=False)
        return index

    def _load(self, bm25s):
        try:
            with open(os.path.join(self.cache_path, "search_qa_meta.json")) as f:
                meta = json.load(f)
            if meta.get("key") != self.key or meta.get("num_docs") != len(self.corpus):
                return None
            with open(os.path.join(self.cache_path, "search_qa_vocab.json")) as f:
                self.tokenizer.word_to_id = json.load(f)
            return bm25s.BM25.load(self.cache_path, mmap=True, load_vocab=True, show_progress=False)
        except Exception as e:  # a partial or stale cache is rebuilt
            log.warning("search_qa: ignoring unreadable BM25 cache %s (%s)", self.cache_path, e)
            return None

    def _save(self) -> None:
        tmp = f"{self.cache_path}.tmp{os.getpid()}_{threading.get_ident()}"
        try:
            os.makedirs(os.path.dirname(self.cache_path) or ".", exist_ok=True)
            self.index.save(tmp, show_progress=False)
            with open(os.path.join(tmp, "search_qa_vocab.json"), "w") as f:
                json.dump(self.tokenizer.word_to_id, f)
            with open(os.path.join(tmp, "search_qa_meta.json"), "w") as f:
                json.dump({"key": self.key, "num_docs": len(self.corpus), "corpus": self.corpus.path}, f)
            try:
                os.replace(tmp, self.cache_path)
            except OSError:  # another process saved it first
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError as e:
            log.warning("search_qa: could not cache the BM25 index in %s (%s)", self.cache_path, e)
            shutil.rmtree(tmp, ignore_errors=True)

    def query_ids(self, query: str) -> List[int]:
        words = next(self.tokenizer.streaming_tokenize([query], update_vocab="never", allow_empty=False))
        return [i for i in words if i < self._n_scored]

    def search(self, query: str, k: int) -> List[int]:
        ids = self.query_ids(query)
        if not ids or k <= 0:
            return []
        return top_k_rows(self.index.get_scores_from_ids(ids), k)


RETRIEVERS: Dict[str, Callable[..., Retriever]] = {"bm25": BM25Retriever}
_CACHE: Dict[Tuple, Retriever] = {}
_LOCK = threading.Lock()


def register_retriever(name: str, factory: Callable[..., Retriever]) -> None:
    """``factory(corpus, cache_dir=..., **params) -> Retriever`` becomes ``env_config.retriever=name``."""
    RETRIEVERS[name] = factory


def get_retriever(name: str, corpus: Corpus, cache_dir: Optional[str] = None, **params: Any) -> Retriever:
    """The retriever ``name`` over ``corpus``, built (or loaded from ``cache_dir``) once per process."""
    if name not in RETRIEVERS:
        raise ValueError(f"search_qa: unknown retriever {name!r}; registered: {sorted(RETRIEVERS)}")
    key = (name, corpus.key, id(corpus), tuple(sorted(params.items())))
    with _LOCK:
        r = _CACHE.get(key)
        if r is None:
            r = _CACHE[key] = RETRIEVERS[name](corpus, cache_dir=cache_dir, **params)
        return r


def clear_retriever_cache() -> None:
    with _LOCK:
        _CACHE.clear()


__all__ = ["Retriever", "BM25Retriever", "RETRIEVERS", "register_retriever", "get_retriever",
           "clear_retriever_cache", "top_k_rows"]
