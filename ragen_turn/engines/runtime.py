"""Where a run computes and how it is seeded: the torch device and the random seeds (both engines, SFT, eval)."""
from __future__ import annotations

import random

import numpy as np
import torch


def pick_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; any other name as given (``cpu``, ``cuda``, ``cuda:1``)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def derived_seed(*parts: int) -> int:
    """A seed in [0, 2**63) from a tuple of ints (run seed, step, purpose ...): independent streams per tuple."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] % (2**63))
