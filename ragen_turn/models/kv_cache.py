"""The decode cache of batched sampling (``actor_rollout_ref.rollout.decode``), shared by the local engine's sampler
and verl's hf rollout.

- ``dynamic``: the cache grows by one slot a step (transformers' ``DynamicCache``);
- ``static``: after the prefill the keys/values move into a cache of fixed length (prefill width + the most new
  tokens, rounded up to ``STATIC_BUCKET``; ``StaticCache``), and the attention mask is one fixed-size tensor
  written in place: every decode step has the same shapes and memory addresses;
- ``compiled``: ``static`` with the decode step through ``torch.compile`` (``mode="reduce-overhead"`` on CUDA:
  CUDA graphs, one launch a step in place of a handful of kernels per layer).

The samples are the same for a seed in every mode; the logits agree to float rounding.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import torch

DECODES = ("dynamic", "static", "compiled")
STATIC_BUCKET = 64  # static caches' lengths are multiples of this, so a compiled step sees few shapes


def check_decode(decode: str) -> str:
    if decode not in DECODES:
        raise ValueError(f"actor_rollout_ref.rollout.decode must be one of {DECODES}, got {decode!r}")
    return decode


def to_static(model: Any, cache: Any, attn: torch.Tensor, max_new_tokens: int,
              bucket: int = STATIC_BUCKET) -> Optional[Tuple[Any, torch.Tensor]]:
    """The prefill's ``DynamicCache`` (width ``W``) -> ``(StaticCache, attention mask [B, L])`` of length
    ``L = W + max_new_tokens`` rounded up to ``bucket``: slots ``< W`` hold the prefill, the rest are masked until
    written (slot ``W + k`` takes the k-th new token). ``None`` where the model's cache is not plain full attention
    (sliding windows, or a model with a cache of its own): the caller keeps the growing cache."""
    from transformers import StaticCache
    from transformers.cache_utils import DynamicLayer, StaticLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    B, W = attn.shape
    L = -(-(W + max_new_tokens) // bucket) * bucket
    static = StaticCache(config=model.config, max_cache_len=L)
    if len(static.layers) != len(layers) or any(type(x) is not StaticLayer for x in static.layers):
        return None
    for dyn, fixed in zip(layers, static.layers):
        fixed.lazy_initialization(dyn.keys, dyn.values)
        fixed.keys[:, :, :W] = dyn.keys
        fixed.values[:, :, :W] = dyn.values
        fixed.cumulative_length.fill_(W)
    mask = attn.new_zeros(B, L)
    mask[:, :W] = attn
    return static, mask


def feed_back(step: Callable, nxt: torch.Tensor, attn: torch.Tensor, last_pos: torch.Tensor, cache: Any,
              static: bool, slot: int, device: torch.device | str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                              Any]:
    """One decode step of both samplers: the sampled tokens ``nxt [B]`` fed back through ``step`` (the model, or its
    compiled step) at the next position. The mask grows by one column (dynamic cache) or has column ``slot``
    (= prefill width + k for the k-th new token) set in place (``static``: same shape and address every step).
    Returns ``(logits [B, V] of the next token, attn, last_pos [B, 1], cache)``."""
    if static:
        attn[:, slot] = 1
    else:
        attn = torch.cat([attn, attn.new_ones(nxt.shape[0], 1)], dim=1)
    last_pos = last_pos + 1
    out = step(input_ids=nxt[:, None].to(device), attention_mask=attn, position_ids=last_pos,
               past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1], attn, last_pos, (cache if static else out.past_key_values)


def compiled_step(model: Any, device: torch.device | str) -> Callable:
    """``model`` through ``torch.compile`` for the decode step: CUDA graphs on a GPU (``reduce-overhead``)."""
    return torch.compile(model, mode="reduce-overhead" if torch.device(device).type == "cuda" else None)
