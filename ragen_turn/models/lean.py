"""A lean forward of plain decoder LMs (the Qwen2 / Llama families: the tiny model, SmolLM2) over one preallocated
key/value buffer: the local sampler's prefill and decode steps without a transformers ``Cache``.

What it saves, per step, against the model's own forward with a ``DynamicCache``: the cache grows by
``torch.cat`` (a copy of every key and value each step), keys/values are repeated per query head (``repeat_kv``),
a 4-D mask is built per call; here keys/values are written in place into ``[B, kv_heads, L, head_dim]`` buffers,
the query heads of one key/value head attend together (``[B, kv_heads, groups x q, head_dim]``: no repeat), and the
rotary table is computed once per model. The arithmetic is the model's own (same weights, same operations in the
same order: RMSNorm in float32, rotary, scaled dot-product attention over the real keys, SiLU MLP, the output
projection at the last position); the logits equal the model's to float rounding (``tests/test_local_engine.py``).

Shapes: B rows, q new tokens, L buffer slots, H hidden size, V vocabulary.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F

LEAN_MODEL_TYPES = ("qwen2", "llama")


def lean_supported(model: Any) -> bool:
    """Whether :class:`LeanLM` computes exactly what ``model`` does: a Qwen2 / Llama ``*ForCausalLM`` with full
    attention everywhere, default rotary embedding, SiLU MLP, one tensor-parallel slice, no sliding window."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in LEAN_MODEL_TYPES:
        return False
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if (rope.get("rope_type") or rope.get("type") or "default") != "default":
        return False
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "hidden_act", "silu") != "silu":
        return False
    if getattr(cfg, "pretraining_tp", 1) != 1 or getattr(cfg, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    base = getattr(model, "model", None)
    return base is not None and hasattr(base, "rotary_emb") and hasattr(model, "lm_head")


class KVBuffer:
    """Keys and values of every layer, ``keys[l]``, ``values[l]``: ``[B, kv_heads, L, head_dim]``, written in place."""

    def __init__(self, keys: List[torch.Tensor], values: List[torch.Tensor]):
        self.keys, self.values = keys, values

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[2])

    @property
    def rows(self) -> int:
        return int(self.keys[0].shape[0])

    def select_rows(self, rows: torch.Tensor) -> "KVBuffer":
        """A new buffer (same length) holding ``rows`` of this one."""
        return KVBuffer([k.index_select(0, rows) for k in self.keys], [v.index_select(0, rows) for v in self.values])


class LeanLM:
    """The forward of ``model`` (:func:`lean_supported`) on a :class:`KVBuffer`. It reads the model's parameters
    at every call (never copies them), so an optimizer step or a loaded checkpoint is seen at once."""

    def __init__(self, model: Any):
        if not lean_supported(model):
            raise ValueError(f"LeanLM: {type(model).__name__} is not a plain Qwen2/Llama decoder")
        self.model = model
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.groups = self.heads // self.kv_heads
        self.scaling = self.head_dim ** -0.5
        self._rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def new_buffer(self, rows: int, length: int) -> KVBuffer:
        p = self.model.model.embed_tokens.weight
        shape = (rows, self.kv_heads, length, self.head_dim)
        n = len(self.model.model.layers)
        return KVBuffer([p.new_empty(shape) for _ in range(n)], [p.new_empty(shape) for _ in range(n)])

    def rope(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``[max_positions, head_dim]``: the model's rotary module at every position (each entry
        is one product of a frequency and a position, the same numbers the model computes per call)."""
        if self._rope is None:
            base = self.model.model
            n = int(self.model.config.max_position_embeddings)
            p = base.embed_tokens.weight
            pos = torch.arange(n, device=p.device)[None]
            with torch.no_grad():
                cos, sin = base.rotary_emb(p.new_zeros(1, n, 1), pos)
            self._rope = (cos[0], sin[0])
        return self._rope

    @staticmethod
    def _rms(x: torch.Tensor, norm: Any) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return norm.weight * x.to(dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, buf: KVBuffer, start: int,
                mask: torch.Tensor) -> torch.Tensor:
        """Run ``input_ids [B, q]`` (at ``position_ids [B, q]``), writing their keys/values into slots
        ``start .. start + q`` of ``buf``; ``mask [B, 1, q, start + q]`` (bool, True = attend) says which slots each
        new token sees. Returns the logits at the last position ``[B, V]``."""
        B, q = input_ids.shape
        end = start + q
        base = self.model.model
        cos_t, sin_t = self.rope()
        cos, sin = cos_t[position_ids][:, None], sin_t[position_ids][:, None]            # [B, 1, q, d]
        if self.groups > 1 and q > 1:  # the query heads of one kv head attend as one block of groups x q rows
            mask = mask.unsqueeze(2).expand(B, 1, self.groups, q, end).reshape(B, 1, self.groups * q, end)
        h = base.embed_tokens(input_ids)                                                  # [B, q, H]
        for i, layer in enumerate(base.layers):
            att = layer.self_attn
            x = self._rms(h, layer.input_layernorm)
            qs = att.q_proj(x).view(B, q, self.heads, self.head_dim).transpose(1, 2)     # [B, heads, q, d]
            ks = att.k_proj(x).view(B, q, self.kv_heads, self.head_dim).transpose(1, 2)
            vs = att.v_proj(x).view(B, q, self.kv_heads, self.head_dim).transpose(1, 2)
            qs, ks = self._rotate(qs, cos, sin), self._rotate(ks, cos, sin)
            buf.keys[i][:, :, start:end] = ks
            buf.values[i][:, :, start:end] = vs
            qg = qs.reshape(B, self.kv_heads, self.groups * q, self.head_dim)
            o = F.scaled_dot_product_attention(qg, buf.keys[i][:, :, :end], buf.values[i][:, :, :end],
                                               attn_mask=mask, scale=self.scaling)       # [B, kv, g*q, d]
            o = o.reshape(B, self.heads, q, self.head_dim).transpose(1, 2).reshape(B, q, -1)
            h = h + att.o_proj(o)
            x = self._rms(h, layer.post_attention_layernorm)
            mlp = layer.mlp
            h = h + mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        last = self._rms(h[:, -1], base.norm)                                             # [B, H]
        return self.model.lm_head(last)
