"""``BanditEnvConfig``: RAGEN's two-armed bandit settings (field names and defaults as RAGEN's ``BanditEnvConfig``)."""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Dict, Optional

# Arm pairs (low-risk name, high-risk name) per split: the names RAGEN's Bandit draws from, in RAGEN's order
# (the index drawn at reset picks a pair, so the order is part of the episode a seed gives).
ARM_PAIRS = {
    "train": (
        ("Teacher", "Trader"), ("Nurse", "StartupFounder"), ("Librarian", "Investor"),
        ("Accountant", "StockBroker"), ("Engineer", "RealEstateAgent"), ("Pharmacist", "Musician"),
        ("Clerk", "Freelancer"), ("Technician", "Youtuber"), ("Planner", "Artist"), ("Postman", "Pilot"),
        ("Banker", "VentureCapitalist"), ("Gardener", "Cryptominer"),
    ),
    "test": (
        ("Receptionist", "Explorer"), ("Archivist", "Filmmaker"), ("Bookkeeper", "Consultant"),
        ("SocialWorker", "Photographer"), ("Mechanic", "GameDesigner"), ("Secretary", "Entrepreneur"),
        ("Cashier", "DataScientist"), ("CivilServant", "StartupAccelerator"),
    ),
}


def _number(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"bandit env_config.{name} must be a number, got {v!r}")
    return v


@dataclass
class BanditEnvConfig:
    """The low-risk arm always pays ``lo_arm_score``; the high-risk arm pays ``hi_arm_hiscore`` with probability
    ``hi_arm_hiscore_prob``, else ``hi_arm_loscore`` (RAGEN's defaults: 0.1, vs 1.0 w.p. 0.25: mean 0.25)."""

    split: str = "train"                    # which arm names: train (12 pairs) | test (8 other pairs)
    lo_arm_name: Optional[str] = None       # RAGEN's Sept 2025 keys: both set = one fixed pair of names (the
    hi_arm_name: Optional[str] = None       # low-risk, the high-risk arm) instead of split's; only their order drawn
    action_space_start: int = 1             # id of the first arm (the second is start + 1)
    lo_arm_score: float = 0.1
    hi_arm_loscore: float = 0.0
    hi_arm_hiscore: float = 1.0
    hi_arm_hiscore_prob: float = 0.25
    render_mode: str = "text"
    action_lookup: Optional[Dict[int, str]] = None  # drawn at every reset (which name is arm 1): leave null
    internal_seed: Optional[int] = None     # not RAGEN's: null = RAGEN's rule (the n-th env built adds n to the reset
                                            # seed; in our env manager n is the env's index in its split); an int
                                            # fixes the offset
    format_penalty: float = -0.1            # not RAGEN's (its env asserts): reward of an unknown arm, a no-op

    def __post_init__(self) -> None:
        if (self.lo_arm_name is None) != (self.hi_arm_name is None):
            raise ValueError("bandit env_config.lo_arm_name and hi_arm_name go together (RAGEN's fixed pair of names): "
                             f"got lo_arm_name={self.lo_arm_name!r}, hi_arm_name={self.hi_arm_name!r}")
        if self.lo_arm_name is not None:
            self.lo_arm_name, self.hi_arm_name = str(self.lo_arm_name), str(self.hi_arm_name)
            if self.lo_arm_name == self.hi_arm_name:
                raise ValueError("bandit env_config.lo_arm_name and hi_arm_name must differ, both "
                                 f"{self.lo_arm_name!r}")
        if self.split not in ARM_PAIRS:
            raise ValueError(f"bandit env_config.split must be one of {sorted(ARM_PAIRS)}, got {self.split!r}")
        for name in ("lo_arm_score", "hi_arm_loscore", "hi_arm_hiscore", "hi_arm_hiscore_prob", "format_penalty"):
            _number(name, getattr(self, name))
        if not 0.0 <= self.hi_arm_hiscore_prob <= 1.0:
            raise ValueError(f"bandit env_config.hi_arm_hiscore_prob must be in [0, 1], got {self.hi_arm_hiscore_prob}")
        for name in ("action_space_start", "internal_seed"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
                raise ValueError(f"bandit env_config.{name} must be an integer, got {v!r}")
        if self.action_space_start is None:
            raise ValueError("bandit env_config.action_space_start must be an integer, got None")
        if self.render_mode != "text":
            raise ValueError(f"bandit env_config.render_mode must be 'text', got {self.render_mode!r}")
        if self.action_lookup is not None:
            self.action_lookup = {int(k): str(v) for k, v in dict(self.action_lookup).items()}
