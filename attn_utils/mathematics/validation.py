"""Input checks shared by the whole package.

Every check raises ``ValueError`` whose message names the offending parameter and the allowed
range, so that bad input stops before any heavy work starts.
"""
from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Iterable

import torch


def broadcasts_to(shape, target) -> bool:
    """Whether a tensor of ``shape`` broadcasts to exactly ``target`` (without growing it)."""
    try:
        return torch.broadcast_shapes(shape, target) == torch.Size(target)
    except RuntimeError:
        return False


def check_positive(name: str, value: float) -> float:
    """Require a finite real number > 0 (Python, numpy or 0-d tensor)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_int(name: str, value: int, low: int | None = None, high: int | None = None) -> int:
    """Require an integer with ``low <= value <= high`` (either end may be open)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else str(low)
        hi = "inf" if high is None else str(high)
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value}")
    return value


def check_choice(name: str, value, choices: Iterable) -> object:
    """Require ``value`` to be one of ``choices``."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_finite(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Require a tensor without NaN (infinities are allowed only where the caller masks them)."""
    if torch.isnan(tensor).any():
        raise ValueError(f"{name} contains NaN values; all entries must be finite numbers")
    return tensor


def check_keys(name: str, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Require at least one key: axis ``dim`` (the keys) must be non-empty. Zero rows are allowed."""
    if tensor.ndim < (-dim if dim < 0 else dim + 1) or tensor.shape[dim] == 0:
        raise ValueError(
            f"{name} must have at least one key (axis {dim} of length >= 1), got shape {tuple(tensor.shape)}"
        )
    return tensor


def check_visible_rows(name: str, mask: torch.Tensor) -> torch.Tensor:
    """Require a boolean mask (..., R, L) whose every row holds at least one visible key (True)."""
    empty = ~mask.any(-1)
    if empty.any():
        row = tuple(empty.nonzero()[0].tolist())
        raise ValueError(f"{name} must leave at least one visible key in every row; row {row} has none")
    return mask


def check_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor, dims: slice = slice(None)) -> None:
    """Require ``a.shape[dims] == b.shape[dims]``."""
    if tuple(a.shape[dims]) != tuple(b.shape[dims]):
        raise ValueError(
            f"{name_a} and {name_b} have mismatched shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_rows_sum_to_one(name: str, weights: torch.Tensor, atol: float = 1e-6) -> torch.Tensor:
    """Require non-negative rows (last axis) that sum to one, as attention weights do.

    Rows that are entirely zero (fully masked rows) are allowed.
    """
    check_finite(name, weights)
    if (weights < -atol).any():
        raise ValueError(f"{name} must be non-negative (attention weights), found {weights.min().item():.3g}")
    sums = weights.sum(-1)
    bad = ((sums - 1).abs() > atol) & (sums.abs() > atol)
    if bad.any():
        worst = sums[bad].flatten()[0].item()
        raise ValueError(f"every row of {name} must sum to one (tolerance {atol}); a row sums to {worst:.6g}")
    return weights


def as_tensor(name: str, value, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Convert arrays and lists to a torch tensor, keeping tensors as they are (optionally cast)."""
    try:
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    except Exception as exc:  # pragma: no cover - message path
        raise ValueError(f"{name} must be an array or tensor of numbers, got {type(value).__name__}") from exc
    if dtype is not None:
        t = t.to(dtype)
    return t


def call_elementwise(F: Callable, l: torch.Tensor, theta, name: str) -> torch.Tensor:
    """Evaluate a user's F(l, theta), or F(l) when theta is None, as a tensor shaped and typed like l; it must be
    callable and give finite values (ValueError naming ``name`` otherwise)."""
    if not callable(F):
        raise ValueError(f"{name} must be a callable F(l, theta) (or F(l) when theta is None), got {F!r}")
    out = as_tensor(name, F(l) if theta is None else F(l, theta)).to(l.dtype)
    if out.shape != l.shape:
        out = out.expand(l.shape)
    check_finite(name, out)
    if torch.isinf(out).any():
        raise ValueError(f"{name} returned infinite values; F and its derivative must be finite")
    return out
