"""verl's log-probs of the sampled tokens without flash-attn, in chunks of rows instead of one row at a time.

verl 0.9.1's ``logprobs_from_logits`` (every actor forward: old log-probs, reference, update) uses flash-attn's
cross-entropy kernel when flash-attn is installed; otherwise ``logprobs_from_logits_v2``, which loops over the rows
of ``logits [N, V]`` in Python (``torch.logsumexp`` of one row per iteration) to bound its memory. Its FSDP engine
hands it every token of a micro-batch as a row, so without flash-attn an actor pass costs one Python iteration and
one kernel launch per token (and the same again in the backward): about 20 us a token on this project's 2-core
Intel Xeon, and the likely reason verl's actor passes took 10-25x its critic's on an H200 (results/gpu.md; not yet
measured on a card).

Importing this module (every Ray worker does: it is one of the engine's ``VERL_USE_EXTERNAL_MODULES``)
replaces ``verl.utils.torch_functional.logprobs_from_logits_v2`` with :func:`logprobs_by_chunks`: the same
formula per row (float32/64: ``x[label] - logsumexp(x)``; bfloat16 and others: ``log_softmax(x)[label]``), over
chunks of at most ``CHUNK_ELEMENTS`` logits, so the memory stays bounded and the launches are a few per
micro-batch. The values are verl's where a chunk's rows reduce in the same order as single rows (on CPU, bit for
bit with the tiny model's 1,024-token vocabulary), else to float rounding (CPU, 49,152 tokens: 1.9e-6 at most).
verl's flash-attn and NPU paths are left as they are. ``benchmarks/bench_token_logprobs.py`` times both.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ragen_turn.engines.verl.replace import replace_verl_function

CHUNK_ELEMENTS = 1 << 20  # logits per chunk (4 MiB in float32; larger chunks leave a CPU's cache)


def logprobs_by_chunks(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``logits [..., V]``, ``labels [...]`` -> log-probs of the labels ``[...]``, as verl's
    ``logprobs_from_logits_v2`` computes each row, a chunk of rows at a time."""
    V = logits.shape[-1]
    x, y = logits.reshape(-1, V), labels.reshape(-1)
    rows = max(1, CHUNK_ELEMENTS // max(V, 1))
    exact = logits.dtype in (torch.float32, torch.float64)
    out = []
    for xc, yc in zip(x.split(rows), y.split(rows)):
        if exact:
            out.append(xc.gather(-1, yc.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(xc, dim=-1))
        else:  # verl's branch for bfloat16: logsumexp is less stable there
            out.append(F.log_softmax(xc, dim=-1).gather(-1, yc.unsqueeze(-1)).squeeze(-1))
    return (torch.cat(out) if out else x.new_zeros(0)).reshape(labels.shape)


# verl's own row loop, kept for the test and the benchmark
_VERL_V2 = replace_verl_function("verl.utils.torch_functional", "logprobs_from_logits_v2", logprobs_by_chunks)
