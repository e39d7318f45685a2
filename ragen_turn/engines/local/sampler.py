"""Batched sampling with a KV cache and left padding (the local engine's rollout policy)."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch


_STOP_TABLES: dict = {}


def _stop_candidates(tokenizer: Any, stop_strings: tuple) -> torch.Tensor:
    """``[V]`` bool: token ids whose text holds the last character of a stop string (only those can
    complete one). Built once per tokenizer."""
    key = (id(tokenizer), len(tokenizer), stop_strings)
    if key not in _STOP_TABLES:
        last_chars = {s[-1] for s in stop_strings}
        table = torch.zeros(len(tokenizer), dtype=torch.bool)
        if last_chars:
            pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
            for tid, piece in enumerate(pieces):
                text = tokenizer.convert_tokens_to_string([piece]) if piece is not None else ""
                table[tid] = any(c in text for c in last_chars)
        _STOP_TABLES[key] = table
    return _STOP_TABLES[key]


class LocalSampler:
    """Samples responses for a batch of prompts of different lengths.

    Prompts are left padded into one batch; one prefill, then one token per step with the KV
    cache, until every row has hit a stop token id, a stop string (e.g. ``</answer>``, checked on
    the decoded text only when a token that can end it is sampled) or ``max_new_tokens``.
    Returns exactly the sampled ids of each row, up to and including the stop.
    """

    def __init__(self, model: Any, tokenizer: Any, temperature: float = 1.0, top_p: float = 1.0,
                 stop_strings: Sequence[str] = ("</answer>",), device: str | torch.device = "cpu",
                 generator: Optional[torch.Generator] = None, micro_batch_size: int = 0):
        if temperature < 0:
            raise ValueError(f"actor_rollout_ref.rollout.temperature must be >= 0, got {temperature}")
        if not (0 < top_p <= 1):
            raise ValueError(f"actor_rollout_ref.rollout.top_p must be in (0, 1], got {top_p}")
        self.model, self.tok = model, tokenizer
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.device = torch.device(device)
        self.generator = generator
        self.micro_batch_size = int(micro_batch_size)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stop_ids = set()
        for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")):
            if isinstance(t, int) and t != tokenizer.unk_token_id and t >= 0:
                self.stop_ids.add(t)
        self.stop_strings = [s for s in stop_strings if s]
        self._maybe_stop = _stop_candidates(tokenizer, tuple(self.stop_strings))
        self._stop_ids_t = torch.tensor(sorted(self.stop_ids), dtype=torch.long)

    @torch.no_grad()
    def generate(self, prompts: List[List[int]], max_new_tokens: int) -> List[List[int]]:
        if not prompts:
            return []
        mb = self.micro_batch_size or len(prompts)
        out: List[List[int]] = []
        for i in range(0, len(prompts), mb):
            out.extend(self._generate(prompts[i:i + mb], max_new_tokens))
        return out

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [B, V]`` -> token ids ``[B]`` (greedy when temperature is 0)."""
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            cum = sorted_p.cumsum(dim=-1)
            drop = cum - sorted_p > self.top_p  # keep the smallest prefix reaching top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        gen = self.generator if (self.generator is not None and self.generator.device == probs.device) else None
        return torch.multinomial(probs, 1, generator=gen).squeeze(-1)

    def _generate(self, prompts: List[List[int]], max_new_tokens: int) -> List[List[int]]:
        B = len(prompts)
        L = max(len(p) for p in prompts)
        input_ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros(B, L, dtype=torch.long)
        for b, p in enumerate(prompts):
            input_ids[b, L - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[b, L - len(p):] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True,
                         logits_to_keep=1)
        cache, logits = out.past_key_values, out.logits[:, -1]
        results: List[List[int]] = [[] for _ in range(B)]
        finished = torch.zeros(B, dtype=torch.bool)
        stop_ids = self._stop_ids_t
        last_pos = pos[:, -1:]
        for _ in range(max_new_tokens):
            nxt = self._sample(logits).cpu()
            for b in (~finished).nonzero().flatten().tolist():
                results[b].append(int(nxt[b]))
            newly = torch.isin(nxt, stop_ids) & ~finished
            cand = (self._maybe_stop[nxt] & ~finished & ~newly).nonzero().flatten().tolist()
            for b in cand:
                text = self.tok.decode(results[b][-16:])
                if any(s in text for s in self.stop_strings):
                    newly[b] = True
            finished |= newly
            if bool(finished.all()):
                break
            attn = torch.cat([attn, attn.new_ones(B, 1)], dim=1)
            last_pos = last_pos + 1
            out = self.model(input_ids=nxt[:, None].to(self.device), attention_mask=attn, position_ids=last_pos,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache, logits = out.past_key_values, out.logits[:, -1]
        return results
