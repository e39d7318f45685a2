"""The embedded `tiny` model's tokenizer: a byte-level BPE trained with the `tokenizers` library on
`ragen_turn.models.tiny_corpus` (deterministic: the same code gives the same `tokenizer.json`); its promises are in
`ragen_turn.models.tiny`'s docstring.
"""
from __future__ import annotations

import json
import random

from .tiny_corpus import ACTION_SEP, ACTION_WORDS, SEARCH_QA_CHAT, build_corpus

# Bump when the corpus or the tokenizer recipe changes: it is part of the cache key.
TOKENIZER_VERSION = 1

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]          # ids 0, 1, 2 (same ids as SmolLM2)
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
VOCAB_SIZE = 1024                                     # total, added tokens included

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Tokenizer corpora (`model.tokenizer_corpus`): the text the BPE is trained on, its added tags and its vocab size.
# `agents` (the default) is Sokoban / WebShop text; `search_qa` is the search-QA env's shipped train split (passages,
# questions, Search-R1's tags), so its fictional names and words are a few tokens each instead of one per letter.
SEARCH_TAG_TOKENS = ["<search>", "</search>", "<information>", "</information>"]
TOKENIZER_CORPORA = ("agents", "search_qa")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the one `tokenizers`' ByteLevel uses)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_U2B = {u: b for b, u in _bytes_to_unicode().items()}
_SQRT = "√".encode()          # e2 88 9a
_GRID_ASCII = set(b"#_OXPS")


def _token_bytes(token: str) -> bytes:
    return bytes(_U2B[c] for c in token)


def _joins_grid_cells(b: bytes) -> bool:
    """True if the token with bytes `b` would join a grid cell to another cell or to a line break.

    `b` is read as a sequence of pieces: grid symbols (`√` whole, or a fragment of its UTF-8 bytes at either end)
    and line breaks. A token made only of such pieces, with at least one grid piece and at least two pieces in all
    (`##`, `_P`, `#` + newline), is never created, so a grid row is one token per cell (and each line break is a
    token of its own).
    """
    grid, other, i = 0, 0, 0
    if not b.startswith(_SQRT):
        for frag in (_SQRT[1:], _SQRT[2:]):
            if b.startswith(frag):
                grid, i = 1, len(frag)
                break
    while i < len(b):
        if b[i:i + 3] == _SQRT:
            i += 3
            grid += 1
        elif b[i] in _GRID_ASCII:
            i += 1
            grid += 1
        elif b[i] in b"\r\n":
            i += 1
            other += 1
        elif _SQRT.startswith(b[i:]):
            i = len(b)
            grid += 1
        else:
            return False
    return grid >= 1 and grid + other >= 2


# Qwen2's pre-tokenizer regex. transformers 5 loads every `model_type: qwen2` directory with `Qwen2Tokenizer`, which
# rebuilds this exact pipeline (NFC, this split, byte-level BPE) around the saved vocab and merges; the tiny
# tokenizer is trained and saved with the same pipeline, so it tokenizes identically however it is loaded.
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                           r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def _corpus_spec(corpus: str, seed: int) -> tuple[list[str], list[str], int]:
    """(training documents, added tag tokens, total vocab size) of a tokenizer corpus."""
    if corpus == "agents":
        return build_corpus(seed), list(TAG_TOKENS), VOCAB_SIZE
    if corpus == "search_qa":
        from ragen_turn.envs.search_qa.kb import tokenizer_corpus

        rng = random.Random(seed)
        docs = tokenizer_corpus()
        docs += [" ".join(rng.sample(SEARCH_QA_CHAT, 4)) for _ in range(200)]
        return docs, TAG_TOKENS + SEARCH_TAG_TOKENS, 2048
    raise ValueError(f"tiny model: tokenizer_corpus must be one of {list(TOKENIZER_CORPORA)}, got {corpus!r}")


def build_tokenizer_object(seed: int = 0, corpus: str = "agents"):
    """Train and return a `tokenizers.Tokenizer` on `corpus` (deterministic)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    def bpe(vocab=None, merges=None):
        return models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                          end_of_word_suffix="", fuse_unk=False, byte_fallback=False)

    def fresh(model):
        tok = Tokenizer(model)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        return tok

    docs, tags, vocab_size = _corpus_spec(corpus, seed)
    n_merges_target = vocab_size - 256 - len(SPECIAL_TOKENS) - len(tags)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size + 200, min_frequency=2, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok = fresh(bpe())
    # the tags are kept out of the BPE (they are added tokens); strip them from the training text
    for t in tags:
        docs = [d.replace(t, "\n") for d in docs]
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))

    spec = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = spec["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["merges"]]
    base = sorted((t for t in vocab if t not in SPECIAL_TOKENS), key=vocab.__getitem__)[:256]
    known = set(base)
    kept: list[tuple[str, str]] = []
    for a, b in merges:
        if len(kept) >= n_merges_target:
            break
        if a not in known or b not in known or _joins_grid_cells(_token_bytes(a + b)):
            continue
        kept.append((a, b))
        known.add(a + b)
    new_vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for t in base + [a + b for a, b in kept]:
        if t not in new_vocab:
            new_vocab[t] = len(new_vocab)
    tok = fresh(bpe(new_vocab, kept))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in tags])

    # the promises in the module docstring
    singles = ACTION_WORDS + [" " + w for w in ACTION_WORDS] + [ACTION_SEP, " " + ACTION_SEP, "√"] \
        if corpus == "agents" else []
    for text in singles + tags:
        assert len(tok.encode(text).ids) == 1, f"tiny tokenizer: {text!r} is not a single token"
    return tok


def build_tokenizer(seed: int = 0, corpus: str = "agents"):
    """The `tiny` tokenizer as a `transformers.PreTrainedTokenizerFast` (ChatML template, left padding)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer_object(seed, corpus),
        eos_token=IM_END, pad_token=PAD_TOKEN, bos_token=None, unk_token=None,
        padding_side="left", truncation_side="left", model_max_length=2048,
        clean_up_tokenization_spaces=False, chat_template=CHAT_TEMPLATE)


