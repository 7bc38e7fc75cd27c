"""Attention rows validated once: the container that metrics, bounds and algorithms share.

The layout of the whole mathematics layer: weights ``(..., R, L)`` (row r = one query over L keys), the
vectors x_i ``(..., L, d)`` (by default the per-head value vectors), and a boolean ``mask`` broadcastable to
the weights (``True`` = key visible). Every leading dim is a batch dim (layers, heads, ...) and must
broadcast between weights and vectors. :meth:`Rows.of` checks all of it once and raises ``ValueError``
naming the parameter; the public functions of :mod:`metrics`, :mod:`theory` and :mod:`algorithms` accept
either raw tensors (validated into a :class:`Rows`) or a :class:`Rows` (used as it is), and their private
kernels trust it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_utils.mathematics.validation import as_tensor, broadcasts_to, check_keys, check_rows_sum_to_one

#: Rows must sum to one within this tolerance (float32 attention of long rows passes).
SUM_ATOL = 1e-5


def float_tensor(name: str, value) -> torch.Tensor:
    """Tensors and arrays keep a floating dtype; Python numbers, lists and integer data become float64 on the CPU
    (whatever torch's default device: callers move them next to their tensors)."""
    if not isinstance(value, torch.Tensor) and not hasattr(value, "dtype"):
        try:
            value = torch.as_tensor(value, dtype=torch.float64, device="cpu")
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"{name} must be an array or tensor of numbers, got {type(value).__name__}") from None
    t = as_tensor(name, value)
    return t if t.is_floating_point() else t.to(torch.float64)


def bool_view(name: str, value, shape: torch.Size) -> torch.Tensor:
    """A boolean tensor broadcast (as a view, never grown) to ``shape``."""
    t = as_tensor(name, value)
    if t.dtype != torch.bool:
        raise ValueError(f"{name} must be a boolean tensor, got dtype {t.dtype}")
    if not broadcasts_to(t.shape, shape):
        raise ValueError(f"{name} of shape {tuple(t.shape)} does not broadcast to the weights' shape {tuple(shape)}")
    return t.expand(shape)


def unit_scale(x: torch.Tensor, dims: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / c, c): c = 2^k per index of the leading dims (all but the last ``dims``), with
    max |x / c| < 2 (c = 1 where x is 0). Division by a power of two is exact (short of underflow),
    squares of x / c cannot overflow, and c is representable in x's dtype. Every distance of the book is
    homogeneous of degree 1 in x, so it is computed on x / c and multiplied by c."""
    lead = x.shape[: x.ndim - dims]
    if x.numel() == 0:
        return x, torch.ones(lead, dtype=x.dtype, device=x.device)
    _, e = torch.frexp(x.abs().amax(tuple(range(x.ndim - dims, x.ndim))))
    # e = 0: max < 1, c = 1
    c = torch.ldexp(torch.ones(e.shape, dtype=x.dtype, device=x.device), torch.where(e == 0, 1, e) - 1)
    return x / c.reshape(*lead, *(1,) * dims), c


@dataclass(frozen=True)
class Rows:
    """Validated attention rows: ``weights`` (..., R, L) and, when given, ``x`` (..., L, d) with the same
    leading dims (broadcast views), in one float dtype; ``visible`` (..., R, L) boolean (a view; all True
    without a mask). With ``sums_to_one`` the weights' rows are non-negative and sum to one (Eq. (3))."""

    weights: torch.Tensor
    visible: torch.Tensor
    x: torch.Tensor | None = None
    masked: bool = False  # whether a mask was given (otherwise every key is visible)

    @classmethod
    def of(cls, weights, x=None, mask=None, *, dtype: torch.dtype | None = torch.float64,
           sums_to_one: bool = True) -> Rows:
        """Validate (weights, x, mask) once. ``dtype=None`` keeps the promoted dtype of weights and x. A
        :class:`Rows` is returned as it is (then ``x`` and ``mask`` must not be given again)."""
        if isinstance(weights, Rows):
            if x is not None or mask is not None:
                raise ValueError("x and mask belong to the Rows already; do not pass them again")
            return weights
        w = float_tensor("weights", weights)
        if w.ndim < 2:
            raise ValueError(f"weights must be a float tensor of shape (..., R, L), got shape {tuple(w.shape)}")
        check_keys("weights", w)
        xs = None
        if x is not None:
            xs = float_tensor("x", x)
            if xs.ndim < 2 or xs.shape[-2] != w.shape[-1]:
                raise ValueError(f"x must be a float tensor of shape (..., L, d) with L = {w.shape[-1]} keys "
                                 f"(the last axis of weights), got shape {tuple(xs.shape)}")
            if not torch.isfinite(xs).all():
                raise ValueError("x must contain only finite numbers (found NaN or inf)")
            try:
                lead = torch.broadcast_shapes(xs.shape[:-2], w.shape[:-2])
            except RuntimeError:
                raise ValueError(f"the leading dims of x {tuple(xs.shape[:-2])} and weights "
                                 f"{tuple(w.shape[:-2])} do not broadcast") from None
            common = dtype or torch.promote_types(w.dtype, xs.dtype)
            w, xs = w.to(common).expand(*lead, *w.shape[-2:]), xs.to(common).expand(*lead, *xs.shape[-2:])
        elif dtype is not None:
            w = w.to(dtype)
        if sums_to_one:
            check_rows_sum_to_one("weights", w, atol=SUM_ATOL)
        visible = (torch.ones((), dtype=torch.bool, device=w.device).expand(w.shape) if mask is None
                   else bool_view("mask", mask, w.shape).to(w.device))
        return cls(w, visible, xs, mask is not None)

    def lengths(self) -> torch.Tensor:
        """L_r: the number of visible keys of each row, shape (..., R)."""
        return self.visible.sum(-1)
