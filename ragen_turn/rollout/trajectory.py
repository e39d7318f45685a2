"""The ``Trajectory`` batch that rollouts produce and the algorithm core consumes.

Token layout: one row per episode, the whole multi-turn conversation flattened into one token
sequence, right padded. ``response_mask`` is 1 exactly on the tokens the policy sampled (never on
prompt, environment or chat-template tokens); ``turn_ids`` numbers those runs 0..n-1.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, List, Optional

import torch

from ragen_turn.models.logprobs import positions_from_mask


@dataclass
class Episode:
    """One finished multi-turn episode, token in / token out."""

    token_ids: List[int]
    response_mask: List[int]
    turn_ids: List[int]
    turn_rewards: List[float]
    group_id: int
    env_seed: int
    tag: str = ""
    success: bool = False
    num_actions: int = 0            # actions that reached the env
    num_valid_actions: int = 0      # of those, the ones the env called valid
    num_effective_actions: int = 0  # of those, the ones that changed the env's state
    num_dropped_actions: int = 0    # action names the env does not declare, dropped before the env
    format_errors: int = 0
    truncated: bool = False  # cut (context window, turn limit or action budget) before the env said done
    texts: List[str] = field(default_factory=list)  # the decoded responses, for logs
    turn_format_ok: List[bool] = field(default_factory=list)  # per turn: an answer was parsed (raw envs: valid)
    turn_invalid: List[int] = field(default_factory=list)  # per turn: actions dropped or called invalid by the env
    metrics: Dict[str, float] = field(default_factory=dict)  # env-specific episode numbers (info["episode_metrics"])
    # the sampler's log-prob of each token it sampled (0 elsewhere), aligned with token_ids; empty if not kept
    sampled_logprobs: List[float] = field(default_factory=list)

    @property
    def num_turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def total_reward(self) -> float:
        return float(sum(self.turn_rewards))


@dataclass
class Trajectory:
    """A padded batch of episodes. Shapes: ``[B, T]`` tokens, ``[B, H]`` turns, ``[B]`` episodes."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    turn_ids: torch.Tensor
    turn_rewards: torch.Tensor
    turn_mask: torch.Tensor
    group_ids: torch.Tensor
    success: torch.Tensor
    episode_rewards: torch.Tensor
    # filled by the trainer: token layout [B, T]
    old_logp: Optional[torch.Tensor] = None
    ref_logp: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None  # values[:, t] = V of the state just before token t
    bootstrap_values: Optional[torch.Tensor] = None  # [B] V after the last turn of truncated rows, 0 for finished ones
    sampled_logp: Optional[torch.Tensor] = None  # [B, T] the sampler's log-probs (every episode kept them), else None
    advantages: Optional[torch.Tensor] = None
    returns: Optional[torch.Tensor] = None  # token / no-critic estimators' returns (None for the turn critic)
    # turn layout [B, H]
    turn_returns: Optional[torch.Tensor] = None  # return_h of a turn-critic estimator (turn GAE), per turn
    episodes: List[Episode] = field(default_factory=list)

    TURN_FIELDS = ("turn_rewards", "turn_mask", "turn_returns")

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def from_episodes(cls, episodes: List[Episode], pad_token_id: int) -> "Trajectory":
        if not episodes:
            raise ValueError("no episodes to batch")
        B = len(episodes)
        T = max(len(e.token_ids) for e in episodes)
        H = max(max(e.num_turns for e in episodes), 1)
        input_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(B, T, dtype=torch.long)
        response_mask = torch.zeros(B, T, dtype=torch.float32)
        turn_ids = torch.full((B, T), -1, dtype=torch.long)
        turn_rewards = torch.zeros(B, H)
        turn_mask = torch.zeros(B, H)
        for b, e in enumerate(episodes):
            n = len(e.token_ids)
            input_ids[b, :n] = torch.tensor(e.token_ids, dtype=torch.long)
            attention_mask[b, :n] = 1
            response_mask[b, :n] = torch.tensor(e.response_mask, dtype=torch.float32)
            turn_ids[b, :n] = torch.tensor(e.turn_ids, dtype=torch.long)
            turn_rewards[b, : e.num_turns] = torch.tensor(e.turn_rewards, dtype=torch.float32)
            turn_mask[b, : e.num_turns] = 1.0
        sampled = None
        if all(e.sampled_logprobs and len(e.sampled_logprobs) == len(e.token_ids) for e in episodes):
            sampled = torch.zeros(B, T)
            for b, e in enumerate(episodes):
                sampled[b, :len(e.token_ids)] = torch.tensor(e.sampled_logprobs, dtype=torch.float32)
        return cls(
            input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask, sampled_logp=sampled,
            turn_ids=turn_ids, turn_rewards=turn_rewards, turn_mask=turn_mask,
            group_ids=torch.tensor([e.group_id for e in episodes], dtype=torch.long),
            success=torch.tensor([float(e.success) for e in episodes]),
            episode_rewards=torch.tensor([e.total_reward for e in episodes]),
            episodes=list(episodes),
        )

    def select(self, index: torch.Tensor | List[int]) -> "Trajectory":
        """Rows ``index`` of every tensor field (and episode list); trims padding columns."""
        idx = torch.as_tensor(index, dtype=torch.long)
        out: Dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = v[idx]
            elif f.name == "episodes":
                out[f.name] = [v[i] for i in idx.tolist()] if v else []
            else:
                out[f.name] = v
        sub = Trajectory(**out)
        return sub.trim()

    def micro_batches(self, size: int, split: str = "rows") -> List[torch.Tensor]:
        """Row indices in chunks of at most ``size`` rows, rows of similar length together: every row appears
        once, and a chunk passed to :meth:`select` is padded only to its own longest row. Which rows share a chunk
        does not change a sum over the rows (a mini-batch's loss, its gradient), only the padding computed on: with
        Sokoban's episodes, 64 rows in chunks of 16 run on about 0.7x the tokens of chunks in row order
        (``benchmarks/bench_micro_batches.py``).

        ``split``: ``rows`` cuts the length-sorted rows every ``size`` rows (the last chunk may be shorter);
        ``padding`` cuts them where the padded tokens plus one longest row per chunk (a chunk's fixed cost) add up
        to the least (:func:`padding_split`): e.g. 16 rows of 600-1,900 tokens (long_horizon) run on ~0.8x the
        tokens of one chunk."""
        lengths = self.attention_mask.sum(dim=1)
        order = torch.argsort(lengths, stable=True)
        size = max(1, int(size))
        if split == "padding":
            cuts = padding_split(lengths[order].tolist(), size)
            return [order[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
        if split != "rows":
            raise ValueError(f"micro_batches: split={split!r} (rows | padding)")
        return [order[i:i + size] for i in range(0, self.batch_size, size)]

    def trim(self) -> "Trajectory":
        """Drop all-padding token columns on the right and all-empty turn columns."""
        T = int(self.attention_mask.sum(dim=1).max()) if self.batch_size else 0
        H = max(int(self.turn_mask.sum(dim=1).max()), 1) if self.batch_size else 1
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, torch.Tensor) or v.dim() != 2:
                continue
            setattr(self, f.name, v[:, :H] if f.name in self.TURN_FIELDS else v[:, :T])
        return self

    def to(self, device: torch.device | str) -> "Trajectory":
        """A Trajectory with every tensor field on ``device`` (``self`` is unchanged; episodes are shared)."""
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})

    @property
    def position_ids(self) -> torch.Tensor:
        """``[B, T]``: HF ``generate``'s positions for the rows
        (:func:`~ragen_turn.models.logprobs.positions_from_mask`)."""
        return positions_from_mask(self.attention_mask)


def padding_split(sorted_lengths: List[int], size: int) -> List[int]:
    """Cut points ``[0, ..., n]`` of ascending ``sorted_lengths`` into chunks of at most ``size`` rows that
    minimise the sum over chunks of ``(rows + 1) x longest``: the tokens a chunk padded to its longest row computes,
    plus one such row for its fixed cost (so that rows of near lengths are not split for a few pad tokens). Dynamic
    programming over the ``n x size`` (chunk end, rows) pairs; of equal costs, the one whose last chunk is largest."""
    n = len(sorted_lengths)
    best = [0.0] + [float("inf")] * n  # best[j]: the least cost of rows [0, j)
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = sorted_lengths[j - 1]
        for i in range(max(0, j - size), j):  # the last chunk is rows [i, j)
            cost = best[i] + (j - i + 1) * longest
            if cost < best[j]:
                best[j], cut[j] = cost, i
    points, j = [n], n
    while j > 0:
        j = cut[j]
        points.append(j)
    return points[::-1]

