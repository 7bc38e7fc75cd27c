"""Per-row measured quantities of arXiv 2508.17821: top-N set, context vector, distances, separability, g.

Layout: attention weights ``(..., R, L)`` (row r = one query, L keys), vectors ``(..., L, d)`` (the x_i;
by project policy the per-head value vectors), a boolean ``mask`` broadcastable to the weights
(``True`` = key visible). Every leading dim is a batch dim (layers, heads, ...) and must broadcast
between weights and vectors. A row's length L_r is its number of visible keys. All arithmetic is in
float64 whatever the input dtype. Where a definition is ours rather than the
paper's, the docstring says so (see ``book/sources.md``).

Conventions of this module (ours; the paper does not fix them):

* **Tie-breaking.** Among equal weights the key with the lowest index enters the top-N set first, so
  the selection is a deterministic function of the weights.
* **Row skipping.** A row with L_r <= N has no non-selected key; it is *invalid* for top-N metrics.
  ``top_n_mask`` reports validity; functions that take ``N`` return NaN on invalid rows.
* **Separability** counts a selected point as distinguishable when it is *strictly* closer to s than
  every non-selected point (see :func:`separability`).

The public functions validate their input and raise ``ValueError`` naming the parameter: zero keys
(L = 0) and, where a row must see a key (Algorithm 5), fully masked rows are refused; zero rows give
empty results. Distances are homogeneous of degree 1 in x, so they are computed on x / c, c a power of
two per head (exact), and multiplied by c: finite for every finite x. The computations themselves are the
unchecked kernels of :mod:`attn_utils.mathematics.kernels`, which ``algorithms`` and ``beyond`` share.
"""
from __future__ import annotations

import math

import torch

from attn_utils.mathematics import kernels
from attn_utils.mathematics.rows import Rows, bool_view, unit_scale
from attn_utils.mathematics.validation import as_tensor, check_choice, check_int, check_keys, check_positive, \
    check_visible_rows

__all__ = [
    "context_vector",
    "cumulative_distance",
    "entropy",
    "expected_distance_mc",
    "finite_difference_gradient",
    "max_weight",
    "min_pairwise_distance",
    "project_to_sphere",
    "random_directions",
    "separability",
    "top_n_mask",
]

READINGS = ("sum_of_norms", "norm_of_sum")


# --- validation (see attn_utils.mathematics.rows) ---------------------------------------------------


def _visible(mask, like: torch.Tensor) -> torch.Tensor:
    """The mask as a view of the shape of ``like``, on its device; None means every key is visible."""
    if mask is None:
        return torch.ones((), dtype=torch.bool, device=like.device).expand(like.shape)
    return bool_view("mask", mask, like.shape).to(like.device)


def _top_n_count(N, weights: torch.Tensor) -> int:
    L = weights.shape[-1]
    return check_int("N", N, low=1, high=L - 1)


# --- block loops over validated rows ---------------------------------------------------------------


def _top_n(w: torch.Tensor, visible: torch.Tensor, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-N set among visible keys (lowest index first among ties) and the rows with L_r > N."""
    return kernels.top_sets(w, visible, [N])[0]


def _cumulative_distance(w, x, selected, visible, reading: str) -> torch.Tensor:
    out = w.new_empty(w.shape[:-1])
    for rows, k in kernels.row_blocks(visible):
        wb, sel, vis, xb = w[..., rows, :k], selected[..., rows, :k], visible[..., rows, :k], x[..., :k, :]
        if reading == "sum_of_norms":
            out[..., rows] = kernels.distance_sum(wb, xb, vis, sel)
        else:
            out[..., rows] = kernels.distance_norm(wb, xb, sel, vis & ~sel)
    return out


def _separability(w, x, top, visible, valid, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """N_s / N and r per row for the top-N sets ``top`` (..., R, N), block by block (an invalid row's keys may lie
    beyond its block's last visible key: they are clamped, its values are NaN anyway)."""
    ratio, radius = w.new_empty(w.shape[:-1]), w.new_empty(w.shape[:-1])
    for rows, k in kernels.row_blocks(visible):
        ratio[..., rows], radius[..., rows], _ = kernels.separability_rows(
            w[..., rows, :k], x[..., :k, :], visible[..., rows, :k], top[..., rows, :].clamp_max(k - 1),
            valid[..., rows], N)
    return ratio, radius


# --- public API -------------------------------------------------------------------------------------


def top_n_mask(weights, N: int, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-N set I_N of each row (recovered: the paper's definition) and the rows where it is meaningful.

    Returns ``(selected, valid_rows)``: ``selected`` (..., R, L) is True at the N largest weights among
    the visible keys, ties broken by the lowest key index (ours); ``valid_rows`` (..., R) is L_r > N.
    On an invalid row (L_r <= N) ``selected`` holds all of its visible keys.
    """
    rows = Rows.of(weights, mask=mask)
    return _top_n(rows.weights, rows.visible, _top_n_count(N, rows.weights))


def context_vector(weights, x, selected) -> torch.Tensor:
    """s = sum_{i in I_N} alpha_i x_i (recovered), shape (..., R, d)."""
    rows = Rows.of(weights, x)
    return kernels.context_vectors(rows.weights, rows.x, bool_view("selected", selected, rows.weights.shape))


def cumulative_distance(weights, x, selected, mask=None, reading: str = "sum_of_norms") -> torch.Tensor:
    """The cumulative distance d-tilde of Eq. (7) for each row, shape (..., R).

    ``reading="sum_of_norms"`` (default, our reconstruction; book/sources.md):
        d = sum_{i visible, i not in I_N} ||alpha_i x_i - s||.
    ``reading="norm_of_sum"`` (the other reading; book/sources.md):
        d = ||sum_{i visible, i not in I_N} (alpha_i x_i - s)||.
    ``selected`` must lie inside the mask. A row without non-selected visible keys gives 0. Both readings
    are homogeneous of degree 1 in x: d(c x) = c d(x) (computed so, see the module's docstring).
    """
    rows = Rows.of(weights, x, mask)
    selected = bool_view("selected", selected, rows.weights.shape)
    if (selected & ~rows.visible).any():
        raise ValueError("selected must lie inside mask: a selected key is not visible")
    check_choice("reading", reading, READINGS)
    xs, c = unit_scale(rows.x)
    return _cumulative_distance(rows.weights, xs, selected, rows.visible, reading) * c.unsqueeze(-1)


def expected_distance_mc(weights, x, N: int, mask=None, n_samples: int = 256, generator=None,
                         reading: str = "sum_of_norms") -> torch.Tensor:
    """Monte-Carlo estimate of E_{I_N ~ U}[d-tilde] (Eq. (8), the random selection of Theorem 1), shape (..., R).

    Each sample draws, independently per row, a uniformly random N-subset of the visible keys (the N
    largest of i.i.d. uniform scores) and evaluates d-tilde with the row's own weights on that subset.
    Invalid rows (L_r <= N) are NaN. ``generator`` (a ``torch.Generator``) makes the draw reproducible.
    """
    rows = Rows.of(weights, x, mask)
    w, visible = rows.weights, rows.visible
    N = _top_n_count(N, w)
    n_samples = check_int("n_samples", n_samples, low=1)
    check_choice("reading", reading, READINGS)
    xs, c = unit_scale(rows.x)
    total = w.new_zeros(w.shape[:-1])
    for _ in range(n_samples):  # drawn where the generator draws (the CPU: the same on every device)
        scores = torch.rand(w.shape, generator=generator, dtype=torch.float64,
                            device=kernels.draw_device(generator)).to(w.device)
        scores.masked_fill_(~visible, -1.0)
        subset = torch.zeros_like(visible).scatter_(-1, torch.topk(scores, N, dim=-1).indices, True)
        total += _cumulative_distance(w, xs, subset & visible, visible, reading)
    return (total / n_samples * c.unsqueeze(-1)).masked_fill_(rows.lengths() <= N, torch.nan)


def project_to_sphere(x, M: float = 1.0) -> torch.Tensor:
    """x_i -> M x_i / ||x_i||, the projection onto the sphere of radius M (Assumption 1, Algorithm 4).

    A zero vector stays zero (it has no direction).
    """
    M = check_positive("M", M)
    x = as_tensor("x", x)
    if x.ndim < 1 or not x.is_floating_point() or not torch.isfinite(x).all():
        raise ValueError(f"x must be a finite float tensor of shape (..., d), got shape {tuple(x.shape)}")
    return kernels.project(x.to(torch.float64), M)


def separability(weights, x, N: int, mask=None, M: float = 1.0,
                 normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Separability ratio N_s / N of Definition (10) and the radius r, per row (Algorithm 4).

    With ``normalize`` the x_i are first projected onto the sphere of radius M (Assumption 1).
    r = min_{i visible, i not in I_N} ||s - alpha_i x_i|| (the paper's choice in Algorithm 4) and
        N_s = #{i in I_N : ||alpha_i x_i - s|| < r}.
    Strict "<" is our reading: with this r the nearest non-selected point lies on the boundary of the
    closed ball B_r(s), so the paper's condition "alpha_j x_j not in B_r(s) for all j not in I_N" holds
    only for the open ball; a selected point counts when it is strictly closer to s than every
    non-selected point. Returns ``(ratio, r)``, both NaN on invalid rows (L_r <= N).
    """
    rows = Rows.of(weights, x, mask)
    w, visible = rows.weights, rows.visible
    N = _top_n_count(N, w)
    M = check_positive("M", M)
    xs, c = unit_scale(rows.x)  # r is homogeneous of degree 1 in x, the ratio of degree 0
    if normalize:
        xs, c = kernels.project(xs, M), torch.ones_like(c)
    _, valid, top, _ = kernels.top_sets(w, visible, [N], keys=True)[0]
    ratio, r = _separability(w, xs, top, visible, valid, N)
    return ratio, r * c.unsqueeze(-1)


def min_pairwise_distance(x) -> torch.Tensor:
    """delta = min_{i != j} ||x_i - x_j|| over the L vectors of x (..., L, d), shape (...).

    Assumption 2 with delta set to the empirical minimum pairwise distance, as the paper does. The Gram
    form |x_i|^2 + |x_j|^2 - 2<x_i, x_j> only screens the pairs: its rounding error is below
    2 (d + 2) eps max_i |x_i|^2, so every pair within four times that of the screened minimum is
    recomputed from its direct difference, and nearly equal vectors keep full precision.
    """
    x = as_tensor("x", x)
    if x.ndim < 2 or x.shape[-2] < 2 or not x.is_floating_point() or not torch.isfinite(x).all():
        raise ValueError(f"x must be a finite float tensor of shape (..., L, d) with L >= 2, got {tuple(x.shape)}")
    lead, (L, d) = x.shape[:-2], x.shape[-2:]
    x, c = unit_scale(x.to(torch.float64).reshape(math.prod(lead), L, d))  # delta(c x) = c delta(x)
    sq = x.square().sum(-1)
    gram = torch.baddbmm(sq.unsqueeze(-1) + sq.unsqueeze(-2), x, x.mT, alpha=-2)
    gram.diagonal(dim1=-2, dim2=-1).fill_(torch.inf)
    slack = 8 * (d + 2) * torch.finfo(torch.float64).eps * sq.amax(-1)
    head, i, j = (gram <= (gram.amin((-2, -1)) + slack)[:, None, None]).nonzero(as_tuple=True)
    exact = torch.linalg.vector_norm(x[head, i] - x[head, j], dim=-1)
    out = x.new_full((x.shape[0],), torch.inf).scatter_reduce_(0, head, exact, "amin")
    return (out * c).reshape(lead)


def random_directions(mask, generator=None) -> torch.Tensor:
    """Independent unit vectors v_r, uniform on the sphere of each row's visible coordinates (Alg. 5).

    Normalised Gaussian draws; masked coordinates are 0. ``mask`` is a boolean (..., R, L) tensor with
    L >= 1 and a visible key in every row (ValueError naming the row otherwise: it has no unit vector).
    """
    visible = as_tensor("mask", mask)
    if visible.dtype != torch.bool or visible.ndim < 1:
        raise ValueError(f"mask must be a boolean tensor of shape (..., R, L), got {visible.dtype}")
    check_visible_rows("mask", check_keys("mask", visible))
    return kernels.unit_directions(visible, generator)


def finite_difference_gradient(logits, T: float, eps: float, mask=None, generator=None) -> torch.Tensor:
    """g_r = ||softmax((l_r + eps v_r) / T) - softmax(l_r / T)|| / eps per row (Algorithm 5).

    l_r is row r of ``logits`` (..., R, L), softmax runs over the visible keys only, and v_r comes from
    :func:`random_directions` with ``generator``. L >= 1, and every row must see a key (softmax over no
    key is undefined): ValueError naming ``mask`` and the row otherwise. The logit scale (raw q.k or the
    model's q.k / sqrt(d)) is whatever the caller passes.
    """
    l = as_tensor("logits", logits)
    if l.ndim < 2 or not l.is_floating_point():
        raise ValueError(f"logits must be a float tensor of shape (..., R, L) (one row: shape (1, L)), "
                         f"got shape {tuple(l.shape)}")
    check_keys("logits", l)
    T, eps = check_positive("T", T), check_positive("eps", eps)
    visible = _visible(mask, l)
    if mask is not None:
        check_visible_rows("mask", visible)
    if not (torch.isfinite(l) | ~visible).all():
        raise ValueError("logits must be finite at visible keys (NaN or inf found)")
    l = l.to(torch.float64)
    return kernels.fd_gradients(l, kernels.unit_directions(visible, generator), visible, [T], [eps])[0, 0]


def entropy(weights) -> torch.Tensor:
    """Shannon entropy -sum_i alpha_i log alpha_i of each row (natural log, 0 log 0 = 0), shape (..., R)."""
    w = Rows.of(weights).weights
    return -torch.special.xlogy(w, w).sum(-1)


def max_weight(weights) -> torch.Tensor:
    """max_i alpha_i of each row, shape (..., R)."""
    return Rows.of(weights).weights.amax(-1)
