"""Policy and value losses: token PPO, turn PPO (sum / geo-mean ratio), turn IS, ST-PPO correction.

Every policy loss has verl's signature, so a verl adapter is one line::

    loss, metrics = fn(old_log_prob, log_prob, advantages, response_mask,
                       loss_agg_mode=None, config=None, rollout_is_weights=None, turn_ids=None)

All tensors are ``[B, T]``. ``turn_ids`` defaults to the runs of 1s in ``response_mask``.
``config`` is a dict or an object with attributes (verl's ActorConfig works); keys:

- ``clip_ratio_low`` (0.2), ``clip_ratio_high`` (0.28), or ``clip_ratio`` for both;
- ``ratio_mode``: ``sum`` (turn ratio = product of token ratios) or ``geo_mean`` (length-normalised);
- ``loss_agg_mode``: ``token-mean`` or ``seq-mean-token-mean`` for token units, ``turn-mean`` or
  ``token-mean`` for turn units (the ``loss_agg_mode`` argument wins when given);
- ``clip_bias`` (bool) and ``clip_bias_level`` (``sample``/``batch``): the ST-PPO correction;
- ``log_ratio_clamp`` (20.0): bound on the (summed) log-ratio before ``exp``.

Each loss is built from its *terms*: one (ratio w_u, advantage A_u, weight n_u) triple per unit u
(a token or a turn), laid out ``[B, K]``. The PPO objective, the clip fractions and the ST-PPO
clipping-bias correction are computed once from those terms.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import torch

from .checks import check_finite, check_mask, check_ndim, check_same_shape
from .registry import Registry
from .turns import check_turn_ids, scatter_turns, turn_sums, turn_token_counts, turn_ids_from_mask

POLICY_LOSS_REGISTRY = Registry("policy loss")
register_policy_loss = POLICY_LOSS_REGISTRY.register  # decorator (verl's register_policy_loss)
get_policy_loss_fn = POLICY_LOSS_REGISTRY.lookup

_DEFAULTS = {
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.28,
    "ratio_mode": "sum",
    "loss_agg_mode": None,
    "clip_bias": False,
    "clip_bias_level": "sample",
    "log_ratio_clamp": 20.0,
}


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


def _clip_range(config: Any) -> tuple[float, float]:
    both = cfg_get(config, "clip_ratio", None)
    low = cfg_get(config, "clip_ratio_low", both if both is not None else _DEFAULTS["clip_ratio_low"])
    high = cfg_get(config, "clip_ratio_high", both if both is not None else _DEFAULTS["clip_ratio_high"])
    if not (0 <= low < 1) or high < 0:
        raise ValueError(f"clip_ratio_low must be in [0, 1) and clip_ratio_high >= 0, got {low}, {high}")
    return float(low), float(high)


@dataclass
class PPOTerms:
    """The units a PPO loss averages, laid out ``[B, K]`` (K = T for tokens, H for turns).

    ratio: importance ratio w_u (differentiable); advantages: A_u; weight: n_u, the unit's weight
    in the loss's mean (0 on padding), summing to 1 over the batch.
    """

    ratio: torch.Tensor
    advantages: torch.Tensor
    weight: torch.Tensor


def ppo_objective(terms: PPOTerms, clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-unit clipped surrogate ``-min(w A, clip(w, 1-low, 1+high) A)`` and its clipped-active mask.

    A unit is clipped-active when the clipped branch is strictly smaller: A > 0 and w > 1+high, or
    A < 0 and w < 1-low. Those units get zero gradient.

    Returns:
        per_unit_loss ``[B, K]``, clipped ``[B, K]`` bool.
    """
    w, A = terms.ratio, terms.advantages
    unclipped = -w * A
    clipped = -w.clamp(1.0 - clip_low, 1.0 + clip_high) * A
    active = ((A > 0) & (w > 1.0 + clip_high)) | ((A < 0) & (w < 1.0 - clip_low))
    per_unit = torch.where(active, clipped, unclipped)  # == max(unclipped, clipped)
    return per_unit, active


def clip_bias_scale(terms: PPOTerms, clipped: torch.Tensor, level: str = "sample",
                    eps: float = 1e-8) -> tuple[torch.Tensor, torch.Tensor]:
    """ST-PPO clipping-bias correction (SPEC.md): a detached per-row scale s_i.

    ``C_i = ||n w A||`` over row i's clipped-active units, ``G_i`` the same over the others,
    ``s_i = 1 / max(1, C_i / (G_i + eps))``. ``level='batch'`` uses one s from the batch sums.

    Args:
        terms: ``[B, K]`` units; clipped: ``[B, K]`` bool.
    Returns:
        scale ``[B]`` (detached), ratio C/G ``[B]``.
    """
    mass = (terms.weight * terms.ratio.detach() * terms.advantages) ** 2
    dims = (0, 1) if level == "batch" else (1,)
    if level not in ("sample", "batch"):
        raise ValueError(f"clip_bias_level must be 'sample' or 'batch', got {level!r}")
    C = torch.where(clipped, mass, torch.zeros_like(mass)).sum(dim=dims).sqrt()
    G = torch.where(clipped, torch.zeros_like(mass), mass).sum(dim=dims).sqrt()
    ratio = C / (G + eps)
    scale = 1.0 / ratio.clamp(min=1.0)
    B = terms.ratio.shape[0]
    return scale.detach().expand(B) if level == "batch" else scale.detach(), ratio.detach().expand(B)


def loss_from_terms(terms: PPOTerms, config: Any, token_clipped_of: Callable[[torch.Tensor], torch.Tensor],
                    turn_clip_frac: Callable[[torch.Tensor], torch.Tensor],
                    apply_clip_bias: bool) -> tuple[torch.Tensor, Dict[str, float]]:
    """The PPO loss ``sum_i s_i sum_u n_u l_u`` and its metrics, from any base loss's terms.

    ``token_clipped_of`` maps the ``[B, K]`` clipped mask to a ``[B, T]`` per-token one and
    ``turn_clip_frac`` gives the fraction of turns clipped, so the metrics mean the same thing
    for every loss.
    """
    low, high = _clip_range(config)
    per_unit, clipped = ppo_objective(terms, low, high)
    row_loss = (terms.weight * per_unit).sum(dim=1)  # [B]: L_i
    metrics: Dict[str, float] = {}
    if apply_clip_bias:
        scale, cg = clip_bias_scale(terms, clipped, cfg_get(config, "clip_bias_level", "sample"))
        rows = terms.weight.sum(dim=1) > 0
        metrics["actor/clip_bias_ratio"] = float(cg[rows].mean()) if rows.any() else 0.0
        metrics["actor/clip_bias_scale"] = float(scale[rows].mean()) if rows.any() else 1.0
        row_loss = row_loss * scale
    loss = row_loss.sum()
    with torch.no_grad():
        tok = token_clipped_of(clipped)
        metrics["actor/clip_frac_token"] = float(tok.float().mean()) if tok.numel() else 0.0
        metrics["actor/clip_frac_turn"] = float(turn_clip_frac(clipped))
        metrics["actor/pg_loss"] = float(loss.detach())
    return loss, metrics


# --------------------------------------------------------------------------------------------
# input handling shared by all losses
# --------------------------------------------------------------------------------------------
def _prepare(old_log_prob, log_prob, advantages, response_mask, turn_ids, config):
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
    clamp = float(cfg_get(config, "log_ratio_clamp", _DEFAULTS["log_ratio_clamp"]))
    log_ratio = torch.where(response_mask.bool(), log_prob - old_log_prob, torch.zeros_like(log_prob))
    adv = torch.where(response_mask.bool(), advantages, torch.zeros_like(advantages)).to(log_prob.dtype)
    return mask, turn_ids, H, clamp, log_ratio, adv


def _token_weights(mask: torch.Tensor, agg: str) -> torch.Tensor:
    """n_t for token units: ``token-mean`` (1/#tokens) or ``seq-mean-token-mean``."""
    if agg == "token-mean":
        return mask / mask.sum().clamp(min=1)
    if agg == "seq-mean-token-mean":
        rows = (mask.sum(dim=1, keepdim=True) > 0).float()
        return mask / mask.sum(dim=1, keepdim=True).clamp(min=1) / rows.sum().clamp(min=1)
    raise ValueError(f"loss_agg_mode {agg!r} is not valid for a token-unit loss (token-mean, seq-mean-token-mean)")


def _turn_log_ratio(log_ratio: torch.Tensor, turn_ids: torch.Tensor, H: int, mode: str, clamp: float):
    """Per-turn log-ratio ``[B, H]``: sum (``sum``) or mean (``geo_mean``) of the token log-ratios."""
    s = turn_sums(log_ratio, turn_ids, H)
    if mode == "geo_mean":
        s = s / turn_token_counts(turn_ids, H).clamp(min=1).to(s.dtype)
    elif mode != "sum":
        raise ValueError(f"ratio_mode must be 'sum' or 'geo_mean', got {mode!r}")
    return s.clamp(-clamp, clamp)


def _turn_clip_frac_from_tokens(turn_ids: torch.Tensor, H: int, mask: torch.Tensor):
    """Fraction of turns clipped, from a per-token clipped mask: each turn counts its clipped share."""
    counts = turn_token_counts(turn_ids, H).to(mask.dtype)
    present = counts > 0

    def frac(tok_clipped: torch.Tensor) -> torch.Tensor:
        share = turn_sums(tok_clipped.to(mask.dtype) * mask, turn_ids, H) / counts.clamp(min=1)
        return share[present].mean() if present.any() else torch.zeros(())

    return frac


# --------------------------------------------------------------------------------------------
# the losses
# --------------------------------------------------------------------------------------------
@register_policy_loss("token_ppo")
def compute_policy_loss_token_ppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=None,
                                  config=None, rollout_is_weights=None, turn_ids=None):
    """Token-level PPO: ``rho_t = exp(d_t)``, ``L = mean_t -min(rho_t A_t, clip(rho_t) A_t)``."""
    return _token_unit_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                            rollout_is_weights, turn_ids, turn_ratio=False,
                            clip_bias=bool(cfg_get(config, "clip_bias", False)))


@register_policy_loss("turn_is")
def compute_policy_loss_turn_is(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=None,
                                config=None, rollout_is_weights=None, turn_ids=None):
    """Turn-level importance sampling (the ST-PPO paper's "Turn-PPO").

    Each token t of turn h uses its turn's ratio rho_h (``ratio_mode``, default ``geo_mean``) with
    its own advantage A_t: ``L_t = -min(rho_h A_t, clip(rho_h) A_t)``, mean over response tokens.
    """
    return _token_unit_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                            rollout_is_weights, turn_ids, turn_ratio=True,
                            clip_bias=bool(cfg_get(config, "clip_bias", False)))


@register_policy_loss("s_ppo")
def compute_policy_loss_s_ppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=None,
                              config=None, rollout_is_weights=None, turn_ids=None):
    """S-PPO: token-level PPO with the clipping-bias correction."""
    return _token_unit_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                            rollout_is_weights, turn_ids, turn_ratio=False, clip_bias=True)


@register_policy_loss("st_ppo")
def compute_policy_loss_st_ppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=None,
                               config=None, rollout_is_weights=None, turn_ids=None):
    """ST-PPO: turn-level importance sampling (``turn_is``) with the clipping-bias correction."""
    return _token_unit_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                            rollout_is_weights, turn_ids, turn_ratio=True, clip_bias=True)


def _token_unit_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                     rollout_is_weights, turn_ids, turn_ratio: bool, clip_bias: bool):
    mask, turn_ids, H, clamp, log_ratio, adv = _prepare(old_log_prob, log_prob, advantages, response_mask,
                                                        turn_ids, config)
    if turn_ratio:
        mode = cfg_get(config, "ratio_mode", "geo_mean")
        token_log_ratio = scatter_turns(_turn_log_ratio(log_ratio, turn_ids, H, mode, clamp), turn_ids)
    else:
        token_log_ratio = log_ratio.clamp(-clamp, clamp)
    ratio = torch.exp(token_log_ratio) * mask
    agg = loss_agg_mode or cfg_get(config, "loss_agg_mode", None) or "token-mean"
    weight = _token_weights(mask, agg)
    if rollout_is_weights is not None:
        weight = weight * rollout_is_weights.detach()
    terms = PPOTerms(ratio=ratio, advantages=adv, weight=weight)
    loss, metrics = loss_from_terms(terms, config, lambda c: c[mask.bool()],
                                    _turn_clip_frac_from_tokens(turn_ids, H, mask), clip_bias)
    metrics.update(_ratio_metrics(log_ratio, mask))
    return loss, metrics


@register_policy_loss("turn_ppo")
def compute_policy_loss_turn_ppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=None,
                                 config=None, rollout_is_weights=None, turn_ids=None):
    """Turn-PPO: one ratio and one advantage per turn, the turn clipped as a whole.

    ``rho_h = exp(sum_{t in T_h} d_t)`` (``ratio_mode=sum``, default) or ``exp(mean d_t)``
    (``geo_mean``); ``A_h`` = the turn's advantage (the mean of ``advantages`` over its tokens,
    which is constant within a turn for turn GAE); ``L_h = -min(rho_h A_h, clip(rho_h) A_h)``.
    Aggregation ``turn-mean`` (default) or ``token-mean`` (turns weighted by length).
    """
    return _turn_unit_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                           rollout_is_weights, turn_ids, cfg_get(config, "ratio_mode", "sum"))


@register_policy_loss("turn_ppo_geo")
def compute_policy_loss_turn_ppo_geo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=None,
                                     config=None, rollout_is_weights=None, turn_ids=None):
    """Turn-PPO with the length-normalised (geometric-mean) turn ratio; GSPO for one-turn episodes."""
    return _turn_unit_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                           rollout_is_weights, turn_ids, "geo_mean")


def _turn_unit_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                    rollout_is_weights, turn_ids, ratio_mode: str):
    mask, turn_ids, H, clamp, log_ratio, adv = _prepare(old_log_prob, log_prob, advantages, response_mask,
                                                        turn_ids, config)
    counts = turn_token_counts(turn_ids, H).to(log_prob.dtype)  # [B, H]
    tmask = (counts > 0).to(log_prob.dtype)
    ratio = torch.exp(_turn_log_ratio(log_ratio, turn_ids, H, ratio_mode, clamp)) * tmask
    turn_adv = turn_sums(adv, turn_ids, H) / counts.clamp(min=1)
    agg = loss_agg_mode or cfg_get(config, "loss_agg_mode", None) or "turn-mean"
    if agg == "turn-mean":
        weight = tmask / tmask.sum().clamp(min=1)
    elif agg == "token-mean":
        weight = counts / counts.sum().clamp(min=1)
    else:
        raise ValueError(f"loss_agg_mode {agg!r} is not valid for turn_ppo (turn-mean, token-mean)")
    if rollout_is_weights is not None:
        weight = weight * (turn_sums(rollout_is_weights.detach() * mask, turn_ids, H) / counts.clamp(min=1))
    terms = PPOTerms(ratio=ratio, advantages=turn_adv, weight=weight)
    present = tmask.bool()
    loss, metrics = loss_from_terms(
        terms, config,
        lambda c: scatter_turns(c.to(mask.dtype), turn_ids)[mask.bool()],
        lambda c: c[present].float().mean() if present.any() else torch.zeros(()),
        bool(cfg_get(config, "clip_bias", False)))
    metrics.update(_ratio_metrics(log_ratio, mask))
    return loss, metrics


def _ratio_metrics(log_ratio: torch.Tensor, mask: torch.Tensor) -> Dict[str, float]:
    """``actor/approx_kl``: mean over response tokens of the k3 estimate of KL(old || new)."""
    with torch.no_grad():
        d = log_ratio.detach().clamp(-20, 20)
        k3 = torch.exp(d) - 1 - d  # E_old[r - 1 - log r] with r = new/old
        n = mask.sum().clamp(min=1)
        return {"actor/approx_kl": float((k3 * mask).sum() / n),
                "actor/ratio_mean": float((torch.exp(d) * mask).sum() / n)}


def policy_loss(name: str, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, turn_ids: Optional[torch.Tensor] = None,
                config: Any = None) -> tuple[torch.Tensor, Dict[str, float]]:
    """Dispatch by name (DESIGN.md's argument order): ``(loss, metrics)``."""
    return get_policy_loss_fn(name)(old_log_prob=old_logp, log_prob=logp, advantages=advantages,
                                    response_mask=response_mask, config=config, turn_ids=turn_ids)


# --------------------------------------------------------------------------------------------
# value loss, KL and entropy
# --------------------------------------------------------------------------------------------
def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip_range: Optional[float] = 0.5) -> tuple[torch.Tensor, Dict[str, float]]:
    """Clipped value loss ``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)``, masked mean.

    Works on any layout: ``[B, T]`` for the token critic, ``[B, H]`` (turn_mask) for the turn critic.
    ``clip_range=None`` disables clipping.
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
    loss = 0.5 * (per * m).sum() / m.sum().clamp(min=1)
    return loss, {"critic/value_loss": float(loss.detach()), "critic/vf_clipfrac": float(clipfrac),
                  "critic/explained_var": explained_variance(values.detach(), returns, m)}


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


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1)
