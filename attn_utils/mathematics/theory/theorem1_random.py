"""Theorem 1 for a uniformly random N-set (the main sum E and its Jensen residual) and Corollary 2 (its limits).

Statuses and layouts as in :mod:`attn_utils.mathematics.theory`.
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from attn_utils.mathematics import kernels
from attn_utils.mathematics.rows import Rows, check_distribution, float_tensor
from attn_utils.mathematics.validation import check_finite, check_int, check_same_shape

__all__ = ["MAX_EXACT_L", "Corollary2Bounds", "corollary2_bounds", "corollary2_small_n_limit", "jensen_residual",
           "theorem1_random_expectation_exact", "theorem1_random_main_sum"]


#: Largest row length that ``theorem1_random_expectation_exact`` enumerates (C(16, 8) = 12870 subsets).
MAX_EXACT_L = 16


class Corollary2Bounds(NamedTuple):
    """Per-row certificates for the two limits of Corollary 2 (see ``corollary2_bounds``)."""

    small_n_gap: torch.Tensor
    large_n_cap: torch.Tensor


def _mean_vector_terms(w: torch.Tensor, x: torch.Tensor):
    """For rows w (b, r, L) and keys x (b, L, d): the attention output m = sum_i w_i x_i (b, r, d),
    the inner products <m, x_i> (b, r, L), the squared key norms |x_i|^2 (b, 1, L) and |m|^2 (b, r)."""
    m = w @ x
    return m, m @ x.transpose(-1, -2), (x * x).sum(-1).unsqueeze(-2), (m * m).sum(-1)


def _random_setting_terms(rows: Rows, N: int, bs: slice, rs: slice):
    """Per-row pieces of the random-setting formulas for a block of rows, with N_r = min(N, L_r)."""
    w, vis = rows.distribution(bs, rs)
    m, xm, sq, mm = _mean_vector_terms(w, rows.x[bs])
    L_r = vis.sum(-1).to(w.dtype)
    n_r = L_r.clamp(max=N)
    c = torch.where(L_r > N, N / (L_r - 1).clamp_min(1), 0.0)
    return w, vis, m, xm, sq, mm, L_r, n_r, c


def theorem1_random_main_sum(weights, x, N: int, mask=None) -> torch.Tensor:
    """Main sum E of Theorem 1 for a uniformly random N-subset I of the visible keys, shape (..., R).

    Reconstruction (ours) of the random part of Theorem 1 (book/sources.md, Theorem 1 (2); the paper's
    prose, "each token is excluded with probability (L - N)/L" and the j != i of its display):

        E = ((L_r - N) / L_r) * sum_i || alpha_i x_i - (N / (L_r - 1)) sum_{j != i} alpha_j x_j ||,

    i, j over the visible keys, for the sum-of-norms reading d~(I) = sum_{i not in I} ||alpha_i x_i - s_I||,
    s_I = sum_{j in I} alpha_j x_j. Proof that E <= E_I[d~] (ours): write d~ with indicators,
    E_I[d~] = sum_i P(i not in I) E[||alpha_i x_i - s_I|| | i not in I]. Here P(i not in I) = (L_r - N)/L_r,
    and given i not in I the set I is a uniform N-subset of the other L_r - 1 keys, so
    E[s_I | i not in I] = (N / (L_r - 1)) sum_{j != i} alpha_j x_j. The norm is convex, so Jensen's
    inequality bounds each conditional expectation below by the norm of the conditional mean. Hence
    E_I[d~] = E + eps with the Jensen residual eps >= 0 (see ``jensen_residual``). The residual is 0
    at N = L_r - 1 (then s_I is determined by the single excluded key, so Jensen is an equality), but
    it need not shrink steadily on the way: in our checks it sometimes rises from N = 1 to N = 2 before
    falling, so "eps -> 0 as N -> L" holds only in this endpoint sense. Uniform weights are not
    needed, nor normalised ones; only the uniform law of I. For the norm-of-sum reading E is not a
    lower bound in general.

    Computed through the identity sum_{j != i} alpha_j x_j = m - alpha_i x_i with m = sum_j alpha_j x_j:
    each term is ||(1 + c) alpha_i x_i - c m||, c = N / (L_r - 1). Requires 1 <= N <= L - 1 for the L
    key columns. Rows with L_r <= N (short causal rows) select all their keys (N_r = L_r), so d~ = 0
    and E = 0 there; the function returns 0 for them.
    """
    rows = Rows.of(weights, x, mask, dtype=None, sums_to_one=False, nonempty=True).per_head()
    N = check_int("N", N, low=1, high=rows.weights.shape[-1] - 1)

    def chunk(bs: slice, rs: slice) -> torch.Tensor:
        w, vis = rows.distribution(bs, rs)
        return kernels.main_sum(*kernels.main_sum_terms(w, rows.x[bs]), vis, vis.sum(-1, keepdim=True), N)

    return rows.restore(kernels.chunked(*rows.weights.shape[:2], 6 * rows.weights.shape[-1], chunk))


def theorem1_random_expectation_exact(weights_row, x, N: int) -> torch.Tensor:
    """E_I[d~] for one row, exactly, by enumerating all C(L, N) subsets I (a 0-d tensor).

    d~(I) = sum_{i not in I} ||alpha_i x_i - sum_{j in I} alpha_j x_j|| (sum-of-norms reading), I uniform
    over the N-subsets of the L keys. Differences are formed directly (no Gram matrix), so this is an
    independent reference for ``theorem1_random_main_sum``. weights_row (L,) must be a distribution,
    x (L, d), 1 <= N <= L - 1 and L <= MAX_EXACT_L.
    """
    w, x = float_tensor("weights_row", weights_row), float_tensor("x", x)
    if w.ndim != 1:
        raise ValueError(f"weights_row must be one row of shape (L,), got {tuple(w.shape)}")
    L = check_int("L", w.shape[0], low=2, high=MAX_EXACT_L)
    if x.ndim != 2 or x.shape[0] != L:
        raise ValueError(f"x must have shape (L, d) = ({L}, d), got {tuple(x.shape)}")
    N = check_int("N", N, low=1, high=L - 1)
    dtype = torch.promote_types(w.dtype, x.dtype)
    w = check_distribution("weights_row", w.to(dtype).unsqueeze(0))[0]
    ax = w.unsqueeze(-1) * check_finite("x", x.to(dtype))
    subsets = torch.tensor(list(itertools.combinations(range(L), N)), device=w.device)
    sel = torch.zeros(len(subsets), L, dtype=torch.bool, device=w.device).scatter_(1, subsets, True)
    s = sel.to(dtype) @ ax  # (K, d)
    dist = (ax.unsqueeze(0) - s.unsqueeze(1)).norm(dim=-1)  # (K, L)
    return torch.where(sel, 0.0, dist).sum(-1).mean()


def jensen_residual(expected, main_sum) -> torch.Tensor:
    """The Jensen residual eps = E_I[d~] - E >= 0 of Theorem 1's random part (elementwise).

    Reconstruction (ours): see ``theorem1_random_main_sum`` for the proof that eps >= 0, that it
    vanishes exactly at N = L - 1, and that it need not decrease monotonically in N.
    """
    expected, main_sum = float_tensor("expected", expected), float_tensor("main_sum", main_sum)
    check_same_shape("expected", expected, "main_sum", main_sum)
    check_finite("expected", expected)
    check_finite("main_sum", main_sum)
    return expected - main_sum


def corollary2_small_n_limit(weights, x, mask=None) -> torch.Tensor:
    """A_r = sum_i ||alpha_i x_i|| over the visible keys, shape (..., R): Corollary 2 (i)'s limit.

    Reconstruction (ours) of Corollary 2 (i) (book/sources.md): for fixed N and growing L, (L - N)/L -> 1
    and N/(L - 1) -> 0 in the main sum E, which suggests E -> A. ``corollary2_bounds`` makes precise
    how far this holds: |E - A| <= small_n_gap, which is O(N/L) * A plus a term of size about
    N ||m||, m = sum_i alpha_i x_i. So E -> A needs N ||m|| -> 0 as well, and fails otherwise: with
    uniform weights and x_i = e for all i, E = 0 for N = 1 at every L while A = 1.
    """
    rows = Rows.of(weights, x, mask, dtype=None, sums_to_one=False, nonempty=True).per_head()
    norms = rows.x.norm(dim=-1).unsqueeze(-1)  # (B, L, 1)

    def chunk(bs: slice, rs: slice) -> torch.Tensor:
        w, _ = rows.distribution(bs, rs)
        return (w @ norms[bs]).squeeze(-1)

    return rows.restore(kernels.chunked(*rows.weights.shape[:2], 2 * rows.weights.shape[-1], chunk))


def corollary2_bounds(weights, x, N: int, mask=None) -> Corollary2Bounds:
    """Certificates for both limits of Corollary 2 on the main sum E, per row (..., R).

    Reconstruction (ours) of Corollary 2 (book/sources.md). With A = sum_i ||alpha_i x_i||,
    m = sum_i alpha_i x_i, c = N / (L - 1) and each term of E written as ||(1 + c) alpha_i x_i - c m||:

    * (i) small N: ``small_n_gap`` = (N / L) A + ((L - N) / L) c sum_i ||m - alpha_i x_i|| bounds
      |E - A|. Proof: | ||(1 + c) a_i - c m|| - ||a_i|| | <= c ||m - a_i|| for a_i = alpha_i x_i
      (triangle inequality), then |E - A| <= |(L - N)/L - 1| A + ((L - N)/L) c sum_i ||m - a_i||.
      Since sum_i ||m - a_i|| <= A + L ||m||, the gap is at most (N / (L - 1)) (2 A + L ||m||): it
      vanishes as L -> infinity with N fixed only if N ||m|| -> 0 too.
    * (ii) N -> L: ``large_n_cap`` = ((L - N) / L) ((1 + c) A + c L ||m||) bounds E (same triangle
      inequality). It is at most (L - N)(2 A / L + ||m||): E decays at least linearly in the number
      L - N of unselected keys and equals 0 at N = L. It need not be small at N = L - 1: for x_i = e
      and uniform weights E(L - 1) = (L - 2) / L.

    Consequence: since (L - N) / (L - 1) <= 1, E <= 2 A + N ||m|| <= (N + 2) max_i ||x_i||, uniformly
    in L. So for fixed N and bounded embeddings this reconstruction of E cannot grow linearly in L, as
    the paper's Fig. 2a reports for its expectation term (the measured top-N distance d~ can).

    Rows with L_r <= N take N_r = L_r (E = 0): there the gap is A and the cap is 0.
    """
    rows = Rows.of(weights, x, mask, dtype=None, sums_to_one=False, nonempty=True).per_head()
    N = check_int("N", N, low=1, high=rows.weights.shape[-1] - 1)
    norms = rows.x.norm(dim=-1).unsqueeze(-1)

    def chunk(bs: slice, rs: slice):
        w, vis, _, xm, sq, mm, L_r, n_r, c = _random_setting_terms(rows, N, bs, rs)
        zero = w.new_zeros(())
        A = (w @ norms[bs]).squeeze(-1)
        U = torch.where(vis, kernels.sqrt0(mm.unsqueeze(-1) - 2 * w * xm + w * w * sq), zero).sum(-1)
        keep = (L_r - n_r) / L_r
        gap = n_r / L_r * A + keep * c * U
        cap = keep * ((1 + c) * A + c * L_r * mm.sqrt())
        return gap, cap

    gap, cap = kernels.chunked(*rows.weights.shape[:2], 6 * rows.weights.shape[-1], chunk)
    return Corollary2Bounds(rows.restore(gap), rows.restore(cap))
