"""The paper's bounds as executable, vectorised formulas, with their proofs and status.

Every result of arXiv 2508.17821 ("Limitations of Normalization in Attention Mechanism") that the
book checks is computed here. The available copies of the paper lost most display formulas (the book's page
"Sources and reconstructions", ``book/sources.md``, says statement by statement what survived), so each
docstring says where a formula comes from:

* **Paper's statement (recovered)**: the formula survived in the paper's text or a public summary of it.
* **Reconstruction (ours)**: we rebuilt the formula from the paper's prose and proof sketch; the proof
  given here is ours, and the test suite checks it numerically.
* **Corrected (ours)**: the recovered statement is false as written; we give a counterexample and a
  valid replacement.

Layout conventions (shared with ``metrics`` and ``experiments``). ``weights`` has shape (..., R, L):
the attention weights of R query rows over L keys. ``x`` has shape (..., L, d): the key-side vectors
of one head, shared by its rows; its leading dims broadcast against those of ``weights``. ``mask``
(optional, bool, broadcastable to ``weights``; True = visible key) hides keys; a row's length L_r is
its number of visible keys, and every row must see at least one key. ``selected`` (bool, same layout)
marks each row's top-N set I_N. Masked entries of ``weights`` are ignored; the visible entries of a
row must form a probability distribution. Results keep the (promoted) floating dtype of the inputs.
Large inputs, e.g. weights of shape (12, 12, 1024, 1024) with d = 64, are processed in chunks of
rows, and pairwise distances come from Gram matrices, ||a - b||^2 = |a|^2 + |b|^2 - 2<a, b>, clamped
at 0. Near-zero distances therefore carry an absolute error of about sqrt(machine eps) times the
vectors' scale; all other values are accurate to rounding. Every key-side vector result is homogeneous of
degree 1 in x, f(c x) = c f(x) for c > 0, so each head's x is divided by the power of two c at its
largest entry (exact) and the result multiplied back: |x| up to the float maximum gives finite results.
Input with zero keys (L = 0) is refused; zero rows (R = 0 or an empty batch dim) give empty results.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from attn_utils.mathematics.rows import SUM_ATOL, Rows, bool_view, float_tensor, unit_scale
from attn_utils.mathematics.validation import (
    as_tensor,
    broadcasts_to,
    check_finite,
    check_int,
    check_keys,
    check_positive,
    check_rows_sum_to_one,
    check_same_shape,
    check_visible_rows,
)

__all__ = [
    "Bounds",
    "Corollary2Bounds",
    "Corollary3Counterexample",
    "FarthestKeys",
    "Lemma1Constants",
    "Theorem2Instance",
    "TwoLogitExample",
    "corollary1_bounds",
    "corollary2_bounds",
    "corollary2_small_n_limit",
    "corollary3_bound",
    "corollary3_counterexample",
    "farthest_keys",
    "finite_difference_bound",
    "general_jacobian",
    "heads_for_coverage",
    "jensen_residual",
    "lemma1_bounds",
    "lemma1_constants",
    "lemma2_bound",
    "multihead_coverage",
    "softmax_jacobian",
    "softmax_jacobian_norm_bound",
    "theorem1_fixed_bound",
    "theorem1_random_expectation_exact",
    "theorem1_random_main_sum",
    "theorem2_bounds",
    "theorem2_upper_counterexample",
    "theorem2_xi",
    "two_logit_example",
]

#: Tolerance on "the visible weights of a row sum to one" (attention computed in float32 is accepted).
#: Rough number of tensor elements one chunk of rows may allocate per temporary.
CHUNK_ELEMENTS = 1 << 22
#: Largest row length that ``theorem1_random_expectation_exact`` enumerates (C(16, 8) = 12870 subsets).
MAX_EXACT_L = 16


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


class Corollary2Bounds(NamedTuple):
    """Per-row certificates for the two limits of Corollary 2 (see ``corollary2_bounds``)."""

    small_n_gap: torch.Tensor
    large_n_cap: torch.Tensor


class Theorem2Instance(NamedTuple):
    """One row of weights (1, L), embeddings x (L, d) on the sphere of radius M, the top-N size N, and
    delta = the minimum pairwise distance of x (so Assumptions 1-2 hold with equality)."""

    weights: torch.Tensor
    x: torch.Tensor
    N: int
    M: float
    delta: float


class Corollary3Counterexample(NamedTuple):
    """Two tied logits: the softmax Jacobian, its spectral norm, and the stated and corrected bounds."""

    logits: torch.Tensor
    weights: torch.Tensor
    jacobian: torch.Tensor
    spectral_norm: float
    stated_bound: float
    corrected_bound: float


class TwoLogitExample(NamedTuple):
    """The two logit vectors of the motivating example of Sec. 2.3."""

    l1: torch.Tensor
    l2: torch.Tensor


# --- input handling --------------------------------------------------------------------------------


def _check_number(name: str, value, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _call(F: Callable, l: torch.Tensor, theta, name: str) -> torch.Tensor:
    """Evaluate F(l, theta), or F(l) when theta is None, as a tensor shaped and typed like l."""
    if not callable(F):
        raise ValueError(f"{name} must be a callable F(l, theta) (or F(l) when theta is None), got {F!r}")
    out = as_tensor(name, F(l) if theta is None else F(l, theta)).to(l.dtype)
    if out.shape != l.shape:
        out = out.expand(l.shape)
    check_finite(name, out)
    if torch.isinf(out).any():
        raise ValueError(f"{name} returned infinite values; F and its derivative must be finite")
    return out


def _check_distribution(name: str, w: torch.Tensor) -> torch.Tensor:
    """Rows of w (already zero at masked keys) must be non-negative and sum to one."""
    check_rows_sum_to_one(name, w, atol=SUM_ATOL)
    if (w.sum(-1) < 0.5).any():
        raise ValueError(f"every row of {name} must sum to one over its visible keys; a row sums to 0")
    return w


class _Rows(NamedTuple):
    weights: torch.Tensor  # (B, R, L): the batch dims broadcast and flattened (a view where possible)
    x: torch.Tensor  # (B, L, d), each head divided by its power-of-two scale (see _unit_scale)
    mask: torch.Tensor | None  # (B, R, L) bool, or None (all visible)
    batch: torch.Size  # the broadcast batch shape, to restore the results' shape
    scale: torch.Tensor  # (B,): the heads' scales c

    def restore(self, t: torch.Tensor) -> torch.Tensor:
        """A result of the scaled x (B, ...), homogeneous of degree 1 in x, in x's units and batch shape."""
        t = t * self.scale.reshape(-1, *(1,) * (t.ndim - 1))
        return t.reshape(*self.batch, *t.shape[1:])


def _prepare(weights, x, mask) -> _Rows:
    """Validate (weights, x, mask) once (:meth:`Rows.of`, one promoted float dtype), flatten the batch dims and
    scale x per head (see :func:`unit_scale`); every row must see a key."""
    rows = Rows.of(weights, x, mask, dtype=None, sums_to_one=False)
    batch = rows.weights.shape[:-2]
    B = math.prod(batch)
    w, xs = rows.weights.reshape(B, *rows.weights.shape[-2:]), rows.x.reshape(B, *rows.x.shape[-2:])
    mask = check_visible_rows("mask", rows.visible).reshape(w.shape) if rows.masked else None
    xs, scale = unit_scale(xs)
    return _Rows(w, xs, mask, batch, scale)


def _visible_rows(rows: _Rows, bs: slice, rs: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated weights of heads bs, rows rs (zero at masked keys), and their visibility."""
    w = rows.weights[bs, rs]
    vis = torch.ones_like(w, dtype=torch.bool) if rows.mask is None else rows.mask[bs, rs]
    return _check_distribution("weights", torch.where(vis, w, 0.0)), vis


def _chunked(n_heads: int, n_rows: int, row_cost: int, fn: Callable[[slice, slice], object]):
    """Apply fn(heads, rows) to blocks of about CHUNK_ELEMENTS // row_cost (head, row) pairs and
    assemble its (heads, rows) results (a tensor or a tuple of tensors). Blocks span whole rows of a
    head first, so each head's key vectors are read as few times as possible."""
    rows_step = max(1, min(n_rows, CHUNK_ELEMENTS // max(1, row_cost)))
    heads_step = max(1, CHUNK_ELEMENTS // max(1, row_cost * rows_step))

    def heads_block(bs: slice):
        parts = [fn(bs, slice(a, a + rows_step)) for a in range(0, max(n_rows, 1), rows_step)]
        return tuple(torch.cat(p, -1) for p in zip(*parts)) if isinstance(parts[0], tuple) else torch.cat(parts, -1)

    blocks = [heads_block(slice(b, b + heads_step)) for b in range(0, max(n_heads, 1), heads_step)]
    if isinstance(blocks[0], tuple):
        return tuple(torch.cat(p, 0) for p in zip(*blocks))
    return torch.cat(blocks, 0)


def _mean_vector_terms(w: torch.Tensor, x: torch.Tensor):
    """For rows w (b, r, L) and keys x (b, L, d): the attention output m = sum_i w_i x_i (b, r, d),
    the inner products <m, x_i> (b, r, L), the squared key norms |x_i|^2 (b, 1, L) and |m|^2 (b, r)."""
    m = w @ x
    return m, m @ x.transpose(-1, -2), (x * x).sum(-1).unsqueeze(-2), (m * m).sum(-1)


def _sqrt0(t: torch.Tensor) -> torch.Tensor:
    return t.clamp_min(0).sqrt()


def _sqrt_(t: torch.Tensor) -> torch.Tensor:
    """t.sqrt_(), through numpy for a contiguous CPU tensor: the same correctly rounded IEEE square roots, about
    twice as fast as torch's float64 kernel on CPU."""
    if t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad:
        a = t.numpy()
        np.sqrt(a, out=a)
        return t
    return t.sqrt_()


def _compact(sel: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The indices of the (at most n) True entries of each row of ``sel`` (..., L), in increasing order,
    as (..., n), padded with the row's first index; and which entries are real. O(L) per row."""
    slot = torch.where(sel, sel.cumsum(-1) - 1, n)  # n: a scratch slot for the False entries
    keys = torch.arange(sel.shape[-1], device=sel.device).expand(sel.shape)
    idx = torch.zeros(*sel.shape[:-1], n + 1, dtype=torch.long, device=sel.device).scatter_(-1, slot, keys)[..., :n]
    real = torch.arange(n, device=sel.device) < sel.sum(-1, keepdim=True)
    return torch.where(real, idx, idx[..., :1]), real


# --- Lemma 1 and Corollary 1 ------------------------------------------------------------------------


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
    values = _call(F, grid, theta, "F")
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


# --- Theorem 1: fixed top-N set ---------------------------------------------------------------------


class FarthestKeys(NamedTuple):
    """For each key j of each head, its farthest keys at several prefix sizes (see ``farthest_keys``).

    ``levels[a]`` is a prefix size K_a (increasing, the last one is L); ``sq_distances[a]`` and
    ``indices[a]`` have shape (B, K_a, m_a): for every key j < K_a the squared distances
    ||x_i - x_j||^2 to its m_a = min(m, K_a) farthest keys i < K_a, largest first, and their indices.
    ``batch`` is the leading shape of the x it was built from (flattened to B).
    """

    levels: tuple[int, ...]
    sq_distances: tuple[torch.Tensor, ...]
    indices: tuple[torch.Tensor, ...]
    batch: torch.Size

    def prefix(self, L: int) -> "FarthestKeys":
        """The lists of the first L keys (L must be one of the levels): the levels up to L."""
        if L not in self.levels:
            raise ValueError(f"L must be one of the levels {self.levels} (see farthest_keys' prefixes), got {L}")
        n = self.levels.index(L) + 1
        return FarthestKeys(self.levels[:n], self.sq_distances[:n], self.indices[:n], self.batch)


#: Farthest keys kept per key and prefix size by ``farthest_keys``.
FARTHEST = 32
#: Entries of those lists that ``_max_cross_sq_distance`` tries first.
FIRST = 4


def farthest_keys(x, m: int = FARTHEST, prefixes: Sequence[int] = ()) -> FarthestKeys:
    """The m farthest keys of every key within the prefixes K = m, 2m, 4m, ..., L of x (..., L, d),
    and within the extra prefix sizes ``prefixes`` (so that ``.prefix(K)`` serves the first K keys).

    ``theorem1_fixed_bound`` reads d_1 = max_{j in I, i in U} ||x_i - x_j|| off these lists: for a
    row whose visible keys lie in the prefix K_a, the farthest unselected visible key of j is the
    first valid entry of j's list at level a, whenever the list has a valid entry (the keys left out
    of the list are no farther than any key in it). Only the few (row, j) pairs whose list holds no
    valid key are computed directly. With a causal mask at least half of a level's keys are visible
    to the rows that use it, so such pairs are rare. Compute it once and pass it to every call of
    ``theorem1_fixed_bound`` on the same x (e.g. for several N); it costs O(L^2 d) per head. The lists
    are ranked on each head's x / c (c = a power of two, see ``_unit_scale``), so they stay right for any
    finite x; a squared distance beyond the float range is stored as inf.
    """
    x = float_tensor("x", x)
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., L, d), got {tuple(x.shape)}")
    check_keys("x", x, -2)
    check_finite("x", x)
    m = check_int("m", m, low=1)
    L, d = x.shape[-2:]
    flat, scale = unit_scale(x.reshape(math.prod(x.shape[:-2]), L, d))
    doubling = []
    while not doubling or doubling[-1] < L:
        doubling.append(min(L, m << len(doubling)))
    levels = sorted({*doubling, *(check_int("prefixes", K, low=1, high=L) for K in prefixes)})
    values = [[] for _ in levels]
    indices = [[] for _ in levels]
    step = max(1, CHUNK_ELEMENTS // (L * L))
    for b in range(0, max(flat.shape[0], 1), step):
        xb, cb = flat[b : b + step], scale[b : b + step, None, None]
        sq = (xb * xb).sum(-1)
        d2 = torch.baddbmm(sq.unsqueeze(-1) + sq.unsqueeze(-2), xb, xb.mT, alpha=-2).clamp_min_(0)
        for a, K in enumerate(levels):
            v, i = d2[:, :K, :K].topk(min(m, K), dim=-1)
            values[a].append(v.mul_(cb).mul_(cb))  # back to x's units: exact, or inf beyond the float range
            indices[a].append(i)
    return FarthestKeys(tuple(levels), tuple(torch.cat(v) for v in values), tuple(torch.cat(i) for i in indices),
                        x.shape[:-2])


def _farthest_for(farthest: FarthestKeys | None, rows: "_Rows") -> tuple[FarthestKeys, torch.Tensor]:
    """``farthest`` checked against (or, when None, computed from) the rows' scaled vectors, with
    B = rows' batch, and the per-head unit c (B,) of its values: dividing them by c twice gives squared
    distances of the scaled x (exact). When some head's c^2 times the largest scaled squared distance
    (16 d) overflows, or c^2 eps underflows, the given values may be inf or imprecise: then the lists are
    recomputed from the scaled x (unit 1)."""
    L = rows.x.shape[-2]
    if farthest is None:
        return farthest_keys(rows.x), torch.ones_like(rows.scale)
    if not isinstance(farthest, FarthestKeys) or farthest.levels[-1] != L:
        raise ValueError(f"farthest must be farthest_keys(x) for the same x with L = {L} keys")
    if not broadcasts_to(farthest.batch, rows.batch):
        raise ValueError(f"farthest was built for x with batch shape {tuple(farthest.batch)}, which does not "
                         f"broadcast to the weights' batch shape {tuple(rows.batch)}")

    B = math.prod(rows.batch)

    def expand(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(*farthest.batch, *t.shape[1:]).expand(*rows.batch, *t.shape[1:]).reshape(B, *t.shape[1:])

    fi, k = torch.finfo(farthest.sq_distances[0].dtype), rows.scale.log2()  # the range the lists were made in
    low = (math.log2(fi.tiny) - math.log2(fi.eps)) / 2
    high = (math.log2(fi.max) - math.log2(16 * max(1, rows.x.shape[-1]))) / 2
    if ((k < low) | (k > high)).any():
        return farthest_keys(rows.x, farthest.sq_distances[-1].shape[-1], farthest.levels), torch.ones_like(rows.scale)
    return farthest._replace(sq_distances=tuple(map(expand, farthest.sq_distances)),
                             indices=tuple(map(expand, farthest.indices)), batch=rows.batch), rows.scale


def _best_candidates(far: FarthestKeys, a: int, m: int, h, j, ok_j, u) -> tuple[torch.Tensor, torch.Tensor]:
    """From the first m entries of the level-a lists of the selected keys j (p, n) (``ok_j``: real entries) of heads h
    (p,), the unselected visible keys u (p, K) being the candidates: the largest squared distance of a candidate
    found there (p,), -inf if none, and an upper bound (p,) on the maximum of every selected key without a
    candidate among them (its m-th value: the lists are sorted, and keys left out of a list are no farther than
    any key in it), -inf if there is no such key. Both in the lists' units."""
    keys = far.indices[a][..., :m][h.unsqueeze(-1), j]  # (p, n, m): the candidates of each selected key
    values = far.sq_distances[a][..., :m][h.unsqueeze(-1), j]
    ok = u.gather(-1, keys.flatten(-2)).view(keys.shape) & ok_j.unsqueeze(-1)
    found = values.masked_fill(~ok, -torch.inf).amax((-1, -2))
    cap = values[..., -1].masked_fill(~(ok_j & ~ok.any(-1)), -torch.inf).amax(-1)
    return found, cap


def _max_cross_sq_distance(x, far: FarthestKeys, unit, heads, idx, valid, unsel) -> torch.Tensor:
    """max_{j in I, i in U} ||x_i - x_j||^2 for P rows: head index ``heads`` (P,), selected keys ``idx``
    (P, n) (``valid`` marks real entries), unselected visible keys ``unsel`` (P, L), U non-empty. The
    lists' values are divided by ``unit`` (B,) twice, to the units of x.

    The maximum is read off the first FIRST entries of the selected keys' lists where they settle it (the best
    candidate found is at least the bound on the keys that found none, see ``_best_candidates``), then off the
    whole lists; the few rows still unsettled are computed directly."""
    out = x.new_empty(len(heads))
    if unsel.shape[-1] < far.levels[-1]:  # unsel may stop at the last visible key; the lists index up to L
        unsel = torch.nn.functional.pad(unsel, (0, far.levels[-1] - unsel.shape[-1]))
    last = unsel.shape[-1] - unsel.flip(-1).to(torch.int8).argmax(-1)  # 1 + the last key in U
    level = torch.bucketize(torch.maximum(last, idx.amax(-1) + 1), torch.tensor(far.levels, device=idx.device))
    for a, K in enumerate(far.levels):
        rows = (level == a).nonzero().squeeze(-1)
        if not len(rows):
            continue
        for m in sorted({min(FIRST, far.indices[a].shape[-1]), far.indices[a].shape[-1]}):
            h, j, ok_j, u = heads[rows], idx[rows], valid[rows], unsel[rows, :K]
            found, cap = _best_candidates(far, a, m, h, j, ok_j, u)
            settled = found >= cap
            out[rows[settled]] = found[settled] / unit[h[settled]] / unit[h[settled]]
            rows = rows[~settled]
            if not len(rows):
                break
        h, j, ok_j = heads[rows], idx[rows], valid[rows]
        step = max(1, CHUNK_ELEMENTS // (K * (j.shape[-1] + x.shape[-1])))
        for c in range(0, len(rows), step):  # rows whose lists do not settle the maximum
            p = slice(c, c + step)
            xk = x[h[p], :K]  # (q, K, d)
            xj = xk.gather(1, j[p].unsqueeze(-1).expand(-1, -1, xk.shape[-1]))  # (q, n, d)
            sq = (xk * xk).sum(-1)
            d2 = torch.baddbmm(sq.gather(1, j[p]).unsqueeze(-1) + sq.unsqueeze(-2), xj, xk.mT, alpha=-2)
            d2.masked_fill_(~(unsel[rows[p], :K].unsqueeze(-2) & ok_j[p].unsqueeze(-1)), -torch.inf)
            out[rows[p]] = d2.amax((-1, -2)).clamp_min(0)
    return out


def theorem1_fixed_bound(weights, x, selected, mask=None, *, farthest: FarthestKeys | None = None) -> torch.Tensor:
    """Theorem 1 (fixed top-N set): an upper bound on the distance d~ of every row, shape (..., R).

    Reconstruction (ours) of a formula whose second term is truncated in the source (book/sources.md,
    Theorem 1 (1); the first term (1 - abar) d_1 is recovered). With abar = sum_{j in I} alpha_j over
    the selected set I (N keys of the L_r visible ones), U = the visible unselected keys,
    s = sum_{j in I} alpha_j x_j and d_1 = max_{i in U, j in I} ||x_i - x_j||:

        d~ := sum_{i in U} ||alpha_i x_i - s||
           <= (1 - abar) d_1 + max_{j in I} ||x_j|| * (abar (L_r - N) - (1 - abar)).

    Proof (ours). abar > 0 (otherwise every weight of the row would be 0), and x~ = s / abar is a
    convex combination of {x_j : j in I}. For i in U,

        alpha_i x_i - s = alpha_i (x_i - x~) - (abar - alpha_i) x~.

    By convexity of the norm, ||x_i - x~|| <= max_{j in I} ||x_i - x_j|| <= d_1 and
    ||x~|| <= max_{j in I} ||x_j||. Hence ||alpha_i x_i - s|| <= alpha_i d_1 + |abar - alpha_i| max_{j in I} ||x_j||.
    Summing over U with sum_{i in U} alpha_i = 1 - abar and, **if alpha_i <= abar for every i in U**,
    sum_{i in U} |abar - alpha_i| = abar (L_r - N) - (1 - abar), gives the bound.

    Hypotheses actually used: non-negative weights that sum to one over the visible keys, and
    abar >= alpha_i for every unselected i. The top-N property implies the latter (abar is at least
    the largest selected weight) but is not needed: any set with abar >= max_{i in U} alpha_i works.
    The condition cannot be dropped: L = 2, N = 1, alpha = (0.1, 0.9), I = {0}, x_0 = x_1 = e gives
    d~ = 0.8 against a bound of -0.8. (Without it, the proof still gives
    (1 - abar) d_1 + max_{j in I} ||x_j|| sum_{i in U} |abar - alpha_i|.)

    Both readings of d~ are covered: the norm-of-sum reading ||sum_{i in U} (alpha_i x_i - s)|| is at
    most the sum-of-norms one by the triangle inequality.

    ``selected`` must lie inside the visible keys, hold at least one key per row, and satisfy the
    hypothesis above (checked; ValueError otherwise). N may differ between rows. A row whose visible
    keys are all selected has d~ = 0 and bound 0. The factor (1 - abar) is computed as the sum of the
    unselected weights, which equals it for exactly normalised rows and keeps the bound valid for rows
    normalised only up to rounding. d_1 is read off ``farthest`` (``farthest_keys(x)``, computed here
    when not given; pass it to share the work between calls on the same x): O(N m) per row instead of
    O(N L d). The bound is homogeneous of degree 1 in x (d_1 and ||x_j|| are), so it is computed on
    x / c per head (c a power of two) and multiplied by c: finite for every finite x.
    """
    rows = _prepare(weights, x, mask)
    sel = bool_view("selected", selected, torch.Size((*rows.batch, *rows.weights.shape[-2:])))
    sel = sel.reshape(rows.weights.shape)
    if rows.mask is not None and (sel & ~rows.mask).any():
        raise ValueError("selected must lie inside the visible keys of mask")
    n_sel = sel.sum(-1)
    if (n_sel < 1).any():
        raise ValueError("selected must contain at least one key (N >= 1) in every row")
    far, unit = _farthest_for(farthest, rows)
    n_max = int(n_sel.max()) if n_sel.numel() else 0
    L = rows.x.shape[-2]
    norms = rows.x.norm(dim=-1)  # (B, L)
    zero = rows.x.new_zeros(())

    def chunk(bs: slice, rs: slice) -> torch.Tensor:
        w, vis = _visible_rows(rows, bs, rs)
        s_c = sel[bs, rs]
        unsel = vis & ~s_c
        abar = torch.where(s_c, w, zero).sum(-1)
        rest = torch.where(unsel, w, zero).sum(-1)
        if (torch.where(unsel, w, zero).amax(-1) > abar).any():
            raise ValueError(
                "selected must carry total weight >= every unselected weight in its row "
                "(true for a top-N set); Theorem 1's bound needs it"
            )
        m_sel = torch.where(s_c, norms[bs].unsqueeze(-2), zero).amax(-1)
        d1 = torch.zeros_like(abar)
        has_u = unsel.any(-1)
        if has_u.any():
            b, r = has_u.nonzero(as_tuple=True)
            idx, valid = _compact(s_c[b, r], n_max)
            heads = torch.arange(bs.start, bs.start + w.shape[0], device=w.device)[b]
            d1[b, r] = _sqrt0(_max_cross_sq_distance(rows.x, far, unit, heads, idx, valid, unsel[b, r]))
        n_unsel = unsel.sum(-1).to(w.dtype)
        return rest * d1 + m_sel * (abar * n_unsel - rest)

    return rows.restore(_chunked(*rows.weights.shape[:2], n_max * (FARTHEST + 2) + 6 * L, chunk))


# --- Theorem 1: uniformly random N-set, and Corollary 2 ----------------------------------------------


def _random_setting_terms(rows: _Rows, N: int, bs: slice, rs: slice):
    """Per-row pieces of the random-setting formulas for a block of rows, with N_r = min(N, L_r)."""
    w, vis = _visible_rows(rows, bs, rs)
    m, xm, sq, mm = _mean_vector_terms(w, rows.x[bs])
    L_r = vis.sum(-1).to(w.dtype)
    n_r = L_r.clamp(max=N)
    c = torch.where(L_r > N, N / (L_r - 1).clamp_min(1), 0.0)
    return w, vis, m, xm, sq, mm, L_r, n_r, c


def _main_sum_terms(w: torch.Tensor, x: torch.Tensor, x2: torch.Tensor | None = None):
    """The N-independent terms of ``_main_sum`` for rows w (b, r, L) (zero at masked keys) and keys x (b, L, d):
    alpha_i^2 |x_i|^2 and alpha_i <x_i, m> (b, r, L), and |m|^2 (b, r, 1), m = sum_j alpha_j x_j. ``x2``: the
    squared key norms (b, 1, L), when the caller has them."""
    m = w @ x
    if x2 is None:
        x2 = x.square().sum(-1).unsqueeze(-2)
    return w * w * x2, w * (m @ x.mT), m.square().sum(-1, keepdim=True)


def _main_sum(wsq, wxm, mm, vis, lengths, N: int, hidden: int = 0) -> torch.Tensor:
    """E of ``theorem1_random_main_sum`` per row (b, r), from the terms of ``_main_sum_terms`` (unchanged, so they
    serve several N) and the row lengths L_r (b, r, 1), without validation. With c = N / (L_r - 1):
    ||(1 + c) alpha_i x_i - c m||^2 = (1 + c)^2 alpha_i^2 |x_i|^2 - 2 c (1 + c) alpha_i <x_i, m> + c^2 |m|^2.
    ``hidden``: every key before it is visible in every row (so only the keys from there on are masked)."""
    zero = wsq.new_zeros(())
    L_r = lengths.to(wsq.dtype)
    c = torch.where(L_r > N, N / (L_r - 1).clamp_min(1), zero)
    t2 = torch.addcmul(c * c * mm, wsq, (1 + c).square()).addcmul_(wxm, c * (1 + c), value=-2.0).clamp_min_(0)
    t2[..., hidden:].masked_fill_(~vis[..., hidden:], 0)
    total = _sqrt_(t2).sum(-1, keepdim=True)
    return torch.where(L_r > N, (L_r - N) / L_r * total, zero).squeeze(-1)


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
    rows = _prepare(weights, x, mask)
    N = check_int("N", N, low=1, high=rows.weights.shape[-1] - 1)

    def chunk(bs: slice, rs: slice) -> torch.Tensor:
        w, vis = _visible_rows(rows, bs, rs)
        return _main_sum(*_main_sum_terms(w, rows.x[bs]), vis, vis.sum(-1, keepdim=True), N)

    return rows.restore(_chunked(*rows.weights.shape[:2], 6 * rows.weights.shape[-1], chunk))


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
    w = _check_distribution("weights_row", w.to(dtype).unsqueeze(0))[0]
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
    rows = _prepare(weights, x, mask)
    norms = rows.x.norm(dim=-1).unsqueeze(-1)  # (B, L, 1)

    def chunk(bs: slice, rs: slice) -> torch.Tensor:
        w, _ = _visible_rows(rows, bs, rs)
        return (w @ norms[bs]).squeeze(-1)

    return rows.restore(_chunked(*rows.weights.shape[:2], 2 * rows.weights.shape[-1], chunk))


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
    rows = _prepare(weights, x, mask)
    N = check_int("N", N, low=1, high=rows.weights.shape[-1] - 1)
    norms = rows.x.norm(dim=-1).unsqueeze(-1)

    def chunk(bs: slice, rs: slice):
        w, vis, _, xm, sq, mm, L_r, n_r, c = _random_setting_terms(rows, N, bs, rs)
        zero = w.new_zeros(())
        A = (w @ norms[bs]).squeeze(-1)
        U = torch.where(vis, _sqrt0(mm.unsqueeze(-1) - 2 * w * xm + w * w * sq), zero).sum(-1)
        keep = (L_r - n_r) / L_r
        gap = n_r / L_r * A + keep * c * U
        cap = keep * ((1 + c) * A + c * L_r * mm.sqrt())
        return gap, cap

    gap, cap = _chunked(*rows.weights.shape[:2], 6 * rows.weights.shape[-1], chunk)
    return Corollary2Bounds(rows.restore(gap), rows.restore(cap))


# --- Theorem 2 ---------------------------------------------------------------------------------------


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
    w = check_keys("weights", float_tensor("weights", weights))
    sel = bool_view("selected", selected, w.shape)
    if (sel.sum(-1) < 1).any():
        raise ValueError("selected must contain at least one key (N >= 1) in every row")
    if isinstance(delta, bool):
        raise ValueError(f"delta must be a number or tensor in [0, 2M], got {delta!r}")
    delta = _per_row("delta", delta, w)
    if ((delta < 0) | (delta > 2 * M)).any():
        raise ValueError(f"delta must lie in [0, 2M] = [0, {2 * M}] (a pairwise distance on the sphere)")
    return _check_distribution("weights", w), sel, M, delta


def _leave_one_out(v: torch.Tensor) -> torch.Tensor:
    """sum_{j != i} v_j for every i, from prefix and suffix sums: no subtraction, so a dominant v_i
    does not wipe out the precision of the small remainder."""
    pad = torch.zeros_like(v[..., :1])
    before = torch.cat([pad, v[..., :-1]], -1).cumsum(-1)
    after = torch.cat([v[..., 1:], pad], -1).flip(-1).cumsum(-1).flip(-1)
    return before + after


def _xi(w: torch.Tensor, sel: torch.Tensor, M: float, delta: torch.Tensor) -> torch.Tensor:
    zero = w.new_zeros(())
    ws = torch.where(sel, w, zero)
    s1 = _leave_one_out(ws)  # sum over I \ {i} of alpha_j
    s2 = _leave_one_out(ws * ws)  # ... of alpha_j^2
    cross = (s1 * s1 - s2).clamp_min(0)  # sum over j != k in I \ {i} of alpha_j alpha_k
    return torch.where(sel, _sqrt0(M * M * s1 * s1 - delta * delta / 2 * cross), zero)


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
    return _xi(w, sel, M, delta)


def _theorem2(ws: torch.Tensor, s: torch.Tensor, r: torch.Tensor, M: float,
              delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper) of ``theorem2_bounds`` from the selected weights ``ws`` (..., n) alone (``s``: which entries
    are real; the others are 0), r and delta (..., 1), without validation."""
    xi = _xi(ws, s, M, delta)
    n = s.sum(-1).to(ws.dtype)
    lower = 1 - xi.sum(-1) / (n * r.squeeze(-1))
    tail = (xi - r).clamp_min_(0).square_().mul_(-1 / (2 * M * M)).exp_().masked_fill_(~s, 0)
    return lower, tail.sum(-1) / n


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
        idx, s = _compact(sel2[sl], n_max)  # the selected weights only: (rows, n_max)
        return _theorem2(w2[sl].gather(-1, idx).masked_fill_(~s, 0), s, r2[sl], M, delta2[sl])

    lower, upper = _chunked(1, w2.shape[0], 3 * L + 8 * n_max, chunk)
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


# --- Lemma 2 and Corollary 3: Jacobians ----------------------------------------------------------------


def _logits(logits) -> torch.Tensor:
    l = float_tensor("logits", logits)
    if l.ndim < 1 or l.shape[-1] < 1:
        raise ValueError(f"logits must have shape (..., L) with L >= 1, got {tuple(l.shape)}")
    check_finite("logits", l)
    if torch.isinf(l).any():
        raise ValueError("logits must be finite")
    return l


def _normalizer_values(F, dF, logits, theta):
    l = _logits(logits)
    Fv, dFv = _call(F, l, theta, "F"), _call(dF, l, theta, "dF")
    if (Fv <= 0).any():
        raise ValueError("F must be positive at every logit (Eq. (3) needs a positive normalizer)")
    S = Fv.sum(-1, keepdim=True)
    return Fv, dFv, S, Fv / S


def general_jacobian(F: Callable, dF: Callable, logits, theta=None) -> torch.Tensor:
    """Jacobian d alpha_i / d l_k of Eq. (3), shape (..., L, L) (row i, column k).

    Reconstruction (ours; book/sources.md, Lemma 2): differentiating alpha_i = F_i / S, S = sum_j F_j, gives
    d alpha_i / d l_k = (F'_k / S) (delta_ik - alpha_i), i.e. J = diag(F') / S - alpha F'^T / S.
    F and dF (its derivative in l) are called as F(l, theta), or F(l) when theta is None.
    """
    _, dFv, S, alpha = _normalizer_values(F, dF, logits, theta)
    return (torch.diag_embed(dFv) - alpha.unsqueeze(-1) * dFv.unsqueeze(-2)) / S.unsqueeze(-1)


def lemma2_bound(F: Callable, dF: Callable, logits, theta=None) -> torch.Tensor:
    """Lemma 2: (max_k |F'_k| + ||alpha||_2 ||F'||_2) / (L min_j F_j) >= ||J||_2, shape (...,).

    Reconstruction (ours) of a lost display (book/sources.md, Lemma 2; the prose says both terms in the
    parentheses scale with 1 / min_j F). Proof: J = diag(F') / S - alpha F'^T / S, so by the triangle
    inequality ||J||_2 <= max_k |F'_k| / S + ||alpha||_2 ||F'||_2 / S (a diagonal matrix has norm
    max |entry|; a rank-one matrix u v^T has norm ||u|| ||v||), and S = sum_j F_j >= L min_j F_j > 0.
    """
    Fv, dFv, _, alpha = _normalizer_values(F, dF, logits, theta)
    top = dFv.abs().amax(-1) + alpha.norm(dim=-1) * dFv.norm(dim=-1)
    return top / (Fv.shape[-1] * Fv.amin(-1))


def softmax_jacobian(weights, T: float) -> torch.Tensor:
    """Jacobian of alpha = softmax(l / T) in l: (diag(alpha) - alpha alpha^T) / T, shape (..., L, L).

    Standard calculus (Eq. (3) with F = e^{l/T}, F' = F / T). ``weights`` (..., L) = softmax(l / T),
    each row a distribution.
    """
    T = check_positive("T", T)
    a = check_keys("weights", float_tensor("weights", weights))
    _check_distribution("weights", a)
    return (torch.diag_embed(a) - a.unsqueeze(-1) * a.unsqueeze(-2)) / T


def corollary3_bound(T: float) -> float:
    """min{1 / (4T), sqrt(2)}: Corollary 3 exactly as the paper states it (book/sources.md, Corollary 3).

    Paper's statement (recovered). **False as a bound on the spectral norm ||d alpha / d l||_2**: two
    tied logits give 1 / (2T) (``corollary3_counterexample``). What does hold with 1 / (4T): every
    entry, |J_ik| <= 1 / (4T) (diagonal alpha_i (1 - alpha_i) / T, off-diagonal alpha_i alpha_k / T
    with alpha_i + alpha_k <= 1). The sqrt(2) is the diameter of the probability simplex, a cap on
    ||alpha - alpha'||_2, not on the Jacobian (which grows without bound as T -> 0).
    """
    T = check_positive("T", T)
    return min(1 / (4 * T), math.sqrt(2))


def softmax_jacobian_norm_bound(T: float) -> float:
    """1 / (2T), the tight bound on ||d softmax(l / T) / d l||_2 for every l and L.

    Corrected (ours) replacement of Corollary 3. Proof: J = (diag(alpha) - alpha alpha^T) / T is
    symmetric positive semi-definite, so ||J||_2 = max_{||v|| = 1} v^T J v, and
    v^T (diag(alpha) - alpha alpha^T) v = Var_alpha(v), the variance of the values v_i under alpha. By
    Popoviciu's inequality Var_alpha(v) <= (max v - min v)^2 / 4 <= (v_a^2 + v_b^2) / 2 <= 1/2.
    Tight: alpha = (1/2, 1/2) (two tied logits, L = 2) and v = (1, -1) / sqrt(2) give 1 / (2T); with
    further, lower logits the norm tends to 1 / (2T) as T -> 0.
    """
    T = check_positive("T", T)
    return 1 / (2 * T)


def finite_difference_bound(T: float, eps: float) -> float:
    """min{1 / (2T), sqrt(2) / eps}: a valid bound on ||softmax((l + eps v)/T) - softmax(l/T)||_2 / eps.

    Corrected (ours) version of the quantity g(T, eps) of Algorithm 5, for any l and unit v. Proof:
    the difference is the integral over t in [0, 1] of J(l + t eps v) (eps v), whose norm is at most
    eps / (2T) by ``softmax_jacobian_norm_bound``; and two probability vectors are at distance
    <= sqrt(2) (||p - p'||_2^2 <= ||p - p'||_1 max_i |p_i - p'_i| <= 2).
    """
    T, eps = check_positive("T", T), check_positive("eps", eps)
    return min(1 / (2 * T), math.sqrt(2) / eps)


def corollary3_counterexample(T: float) -> Corollary3Counterexample:
    """Two tied logits l = (0, 0): ||J||_2 = 1/(2T) exceeds Corollary 3's min{1/(4T), sqrt(2)}.

    It exceeds 1 / (4T) for every T, and sqrt(2) too when T < 1 / (2 sqrt(2)) ~ 0.354. Corrected (ours);
    see ``corollary3_bound`` and ``softmax_jacobian_norm_bound``.
    """
    T = check_positive("T", T)
    logits = torch.zeros(2, dtype=torch.float64)
    weights = torch.softmax(logits / T, dim=-1)
    J = softmax_jacobian(weights, T)
    norm = float(torch.linalg.matrix_norm(J, ord=2))
    return Corollary3Counterexample(logits, weights, J, norm, corollary3_bound(T), softmax_jacobian_norm_bound(T))


def two_logit_example(c: float, eps: float, rest: Sequence[float] = ()) -> TwoLogitExample:
    """The motivating example of Sec. 2.3: l1 = (c + eps, c, *rest), l2 = (c - eps, c + eps, *rest).

    Reconstruction (ours; book/sources.md, "Gradient sensitivity"): ||l1 - l2||_2 = ||(2 eps, -eps, 0, ...)|| =
    sqrt(5) eps, and the two largest logits swap order (key 0 leads in l1, key 1 in l2); every entry of
    ``rest`` must be below c - eps so those two stay on top. First-order prediction (ours, proven):
    with J = the softmax Jacobian at l2, ||alpha1 - alpha2 - J (l1 - l2)||_2 <= ||l1 - l2||^2 / (2 T^2)
    = 5 eps^2 / (2 T^2), since the second derivative of softmax(z) in direction h has norm
    <= 2 Var_alpha(h) <= ||h||^2; and ||alpha1 - alpha2|| <= sqrt(5) eps / (2T). So the change is
    O(eps / T). Returns float64 tensors.
    """
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c):
        raise ValueError(f"c must be a finite number, got {c!r}")
    eps = check_positive("eps", eps)
    rest_t = float_tensor("rest", list(rest)).to(torch.float64).reshape(-1)
    check_finite("rest", rest_t)
    if (rest_t >= c - eps).any():
        raise ValueError(f"every entry of rest must be < c - eps = {c - eps} so that the two top logits swap")
    head1 = torch.tensor([c + eps, c], dtype=torch.float64)
    head2 = torch.tensor([c - eps, c + eps], dtype=torch.float64)
    return TwoLogitExample(torch.cat([head1, rest_t]), torch.cat([head2, rest_t]))


# --- Discussion: multi-head coverage ---------------------------------------------------------------------


#: Largest answer of ``heads_for_coverage``: up to 2^53 every integer H is a float64, so H and H - 1
#: are told apart and the minimal H is exact.
MAX_HEADS = 2**53


def _coverage(p: float, H: int) -> float:
    return -math.expm1(H * math.log1p(-p)) if p < 1 else 1.0


def multihead_coverage(p: float, H: int) -> float:
    """1 - (1 - p)^H: the fraction of top-N tokens covered by H independent heads that each separate a
    fraction p (the paper's Discussion; paper's statement, recovered). Computed as
    -expm1(H log1p(-p)), accurate also for tiny p; non-decreasing in H."""
    p = _check_number("p", p, 0.0, 1.0)
    H = check_int("H", H, low=1)
    return _coverage(p, H)


def heads_for_coverage(p: float, target: float) -> int:
    """The smallest H >= 1 with multihead_coverage(p, H) >= target (p = 0.8, target = 0.99 gives 3).

    Closed form: (1 - p)^H <= 1 - target iff H >= log1p(-target) / log1p(-p), so H is the ceiling of
    that ratio; a bounded search (galloping then bisection, O(log H) steps) corrects its rounding
    against ``multihead_coverage``, which is non-decreasing in H. Needs 0 < p <= 1 and 0 <= target < 1
    (target = 1 only with p = 1). Returns an exact int up to MAX_HEADS = 2^53; a larger answer (tiny p)
    raises ValueError.
    """
    p = _check_number("p", p, 0.0, 1.0)
    if p == 0:
        raise ValueError("p must be in (0, 1]: with p = 0 no number of heads covers anything")
    target = _check_number("target", target, 0.0, 1.0)
    if target == 1 and p < 1:
        raise ValueError("target must be in [0, 1): coverage 1 needs p = 1")
    if p == 1 or target == 0:
        return 1
    ratio = math.log1p(-target) / math.log1p(-p)
    if not ratio <= MAX_HEADS:  # also catches ratio = inf (p below ~1e-308)
        raise ValueError(
            f"p = {p!r} is too small for target = {target!r}: log1p(-target) / log1p(-p) = {ratio:.3g} heads "
            f"exceeds MAX_HEADS = 2^53 (the largest count returned exactly); use a larger p or a smaller target"
        )

    def enough(H: int) -> bool:
        return H >= 1 and _coverage(p, H) >= target

    guess = max(1, math.ceil(ratio))
    step = 1
    if enough(guess):  # gallop down to a failing lo (or 0), then bisect (lo, hi]
        hi, lo = guess, guess - 1
        while enough(lo):
            hi, step = lo, 2 * step
            lo = max(0, hi - step)
    else:  # gallop up to a passing hi
        lo, hi = guess, guess + 1
        while not enough(hi):
            lo, step = hi, 2 * step
            hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi
