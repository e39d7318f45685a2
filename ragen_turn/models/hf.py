"""transformers helpers for every model loader here: dtype names and quiet loading (no logs, no progress bars)."""
from __future__ import annotations

import contextlib
from typing import Any


def dtype_name(dtype: Any) -> str:
    """Normalise a dtype given as a string or torch.dtype: float32 | bfloat16 | float16 | auto."""
    name = str(dtype).replace("torch.", "").lower()
    aliases = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    name = aliases.get(name, name)
    if name not in ("float32", "bfloat16", "float16", "auto"):
        raise ValueError(f"dtype must be one of float32, bfloat16, float16, auto; got {dtype!r}")
    return name


def torch_dtype(dtype: Any):
    """A dtype name (see :func:`dtype_name`) as the torch dtype, or "auto"."""
    import torch

    name = dtype_name(dtype)
    return "auto" if name == "auto" else getattr(torch, name)


@contextlib.contextmanager
def quiet_hf():
    """Silence transformers' info logs and progress bars ("Loading weights ...") for the duration."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
