"""BM25 product search (WebShop used Lucene through pyserini; this uses ``bm25s`` from PyPI).

The indexed text of a product is WebShop's: title, description, first bullet point and the option values,
lower-cased. Text is split on anything but letters and digits, Lucene's English stop words are dropped and
plurals are folded by a light suffix stemmer (Lucene's English analyser stems with Porter; the light stemmer
keeps the common shopping plurals, ``shoes`` / ``shoe``, ``dresses`` / ``dress``, together). Scores use
Lucene's BM25 (k1 = 0.9, b = 0.4, pyserini's defaults); documents with score 0 are not returned, ties go to
the lower product index, as Lucene breaks ties by document id.

The index is built once per catalog and process (:func:`get_search_engine`) and saved under ``cache_dir``
(memory-mapped when loaded back), keyed by the catalog files' identity and the BM25 parameters.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
from array import array
from typing import Dict, List, Optional, Tuple

import numpy as np

TOKENIZER_VERSION = 1
_TOKEN_RE = re.compile(r"[a-z0-9]+")
#: Lucene's default English stop-word set
LUCENE_STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with".split()
)

log = logging.getLogger(__name__)


def light_stem(w: str) -> str:
    """Fold English plurals: ``ies`` -> ``y``, ``(s|x|z|ch|sh)es`` -> drop ``es``,
    ``s`` -> drop (not ``ss``/``us``/``is``)."""
    n = len(w)
    if n <= 3 or not w.endswith("s") or w[-2:] in ("ss", "us", "is") or w[-2].isdigit():
        return w
    if w.endswith("ies") and n > 4 and w[-4] not in "ae":
        return w[:-3] + "y"
    if w.endswith("es") and (w.endswith(("sses", "xes", "zes", "ches", "shes"))):
        return w[:-2]
    return w[:-1]


class Tokenizer:
    """Lower-case alphanumeric words minus stop words, light-stemmed (memoised per word)."""

    def __init__(self) -> None:
        self._memo: Dict[str, Optional[str]] = {}

    def __call__(self, text: str) -> List[str]:
        memo = self._memo
        out = []
        for w in _TOKEN_RE.findall(text.lower()):
            t = memo.get(w, "")
            if t == "":
                t = None if w in LUCENE_STOP_WORDS else light_stem(w)
                if len(memo) < 2_000_000:
                    memo[w] = t
            if t is not None:
                out.append(t)
        return out


def _require_bm25s():
    try:
        import bm25s  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "The WebShop env's search engine needs the `bm25s` package: pip install 'bm25s>=0.2' "
            "(or pip install -e '.[webshop]')."
        ) from e
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its logger to DEBUG: "[bm25s][DEBUG] ..." lines
    return bm25s


class BM25SearchEngine:
    """``search(query, k) -> [product index, ...]`` over a :class:`~.catalog.Catalog`."""

    def __init__(self, catalog, cache_dir: Optional[str] = None, k1: float = 0.9, b: float = 0.4):
        bm25s = _require_bm25s()
        self.catalog = catalog
        self.k1, self.b = float(k1), float(b)
        self.tokenizer = Tokenizer()
        self.key = hashlib.sha1(repr((catalog.key, self.k1, self.b, TOKENIZER_VERSION, bm25s.__version__))
                                .encode()).hexdigest()[:16]
        self.cache_path = os.path.join(cache_dir, f"bm25_{self.key}") if cache_dir else None
        self.loaded_from_cache = False
        self.retriever = None
        if self.cache_path and os.path.isdir(self.cache_path):
            self.retriever = self._load(bm25s, self.cache_path)
            self.loaded_from_cache = self.retriever is not None
        if self.retriever is None:
            from .catalog import gc_paused

            with gc_paused():
                self.retriever = self._build(bm25s)
            if self.cache_path:
                self._save(self.cache_path)
        self.vocab: Dict[str, int] = self.retriever.vocab_dict
        self.num_docs = int(self.retriever.scores["num_docs"])
        self._n_scored_tokens = len(self.retriever.scores["indptr"]) - 1

    # ---- build / cache
    def _build(self, bm25s):
        vocab: Dict[str, int] = {}
        ids: List[array] = []
        tok = self.tokenizer
        for p in self.catalog.iter_products(with_attributes=False):
            ids.append(array("i", [vocab.setdefault(t, len(vocab)) for t in tok(p.search_text())]))
        if not vocab:
            vocab["__empty__"] = 0
        retriever = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        retriever.index((ids, vocab), show_progress=False)
        return retriever

    def _load(self, bm25s, path: str):
        try:
            with open(os.path.join(path, "webshop_meta.json")) as f:
                meta = json.load(f)
            if meta.get("num_docs") != len(self.catalog) or meta.get("key") != self.key:
                return None
            return bm25s.BM25.load(path, mmap=True, load_vocab=True, show_progress=False)
        except Exception as e:  # a partial or stale cache is rebuilt
            log.warning("webshop: ignoring unreadable BM25 cache %s (%s)", path, e)
            return None

    def _save(self, path: str) -> None:
        tmp = f"{path}.tmp{os.getpid()}_{threading.get_ident()}"
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self.retriever.save(tmp, show_progress=False)
            with open(os.path.join(tmp, "webshop_meta.json"), "w") as f:
                json.dump({"key": self.key, "num_docs": len(self.catalog), "catalog_files":
                           [self.catalog.files.products]}, f)
            try:
                os.replace(tmp, path)
            except OSError:  # another process saved it first
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError as e:
            log.warning("webshop: could not cache the BM25 index in %s (%s)", path, e)
            shutil.rmtree(tmp, ignore_errors=True)

    # ---- query
    def query_ids(self, query: str) -> List[int]:
        vocab = self.vocab
        out = []
        for t in self.tokenizer(query):
            i = vocab.get(t)
            if i is not None and i < self._n_scored_tokens:
                out.append(i)
        return out

    def scores(self, query: str) -> np.ndarray:
        ids = self.query_ids(query)
        if not ids:
            return np.zeros(self.num_docs, dtype=np.float32)
        return self.retriever.get_scores_from_ids(ids)

    def search(self, query: str, k: int = 50) -> List[int]:
        """Indices of the top-``k`` products with a positive score, best first (ties: lower index first)."""
        ids = self.query_ids(query)
        if not ids or k <= 0:
            return []
        scores = self.retriever.get_scores_from_ids(ids)
        hits = np.flatnonzero(scores > 0)
        if hits.size > k:
            part = np.argpartition(-scores[hits], k - 1)[:k]
            kth = scores[hits[part]].min()
            hits = hits[scores[hits] >= kth]  # keep every tie of the k-th score, trimmed after sorting
        order = np.lexsort((hits, -scores[hits]))
        return hits[order][:k].tolist()


_ENGINES: Dict[Tuple, BM25SearchEngine] = {}
_ENGINE_LOCK = threading.Lock()


def get_search_engine(catalog, cache_dir: Optional[str] = None, k1: float = 0.9, b: float = 0.4) -> BM25SearchEngine:
    """The catalog's search engine, built (or loaded from ``cache_dir``) once per process."""
    key = (catalog.key, id(catalog), float(k1), float(b))
    with _ENGINE_LOCK:
        eng = _ENGINES.get(key)
        if eng is None:
            eng = BM25SearchEngine(catalog, cache_dir=cache_dir, k1=k1, b=b)
            _ENGINES[key] = eng
        return eng


def clear_search_cache() -> None:
    with _ENGINE_LOCK:
        _ENGINES.clear()


__all__ = ["BM25SearchEngine", "Tokenizer", "light_stem", "get_search_engine", "clear_search_cache"]
