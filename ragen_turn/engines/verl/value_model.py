"""The critic's model on verl without flash-attn or trl: a wrapper of verl's value-head loader.

verl 0.9.1 builds its critic with ``verl.utils.model.load_valuehead_model``, which hard-codes
``attn_implementation="flash_attention_2"`` and, when that load fails, asks for ``trl``. verl has no
hook for this loader, so importing this module (every Ray worker does: it is one of the
engine's ``VERL_USE_EXTERNAL_MODULES``) replaces that one function in ``verl.utils.model`` with
:func:`load_value_model`, which verl's FSDP engine looks up when it builds the critic. It loads the
same class verl's first attempt loads (``AutoModelForTokenClassification``, ``num_labels=1``) with
:func:`attn_implementation` (``flash_attention_2`` only when flash-attn is importable and a GPU is
there, else ``sdpa``), and zero-initialises a value head the checkpoint does not hold, like the local
engine's critic (a fresh critic predicts 0). Models without a token-classification class still go
to verl's own loader (its ``trl`` path).
"""
from __future__ import annotations

import importlib.util
from typing import Any

import torch

from ragen_turn.engines.verl.replace import replace_verl_function

FLASH_ATTENTION = "flash_attention_2"
SDPA = "sdpa"


def attn_implementation(device: str = "cuda") -> str:
    """``flash_attention_2`` on a GPU with flash-attn installed, else PyTorch's ``sdpa``."""
    if device != "cpu" and importlib.util.find_spec("flash_attn") is not None:
        return FLASH_ATTENTION
    return SDPA


def load_value_model(local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool = False):
    """verl's ``load_valuehead_model`` signature: a ``*ForTokenClassification`` with one label.

    The attention implementation is the one ``model_config`` carries (verl's ``HFModelConfig`` sets it
    from ``override_config.attn_implementation``) unless that is flash-attn without flash-attn installed.
    """
    from transformers import AutoModelForTokenClassification

    attn = getattr(model_config, "_attn_implementation", None) or SDPA
    if attn == FLASH_ATTENTION and importlib.util.find_spec("flash_attn") is None:
        attn = SDPA
    if type(model_config) not in AutoModelForTokenClassification._model_mapping.keys():
        return _VERL_LOADER(local_path, torch_dtype, model_config, trust_remote_code)
    model_config.num_labels = 1
    model, info = AutoModelForTokenClassification.from_pretrained(
        local_path, dtype=torch_dtype, config=model_config, attn_implementation=attn,
        trust_remote_code=trust_remote_code, output_loading_info=True)
    head = _head(model)
    missing = set(info.get("missing_keys", ()))
    if head is not None and any(k.startswith(head[0] + ".") for k in missing):
        with torch.no_grad():
            for p in head[1].parameters():
                p.zero_()
    return model


def _head(model: torch.nn.Module):
    """``(name, module)`` of the token-classification head (``score`` for Qwen2/Llama, ``classifier`` others)."""
    for name in ("score", "classifier"):
        mod = getattr(model, name, None)
        if isinstance(mod, torch.nn.Module):
            return name, mod
    return None


# verl's own loader, for the models our loader leaves to it
_VERL_LOADER = replace_verl_function("verl.utils.model", "load_valuehead_model", load_value_model)
