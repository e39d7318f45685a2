"""The algorithm core: pure torch, no engine or environment imports.

- :mod:`.turns`: response mask -> turn ids, turn boundaries, gather/scatter per turn.
- :mod:`.advantages`: ``grpo``, ``token_gae``, ``turn_gae``, ``bi_level_gae`` (registry by name, one
  keyword signature: ``get_adv_estimator_fn(name)(turn_rewards=, turn_mask=, turn_ids=, response_mask=,
  group_ids=, values=, config=) -> (advantages, returns)``; ``adv_estimator_spec(name)``: the critic it reads,
  bootstrapping, group size).
- :mod:`.losses`: ``token_ppo``, ``turn_ppo``, ``turn_ppo_geo``, ``turn_is``, ``s_ppo``, ``st_ppo``
  (registry by name, verl's argument order, dual clip, the clipping-bias correction in SPEC's ``mass`` and
  SORL's ``rms`` readings), ``value_loss``, ``kl_penalty``; :class:`GlobalCounts` makes micro-batch losses add
  up to the mini-batch's; ``policy_loss_spec(name)``: its unit and default aggregation.
- :mod:`.kl_control`: the KL penalty in the reward (verl's ``use_kl_in_reward``): ``KLController`` (fixed /
  adaptive), ``reward_kl`` (the per-token penalty and the step's KL).
- :mod:`.value_norm`: ``critic.target_norm``: ``ValueNorm`` (running mean / std of the critic's targets; the
  critic fits standardised returns, its outputs de-normalised where values are used).
- :mod:`.registry`: the registries and the properties on their entries (``EstimatorSpec``, ``LossSpec``).
"""
from .advantages import (
    ADV_ESTIMATOR_REGISTRY,
    adv_estimator_spec,
    bi_level_gae_advantage,
    bootstrapping_estimators,
    compute_bi_level_gae,
    compute_grpo_advantages,
    compute_token_gae,
    compute_turn_gae,
    discounted_reverse_cumsum,
    get_adv_estimator_fn,
    grpo_advantage,
    masked_whiten,
    register_adv_est,
    token_gae_advantage,
    turn_gae_advantage,
)
from .kl_control import KL_CTRL_TYPES, KLController, kl_controller, reward_kl
from .losses import (
    POLICY_LOSS_REGISTRY,
    GlobalCounts,
    LossSettings,
    PPOTerms,
    clip_bias_scale,
    explained_variance,
    get_policy_loss_fn,
    kl_penalty,
    loss_settings,
    masked_mean,
    minibatch_clip_stats,
    needs_minibatch_stats,
    policy_loss,
    policy_loss_spec,
    register_policy_loss,
    unit_stats,
    value_loss,
)
from .value_norm import ValueNorm, value_norm
from .registry import CRITIC_LEVELS, DEFAULT_AGG, EstimatorSpec, LossSpec
from .turns import (
    check_turn_ids,
    gather_turns,
    num_turns,
    place_turn_rewards,
    scatter_turns,
    state_positions,
    turn_boundaries,
    turn_ids_from_mask,
    turn_mask_from_ids,
    turn_start_values,
    turn_sums,
    values_before_tokens,
    turn_token_counts,
)

__all__ = [name for name in dir() if not name.startswith("_")]
