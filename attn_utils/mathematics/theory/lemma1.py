"""Lemma 1 (weights of a bounded row vanish like 1/L) and Corollary 1 (its softmax form), with their proofs.

Statuses and layouts as in :mod:`attn_utils.mathematics.theory`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from scipy.optimize import minimize_scalar

from attn_utils.mathematics.rows import bool_view, float_tensor
from attn_utils.mathematics.validation import (
    call_elementwise,
    check_finite,
    check_int,
    check_keys,
    check_positive,
    check_visible_rows,
)

__all__ = ["Bounds", "Lemma1Constants", "corollary1_bounds", "lemma1_bounds", "lemma1_constants"]


class Bounds(NamedTuple):
    """A lower and an upper bound (floats, or tensors of one value per row)."""

    lower: torch.Tensor | float
    upper: torch.Tensor | float


class Lemma1Constants(NamedTuple):
    """C1 = m_F / M_F and C2 = M_F / m_F of Lemma 1, with the extrema m_F, M_F of F on [-a, a]."""

    C1: float
    C2: float
    m_F: float
    M_F: float


def lemma1_constants(F: Callable, a: float, theta=None) -> Lemma1Constants:
    """Constants C1 = m_F / M_F and C2 = M_F / m_F of Lemma 1.

    Paper's statement (recovered; book/sources.md, Lemma 1): for alpha_i = F(l_i) / sum_j F(l_j) with a
    positive continuous F that does not depend on L, and logits in [-a, a],
    C1 / L <= alpha_i <= C2 / L. Proof: F attains m_F = min F > 0 and M_F = max F on the compact
    interval, so each of the L terms of the denominator lies in [m_F, M_F].

    F is called as F(l, theta), or F(l) when theta is None, on float64 tensors. The extrema are found
    numerically: F is evaluated on 4097 equispaced points of [-a, a] (endpoints included), and the best
    grid point is refined by a bounded scalar search between its grid neighbours. This is exact when F
    is monotone (the extrema are endpoints) and accurate to ~1e-12 when F is unimodal between grid
    neighbours near its extrema; an F that oscillates faster than the grid spacing a / 2048 is outside
    its reach.
    """
    a = check_positive("a", a)
    grid = torch.linspace(-a, a, 4097, dtype=torch.float64)
    values = call_elementwise(F, grid, theta, "F")
    if (values <= 0).any():
        raise ValueError("F must be positive on [-a, a] (Lemma 1 assumes a positive normalizer)")

    def scalar(t: float, sign: float) -> float:
        l = torch.tensor(t, dtype=torch.float64)
        return sign * float(F(l) if theta is None else F(l, theta))

    def extremum(k: int, sign: float) -> float:
        lo, hi = float(grid[max(k - 1, 0)]), float(grid[min(k + 1, len(grid) - 1)])
        res = minimize_scalar(scalar, bounds=(lo, hi), args=(sign,), method="bounded", options={"xatol": 1e-13})
        return min(sign * float(values[k]), float(res.fun)) * sign

    m_F = extremum(int(values.argmin()), 1.0)
    M_F = extremum(int(values.argmax()), -1.0)
    if not m_F > 0:
        raise ValueError("F must be positive on [-a, a] (Lemma 1 assumes a positive normalizer)")
    return Lemma1Constants(m_F / M_F, M_F / m_F, m_F, M_F)


def lemma1_bounds(F: Callable, a: float, L: int, theta=None) -> Bounds:
    """Lemma 1's bounds (C1 / L, C2 / L) on every weight alpha_i of a row of length L (floats).

    Paper's statement (recovered; book/sources.md, Lemma 1); see ``lemma1_constants`` for the proof.
    """
    L = check_int("L", L, low=1)
    C = lemma1_constants(F, a, theta)
    return Bounds(C.C1 / L, C.C2 / L)


def corollary1_bounds(q, k, T: float, mask=None) -> Bounds:
    """Corollary 1 (softmax): e^{-2 Delta/T} / L_r <= alpha_{r,j} <= e^{2 Delta/T} / L_r per row r.

    Paper's statement (recovered; book/sources.md, Corollary 1), with Delta_r = ||q_r|| * max_j ||k_j|| over
    the keys row r sees (we read the paper's ||k|| as that maximum, which makes the bound strict).
    Proof: |q_r^T k_j| <= Delta_r by Cauchy-Schwarz, so Lemma 1 applies with a = Delta_r and
    F = exp(l / T), whose extrema give M_F / m_F = e^{2 Delta_r / T}.

    q has shape (..., R, d), k (..., L, d), mask (..., R, L). Returns tensors (..., R). For tiny T
    the upper bound overflows to inf and the lower one underflows to 0, which stay valid.
    """
    T = check_positive("T", T)
    q, k = float_tensor("q", q), float_tensor("k", k)
    if q.ndim < 2 or k.ndim < 2 or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q (..., R, d) and k (..., L, d) must share d, got shapes {tuple(q.shape)} and {tuple(k.shape)}"
        )
    check_keys("k", k, -2)
    check_finite("q", q)
    check_finite("k", k)
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    except RuntimeError:
        raise ValueError(f"q and k have mismatched batch shapes {tuple(q.shape)} and {tuple(k.shape)}") from None
    dtype = torch.promote_types(q.dtype, k.dtype)
    qn = q.to(dtype).norm(dim=-1).expand(*batch, q.shape[-2])
    kn = k.to(dtype).norm(dim=-1).expand(*batch, k.shape[-2])
    if mask is None:
        kmax, L_r = kn.amax(-1, keepdim=True), torch.full_like(qn, k.shape[-2])
    else:
        mask = check_visible_rows("mask", bool_view("mask", mask, torch.Size((*batch, q.shape[-2], k.shape[-2]))))
        mask = mask.to(kn.device)
        kmax = torch.where(mask, kn.unsqueeze(-2), 0.0).amax(-1)
        L_r = mask.sum(-1).to(dtype)
    spread = torch.exp(2 * qn * kmax / T)
    return Bounds(1 / (spread * L_r), spread / L_r)
