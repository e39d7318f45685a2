"""Policy and value losses: token PPO, turn PPO (sum / geo-mean ratio), turn IS, the clipping-bias correction.

Every policy loss has verl's signature plus two optional keywords, so a verl adapter is one line::

    loss, metrics = fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=None,
                       config=None, rollout_is_weights=None, turn_ids=None, global_counts=None)

All tensors are ``[B, T]``. ``turn_ids`` defaults to the runs of 1s in ``response_mask``.
``config`` is a dict or an object with attributes (verl's ActorConfig works); its keys are read and
checked by :func:`loss_settings`:

- ``clip_ratio_low`` (0.2), ``clip_ratio_high`` (0.28), or ``clip_ratio`` for both;
- ``clip_ratio_c`` (3.0): dual clip, the loss of a unit with A < 0 is capped at ``-A c`` (verl's name);
- ``ratio_mode``: ``sum`` (turn ratio = product of token ratios) or ``geo_mean`` (length-normalised);
- ``loss_agg_mode``: ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum`` (DrGRPO) or
  ``seq-mean-token-sum-norm`` (verl's; divided by ``loss_scale_factor``) for token units; ``turn-mean``,
  ``token-mean`` or ``seq-mean-turn-sum-token-norm`` (the Turn-PPO reimplementations': a row's turn losses
  summed, divided by its response tokens, mean over rows) for turn units (the argument wins when given);
- ``turn_band``: ``fixed`` (the turn's log-ratio in ``[log(1-low), log(1+high)]``) or ``sqrt_len`` (that band
  times ``sqrt(n_h)`` on the turn's summed log-ratio, for a turn of n_h tokens, whichever ``ratio_mode``);
- ``token_band`` (bool): inside a turn ratio, a token whose own ratio has left token PPO's band on the side its
  advantage pushes gives its turn ratio no gradient (the value is unchanged); ``token_clip_low`` (0.2) and
  ``token_clip_high`` (0.28) are that band, its own keys: the turn's clip range (GSPO's 3e-4 / 4e-4 for a
  geo-mean ratio) does not move it;
- ``clip_bias`` (bool), ``clip_bias_level`` (``sample``/``batch``), ``clip_bias_stat`` (``mass``/``rms``)
  and ``clip_bias_threshold`` (null = 1 for mass, 5 for rms): the clipping-bias correction.

``global_counts`` (:class:`GlobalCounts`) holds the token / turn / row counts of the whole mini-batch
(and the correction's batch-level sums): with it a micro-batch's loss is its share of the mini-batch
loss, so the micro-batch losses of one mini-batch add up to the loss of the whole mini-batch. Without
it the counts are this batch's own.

Each loss is built from its *terms*: one (ratio w_u, advantage A_u, weight n_u) triple per unit u
(a token or a turn), laid out ``[B, K]``. The PPO objective, dual clip, the clip fractions and the
clipping-bias correction are computed once from those terms (:func:`loss_from_units`).

Metrics are means over tokens, turns or rows; with ``global_counts`` each is this micro-batch's share of the
mini-batch's value (its sum divided by the mini-batch's count), so a trainer adds every metric up over a
mini-batch's micro-batches and gets the mini-batch's statistics for any micro-batch size (``actor/pg_loss``: the
loss that was differentiated).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import torch

from ragen_turn.cfg_get import cfg_get

from .checks import check_finite, check_mask, check_ndim, check_same_shape
from .registry import DEFAULT_AGG, LossSpec, Registry
from .turns import check_turn_ids, scatter_turns, turn_sums, turn_token_counts, turn_ids_from_mask

# each entry carries its LossSpec (unit, so default aggregation; forced clipping-bias correction): registry.py
POLICY_LOSS_REGISTRY = Registry("policy loss", LossSpec)
get_policy_loss_fn = POLICY_LOSS_REGISTRY.lookup
policy_loss_spec = POLICY_LOSS_REGISTRY.spec  # name -> LossSpec

TURN_BANDS = ("fixed", "sqrt_len")
RATIO_MODES = ("sum", "geo_mean")
CLIP_BIAS_LEVELS = ("sample", "batch")
CLIP_BIAS_STATS = ("mass", "rms")
CLIP_BIAS_THRESHOLDS = {"mass": 1.0, "rms": 5.0}  # clip_bias_threshold's default, per clip_bias_stat
TOKEN_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
TURN_AGG_MODES = ("turn-mean", "token-mean", "seq-mean-turn-sum-token-norm")


# --------------------------------------------------------------------------------------------
# settings and counts
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LossSettings:
    """The knobs of every policy loss, read from a config and checked (:func:`loss_settings`). The defaults are
    for a direct call; a run's config carries every knob (its defaults: ``PolicyLossConfig`` in
    ``ragen_turn/schema.py``, which ``tests/test_policy_loss_options.py`` checks these against)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_c: float = 3.0
    ratio_mode: Optional[str] = None
    loss_agg_mode: Optional[str] = None
    clip_bias: bool = False
    clip_bias_level: str = "sample"
    clip_bias_stat: str = "mass"
    clip_bias_threshold: float = CLIP_BIAS_THRESHOLDS["mass"]
    turn_band: str = "fixed"
    token_band: bool = False
    loss_scale_factor: Optional[float] = None
    token_clip_low: float = 0.2  # token_band's band (token PPO's), whatever the turn ratio's clip range
    token_clip_high: float = 0.28

    @property
    def log_ratio_cap(self) -> float:
        """Above this log-ratio every unit's loss is flat in the ratio (A > 0: PPO-clipped at 1+eps_high;
        A < 0: dual-clipped at c; A = 0: zero), so capping the exponent there changes neither the loss
        nor its gradient: it only keeps ``exp`` finite."""
        return math.log(max(self.clip_c, 1.0 + self.clip_high))


def loss_settings(config: Any) -> LossSettings:
    """Read and check the loss keys of ``config``; a ValueError names the bad key. A key the config lacks (or
    sets to null) takes :class:`LossSettings`' default (the run config's defaults: ``ragen_turn/schema.py``)."""
    d = _DEFAULTS
    both = cfg_get(config, "clip_ratio", None)
    low = float(cfg_get(config, "clip_ratio_low", both if both is not None else d.clip_low))
    high = float(cfg_get(config, "clip_ratio_high", both if both is not None else d.clip_high))
    if not (0 <= low < 1) or high < 0:
        raise ValueError(f"clip_ratio_low must be in [0, 1) and clip_ratio_high >= 0, got {low}, {high}")
    c = float(cfg_get(config, "clip_ratio_c", d.clip_c))
    if not (c > 1.0 and math.isfinite(c)):
        raise ValueError(f"clip_ratio_c (dual clip) must be a finite number > 1, got {c}")
    mode = cfg_get(config, "ratio_mode", d.ratio_mode)
    if mode not in (None,) + RATIO_MODES:
        raise ValueError(f"ratio_mode must be 'sum' or 'geo_mean', got {mode!r}")
    agg = cfg_get(config, "loss_agg_mode", d.loss_agg_mode)
    level = cfg_get(config, "clip_bias_level", d.clip_bias_level)
    if level not in CLIP_BIAS_LEVELS:
        raise ValueError(f"clip_bias_level must be 'sample' or 'batch', got {level!r}")
    stat = cfg_get(config, "clip_bias_stat", d.clip_bias_stat)
    if stat not in CLIP_BIAS_STATS:
        raise ValueError(f"clip_bias_stat must be 'mass' or 'rms', got {stat!r}")
    thr = float(cfg_get(config, "clip_bias_threshold", CLIP_BIAS_THRESHOLDS[stat]))
    if not thr >= 1.0:
        raise ValueError(f"clip_bias_threshold must be >= 1 (the correction only scales down), got {thr}")
    band = cfg_get(config, "turn_band", d.turn_band)
    if band not in TURN_BANDS:
        raise ValueError(f"turn_band must be one of {TURN_BANDS}, got {band!r}")
    if agg is not None and agg not in TOKEN_AGG_MODES + TURN_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {sorted(set(TOKEN_AGG_MODES + TURN_AGG_MODES))}, got {agg!r}")
    loss = cfg_get(config, "loss_mode", None)
    if agg is not None and loss in POLICY_LOSS_REGISTRY:  # before any work, not at the first update
        unit = POLICY_LOSS_REGISTRY.spec(loss).unit
        modes = TOKEN_AGG_MODES if unit == "token" else TURN_AGG_MODES
        if agg not in modes:
            raise ValueError(f"loss_agg_mode {agg!r} is not valid for {loss} (a {unit}-unit loss): {list(modes)}")
    scale = cfg_get(config, "loss_scale_factor", d.loss_scale_factor)
    if scale is not None and not (float(scale) > 0 and math.isfinite(float(scale))):
        raise ValueError(f"loss_scale_factor must be a finite number > 0, got {scale}")
    tok_low = float(cfg_get(config, "token_clip_low", d.token_clip_low))
    tok_high = float(cfg_get(config, "token_clip_high", d.token_clip_high))
    if not 0 <= tok_low < 1:
        raise ValueError(f"token_clip_low must be in [0, 1), got {tok_low}")
    if not (tok_high >= 0 and math.isfinite(tok_high)):
        raise ValueError(f"token_clip_high must be a finite number >= 0, got {tok_high}")
    return LossSettings(low, high, c, mode, agg, bool(cfg_get(config, "clip_bias", d.clip_bias)), level, stat, thr,
                        band, bool(cfg_get(config, "token_band", d.token_band)),
                        None if scale is None else float(scale), tok_low, tok_high)


_DEFAULTS = LossSettings()


@dataclass(frozen=True)
class GlobalCounts:
    """Denominators of a loss's means over the whole mini-batch, so micro-batch losses add up to it.

    tokens: response tokens; turns: turns; rows: rows with a response. Under data parallelism each
    rank's loss is averaged over ranks, so pass the counts divided by ``dp_size`` (verl's rule).
    clip_stats: ``[4]`` the correction's batch-level sums over the mini-batch
    (:func:`minibatch_clip_stats` summed over its micro-batches); None = this batch's own.
    """

    tokens: float
    turns: float
    rows: float
    clip_stats: Optional[torch.Tensor] = None

    @classmethod
    def of(cls, response_mask: torch.Tensor, turn_ids: Optional[torch.Tensor] = None,
           dp_size: int = 1) -> "GlobalCounts":
        """The counts of the mini-batch ``response_mask`` ``[B, T]`` (its turns: ``turn_ids`` or mask runs)."""
        mask = response_mask.bool()
        ids = turn_ids_from_mask(mask) if turn_ids is None else turn_ids
        turns = float((ids.max(dim=1).values + 1).clamp(min=0).sum()) if ids.numel() else 0.0
        return cls(tokens=float(mask.sum()) / dp_size, turns=turns / dp_size,
                   rows=float((mask.sum(dim=1) > 0).sum()) / dp_size)

    def with_clip_stats(self, stats: Optional[torch.Tensor]) -> "GlobalCounts":
        return dataclasses.replace(self, clip_stats=stats)


def _denominator(local: torch.Tensor, global_count: Optional[float]) -> torch.Tensor:
    """The mean's denominator: the global count when given (> 0), else the local one (at least 1)."""
    if global_count is not None and global_count > 0:
        return torch.as_tensor(float(global_count), dtype=local.dtype, device=local.device)
    return local.clamp(min=1)


# --------------------------------------------------------------------------------------------
# terms, the PPO objective with dual clip, the clipping-bias correction
# --------------------------------------------------------------------------------------------
@dataclass
class PPOTerms:
    """The units a PPO loss averages, laid out ``[B, K]`` (K = T for tokens, H for turns).

    ratio: importance ratio w_u (differentiable; its exponent capped where the loss is flat in it,
    :func:`capped_exp`); advantages: A_u; weight: n_u, the unit's weight in the loss's mean (0 on padding);
    log_ratio: log w_u, uncapped and detached (for the clip masks and statistics; default ``log(ratio)``);
    log_low / log_high: the unit's clip band on log w_u (None = ``log(1-low)``, ``log(1+high)`` for every unit).
    """

    ratio: torch.Tensor
    advantages: torch.Tensor
    weight: torch.Tensor
    log_ratio: Optional[torch.Tensor] = None
    log_low: Optional[torch.Tensor] = None
    log_high: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.log_ratio is None:
            self.log_ratio = torch.log(self.ratio.detach().clamp(min=1e-45))

    def band(self, clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log_low, log_high)`` ``[B, K]``: each unit's clip band on its log-ratio."""
        lo = self.log_low if self.log_low is not None else torch.full_like(self.log_ratio, math.log1p(-clip_low))
        hi = self.log_high if self.log_high is not None else torch.full_like(self.log_ratio, math.log1p(clip_high))
        return lo, hi


@dataclass
class LossUnits:
    """A loss's terms plus the token view of its units.

    unit_ids ``[B, T]``: the unit (column of ``terms``) of each response token, -1 elsewhere;
    token_log_ratio ``[B, T]``: each token's own log-ratio d_t; token_advantages ``[B, T]``;
    mask ``[B, T]`` float; turn_ids ``[B, T]`` and H for turn metrics; token_gated ``[B, T]`` bool: tokens
    ``token_band`` keeps out of their turn ratio's gradient (None = none).
    """

    terms: PPOTerms
    unit_ids: torch.Tensor
    token_log_ratio: torch.Tensor
    token_advantages: torch.Tensor
    mask: torch.Tensor
    turn_ids: torch.Tensor
    H: int
    token_gated: Optional[torch.Tensor] = None

    def on_tokens(self, unit_values: torch.Tensor) -> torch.Tensor:
        """``[B, K]`` per-unit values -> ``[B, T]`` per-token (0 off the response)."""
        if unit_values.shape[1] == 0:
            return torch.zeros_like(self.mask, dtype=unit_values.dtype)
        out = unit_values.gather(1, self.unit_ids.clamp(min=0))
        return torch.where(self.unit_ids >= 0, out, torch.zeros_like(out))


def clip_region(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float) -> torch.Tensor:
    """Where PPO's clip takes the gradient away: A > 0 and w > 1+high, or A < 0 and w < 1-low (bool, same shape)."""
    return clip_region_log(log_ratio, advantages, math.log1p(-clip_low), math.log1p(clip_high))


def clip_region_log(log_ratio: torch.Tensor, advantages: torch.Tensor, log_low, log_high) -> torch.Tensor:
    """:func:`clip_region` with the band given on log w (floats or tensors shaped like ``log_ratio``)."""
    return ((advantages > 0) & (log_ratio > log_high)) | ((advantages < 0) & (log_ratio < log_low))


def capped_exp(log_ratio: torch.Tensor, settings: "LossSettings", log_high=None) -> torch.Tensor:
    """``exp(log_ratio)`` with the exponent capped where every unit's loss is flat in it: above
    ``max(log c, log_high)`` a unit is PPO-clipped (A > 0), dual-clipped (A < 0) or has A = 0, so the cap changes
    neither the loss nor its gradient (SPEC "Keeping exp finite"). ``log_high``: per-unit upper bounds (a tensor)."""
    cap = settings.log_ratio_cap
    if log_high is None:
        return torch.exp(log_ratio.clamp(max=cap))
    return torch.exp(torch.minimum(log_ratio, log_high.clamp(min=cap)))


def ppo_objective(terms: PPOTerms, clip_low: float, clip_high: float,
                  clip_c: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-unit clipped surrogate with dual clip, and which units it clips.

    ``l_u = max(-w A, -clip(w, e^{log_low_u}, e^{log_high_u}) A)`` (the band: ``[1-low, 1+high]`` unless the
    terms carry per-unit bounds), and for A < 0 ``l_u = min(l_u, -c A)`` (dual clip, verl's ``clip_ratio_c``;
    None = off). PPO-clipped: A > 0 and w above the band, or A < 0 and w below it. Dual-clipped: A < 0 and w > c.
    Both get zero gradient.

    Returns:
        per_unit_loss ``[B, K]``, clipped ``[B, K]`` bool, dual_clipped ``[B, K]`` bool.
    """
    w, A = terms.ratio, terms.advantages
    lw = terms.log_ratio  # the masks read the uncapped ratio (w itself stops at the cap)
    unclipped = -w * A
    if terms.log_low is None and terms.log_high is None:
        clipped_val = -w.clamp(1.0 - clip_low, 1.0 + clip_high) * A
        clipped = clip_region(lw, A, clip_low, clip_high)
    else:
        lo, hi = terms.band(clip_low, clip_high)
        clipped_val = -torch.minimum(torch.maximum(w, lo.exp()), hi.exp()) * A
        clipped = clip_region_log(lw, A, lo, hi)
    per_unit = torch.where(clipped, clipped_val, unclipped)  # == max(unclipped, clipped_val)
    if clip_c is None:
        return per_unit, clipped, torch.zeros_like(clipped)
    dual = (A < 0) & (lw > math.log(clip_c))
    return torch.where(dual, -A * clip_c, per_unit), clipped, dual


def clip_bias_sums(units: LossUnits, clipped: torch.Tensor, dual: torch.Tensor, settings: LossSettings) -> torch.Tensor:
    """Per-row sums the correction's statistic is made of: ``[B, 4]`` float64 ``(S_out, N_out, S_in, N_in)``.

    ``mass`` (SPEC's reading): over the loss's units, S = sum of (n_u w_u A_u)^2, "out" = the units
    clipping gives no gradient (``clipped | dual``). A dual-clipped unit (A < 0, w > c) enters at ``w = c``:
    its loss is capped at ``c |A|``, so that is the most of its gradient the cap throws away (at its raw ratio
    one long turn would scale the rest of its row to nothing). ``rms`` (SORL's code): over response tokens,
    S = sum of (w_t A_t)^2 with the token's own ratio, "out" = tokens whose ratio lies outside
    [1-low, 1+high]. N counts the units of each side. Sums add up over rows and micro-batches.
    """
    no_grad_units = clipped | dual
    if settings.clip_bias_stat == "mass":
        t = units.terms
        lw = t.log_ratio.double().clamp(max=300.0)  # (e^300)^2 still fits a float64
        lw = torch.where(dual, lw.clamp(max=math.log(settings.clip_c)), lw)
        x2 = (t.weight.double() * torch.exp(lw) * t.advantages.double()) ** 2
        present = t.weight != 0
        out = no_grad_units & present
        inside = ~no_grad_units & present
    else:
        d = units.token_log_ratio.detach().double()
        w = torch.exp(d.clamp(max=300.0))
        x2 = (w * units.token_advantages.double()) ** 2
        on = units.mask.bool()
        outside = (w < 1.0 - settings.clip_low) | (w > 1.0 + settings.clip_high)
        out, inside = on & outside, on & ~outside
    zero = torch.zeros_like(x2)
    return torch.stack([torch.where(out, x2, zero).sum(dim=1), out.double().sum(dim=1),
                        torch.where(inside, x2, zero).sum(dim=1), inside.double().sum(dim=1)], dim=-1)


def clip_bias_ratio(sums: torch.Tensor, stat: str, eps: float = 1e-8) -> torch.Tensor:
    """The statistic r from sums ``[..., 4]``: mass ``sqrt(S_out) / sqrt(S_in)``, rms ``RMS_out / RMS_in``."""
    s_out, n_out, s_in, n_in = sums.unbind(-1)
    if stat == "rms":
        s_out, s_in = s_out / n_out.clamp(min=1), s_in / n_in.clamp(min=1)
    return s_out.sqrt() / (s_in.sqrt() + eps)


def clip_bias_scale(units: LossUnits, clipped: torch.Tensor, dual: torch.Tensor, settings: LossSettings,
                    global_counts: Optional[GlobalCounts] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The correction's detached scale per row: ``s = 1/r`` where ``r > threshold``, else 1.

    ``clip_bias_level=sample``: one r per row from its own sums. ``batch``: one r from the
    mini-batch's sums (``global_counts.clip_stats``, or this batch's when not given).

    Returns:
        scale ``[B]``, r ``[B]`` (both detached, the loss's dtype).
    """
    sums = clip_bias_sums(units, clipped, dual, settings)
    B = sums.shape[0]
    if settings.clip_bias_level == "batch":
        total = global_counts.clip_stats if global_counts is not None and global_counts.clip_stats is not None \
            else sums.sum(dim=0)
        r = clip_bias_ratio(total.to(sums), settings.clip_bias_stat).expand(B)
    else:
        r = clip_bias_ratio(sums, settings.clip_bias_stat)
    scale = torch.where(r > settings.clip_bias_threshold, 1.0 / r, torch.ones_like(r))
    dtype = units.terms.ratio.dtype
    return scale.to(dtype).detach(), r.to(dtype).detach()


class _Denominators:
    """The denominators of a loss's statistics: the mini-batch's counts when given (so each micro-batch's
    statistic is its share and the shares add up to the mini-batch's value), else this batch's own."""

    def __init__(self, units: LossUnits, global_counts: Optional[GlobalCounts]):
        gc = global_counts
        counts = turn_token_counts(units.turn_ids, units.H)
        self.tokens = float(_denominator(units.mask.sum(), gc.tokens if gc else None))
        self.turns = float(_denominator((counts > 0).sum(), gc.turns if gc else None))
        self.rows = float(_denominator((units.mask.sum(dim=1) > 0).sum(), gc.rows if gc else None))


def loss_from_units(units: LossUnits, settings: LossSettings, apply_clip_bias: bool,
                    global_counts: Optional[GlobalCounts] = None) -> tuple[torch.Tensor, Dict[str, float]]:
    """The PPO loss ``sum_i s_i sum_u n_u l_u`` and its metrics, from any base loss's units.

    Every metric is a mean over tokens, turns or rows; with ``global_counts`` its denominator is the
    mini-batch's count, so it is this micro-batch's share and the shares add up over a mini-batch's
    micro-batches to the mini-batch's value, whatever the micro-batch size (verl sums them as it sums
    ``pg_loss``; the local engine likewise)."""
    terms = units.terms
    per_unit, clipped, dual = ppo_objective(terms, settings.clip_low, settings.clip_high, settings.clip_c)
    row_loss = (terms.weight * per_unit).sum(dim=1)  # [B]: L_i
    den = _Denominators(units, global_counts)
    on = units.mask.bool()
    rows = units.mask.sum(dim=1) > 0
    metrics: Dict[str, float] = {}
    if apply_clip_bias:
        scale, r = clip_bias_scale(units, clipped, dual, settings, global_counts)
        metrics["actor/clip_bias_ratio"] = float(r[rows].double().sum()) / den.rows
        metrics["actor/clip_bias_scale"] = float(scale[rows].double().sum()) / den.rows
        row_loss = row_loss * scale
    loss = row_loss.sum()
    with torch.no_grad():  # float64 sums: the shares add up to the mini-batch's value to float64 rounding
        f = torch.float64
        tok_clipped, tok_dual, gated, live = _token_flags(units, clipped, dual)
        mask = units.mask.to(f)
        metrics["actor/clip_frac_token"] = float(tok_clipped[on].sum()) / den.tokens
        metrics["actor/clip_frac_turn"] = _turn_share_sum(tok_clipped, units) / den.turns
        metrics["actor/dual_clip_frac"] = float(tok_dual[on].sum()) / den.tokens
        metrics["actor/token_band_frac"] = float(gated[on].sum()) / den.tokens
        metrics["actor/live_frac"] = float(live.sum()) / den.tokens
        metrics["actor/pg_loss"] = float(row_loss.detach().double().sum())
        metrics.update(_ratio_metrics(units.token_log_ratio, mask, den.tokens))
        no_grad = ((tok_clipped + tok_dual + gated) > 0).to(f)
        metrics.update(_token_trust_metrics(units, settings, no_grad, den.tokens))
    return loss, metrics


def _token_flags(units: LossUnits, clipped: torch.Tensor, dual: torch.Tensor):
    """Each response token's part in the loss, ``[B, T]`` float64 0/1 each: ``(clipped, dual, gated, live)``:
    its unit PPO-clipped, its unit dual-clipped, kept out of its turn ratio's gradient by ``token_band``, and
    live (none of those: it gets gradient)."""
    f = torch.float64
    tok_clipped = units.on_tokens(clipped.to(f))
    tok_dual = units.on_tokens(dual.to(f))
    mask = units.mask.to(f)
    gated = units.token_gated.to(f) if units.token_gated is not None else torch.zeros_like(mask)
    live = (1 - tok_clipped) * (1 - tok_dual) * (1 - gated) * mask
    return tok_clipped, tok_dual, gated * mask, live


def _token_trust_metrics(units: LossUnits, settings: LossSettings, tok_no_grad: torch.Tensor,
                         n_tokens: float) -> Dict[str, float]:
    """How far a loss's units let single tokens leave token PPO's trust region.

    ``actor/token_outside_frac``: share of response tokens whose *own* ratio lies where token PPO would
    clip them (A_t > 0 and exp(d_t) > 1+high, or A_t < 0 and exp(d_t) < 1-low). ``actor/token_outside_kept_frac``:
    share of response tokens that are outside so and still get gradient, because the unit they belong to
    (their turn, under a turn ratio) is not clipped and ``token_band`` is off. Token PPO keeps none; a turn
    ratio can keep many. Sums over this batch's tokens divided by ``n_tokens``.
    """
    on = units.mask.bool()
    d, A = units.token_log_ratio.detach(), units.token_advantages
    outside = clip_region(d, A, settings.clip_low, settings.clip_high) & on
    kept = outside & (tok_no_grad == 0)
    return {"actor/token_outside_frac": float(outside.sum()) / n_tokens,
            "actor/token_outside_kept_frac": float(kept.sum()) / n_tokens}


def _turn_share_sum(tok_flag: torch.Tensor, units: LossUnits) -> float:
    """Sum over turns of the share of the turn's tokens flagged (0/1 for turn units)."""
    counts = turn_token_counts(units.turn_ids, units.H).to(tok_flag.dtype)
    present = counts > 0
    share = turn_sums(tok_flag * units.mask.to(tok_flag.dtype), units.turn_ids, units.H) / counts.clamp(min=1)
    return float(share[present].sum())


def _ratio_metrics(log_ratio: torch.Tensor, mask: torch.Tensor, n_tokens: float) -> Dict[str, float]:
    """``actor/approx_kl``: the k3 estimate of KL(old || new) per response token; ``actor/ppo_kl``: verl's (k1,
    the mean of old - new log-prob); ``actor/ratio_mean``. Sums over this batch's tokens divided by ``n_tokens``."""
    d = log_ratio.detach().double().clamp(-20, 20)
    k3 = torch.exp(d) - 1 - d  # E_old[r - 1 - log r] with r = new/old
    return {"actor/approx_kl": float((k3 * mask).sum()) / n_tokens,
            "actor/ppo_kl": float((-d * mask).sum()) / n_tokens,
            "actor/ratio_mean": float((torch.exp(d) * mask).sum()) / n_tokens}


# --------------------------------------------------------------------------------------------
# building the units of each loss
# --------------------------------------------------------------------------------------------
def _prepare(old_log_prob, log_prob, advantages, response_mask, turn_ids):
    for name, t in (("old_log_prob", old_log_prob), ("log_prob", log_prob), ("advantages", advantages),
                    ("response_mask", response_mask)):
        check_ndim(name, t, 2)
    check_same_shape(log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages,
                     response_mask=response_mask, turn_ids=turn_ids)
    check_mask("response_mask", response_mask)
    check_finite("advantages", advantages, response_mask)
    check_finite("old_log_prob", old_log_prob, response_mask)
    mask = response_mask.to(log_prob.dtype)
    if turn_ids is None:
        turn_ids = turn_ids_from_mask(response_mask)
        H = int(turn_ids.max()) + 1 if mask.any() else 0
    else:
        H = check_turn_ids(turn_ids, response_mask)
    log_ratio = torch.where(response_mask.bool(), log_prob - old_log_prob, torch.zeros_like(log_prob))
    adv = torch.where(response_mask.bool(), advantages, torch.zeros_like(advantages)).to(log_prob.dtype)
    return mask, turn_ids, H, log_ratio, adv


def _turn_log_ratio(log_ratio: torch.Tensor, turn_ids: torch.Tensor, H: int, mode: str) -> torch.Tensor:
    """Per-turn log-ratio ``[B, H]``: sum (``sum``) or mean (``geo_mean``) of the token log-ratios."""
    s = turn_sums(log_ratio, turn_ids, H)
    if mode == "geo_mean":
        s = s / turn_token_counts(turn_ids, H).clamp(min=1).to(s.dtype)
    return s


def token_band_gate(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                    settings: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_band``: the token log-ratios a turn ratio is built from, with the tokens outside token PPO's band on
    their advantage's side (A > 0 and d_t > log(1+token_clip_high), or A < 0 and d_t < log(1-token_clip_low))
    detached: their value still counts in the turn ratio, their gradient does not. The band is
    ``settings.token_clip_low/high``, not the turn ratio's clip range. Off: ``log_ratio`` as it is.

    Args:
        log_ratio, advantages, mask: ``[B, T]`` (advantages: the token's own, or its turn's).
    Returns:
        gated log-ratio ``[B, T]``, gated ``[B, T]`` bool (None when off).
    """
    if not settings.token_band:
        return log_ratio, None
    gated = clip_region(log_ratio.detach(), advantages, settings.token_clip_low, settings.token_clip_high) & mask.bool()
    return torch.where(gated, log_ratio.detach(), log_ratio), gated


def turn_band_bounds(counts: torch.Tensor, mode: str, settings: LossSettings):
    """``turn_band=sqrt_len``: per-turn bounds ``[B, H]`` on the turn log-ratio, ``sqrt(n_h) x [log(1-low),
    log(1+high)]`` on the turn's summed log-ratio (``sum``), i.e. that divided by n_h on its mean (``geo_mean``).
    A turn whose tokens each move by noise of one token's band stays inside at any length; a steady drift of
    delta per token leaves it once delta > band / sqrt(n_h). ``fixed``: None (the same band for every turn)."""
    if settings.turn_band == "fixed":
        return None, None
    n = counts.clamp(min=1).to(torch.float64)
    f = n.sqrt() if mode == "sum" else 1.0 / n.sqrt()
    dtype = counts.dtype if counts.is_floating_point() else torch.float32
    return ((f * math.log1p(-settings.clip_low)).to(dtype), (f * math.log1p(settings.clip_high)).to(dtype))


def token_units(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, settings: LossSettings,
                rollout_is_weights=None, turn_ids=None, global_counts: Optional[GlobalCounts] = None,
                turn_ratio: bool = False) -> LossUnits:
    """Token units: each response token t with its own advantage A_t and ratio exp(d_t), or its
    turn's ratio (``turn_ratio``, ``ratio_mode`` default ``geo_mean``; ``token_band`` and ``turn_band`` apply);
    weights ``token-mean`` (default), ``seq-mean-token-mean``, ``seq-mean-token-sum`` or
    ``seq-mean-token-sum-norm``."""
    mask, turn_ids, H, log_ratio, adv = _prepare(old_log_prob, log_prob, advantages, response_mask, turn_ids)
    gated, log_low, log_high = None, None, None
    if turn_ratio:
        mode = settings.ratio_mode or "geo_mean"
        lr_in, gated = token_band_gate(log_ratio, adv, mask, settings)
        unit_lr = scatter_turns(_turn_log_ratio(lr_in, turn_ids, H, mode), turn_ids)
        lo, hi = turn_band_bounds(turn_token_counts(turn_ids, H).to(log_prob.dtype), mode, settings)
        if lo is not None:
            log_low, log_high = scatter_turns(lo, turn_ids), scatter_turns(hi, turn_ids)
    else:
        unit_lr = log_ratio
    ratio = capped_exp(unit_lr, settings, log_high) * mask
    agg = loss_agg_mode or settings.loss_agg_mode or DEFAULT_AGG["token"]
    gc = global_counts
    rows = (mask.sum(dim=1, keepdim=True) > 0).to(mask.dtype)
    row_den = _denominator(rows.sum(), gc.rows if gc else None)
    if agg == "token-mean":
        weight = mask / _denominator(mask.sum(), gc.tokens if gc else None)
    elif agg == "seq-mean-token-mean":
        weight = mask / mask.sum(dim=1, keepdim=True).clamp(min=1) / row_den
    elif agg == "seq-mean-token-sum":
        weight = mask / row_den
    elif agg == "seq-mean-token-sum-norm":
        if settings.loss_scale_factor is None:
            raise ValueError("loss_agg_mode seq-mean-token-sum-norm needs loss_scale_factor (a constant: the most "
                             "response tokens a row can have), so the loss is the same for any micro-batch")
        weight = mask / row_den / settings.loss_scale_factor
    else:
        raise ValueError(f"loss_agg_mode {agg!r} is not valid for a token-unit loss {TOKEN_AGG_MODES}")
    if rollout_is_weights is not None:
        weight = weight * rollout_is_weights.detach()
    T = mask.shape[1]
    unit_ids = torch.where(mask.bool(), torch.arange(T, device=mask.device).expand_as(turn_ids),
                           torch.full_like(turn_ids, -1))
    terms = PPOTerms(ratio=ratio, advantages=adv, weight=weight, log_ratio=unit_lr.detach(),
                     log_low=log_low, log_high=log_high)
    return LossUnits(terms, unit_ids, log_ratio, adv, mask, turn_ids, H, gated)


def turn_units(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, settings: LossSettings,
               rollout_is_weights=None, turn_ids=None, global_counts: Optional[GlobalCounts] = None,
               ratio_mode: str = "sum") -> LossUnits:
    """Turn units: one ratio rho_h and one advantage A_h (the mean of ``advantages`` over the turn's
    tokens) per turn (``token_band`` and ``turn_band`` apply); weights ``turn-mean`` (default), ``token-mean``
    (turns weighted by length) or ``seq-mean-turn-sum-token-norm`` (a row's turns summed, divided by its
    response tokens; mean over rows)."""
    mask, turn_ids, H, log_ratio, adv = _prepare(old_log_prob, log_prob, advantages, response_mask, turn_ids)
    counts = turn_token_counts(turn_ids, H).to(log_prob.dtype)  # [B, H]
    tmask = (counts > 0).to(log_prob.dtype)
    turn_adv = turn_sums(adv, turn_ids, H) / counts.clamp(min=1)
    lr_in, gated = token_band_gate(log_ratio, scatter_turns(turn_adv, turn_ids), mask, settings)
    unit_lr = _turn_log_ratio(lr_in, turn_ids, H, ratio_mode)
    log_low, log_high = turn_band_bounds(counts, ratio_mode, settings)
    ratio = capped_exp(unit_lr, settings, log_high) * tmask
    agg = loss_agg_mode or settings.loss_agg_mode or DEFAULT_AGG["turn"]
    gc = global_counts
    if agg == "turn-mean":
        weight = tmask / _denominator(tmask.sum(), gc.turns if gc else None)
    elif agg == "token-mean":
        weight = counts / _denominator(counts.sum(), gc.tokens if gc else None)
    elif agg == "seq-mean-turn-sum-token-norm":
        row_tokens = counts.sum(dim=1, keepdim=True)
        rows = (row_tokens > 0).to(counts.dtype)
        weight = tmask / row_tokens.clamp(min=1) / _denominator(rows.sum(), gc.rows if gc else None)
    else:
        raise ValueError(f"loss_agg_mode {agg!r} is not valid for a turn-unit loss {TURN_AGG_MODES}")
    if rollout_is_weights is not None:
        weight = weight * (turn_sums(rollout_is_weights.detach() * mask, turn_ids, H) / counts.clamp(min=1))
    terms = PPOTerms(ratio=ratio, advantages=turn_adv, weight=weight, log_ratio=unit_lr.detach(),
                     log_low=log_low, log_high=log_high)
    return LossUnits(terms, turn_ids, log_ratio, adv, mask, turn_ids, H, gated)


# --------------------------------------------------------------------------------------------
# the losses
# --------------------------------------------------------------------------------------------
def register_policy_loss(name: str, unit: str, clip_bias: Optional[bool] = None):
    """Register a policy loss given by its units builder ``build(old, new, adv, mask, agg, settings,
    is_weights, turn_ids, global_counts) -> LossUnits``. ``unit``: ``token`` (the builder calls
    :func:`token_units`) or ``turn`` (:func:`turn_units`). ``clip_bias``: True forces the correction on
    (``s_ppo``, ``st_ppo``), None leaves it to the ``clip_bias`` key. The registered function has
    verl's signature (module docstring), keeps its builder as ``.build_units`` and its properties as ``.spec``
    (:class:`~ragen_turn.algos.registry.LossSpec`)."""

    def wrap(build: Callable[..., LossUnits]) -> Callable:
        def policy_loss_fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=None, config=None,
                           rollout_is_weights=None, turn_ids=None, global_counts=None):
            settings = loss_settings(config)
            units = build(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, settings,
                          rollout_is_weights, turn_ids, global_counts)
            return loss_from_units(units, settings, bool(clip_bias) or settings.clip_bias, global_counts)

        policy_loss_fn.__name__ = f"compute_policy_loss_{name}"
        policy_loss_fn.__doc__ = build.__doc__
        policy_loss_fn.build_units = build
        POLICY_LOSS_REGISTRY.register(name, unit=unit, forces_clip_bias=bool(clip_bias))(policy_loss_fn)
        return policy_loss_fn

    return wrap


@register_policy_loss("token_ppo", unit="token")
def compute_policy_loss_token_ppo(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """Token-level PPO: ``rho_t = exp(d_t)``, ``L = mean_t -min(rho_t A_t, clip(rho_t) A_t)`` (+ dual clip)."""
    return token_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, turn_ratio=False)


@register_policy_loss("turn_is", unit="token")
def compute_policy_loss_turn_is(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """Turn-level importance sampling (the ST-PPO paper's "Turn-PPO").

    Each token t of turn h uses its turn's ratio rho_h (``ratio_mode``, default ``geo_mean``) with
    its own advantage A_t: ``L_t = -min(rho_h A_t, clip(rho_h) A_t)``, mean over response tokens.
    """
    return token_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, turn_ratio=True)


@register_policy_loss("s_ppo", unit="token", clip_bias=True)
def compute_policy_loss_s_ppo(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """S-PPO: token-level PPO with the clipping-bias correction."""
    return token_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, turn_ratio=False)


@register_policy_loss("st_ppo", unit="token", clip_bias=True)
def compute_policy_loss_st_ppo(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """ST-PPO: turn-level importance sampling (``turn_is``) with the clipping-bias correction."""
    return token_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, turn_ratio=True)


@register_policy_loss("turn_ppo", unit="turn")
def compute_policy_loss_turn_ppo(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """Turn-PPO: one ratio and one advantage per turn, the turn clipped as a whole.

    ``rho_h = exp(sum_{t in T_h} d_t)`` (``ratio_mode=sum``, default) or ``exp(mean d_t)``
    (``geo_mean``); ``A_h`` = the turn's advantage (the mean of ``advantages`` over its tokens,
    which is constant within a turn for turn GAE); ``L_h = -min(rho_h A_h, clip(rho_h) A_h)``.
    Aggregation ``turn-mean`` (default) or ``token-mean`` (turns weighted by length).
    """
    return turn_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, settings.ratio_mode or "sum")


@register_policy_loss("turn_ppo_geo", unit="turn")
def compute_policy_loss_turn_ppo_geo(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """Turn-PPO with the length-normalised (geometric-mean) turn ratio; GSPO for one-turn episodes."""
    return turn_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, "geo_mean")


def policy_loss(name: str, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, turn_ids: Optional[torch.Tensor] = None, config: Any = None,
                global_counts: Optional[GlobalCounts] = None) -> tuple[torch.Tensor, Dict[str, float]]:
    """Dispatch by name: ``(loss, metrics)`` of loss ``name``, every tensor ``[B, T]``. Note the order: the new
    log-probs ``logp`` come before the old ones, the reverse of verl's signature (``old_log_prob, log_prob, ...``);
    the call passes them to the loss by keyword."""
    return get_policy_loss_fn(name)(old_log_prob=old_logp, log_prob=logp, advantages=advantages,
                                    response_mask=response_mask, config=config, turn_ids=turn_ids,
                                    global_counts=global_counts)


def needs_minibatch_stats(name: str, config: Any) -> bool:
    """True when loss ``name`` applies the correction at ``clip_bias_level=batch``: its statistic must be
    summed over the whole mini-batch (:func:`minibatch_clip_stats`) before any micro-batch's backward."""
    s = loss_settings(config)
    return (policy_loss_spec(name).forces_clip_bias or s.clip_bias) and s.clip_bias_level == "batch"


@torch.no_grad()
def minibatch_clip_stats(name: str, old_log_prob, log_prob, advantages, response_mask, config: Any = None,
                         rollout_is_weights=None, turn_ids=None, global_counts: Optional[GlobalCounts] = None,
                         loss_agg_mode: Optional[str] = None) -> torch.Tensor:
    """This micro-batch's part ``[4]`` of the correction's batch-level sums (add them over the micro-batches
    of a mini-batch, then pass them in ``global_counts.clip_stats``). Same arguments as the loss."""
    settings = loss_settings(config)
    units = get_policy_loss_fn(name).build_units(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                                                 settings, rollout_is_weights, turn_ids, global_counts)
    _, clipped, dual = ppo_objective(units.terms, settings.clip_low, settings.clip_high, settings.clip_c)
    return clip_bias_sums(units, clipped, dual, settings).sum(dim=0)


@torch.no_grad()
def unit_stats(name: str, old_log_prob, log_prob, advantages, response_mask, config: Any = None,
               turn_ids=None, global_counts: Optional[GlobalCounts] = None,
               loss_agg_mode: Optional[str] = None) -> Dict[str, Optional[torch.Tensor]]:
    """What loss ``name`` does to each turn and token of a batch, from the same units, objective and correction
    as the loss itself (for the trajectory trace; same arguments as the loss, no gradient). Returns:

    - ``token_log_ratio`` ``[B, T]``: each response token's own log-ratio d_t (0 elsewhere);
    - ``turn_log_ratio`` ``[B, H]``: the mean over the turn's tokens of the log-ratio of the unit each token
      belongs to, before clipping: the turn ratio the loss clips for turn units and turn ratios (``turn_ppo``,
      ``turn_is``, ``st_ppo``: constant over the turn), the geometric mean of the token ratios for token units;
    - ``turn_clipped``, ``turn_dual``, ``turn_token_band``, ``turn_live`` ``[B, H]``: the share of the turn's
      tokens whose unit is PPO-clipped, dual-clipped, gated by ``token_band``, or live (gets gradient; 0/1 for
      turn units);
    - ``clip_bias_scale`` ``[B]``: the correction's scale per row where the loss applies it, else None.
    """
    settings = loss_settings(config)
    units = get_policy_loss_fn(name).build_units(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                                                 settings, None, turn_ids, global_counts)
    _, clipped, dual = ppo_objective(units.terms, settings.clip_low, settings.clip_high, settings.clip_c)
    scale = None
    if policy_loss_spec(name).forces_clip_bias or settings.clip_bias:
        scale = clip_bias_scale(units, clipped, dual, settings, global_counts)[0].double()
    flags = _token_flags(units, clipped, dual)
    counts = turn_token_counts(units.turn_ids, units.H).to(torch.float64).clamp(min=1)
    mask = units.mask.to(torch.float64)

    def turn_mean(x: torch.Tensor) -> torch.Tensor:
        return turn_sums(x * mask, units.turn_ids, units.H) / counts

    tok_unit_lr = units.on_tokens(units.terms.log_ratio.double())  # token units: unit_ids are the positions
    out = {"token_log_ratio": units.token_log_ratio.double() * mask, "turn_log_ratio": turn_mean(tok_unit_lr),
           "clip_bias_scale": scale}
    for key, x in zip(("turn_clipped", "turn_dual", "turn_token_band", "turn_live"), flags):
        out[key] = turn_mean(x)
    return out


# --------------------------------------------------------------------------------------------
# value loss, KL and entropy
# --------------------------------------------------------------------------------------------
def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip_range: Optional[float] = 0.5,
               normaliser: Optional[float] = None) -> tuple[torch.Tensor, Dict[str, float]]:
    """Clipped value loss ``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)``, masked mean.

    Works on any layout: ``[B, T]`` for the token critic, ``[B, H]`` (turn_mask) for the turn critic.
    ``clip_range=None`` disables clipping. ``normaliser``: the number of masked entries in the whole
    mini-batch (``GlobalCounts.tokens`` or ``.turns``), so micro-batch losses add up to the mini-batch's;
    None = this batch's count.
    """
    check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    check_mask("mask", mask)
    check_finite("returns", returns, mask)
    m = mask.to(values.dtype)
    err = (values - returns) ** 2
    if clip_range is not None:
        v_clip = old_values + (values - old_values).clamp(-clip_range, clip_range)
        err_clip = (v_clip - returns) ** 2
        per = torch.maximum(err, err_clip)
        clipfrac = ((err_clip > err).float() * m).sum() / _denominator(m.sum(), normaliser)
    else:
        per, clipfrac = err, torch.zeros(())
    loss = 0.5 * (per * m).sum() / _denominator(m.sum(), normaliser)
    # no explained variance here: over a length-sorted micro-batch (rows of like returns) it is meaningless, and a
    # mean of per-micro-batch ratios is not the batch's; the trainers report it once over the batch
    return loss, {"critic/value_loss": float(loss.detach()), "critic/vf_clipfrac": float(clipfrac)}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var[R - V] / Var[R]`` over the mask (nan when Var[R] = 0)."""
    m = mask.to(values.dtype)
    n = m.sum()
    if n < 2:
        return float("nan")

    def var(x):
        mu = (x * m).sum() / n
        return (((x - mu) ** 2) * m).sum() / n

    vr = var(returns)
    return float("nan") if vr <= 0 else float(1 - var(returns - values) / vr)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL(pi || ref) estimate ``[B, T]``: ``kl`` (k1), ``abs``, ``mse`` (k2) or ``low_var_kl`` (k3)."""
    d = log_prob - ref_log_prob
    if kind == "kl":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "mse":
        return 0.5 * d**2
    if kind == "low_var_kl":
        r = (-d).clamp(-20, 20)
        return (torch.exp(r) - r - 1).clamp(-10, 10)
    raise ValueError(f"unknown kl kind {kind!r} (kl, abs, mse, low_var_kl)")


def masked_mean(x: torch.Tensor, mask: torch.Tensor, normaliser: Optional[float] = None) -> torch.Tensor:
    """``sum(x * mask) / normaliser`` (None = ``mask.sum()``): a token mean, or with the mini-batch's
    token count (``GlobalCounts.tokens``) this micro-batch's share of the mini-batch's token mean."""
    m = mask.to(x.dtype)
    return (x * m).sum() / _denominator(m.sum(), normaliser)
