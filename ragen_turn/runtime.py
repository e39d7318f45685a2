"""Where a run computes, how it is seeded and how long it takes: the torch device, the random seeds, durations and
ETAs for progress lines, transformers' log level (both engines, SFT, eval: a leaf any of them imports)."""
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


def fmt_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = int(round(max(0.0, float(seconds))))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def eta(done: int, total: int, elapsed: float) -> str:
    """``elapsed, ETA left`` after ``done`` of ``total`` equal units of work that took ``elapsed`` seconds."""
    if done <= 0 or total <= done:
        return fmt_duration(elapsed)
    return f"{fmt_duration(elapsed)}, ETA {fmt_duration(elapsed / done * (total - done))}"


def set_cuda_visible_devices(value: str) -> None:
    """Export ``CUDA_VISIBLE_DEVICES`` (RAGEN's ``system.CUDA_VISIBLE_DEVICES``, mapped by ``ragen_keys``); once torch
    has initialised CUDA a different value cannot take effect, so that stops the run (it never happens from the
    command line, where this runs first)."""
    import os

    value = str(value).strip()
    if os.environ.get("CUDA_VISIBLE_DEVICES") == value:
        return
    if torch.cuda.is_initialized():
        raise ValueError(f"system.CUDA_VISIBLE_DEVICES={value}: CUDA is already initialised in this process with "
                         f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}; give it on the command "
                         "line (or export it before starting)")
    os.environ["CUDA_VISIBLE_DEVICES"] = value


def quiet_transformers() -> None:
    """One progress line per step is ours; transformers' load/save progress bars are noise here."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
