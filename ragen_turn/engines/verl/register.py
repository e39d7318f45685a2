"""Register our policy losses and turn-level GAE in verl's registries (thin adapters over ``ragen_turn.algos``).

Importing this module registers every policy loss of ``ragen_turn.algos``' registry (``turn_ppo``,
``turn_ppo_geo``, ``turn_is``, ``s_ppo``, ``st_ppo``, ``token_ppo``; each one's default aggregation from its
registry entry) with ``verl.trainer.ppo.core_algos.register_policy_loss``, and ``turn_gae`` (the estimator
verl has no counterpart of) with ``register_adv_est``. Registries live in each process, so every Ray worker
must import it: the verl engine sets ``VERL_USE_EXTERNAL_MODULES`` (read by ``import verl``) and
``actor_rollout_ref.model.external_lib`` to this module.

The maths is ``ragen_turn.algos``; an adapter only
- reads our knobs from verl's ``ActorConfig`` (``clip_ratio_low/high``, ``clip_ratio_c`` and
  ``policy_loss.<each knob of the schema's PolicyLossConfig>``, see ``RagenPolicyLossConfig``),
- takes the turns from the runs of 1s in ``response_mask`` (all a registered loss sees), and
- hands verl's global mini-batch counts to the loss as :class:`ragen_turn.algos.GlobalCounts`: verl
  back-propagates each micro-batch loss as is, so a loss must be ``sum over its units / (units in the
  global mini-batch) * dp_size`` (``config.global_batch_info``, as verl's own ``agg_loss`` does), i.e.
  counts divided by ``dp_size``. The local engine passes the same object, so both engines optimise one
  objective.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import torch
from verl.trainer.ppo import core_algos as verl_algos
from verl.workers.config import PolicyLossConfig

from ragen_turn import algos
from ragen_turn.cfg_get import cfg_get
from ragen_turn.schema import policy_loss_knobs

_KNOBS = tuple(policy_loss_knobs())  # our losses' keys under actor.policy_loss: the schema's PolicyLossConfig


def _knob_field(typ: Any, default: Any) -> Tuple[Any, Any]:
    """A knob's ``(type, field)`` for ``make_dataclass``: optional when its default is None."""
    return (Optional[typ] if default is None else typ), dataclasses.field(default=default)


# verl's ``actor.policy_loss`` plus the knobs of our losses (SPEC.md), one field per PolicyLossConfig knob with its
# default (``make_dataclass``: the schema is their one list). ``loss_agg_mode`` here is the policy loss's own
# aggregation (null = the loss's default: ``turn-mean`` for turn_ppo, ``token-mean`` otherwise); verl's
# ``actor.loss_agg_mode`` stays ``token-mean`` and only aggregates the entropy and KL terms.
RagenPolicyLossConfig = dataclasses.make_dataclass(
    "RagenPolicyLossConfig", [(name, *_knob_field(typ, d)) for name, (typ, d) in policy_loss_knobs().items()],
    bases=(PolicyLossConfig,))
RagenPolicyLossConfig.__module__ = __name__  # verl's config names it by path (_target_) and Ray pickles it by it
RagenPolicyLossConfig.__doc__ = "verl's ``actor.policy_loss`` plus the knobs of our losses (see above)."


def core_config(config: Any) -> Dict[str, Any]:
    """Our loss config (a plain dict) from verl's ``ActorConfig`` or a dict of the same keys."""
    out: Dict[str, Any] = {}
    if config is None:
        return out
    for key in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c"):
        val = cfg_get(config, key)
        if val is not None:
            out[key] = float(val)
    sub = config.get("policy_loss") if hasattr(config, "get") else getattr(config, "policy_loss", None)
    for key in _KNOBS:
        val = cfg_get(sub, key) if sub is not None else None
        if val is None:
            val = cfg_get(config, key) if isinstance(config, dict) else None
        if val is not None:
            out[key] = val
    return out


def _batch_info(config: Any) -> Dict[str, Any]:
    """A copy of ``config.global_batch_info``; the turn count (ours) is taken out of verl's dict, which verl's
    ``ppo_loss`` then passes to ``agg_loss`` for the entropy and KL terms (it takes no such argument)."""
    info = cfg_get(config, "global_batch_info") if config is not None else None
    out = dict(info or {})
    if isinstance(info, dict):
        info.pop("batch_num_turns", None)
    return out


def global_counts(name: str, response_mask: torch.Tensor, agg: Optional[str],
                  info: Dict[str, Any]) -> Optional[algos.GlobalCounts]:
    """verl's global mini-batch counts (``global_batch_info``) as the loss's :class:`~ragen_turn.algos.GlobalCounts`.

    Every count is divided by ``dp_size`` (each rank's loss is averaged over ranks): response tokens
    ``batch_num_tokens``, rows ``global_batch_size`` and turns ``batch_num_turns`` (set by the verl
    trainer, which knows each mini-batch's turn count). Without the turn count, a ``turn-mean`` loss
    normalises by this micro-batch's turns scaled to the mini-batch's rows (each micro-batch's turn mean
    weighted by its share of episodes). With no batch info (a direct call): None, the batch's own mean.
    """
    if not info:
        return None
    dp = int(info.get("dp_size") or 1)
    mask = response_mask.bool()
    n_tok, n_seq, n_turns = (info.get(k) for k in ("batch_num_tokens", "global_batch_size", "batch_num_turns"))
    rows = float((mask.sum(dim=1) > 0).sum())
    default = algos.policy_loss_spec(name).default_agg
    if n_turns:
        turns = float(n_turns) / dp
    else:
        local = float((algos.turn_ids_from_mask(mask).max(dim=1).values + 1).clamp(min=0).sum())
        turns = local * float(n_seq) / dp / rows if n_seq and rows and (agg or default) == "turn-mean" else 0.0
    return algos.GlobalCounts(tokens=float(n_tok) / dp if n_tok else 0.0, turns=turns,
                              rows=float(n_seq) / dp if n_seq else 0.0)


def make_policy_loss(name: str):
    """verl-signature adapter over ``ragen_turn.algos``'s loss ``name``."""
    core = algos.get_policy_loss_fn(name)

    def policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode: str = "token-mean",
                    config=None, rollout_is_weights=None):
        # verl's actor-level loss_agg_mode aggregates entropy/KL; ours comes from policy_loss.loss_agg_mode
        cfg = core_config(config)
        agg = cfg.pop("loss_agg_mode", None)
        counts = global_counts(name, response_mask, agg, _batch_info(config))
        return core(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
                    loss_agg_mode=agg, config=cfg, rollout_is_weights=rollout_is_weights, global_counts=counts)

    policy_loss.__name__ = f"compute_policy_loss_{name}_verl"
    policy_loss.__doc__ = f"verl adapter of ragen_turn.algos policy loss {name!r}.\n\n{core.__doc__ or ''}"
    return policy_loss


@torch.no_grad()
def compute_turn_gae_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config=None,
                               values: Optional[torch.Tensor] = None, turn_ids: Optional[torch.Tensor] = None,
                               **kwargs):
    """verl advantage estimator ``turn_gae`` (Turn-PPO): ``ragen_turn.algos``' ``turn_gae`` estimator (the turn GAE
    pipeline both engines run) on verl's inputs.

    Args:
        token_level_rewards: ``[B, R]``; r_h = the sum over turn h's tokens (verl puts an episode's
            score on its last response token, i.e. a terminal reward on the last turn).
        response_mask: ``[B, R]``; turns are its runs of 1s unless ``turn_ids`` is given.
        config: verl's ``algorithm`` config: ``gamma``, ``lam`` (1.0 if absent, as verl), ``norm_adv``
            (whiten over turns, default true).
        values: ``[B, R]`` critic values in verl's layout (V(s_h) = the value at turn h's first
            token). verl's stock ``compute_advantage`` never passes values to a custom estimator; then
            V = 0 and the advantages are turn-level discounted returns (the verl engine's trainer passes them).
    Returns:
        advantages, returns: ``[B, R]``, turn h's value on every token of turn h (verl's layout; our estimator
        gives the returns per turn).
    """
    mask = response_mask.float()
    if turn_ids is None:
        turn_ids = algos.turn_ids_from_mask(response_mask)
    H = max(algos.num_turns(turn_ids), 1)
    rewards = algos.turn_sums(token_level_rewards.float() * mask, turn_ids, H)
    adv, turn_returns = algos.get_adv_estimator_fn("turn_gae")(
        turn_rewards=rewards, turn_mask=algos.turn_mask_from_ids(turn_ids, H), turn_ids=turn_ids, response_mask=mask,
        group_ids=None, values=values, config=config)
    return adv, algos.scatter_turns(turn_returns, turn_ids) * mask


def register_all() -> None:
    """Idempotent: (re)register our names in this process's verl registries."""
    for name in algos.POLICY_LOSS_REGISTRY:  # every loss of ours, by its registry entry
        fn = verl_algos.POLICY_LOSS_REGISTRY.get(name)
        if fn is None or getattr(fn, "__module__", None) != __name__:
            verl_algos.register_policy_loss(name)(make_policy_loss(name))
    current = verl_algos.ADV_ESTIMATOR_REGISTRY.get("turn_gae")
    if current is not compute_turn_gae_advantage:
        verl_algos.ADV_ESTIMATOR_REGISTRY.pop("turn_gae", None)
        verl_algos.register_adv_est("turn_gae")(compute_turn_gae_advantage)


register_all()
