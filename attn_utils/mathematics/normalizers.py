"""Attention normalizers: softmax with temperature, the general rule of Eq. (3), and its remedies.

Every function maps logits ``l`` (any leading batch dims, keys on the last axis) to weights of the same
shape and dtype. A ``mask`` is a boolean tensor broadcastable to the logits, ``True`` = key visible.
Masked keys get weight exactly 0, a row without visible keys gets all zeros, and logits may be
``±inf`` only at masked positions. Gradients flow through autograd; masked logits get gradient 0.

The paper (arXiv 2508.17821) writes softmax with temperature as Eq. (2),
``alpha_i = exp(l_i / T) / sum_j exp(l_j / T)``, and the general normalization framework as Eq. (3),
``alpha_i = F(l_i, theta) / sum_j F(l_j, theta)`` for a positive function ``F``. The remedies of its
Sec. 4 (sparsemax and 1.5-entmax, scalable softmax, self-adjust softmax) and softmax-1 are here too.

What the book knows about each of them beyond the function (label, kind of rows, envelope, Jacobian) is in
its record in :mod:`attn_utils.mathematics.registry`, which also dispatches by name (``registry.normalize``).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from entmax import entmax15 as _entmax15
from entmax import sparsemax as _sparsemax

from attn_utils.mathematics.rows import Rows
from attn_utils.mathematics.validation import as_tensor, check_int, check_positive

__all__ = [
    "causal_mask",
    "entmax15",
    "general",
    "self_adjust",
    "self_adjust_normalized",
    "softmax",
    "softmax1",
    "sparsemax",
    "ssmax",
]


def causal_mask(L: int, device=None) -> torch.Tensor:
    """The (L, L) boolean causal mask: row t sees keys 0..t (lower triangle, diagonal included)."""
    L = check_int("L", L, low=1)
    return torch.ones(L, L, dtype=torch.bool, device=device).tril()


# --- shared steps --------------------------------------------------------------------------------


def _prepare(logits, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """The float logits (integer data and lists in torch's default dtype, floats as they are) and the visibility of
    every entry, validated by :meth:`Rows.of`: at least one key on the last axis, no NaN, a boolean mask that
    broadcasts to the logits, and infinite logits only at masked keys."""
    logits = as_tensor("logits", logits)
    if not logits.is_floating_point():
        logits = logits.to(torch.get_default_dtype())
    rows = Rows.of(logits, mask=mask, name="logits", dtype=None, sums_to_one=False, row_axis=False, finite=False)
    if (torch.isinf(rows.weights) & rows.visible).any():
        raise ValueError("logits may be infinite only at masked positions; a visible logit is ±inf")
    return rows.weights, rows.visible


def _check_overflow(z: torch.Tensor, what: str) -> torch.Tensor:
    if not torch.isfinite(z).all():
        raise ValueError(f"{what} overflows {z.dtype}; use a larger T (or s smaller) or float64 logits")
    return z


def _tempered(logits: torch.Tensor, visible: torch.Tensor, T: float) -> torch.Tensor:
    """z = l / T at visible entries and 0 at masked ones (so masked infinities never enter arithmetic)."""
    T = check_positive("T", T)
    return _check_overflow(torch.where(visible, logits, 0) / T, "logits / T")


def _row_max(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Max over the visible entries of each row (0 for a row without any), detached: it is only a shift."""
    m = torch.where(visible, z, -torch.inf).amax(-1, keepdim=True)
    return torch.where(m > -torch.inf, m, 0).detach()


def _masked_softmax(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """softmax over the visible entries; exp only sees numbers <= 0 (max subtracted) or -inf (masked)."""
    e = torch.exp(torch.where(visible, z - _row_max(z, visible), -torch.inf))
    total = e.sum(-1, keepdim=True)  # >= 1 when the row sees a key, 0 otherwise
    return e / torch.where(total > 0, total, 1)


# --- the normalizers ------------------------------------------------------------------------------


def softmax(logits, *, mask=None, T: float = 1.0) -> torch.Tensor:
    """Softmax with temperature, Eq. (2): alpha_i = exp(l_i / T) / sum_j exp(l_j / T), T > 0.

    Stable for tiny T and large logits: the row max over visible keys is subtracted before exp.
    """
    logits, visible = _prepare(logits, mask)
    return _masked_softmax(_tempered(logits, visible, T), visible)


def general(logits, *, F: Callable, theta=None, mask=None) -> torch.Tensor:
    """The general normalization framework, Eq. (3): alpha_i = F(l_i, theta) / sum_j F(l_j, theta).

    ``F`` acts elementwise on a tensor of logits and must return positive, finite values; it is called
    as ``F(l, theta)``, or as ``F(l)`` when ``theta`` is None. Softmax with temperature is the case
    ``F(l, T) = exp(l / T)``. Masked logits are replaced by 0 before ``F`` sees them and their values
    are ignored. The values are divided by their row max before summing, so large F cannot overflow.
    """
    if not callable(F):
        raise ValueError(f"F must be a callable F(l, theta) returning positive values, got {F!r}")
    logits, visible = _prepare(logits, mask)
    x = torch.where(visible, logits, 0)
    values = as_tensor("F(l, theta)", F(x) if theta is None else F(x, theta))
    if values.shape != logits.shape:
        raise ValueError(f"F must act elementwise: it returned shape {tuple(values.shape)} for {tuple(logits.shape)}")
    bad = visible & ~(torch.isfinite(values) & (values > 0))
    if bad.any():
        raise ValueError(f"F must be positive and finite at visible logits; got {values[bad].flatten()[0].item()!r}")
    w = torch.where(visible, values, 0)
    w_max = w.amax(-1, keepdim=True).detach()
    w = w / torch.where(w_max > 0, w_max, 1)
    total = w.sum(-1, keepdim=True)
    return w / torch.where(total > 0, total, 1)


def _sparse(fn: Callable, logits, mask, T: float) -> torch.Tensor:
    """Apply a shift-invariant entmax-family map to l / T over the visible keys only.

    ``entmax`` returns NaN or fails on rows of -inf, so masked entries get the finite value
    (row max - 3) instead. Sparsemax zeroes every z <= max(z) - 1 and 1.5-entmax every z <= max(z) - 2,
    so these entries are outside the support: exactly 0, without any effect on the threshold.
    """
    logits, visible = _prepare(logits, mask)
    z = _tempered(logits, visible, T)
    z = torch.where(visible, z - _row_max(z, visible), -3.0)
    return torch.where(visible, fn(z, dim=-1), 0)


def sparsemax(logits, *, mask=None, T: float = 1.0) -> torch.Tensor:
    """Sparsemax (Martins & Astudillo 2016) of l / T: the Euclidean projection onto the simplex.

    alpha_i = max(z_i - tau, 0) with tau chosen so that the row sums to one; exact zeros appear.
    Computed by the ``entmax`` package.
    """
    return _sparse(_sparsemax, logits, mask, T)


def entmax15(logits, *, mask=None, T: float = 1.0) -> torch.Tensor:
    """1.5-entmax (Peters et al. 2019) of l / T: alpha_i = max(z_i / 2 - tau, 0)^2, rows sum to one.

    Between softmax and sparsemax; exact zeros appear. Computed by the ``entmax`` package.
    """
    return _sparse(_entmax15, logits, mask, T)


def ssmax(logits, *, mask=None, s: float = 1.0, T: float = 1.0) -> torch.Tensor:
    """Scalable softmax (Nakanishi 2025, arXiv 2501.19399): softmax(s * log(n) * l / T).

    n is the number of keys the row sees (visible entries of the row). Because n enters theta, SSMax
    lies outside Lemma 1's assumption L not in theta. A row with n = 1 puts weight 1 on its key.
    """
    logits, visible = _prepare(logits, mask)
    z = _tempered(logits, visible, T)
    s = check_positive("s", s)
    n = visible.sum(-1, keepdim=True).clamp(min=1).to(z.dtype)
    return _masked_softmax(_check_overflow(z * (s * torch.log(n)), "s * log(n) * logits / T"), visible)


def softmax1(logits, *, mask=None, T: float = 1.0) -> torch.Tensor:
    """Softmax-1, the "off-by-one" softmax (Miller 2023): alpha_i = exp(z_i) / (1 + sum_j exp(z_j)), z = l / T.

    Rows do NOT sum to one: the sum is S / (1 + S) < 1 with S = sum_j exp(z_j), so a head may attend
    to nothing. The 1 is an implicit extra logit 0, shifted like the others by m = max(0, max_j z_j):
    alpha_i = exp(z_i - m) / (exp(-m) + sum_j exp(z_j - m)), so nothing overflows.
    """
    logits, visible = _prepare(logits, mask)
    z = _tempered(logits, visible, T)
    m = _row_max(z, visible).clamp(min=0)
    e = torch.exp(torch.where(visible, z - m, -torch.inf))
    return e / (torch.exp(-m) + e.sum(-1, keepdim=True))


def self_adjust(logits, *, mask=None, T: float = 1.0) -> torch.Tensor:
    """Self-adjust softmax (SA-Softmax; Zheng et al. 2025, arXiv 2502.18277): z * softmax(z), z = l / T.

    NOT a distribution: rows do not sum to one, and weights are negative wherever z_i < 0 (their
    magnitude is unbounded in z). Masked entries are 0.
    """
    logits, visible = _prepare(logits, mask)
    z = _tempered(logits, visible, T)
    return z * _masked_softmax(z, visible)


def self_adjust_normalized(logits, *, mask=None, T: float = 1.0) -> torch.Tensor:
    """Normalized SA-Softmax (Zheng et al. 2025, arXiv 2502.18277), z = l / T:

        alpha_i = (z_i - min(z_min, 0)) / (max(z_max, 0) - min(z_min, 0)) * softmax(z)_i,

    the form stated in the paper's abstract, with z_min and z_max taken over the visible keys of the
    row (our reading for masked rows). The factor lies in [0, 1], so 0 <= alpha_i <= softmax(z)_i; rows
    do NOT sum to one. The denominator vanishes only when every visible z_i is 0; then the numerator
    vanishes too and we return 0.
    """
    logits, visible = _prepare(logits, mask)
    z = _tempered(logits, visible, T)
    low = torch.where(visible, z, torch.inf).amin(-1, keepdim=True).clamp(max=0)
    high = torch.where(visible, z, -torch.inf).amax(-1, keepdim=True).clamp(min=0)
    span = high - low
    return (z - low) / torch.where(span > 0, span, 1) * _masked_softmax(z, visible)
