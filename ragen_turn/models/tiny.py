"""The embedded `tiny` model: a local byte-level BPE tokenizer + a small randomly initialised Qwen2/Llama.

Nothing is downloaded. The tokenizer is trained with the `tokenizers` library on a corpus generated here
(Sokoban / WebShop agent prompts, grids, page text, digits), deterministically: the same code gives the same
`tokenizer.json` every time. Properties the rest of the project relies on:

- byte-level BPE, so any text encodes and `decode(encode(text)) == text`;
- ChatML special tokens `<|endoftext|>` (id 0, pad), `<|im_start|>` (id 1), `<|im_end|>` (id 2, eos), and a
  ChatML `chat_template` (no default system prompt), so the rollout code calls `apply_chat_template` for every model
  alike; `padding_side="left"` for generation;
- the Sokoban cell symbols `# _ O X √ P S` are one token per cell in a grid row, rows written without spaces as
  RAGEN renders them (no BPE merge joins two grid symbols, or a symbol and a line break: `_joins_grid_cells`),
  while ordinary words such as `State` or `Sokoban` still tokenize normally;
- `<think>`, `</think>`, `<answer>`, `</answer>` are added (non-special) tokens; `Up`, `Down`, `Left`, `Right` and
  `||` are single BPE tokens both with and without a leading space (`Up`, ` Up`);
- digits are split one per token; the pipeline is Qwen2's (NFC, Qwen2's split regex, byte-level BPE).

`tokenizer_corpus: search_qa` (set by `env=search_qa`) trains the same pipeline on the search-QA env's text instead
(passages and questions of a synthetic knowledge base with other names than the shipped one), with 2048 tokens and
`<search>`, `</search>`, `<information>`, `</information>` added as well (the Sokoban promises above do not hold).
"""
from __future__ import annotations

import hashlib
import json
import random
from typing import Any, Mapping

# Bump when the corpus or the tokenizer recipe changes: it is part of the cache key.
TOKENIZER_VERSION = 1

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]          # ids 0, 1, 2 (same ids as SmolLM2)
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
GRID_SYMBOLS = "#_OX√PS"
ACTION_WORDS = ["Up", "Down", "Left", "Right"]
ACTION_SEP = "||"
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
# Copies of the prompt text a search-QA episode shows (system prompt, user message, the env's feedback, the warm
# start's think lines). They stay copies: generating them from the live code would retrain the tokenizer whenever
# that text changes. tests/test_tiny_corpus.py fails when a copy no longer matches the real text.
SEARCH_QA_CHAT = ["You are a helpful agent.", "Turn 1:", "State:", "You have 3 turns left.", "Reward: 0.00",
                  "Invalid response: no <search> ... </search> or <answer> ... </answer> found.",
                  "<think>I need to look this up.</think>", "<think>I know the answer now.</think>"]

DEFAULT_CONFIG: dict[str, Any] = {
    "arch": "qwen2",                  # or "llama"
    "tokenizer_corpus": "agents",     # see TOKENIZER_CORPORA
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "seed": 0,
    "copy_pretrain_steps": 0,         # steps of the synthetic copy task after init (ragen_turn.models.copy_pretrain)
    "copy_pretrain_max_gap": 30,      # its longest distance between a span and its repeat
    "copy_pretrain_small_alphabet": 0.0,  # its fraction of rows drawn from a few tokens (IDs: match on several)
}


# ----------------------------------------------------------------------------------------------------------------
# corpus
# ----------------------------------------------------------------------------------------------------------------
_SOKOBAN_SYSTEM = [
    "You are a helpful assistant. You first think about the reasoning process and then give the answer.",
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
    "When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box through a wall, and you cannot pull a box.",
    "The meaning of each symbol in the state is:\n#: wall, _: empty, O: target, √: box on target, X: box, "
    "P: player, S: player on target",
    "Symbols: # Wall | _ Floor | O Target | X Box | P You | √ Box on Target | S You on Target",
    "Your available actions are:\nUp, Down, Left, Right",
    "You can make up to {n} actions, separated by the action separator \" || \"",
    "Rules: push boxes only, no pulling. Avoid walls. Do not push a box into a corner.",
    "Rewards: -0.1 per move, +1.0 for a box on a target, +10.0 when all boxes are placed. "
    "Format penalty: -0.1 for an invalid answer.",
    "Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> with no extra text. "
    "Strictly follow this format. Max response length: {m} words (tokens).",
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>",
    "The observation is a 2D grid of the current state of the Sokoban game.",
    "Decide your next action(s).",
]

_WEBSHOP_SYSTEM = [
    "You are browsing an online shop. Based on the instruction, find the product that matches the description. "
    "You need to a) first search for the product, b) click the product you want, c) select its options, "
    "and d) click Buy Now.",
    "Your available actions are: search[keywords], click[value]. Only click values shown on the page.",
    "Instruction: i need a {adj} {noun}, and price lower than {price} dollars",
    "Instruction: i am looking for {color} {noun} in size {size}, and price lower than {price} dollars",
    "Instruction: find me a {adj} {color} {noun} for {who}, with price lower than {price} dollars",
    "Available actions: {actions}",
    "You have {n} actions left.",
]

_THOUGHTS = [
    "The box is {dir} of me and the target is {dir2}, so I should push it {dir3}.",
    "I am {dir} of the box. I need to go around it first.",
    "Moving {dir3} pushes the box onto the target.",
    "There is a wall {dir}, so I cannot move that way.",
    "The player should move {dir3} to reach the box.",
    "I should search for the product first.",
    "This product matches the color and the size, so I will click it.",
    "The price is lower than the budget. I will select the options and buy now.",
    "None of these results match. I will go to the next page.",
    "I need to go back to search and try other keywords.",
]

_DIRS = ["above", "below", "left", "right", "up", "down"]

_PRODUCT_WORDS = (
    "shirt t-shirt dress pants jeans shorts skirt jacket coat hoodie sweater socks shoes sneakers boots sandals "
    "hat cap bag backpack wallet watch necklace bracelet earrings ring sunglasses scarf gloves belt "
    "hair extension wig shampoo conditioner lotion cream serum mask lipstick nail polish perfume brush "
    "phone case charger cable headphones earbuds speaker keyboard mouse monitor laptop tablet camera "
    "pillow blanket sheet curtain rug lamp chair table desk shelf mirror candle vase frame towel "
    "coffee tea snack cookies chocolate candy nuts chips sauce spice oil honey protein vitamin "
    "toy puzzle game book pen notebook bottle cup mug plate bowl knife pan pot kettle "
    "women men girls boys baby kids unisex adult "
    "cotton leather wool silk polyester linen denim plastic metal wood glass ceramic steel "
    "natural organic vegan gluten free sugar free long short slim loose fit soft lightweight waterproof "
    "wireless portable rechargeable machine washable non-slip easy to clean high quality"
).split()
_COLORS = "black white red blue green yellow pink purple grey gray brown beige navy gold silver multicolor".split()
_SIZES = "x-small small medium large x-large xx-large 3x-large one size 6 7 8 9 10 11 12 32 34 36".split()
_WHO = ["women", "men", "kids", "my daughter", "my son", "a gift", "the office", "travel", "the kitchen"]
_PAGE_WORDS = [
    "Back to Search", "Next >", "< Prev", "Buy Now", "Description", "Features", "Reviews", "Attributes",
    "Rating: N.A.", "Price:", "Page 1 (Total results: 50)", "size", "color", "style", "flavor name",
    "Instruction:", "[SEP]", "WebShop",
]


def _grid(rng: random.Random, rows: int, cols: int) -> list[str]:
    """Random Sokoban-like rows: walls around, floor inside, a few boxes/targets/player."""
    out = ["#" * cols]
    for _ in range(rows - 2):
        inner = [rng.choice("_______#OX√PS") for _ in range(cols - 2)]
        out.append("#" + "".join(inner) + "#")
    out.append("#" * cols)
    return out


def _asin(rng: random.Random) -> str:
    return "B0" + "".join(rng.choice("0123456789ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(8))


def _price(rng: random.Random) -> str:
    return f"{rng.randint(1, 199)}.{rng.randint(0, 99):02d}"


def _product_title(rng: random.Random) -> str:
    return " ".join(rng.choice(_PRODUCT_WORDS) for _ in range(rng.randint(3, 9))).title() if rng.random() < 0.5 \
        else " ".join(rng.choice(_PRODUCT_WORDS) for _ in range(rng.randint(3, 9)))


def _actions(rng: random.Random, k: int, sep: str = " || ") -> str:
    return sep.join(rng.choice(ACTION_WORDS) for _ in range(k))


def build_corpus(seed: int = 0, n_episodes: int = 300) -> list[str]:
    """Deterministic training text for the BPE (a list of documents)."""
    rng = random.Random(seed)
    docs: list[str] = []
    fill = lambda s: s.format(  # noqa: E731
        n=rng.randint(1, 10), m=rng.choice([50, 100, 128, 200]), adj=rng.choice(_PRODUCT_WORDS),
        noun=rng.choice(_PRODUCT_WORDS), color=rng.choice(_COLORS), size=rng.choice(_SIZES),
        price=_price(rng), who=rng.choice(_WHO), dir=rng.choice(_DIRS), dir2=rng.choice(_DIRS),
        dir3=rng.choice(ACTION_WORDS).lower(),
        actions=", ".join(rng.sample(["search[...]", "click[back to search]", "click[next >]",
                                      "click[< prev]", "click[buy now]", "click[description]"], 3)))
    # Sokoban episodes in RAGEN's context format
    for _ in range(n_episodes):
        parts = [fill(s) for s in _SOKOBAN_SYSTEM if rng.random() < 0.7]
        size = rng.choice([(6, 6), (8, 8), (7, 7), (6, 8)])
        for turn in range(1, rng.randint(2, 6)):
            grid = "\n".join(_grid(rng, *size))
            left = rng.randint(1, 20)
            parts.append(f"Turn {turn}:\nState:\n{grid}\nYou have {left} actions left. "
                         f"Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> "
                         f"with no extra text. Strictly follow this format. Max response length: 100 words (tokens).")
            k = rng.randint(1, 4)
            sep = rng.choice([" || ", " || ", "||", ", "])
            thought = " ".join(fill(rng.choice(_THOUGHTS)) for _ in range(rng.randint(1, 2)))
            parts.append(f"<think>{thought}</think><answer>{_actions(rng, k, sep)}</answer>")
            parts.append(f"<think> {thought} </think> <answer> {_actions(rng, k, sep)} </answer>")
            parts.append(f"Reward:\n{rng.choice(['-0.1', '0.9', '-0.2', '10.9', '0', '-1', '1.0', '0.0'])}\n")
        docs.append("\n".join(parts))
    # WebShop episodes
    for _ in range(n_episodes):
        parts = [fill(s) for s in _WEBSHOP_SYSTEM if rng.random() < 0.7]
        query = " ".join(rng.choice(_PRODUCT_WORDS + _COLORS) for _ in range(rng.randint(2, 6)))
        results = []
        for _ in range(rng.randint(2, 6)):
            results += [_asin(rng), _product_title(rng), "$" + _price(rng)]
        page = " [SEP] ".join(["Back to Search", f"Page {rng.randint(1, 5)} (Total results: {rng.randint(1, 50)})",
                               "Next >"] + results)
        item = " [SEP] ".join(["Back to Search", "< Prev", rng.choice(["size", "color", "style"])]
                              + rng.sample(_SIZES, 3) + rng.sample(_COLORS, 3)
                              + [_product_title(rng), f"Price: ${_price(rng)}", "Rating: N.A.", "Description",
                                 "Features", "Reviews", "Buy Now"])
        parts += [
            f"Instruction: [SEP] {fill(rng.choice(_WEBSHOP_SYSTEM[2:5]))[13:]} [SEP] Search",
            f"<think>{fill(rng.choice(_THOUGHTS[5:]))}</think><answer>search[{query}]</answer>",
            f"Instruction: [SEP] {page}",
            f"<think>{fill(rng.choice(_THOUGHTS[5:]))}</think><answer>click[{results[0].lower()}]</answer>",
            f"Instruction: [SEP] {item}",
            f"<answer>click[{rng.choice(_SIZES)}]</answer> <answer>click[{rng.choice(_COLORS)}]</answer> "
            f"<answer>click[buy now]</answer> <answer>click[Buy Now]</answer> <answer>click[next >]</answer> "
            f"<answer>click[back to search]</answer> <answer>click[< prev]</answer>",
            "Reward:\n" + rng.choice(["0", "0.5", "1.0", "0.75", "0.33"]),
            " ".join(rng.choice(_PAGE_WORDS) for _ in range(5)),
        ]
        docs.append("\n".join(parts))
    # digits, numbers and a little generic English
    docs.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(2000)))
    docs.append(" ".join(f"{rng.randint(-20, 20) / 10:.1f}" for _ in range(500)))
    generic = ("the a an and or of to in on at for with is are was be it this that I you we they he she "
               "not no yes can will should must need go move push pull box wall target player step turn state "
               "action actions reward done success valid invalid format answer think search click product page "
               "first then next last only all each one two three four five left right up down above below "
               "User Assistant System user assistant system").split()
    for _ in range(200):
        docs.append(" ".join(rng.choice(generic) for _ in range(30)).capitalize() + ".")
    return docs


# ----------------------------------------------------------------------------------------------------------------
# tokenizer
# ----------------------------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------------------------------------------
def tiny_config(model_cfg: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """DEFAULT_CONFIG updated with the architecture keys present in `model_cfg`."""
    cfg = dict(DEFAULT_CONFIG)
    for k in DEFAULT_CONFIG:
        if model_cfg is not None and model_cfg.get(k) is not None:
            cfg[k] = model_cfg.get(k)
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "max_position_embeddings", "seed", "copy_pretrain_steps", "copy_pretrain_max_gap"):
        cfg[k] = int(cfg[k])
    cfg["copy_pretrain_small_alphabet"] = float(cfg["copy_pretrain_small_alphabet"])
    cfg["tie_word_embeddings"] = bool(cfg["tie_word_embeddings"])
    cfg["tokenizer_corpus"] = str(cfg["tokenizer_corpus"])
    if cfg["tokenizer_corpus"] not in TOKENIZER_CORPORA:
        raise ValueError(f"tiny model: tokenizer_corpus must be one of {list(TOKENIZER_CORPORA)}, "
                         f"got {cfg['tokenizer_corpus']!r}")
    cfg["rope_theta"] = float(cfg["rope_theta"])
    cfg["arch"] = str(cfg["arch"]).lower()
    if cfg["arch"] not in ("qwen2", "llama"):
        raise ValueError(f"tiny model: arch must be 'qwen2' or 'llama', got {cfg['arch']!r}")
    return cfg


def config_hash(cfg: Mapping[str, Any]) -> str:
    cfg = dict(cfg)
    # defaults keep the hash they had before their key existed
    if cfg.get("tokenizer_corpus", "agents") == "agents":
        cfg.pop("tokenizer_corpus", None)
    if not cfg.get("copy_pretrain_steps", 0):  # no copy task: its knobs change nothing
        for k in ("copy_pretrain_steps", "copy_pretrain_max_gap", "copy_pretrain_small_alphabet"):
            cfg.pop(k, None)
    for k in ("copy_pretrain_max_gap", "copy_pretrain_small_alphabet"):
        if cfg.get(k) == DEFAULT_CONFIG[k]:
            cfg.pop(k, None)
    blob = json.dumps({**cfg, "tokenizer_version": TOKENIZER_VERSION, "vocab_size": VOCAB_SIZE}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_model(cfg: Mapping[str, Any], tokenizer, log=print):
    """The causal LM (float32) for `cfg` (see `tiny_config`): randomly initialised, seeded with `cfg['seed']`, then
    `cfg['copy_pretrain_steps']` steps of the synthetic copy task (`ragen_turn.models.copy_pretrain`) when > 0."""
    import torch
    from transformers import GenerationConfig

    if cfg["arch"] == "llama":
        from transformers import LlamaConfig as Config, LlamaForCausalLM as Model
    else:
        from transformers import Qwen2Config as Config, Qwen2ForCausalLM as Model
    if cfg["hidden_size"] % cfg["num_attention_heads"] or cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise ValueError("tiny model: hidden_size must divide by num_attention_heads, and num_attention_heads by "
                         f"num_key_value_heads; got {cfg}")
    config = Config(
        vocab_size=len(tokenizer), hidden_size=cfg["hidden_size"], num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=cfg["num_key_value_heads"],
        intermediate_size=cfg["intermediate_size"], max_position_embeddings=cfg["max_position_embeddings"],
        tie_word_embeddings=cfg["tie_word_embeddings"], rope_theta=cfg["rope_theta"],
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg["seed"])
        model = Model(config).float()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    if cfg.get("copy_pretrain_steps", 0) > 0:
        from .copy_pretrain import copy_pretrain

        copy_pretrain(model, tokenizer, cfg["copy_pretrain_steps"], seed=cfg["seed"], log=log,
                      max_gap=cfg["copy_pretrain_max_gap"], small_alphabet=cfg["copy_pretrain_small_alphabet"])
    return model.eval()
