"""The forward of a plain decoder (Qwen2 / Llama body) whose LAST layer runs only where its output is read.

A causal LM's last layer feeds nothing but the output: its keys and values are read by its own queries, but no
later layer reads its hidden states. So where only some positions' outputs are used (the log-probs of the
response tokens: the position before each; the critic's values before them), that layer's query projection,
attention, output projection and MLP are needed at those positions only; its keys and values at every position.
On the local engine's rows about 4% of the positions are read (Sokoban: ~4 sampled tokens a turn in ~75-token
turns), so for the tiny model (2 layers) the score and update forwards and backwards do a bit more than half the
arithmetic of the full forward. The layers before it run as the model runs them (its own decoder-layer modules,
its own mask); the last one is the same operations (its norms, projections, rotary formula and MLP modules) on
the read positions, with scaled dot-product attention over a boolean mask of the keys each read position sees.
Columns after the last read position of a micro-batch are dropped before the forward (causal: nothing read
depends on them).

Shapes: B rows, T tokens, n read positions (row-major order), m the most read positions of one row, H hidden size.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")


def last_layer_supported(base: Any) -> bool:
    """Whether :func:`hidden_where_read` computes what ``base`` (a Qwen2 / Llama ``*Model`` body) computes: full
    attention in every layer (no sliding window), SDPA or eager attention, one tensor-parallel slice, and a
    transformers with ``masking_utils.create_causal_mask``."""
    cfg = getattr(base, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    if getattr(cfg, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    if len(base.layers) != cfg.num_hidden_layers or len(base.layers) == 0:
        return False
    try:
        from transformers.masking_utils import create_causal_mask  # noqa: F401
    except ImportError:
        return False
    return True


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``apply_rotary_pos_emb`` on one tensor: ``x * cos + rotate_half(x) * sin``."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def read_slots(read: torch.Tensor):
    """``read [B, T]`` bool -> ``(cols [B, m], valid [B, m])``: each row's read columns in ascending order, then
    filler columns (``valid`` False); ``m >= 1``."""
    B, T = read.shape
    counts = read.sum(dim=1)
    m = max(int(counts.max()) if B else 0, 1)
    ar = torch.arange(T, device=read.device)
    cols = torch.where(read, ar, ar + T).argsort(dim=1)[:, :m]                                 # read ones first
    valid = torch.arange(m, device=read.device)[None] < counts[:, None]
    return cols, valid


def hidden_where_read(base: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                      position_ids: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """The body's last hidden state (after its final norm) at the positions ``read`` marks: ``[n, H]`` in
    ``read.nonzero()`` order (row-major).

    Args:
        base: the decoder body (:func:`last_layer_supported`).
        input_ids: ``[B, T]``; position_ids: ``[B, T]``.
        attention_mask: what the model's own forward would get (``None``: plain causal attention, for right-padded
            rows; else ``[B, T]`` 1 on real tokens), used by every layer before the last as the model uses it.
        read: ``[B, T]`` bool, the positions whose output is wanted (real tokens).
    """
    from transformers.masking_utils import create_causal_mask

    read = read.bool()
    B, T = input_ids.shape
    cut = int(read.nonzero()[:, 1].max()) + 1 if bool(read.any()) else 1  # nothing read depends on later columns
    input_ids, position_ids, read = input_ids[:, :cut], position_ids[:, :cut], read[:, :cut]
    if attention_mask is not None:
        attention_mask = attention_mask[:, :cut]
    h = base.embed_tokens(input_ids)                                                          # [B, t, H]
    mask = create_causal_mask(config=base.config, inputs_embeds=h, attention_mask=attention_mask,
                              past_key_values=None, position_ids=position_ids)
    cos, sin = base.rotary_emb(h, position_ids)                                               # [B, t, d]
    layers = base.layers
    for layer in layers[:-1]:  # the model's own layers, as its forward calls them
        h = layer(h, attention_mask=mask, position_embeddings=(cos, sin), position_ids=position_ids,
                  past_key_values=None, use_cache=False)
    cols, valid = read_slots(read)                                                            # [B, m]
    args = (layers[-1], base.config, h, cos, sin, cols, attention_mask)
    if getattr(base, "gradient_checkpointing", False) and base.training and torch.is_grad_enabled():
        h = torch.utils.checkpoint.checkpoint(_last_layer_at, *args, use_reentrant=False)  # as the other layers
    else:
        h = _last_layer_at(*args)
    return base.norm(h)[valid]                                                                # [n, H]


def _last_layer_at(layer: Any, config: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cols: torch.Tensor,
                   attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The decoder's last ``layer`` on the hidden states ``h`` ``[B, t, H]`` (keys and values at every position,
    queries and the MLP at the ``cols`` ``[B, m]`` only): ``[B, m, H]``, before the final norm."""
    att = layer.self_attn
    heads, kv, d = config.num_attention_heads, config.num_key_value_heads, att.head_dim
    x = layer.input_layernorm(h)                                                              # [B, t, H]
    B, t = x.shape[:2]
    ks = _rotate(att.k_proj(x).view(B, t, kv, d).transpose(1, 2), cos[:, None], sin[:, None])  # [B, kv, t, d]
    vs = att.v_proj(x).view(B, t, kv, d).transpose(1, 2)
    if heads != kv:  # transformers' repeat_kv
        ks = ks[:, :, None].expand(B, kv, heads // kv, t, d).reshape(B, heads, t, d)
        vs = vs[:, :, None].expand(B, kv, heads // kv, t, d).reshape(B, heads, t, d)
    m = cols.shape[1]
    rows = torch.arange(B, device=cols.device)[:, None]
    xq, cq, sq = x[rows, cols], cos[rows, cols], sin[rows, cols]                              # [B, m, .]
    qs = _rotate(att.q_proj(xq).view(B, m, heads, d).transpose(1, 2), cq[:, None], sq[:, None])  # [B, heads, m, d]
    keys = torch.arange(t, device=cols.device)
    sees = keys[None, None] <= cols[:, :, None]                                               # [B, m, t]
    if attention_mask is not None:
        sees = sees & attention_mask[:, None, :].bool()
    o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=sees[:, None], scale=att.scaling)  # [B, heads, m, d]
    o = att.o_proj(o.transpose(1, 2).reshape(B, m, heads * d))
    h = h[rows, cols] + o                                                                     # [B, m, H]
    h = h + layer.mlp(layer.post_attention_layernorm(h))
    return h
