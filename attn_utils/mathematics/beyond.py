"""Beyond the paper: its lenses applied to the normalizers its Discussion proposes (chapter 6, ``ch6_beyond``).

The paper (arXiv 2508.17821) closes by pointing at sparsemax and 1.5-entmax, scalable softmax (SSMax) and
self-adjust softmax (SA-softmax) as remedies, without measuring them. This module holds what the chapter
needs to measure them with the paper's own lenses, for every normalizer of :mod:`attn_utils.mathematics.normalizers`:

* **Lemma 1** (vanishing weights): :func:`row_stats` (largest and smallest weight magnitude, mass and
  support of each row), :func:`lemma1_envelope` (the band every weight of a row with logits in [-a, a]
  must lie in, per normalizer) and :func:`planted_weight_bound` (what a key whose logit stands out by a
  fixed gap is guaranteed); both read the normalizer's record in :mod:`attn_utils.mathematics.registry`.
* **Theorems 1 and 2** for weights that are not distributions: :func:`lens_distance` and
  :func:`lens_separability`. They use two exact identities (chapter ``ch6_beyond``, "homogeneity"): for a
  non-negative row with mass m > 0, d-tilde(alpha) = m * d-tilde(alpha / m) and N_s / N is the same for
  alpha and alpha / m. Signed weights (self-adjust softmax) are refused: neither lens is defined for them.
* **Gradients**: :func:`jacobian` and :func:`jvp`, the Jacobian d alpha / d l of every normalizer in closed
  form (and its product with a direction), vectorised over rows.
* **Several heads**: :func:`separated_keys` (which selected keys are geometrically distinguishable, the
  indicator behind ``metrics.separability``), :func:`coverage` (keys covered by at least one head, the
  prediction under independence and a permutation null) and :func:`head_association` (pairwise phi).

Layouts follow :mod:`attn_utils.mathematics.metrics`: weights and logits ``(..., R, L)``, vectors ``(..., L, d)``, a
boolean ``mask`` broadcastable to the weights (``True`` = key visible). Public functions validate their
input (:meth:`~attn_utils.mathematics.rows.Rows.of`) and raise ``ValueError`` naming the parameter; the
computations are the shared kernels of :mod:`attn_utils.mathematics.kernels`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from scipy.stats import chi2

from attn_utils.mathematics import kernels, metrics, registry
from attn_utils.mathematics.rows import Rows, float_tensor
from attn_utils.mathematics.validation import as_tensor, check_choice, check_int, check_positive

__all__ = [
    "CoverageResult",
    "Envelope",
    "Geometry",
    "association_from_counts",
    "coverage",
    "geometry",
    "geometry_weights",
    "head_association",
    "jacobian",
    "jvp",
    "lemma1_envelope",
    "lens_distance",
    "lens_separability",
    "planted_weight_bound",
    "row_stats",
    "separated_keys",
    "synthetic_rows",
    "unit_vectors",
]

# Tolerance of "a weight is negative" when deciding whether a row can be rescaled into a distribution.
_NEGATIVE_ATOL = 1e-12
# Temporaries of one chunk hold about this many float64 numbers.
_CHUNK = 1 << 21


# --- Lemma 1 lens -----------------------------------------------------------------------------------


def row_stats(weights, mask=None) -> dict[str, torch.Tensor]:
    """Per row (shape ``(...)`` for weights ``(..., L)``), over the visible keys:

    ``max`` = max_i |alpha_i|, ``min`` = min_i |alpha_i|, ``mass`` = sum_i alpha_i, ``support`` = the number of
    keys with alpha_i != 0, ``length`` = the number of visible keys. Magnitudes make the definition work for
    signed weights (self-adjust softmax); for non-negative weights they are the weights. Rows without a
    visible key have NaN ``max`` and ``min``. Computed in float64.
    """
    rows = Rows.of(weights, mask=mask, sums_to_one=False, row_axis=False)
    w, visible = rows.weights, rows.visible
    a = w.abs()
    seen = visible.any(-1)
    return {
        "max": torch.where(seen, torch.where(visible, a, -torch.inf).amax(-1), torch.nan),
        "min": torch.where(seen, torch.where(visible, a, torch.inf).amin(-1), torch.nan),
        "mass": torch.where(visible, w, 0.0).sum(-1),
        "support": (visible & (w != 0)).sum(-1),
        "length": visible.sum(-1),
    }


class Envelope(NamedTuple):
    """Bounds ``lower <= |alpha_i| <= upper`` valid for every key of every row of L logits in [-a, a]."""

    lower: float
    upper: float


def lemma1_envelope(name: str, a: float, L: int, T: float = 1.0, s: float = 1.0) -> Envelope:
    """The band every weight magnitude of a row of ``L`` logits in ``[-a, a]`` lies in (chapter ch6, Prop. 1-2).

    * softmax (Corollary 1): e^{-2a/T} / L and e^{2a/T} / L;
    * softmax-1: e^{-a/T} / (1 + L e^{a/T}) and e^{a/T} / (1 + L e^{-a/T}), both Theta(1/L);
    * self-adjust: 0 and (a/T) e^{2a/T} / L; normalized self-adjust: 0 and e^{2a/T} / L;
    * scalable softmax (n = L visible keys): L^{-2sa/T} / L and min(1, L^{2sa/T} / L), no decay once 2sa/T >= 1;
    * sparsemax and 1.5-entmax: 0 and 1 (no decay is forced, and exact zeros occur).
    """
    envelope = registry.get(name).envelope
    if envelope is None:
        raise ValueError(f"normalizer {name!r} has no envelope; normalizers with one: {list(registry.COMPARED)}")
    a = float(a)
    if not math.isfinite(a) or a < 0:
        raise ValueError(f"a must be a finite number >= 0, got {a!r}")
    L = check_int("L", L, low=1)
    T, s = check_positive("T", T), check_positive("s", s)
    return Envelope(*envelope(a / T, L, s))


def planted_weight_bound(name: str, gap: float, L: int, T: float = 1.0, s: float = 1.0) -> float:
    """A lower bound on the weight of a key whose logit exceeds every other logit of its row by >= ``gap``
    (chapter ch6, Prop. ch6-prop-escape), the ``planted`` field of the normalizer's record.

    The row has ``L`` keys. softmax: 1 / (1 + (L - 1) e^{-gap/T}) (tends to 0 as L grows); scalable softmax:
    1 / (1 + (L - 1) L^{-s gap / T}) (tends to 1 when s gap / T > 1); sparsemax: 1 if gap >= T; 1.5-entmax: 1 if
    gap >= 2T; otherwise 1 / L (the largest weight of a distribution over L keys).
    """
    planted = registry.get(name).planted
    if planted is None:
        raise ValueError(f"normalizer {name!r} has no planted-key guarantee; normalizers with one: "
                         f"{[r.name for r in registry.RECORDS if r.planted]}")
    gap = float(gap)
    if not math.isfinite(gap) or gap < 0:
        raise ValueError(f"gap must be a finite number >= 0, got {gap!r}")
    L = check_int("L", L, low=1)
    T, s = check_positive("T", T), check_positive("s", s)
    return 1.0 if L == 1 else planted(gap, L, T, s)


# --- Theorem 1 and 2 lenses for rows that are not distributions ---------------------------------------


def geometry_weights(weights) -> tuple[torch.Tensor, torch.Tensor]:
    """Split non-negative weights ``(..., R, L)`` into a distribution and its mass: ``(alpha / m, m)``.

    ``m`` is the row sum (shape ``(..., R)``); rows with m = 0 stay zero. Float64. Raises ``ValueError`` for
    weights of either sign (self-adjust softmax): no rescaling turns them into a distribution.
    """
    return _split(_nonnegative(weights))


def _nonnegative(weights) -> torch.Tensor:
    """The weights (..., R, L) in float64 (:meth:`Rows.of`), refused when signed, negative rounding clamped to 0."""
    w = Rows.of(weights, sums_to_one=False).weights
    if (w < -_NEGATIVE_ATOL).any():
        raise ValueError("weights must be non-negative: the distance and separability lenses are not defined "
                         f"for signed weights (found {w.min().item():.3g}); self-adjust softmax is such a case")
    return w.clamp(min=0)


def _split(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m = w.sum(-1)
    return w / torch.where(m > 0, m, 1.0).unsqueeze(-1), m


def lens_distance(weights, x, N: int, mask=None, reading: str = "sum_of_norms") -> torch.Tensor:
    """d-tilde (Eq. (7), ``metrics.cumulative_distance``) of each row of non-negative weights, any mass.

    d-tilde is positively homogeneous of degree one in the weights and the top-N set is scale invariant, so
    d-tilde(alpha) = m * d-tilde(alpha / m) exactly; the distribution alpha / m goes through the library.
    NaN on rows that see at most N keys or have mass 0. Shape ``(..., R)``.
    """
    w, m = geometry_weights(weights)
    selected, valid = metrics.top_n_mask(w, N, mask)
    d = metrics.cumulative_distance(w, x, selected, mask, reading=reading) * m
    return d.masked_fill(~(valid & (m > 0)), torch.nan)


def lens_separability(weights, x, N: int, mask=None, M: float = 1.0, normalize: bool = True) -> torch.Tensor:
    """N_s / N (Definition (10), ``metrics.separability``) of each row of non-negative weights, any mass.

    Every distance ||alpha_i x_i - s|| and the radius r scale by the same factor m, so the count is that of
    alpha / m. NaN on rows that see at most N keys or have mass 0. Shape ``(..., R)``.
    """
    w, m = geometry_weights(weights)
    ratio, _ = metrics.separability(w, x, N, mask, M=M, normalize=normalize)
    return ratio.masked_fill(~(m > 0), torch.nan)


class Geometry(NamedTuple):
    """The Theorem 1 and Theorem 2 lenses of one top-N size, per row (see :func:`geometry`)."""

    distance: torch.Tensor      # d-tilde, sum-of-norms reading, (..., R); NaN on invalid rows
    separability: torch.Tensor  # N_s / N, (..., R); NaN on invalid rows
    selected: torch.Tensor      # the top-N set, (..., R, L)
    separated: torch.Tensor | None  # its distinguishable keys, (..., R, L), False on invalid rows; None if not asked
    valid: torch.Tensor         # L_r > N and mass > 0, (..., R)


def geometry(weights, x, N, mask=None, *, sphere=None, M: float = 1.0, keys: bool = True):
    """d-tilde and N_s / N of every row, for non-negative weights of any mass, through the metric's own kernels.

    The same quantities as :func:`lens_distance` (d-tilde of Eq. (7) with the vectors ``x``, sum-of-norms
    reading) and :func:`lens_separability` (N_s / N of Definition (10) with the vectors projected onto the sphere
    of radius ``M``; pass them as ``sphere`` when they are already projected, to skip the projection). Both are
    computed by the kernels of :mod:`attn_utils.mathematics.metrics` (``cumulative_distance`` and
    ``separability``) directly on the given weights: d-tilde is homogeneous and N_s / N scale invariant, so no
    rescaling is needed. The inputs are validated, and the top-N sets found (one partial sort), once for every
    top-N size: ``N`` may be one size (returns a :class:`Geometry`) or a list of sizes (returns ``{N:
    Geometry}``). With ``keys`` the separated keys themselves are returned too (the indicator of the strict
    count: ||alpha_i x_i - s|| < r with the metric's radius r; the multi-head coverage needs it).
    ``weights`` (..., R, L), ``x`` and ``sphere`` (..., L, d).
    """
    w = _nonnegative(weights)  # the weights as given
    distribution, m = _split(w)
    M = check_positive("M", M)
    rows = Rows.of(w, x, mask, sums_to_one=False)  # weights and x broadcast to their leading dims
    sph = kernels.project(rows.x, M) if sphere is None else Rows.of(w, sphere, x_name="sphere", sums_to_one=False).x
    if sph.shape[:-2] != rows.x.shape[:-2]:
        raise ValueError(f"sphere of shape {tuple(sph.shape)} must have the leading dims {tuple(rows.x.shape[:-2])} "
                         "of weights and x")
    w, visible, lead = rows.weights, rows.visible, rows.weights.shape[:-2]
    R, L = w.shape[-2:]
    # contiguous once (a view of a longer window is not), so that the sums over the sets read them without copies
    xs, sph = rows.x.contiguous(), sph.contiguous()
    single = not isinstance(N, (list, tuple))
    Ns = [check_int("N", n, low=1, high=L - 1) for n in ([N] if single else list(N))]
    dist = Rows.of(distribution, mask=mask)  # the distributions alpha / m, checked
    tops = kernels.top_sets(dist.weights, dist.visible, Ns, keys=True)  # one sort for every N
    x2, sph2 = xs.square().sum(-1).unsqueeze(-2), sph.square().sum(-1).unsqueeze(-2)  # once for every N and block
    longest_x, longest_s = x2.amax(-1, keepdim=True).sqrt(), sph2.amax(-1, keepdim=True).sqrt()
    mass = m.expand(*lead, R).unsqueeze(-1)
    out = {}
    for n, (selected, valid, top, ranked) in zip(Ns, tops):
        selected, top = selected.expand(*lead, R, L), top.expand(*lead, R, n)
        valid = (valid & (m > 0)).expand(*lead, R)
        picked = w.gather(-1, top)
        s_x, s_s = kernels.weighted_sum(xs, top, picked), kernels.weighted_sum(sph, top, picked)
        outside = ranked[..., n : n + 1].expand(*lead, R, 1) * mass  # >= every weight outside the set (valid rows)
        distance, ratio = w.new_empty(w.shape[:-1]), w.new_empty(w.shape[:-1])
        separated = torch.zeros_like(selected) if keys else None
        for block, k in kernels.row_blocks(visible):
            wb, vb, out_b = w[..., block, :k], visible[..., block, :k], outside[..., block, :]
            keys_b = top[..., block, :].clamp_max(k - 1)  # only an invalid row (NaN, no keys kept) reaches beyond k
            distance[..., block] = kernels.distance_sum(wb, xs[..., :k, :], vb, top=keys_b, wsq=wb * wb * x2[..., :k],
                                                         reach=out_b * longest_x, s=s_x[..., block, :])
            ratio[..., block], _, inside = kernels.separability_rows(
                wb, sph[..., :k, :], vb, keys_b, valid[..., block], n, s_s[..., block, :], wb * wb * sph2[..., :k],
                out_b * longest_s)
            if keys:  # the selected keys strictly inside the ball, on valid rows
                separated[..., block, :k].scatter_(-1, keys_b, inside & valid[..., block, None])
        out[n] = Geometry(torch.where(valid, distance, torch.nan), torch.where(valid, ratio, torch.nan), selected,
                          separated, valid)
    return out[N] if single else out


# --- gradients ----------------------------------------------------------------------------------------


def _jacobian_parts(logits, name: str, mask, T: float, s: float):
    """The record's closed-form Jacobian, its parts for these logits (float64, validated by :meth:`Rows.of`; the
    normalizer refuses infinite visible logits) and their visibility."""
    jac = registry.get(name).jacobian
    if jac is None:
        raise ValueError(f"normalizer {name!r} has no closed-form Jacobian; those with one: {list(registry.COMPARED)}")
    rows = Rows.of(logits, mask=mask, name="logits", sums_to_one=False, row_axis=False, finite=False)
    T, s = check_positive("T", T), check_positive("s", s)
    return jac, jac.parts(rows.weights, rows.visible, T, s), rows.visible


def jvp(logits, v, name: str, *, mask=None, T: float = 1.0, s: float = 1.0) -> torch.Tensor:
    """J v for each row: the derivative of ``normalize(logits, name, mask=mask, T=T)`` along direction ``v``.

    Closed forms (z = l / T; J_l = J_z / T, and s log(n) / T for scalable softmax):

    * softmax, softmax-1, scalable softmax: J_z = diag(alpha) - alpha alpha^T (softmax-1's alpha sums to < 1);
    * sparsemax: J_z = diag(sigma) - sigma sigma^T / |S|, sigma the indicator of the support S;
    * 1.5-entmax: J_z = diag(r) - r r^T / sum(r), r = sqrt(alpha);
    * self-adjust, alpha = z p with p = softmax(z): J_z = diag(p (1 + z)) - (z p) p^T;
    * normalized self-adjust, alpha = f p: J_z = diag(f) (diag(p) - p p^T) + diag(p) df/dz.

    ``v`` broadcasts to the logits; entries at masked keys do not matter. Float64, shape of the logits.
    Non-differentiable points (support changes, tied extremes) get the one-sided value autograd would give.
    """
    jac, parts, visible = _jacobian_parts(logits, name, mask, T, s)
    v = float_tensor("v", v).to(torch.float64)
    try:
        v = v.expand(parts.a.shape)
    except RuntimeError:
        raise ValueError(f"v of shape {tuple(v.shape)} does not broadcast to logits {tuple(parts.a.shape)}") from None
    v = torch.where(visible, v, 0.0)
    if not torch.isfinite(v).all():
        raise ValueError("v must be finite at visible keys (found NaN or inf)")
    return parts.scale * jac.jvp(parts, v)


def jacobian(logits, name: str, *, mask=None, T: float = 1.0, s: float = 1.0) -> torch.Tensor:
    """The Jacobian J[..., i, k] = d alpha_i / d l_k of each row, shape ``(..., L, L)``, in closed form.

    Same formulas as :func:`jvp` (which computes J v without forming J). Rows and columns of masked keys are 0.
    """
    jac, parts, _ = _jacobian_parts(logits, name, mask, T, s)
    return parts.scale.unsqueeze(-1) * jac.matrix(parts)


# --- several heads: separated keys and coverage ----------------------------------------------------------


def separated_keys(weights, x, N: int, mask=None, M: float = 1.0,
                   normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which of the top-N keys of each row are geometrically distinguishable (Definition (10)).

    Returns ``(selected, separated, valid)``: ``selected`` (..., R, L) is the top-N set of
    ``metrics.top_n_mask``; ``separated`` (..., R, L) marks the selected keys i with
    ||alpha_i x_i - s|| < r, r = min over the visible non-selected keys j of ||alpha_j x_j - s|| (the strict
    count of ``metrics.separability``, whose ratio is ``separated.sum(-1) / N``); ``valid`` (..., R) is
    L_r > N. ``x`` (..., L, d) is projected onto the sphere of radius ``M`` when ``normalize``. On invalid
    rows ``separated`` is all False. (The indicator of :func:`geometry`.)
    """
    g = geometry(weights, x, N, mask, sphere=None if normalize else x, M=M)
    return g.selected, g.separated, g.valid


class CoverageResult(NamedTuple):
    """Per row (shape ``(..., R)``, NaN or 0 on invalid rows) and per permutation.

    ``union``: |U|, the number of keys in the top-N set of at least one head; ``covered``: keys of U
    separated by at least one head; ``expected``: the expected number covered if each head's separated keys
    were a uniformly random subset (of the same size) of its own top-N set, independently across heads;
    ``paper``: the paper's fraction 1 - (1 - p)^H with p the mean over heads of N_s / N; ``separated``:
    N_s per head, ``(..., H, R)``; ``null``: the total number covered (summed over valid rows) in each of
    ``n_perm`` permutations that shuffle each head's separated indicator within its own top-N set,
    ``(n_perm, ...)``; ``valid``: the rows used.
    """

    union: torch.Tensor
    covered: torch.Tensor
    expected: torch.Tensor
    paper: torch.Tensor
    separated: torch.Tensor
    null: torch.Tensor
    valid: torch.Tensor


def _head_tensors(selected, separated, valid):
    sel = as_tensor("selected", selected)
    sep = as_tensor("separated", separated)
    if sel.dtype != torch.bool or sep.dtype != torch.bool or sel.ndim < 3 or sel.shape != sep.shape:
        raise ValueError("selected and separated must be boolean tensors of the same shape (..., H, R, L), got "
                         f"{sel.dtype} {tuple(sel.shape)} and {sep.dtype} {tuple(sep.shape)}")
    if (sep & ~sel).any():
        raise ValueError("separated must lie inside selected: a separated key is not selected")
    ok = as_tensor("valid", valid)
    if ok.dtype != torch.bool:
        raise ValueError(f"valid must be a boolean tensor, got dtype {ok.dtype}")
    try:
        ok = ok.expand(sel.shape[:-1])
    except RuntimeError:
        try:
            ok = ok.unsqueeze(-2).expand(sel.shape[:-1])
        except RuntimeError:
            raise ValueError(f"valid of shape {tuple(ok.shape)} matches neither (..., H, R) nor (..., R) of "
                             f"{tuple(sel.shape[:-1])}") from None
    ok = ok.all(-2)  # a row is used when it is valid for every head
    return sel & ok.unsqueeze(-2).unsqueeze(-1), sep & ok.unsqueeze(-2).unsqueeze(-1), ok


def coverage(selected, separated, valid, N: int, n_perm: int = 0, generator=None) -> CoverageResult:
    """Multi-head coverage of the paper's Discussion, measured: heads on dim -3, rows on -2, keys on -1.

    The universe of a row is U = the union over heads of their top-N sets. Under the null hypothesis the
    N_s^h separated keys of head h are a uniformly random subset of its top-N set, independently across heads;
    then a key i of U is missed by every head with probability prod_{h : i in I_N^h} (1 - N_s^h / N), which
    gives ``expected`` exactly, and the permutations give the null distribution of the total. Every valid
    row must have exactly N selected keys per head (``metrics.top_n_mask`` guarantees it).
    """
    sel, sep, ok = _head_tensors(selected, separated, valid)
    N = check_int("N", N, low=1, high=sel.shape[-1])
    n_perm = check_int("n_perm", n_perm, low=0)
    counts = sel.sum(-1)
    if (counts[ok.unsqueeze(-2).expand_as(counts)] != N).any():
        raise ValueError(f"every valid row must select exactly N = {N} keys per head")
    H = sel.shape[-3]
    k = sep.sum(-1)  # (..., H, R)
    union = sel.any(-3)  # (..., R, L)
    covered = sep.any(-3).sum(-1)
    miss = torch.where(sel, 1.0 - k.unsqueeze(-1).to(torch.float64) / N, 1.0).prod(-3)  # (..., R, L)
    expected = torch.where(union, 1.0 - miss, 0.0).sum(-1)
    p = (k.to(torch.float64) / N).mean(-2)
    paper = 1.0 - (1.0 - p) ** H
    n_union = union.sum(-1)
    null = _coverage_null(sel, sep, union, ok, N, n_perm, generator)
    return CoverageResult(union=torch.where(ok, n_union, 0), covered=torch.where(ok, covered, 0),
                          expected=torch.where(ok, expected, torch.nan), paper=torch.where(ok, paper, torch.nan),
                          separated=torch.where(ok.unsqueeze(-2), k, 0), null=null, valid=ok)


def _coverage_null(sel, sep, union, ok, N: int, n_perm: int, generator) -> torch.Tensor:
    """Totals covered (summed over valid rows) under within-head shuffles, shape (n_perm, ...)."""
    lead = sel.shape[:-3]
    if n_perm == 0:
        return torch.zeros((0, *lead), dtype=torch.float64, device=sel.device)
    H, R, L = sel.shape[-3:]
    # positions of each head's N selected keys (index order), on valid rows; dummy 0..N-1 elsewhere
    order = torch.sort(sel.to(torch.int8), dim=-1, descending=True, stable=True).indices[..., :N]  # (..., H, R, N)
    sep_sel = sep.gather(-1, order)
    slot = (union.cumsum(-1) - 1).clamp(min=0)  # position of each key inside U
    pos = slot.unsqueeze(-3).expand(*lead, H, R, L).gather(-1, order)  # (..., H, R, N)
    width = max(1, int(union.sum(-1).max()))
    pos = pos.movedim(-3, -2).reshape(*lead, R, H * N)
    rows_ok = ok.to(torch.float64)
    out = torch.empty((n_perm, *lead), dtype=torch.float64, device=sel.device)
    per_draw = max(1, _CHUNK // max(1, sep_sel.numel()))
    for p0 in range(0, n_perm, per_draw):
        P = min(per_draw, n_perm - p0)
        # drawn where the generator draws (the CPU: the same shuffles on every device)
        keys = torch.rand((P, *sep_sel.shape), generator=generator, dtype=torch.float64,
                          device=kernels.draw_device(generator)).to(sel.device)
        shuffled = sep_sel.unsqueeze(0).expand(P, *sep_sel.shape).gather(-1, kernels.argsort(keys))
        shuffled = shuffled.movedim(-3, -2).reshape(P, *lead, R, H * N).to(torch.float64)
        hits = torch.zeros((P, *lead, R, width), dtype=torch.float64, device=sel.device)
        hits.scatter_add_(-1, pos.unsqueeze(0).expand(P, *pos.shape), shuffled)
        out[p0:p0 + P] = ((hits > 0).sum(-1).to(torch.float64) * rows_ok).sum(-1)
    return out


def head_association(selected, separated, valid) -> dict[str, torch.Tensor]:
    """Pairwise association of the heads' separation, over the keys both heads select.

    For heads h, h' (dim -3) the observations are the (row, key) pairs with the key in both top-N sets, on
    the valid rows; the 2 x 2 table counts whether each head separates the key. Returns tensors of shape
    ``(..., H, H)``: the counts ``n11`` (both separate), ``n10``, ``n01``, ``n00`` (neither), and what
    :func:`association_from_counts` makes of them. The diagonal compares a head with itself. Tables of
    several row blocks add up: sum their counts and call :func:`association_from_counts`.
    """
    sel, sep, _ = _head_tensors(selected, separated, valid)
    A = sel.flatten(-2).to(torch.float64)   # (..., H, R * L)
    B = sep.flatten(-2).to(torch.float64)
    C = A - B                               # selected but not separated
    counts = {"n11": B @ B.mT, "n10": B @ C.mT, "n01": C @ B.mT, "n00": C @ C.mT}
    return {**counts, **association_from_counts(**counts)}


def association_from_counts(n11, n10, n01, n00) -> dict[str, torch.Tensor]:
    """``n`` (observations), ``phi`` (the phi coefficient of the 2 x 2 tables; NaN when a margin is empty),
    ``chi2`` = n phi^2 and ``pvalue`` (chi-square, one degree of freedom, no continuity correction; it assumes
    independent observations)."""
    n11, n10, n01, n00 = (as_tensor(k, v).to(torch.float64) for k, v in
                          (("n11", n11), ("n10", n10), ("n01", n01), ("n00", n00)))
    n = n11 + n10 + n01 + n00
    denominator = (n11 + n10) * (n01 + n00) * (n11 + n01) * (n10 + n00)
    phi = torch.where(denominator > 0, (n11 * n00 - n10 * n01) / denominator.clamp(min=1e-300).sqrt(), torch.nan)
    stat = n * phi ** 2
    pvalue = torch.from_numpy(chi2.sf(stat.cpu().numpy(), 1)).to(stat.device, torch.float64)
    return {"n": n, "phi": phi, "chi2": stat, "pvalue": pvalue}


# --- synthetic instances ------------------------------------------------------------------------------------

FAMILIES = ("typical", "planted")


def synthetic_rows(family: str, n: int, length: int, a: float, gap: float = 0.0, generator=None) -> torch.Tensor:
    """``n`` rows of ``length`` logits in [-a, a], float64, drawn with ``generator`` (one ``torch.rand`` call).

    ``"typical"``: i.i.d. uniform on [-a, a]. ``"planted"``: key 0 at +a and the others uniform on [-a, a - gap], so
    that key 0 exceeds every other logit by at least ``gap`` (the hypothesis of :func:`planted_weight_bound`).
    """
    check_choice("family", family, FAMILIES)
    n, length = check_int("n", n, low=1), check_int("length", length, low=1)
    a, gap = float(a), float(gap)
    if not (math.isfinite(a) and a >= 0 and math.isfinite(gap) and 0 <= gap <= 2 * a):
        raise ValueError(f"a and gap must be finite with a >= 0 and 0 <= gap <= 2a, got a={a!r}, gap={gap!r}")
    u = torch.rand(n, length, generator=generator, dtype=torch.float64)
    if family == "typical":
        return (2 * u - 1) * a
    logits = -a + (2 * a - gap) * u
    logits[:, 0] = a
    return logits


def unit_vectors(shape, d: int, generator=None) -> torch.Tensor:
    """Vectors uniform on the unit sphere of R^d, shape ``(*shape, d)``, float64 (normalised Gaussian draws)."""
    d = check_int("d", d, low=1)
    x = torch.randn(*shape, d, generator=generator, dtype=torch.float64)
    return x / x.norm(dim=-1, keepdim=True)
