"""Batched sampling with a KV cache and left padding (the local engine's rollout policy)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

import torch

from ragen_turn.models.kv_cache import check_decode, compiled_step, feed_back, to_static
from ragen_turn.models.lean import KVBuffer, LeanLM, lean_supported

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


class NonFiniteSampling(FloatingPointError):
    """The next-token distribution holds NaN or inf (the trainer stops naming the checkpoint to go back to)."""


@dataclass
class _CachedRow:
    """One row of an earlier call: its real ``tokens`` and where their keys/values are:
    ``layers[l] = (K, V)`` of its chunk (``[B, heads, S, d]``), row ``row``, slots ``slots`` (``[len(tokens)]``)."""
    tokens: tuple
    layers: list
    row: int
    slots: torch.Tensor


class LocalSampler:
    """Samples responses for a batch of prompts of different lengths.

    Prompts are left padded into one batch; one prefill, then one token per step with the KV
    cache, until every row has hit a stop token id, a stop string (e.g. ``</answer>``, checked on
    the decoded text only when a token that can end it is sampled) or ``max_new_tokens``.
    Returns exactly the sampled ids of each row, up to and including the stop.

    ``prefix_cache=True`` keeps each row's keys/values between calls, so the next turn of a
    multi-turn episode (its prompt = the last prompt + the response + the env's reply) prefills only
    the new tokens. Rows are matched by token prefix; call ``reset_cache()`` whenever the model's
    weights change (``run_episodes`` does at the start and end of every rollout).

    ``decode`` picks how the tokens after the prefill are computed (``dynamic``, ``static`` or ``compiled``;
    :mod:`ragen_turn.models.kv_cache`): the samples are the same for a seed, the logits agree to float rounding.

    ``lean=True`` (``actor_rollout_ref.rollout.lean_forward``) with ``decode="dynamic"``, for a Qwen2/Llama model
    (:func:`~ragen_turn.models.lean.lean_supported`): the prefill and decode steps run
    :class:`~ragen_turn.models.lean.LeanLM` on one preallocated key/value buffer per call (no cache copies a step),
    rows that have stopped leave the computed batch (the buffer is compacted once a quarter of its rows stopped), and
    stops are found on token ids for the whole batch. Every row's next token is still
    drawn from one ``[B, V]`` distribution a step (stopped rows' logits are 0), so the random stream, hence the samples
    for a seed, are the model-forward path's wherever the logits agree (they do to float rounding).
    """

    def __init__(self, model: Any, tokenizer: Any, temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
                 stop_strings: Sequence[str] = ("</answer>", "</search>"), device: str | torch.device = "cpu",
                 generator: Optional[torch.Generator] = None, micro_batch_size: int = 0,
                 prefix_cache: bool = False, decode: str = "dynamic", lean: bool = False):
        if temperature < 0:
            raise ValueError(f"actor_rollout_ref.rollout.temperature must be >= 0, got {temperature}")
        if not (0 < top_p <= 1):
            raise ValueError(f"actor_rollout_ref.rollout.top_p must be in (0, 1], got {top_p}")
        self.model, self.tok = model, tokenizer
        self.decode = check_decode(decode)
        self._lean = LeanLM(model) if lean and self.decode == "dynamic" and lean_supported(model) else None
        self._step = model  # the decode step's callable (compiled on first use when decode=compiled)
        if int(top_k) < -1:
            raise ValueError(f"actor_rollout_ref.rollout.top_k must be -1 (off), 0 (off) or > 0, got {top_k}")
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
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
        self.prefix_cache = bool(prefix_cache)
        self._cached: List[_CachedRow] = []
        self._sample_gen = generator
        self.cached_tokens_reused = 0  # prompt tokens not prefilled again thanks to the cache (running total)
        # record_logprobs (lean path): each sampled token's log-prob at the sampling temperature, from the logits it
        # was drawn from (``last_logprobs``, aligned with the last ``generate``'s responses)
        self.record_logprobs = False
        self.last_logprobs: Optional[List[List[float]]] = None

    def reset_cache(self) -> None:
        """Forget the keys/values of earlier calls (they belong to the weights they were computed with)."""
        self._cached = []

    @torch.no_grad()
    def generate(self, prompts: List[List[int]], max_new_tokens: int) -> List[List[int]]:
        if not prompts:
            return []
        mb = self.micro_batch_size or len(prompts)
        self._sample_gen = self._device_generator()
        previous, self._cached = self._cached, []
        out: List[List[int]] = []
        self.last_logprobs = [] if self.record_logprobs and self._lean is not None else None
        for i in range(0, len(prompts), mb):
            out.extend(self._generate(prompts[i:i + mb], max_new_tokens, previous))
        return out

    def _device_generator(self) -> Optional[torch.Generator]:
        """The generator ``_sample`` draws from. Sampling runs on the model's device; a CPU generator (the one the
        trainer checkpoints) seeds a fresh one there per call, so seeded runs repeat on a GPU too."""
        if self.generator is None or self.generator.device == self.device:
            return self.generator
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=self.generator))
        return torch.Generator(device=self.device).manual_seed(seed)

    def _find_prefix(self, prompt: List[int], previous: List[_CachedRow]) -> Optional[_CachedRow]:
        best = None
        for c in previous:
            n = len(c.tokens)
            if n < len(prompt) and (best is None or n > len(best.tokens)) and tuple(prompt[:n]) == c.tokens:
                best = c
        return best

    @staticmethod
    def _prefix_index(previous: Sequence[_CachedRow]):
        """``(tokens -> the first cached row holding them, their lengths longest first)``: :meth:`_find_prefix`'s
        answer by one dict look-up per distinct length (the longest cached prefix; the first row among equals)."""
        index: dict = {}
        for c in previous:
            index.setdefault(c.tokens, c)
        return index, sorted({len(t) for t in index}, reverse=True)

    @staticmethod
    def _lookup(prompt: List[int], index: dict, lengths: List[int]) -> Optional[_CachedRow]:
        for n in lengths:
            if n < len(prompt):
                hit = index.get(tuple(prompt[:n]))
                if hit is not None:
                    return hit
        return None

    def _prefill(self, prompts: List[List[int]], previous: List[_CachedRow]):
        """Prefill ``prompts`` ``-> (logits [B, V], cache, attn [B, S], last_pos [B, 1], slots)``.

        Each row is ``[pad][cached prefix][pad][new tokens]``: the keys/values of a cached prefix are
        copied in (their positions are already encoded), only the new tokens run through the model.
        Without a cached prefix that is plain left padding. ``slots[b]`` = the prompt's slot indices.
        """
        B = len(prompts)
        hits = [self._find_prefix(p, previous) if previous else None for p in prompts]
        c_len = [len(h.tokens) if h is not None else 0 for h in hits]
        new = [p[c:] for p, c in zip(prompts, c_len)]
        C, N = max(c_len), max(len(x) for x in new)
        input_ids = torch.full((B, N), self.pad_id, dtype=torch.long)
        attn = torch.zeros(B, C + N, dtype=torch.long)
        pos = torch.zeros(B, N, dtype=torch.long)
        slots = []
        for b, (x, c) in enumerate(zip(new, c_len)):
            input_ids[b, N - len(x):] = torch.tensor(x, dtype=torch.long)
            pos[b, N - len(x):] = torch.arange(c, c + len(x))
            slots.append(torch.cat([torch.arange(C - c, C), torch.arange(C + N - len(x), C + N)]))
            attn[b, slots[-1]] = 1
        past = None
        if C > 0:
            from transformers import DynamicCache

            any_hit = next(h for h in hits if h is not None)
            layers = []
            for layer in range(len(any_hit.layers)):
                kv = []
                for which in (0, 1):  # keys, values: [B, heads, C, d], each row's prefix right-aligned
                    ref = any_hit.layers[layer][which]
                    rows = []
                    for h, c in zip(hits, c_len):
                        row = ref.new_zeros(1, ref.shape[1], C - c, ref.shape[3])  # left padding
                        if h is not None:
                            src = h.layers[layer][which][h.row:h.row + 1]
                            row = torch.cat([row, src.index_select(2, h.slots.to(src.device))], dim=2)
                        rows.append(row)
                    kv.append(torch.cat(rows, dim=0))
                layers.append(tuple(kv))
            past = DynamicCache(ddp_cache_data=layers)
            self.cached_tokens_reused += sum(c_len)
        out = self.model(input_ids=input_ids.to(self.device), attention_mask=attn.to(self.device),
                         position_ids=pos.to(self.device), past_key_values=past, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1], out.past_key_values, attn.to(self.device), pos[:, -1:].to(self.device), slots

    def _decode_step(self):
        if self.decode == "compiled" and self._step is self.model:
            self._step = compiled_step(self.model, self.device)
        return self._step

    def _remember(self, prompts, results, cache, slots, width: int) -> None:
        """Keep each row's keys/values of prompt + response minus its last token (never fed back);
        the response's token k sits at slot ``width + k`` (in a dynamic or a static cache alike)."""
        try:
            from transformers.cache_utils import DynamicLayer, StaticLayer

            if any(type(layer) not in (DynamicLayer, StaticLayer) for layer in cache.layers):
                return  # sliding-window or other layouts: no reuse
            layers = [(layer.keys, layer.values) for layer in cache.layers]
        except (ImportError, AttributeError):
            return
        for b, (p, r) in enumerate(zip(prompts, results)):
            resp_slots = torch.arange(width, width + len(r) - 1)
            self._cached.append(_CachedRow(tuple(p) + tuple(r[:-1]), layers, b, torch.cat([slots[b], resp_slots])))

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [B, V]`` -> token ids ``[B]`` (greedy when temperature is 0)."""
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if not bool(torch.isfinite(probs).all()):  # torch.multinomial would fail with a bare RuntimeError
            raise NonFiniteSampling("the policy's sampling distribution is not finite (non-finite logits: its "
                                    "weights are not sound)")
        if 0 < self.top_k < probs.shape[-1]:  # keep the k most likely tokens (ties at the k-th kept, as verl's hf)
            kth = probs.topk(self.top_k, dim=-1).values[:, -1:]
            probs = probs.masked_fill(probs < kth, 0.0)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            cum = sorted_p.cumsum(dim=-1)
            drop = cum - sorted_p > self.top_p  # keep the smallest prefix reaching top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        return torch.multinomial(probs, 1, generator=self._sample_gen).squeeze(-1)

    def _generate(self, prompts: List[List[int]], max_new_tokens: int,
                  previous: Sequence[_CachedRow] = ()) -> List[List[int]]:
        if self._lean is not None:
            return self._generate_lean(prompts, max_new_tokens, previous)
        B = len(prompts)
        logits, cache, attn, last_pos, slots = self._prefill(prompts, list(previous) if self.prefix_cache else [])
        width = attn.shape[1]
        static = to_static(self.model, cache, attn, max_new_tokens) if self.decode != "dynamic" else None
        step = self.model
        if static is not None:
            (cache, attn), step = static, self._decode_step()
        results: List[List[int]] = [[] for _ in range(B)]
        finished = torch.zeros(B, dtype=torch.bool)
        stop_ids = self._stop_ids_t
        for k in range(max_new_tokens):  # the k-th response token; fed back, its keys/values go to slot width + k
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
            logits, attn, last_pos, cache = feed_back(step, nxt, attn, last_pos, cache, static is not None, width + k,
                                                      self.device)
        if self.prefix_cache:
            self._remember(prompts, results, cache, slots, width)
        return results

    # ------------------------------------------------------------------ the lean path (LeanLM on one buffer)
    def _lean_prefill(self, prompts: List[List[int]], previous: Sequence[_CachedRow], max_new_tokens: int):
        """:meth:`_prefill`'s layout (``[pad][cached prefix][pad][new tokens]``, width ``W``) in a
        :class:`KVBuffer` of ``W + max_new_tokens`` slots: cached prefixes gathered in one indexed copy per source
        buffer and layer, the new tokens through :class:`LeanLM`. Returns ``(logits [B, V], buffer,
        attn [B, L] bool, last positions [B], new-token counts, cached-prefix counts)``.

        Equal prompts (a group's first turn) are prefilled once and their rows copied: the same keys, values and
        logits for each (every row's arithmetic is its own)."""
        firsts: dict = {}
        inverse = [firsts.setdefault(tuple(p), len(firsts)) for p in prompts]
        if len(firsts) < len(prompts):
            reused = self.cached_tokens_reused
            out = self._lean_prefill([list(t) for t in firsts], previous, max_new_tokens)
            inv = torch.tensor(inverse, dtype=torch.long)
            logits, buf, attn, last_pos, n_len, c_len = out
            self.cached_tokens_reused = reused + int(c_len[inv].sum())
            return (logits[inv.to(logits.device)], buf.select_rows(inv.to(buf.keys[0].device)),
                    attn[inv.to(attn.device)], last_pos[inv.to(last_pos.device)], n_len[inv], c_len[inv])
        B, dev = len(prompts), self.device
        hits: List[Optional[_CachedRow]] = [None] * B
        if previous:
            index, lengths = self._prefix_index(previous)
            hits = [self._lookup(p, index, lengths) for p in prompts]
        c_len = torch.tensor([len(h.tokens) if h is not None else 0 for h in hits], dtype=torch.long)
        n_len = torch.tensor([len(p) for p in prompts], dtype=torch.long) - c_len
        C, N = int(c_len.max()), int(n_len.max())
        W = C + N
        buf = self._lean.new_buffer(B, W + max_new_tokens)
        for k, v in zip(buf.keys, buf.values):  # padding slots must hold finite numbers (0 x NaN is NaN)
            k[:, :, :W].zero_()
            v[:, :, :W].zero_()
        cols = torch.arange(W)
        attn = torch.zeros(B, W + max_new_tokens, dtype=torch.bool)
        attn[:, :W] = ((cols >= C - c_len[:, None]) & (cols < C)) | (cols >= W - n_len[:, None])
        flat = torch.tensor([t for p, h in zip(prompts, hits) for t in p[len(h.tokens) if h is not None else 0:]],
                            dtype=torch.long)
        new_cols = attn[:, C:W]
        input_ids = torch.full((B, N), self.pad_id, dtype=torch.long)
        input_ids[new_cols[:, :N]] = flat
        pos = (new_cols.long().cumsum(1) - 1 + c_len[:, None]).clamp(min=0)
        if C > 0:
            self._gather_prefixes(buf, hits, c_len, C)
            self.cached_tokens_reused += int(c_len.sum())
        qi = torch.arange(N)[:, None] + C                                            # each new token's slot
        mask = (attn[:, None, :W] & (cols[None] <= qi)[None]) | (cols[None] == qi)[None]  # [B, N, W]; self always
        logits = self._lean.forward(input_ids.to(dev), pos.to(dev), buf, C, mask[:, None].to(dev))
        return logits, buf, attn.to(dev), pos[:, -1].to(dev), n_len, c_len

    @staticmethod
    def _gather_prefixes(buf: KVBuffer, hits: List[Optional[_CachedRow]], c_len: torch.Tensor, C: int) -> None:
        """Copy each hit row's cached keys/values into ``buf``, right-aligned at slot ``C`` (grouped by the buffer
        they sit in: one indexed copy per group and layer)."""
        groups: dict = {}
        for b, h in enumerate(hits):
            if h is not None:
                groups.setdefault(id(h.layers), (h.layers, []))[1].append((b, h))
        for layers, rows in groups.values():
            dst_b = torch.cat([torch.full((len(h.slots),), b, dtype=torch.long) for b, h in rows])
            src_b = torch.cat([torch.full((len(h.slots),), h.row, dtype=torch.long) for _, h in rows])
            src_t = torch.cat([h.slots for _, h in rows])
            dst_t = torch.cat([torch.arange(C - len(h.slots), C) for _, h in rows])
            dst, src = buf.keys[0], layers[0][0]
            heads = torch.arange(dst.shape[1])[None]  # the same slots of every kv head: flat row indices
            flat_dst = ((dst_b[:, None] * dst.shape[1] + heads) * dst.shape[2] + dst_t[:, None]).flatten()
            flat_src = ((src_b[:, None] * src.shape[1] + heads) * src.shape[2] + src_t[:, None]).flatten()
            flat_dst, flat_src = flat_dst.to(dst.device), flat_src.to(src.device)
            for (k_src, v_src), k, v in zip(layers, buf.keys, buf.values):
                d = k.shape[-1]
                k.view(-1, d).index_copy_(0, flat_dst, k_src.reshape(-1, d).index_select(0, flat_src))
                v.view(-1, d).index_copy_(0, flat_dst, v_src.reshape(-1, d).index_select(0, flat_src))

    def _stops(self, nxt: torch.Tensor, alive: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
        """``[B]`` bool: rows (of ``alive``) whose response ``tokens[:, :k + 1]`` ends in a stop id or a stop string
        (decoded only for rows whose new token can end one)."""
        newly = torch.isin(nxt, self._stop_ids_t) & alive
        cand = (self._maybe_stop[nxt] & alive & ~newly).nonzero().flatten().tolist()
        for b in cand:
            text = self.tok.decode(tokens[b, max(0, k - 15):k + 1].tolist())
            if any(s in text for s in self.stop_strings):
                newly[b] = True
        return newly

    def _generate_lean(self, prompts: List[List[int]], max_new_tokens: int,
                       previous: Sequence[_CachedRow] = ()) -> List[List[int]]:
        B = len(prompts)
        logits, buf, attn, last_pos, n_len, c_len = self._lean_prefill(
            prompts, list(previous) if self.prefix_cache else [], max_new_tokens)
        W = attn.shape[1] - max_new_tokens
        C = W - int(n_len.max())  # the cached prefixes end here
        tokens = torch.zeros(B, max_new_tokens, dtype=torch.long)
        logps = torch.zeros(B, max_new_tokens) if self.last_logprobs is not None else None
        lengths = torch.zeros(B, dtype=torch.long)
        alive = torch.ones(B, dtype=torch.bool)
        rows = torch.arange(B)            # buffer row r holds original row rows[r]
        home = [(buf, b) for b in range(B)]  # where each row's keys/values are (a stopped row's stay in place)
        full = logits.new_zeros(B, logits.shape[-1])
        for k in range(max_new_tokens):
            full[rows.to(full.device)] = logits
            nxt = self._sample(full).cpu()  # every row draws: the random stream is the full batch's
            tokens[:, k] = nxt
            if logps is not None:  # the trainer's log-prob: the full softmax at the temperature (not top_p's)
                lp = torch.log_softmax(full.float() / (self.temperature or 1.0), dim=-1)
                logps[:, k] = lp.gather(1, nxt[:, None].to(lp.device)).squeeze(1).cpu()
            lengths += alive.long()
            alive &= ~self._stops(nxt, alive, tokens, k)
            if not bool(alive.any()) or k == max_new_tokens - 1:
                break
            keep = alive[rows]
            if int(keep.sum()) <= 0.75 * len(rows):  # compact: stopped rows leave the computed batch
                sel = keep.nonzero().flatten()
                buf = buf.select_rows(sel.to(buf.keys[0].device))
                rows, attn, last_pos = rows[sel], attn[sel.to(attn.device)], last_pos[sel.to(last_pos.device)]
                for r, b in enumerate(rows.tolist()):
                    home[b] = (buf, r)
                full.zero_()
            attn[:, W + k] = True
            last_pos = last_pos + 1
            step_mask = attn[:, None, None, :W + k + 1]
            logits = self._lean.forward(nxt[rows][:, None].to(self.device), last_pos[:, None], buf, W + k, step_mask)
        results = [tokens[b, :n].tolist() for b, n in enumerate(lengths.tolist())]
        if logps is not None:
            self.last_logprobs.extend(logps[b, :n].tolist() for b, n in enumerate(lengths.tolist()))
        if self.prefix_cache:
            layers: dict = {}  # one (K, V) list per buffer, shared by its rows (the next prefill groups by it)
            for b, (p, r) in enumerate(zip(prompts, results)):
                hb, hr = home[b]
                n, c = int(n_len[b]), int(c_len[b])
                slots = torch.cat([torch.arange(C - c, C), torch.arange(W - n, W + len(r) - 1)])
                lay = layers.setdefault(id(hb), list(zip(hb.keys, hb.values)))
                self._cached.append(_CachedRow(tuple(p) + tuple(r[:-1]), lay, hr, slots))
        return results
