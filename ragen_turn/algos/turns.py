"""Turn segmentation: from a token-level response mask to the turn-MDP.

A rollout is one multi-turn episode flattened into one row of tokens. ``response_mask[b, t] = 1``
on tokens the policy generated and 0 on prompt / environment / padding tokens. Turn ``h`` is the
h-th maximal run of 1s. Shapes: ``B`` rows, ``T`` tokens, ``H`` turns (the largest turn count in
the batch). Every function here is pure torch and vectorised over the batch.
"""
from __future__ import annotations

import torch

from .checks import check_mask, check_same_shape


def turn_ids_from_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """Turn index of every response token.

    Args:
        response_mask: ``[B, T]`` 0/1.
    Returns:
        turn_ids: ``[B, T]`` long, ``h`` on the tokens of turn ``h`` (0-based), ``-1`` elsewhere.
    """
    check_mask("response_mask", response_mask)
    m = response_mask.long()
    prev = torch.nn.functional.pad(m[:, :-1], (1, 0))
    starts = m * (1 - prev)
    return torch.where(m.bool(), starts.cumsum(dim=1) - 1, torch.full_like(m, -1))


def check_turn_ids(turn_ids: torch.Tensor, response_mask: torch.Tensor) -> int:
    """Validate ``turn_ids`` ``[B, T]`` against ``response_mask`` ``[B, T]``; return H.

    Turn ids must be -1 exactly off the response, non-decreasing along a row and cover
    ``0..n_b-1`` with no empty turn (every id up to the row's last one has >= 1 token).
    """
    check_same_shape(turn_ids=turn_ids, response_mask=response_mask)
    on = turn_ids >= 0
    if not torch.equal(on, response_mask.bool()):
        raise ValueError("turn_ids must be >= 0 exactly where response_mask is 1 (and -1 elsewhere)")
    if turn_ids.numel() == 0 or not on.any():
        return 0
    ids = torch.where(on, turn_ids, torch.full_like(turn_ids, -1))
    running_max = ids.cummax(dim=1).values
    if (on & (ids < running_max)).any():
        raise ValueError("turn_ids must be non-decreasing along each row")
    num_turns = int(ids.max()) + 1
    counts = turn_token_counts(turn_ids, num_turns)
    last = ids.max(dim=1).values  # [B]
    expected = torch.arange(num_turns, device=ids.device)[None, :] <= last[:, None]
    if (expected & (counts == 0)).any():
        raise ValueError("turn_ids has an empty turn: some turn index below a row's last turn has no token")
    return num_turns


def num_turns(turn_ids: torch.Tensor) -> int:
    """H: the largest number of turns of any row (``turn_ids`` ``[B, T]``)."""
    return int(turn_ids.max().clamp(min=-1)) + 1 if turn_ids.numel() else 0


def turn_token_counts(turn_ids: torch.Tensor, H: int) -> torch.Tensor:
    """Tokens per turn. ``turn_ids`` ``[B, T]`` -> ``[B, H]`` long."""
    return turn_sums(torch.ones_like(turn_ids, dtype=torch.long), turn_ids, H)


def turn_sums(x: torch.Tensor, turn_ids: torch.Tensor, H: int) -> torch.Tensor:
    """Sum of ``x`` over each turn's tokens (differentiable in ``x``).

    Args:
        x: ``[B, T]``; turn_ids: ``[B, T]`` (-1 = not in a turn).
    Returns:
        ``[B, H]``: ``out[b, h] = sum_{t: turn_ids[b,t]=h} x[b, t]``.
    """
    B = x.shape[0]
    idx = turn_ids.clamp(min=0)
    x = torch.where(turn_ids >= 0, x, torch.zeros_like(x))
    out = torch.zeros(B, max(H, 1), dtype=x.dtype, device=x.device)
    return out.scatter_add(1, idx, x)[:, :H]


def turn_mask_from_ids(turn_ids: torch.Tensor, H: int) -> torch.Tensor:
    """``[B, H]`` float 0/1: 1 where row b has a turn h."""
    return (turn_token_counts(turn_ids, H) > 0).float()


def turn_boundaries(turn_ids: torch.Tensor, H: int) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last token position of each turn.

    Returns:
        starts, ends: ``[B, H]`` long; for missing turns both are 0 (mask them with ``turn_mask``).
    """
    B, T = turn_ids.shape
    pos = torch.arange(T, device=turn_ids.device).expand(B, T)
    big = torch.full_like(pos, T)
    idx = turn_ids.clamp(min=0)
    on = turn_ids >= 0
    starts = torch.full((B, max(H, 1)), T, dtype=torch.long, device=turn_ids.device)
    starts = starts.scatter_reduce(1, idx, torch.where(on, pos, big), reduce="amin")[:, :H]
    ends = torch.full((B, max(H, 1)), -1, dtype=torch.long, device=turn_ids.device)
    ends = ends.scatter_reduce(1, idx, torch.where(on, pos, -torch.ones_like(pos)), reduce="amax")[:, :H]
    present = ends >= 0
    return torch.where(present, starts, 0), torch.where(present, ends, 0)


def state_positions(turn_ids: torch.Tensor, H: int) -> torch.Tensor:
    """Where the turn critic reads V(s_h): the last token of state s_h.

    s_h is every token before turn h's first generated token, so its last token sits at
    ``start_h - 1``. (In verl's layout, where the critic's ``values[:, i]`` come from the hidden
    state just before response token i, this is "the value at the first token of turn h".)

    Returns:
        ``[B, H]`` long positions (0 for missing turns). Raises ValueError if a turn starts at
        position 0 (its state would be empty: every rollout starts with a prompt).
    """
    starts, _ = turn_boundaries(turn_ids, H)
    mask = turn_mask_from_ids(turn_ids, H).bool()
    if (mask & (starts == 0)).any():
        raise ValueError("a turn starts at token 0: the state s_h before it is empty (no prompt tokens)")
    return torch.where(mask, starts - 1, torch.zeros_like(starts))


def gather_turns(x: torch.Tensor, positions: torch.Tensor, turn_mask: torch.Tensor) -> torch.Tensor:
    """Read ``x`` ``[B, T]`` at ``positions`` ``[B, H]``; 0 where ``turn_mask`` ``[B, H]`` is 0."""
    out = x.gather(1, positions)
    return out * turn_mask.to(out.dtype)


def scatter_turns(turn_values: torch.Tensor, turn_ids: torch.Tensor) -> torch.Tensor:
    """Broadcast one value per turn onto every token of that turn.

    Args:
        turn_values: ``[B, H]``; turn_ids: ``[B, T]``.
    Returns:
        ``[B, T]``: ``turn_values[b, turn_ids[b, t]]`` on response tokens, 0 elsewhere.
    """
    if turn_values.shape[1] == 0:
        return torch.zeros(turn_ids.shape, dtype=turn_values.dtype, device=turn_values.device)
    out = turn_values.gather(1, turn_ids.clamp(min=0))
    return torch.where(turn_ids >= 0, out, torch.zeros_like(out))


def place_turn_rewards(turn_rewards: torch.Tensor, turn_ids: torch.Tensor) -> torch.Tensor:
    """Token-level rewards: r_h on the last token of turn h, 0 elsewhere.

    Args:
        turn_rewards: ``[B, H]``; turn_ids: ``[B, T]``.
    Returns:
        token_rewards ``[B, T]``.
    """
    H = turn_rewards.shape[1]
    _, ends = turn_boundaries(turn_ids, H)
    mask = turn_mask_from_ids(turn_ids, H)
    out = torch.zeros(turn_ids.shape, dtype=turn_rewards.dtype, device=turn_rewards.device)
    return out.scatter_add(1, ends, turn_rewards * mask.to(turn_rewards.dtype))


def compact_rows(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack the masked entries of each row to the left.

    Args:
        x: ``[B, T]``; mask: ``[B, T]`` 0/1.
    Returns:
        packed ``[B, N]`` (N = max row count; zero padded), packed_mask ``[B, N]``, rank ``[B, T]``
        (the packed column of each masked entry, used by :func:`uncompact_rows`).
    """
    m = mask.bool()
    rank = m.long().cumsum(dim=1) - 1
    N = int(m.sum(dim=1).max()) if m.numel() else 0
    B = x.shape[0]
    packed = torch.zeros(B, N + 1, dtype=x.dtype, device=x.device)
    col = torch.where(m, rank, torch.full_like(rank, N))  # unmasked entries go to a spill column
    packed = packed.scatter(1, col, torch.where(m, x, torch.zeros_like(x)))[:, :N]
    packed_mask = torch.arange(N, device=x.device)[None, :] < m.sum(dim=1, keepdim=True)
    return packed, packed_mask.to(x.dtype), rank


def uncompact_rows(packed: torch.Tensor, mask: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`compact_rows`: ``[B, N]`` -> ``[B, T]`` with 0 off the mask."""
    if packed.shape[1] == 0:
        return torch.zeros(mask.shape, dtype=packed.dtype, device=packed.device)
    out = packed.gather(1, rank.clamp(min=0))
    return torch.where(mask.bool(), out, torch.zeros_like(out))


def turn_start_values(values: torch.Tensor, turn_ids: torch.Tensor, H: int) -> torch.Tensor:
    """V(s_h) for every turn, from critic values indexed by the token they precede.

    Both engines lay values out as ``values[:, t]`` = V(state just before token t) (verl's
    convention), so V(s_h) is the value at turn h's first token. This is the one place that reads it.

    Args:
        values: ``[B, T]``; turn_ids: ``[B, T]``.
    Returns:
        ``[B, H]``, 0 for missing turns.
    """
    starts, _ = turn_boundaries(turn_ids, H)
    return gather_turns(values, starts, turn_mask_from_ids(turn_ids, H))


def values_before_tokens(hidden_values: torch.Tensor) -> torch.Tensor:
    """Shift per-position critic outputs to verl's layout.

    Args:
        hidden_values: ``[B, T]``, the value head at each position's hidden state (the state after
            reading tokens <= t).
    Returns:
        ``[B, T]`` with ``out[:, t] = hidden_values[:, t-1]`` (``out[:, 0] = 0``): the value of the
        state just before token t.
    """
    return torch.nn.functional.pad(hidden_values[:, :-1], (1, 0))
