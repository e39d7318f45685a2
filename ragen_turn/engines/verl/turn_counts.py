"""The actor loss the verl engine installs: verl's ``ppo_loss`` plus the mini-batch turn count.

verl normalises a micro-batch's loss by counts over the whole (global) mini-batch, which it only
knows for tokens and sequences. ``turn_ppo``'s default ``turn-mean`` needs the number of turns in
the mini-batch: the trainer computes it per row (:func:`minibatch_turn_counts`) into the batch field
``ragen_minibatch_turns``, and this wrapper hands it to the policy loss through
``config.global_batch_info["batch_num_turns"]`` (see ``register.global_counts``).
"""
from __future__ import annotations

import torch
from verl.utils.metric import Metric
from verl.workers.utils.losses import ppo_loss

from . import trust_region

# the statistics our policy losses return (ragen_turn.algos.losses.loss_from_units), each a micro-batch's share
LOSS_STATISTICS = ("actor/clip_frac_token", "actor/clip_frac_turn", "actor/dual_clip_frac", "actor/token_band_frac",
                   "actor/live_frac", "actor/approx_kl", "actor/ratio_mean", "actor/token_outside_frac",
                   "actor/token_outside_kept_frac", "actor/clip_bias_ratio", "actor/clip_bias_scale")

TURNS_FIELD = "ragen_minibatch_turns"


def ppo_loss_with_turn_counts(config, model_output, data, dp_group=None):
    """verl's ``ppo_loss`` with the mini-batch's turn count handed to our loss, and our loss's statistics
    aggregated as verl aggregates ``actor/pg_loss``: each is a micro-batch's share of the mini-batch's value
    (``ragen_turn.algos.losses``), so they are summed over a mini-batch's micro-batches (verl would average
    them), then averaged over mini-batches: the same numbers as the local engine for any micro-batch size."""
    counts = _first(data, TURNS_FIELD)
    if counts is not None:
        config.global_batch_info["batch_num_turns"] = counts
    else:
        config.global_batch_info.pop("batch_num_turns", None)
    trust_region.start_update(_first(data, trust_region.UPDATE_FIELD))
    loss, metrics = ppo_loss(config, model_output, data, dp_group)
    # this micro-batch's shares of the statistics actor.target_kl / step_scale act on (trust_region.AdamW)
    trust_region.add_micro_batch(_scalar(metrics.get("actor/approx_kl")), _scalar(metrics.get("actor/live_frac")))
    pg = metrics.get("actor/pg_loss")
    if isinstance(pg, Metric):
        for key, val in list(metrics.items()):
            if key in LOSS_STATISTICS and isinstance(val, Metric) and val.aggregation != pg.aggregation:
                summed = Metric(aggregation=pg.aggregation)
                summed.extend(list(val.values))
                metrics[key] = summed
    return loss, metrics


def _first(data, field: str):
    """The first row's value of a per-row field of the micro-batch (the same on every row), or None."""
    col = data.get(field, None) if hasattr(data, "get") else None
    if col is None:
        return None
    values = col.values() if getattr(col, "is_nested", False) else col
    return float(values.reshape(-1)[0])


def _scalar(metric):
    """A loss statistic of one micro-batch (a verl ``Metric`` of one value, or a number) as a float, or None."""
    if metric is None:
        return None
    if isinstance(metric, Metric):
        return float(sum(metric.values))
    return float(metric)


def minibatch_turn_counts(turns_per_row: torch.Tensor, mini_batch_size: int, dp_size: int) -> torch.Tensor:
    """For every row, the number of turns in the global mini-batch it is trained in.

    verl's update splits the batch into ``dp_size`` contiguous chunks (one per data-parallel rank) and
    each rank walks its chunk in order (``actor.shuffle=false``) in mini-batches of
    ``mini_batch_size / dp_size`` rows; global mini-batch j is the union of every rank's j-th one.

    Args:
        turns_per_row: ``[B]`` turns of each row (in the order sent to the workers).
    Returns:
        ``[B]`` float.
    """
    B = int(turns_per_row.shape[0])
    if B % dp_size or mini_batch_size % dp_size:
        raise ValueError(f"batch {B} and mini-batch {mini_batch_size} must be multiples of dp size {dp_size}")
    per_rank, per_mb = B // dp_size, mini_batch_size // dp_size
    if per_rank % per_mb:
        raise ValueError(f"mini-batch {mini_batch_size} must divide the batch {B}")
    pos = torch.arange(B)
    mb = (pos % per_rank) // per_mb
    totals = torch.zeros(per_rank // per_mb, dtype=torch.float64).index_add(0, mb, turns_per_row.double())
    return totals[mb].float()
