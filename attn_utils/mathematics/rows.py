"""Attention rows validated once: the container that metrics, bounds and algorithms share.

The layout of the whole mathematics layer: weights ``(..., R, L)`` (row r = one query over L keys), the
vectors x_i ``(..., L, d)`` (by default the per-head value vectors), and a boolean ``mask`` broadcastable to
the weights (``True`` = key visible). Every leading dim is a batch dim (layers, heads, ...) and must
broadcast between weights and vectors. :meth:`Rows.of` checks all of it once and raises ``ValueError``
naming the parameter and the allowed shape: it is the one row validator of the mathematics. The public
functions of :mod:`metrics`, :mod:`theory`, :mod:`algorithms`, :mod:`beyond` and the normalizers validate their
rows through it (the metrics also accept a :class:`Rows`, used as it is); the kernels of :mod:`kernels` trust
what it returned.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attn_utils.mathematics.validation import (
    as_tensor,
    broadcasts_to,
    check_finite,
    check_keys,
    check_rows_sum_to_one,
    check_visible_rows,
)

__all__ = ["SUM_ATOL", "Rows", "bool_view", "check_distribution", "float_tensor", "unit_scale"]

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


def bool_view(name: str, value, shape: torch.Size, device=None, of: str = "weights") -> torch.Tensor:
    """A boolean tensor broadcast (as a view, never grown) to ``shape`` (the shape of ``of``), moved to ``device``
    first when given."""
    t = as_tensor(name, value)
    if t.dtype != torch.bool:
        raise ValueError(f"{name} must be a boolean tensor, got dtype {t.dtype}")
    if not broadcasts_to(t.shape, shape):
        raise ValueError(f"{name} of shape {tuple(t.shape)} does not broadcast to {of} of shape {tuple(shape)}")
    return (t if device is None else t.to(device)).expand(shape)


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


def check_distribution(name: str, w: torch.Tensor) -> torch.Tensor:
    """Rows of w (already zero at masked keys) must be non-negative and sum to one (within SUM_ATOL); unlike
    :meth:`Rows.of`, a row of zeros is refused too (the bounds need every row to be a distribution)."""
    check_rows_sum_to_one(name, w, atol=SUM_ATOL)
    if (w.sum(-1) < 0.5).any():
        raise ValueError(f"every row of {name} must sum to one over its visible keys; a row sums to 0")
    return w


@dataclass(frozen=True)
class Rows:
    """Validated attention rows: ``weights`` (..., R, L) and, when given, ``x`` (..., L, d) with the same
    leading dims (broadcast views), in one float dtype; ``visible`` (..., R, L) boolean (a view; all True
    without a mask). With ``sums_to_one`` the weights' rows are non-negative and sum to one (Eq. (3)).
    :meth:`per_head` flattens the leading dims into one and scales each head's x; then ``batch`` is the
    leading shape and ``scale`` the heads' divisors, which :meth:`restore` undoes."""

    weights: torch.Tensor
    visible: torch.Tensor
    x: torch.Tensor | None = None
    masked: bool = False  # whether a mask was given (otherwise every key is visible)
    batch: torch.Size | None = None  # after per_head(): the leading shape of the rows
    scale: torch.Tensor | None = None  # after per_head(): (B,), the power of two each head's x was divided by

    @classmethod
    def of(cls, weights, x=None, mask=None, *, dtype: torch.dtype | None = torch.float64, sums_to_one: bool = True,
           name: str = "weights", x_name: str = "x", row_axis: bool = True, lead: tuple[str, ...] | None = None,
           square: bool = False, finite: bool = True, nonempty: bool = False, values: bool = True) -> Rows:
        """Validate (weights, x, mask) once; ``ValueError`` names the parameter and the allowed shape.

        ``dtype=None`` keeps the promoted dtype of weights and x (Python numbers, lists and integer data become
        float64). ``name`` and ``x_name`` are the parameters' names in the messages (e.g. "logits"). Without
        ``row_axis`` the weights may be a single row (L,). ``lead`` names leading dims that the weights (and x)
        must have exactly, without broadcasting (e.g. ("layers", "heads") for one model's attention); ``square``:
        R = L, every key is also a query (a whole attention matrix). ``finite``: the weights are finite (with
        False only NaN is refused: logits may be infinite at masked keys, which their user checks). ``nonempty``:
        every row sees a key of the mask. ``values=False`` checks the shapes and dtypes only: no copy, no
        conversion of a tensor and no pass over the values (for inputs too large to convert at once, validated
        block by block later). A :class:`Rows` is returned as it is (then ``x`` and ``mask`` must not be given
        again)."""
        if isinstance(weights, Rows):
            if x is not None or mask is not None:
                raise ValueError("x and mask belong to the Rows already; do not pass them again")
            return weights
        w = float_tensor(name, weights)
        rows_keys = ("L", "L") if square else ("R", "L") if row_axis else ("L",)
        layout = f"({', '.join(lead or ('...',))}, {', '.join(rows_keys)})"
        if (w.ndim < len(rows_keys) or (lead is not None and w.ndim != len(lead) + 2)
                or (square and w.shape[-1] != w.shape[-2])):
            raise ValueError(f"{name} must be a float tensor of shape {layout} with at least one key, "
                             f"got shape {tuple(w.shape)}")
        check_keys(name, w)
        xs = None
        if x is not None:
            xs = float_tensor(x_name, x)
            if lead is not None and xs.shape[:-1] != w.shape[:-1]:
                raise ValueError(f"{x_name} must be a float tensor of shape ({', '.join(lead)}, L, d) = "
                                 f"{tuple(w.shape[:-1])} + (d,), like {name}, got shape {tuple(xs.shape)}")
            if xs.ndim < 2 or xs.shape[-2] != w.shape[-1]:
                raise ValueError(f"{x_name} must be a float tensor of shape (..., L, d) with L = {w.shape[-1]} keys "
                                 f"(the last axis of {name}), got shape {tuple(xs.shape)}")
            if values and not torch.isfinite(xs).all():
                raise ValueError(f"{x_name} must contain only finite numbers (found NaN or inf)")
            try:
                batch = torch.broadcast_shapes(xs.shape[:-2], w.shape[:-2])
            except RuntimeError:
                raise ValueError(f"the leading dims of {x_name} {tuple(xs.shape[:-2])} and {name} "
                                 f"{tuple(w.shape[:-2])} do not broadcast") from None
            if values:
                common = dtype or torch.promote_types(w.dtype, xs.dtype)
                w, xs = w.to(common), xs.to(common)
            w, xs = w.expand(*batch, *w.shape[-2:]), xs.expand(*batch, *xs.shape[-2:])
        elif values and dtype is not None:
            w = w.to(dtype)
        if values and sums_to_one:
            check_rows_sum_to_one(name, w, atol=SUM_ATOL)
        elif values and finite:
            if not torch.isfinite(w).all():
                raise ValueError(f"{name} must contain only finite numbers (found NaN or inf)")
        elif values:
            check_finite(name, w)
        visible = (torch.ones((), dtype=torch.bool, device=w.device).expand(w.shape) if mask is None
                   else bool_view("mask", mask, w.shape, device=w.device, of=name))
        if nonempty and mask is not None:
            check_visible_rows("mask", visible)
        return cls(w, visible, xs, mask is not None)

    def lengths(self) -> torch.Tensor:
        """L_r: the number of visible keys of each row, shape (..., R)."""
        return self.visible.sum(-1)

    def per_head(self) -> Rows:
        """The same rows with the leading dims flattened into one, weights (B, R, L) and x (B, L, d), each head's x
        divided by its power of two c (:func:`unit_scale`): ``batch`` keeps the leading shape, ``scale`` c (B,)."""
        batch = self.weights.shape[:-2]
        B = math.prod(batch)
        w = self.weights.reshape(B, *self.weights.shape[-2:])
        xs, scale = unit_scale(self.x.reshape(B, *self.x.shape[-2:]))
        return Rows(w, self.visible.reshape(w.shape), xs, self.masked, batch, scale)

    def restore(self, t: torch.Tensor) -> torch.Tensor:
        """A result (B, ...) of the scaled x of :meth:`per_head`, homogeneous of degree 1 in x, in x's units and
        the leading shape of the rows."""
        t = t * self.scale.reshape(-1, *(1,) * (t.ndim - 1))
        return t.reshape(*self.batch, *t.shape[1:])

    def distribution(self, heads: slice, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights of heads ``heads`` and rows ``rows`` of :meth:`per_head` rows, zero at masked keys and
        checked to be distributions (:func:`check_distribution`), and their visibility."""
        w, vis = self.weights[heads, rows], self.visible[heads, rows]
        return check_distribution("weights", torch.where(vis, w, 0.0)), vis
