"""Registries by name, like verl's ``register_adv_est`` / ``register_policy_loss``, whose entries carry the
algorithm's properties.

Every fact the rest of the project needs about an estimator or a loss sits on its registry entry (a frozen
spec, ``fn.spec``), so a new algorithm is one registered function plus one ``config/algo/<name>.yaml``:

- :class:`EstimatorSpec`: the critic it reads (``none`` / ``token`` / ``turn``), whether it bootstraps
  truncated episodes, the smallest env group it can form a baseline from;
- :class:`LossSpec`: its unit (``token`` / ``turn``, and so its default aggregation), whether it forces the
  clipping-bias correction on.

The config checks, the critic each engine builds and trains, the verl registrations and RAGEN-key messages
are derived from these (``ragen_turn/config.py``, ``engines/advantages.py``, ``engines/verl/register.py``,
``ragen_turn/ragen_keys.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

CRITIC_LEVELS = ("none", "token", "turn")
UNITS = ("token", "turn")
DEFAULT_AGG = {"token": "token-mean", "turn": "turn-mean"}  # a loss's aggregation when none is configured


@dataclass(frozen=True)
class EstimatorSpec:
    """What an advantage estimator needs.

    ``critic_level``: ``none`` (no critic is built; e.g. GRPO's group baseline), ``token`` (V before every
    response token, trained on every response token) or ``turn`` (V(s_h), read and trained at each turn's
    first token). ``bootstraps``: it accepts ``bootstrap_values`` (``algorithm.bootstrap_truncated``).
    ``min_group_size``: the fewest rollouts per env group it can use (2 for a group-mean baseline).
    ``token_rewards``: it takes per-token rewards (``token_rewards=[B, T]``, added to the turn rewards on their
    tokens: the in-reward KL penalty); otherwise a per-token reward is summed into its turn's reward."""

    critic_level: str
    bootstraps: bool
    min_group_size: int = 1
    token_rewards: bool = False

    def __post_init__(self):
        if self.critic_level not in CRITIC_LEVELS:
            raise ValueError(f"critic_level must be one of {CRITIC_LEVELS}, got {self.critic_level!r}")
        if self.bootstraps and self.critic_level == "none":
            raise ValueError("an estimator without a critic has no value to bootstrap from (bootstraps=True)")
        if self.min_group_size < 1:
            raise ValueError(f"min_group_size must be >= 1, got {self.min_group_size}")


@dataclass(frozen=True)
class LossSpec:
    """What a policy loss is: ``unit`` ``token`` (one ratio and advantage per response token) or ``turn`` (one
    per turn); ``forces_clip_bias``: the clipping-bias correction is always on (``s_ppo``, ``st_ppo``)."""

    unit: str
    forces_clip_bias: bool = False

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")

    @property
    def default_agg(self) -> str:
        """The aggregation used when ``loss_agg_mode`` is not set: ``token-mean`` or ``turn-mean``."""
        return DEFAULT_AGG[self.unit]


class Registry(Dict[str, Callable]):
    """A ``name -> function`` dict with a registering decorator and a lookup that names what exists.

    ``spec_type`` (optional): every entry is registered with that spec's fields as keywords and keeps the spec
    as ``fn.spec`` (:meth:`spec` reads it)."""

    def __init__(self, kind: str, spec_type: Optional[type] = None):
        super().__init__()
        self.kind = kind
        self.spec_type = spec_type

    def register(self, name: str, **props: Any) -> Callable[[Callable], Callable]:
        spec = self.spec_type(**props) if self.spec_type is not None else None
        if props and spec is None:
            raise TypeError(f"{self.kind} registry takes no properties, got {sorted(props)}")

        def wrap(fn: Callable) -> Callable:
            if name in self and self[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            if spec is not None:
                fn.spec = spec
            self[name] = fn
            return fn

        return wrap

    def lookup(self, name: str) -> Callable:
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {sorted(self)}")
        return self[name]

    def spec(self, name: str) -> Any:
        """The registered properties of ``name`` (ValueError naming the known names for an unknown one)."""
        return self.lookup(name).spec
