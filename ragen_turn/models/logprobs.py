"""Per-token log-probabilities (and entropies) of a causal LM, and the position ids they are read at.

Shapes: B = batch, T = tokens, V = vocabulary, H = hidden size. Masks are 0/1 integer or bool tensors.
"""
from __future__ import annotations

import torch

from .last_layer import hidden_where_read, last_layer_supported


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """position_ids[B, T] = (number of real tokens before t), 0 on padding; what HF `generate` uses, so left-padded
    (or right-padded) batches give the same logits as the unpadded sequences."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def model_mask(attention_mask: torch.Tensor, causal: bool) -> torch.Tensor | None:
    """The attention mask to give the model: ``None`` when ``causal`` and every row is right-padded (ones, then
    zeros), so that it runs plain causal attention (SDPA's causal kernel: no ``[B, 1, T, T]`` mask built or read,
    key blocks above the diagonal skipped, no key/value heads repeated; with :func:`model_inputs`' position ids). Every
    real token then attends to the same keys as under the mask (pad positions see earlier pads, and nothing reads
    them); log-probs and gradients equal the masked ones' to float rounding (``tests/test_local_engine.py``). Else
    ``attention_mask`` itself."""
    if causal and attention_mask.dim() == 2 and bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all()):
        return None
    return attention_mask


def model_inputs(attention_mask: torch.Tensor, position_ids: torch.Tensor, causal: bool):
    """``(mask, position_ids)`` to give the model: :func:`model_mask`, and where it is ``None`` (right-padded rows,
    plain causal attention) the padding's position ids continue its row's count (``n, n + 1, ...`` after ``n`` real
    tokens; the real tokens keep theirs). transformers (>= 5) reads position ids that do not rise by 1 as packed
    sequences and then builds a ``[B, 1, T, T]`` mask (and SDPA runs its masked kernel over every key block):
    ``positions_from_mask`` repeats the last position on the padding, which did that for every micro-batch with
    rows of different lengths. Nothing reads a pad position's output, and no real token attends to a later one."""
    mask = model_mask(attention_mask, causal)
    if mask is None and attention_mask.dim() == 2:
        steps = torch.arange(attention_mask.shape[1], device=position_ids.device).expand_as(position_ids)
        position_ids = torch.where(attention_mask.bool(), position_ids, steps)
    return mask, position_ids


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer body of a `*ForCausalLM` (its `.base_model`, e.g. `.model`), or `model` itself."""
    base = getattr(model, "base_model", None)
    return base if isinstance(base, torch.nn.Module) and base is not model else model


def sequence_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor | None = None, temperature: float = 1.0,
                      return_entropy: bool = False, chunk_tokens: int = 4096,
                      token_mask: torch.Tensor | None = None, causal: bool = False, last_layer_read: bool = False):
    """Per-token log-probabilities of `input_ids` under the causal LM `model`.

    Args:
        input_ids: [B, T] token ids.
        attention_mask: [B, T], 1 on real tokens, 0 on padding (left or right).
        position_ids: [B, T] or None (then `positions_from_mask(attention_mask)`, as HF `generate` does).
        temperature: logits are divided by it (use the sampling temperature so ratios match the rollout).
        return_entropy: also return the entropy of each predictive distribution.
        chunk_tokens: positions processed at once when reducing over V (bounds the float32 working memory to
            about chunk_tokens x V).
        token_mask: [B, T] or None. If given, only the tokens it marks (e.g. the response tokens) are scored and
            the output is 0 elsewhere; for a model whose logits are a plain `lm_head(hidden)` (Llama, Qwen2,
            ...) the vocabulary projection then runs on those positions only, not on all B x T.
        causal: right-padded rows run plain causal attention (:func:`model_mask`).
        last_layer_read: with `token_mask`, on a plain Qwen2 / Llama decoder, the last layer runs only at the
            positions the scored tokens are read from (:mod:`ragen_turn.models.last_layer`): the same numbers to
            float rounding, a bit more than half the arithmetic of a 2-layer model. Ignored where unsupported.

    Returns:
        logp [B, T] float32: `logp[:, t] = log p(input_ids[:, t] | input_ids[:, :t])`; `logp[:, 0] = 0`, and 0
        wherever token t or token t-1 is padding.
        If `return_entropy`: `(logp, entropy)`, entropy [B, T] float32 aligned the same way (the entropy of the
        distribution that token t was drawn from), 0 at the same positions.

    Memory: without `token_mask`, one [B, T, V] logits tensor in the model's dtype; the log-softmax is never
    materialised (logsumexp + gather per chunk, in float32). Gradients flow through both outputs.
    """
    logp, ent, _ = _logprobs(model, input_ids, attention_mask, position_ids, temperature, return_entropy,
                             chunk_tokens, token_mask, want_hidden=False, causal=causal,
                             last_layer_read=last_layer_read)
    return (logp, ent) if return_entropy else logp


def logprobs_and_hidden(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        position_ids: torch.Tensor | None = None, temperature: float = 1.0, chunk_tokens: int = 4096,
                        token_mask: torch.Tensor | None = None, causal: bool = False):
    """One forward of the causal LM: `(logp[B,T], entropy[B,T], hidden[B,T,H])` (as `sequence_logprobs` with
    `return_entropy`, plus the backbone's last hidden state, after its final norm, for a value head on it)."""
    return _logprobs(model, input_ids, attention_mask, position_ids, temperature, True, chunk_tokens, token_mask,
                     want_hidden=True, causal=causal)


PLAIN_HEAD_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def plain_lm_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The output projection of a causal LM whose logits are exactly `lm_head(last hidden state)` (no logit
    scaling or soft-capping: the model types in `PLAIN_HEAD_MODEL_TYPES`), else None."""
    cfg = getattr(model, "config", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if cfg is None or getattr(cfg, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    if not isinstance(head, torch.nn.Linear) or base_model(model) is model:
        return None
    return head


def _logprobs(model, input_ids, attention_mask, position_ids, temperature, return_entropy, chunk_tokens, token_mask,
              want_hidden: bool, causal: bool = False, last_layer_read: bool = False):
    """``(logp [B,T], entropy [B,T] | None, hidden [B,T,H] | None)``: the one implementation behind both above."""
    if position_ids is None:
        position_ids = positions_from_mask(attention_mask)
    head = plain_lm_head(model) if token_mask is not None else None
    mask, position_ids = model_inputs(attention_mask, position_ids, causal)
    if head is not None and last_layer_read and not want_hidden and last_layer_supported(base_model(model)):
        want = scored_positions(input_ids, attention_mask, token_mask)                      # [B, T]
        read = torch.zeros_like(want)
        read[:, :-1] = want[:, 1:]                                                          # token t is read at t-1
        h = hidden_where_read(base_model(model), input_ids, mask, position_ids, read)       # [n, H]
        logp, ent = _head_logprobs(head, h, input_ids, want, temperature, return_entropy, chunk_tokens)
        return logp, ent, None
    if head is not None:  # backbone only, then the vocabulary projection on the scored positions
        hidden = base_model(model)(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                                    use_cache=False).last_hidden_state                            # [B, T, H]
        logp, ent = _selected_logprobs(head, hidden, input_ids, attention_mask, token_mask, temperature,
                                       return_entropy, chunk_tokens)
        return logp, ent, hidden if want_hidden else None
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False,
                output_hidden_states=want_hidden)
    logp, ent = logprobs_from_logits(out.logits, input_ids, attention_mask, temperature, return_entropy,
                                     chunk_tokens)
    if token_mask is not None:
        keep = token_mask.bool()
        logp = logp.masked_fill(~keep, 0.0)
        ent = ent.masked_fill(~keep, 0.0) if ent is not None else None
    return logp, ent, out.hidden_states[-1] if want_hidden else None


def _token_logp_entropy(x: torch.Tensor, targets: torch.Tensor, temperature: float, return_entropy: bool):
    """x [..., V] logits, targets [...] -> (log p(target) [...], entropy [...] or None), float32."""
    x = x.float()
    if temperature != 1.0:
        x = x / temperature
    lse = torch.logsumexp(x, dim=-1)
    tok = x.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    ent = lse - (torch.softmax(x, dim=-1) * x).sum(-1) if return_entropy else None
    return tok, ent


def scored_positions(input_ids, attention_mask, token_mask) -> torch.Tensor:
    """``[B, T]`` bool: the tokens ``token_mask`` marks that have a real token before them (their log-prob is
    read from the hidden state at ``t - 1``)."""
    B, T = input_ids.shape
    want = torch.zeros(B, T, dtype=torch.bool, device=input_ids.device)
    want[:, 1:] = token_mask[:, 1:].bool() & (attention_mask[:, 1:] != 0) & (attention_mask[:, :-1] != 0)
    return want


def _selected_logprobs(head, hidden, input_ids, attention_mask, token_mask, temperature, return_entropy,
                       chunk_tokens):
    want = scored_positions(input_ids, attention_mask, token_mask)
    b_idx, t_idx = want.nonzero(as_tuple=True)
    return _head_logprobs(head, hidden[b_idx, t_idx - 1], input_ids, want, temperature, return_entropy,
                          chunk_tokens)


def _head_logprobs(head, h, input_ids, want, temperature, return_entropy, chunk_tokens):
    """``h [n, H]``: the hidden states the ``want`` ``[B, T]`` tokens are read from (row-major) -> ``(logp [B, T],
    entropy [B, T] | None)`` float32, 0 where not wanted."""
    B, T = input_ids.shape
    b_idx, t_idx = want.nonzero(as_tuple=True)
    targets = input_ids[b_idx, t_idx]                                                       # [n]
    lp, en = [], []
    for s in range(0, h.shape[0], chunk_tokens):
        tok, ent = _token_logp_entropy(head(h[s:s + chunk_tokens]), targets[s:s + chunk_tokens], temperature,
                                       return_entropy)
        lp.append(tok)
        en.append(ent)
    zeros = h.new_zeros(B, T, dtype=torch.float32)

    def scatter(parts):
        vals = torch.cat(parts) if parts else zeros.new_zeros(0)
        return zeros.index_put((b_idx, t_idx), vals)

    return scatter(lp), scatter(en) if return_entropy else None


def logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         temperature: float = 1.0, return_entropy: bool = False, chunk_tokens: int = 4096):
    """The reduction of `sequence_logprobs` on given logits[B,T,V]: `(logp [B,T], entropy [B,T] or None)`."""
    B, T, V = logits.shape
    targets = input_ids[:, 1:]                                                              # [B, T-1]
    step = max(1, chunk_tokens // max(B, 1))
    lp_chunks, ent_chunks = [], []
    for s in range(0, T - 1, step):
        x = logits[:, s:min(s + step, T - 1)]                                               # [B, c, V]
        tok, ent = _token_logp_entropy(x, targets[:, s:s + x.shape[1]], temperature, return_entropy)
        lp_chunks.append(tok)
        ent_chunks.append(ent)
    valid = (attention_mask[:, 1:] != 0) & (attention_mask[:, :-1] != 0)                    # [B, T-1]
    zero = logits.new_zeros(B, 1, dtype=torch.float32)

    def assemble(chunks):
        body = torch.cat(chunks, dim=1) if chunks else logits.new_zeros(B, 0, dtype=torch.float32)
        return torch.cat([zero, body.masked_fill(~valid, 0.0)], dim=1)                      # [B, T]

    return assemble(lp_chunks), assemble(ent_chunks) if return_entropy else None
