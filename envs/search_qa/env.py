"""Multi-turn search QA with Search-R1's turn protocol, behind RAGEN's language-env interface.

Each turn the agent writes one response. The env reads the first ``<search> query </search>`` or
``<answer> text </answer>`` in it (after cutting the response at its first ``</search>``, else its first
``</answer>``, as Search-R1 does); ``<think> ... </think>`` or any other text around the tag is allowed.

* search: the observation is ``<information>Doc 1(Title: ...) text\\nDoc 2(Title: ...) ...</information>``, the
  top ``topk`` passages; reward 0. At most ``max_searches`` searches per episode; one more is refused.
* answer: ends the episode; reward ``answer_reward`` when it is an exact match after Search-R1's normalisation
  (or, for multiple choice, names the right option letter), else 0.
* anything else (no tag, an empty query, a refused search): an invalid turn, ``format_penalty``, and an
  observation saying how to search or answer. Malformed input never raises.

The episode also ends, unanswered, after ``max_turns`` responses. ``info`` has ``em``, ``f1`` (token F1, a metric
only), ``searches``, ``retrieval_hit`` (a golden answer appeared in a shown passage) and, under
``episode_metrics``, the same numbers for the run's metrics (``env/f1``, ``val/f1``, ...).
"""
from __future__ import annotations

import random
import re
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple, Union

from ..base import BaseLanguageBasedEnv, coerce_config, env_cache_dir
from .config import SearchQAEnvConfig, normalize_split
from .data import Corpus, QAItem, get_corpus, get_questions
from .retrieval import Retriever, get_retriever
from .scoring import answer_in_text, choice_letter, exact_match, f1_score

_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

HOW_TO = "Search with <search> query </search> or answer with <answer> answer </answer>."


def parse_action(text: Any) -> Tuple[Optional[str], str]:
    """``("search" | "answer", content)`` of the response's first tag, or ``(None, why not)``."""
    if not isinstance(text, str):
        return None, f"a response must be text, got {type(text).__name__}"
    for close in ("</search>", "</answer>"):  # Search-R1 cuts the response at its first closing tag
        cut = text.find(close)
        if cut >= 0:
            text = text[: cut + len(close)]
            break
    m = _TAG.search(text)
    if m is None:
        return None, "no <search> ... </search> or <answer> ... </answer> found"
    return m.group(1), m.group(2).strip()


class SearchQAEnv(BaseLanguageBasedEnv):
    """``reset(seed) -> question``; ``step(response) -> (obs, reward, done, info)``; ``solve()`` for demos."""

    response_format = "raw"

    def __init__(self, config: Union[SearchQAEnvConfig, Mapping[str, Any], None] = None, **kwargs: Any) -> None:
        config = coerce_config(SearchQAEnvConfig, config, kwargs)
        super().__init__(config)
        cfg = config
        cache_dir = env_cache_dir("search_qa") if cfg.cache_dir is None else (cfg.cache_dir or None)
        self.corpus: Corpus = get_corpus(cfg.resolved_corpus_path, lazy=cfg.lazy_load, max_passages=cfg.max_passages)
        params = {"k1": cfg.bm25_k1, "b": cfg.bm25_b} if cfg.retriever == "bm25" else {}
        self.retriever: Retriever = get_retriever(cfg.retriever, self.corpus, cache_dir=cache_dir, **params)
        self._splits: Dict[str, List[QAItem]] = {}
        self.questions(cfg.split)  # load and check now
        self._rng = random.Random()
        self.item: Optional[QAItem] = None
        self._start_episode()

    # ------------------------------------------------------------------ data
    def questions(self, split: Optional[str] = None) -> List[QAItem]:
        """The questions of ``split`` (default: the configured one; with ``qa_path`` only that file)."""
        cfg = self.config
        split = normalize_split(split or cfg.split)
        if cfg.qa_path is not None:
            split = cfg.split
        if split not in self._splits:
            path = cfg.resolved_qa_path if split == cfg.split else SearchQAEnvConfig(split=split).resolved_qa_path
            self._splits[split] = get_questions(path, cfg.qa_format, cfg.max_questions, split)
        return self._splits[split]

    @property
    def instruction(self) -> str:
        return ("Answer the question with the help of a search engine. To search, write <search> query </search>; "
                "the best matching passages come back between <information> and </information>. You may search up "
                f"to {self.config.max_searches} times, once per turn. When you know the answer, write "
                "<answer> answer </answer> with the answer alone (a name, a number or a few words; the option "
                "letter for a multiple-choice question). You may reason inside <think> ... </think> first.")

    # ------------------------------------------------------------------ API
    def _start_episode(self) -> None:
        self.turns = 0
        self.searches = 0
        self.done = False
        self.shown: Set[int] = set()
        self.retrieval_hit = False
        self.em = 0.0
        self.f1 = 0.0
        self.answer: Optional[str] = None
        self._obs = self.item.prompt_text() if self.item is not None else ""

    def reset(self, seed: Optional[int] = None, mode: Optional[str] = None) -> str:
        """Start an episode; ``seed`` picks the question of the split (``mode`` may name another split)."""
        items = self.questions(mode)
        if seed is None:
            seed = self._rng.randrange(2 ** 31)
        self.item = items[int(seed) % len(items)]
        self._start_episode()
        return self._obs

    def step(self, action: Any) -> Tuple[str, float, bool, Dict[str, Any]]:
        if self.item is None:
            self.reset()
        info: Dict[str, Any] = {"success": False, "action_is_valid": False, "action_is_effective": False}
        if self.done:
            info.update(self._scores(), feedback="The episode is over; call reset().")
            return self._obs, 0.0, True, info
        self.turns += 1
        reward, error = 0.0, None
        try:
            kind, content = parse_action(action)
            if kind is None:
                error = content
            elif kind == "search":
                error = self._search(content, info)
            else:
                reward = self._answer(content)
        except Exception as e:  # never let a bad response crash a rollout
            kind, error = None, f"the response could not be used ({type(e).__name__})"
        info["action"] = kind if error is None else "invalid"
        if error is not None:
            reward = self.config.format_penalty
            info["feedback"] = f"Invalid response: {error}."
            self._obs = f"Invalid response: {error}. {HOW_TO}"
        else:
            info["action_is_valid"] = True
            info["action_is_effective"] = info["action_is_effective"] if kind == "search" else True
        if not self.done and self.turns >= self.config.max_turns:
            self.done = True
            info["truncated"] = True
        info.update(self._scores())
        info["success"] = self.em >= 1.0
        return self._obs, float(reward), self.done, info

    def render(self, mode: str = "text") -> str:
        return self._obs

    def close(self) -> None:
        """Nothing to release per env: the corpus and index are shared by the process."""

    def get_all_actions(self) -> List[str]:
        return [] if self.done else ["<search> query </search>", "<answer> answer </answer>"]

    # ------------------------------------------------------------------ actions
    def _search(self, query: str, info: Dict[str, Any]) -> Optional[str]:
        cfg = self.config
        query = " ".join(query.split())[: cfg.max_query_chars]
        if not query:
            return "the search query is empty"
        if self.searches >= cfg.max_searches:
            return f"no searches left (the limit is {cfg.max_searches}); give your answer"
        self.searches += 1
        rows = self.retriever.search(query, cfg.topk)
        info["action_is_effective"] = any(r not in self.shown for r in rows)
        self.shown.update(rows)
        docs = []
        for i, r in enumerate(rows, 1):
            p = self.corpus.passage(r)
            words = p.text.split()
            if cfg.max_passage_words is not None and len(words) > cfg.max_passage_words:
                words = words[: cfg.max_passage_words] + ["..."]
            docs.append(f"Doc {i}(Title: {p.title}) {' '.join(words)}")
        text = "\n".join(docs) if docs else "No passage matches the query."
        if not self.item.is_choice and answer_in_text(self.item.golden_answers, text):
            self.retrieval_hit = True
        self._obs = f"<information>{text}</information>"
        info["retrieved"] = rows
        return None

    def _answer(self, answer: str) -> float:
        item = self.item
        self.answer = answer
        if item.is_choice:
            self.em = self.f1 = float(choice_letter(answer) == item.golden_answers[0])
        else:
            self.em = exact_match(answer, item.golden_answers)
            self.f1 = f1_score(answer, item.golden_answers)
        self.done = True
        self._obs = f"Your answer: {answer}"
        return self.config.answer_reward * self.em

    def _scores(self) -> Dict[str, Any]:
        m = {"em": self.em, "f1": self.f1, "searches": float(self.searches), "retrieval_hit": float(self.retrieval_hit)}
        return {**m, "answered": self.answer is not None, "episode_metrics": dict(m)}

    # ------------------------------------------------------------------ expert
    def solve(self) -> List[str]:
        """The expert's remaining responses from the current state: its searches, then the golden answer.

        Shipped questions: one ``<search> name </search>`` per hop whose supporting passage no search has shown
        yet (the subject's name, then the bridge entity's), within the searches left, then
        ``<answer> golden answer </answer>``. Stepping them in order scores an exact match (tested on every
        shipped question with the default ``topk``). Other data has no expert searches: one search for the
        question text, then the golden answer (or option letter). ``[]`` once the episode is over.
        """
        if self.item is None:
            raise RuntimeError("call reset() before solve()")
        if self.done:
            return []
        item, left = self.item, self.config.max_searches - self.searches
        plan: List[str] = []
        if item.queries:
            for q, pid in zip(item.queries, item.support or [None] * len(item.queries)):
                row = self.corpus.index_of(pid) if pid is not None else None
                if row is None or row not in self.shown:
                    plan.append(q)
        elif self.searches == 0:
            plan.append(" ".join(item.question.split())[: self.config.max_query_chars])
        searches = [f"<search> {q} </search>" for q in plan[: max(left, 0)]]
        return searches + [f"<answer> {item.golden_answers[0]} </answer>"]


__all__ = ["SearchQAEnv", "parse_action", "HOW_TO"]
