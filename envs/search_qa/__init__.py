"""Multi-turn search QA (Search-R1's protocol: ``<search>`` / ``<information>`` / ``<answer>``), BM25 retrieval.

``SearchQAEnv(SearchQAEnvConfig(...))`` runs on the synthetic knowledge base shipped in ``data/`` (written by
``scripts/make_search_qa_data.py``) or on Search-R1's corpus and QA files, or a medical multiple-choice file
(``corpus_path``, ``qa_path``). See README.md in this folder. BM25 needs ``bm25s`` (the ``[search_qa]`` extra).
"""
from .config import SHIPPED_DATA_DIR, SearchQAEnvConfig
from .data import (Corpus, Passage, QAItem, SearchQADataError, clear_data_cache, get_corpus, get_questions,
                   load_questions, split_contents)
from .env import SearchQAEnv, parse_action
from .retrieval import (RETRIEVERS, BM25Retriever, Retriever, clear_retriever_cache, get_retriever,
                        register_retriever)
from .scoring import choice_letter, exact_match, f1_score, normalize_answer

__all__ = [
    "SearchQAEnv", "SearchQAEnvConfig", "SHIPPED_DATA_DIR", "parse_action", "Corpus", "Passage", "QAItem",
    "SearchQADataError", "load_questions", "get_corpus", "get_questions", "clear_data_cache", "split_contents",
    "Retriever", "BM25Retriever", "RETRIEVERS", "register_retriever", "get_retriever", "clear_retriever_cache",
    "normalize_answer", "exact_match", "f1_score", "choice_letter",
]
