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
from typing import Any, Mapping

from .tiny_tokenizer import TOKENIZER_CORPORA, TOKENIZER_VERSION, VOCAB_SIZE

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
