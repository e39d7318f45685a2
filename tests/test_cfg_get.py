"""cfg_get: one reader of a (dotted) key for every kind of config the project meets."""
from dataclasses import dataclass, field

from omegaconf import OmegaConf

from ragen_turn.cfg_get import cfg_get


@dataclass
class _PolicyLoss:
    clip_ratio_c: float = 3.0
    loss_agg_mode: str | None = None


@dataclass
class _Actor:
    policy_loss: _PolicyLoss = field(default_factory=_PolicyLoss)


def test_dotted_keys_through_dicts_hydra_and_attribute_configs():
    plain = {"trainer": {"total_training_steps": 30, "logger": None}, "seed": 0}
    hydra = OmegaConf.create(plain)
    for cfg in (plain, hydra):
        assert cfg_get(cfg, "trainer.total_training_steps") == 30
        assert cfg_get(cfg, "seed", 5) == 0                        # a falsy value is a value
        assert cfg_get(cfg, "trainer.logger", "console") == "console"  # null -> default
        assert cfg_get(cfg, "trainer.missing.deeper", 1) == 1      # a missing level -> default
        assert cfg_get(cfg, "seed.train") is None                  # through a number: missing, not an error
    actor = _Actor()
    assert cfg_get(actor, "policy_loss.clip_ratio_c") == 3.0
    assert cfg_get(actor, "policy_loss.loss_agg_mode", "token-mean") == "token-mean"
    assert cfg_get(None, "a", 2) == 2
