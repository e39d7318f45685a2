"""Corpus and question loaders: the shipped synthetic data, Search-R1's files, a medical multiple-choice format.

Corpus: a JSONL file (``.jsonl`` or ``.jsonl.gz``), one passage per line, Search-R1's format:
``{"id": ..., "contents": "<title>\\n<text>"}`` (the 2018 Wikipedia dump ``wiki-18.jsonl`` is one). A title
wrapped in double quotes (as in wiki-18) is shown without them. The file is streamed: passages are held in
memory, or, for large uncompressed files (``lazy``), only each line's byte offset is, and a passage is read back
from disk when a search shows it.

Questions, one file per split:

* QA (Search-R1's data, NQ / HotpotQA / ...): ``question`` and ``golden_answers`` (a list of strings, or one
  string); Search-R1's processed parquet files also work (their ``reward_model.ground_truth.target`` is read when
  ``golden_answers`` is missing). Parquet (``.parquet``, needs ``pyarrow``: ``pip install -e '.[parquet]'``) or
  JSONL (``.jsonl`` / ``.jsonl.gz``).
* MCQA (medical multiple choice, MedQA / MedMCQA-like): ``question``, the options as ``options`` (a dict
  ``{"A": ..., "B": ...}`` or a list) or as columns ``A`` .. ``E``, and the answer letter in ``answer_idx`` or
  ``answer`` (MedQA's ``answer`` holds the option's text, which is mapped back to its letter). The golden answer is
  the letter.

The shipped files (``data/``, written by ``scripts/make_search_qa_data.py``) are in the QA format with two extra
fields the expert uses: ``queries`` (its searches) and ``support`` (the passage ids they must reach).
"""
from __future__ import annotations

import gzip
import io
import json
import os
import threading
from array import array
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from .scoring import CHOICE_LETTERS

QA_FORMATS = ("auto", "qa", "mcqa")


class SearchQADataError(ValueError):
    """A data file is missing or not in a supported format (the message says which and where)."""


@dataclass(frozen=True)
class Passage:
    title: str
    text: str


@dataclass
class QAItem:
    """One question. ``choices`` is set for multiple choice (then ``golden_answers`` is ``[letter]``)."""

    qid: str
    question: str
    golden_answers: List[str]
    choices: Optional[Dict[str, str]] = None
    queries: List[str] = field(default_factory=list)   # the expert's searches (shipped data only)
    support: List[str] = field(default_factory=list)   # passage ids those searches must reach
    hops: int = 0

    @property
    def is_choice(self) -> bool:
        return self.choices is not None

    def prompt_text(self) -> str:
        """The question as the agent sees it (with its options for multiple choice)."""
        q = self.question.strip()
        if not self.choices:
            return f"Question: {q}"
        opts = "\n".join(f"{k}. {v}" for k, v in self.choices.items())
        return f"Question: {q}\nOptions:\n{opts}"


# ------------------------------------------------------------------------------------------------ helpers
def _open_text(path: str):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, "r", encoding="utf-8")


def require_file(path: str, what: str, hint: str) -> str:
    path = os.path.expanduser(str(path))
    if not os.path.isfile(path):
        raise SearchQADataError(f"search_qa: {what} not found at {path!r}. {hint}")
    return path


def split_contents(contents: str) -> Passage:
    """Search-R1's ``contents``: the first line is the title (quotes stripped), the rest the text."""
    title, _, text = str(contents).partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return Passage(title, " ".join(text.split()))


def _passage_of(rec: Mapping[str, Any], where: str) -> Tuple[str, Passage]:
    if "contents" in rec:
        p = split_contents(rec["contents"])
    elif "text" in rec:  # {"title", "text"} corpora
        p = Passage(str(rec.get("title", "")).strip(), " ".join(str(rec["text"]).split()))
    else:
        raise SearchQADataError(f"search_qa: {where}: a corpus line needs 'contents' (\"title\\ntext\") "
                                f"or 'title' and 'text'; got keys {sorted(rec)}")
    return str(rec.get("id", "")), p


# ------------------------------------------------------------------------------------------------ corpus
CORPUS_HINT = ("Give a Search-R1 corpus JSONL (one {\"id\", \"contents\": \"title\\ntext\"} per line, e.g. "
               "wiki-18.jsonl) with custom_envs.<tag>.env_config.corpus_path=/path/to/corpus.jsonl, "
               "or leave it null for the shipped corpus.")


class Corpus:
    """Passages of a JSONL corpus: ``len``, ``passage(i)``, ``ids``, ``index_of(pid)``, ``iter_passages()``."""

    def __init__(self, path: str, lazy: Optional[bool] = None, max_passages: Optional[int] = None):
        self.path = require_file(path, "corpus file", CORPUS_HINT)
        st = os.stat(self.path)
        self.key = (os.path.abspath(self.path), st.st_size, int(st.st_mtime), max_passages)
        gz = self.path.endswith(".gz")
        if lazy is None:
            lazy = not gz and st.st_size > 512 * 2**20
        if lazy and gz:
            raise SearchQADataError(f"search_qa: lazy loading needs an uncompressed corpus; gunzip {self.path!r} "
                                    "first (or set lazy_load=false to hold it in memory)")
        self.lazy = bool(lazy)
        self.max_passages = max_passages
        self.ids: List[str] = []
        self._passages: List[Passage] = []
        self._offsets = array("q")
        self._fd: Optional[int] = None
        self._load()
        self._id_index: Optional[Dict[str, int]] = None
        if not len(self):
            raise SearchQADataError(f"search_qa: the corpus {self.path!r} holds no passages")

    def _load(self) -> None:
        if self.lazy:
            with open(self.path, "rb") as f:
                pos = 0
                for n, line in enumerate(f):
                    if self.max_passages is not None and len(self._offsets) >= self.max_passages:
                        break
                    if line.strip():
                        self._offsets.append(pos)
                        if n == 0:  # check the format on the first line
                            self._parse(line, 1)
                    pos += len(line)
            return
        with _open_text(self.path) as f:
            for n, line in enumerate(f, 1):
                if self.max_passages is not None and len(self._passages) >= self.max_passages:
                    break
                if line.strip():
                    pid, p = self._parse(line, n)
                    self.ids.append(pid or str(len(self._passages)))
                    self._passages.append(p)

    def _parse(self, line, n: int) -> Tuple[str, Passage]:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise SearchQADataError(f"search_qa: {self.path}:{n} is not JSON ({e})") from None
        if not isinstance(rec, dict):
            raise SearchQADataError(f"search_qa: {self.path}:{n} is not a JSON object")
        return _passage_of(rec, f"{self.path}:{n}")

    def __len__(self) -> int:
        return len(self._offsets) if self.lazy else len(self._passages)

    def passage(self, i: int) -> Passage:
        if not self.lazy:
            return self._passages[i]
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        pos, chunks = self._offsets[i], []
        while True:  # pread: no shared file position, so threads may read at once
            chunk = os.pread(self._fd, 1 << 16, pos)
            cut = chunk.find(b"\n")
            chunks.append(chunk if cut < 0 else chunk[:cut])
            if cut >= 0 or not chunk:
                break
            pos += len(chunk)
        return self._parse(b"".join(chunks), i + 1)[1]

    def iter_passages(self) -> Iterator[Passage]:
        """Every passage in order (one pass over the file when lazy)."""
        if not self.lazy:
            yield from self._passages
            return
        count = 0
        with open(self.path, "rb") as f:
            for line in f:
                if count >= len(self):
                    break
                if line.strip():
                    count += 1
                    yield self._parse(line, count)[1]

    def index_of(self, pid: str) -> Optional[int]:
        """Row of passage id ``pid`` (in-memory corpora; None when unknown)."""
        if self._id_index is None:
            self._id_index = {p: i for i, p in enumerate(self.ids)}
        return self._id_index.get(pid)


# ------------------------------------------------------------------------------------------------ questions
QA_HINT = ("Give the question file of each split with custom_envs.<tag>.env_config.qa_path=/path/to/train.parquet "
           "(Search-R1's QA parquet or JSONL with 'question' and 'golden_answers'; or MCQA with 'question', "
           "'options' A-E and the answer letter, qa_format=mcqa), or leave it null for the shipped questions.")


def _iter_records(path: str, max_items: Optional[int]) -> Iterator[Dict[str, Any]]:
    n = 0
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise SearchQADataError(f"search_qa: reading {path!r} needs pyarrow: pip install -e '.[parquet]' "
                                    "(or convert the file to JSONL)") from None
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=1024):
            for rec in batch.to_pylist():
                if max_items is not None and n >= max_items:
                    return
                n += 1
                yield rec
        return
    if not path.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz")):
        raise SearchQADataError(f"search_qa: {path!r}: question files must be .parquet, .jsonl or .jsonl.gz")
    with _open_text(path) as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            if max_items is not None and n >= max_items:
                return
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise SearchQADataError(f"search_qa: {path}:{ln} is not JSON ({e}); question files are JSONL "
                                        "(one object per line) or parquet") from None
            if not isinstance(rec, dict):
                raise SearchQADataError(f"search_qa: {path}:{ln} is not a JSON object")
            n += 1
            yield rec


def _golden(rec: Mapping[str, Any]) -> Optional[List[str]]:
    g = rec.get("golden_answers")
    if g is None:  # Search-R1's processed parquet: reward_model.ground_truth.target
        g = ((rec.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    if g is None:
        return None
    if isinstance(g, str):
        g = [g]
    out = [str(x) for x in list(g) if str(x).strip()]
    return out or None


def _choices(rec: Mapping[str, Any]) -> Optional[Dict[str, str]]:
    opts = rec.get("options")
    if isinstance(opts, Mapping):
        out = {str(k).strip().upper(): str(v) for k, v in opts.items() if v is not None and str(v).strip()}
    elif isinstance(opts, (list, tuple)):
        if isinstance(opts[0] if opts else None, Mapping):  # parquet of [{"key": "A", "value": ...}]
            out = {str(o.get("key")).strip().upper(): str(o.get("value")) for o in opts}
        else:
            out = {CHOICE_LETTERS[i]: str(v) for i, v in enumerate(opts[: len(CHOICE_LETTERS)])}
    else:
        out = {k: str(rec[k]) for k in CHOICE_LETTERS if rec.get(k) is not None and str(rec[k]).strip()}
    out = {k: v for k, v in out.items() if k in CHOICE_LETTERS}
    return dict(sorted(out.items())) if len(out) >= 2 else None


def _choice_answer(rec: Mapping[str, Any], choices: Mapping[str, str]) -> Optional[str]:
    for key in ("answer_idx", "answer"):
        v = rec.get(key)
        if v is None:
            continue
        s = str(v).strip()
        if s.upper() in choices:
            return s.upper()
        by_text = [k for k, t in choices.items() if t.strip().lower() == s.lower()]
        if len(by_text) == 1:  # MedQA: "answer" is the option's text
            return by_text[0]
    return None


def load_questions(path: str, qa_format: str = "auto", max_items: Optional[int] = None,
                   split: str = "") -> List[QAItem]:
    """Stream a question file into :class:`QAItem` records (the first ``max_items`` when given)."""
    if qa_format not in QA_FORMATS:
        raise SearchQADataError(f"search_qa: qa_format must be one of {list(QA_FORMATS)}, got {qa_format!r}")
    path = require_file(path, "question file", QA_HINT)
    items: List[QAItem] = []
    for n, rec in enumerate(_iter_records(path, max_items)):
        where = f"{path} (record {n + 1})"
        q = rec.get("question")
        if not isinstance(q, str) or not q.strip():
            raise SearchQADataError(f"search_qa: {where} has no 'question' text; keys: {sorted(rec)}")
        choices = _choices(rec) if qa_format in ("auto", "mcqa") else None
        if qa_format == "mcqa" and choices is None:
            raise SearchQADataError(f"search_qa: {where}: an MCQA record needs 'options' (A-E, a dict or a list) "
                                    f"or columns A..E; keys: {sorted(rec)}")
        qid = str(rec.get("id", f"{split or 'q'}-{n}"))
        if choices is not None and (qa_format == "mcqa" or _golden(rec) is None):
            letter = _choice_answer(rec, choices)
            if letter is None:
                raise SearchQADataError(f"search_qa: {where}: the answer must be one of the option letters "
                                        f"{list(choices)} in 'answer_idx' or 'answer' (or an option's exact text)")
            items.append(QAItem(qid, q, [letter], choices=choices))
            continue
        golden = _golden(rec)
        if golden is None:
            raise SearchQADataError(f"search_qa: {where} has no 'golden_answers' (QA format) and no options + answer "
                                    f"letter (MCQA format); keys: {sorted(rec)}")
        queries = [str(x) for x in (rec.get("queries") or [])]
        items.append(QAItem(qid, q, golden, queries=queries, support=[str(x) for x in (rec.get("support") or [])],
                            hops=int(rec.get("hops") or len(queries))))
    if not items:
        raise SearchQADataError(f"search_qa: the question file {path!r} holds no questions")
    return items


_LOADED: Dict[Tuple, Any] = {}
_LOCK = threading.Lock()


def get_corpus(path: str, lazy: Optional[bool] = None, max_passages: Optional[int] = None) -> Corpus:
    """The corpus at ``path``, loaded once per process (every env of a run shares it)."""
    key = ("corpus", os.path.abspath(os.path.expanduser(path)), lazy, max_passages)
    with _LOCK:
        if key not in _LOADED:
            _LOADED[key] = Corpus(path, lazy=lazy, max_passages=max_passages)
        return _LOADED[key]


def get_questions(path: str, qa_format: str = "auto", max_items: Optional[int] = None,
                  split: str = "") -> List[QAItem]:
    """The questions of ``path``, loaded once per process."""
    key = ("questions", os.path.abspath(os.path.expanduser(path)), qa_format, max_items, split)
    with _LOCK:
        if key not in _LOADED:
            _LOADED[key] = load_questions(path, qa_format, max_items, split)
        return _LOADED[key]


def clear_data_cache() -> None:
    with _LOCK:
        _LOADED.clear()


__all__ = ["Corpus", "Passage", "QAItem", "SearchQADataError", "load_questions", "split_contents",
           "get_corpus", "get_questions", "clear_data_cache", "QA_FORMATS"]
