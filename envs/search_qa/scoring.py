"""Answer scoring: Search-R1's normalised exact match, token F1, and the letter of a multiple-choice answer.

Normalisation (Search-R1's, which is SQuAD's): lower case, drop every ASCII punctuation character, drop the
articles ``a`` / ``an`` / ``the`` as whole words, collapse white space. Exact match is 1 when the normalised
prediction equals any normalised golden answer. F1 is the best token-overlap F1 over the golden answers (on the
normalised tokens); it is reported as a metric, the reward is exact match.

Multiple-choice answers are letters, which the article rule would erase (``"A"`` normalises to ``""``), so a
choice question is scored on the letter the answer starts with: ``C``, ``(C)``, ``C.``, ``C) text``,
``Option C`` and ``answer: C`` all read as C.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable, Optional, Sequence

_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
CHOICE_LETTERS = "ABCDE"
_CHOICE = re.compile(r"^\W*(?:(?:the\s+)?(?:answer|option|choice)\s*(?:is)?\s*[:\-]?\s*)?"
                     r"\(?([A-Ea-e])(?![A-Za-z])", re.IGNORECASE)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (Search-R1's ``normalize_answer``)."""
    text = str(text).lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golden_answers: Iterable[str]) -> float:
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _as_list(golden_answers)))


def f1_score(prediction: str, golden_answers: Iterable[str]) -> float:
    """Best token F1 over the golden answers (0 when either side normalises to nothing)."""
    pred = normalize_answer(prediction).split()
    best = 0.0
    for g in _as_list(golden_answers):
        gold = normalize_answer(g).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            p, r = common / len(pred), common / len(gold)
            best = max(best, 2 * p * r / (p + r))
    return best


def choice_letter(text: str) -> Optional[str]:
    """The option letter an answer names (``"(b) aspirin"`` -> ``"B"``), or None."""
    m = _CHOICE.match(str(text).strip())
    return m.group(1).upper() if m else None


def answer_in_text(golden_answers: Iterable[str], text: str) -> bool:
    """Whether a normalised golden answer occurs in the normalised ``text`` (Search-R1's retrieval check)."""
    hay = f" {normalize_answer(text)} "
    return any(f" {g} " in hay for g in (normalize_answer(x) for x in _as_list(golden_answers)) if g)


def _as_list(golden_answers: Iterable[str]) -> Sequence[str]:
    return [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)


__all__ = ["normalize_answer", "exact_match", "f1_score", "choice_letter", "answer_in_text", "CHOICE_LETTERS"]
