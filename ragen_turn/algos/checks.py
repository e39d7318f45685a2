"""Input checks shared by the algorithm core: every bad input is a ValueError naming the argument."""
from __future__ import annotations

import torch


def check_mask(name: str, mask: torch.Tensor) -> None:
    """``mask`` must be a tensor of 0s and 1s (bool, int or float)."""
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return
    if not ((mask == 0) | (mask == 1)).all():
        raise ValueError(f"{name} must contain only 0 and 1")


def check_same_shape(**tensors: torch.Tensor) -> None:
    """All given tensors must have the first one's shape."""
    items = list(tensors.items())
    ref_name, ref = items[0]
    for name, t in items[1:]:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.shape != ref.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but {ref_name} has shape {tuple(ref.shape)}")


def check_finite(name: str, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """``x`` must be finite wherever ``mask`` is 1 (everywhere if no mask)."""
    bad = ~torch.isfinite(x)
    if mask is not None:
        bad = bad & mask.bool()
    if bad.any():
        raise ValueError(f"{name} has {int(bad.sum())} non-finite value(s) (NaN/inf)")


def check_ndim(name: str, x: torch.Tensor, ndim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")


def check_unit_interval(name: str, value: float) -> None:
    if not (0.0 <= float(value) <= 1.0):
        raise ValueError(f"{name} must be in [0, 1], got {value}")
