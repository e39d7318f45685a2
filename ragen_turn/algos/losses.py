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
- ``loss_agg_mode``: ``token-mean`` or ``seq-mean-token-mean`` for token units, ``turn-mean`` or
  ``token-mean`` for turn units (the ``loss_agg_mode`` argument wins when given);
- ``clip_bias`` (bool), ``clip_bias_level`` (``sample``/``batch``), ``clip_bias_stat`` (``mass``/``rms``)
  and ``clip_bias_threshold`` (null = 1 for mass, 5 for rms): the clipping-bias correction.

``global_counts`` (:class:`GlobalCounts`) holds the token / turn / row counts of the whole mini-batch
(and the correction's batch-level sums): with it a micro-batch's loss is its share of the mini-batch
loss, so the micro-batch losses of one mini-batch add up to the loss of the whole mini-batch. Without
it the counts are this batch's own.

Each loss is built from its *terms*: one (ratio w_u, advantage A_u, weight n_u) triple per unit u
(a token or a turn), laid out ``[B, K]``. The PPO objective, dual clip, the clip fractions and the
clipping-bias correction are computed once from those terms (:func:`loss_from_units`).

Metrics are means over this call's batch, except ``actor/pg_loss``: the loss that was differentiated
(with global counts, this micro-batch's share; add them up over a mini-batch, as verl does).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import torch

from .checks import check_finite, check_mask, check_ndim, check_same_shape
from .registry import Registry
from .turns import check_turn_ids, scatter_turns, turn_sums, turn_token_counts, turn_ids_from_mask

POLICY_LOSS_REGISTRY = Registry("policy loss")
get_policy_loss_fn = POLICY_LOSS_REGISTRY.lookup

# metrics that are a micro-batch's share of a mini-batch mean when the loss gets global counts:
# a trainer adds them up over the micro-batches of a mini-batch (the others are micro-batch means)
SUMMED_METRICS = ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "critic/value_loss")


def cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a dict-like or attribute config (verl's ``policy_loss`` sub-config too)."""
    if config is None:
        return default
    if isinstance(config, dict) or hasattr(config, "keys") and hasattr(config, "get"):
        val = config.get(key, None)
    else:
        val = getattr(config, key, None)
        if val is None and hasattr(config, "policy_loss"):
            sub = getattr(config, "policy_loss")
            val = sub.get(key, None) if hasattr(sub, "get") else getattr(sub, key, None)
    return default if val is None else val


# --------------------------------------------------------------------------------------------
# settings and counts
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LossSettings:
    """The knobs of every policy loss, read from a config and checked (:func:`loss_settings`)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_c: float = 3.0
    ratio_mode: Optional[str] = None
    loss_agg_mode: Optional[str] = None
    clip_bias: bool = False
    clip_bias_level: str = "sample"
    clip_bias_stat: str = "mass"
    clip_bias_threshold: float = 1.0

    @property
    def log_ratio_cap(self) -> float:
        """Above this log-ratio every unit's loss is flat in the ratio (A > 0: PPO-clipped at 1+eps_high;
        A < 0: dual-clipped at c; A = 0: zero), so capping the exponent there changes neither the loss
        nor its gradient: it only keeps ``exp`` finite."""
        return math.log(max(self.clip_c, 1.0 + self.clip_high))


def loss_settings(config: Any) -> LossSettings:
    """Read and check the loss keys of ``config``; a ValueError names the bad key."""
    both = cfg_get(config, "clip_ratio", None)
    low = float(cfg_get(config, "clip_ratio_low", both if both is not None else 0.2))
    high = float(cfg_get(config, "clip_ratio_high", both if both is not None else 0.28))
    if not (0 <= low < 1) or high < 0:
        raise ValueError(f"clip_ratio_low must be in [0, 1) and clip_ratio_high >= 0, got {low}, {high}")
    c = float(cfg_get(config, "clip_ratio_c", 3.0))
    if not (c > 1.0 and math.isfinite(c)):
        raise ValueError(f"clip_ratio_c (dual clip) must be a finite number > 1, got {c}")
    mode = cfg_get(config, "ratio_mode", None)
    if mode not in (None, "sum", "geo_mean"):
        raise ValueError(f"ratio_mode must be 'sum' or 'geo_mean', got {mode!r}")
    agg = cfg_get(config, "loss_agg_mode", None)
    level = cfg_get(config, "clip_bias_level", "sample")
    if level not in ("sample", "batch"):
        raise ValueError(f"clip_bias_level must be 'sample' or 'batch', got {level!r}")
    stat = cfg_get(config, "clip_bias_stat", "mass")
    if stat not in ("mass", "rms"):
        raise ValueError(f"clip_bias_stat must be 'mass' or 'rms', got {stat!r}")
    thr = float(cfg_get(config, "clip_bias_threshold", 1.0 if stat == "mass" else 5.0))
    if not thr >= 1.0:
        raise ValueError(f"clip_bias_threshold must be >= 1 (the correction only scales down), got {thr}")
    return LossSettings(low, high, c, mode, agg, bool(cfg_get(config, "clip_bias", False)), level, stat, thr)


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

    ratio: importance ratio w_u (differentiable; its exponent capped at
    :attr:`LossSettings.log_ratio_cap`, where the loss is flat in it); advantages: A_u; weight: n_u,
    the unit's weight in the loss's mean (0 on padding); log_ratio: log w_u, uncapped and detached
    (for statistics; default ``log(ratio)``).
    """

    ratio: torch.Tensor
    advantages: torch.Tensor
    weight: torch.Tensor
    log_ratio: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.log_ratio is None:
            self.log_ratio = torch.log(self.ratio.detach().clamp(min=1e-45))


@dataclass
class LossUnits:
    """A loss's terms plus the token view of its units.

    unit_ids ``[B, T]``: the unit (column of ``terms``) of each response token, -1 elsewhere;
    token_log_ratio ``[B, T]``: each token's own log-ratio d_t; token_advantages ``[B, T]``;
    mask ``[B, T]`` float; turn_ids ``[B, T]`` and H for turn metrics.
    """

    terms: PPOTerms
    unit_ids: torch.Tensor
    token_log_ratio: torch.Tensor
    token_advantages: torch.Tensor
    mask: torch.Tensor
    turn_ids: torch.Tensor
    H: int

    def on_tokens(self, unit_values: torch.Tensor) -> torch.Tensor:
        """``[B, K]`` per-unit values -> ``[B, T]`` per-token (0 off the response)."""
        if unit_values.shape[1] == 0:
            return torch.zeros_like(self.mask, dtype=unit_values.dtype)
        out = unit_values.gather(1, self.unit_ids.clamp(min=0))
        return torch.where(self.unit_ids >= 0, out, torch.zeros_like(out))


def clip_region(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float) -> torch.Tensor:
    """Where PPO's clip takes the gradient away: A > 0 and w > 1+high, or A < 0 and w < 1-low (bool, same shape)."""
    return ((advantages > 0) & (log_ratio > math.log1p(clip_high))) | \
        ((advantages < 0) & (log_ratio < math.log1p(-clip_low)))


def ppo_objective(terms: PPOTerms, clip_low: float, clip_high: float,
                  clip_c: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-unit clipped surrogate with dual clip, and which units it clips.

    ``l_u = max(-w A, -clip(w, 1-low, 1+high) A)``, and for A < 0 ``l_u = min(l_u, -c A)`` (dual clip,
    verl's ``clip_ratio_c``; None = off). PPO-clipped: A > 0 and w > 1+high, or A < 0 and w < 1-low.
    Dual-clipped: A < 0 and w > c. Both get zero gradient.

    Returns:
        per_unit_loss ``[B, K]``, clipped ``[B, K]`` bool, dual_clipped ``[B, K]`` bool.
    """
    w, A = terms.ratio, terms.advantages
    lw = terms.log_ratio  # the masks read the uncapped ratio (w itself stops at the cap)
    unclipped = -w * A
    clipped_val = -w.clamp(1.0 - clip_low, 1.0 + clip_high) * A
    clipped = clip_region(lw, A, clip_low, clip_high)
    per_unit = torch.where(clipped, clipped_val, unclipped)  # == max(unclipped, clipped_val)
    if clip_c is None:
        return per_unit, clipped, torch.zeros_like(clipped)
    dual = (A < 0) & (lw > math.log(clip_c))
    return torch.where(dual, -A * clip_c, per_unit), clipped, dual


def clip_bias_sums(units: LossUnits, no_grad_units: torch.Tensor, settings: LossSettings) -> torch.Tensor:
    """Per-row sums the correction's statistic is made of: ``[B, 4]`` float64 ``(S_out, N_out, S_in, N_in)``.

    ``mass`` (SPEC's reading): over the loss's units, S = sum of (n_u w_u A_u)^2, "out" = the units
    clipping gives no gradient (``no_grad_units``). ``rms`` (SORL's code): over response tokens,
    S = sum of (w_t A_t)^2 with the token's own ratio, "out" = tokens whose ratio lies outside
    [1-low, 1+high]. N counts the units of each side. Sums add up over rows and micro-batches.
    """
    if settings.clip_bias_stat == "mass":
        t = units.terms
        w = torch.exp(t.log_ratio.double().clamp(max=300.0))  # (e^300)^2 still fits a float64
        x2 = (t.weight.double() * w * t.advantages.double()) ** 2
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


def clip_bias_scale(units: LossUnits, no_grad_units: torch.Tensor, settings: LossSettings,
                    global_counts: Optional[GlobalCounts] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The correction's detached scale per row: ``s = 1/r`` where ``r > threshold``, else 1.

    ``clip_bias_level=sample``: one r per row from its own sums. ``batch``: one r from the
    mini-batch's sums (``global_counts.clip_stats``, or this batch's when not given).

    Returns:
        scale ``[B]``, r ``[B]`` (both detached, the loss's dtype).
    """
    sums = clip_bias_sums(units, no_grad_units, settings)
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


def loss_from_units(units: LossUnits, settings: LossSettings, apply_clip_bias: bool,
                    global_counts: Optional[GlobalCounts] = None) -> tuple[torch.Tensor, Dict[str, float]]:
    """The PPO loss ``sum_i s_i sum_u n_u l_u`` and its metrics, from any base loss's units."""
    terms = units.terms
    per_unit, clipped, dual = ppo_objective(terms, settings.clip_low, settings.clip_high, settings.clip_c)
    row_loss = (terms.weight * per_unit).sum(dim=1)  # [B]: L_i
    metrics: Dict[str, float] = {}
    if apply_clip_bias:
        scale, r = clip_bias_scale(units, clipped | dual, settings, global_counts)
        rows = units.mask.sum(dim=1) > 0
        metrics["actor/clip_bias_ratio"] = float(r[rows].mean()) if rows.any() else 0.0
        metrics["actor/clip_bias_scale"] = float(scale[rows].mean()) if rows.any() else 1.0
        row_loss = row_loss * scale
    loss = row_loss.sum()
    with torch.no_grad():
        on = units.mask.bool()
        tok_clipped = units.on_tokens(clipped.to(units.mask.dtype))
        metrics["actor/clip_frac_token"] = float(tok_clipped[on].mean()) if on.any() else 0.0
        metrics["actor/clip_frac_turn"] = _turn_share(tok_clipped, units)
        metrics["actor/dual_clip_frac"] = float(units.on_tokens(dual.to(units.mask.dtype))[on].mean()) \
            if on.any() else 0.0
        metrics["actor/pg_loss"] = float(loss.detach())
        metrics.update(_ratio_metrics(units.token_log_ratio, units.mask))
        metrics.update(_token_trust_metrics(units, settings, tok_clipped + units.on_tokens(dual.to(units.mask.dtype))))
    return loss, metrics


def _token_trust_metrics(units: LossUnits, settings: LossSettings, tok_no_grad: torch.Tensor) -> Dict[str, float]:
    """How far a loss's units let single tokens leave token PPO's trust region.

    ``actor/token_outside_frac``: share of response tokens whose *own* ratio lies where token PPO would
    clip them (A_t > 0 and exp(d_t) > 1+high, or A_t < 0 and exp(d_t) < 1-low). ``actor/token_outside_kept_frac``:
    share of response tokens that are outside so and still get gradient, because the unit they belong to
    (their turn, under a turn ratio) is not clipped. Token PPO keeps none; a turn ratio can keep many.
    """
    on = units.mask.bool()
    if not on.any():
        return {"actor/token_outside_frac": 0.0, "actor/token_outside_kept_frac": 0.0}
    d, A = units.token_log_ratio.detach(), units.token_advantages
    outside = clip_region(d, A, settings.clip_low, settings.clip_high) & on
    kept = outside & (tok_no_grad == 0)
    return {"actor/token_outside_frac": float(outside[on].float().mean()),
            "actor/token_outside_kept_frac": float(kept[on].float().mean())}


def _turn_share(tok_flag: torch.Tensor, units: LossUnits) -> float:
    """Mean over turns of the share of the turn's tokens flagged (0/1 for turn units)."""
    counts = turn_token_counts(units.turn_ids, units.H).to(units.mask.dtype)
    present = counts > 0
    if not present.any():
        return 0.0
    share = turn_sums(tok_flag * units.mask, units.turn_ids, units.H) / counts.clamp(min=1)
    return float(share[present].mean())


def _ratio_metrics(log_ratio: torch.Tensor, mask: torch.Tensor) -> Dict[str, float]:
    """``actor/approx_kl``: mean over response tokens of the k3 estimate of KL(old || new)."""
    d = log_ratio.detach().clamp(-20, 20)
    k3 = torch.exp(d) - 1 - d  # E_old[r - 1 - log r] with r = new/old
    n = mask.sum().clamp(min=1)
    return {"actor/approx_kl": float((k3 * mask).sum() / n),
            "actor/ratio_mean": float((torch.exp(d) * mask).sum() / n)}


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


def token_units(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, settings: LossSettings,
                rollout_is_weights=None, turn_ids=None, global_counts: Optional[GlobalCounts] = None,
                turn_ratio: bool = False) -> LossUnits:
    """Token units: each response token t with its own advantage A_t and ratio exp(d_t), or its
    turn's ratio (``turn_ratio``, ``ratio_mode`` default ``geo_mean``); weights ``token-mean`` (default)
    or ``seq-mean-token-mean``."""
    mask, turn_ids, H, log_ratio, adv = _prepare(old_log_prob, log_prob, advantages, response_mask, turn_ids)
    if turn_ratio:
        unit_lr = scatter_turns(_turn_log_ratio(log_ratio, turn_ids, H, settings.ratio_mode or "geo_mean"),
                                turn_ids)
    else:
        unit_lr = log_ratio
    ratio = torch.exp(unit_lr.clamp(max=settings.log_ratio_cap)) * mask
    agg = loss_agg_mode or settings.loss_agg_mode or "token-mean"
    gc = global_counts
    if agg == "token-mean":
        weight = mask / _denominator(mask.sum(), gc.tokens if gc else None)
    elif agg == "seq-mean-token-mean":
        rows = (mask.sum(dim=1, keepdim=True) > 0).to(mask.dtype)
        weight = mask / mask.sum(dim=1, keepdim=True).clamp(min=1) / _denominator(rows.sum(), gc.rows if gc else None)
    else:
        raise ValueError(f"loss_agg_mode {agg!r} is not valid for a token-unit loss (token-mean, seq-mean-token-mean)")
    if rollout_is_weights is not None:
        weight = weight * rollout_is_weights.detach()
    T = mask.shape[1]
    unit_ids = torch.where(mask.bool(), torch.arange(T, device=mask.device).expand_as(turn_ids),
                           torch.full_like(turn_ids, -1))
    terms = PPOTerms(ratio=ratio, advantages=adv, weight=weight, log_ratio=unit_lr.detach())
    return LossUnits(terms, unit_ids, log_ratio, adv, mask, turn_ids, H)


def turn_units(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, settings: LossSettings,
               rollout_is_weights=None, turn_ids=None, global_counts: Optional[GlobalCounts] = None,
               ratio_mode: str = "sum") -> LossUnits:
    """Turn units: one ratio rho_h and one advantage A_h (the mean of ``advantages`` over the turn's
    tokens) per turn; weights ``turn-mean`` (default) or ``token-mean`` (turns weighted by length)."""
    mask, turn_ids, H, log_ratio, adv = _prepare(old_log_prob, log_prob, advantages, response_mask, turn_ids)
    counts = turn_token_counts(turn_ids, H).to(log_prob.dtype)  # [B, H]
    tmask = (counts > 0).to(log_prob.dtype)
    unit_lr = _turn_log_ratio(log_ratio, turn_ids, H, ratio_mode)
    ratio = torch.exp(unit_lr.clamp(max=settings.log_ratio_cap)) * tmask
    turn_adv = turn_sums(adv, turn_ids, H) / counts.clamp(min=1)
    agg = loss_agg_mode or settings.loss_agg_mode or "turn-mean"
    gc = global_counts
    if agg == "turn-mean":
        weight = tmask / _denominator(tmask.sum(), gc.turns if gc else None)
    elif agg == "token-mean":
        weight = counts / _denominator(counts.sum(), gc.tokens if gc else None)
    else:
        raise ValueError(f"loss_agg_mode {agg!r} is not valid for a turn-unit loss (turn-mean, token-mean)")
    if rollout_is_weights is not None:
        weight = weight * (turn_sums(rollout_is_weights.detach() * mask, turn_ids, H) / counts.clamp(min=1))
    terms = PPOTerms(ratio=ratio, advantages=turn_adv, weight=weight, log_ratio=unit_lr.detach())
    return LossUnits(terms, turn_ids, log_ratio, adv, mask, turn_ids, H)


# --------------------------------------------------------------------------------------------
# the losses
# --------------------------------------------------------------------------------------------
def register_policy_loss(name: str, clip_bias: Optional[bool] = None):
    """Register a policy loss given by its units builder ``build(old, new, adv, mask, agg, settings,
    is_weights, turn_ids, global_counts) -> LossUnits``. ``clip_bias``: True forces the correction on
    (``s_ppo``, ``st_ppo``), None leaves it to the ``clip_bias`` key. The registered function has
    verl's signature (module docstring) and keeps its builder as ``.build_units``."""

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
        policy_loss_fn.forces_clip_bias = bool(clip_bias)
        POLICY_LOSS_REGISTRY.register(name)(policy_loss_fn)
        return policy_loss_fn

    return wrap


@register_policy_loss("token_ppo")
def compute_policy_loss_token_ppo(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """Token-level PPO: ``rho_t = exp(d_t)``, ``L = mean_t -min(rho_t A_t, clip(rho_t) A_t)`` (+ dual clip)."""
    return token_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, turn_ratio=False)


@register_policy_loss("turn_is")
def compute_policy_loss_turn_is(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """Turn-level importance sampling (the ST-PPO paper's "Turn-PPO").

    Each token t of turn h uses its turn's ratio rho_h (``ratio_mode``, default ``geo_mean``) with
    its own advantage A_t: ``L_t = -min(rho_h A_t, clip(rho_h) A_t)``, mean over response tokens.
    """
    return token_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, turn_ratio=True)


@register_policy_loss("s_ppo", clip_bias=True)
def compute_policy_loss_s_ppo(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """S-PPO: token-level PPO with the clipping-bias correction."""
    return token_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, turn_ratio=False)


@register_policy_loss("st_ppo", clip_bias=True)
def compute_policy_loss_st_ppo(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """ST-PPO: turn-level importance sampling (``turn_is``) with the clipping-bias correction."""
    return token_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, turn_ratio=True)


@register_policy_loss("turn_ppo")
def compute_policy_loss_turn_ppo(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """Turn-PPO: one ratio and one advantage per turn, the turn clipped as a whole.

    ``rho_h = exp(sum_{t in T_h} d_t)`` (``ratio_mode=sum``, default) or ``exp(mean d_t)``
    (``geo_mean``); ``A_h`` = the turn's advantage (the mean of ``advantages`` over its tokens,
    which is constant within a turn for turn GAE); ``L_h = -min(rho_h A_h, clip(rho_h) A_h)``.
    Aggregation ``turn-mean`` (default) or ``token-mean`` (turns weighted by length).
    """
    return turn_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, settings.ratio_mode or "sum")


@register_policy_loss("turn_ppo_geo")
def compute_policy_loss_turn_ppo_geo(old, new, adv, mask, agg, settings, is_w, turn_ids, gc):
    """Turn-PPO with the length-normalised (geometric-mean) turn ratio; GSPO for one-turn episodes."""
    return turn_units(old, new, adv, mask, agg, settings, is_w, turn_ids, gc, "geo_mean")


def policy_loss(name: str, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, turn_ids: Optional[torch.Tensor] = None, config: Any = None,
                global_counts: Optional[GlobalCounts] = None) -> tuple[torch.Tensor, Dict[str, float]]:
    """Dispatch by name (DESIGN.md's argument order): ``(loss, metrics)``."""
    return get_policy_loss_fn(name)(old_log_prob=old_logp, log_prob=logp, advantages=advantages,
                                    response_mask=response_mask, config=config, turn_ids=turn_ids,
                                    global_counts=global_counts)


def needs_minibatch_stats(name: str, config: Any) -> bool:
    """True when loss ``name`` applies the correction at ``clip_bias_level=batch``: its statistic must be
    summed over the whole mini-batch (:func:`minibatch_clip_stats`) before any micro-batch's backward."""
    s = loss_settings(config)
    return (get_policy_loss_fn(name).forces_clip_bias or s.clip_bias) and s.clip_bias_level == "batch"


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
    return clip_bias_sums(units, clipped | dual, settings).sum(dim=0)


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
        clipfrac = ((err_clip > err).float() * m).sum() / m.sum().clamp(min=1)
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
