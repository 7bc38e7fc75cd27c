"""Theorem 1 for a fixed top-N set: an upper bound on the cumulative distance d~ of Eq. (7), with its proof.

d_1 = max_{i in U, j in I} ||x_i - x_j|| is read off the lists of :func:`farthest_keys` (the kernel
``kernels.max_cross_sq_distance``). Statuses and layouts as in :mod:`attn_utils.mathematics.theory`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from attn_utils.mathematics import kernels
from attn_utils.mathematics.rows import Rows, bool_view, float_tensor, unit_scale
from attn_utils.mathematics.validation import broadcasts_to, check_finite, check_int, check_keys

__all__ = ["FARTHEST", "FarthestKeys", "farthest_keys", "theorem1_fixed_bound"]


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

    def prefix(self, L: int) -> FarthestKeys:
        """The lists of the first L keys (L must be one of the levels): the levels up to L."""
        if L not in self.levels:
            raise ValueError(f"L must be one of the levels {self.levels} (see farthest_keys' prefixes), got {L}")
        n = self.levels.index(L) + 1
        return FarthestKeys(self.levels[:n], self.sq_distances[:n], self.indices[:n], self.batch)


#: Farthest keys kept per key and prefix size by ``farthest_keys``.
FARTHEST = 32


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
    are ranked on each head's x / c (c = a power of two, see ``rows.unit_scale``), so they stay right for any
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
    step = max(1, kernels.CHUNK_ELEMENTS // (L * L))
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


def _farthest_for(farthest: FarthestKeys | None, rows: Rows) -> tuple[FarthestKeys, torch.Tensor]:
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
    rows = Rows.of(weights, x, mask, dtype=None, sums_to_one=False, nonempty=True).per_head()
    sel = bool_view("selected", selected, torch.Size((*rows.batch, *rows.weights.shape[-2:])))
    sel = sel.reshape(rows.weights.shape)
    if rows.masked and (sel & ~rows.visible).any():
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
        w, vis = rows.distribution(bs, rs)
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
            idx, valid = kernels.compact(s_c[b, r], n_max)
            heads = torch.arange(bs.start, bs.start + w.shape[0], device=w.device)[b]
            d1[b, r] = kernels.sqrt0(kernels.max_cross_sq_distance(rows.x, far, unit, heads, idx, valid, unsel[b, r]))
        n_unsel = unsel.sum(-1).to(w.dtype)
        return rest * d1 + m_sel * (abar * n_unsel - rest)

    return rows.restore(kernels.chunked(*rows.weights.shape[:2], n_max * (FARTHEST + 2) + 6 * L, chunk))
