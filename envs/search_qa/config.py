"""Configuration of the search-QA environment (``custom_envs.<tag>.env_config`` in Hydra)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..base import known_keys_config, normalize_split as _normalize_split
from .data import CORPUS_HINT, QA_FORMATS, QA_HINT, require_file

SPLITS = ("train", "val", "test")
FILE_OF = {"corpus_path": ("corpus file", CORPUS_HINT), "qa_path": ("question file", QA_HINT)}

#: the synthetic knowledge base and questions shipped with the package (scripts/make_search_qa_data.py)
SHIPPED_DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def normalize_split(split: Optional[str]) -> str:
    return _normalize_split(split, SPLITS, "search_qa")


@dataclass
class SearchQAEnvConfig:
    """Every field has a default, so ``SearchQAEnvConfig(**plain_dict)`` works from Hydra.

    Data
      corpus_path: the retrieval corpus, a Search-R1 JSONL (``{"id", "contents": "title\\ntext"}`` per line, ``.gz``
        allowed). ``None`` = the synthetic knowledge base shipped in ``envs/search_qa/data/``.
      qa_path: this env's questions (``.parquet``, ``.jsonl`` or ``.jsonl.gz``): Search-R1's QA files (``question``,
        ``golden_answers``) or MCQA (``question``, options A-E, answer letter). ``None`` = the shipped file of
        ``split``.
      qa_format: ``auto`` (MCQA when a record has options and no golden answers), ``qa`` or ``mcqa``.
      split: ``train`` / ``val`` / ``test``: which shipped question file (with ``qa_path`` it only names the split).
      max_questions / max_passages: keep only the first N questions / passages (``None`` = all).
      lazy_load: keep only byte offsets of the corpus in memory and read passages on demand (``None`` = on for
        uncompressed corpora over 512 MB).
      cache_dir: where the search index is cached (``None`` = ``$RAGEN_TURN_CACHE_DIR/search_qa``, else
        ``~/.cache/ragen_turn/search_qa``; ``""`` = no disk cache).
    Retrieval
      retriever: a name in ``retrieval.RETRIEVERS`` (``bm25``).
      topk: passages per search (Search-R1: 3). bm25_k1 / bm25_b: BM25 parameters (pyserini's defaults).
      max_passage_words: cut each shown passage to this many words (``None`` = whole passages).
    Episode
      max_searches: searches per episode (Search-R1's ``max_turns``); a search beyond it is an invalid turn.
      max_turns: responses per episode (``None`` = ``max_searches + 1``); the episode ends there, unanswered.
      format_penalty: reward of a turn with neither a ``<search>`` nor an ``<answer>`` (or a refused search).
      answer_reward: reward of an exact-match answer (a wrong answer scores 0).
      max_query_chars: longer queries are cut to this many characters.
    """

    corpus_path: Optional[str] = None
    qa_path: Optional[str] = None
    qa_format: str = "auto"
    split: str = "train"
    max_questions: Optional[int] = None
    max_passages: Optional[int] = None
    lazy_load: Optional[bool] = None
    cache_dir: Optional[str] = None

    retriever: str = "bm25"
    topk: int = 3
    bm25_k1: float = 0.9
    bm25_b: float = 0.4
    max_passage_words: Optional[int] = None

    max_searches: int = 4
    max_turns: Optional[int] = None
    format_penalty: float = -0.1
    answer_reward: float = 1.0
    max_query_chars: int = 300

    def __post_init__(self) -> None:
        self.split = normalize_split(self.split)
        for name in ("corpus_path", "qa_path"):
            v = getattr(self, name)
            if v is not None:
                if not isinstance(v, (str, os.PathLike)) or not str(v).strip():
                    raise ValueError(f"search_qa: {name} must be a non-empty path or null, got {v!r}")
                # a missing file is said here, before any work (the data loads with the env)
                setattr(self, name, require_file(v, *FILE_OF[name]))
        if self.qa_format not in QA_FORMATS:
            raise ValueError(f"search_qa: qa_format must be one of {list(QA_FORMATS)}, got {self.qa_format!r}")
        for name in ("topk", "max_searches", "max_query_chars"):
            _check_int(name, getattr(self, name), minimum=1 if name != "max_searches" else 0)
        for name in ("max_questions", "max_passages", "max_turns", "max_passage_words"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), minimum=1)
        if self.max_turns is None:
            self.max_turns = self.max_searches + 1
        for name in ("format_penalty", "answer_reward", "bm25_k1", "bm25_b"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"search_qa: {name} must be a number, got {v!r}")
            setattr(self, name, float(v))
        if not (self.bm25_k1 > 0 and 0 <= self.bm25_b <= 1):
            raise ValueError(f"search_qa: need bm25_k1 > 0 and 0 <= bm25_b <= 1, got {self.bm25_k1}, {self.bm25_b}")
        if self.lazy_load not in (None, True, False):
            raise ValueError(f"search_qa: lazy_load must be true, false or null, got {self.lazy_load!r}")
        if not isinstance(self.retriever, str) or not self.retriever:
            raise ValueError(f"search_qa: retriever must be a registered name, got {self.retriever!r}")

    @classmethod
    def from_dict(cls, d: Optional[Mapping[str, Any]] = None) -> "SearchQAEnvConfig":
        return known_keys_config(cls, d, "search_qa")

    @property
    def resolved_corpus_path(self) -> str:
        return self.corpus_path or os.path.join(SHIPPED_DATA_DIR, "corpus.jsonl.gz")

    @property
    def resolved_qa_path(self) -> str:
        return self.qa_path or os.path.join(SHIPPED_DATA_DIR, f"{self.split}.jsonl.gz")


def _check_int(name: str, v: Any, minimum: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"search_qa: {name} must be an int >= {minimum}, got {v!r}")


__all__ = ["SearchQAEnvConfig", "SHIPPED_DATA_DIR", "SPLITS", "normalize_split"]
