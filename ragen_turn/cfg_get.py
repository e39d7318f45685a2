"""One way to read a key from any config this project meets: Hydra's ``DictConfig``, a plain dict (a run's
``config.yaml`` as the report reads it), a dataclass or another attribute object (verl's configs).

    cfg_get(cfg, "trainer.total_training_steps")        # -> 30
    cfg_get(policy_loss_config, "clip_ratio_c", 3.0)     # -> 3.0 when the key is missing or null
"""
from __future__ import annotations

from typing import Any


def cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """``config``'s value at the dotted ``key``, read through mappings (``.get``) or attributes at each level;
    ``default`` when a level is missing or the value is ``None`` (null)."""
    cur = config
    for part in key.split("."):
        if cur is None:
            return default
        if hasattr(cur, "keys") and hasattr(cur, "get"):
            cur = cur.get(part, None)
        else:
            cur = getattr(cur, part, None)
    return default if cur is None else cur
