"""Theorem 2: the bounds on the separability fraction N_s / N of Definition (10), and a counterexample to its
upper bound.

Statuses and layouts as in :mod:`attn_utils.mathematics.theory`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from attn_utils.mathematics import kernels
from attn_utils.mathematics.rows import Rows, bool_view, check_distribution, float_tensor
from attn_utils.mathematics.theory.lemma1 import Bounds
from attn_utils.mathematics.validation import check_finite, check_positive

__all__ = ["Theorem2Instance", "theorem2_bounds", "theorem2_upper_counterexample", "theorem2_xi"]


class Theorem2Instance(NamedTuple):
    """One row of weights (1, L), embeddings x (L, d) on the sphere of radius M, the top-N size N, and
    delta = the minimum pairwise distance of x (so Assumptions 1-2 hold with equality)."""

    weights: torch.Tensor
    x: torch.Tensor
    N: int
    M: float
    delta: float


def _per_row(name: str, value, w: torch.Tensor) -> torch.Tensor:
    """A number or a tensor broadcastable to the rows w.shape[:-1], as a (..., 1) tensor of w's dtype."""
    v = float_tensor(name, value).to(device=w.device, dtype=w.dtype)
    check_finite(name, v)
    if torch.isinf(v).any():
        raise ValueError(f"{name} must be finite")
    try:
        return v.expand(w.shape[:-1]).unsqueeze(-1)
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(v.shape)} does not broadcast to the rows {tuple(w.shape[:-1])}"
        ) from None


def _theorem2_inputs(weights, selected, M, delta):
    M = check_positive("M", M)
    w = Rows.of(weights, dtype=None, sums_to_one=False, row_axis=False).weights
    sel = bool_view("selected", selected, w.shape)
    if (sel.sum(-1) < 1).any():
        raise ValueError("selected must contain at least one key (N >= 1) in every row")
    if isinstance(delta, bool):
        raise ValueError(f"delta must be a number or tensor in [0, 2M], got {delta!r}")
    delta = _per_row("delta", delta, w)
    if ((delta < 0) | (delta > 2 * M)).any():
        raise ValueError(f"delta must lie in [0, 2M] = [0, {2 * M}] (a pairwise distance on the sphere)")
    return check_distribution("weights", w), sel, M, delta


def theorem2_xi(weights, selected, M: float, delta: float) -> torch.Tensor:
    """xi_i of Theorem 2 for every selected key i (0 at unselected keys), shape like ``weights``.

    Reconstruction (ours) of a formula lost in the source (book/sources.md, Theorem 2):

        xi_i^2 = M^2 sum_{j in I \\ i} alpha_j^2 + (M^2 - delta^2 / 2) sum_{j != k in I \\ i} alpha_j alpha_k
               = M^2 S_1^2 - (delta^2 / 2) (S_1^2 - S_2),

    with S_1, S_2 the sum and the sum of squares of the selected weights other than alpha_i.
    Deterministic fact (ours): if the selected x_j lie on the sphere of radius M and are pairwise at
    distance >= delta (Assumptions 1-2, only the geometry is used), then
    X_i := ||s - alpha_i x_i|| = ||sum_{j in I \\ i} alpha_j x_j|| <= xi_i, because
    <x_j, x_k> = M^2 - ||x_j - x_k||^2 / 2 <= M^2 - delta^2 / 2 and alpha_j alpha_k >= 0.
    ``selected`` is bool like ``weights`` with at least one key per row; 0 <= delta <= 2M, a number
    or a tensor broadcastable to the rows (...,), e.g. one delta per head.
    """
    w, sel, M, delta = _theorem2_inputs(weights, selected, M, delta)
    return kernels.xi_values(w, sel, M, delta)


def theorem2_bounds(weights, selected, r, M: float, delta: float) -> Bounds:
    """Theorem 2's lower and upper bounds on the separability fraction N_s / N, per row (...,).

    Reconstruction (ours) of Eq. (11) (book/sources.md, Theorem 2), with xi_i from ``theorem2_xi`` and
    N_s = #{i in I : ||alpha_i x_i - s|| < r}, r = min_{j not in I} ||s - alpha_j x_j|| (the caller's r;
    the count is strict, as in ``metrics.separability``, because the nearest unselected point lies on
    the boundary of the closed ball):

        lower = 1 - (1 / (N r)) sum_{i in I} xi_i,
        upper = (1 / N) sum_{i in I} exp(-(xi_i - r)_+^2 / (2 M^2)).

    Status. The **lower bound is proven**, deterministically for every row (so also for E[N_s] / N):
    1{X_i >= r} <= X_i / r <= xi_i / r, hence N_s / N = 1 - (1/N) sum_i 1{X_i >= r} >= lower (the same
    holds for the non-strict count, since 1{X_i > r} <= 1{X_i >= r}). It holds for
    any r > 0 and any non-negative weights; only the sphere and the separation delta are used. The
    **upper bound is heuristic and false in general**: its Hoeffding step treats xi_i as if it were the
    mean of X_i, but xi_i is only an upper bound on X_i, and rows with X_i < r < xi_i for every i
    have N_s / N = 1 > upper. ``theorem2_upper_counterexample`` gives such a row, and it also happens
    on i.i.d. uniform sphere embeddings (see the tests). A single row does not refute a statement about
    the average E[N_s] / N over uniform embeddings (in our Monte-Carlo runs the averages stayed below
    the averaged upper value), but nothing proves that either, and Algorithm 4 compares the bound
    with measured rows, where it fails.

    r, and delta (see ``theorem2_xi``), are numbers or tensors broadcastable to the rows (...,); r > 0.
    """
    w, sel, M, delta = _theorem2_inputs(weights, selected, M, delta)
    r = _per_row("r", r, w)
    if (r <= 0).any():
        raise ValueError("r must be finite and > 0 (the radius of the selective ball)")
    L = w.shape[-1]
    w2, sel2, r2, delta2 = w.reshape(-1, L), sel.reshape(-1, L), r.reshape(-1, 1), delta.reshape(-1, 1)

    n_max = int(sel2.sum(-1).max()) if sel2.numel() else 0

    def chunk(_: slice, sl: slice):
        idx, s = kernels.compact(sel2[sl], n_max)  # the selected weights only: (rows, n_max)
        return kernels.theorem2_selected(w2[sl].gather(-1, idx).masked_fill_(~s, 0), s, r2[sl], M, delta2[sl])

    lower, upper = kernels.chunked(1, w2.shape[0], 3 * L + 8 * n_max, chunk)
    return Bounds(lower.reshape(w.shape[:-1]), upper.reshape(w.shape[:-1]))


def theorem2_upper_counterexample() -> Theorem2Instance:
    """A row where the measured N_s / N = 1 exceeds Theorem 2's "upper bound" (about 0.69).

    Construction (ours), M = 1, d = 3, L = 33, N = 32. The selected keys are
    x_i = (c, sqrt(1 - c^2) cos(2 pi i / N), sqrt(1 - c^2) sin(2 pi i / N)) with c = 0.05: a ring whose
    in-plane parts cancel, so s = N w c e_1 is short and every X_i = w sqrt(c^2 (N - 1)^2 + 1 - c^2)
    is small. The one unselected key is -e_1 with weight 0.9 w (w = the common selected weight), so
    r = N w c + 0.9 w > X_i and all N selected keys count: N_s / N = 1. Meanwhile xi_i only knows that
    pairwise inner products are <= 1 - delta^2 / 2, with delta = 2 sqrt(1 - c^2) sin(pi / N) the
    ring's spacing (the minimum pairwise distance), so xi_i ~ 0.93 >> r ~ 0.076 and every term of the
    upper bound is exp(-(xi_i - r)^2 / 2) ~ 0.69.
    """
    N, c = 32, 0.05
    angle = 2 * math.pi * torch.arange(N, dtype=torch.float64) / N
    ring = torch.stack([torch.full((N,), c, dtype=torch.float64), math.sqrt(1 - c * c) * angle.cos(),
                        math.sqrt(1 - c * c) * angle.sin()], dim=-1)
    x = torch.cat([ring, torch.tensor([[-1.0, 0.0, 0.0]], dtype=torch.float64)])
    weights = torch.cat([torch.ones(N, dtype=torch.float64), torch.tensor([0.9], dtype=torch.float64)])
    weights = (weights / weights.sum()).unsqueeze(0)
    delta = float(torch.pdist(x).min())
    return Theorem2Instance(weights, x, N, 1.0, delta)
