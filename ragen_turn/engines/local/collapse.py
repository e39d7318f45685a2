"""RAGEN-2's collapse measures on the local engine (``trainer.collapse_freq``, when ``agent_proxy.enable_think``).

As RAGEN's first-turn measure: each episode's first prompt ``x`` (shared by its env group) and the reasoning
``z`` of its first response (the think text, re-tokenized); the policy scores every ``z_i`` after every
group's prompt followed by ``<think>`` (teacher forcing), and :func:`ragen_turn.algos.collapse.collapse_measures`
turns those cross log-probs into the MI estimate, its z-score and H(Z|X).
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np
import torch

from ragen_turn.algos.collapse import collapse_measures
from ragen_turn.models import positions_from_mask, sequence_logprobs
from ragen_turn.rollout.context import think_text
from ragen_turn.rollout.trajectory import Episode


def collapse_due(cfg: Any, step: int) -> bool:
    """RAGEN's schedule: step 1, then every ``trainer.collapse_freq`` steps, when the model thinks."""
    freq = int(cfg.trainer.get("collapse_freq", 0) or 0)
    return bool(cfg.agent_proxy.enable_think) and freq > 0 and (step == 1 or step % freq == 0)


def first_turn_pairs(episodes: Sequence[Episode], encode, max_samples: int | None = None, seed: int = 0):
    """``(prompts {group: ids}, reasoning [ids], groups [group])`` of the episodes whose first response
    thinks; ``encode(text) -> ids``. At most ``max_samples`` pairs, drawn with ``seed``."""
    prompts: Dict[int, List[int]] = {}
    reasoning, groups = [], []
    think_ids = encode("<think>")
    for ep in episodes:
        if not ep.texts:
            continue
        z = think_text(ep.texts[0])
        if not z:
            continue
        first = ep.response_mask.index(1) if 1 in ep.response_mask else len(ep.token_ids)
        prompts.setdefault(ep.group_id, list(ep.token_ids[:first]) + list(think_ids))
        reasoning.append(encode(z))
        groups.append(ep.group_id)
    if max_samples is not None and len(reasoning) > max_samples:
        keep = sorted(np.random.default_rng(seed).choice(len(reasoning), max_samples, replace=False).tolist())
        reasoning, groups = [reasoning[i] for i in keep], [groups[i] for i in keep]
        prompts = {g: prompts[g] for g in sorted(set(groups))}
    return prompts, reasoning, groups


@torch.no_grad()
def cross_logprobs(model: Any, prompts: Dict[int, List[int]], reasoning: List[List[int]], pad_id: int,
                   device: Any, micro_batch_size: int = 16):
    """``(mean, sum)`` ``[NK, N]``: log-prob of reasoning ``i`` after prompt ``j`` (columns in ``sorted(prompts)``)."""
    cols = sorted(prompts)
    nk = len(reasoning)
    mean = torch.zeros(nk, len(cols), dtype=torch.float64)
    total = torch.zeros(nk, len(cols), dtype=torch.float64)
    for j, g in enumerate(cols):
        x = prompts[g]
        for lo in range(0, nk, micro_batch_size):
            zs = reasoning[lo:lo + micro_batch_size]
            T = len(x) + max(len(z) for z in zs)
            ids = torch.full((len(zs), T), pad_id, dtype=torch.long)
            am = torch.zeros(len(zs), T, dtype=torch.long)
            zmask = torch.zeros(len(zs), T)
            for b, z in enumerate(zs):
                ids[b, :len(x) + len(z)] = torch.tensor(x + z, dtype=torch.long)
                am[b, :len(x) + len(z)] = 1
                zmask[b, len(x):len(x) + len(z)] = 1
            pos = positions_from_mask(am)
            logp = sequence_logprobs(model, ids.to(device), am.to(device), pos.to(device),
                                     token_mask=zmask.to(device)).double().cpu() * zmask
            s = logp.sum(dim=1)
            total[lo:lo + len(zs), j] = s
            mean[lo:lo + len(zs), j] = s / zmask.sum(dim=1).clamp(min=1)
    return mean, total


def collapse_metrics(model: Any, tokenizer: Any, episodes: Sequence[Episode], device: Any, max_samples: int = 64,
                     micro_batch_size: int = 16, seed: int = 0) -> Dict[str, float]:
    """The ``collapse/*`` measures of a batch of episodes (empty when fewer than 2 groups think)."""
    def encode(text: str) -> List[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    was_training = model.training
    model.eval()
    try:
        prompts, reasoning, groups = first_turn_pairs(episodes, encode, max_samples, seed)
        n_eps = sum(1 for e in episodes if e.texts)
        out: Dict[str, float] = {"collapse/first_turn_valid_rate": len(reasoning) / max(n_eps, 1)}
        if len(prompts) < 2:
            return out
        mean, total = cross_logprobs(model, prompts, reasoning, tokenizer.pad_token_id, device, micro_batch_size)
        col_of = {g: j for j, g in enumerate(sorted(prompts))}
        out.update(collapse_measures(mean, total, torch.tensor([col_of[g] for g in groups])))
        return out
    finally:
        model.train(was_training)
