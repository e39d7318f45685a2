"""The policy loss's options, listed once here, and every consumer of them agreeing (issue #62, item 1).

Their one home is ``PolicyLossConfig`` in ``ragen_turn/schema.py`` (each knob with its default and rule); the
loss (``algos.loss_settings``), the run config (``config.policy_loss_config``), verl's config section
(``engines/verl/config.py``: ``verl_policy_loss_knobs``) and verl's loss adapter (``engines/verl/register.py``:
``RagenPolicyLossConfig``, ``core_config``) derive from it or read it. A knob added to the schema and not read by the
loss, or dropped on the way to verl, fails here; so does a default that drifts between the schema and the loss.
"""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from helpers import micro_config

# knob -> (its default, another valid value): the one list of the options in the tests
OPTIONS = {
    "ratio_mode": (None, "geo_mean"),  # the schema leaves it to the algo's yaml (${algo.ratio_mode})
    "loss_agg_mode": (None, "token-mean"),
    "turn_band": ("fixed", "sqrt_len"),
    "token_band": (False, True),
    "token_clip_low": (0.2, 0.1),
    "token_clip_high": (0.28, 0.3),
    "loss_scale_factor": (None, 7.0),
    "clip_bias": (False, True),
    "clip_bias_level": ("sample", "batch"),
    "clip_bias_stat": ("mass", "rms"),
    "clip_bias_threshold": (None, 2.0),
}
PREFIX = "actor_rollout_ref.actor.policy_loss."


def _yaml(v) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


@pytest.fixture(scope="module")
def other_cfg():
    """A run config with every knob set to its other value on the command line (a turn-unit loss: token-mean is
    valid for it)."""
    return micro_config([f"{PREFIX}{k}={_yaml(alt)}" for k, (_, alt) in OPTIONS.items()])


def test_the_schema_is_the_list():
    from ragen_turn.schema import policy_loss_knobs

    assert {k: d for k, (_, d) in policy_loss_knobs().items()} == {k: d for k, (d, _) in OPTIONS.items()}


def test_the_loss_defaults_and_choices_agree_with_the_schema():
    from ragen_turn import schema
    from ragen_turn.algos import losses

    d = losses.LossSettings()
    for k, (default, _) in OPTIONS.items():
        want = losses.CLIP_BIAS_THRESHOLDS[d.clip_bias_stat] if k == "clip_bias_threshold" else default
        assert getattr(d, k) == want, k
    rules = {f.name: f.metadata.get("rule") for f in dataclasses.fields(schema.PolicyLossConfig)}
    for k, names in (("ratio_mode", losses.RATIO_MODES), ("clip_bias_level", losses.CLIP_BIAS_LEVELS),
                     ("clip_bias_stat", losses.CLIP_BIAS_STATS), ("turn_band", losses.TURN_BANDS),
                     ("loss_agg_mode", losses.TOKEN_AGG_MODES + losses.TURN_AGG_MODES)):
        choices = rules[k].choices
        assert set(choices() if callable(choices) else choices) == set(names), k


def test_the_loss_reads_every_knob_of_the_run_config(other_cfg):
    from ragen_turn.algos import loss_settings
    from ragen_turn.config import policy_loss_config

    s = loss_settings(policy_loss_config(other_cfg))
    assert {k: getattr(s, k) for k in OPTIONS} == {k: alt for k, (_, alt) in OPTIONS.items()}
    default = loss_settings(policy_loss_config(micro_config(["algo=st_ppo"])))  # ratio_mode from its yaml
    assert {k: getattr(default, k) for k in OPTIONS if k not in ("clip_bias_threshold", "loss_scale_factor")} == \
        {k: d for k, (d, _) in OPTIONS.items() if k not in ("clip_bias_threshold", "loss_scale_factor")} | \
        {"ratio_mode": "geo_mean"}
    assert default.loss_scale_factor == 2 * 8  # null: max_turn x response_length (micro_config's 2 and 8)


def test_the_verl_config_passes_every_knob(other_cfg):
    from ragen_turn.engines.verl.config import verl_policy_loss_knobs

    assert verl_policy_loss_knobs(other_cfg) == {k: alt for k, (_, alt) in OPTIONS.items()}


@pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed (pip install -e '.[verl]')")
def test_verls_loss_adapter_takes_every_knob(other_cfg):
    from ragen_turn.engines.verl.config import verl_policy_loss_knobs
    from ragen_turn.engines.verl.register import RagenPolicyLossConfig, core_config

    fields = {f.name: f.default for f in dataclasses.fields(RagenPolicyLossConfig)}
    assert {k: fields[k] for k in OPTIONS} == {k: d for k, (d, _) in OPTIONS.items()}
    pl = RagenPolicyLossConfig(loss_mode="turn_ppo", **verl_policy_loss_knobs(other_cfg))
    assert core_config({"policy_loss": pl}) == {k: alt for k, (_, alt) in OPTIONS.items()}
