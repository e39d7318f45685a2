"""Slow, obviously-correct references (plain Python loops) for the algorithm core."""
from __future__ import annotations

import math
import random

import torch


def random_batch(seed: int, B: int = 5, max_turns: int = 4, max_len: int = 6, pad_to: int | None = None):
    """Ragged multi-turn rows: prompt, (response, env tokens)*, right padding.

    Returns response_mask [B, T] (float), and the list of turns per row as lists of positions.
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(B):
        row, turns = [], []
        prompt = rng.randint(1, 4)
        row += [0] * prompt
        n_turns = rng.randint(1, max_turns)
        for h in range(n_turns):
            L = rng.randint(1, max_len)
            turns.append(list(range(len(row), len(row) + L)))
            row += [1] * L
            if h < n_turns - 1:
                row += [0] * rng.randint(1, 3)
        rows.append((row, turns))
    T = max(len(r) for r, _ in rows) + rng.randint(0, 3)
    if pad_to:
        T = max(T, pad_to)
    mask = torch.zeros(B, T)
    for b, (row, _) in enumerate(rows):
        mask[b, : len(row)] = torch.tensor(row, dtype=torch.float)
    return mask, [t for _, t in rows]


def turns_of(mask_row) -> list[list[int]]:
    turns, cur = [], []
    for t, m in enumerate(mask_row.tolist()):
        if m:
            cur.append(t)
        elif cur:
            turns.append(cur)
            cur = []
    if cur:
        turns.append(cur)
    return turns


def ref_grpo(scores, group_ids, norm_by_std=True, eps=1e-6):
    out = []
    for i, s in enumerate(scores.tolist()):
        grp = [scores[j].item() for j in range(len(scores)) if group_ids[j] == group_ids[i]]
        if len(grp) < 2:
            out.append(0.0)
            continue
        mean = sum(grp) / len(grp)
        std = math.sqrt(sum((g - mean) ** 2 for g in grp) / (len(grp) - 1))
        out.append((s - mean) / (std + eps) if norm_by_std else s - mean)
    return torch.tensor(out)


def ref_token_gae(rewards, values, mask, gamma, lam, last_values=None):
    B, T = mask.shape
    adv = torch.zeros(B, T)
    for b in range(B):
        pos = [t for t in range(T) if mask[b, t] == 1]
        boot = 0.0 if last_values is None else last_values[b].item()
        last = 0.0
        for i in range(len(pos) - 1, -1, -1):
            t = pos[i]
            v_next = values[b, pos[i + 1]].item() if i + 1 < len(pos) else boot
            delta = rewards[b, t].item() + gamma * v_next - values[b, t].item()
            last = delta + gamma * lam * last
            adv[b, t] = last
    return adv, (adv + values) * mask


def ref_turn_gae(turn_rewards, turn_values, turn_mask, gamma, lam, last_values=None):
    B, H = turn_mask.shape
    adv = torch.zeros(B, H)
    for b in range(B):
        n = int(turn_mask[b].sum())
        boot = 0.0 if last_values is None else last_values[b].item()
        last = 0.0
        for h in range(n - 1, -1, -1):
            v_next = turn_values[b, h + 1].item() if h + 1 < n else boot
            delta = turn_rewards[b, h].item() + gamma * v_next - turn_values[b, h].item()
            last = delta + gamma * lam * last
            adv[b, h] = last
    return adv, (adv + turn_values) * turn_mask


def ref_bi_level(turn_rewards, values, mask, gamma, lam, high_gamma):
    B, T = mask.shape
    adv = torch.zeros(B, T)
    for b in range(B):
        turns = turns_of(mask[b])
        ends = [t[-1] for t in turns]
        # high level over turn ends
        high_ret = [0.0] * len(turns)
        last = 0.0
        for h in range(len(turns) - 1, -1, -1):
            v_next = values[b, ends[h + 1]].item() if h + 1 < len(turns) else 0.0
            delta = turn_rewards[b, h].item() + high_gamma * v_next - values[b, ends[h]].item()
            last = delta + high_gamma * lam * last
            high_ret[h] = last + values[b, ends[h]].item()
        # low level inside each turn
        for h, toks in enumerate(turns):
            last = 0.0
            for i in range(len(toks) - 1, -1, -1):
                t = toks[i]
                r = high_ret[h] if i == len(toks) - 1 else 0.0
                v_next = values[b, toks[i + 1]].item() if i + 1 < len(toks) else 0.0
                delta = r + gamma * v_next - values[b, t].item()
                last = delta + gamma * lam * last
                adv[b, t] = last
    return adv, (adv + values) * mask


def ref_ragen_bi_level(token_rewards, values, mask, gamma, lam, high_gamma):
    """RAGEN's bi-level GAE as its code reads (``compute_bi_level_gae_advantage_return``), written again from
    that description, before its final whitening. Turn ends are the tokens whose reward is non-zero. High
    level, backwards over the ends: delta = r_end + high_gamma * V(next end) - V(end) (0 past the last end),
    GAE with high_gamma * lam; the end's reward becomes its return A + V(end). Low level, backwards over the
    masked tokens: at an end, the running GAE restarts and the next value is 0; elsewhere the next value is
    the next masked token's (past the last masked token: 0, where RAGEN's loop would index past its end)."""
    B, T = mask.shape
    adv = torch.zeros(B, T)
    ret = torch.zeros(B, T)
    for b in range(B):
        r = [float(x) for x in token_rewards[b]]
        ends = [t for t in range(T) if r[t] != 0]
        last = 0.0
        for i in range(len(ends) - 1, -1, -1):
            v_next = values[b, ends[i + 1]].item() if i + 1 < len(ends) else 0.0
            delta = r[ends[i]] + high_gamma * v_next - values[b, ends[i]].item()
            last = delta + high_gamma * lam * last
            adv[b, ends[i]] = last
        for t in ends:
            r[t] = adv[b, t].item() + values[b, t].item()
        pos = [t for t in range(T) if mask[b, t] == 1]
        last = 0.0
        for i in range(len(pos) - 1, -1, -1):
            t = pos[i]
            if t in ends:
                v_next, last = 0.0, 0.0
            else:
                v_next = values[b, pos[i + 1]].item() if i + 1 < len(pos) else 0.0
            delta = r[t] + gamma * v_next - values[b, t].item()
            last = delta + gamma * lam * last
            adv[b, t] = last
            ret[b, t] = last + values[b, t].item()
    return adv * mask, ret * mask


def ref_policy_loss(name, old_logp, logp, adv, mask, low=0.2, high=0.28, ratio_mode=None, agg=None,
                    clip_bias=False, clip_c=3.0, stat="mass", level="sample", threshold=None,
                    token_band=False, turn_band="fixed", loss_scale_factor=None, token_low=0.2, token_high=0.28):
    """Loop reference of every policy loss; differentiable through ``logp`` (torch scalar ops).

    Dual clip (``clip_c``): for A < 0 a unit's loss is capped at ``-A c``. The correction: ``mass``
    (sqrt of the summed (n w A)^2 over units clipping gives no gradient, over the others' sum) or ``rms``
    (RMS of w_t A_t over tokens whose own ratio is outside [1-low, 1+high], over the inside ones' RMS),
    per row (``sample``) or over the batch; scale 1/r where r > threshold; a dual-clipped unit enters the mass
    statistic at ratio c. ``token_band``: a token outside token PPO's band ([1-token_low, 1+token_high], not the
    turn's clip range) on its (turn's) advantage's side adds its log-ratio to its turn ratio detached.
    ``turn_band=sqrt_len``: a turn's band on its summed log-ratio is
    sqrt(n) x [log(1-low), log(1+high)] (divided by n for the geo-mean)."""
    B, T = mask.shape
    turn_unit = name in ("turn_ppo", "turn_ppo_geo")
    turn_ratio = name in ("turn_ppo", "turn_ppo_geo", "turn_is", "st_ppo")
    if ratio_mode is None:
        ratio_mode = {"turn_ppo": "sum", "turn_ppo_geo": "geo_mean"}.get(name, "geo_mean")
    if name == "turn_ppo_geo":
        ratio_mode = "geo_mean"
    clip_bias = clip_bias or name in ("s_ppo", "st_ppo")
    if threshold is None:
        threshold = 1.0 if stat == "mass" else 5.0
    agg = agg or ("turn-mean" if turn_unit else "token-mean")
    rows = []  # per row: list of (ratio tensor, adv float, n_tokens, (log_low, log_high))
    fixed = (math.log(1 - low), math.log(1 + high))
    token_fixed = (math.log(1 - token_low), math.log(1 + token_high))
    for b in range(B):
        units = []
        for toks in turns_of(mask[b]):
            turn_a = sum(adv[b, t].item() for t in toks) / len(toks)
            d = []
            for t in toks:
                dt = logp[b, t] - old_logp[b, t]
                a_gate = turn_a if turn_unit else adv[b, t].item()
                out = (a_gate > 0 and dt.item() > token_fixed[1]) or (a_gate < 0 and dt.item() < token_fixed[0])
                d.append(dt.detach() if (token_band and turn_ratio and out) else dt)
            s = sum(d)
            n = len(toks)
            band = fixed
            if turn_band == "sqrt_len" and turn_ratio:
                f = math.sqrt(n) if ratio_mode == "sum" else 1 / math.sqrt(n)
                band = (f * fixed[0], f * fixed[1])
            if ratio_mode == "geo_mean":
                s = s / n
            turn_w = torch.exp(s) if turn_ratio else None
            if turn_unit:
                units.append((turn_w, turn_a, n, band))
            else:
                for t, dt in zip(toks, d):
                    w = turn_w if turn_ratio else torch.exp(dt)
                    units.append((w, adv[b, t].item(), 1, band))
        rows.append(units)
    n_rows = sum(1 for u in rows if u)
    if turn_unit and agg == "turn-mean":
        denom = sum(len(u) for u in rows)
        weight = lambda unit: 1.0 / denom  # noqa: E731
    elif agg in ("seq-mean-token-mean", "seq-mean-turn-sum-token-norm"):
        weight = None  # 1 / (row's tokens) / rows, per token or per turn
    elif agg == "seq-mean-token-sum":
        weight = lambda unit: unit[2] / n_rows  # noqa: E731
    elif agg == "seq-mean-token-sum-norm":
        weight = lambda unit: unit[2] / n_rows / loss_scale_factor  # noqa: E731
    else:
        denom = sum(unit[2] for u in rows for unit in u)
        weight = lambda unit: unit[2] / denom  # noqa: E731
    row_losses, row_sums = [], []
    for b, units in enumerate(rows):
        n_tok = sum(unit[2] for unit in units)
        L_i = torch.zeros(())
        out2 = in2 = 0.0
        n_out = n_in = 0
        for unit in units:
            w, a, _, (lo, hi) = unit
            n = weight(unit) if weight is not None else 1.0 / n_tok / n_rows
            wv = w.item()
            clipped = (a > 0 and math.log(wv) > hi) or (a < 0 and math.log(wv) < lo)
            dual = a < 0 and wv > clip_c
            if dual:
                term = torch.tensor(-a * clip_c)
            elif clipped:
                term = -torch.clamp(w, math.exp(lo), math.exp(hi)) * a
            else:
                term = -w * a
            L_i = L_i + n * term
            if stat == "mass":
                if clipped or dual:
                    out2, n_out = out2 + (n * min(wv, clip_c if dual else wv) * a) ** 2, n_out + 1
                else:
                    in2, n_in = in2 + (n * wv * a) ** 2, n_in + 1
        if stat == "rms":
            for t in range(T):
                if mask[b, t] == 1:
                    wt = math.exp((logp[b, t] - old_logp[b, t]).item())
                    x2 = (wt * adv[b, t].item()) ** 2
                    if wt < 1 - low or wt > 1 + high:
                        out2, n_out = out2 + x2, n_out + 1
                    else:
                        in2, n_in = in2 + x2, n_in + 1
        row_losses.append(L_i)
        row_sums.append((out2, n_out, in2, n_in))

    def ratio(o2, no, i2, ni):
        if stat == "rms":
            o2, i2 = o2 / max(no, 1), i2 / max(ni, 1)
        return math.sqrt(o2) / (math.sqrt(i2) + 1e-8)

    def scale(r):
        return 1.0 / r if r > threshold else 1.0

    if not clip_bias:
        return sum(row_losses, torch.zeros(()))
    if level == "batch":
        s = scale(ratio(*[sum(x[k] for x in row_sums) for k in range(4)]))
        return s * sum(row_losses, torch.zeros(()))
    return sum((scale(ratio(*row_sums[b])) * row_losses[b] for b in range(B)), torch.zeros(()))
