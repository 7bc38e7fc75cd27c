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
two per head (exact), and multiplied by c: finite for every finite x. The underscore functions skip
validation; ``attn_utils.mathematics.algorithms`` validates once per layer and calls them.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from attn_utils.mathematics.rows import Rows, bool_view, unit_scale
from attn_utils.mathematics.theory import _compact, _sqrt_
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

# Temporaries of one row block hold about this many float64 numbers (8 MB each).
_BLOCK_ELEMENTS = 1 << 20
# The same for Algorithm 5, whose many passes over a block run fastest from the processor's cache (512 kB each).
_GRADIENT_BLOCK = 1 << 16
# Algorithm 5 takes the softmax of z + c v directly above this c = eps / T, and exp(c v) - 1 for expm1(c v) from
# _EXPM1 on (see _fd_gradients).
_DIRECT = 20.0
_EXPM1 = 1e-2
# The Gram form of ||a - s||^2 has rounding error <~ (d + 3) eps (||a||^2 + ||s||^2). Where the result is
# >= _CANCELLATION * ||s||^2 that is <~ 300 (d + 3) eps relative (1e-12 for d = 64, float64); smaller
# entries (a close to s) are recomputed as direct differences.
_CANCELLATION = 1e-2


# --- validation (see attn_utils.mathematics.rows) ---------------------------------------------------


def _weights(weights) -> torch.Tensor:
    """Float64 weights whose rows sum to one (the weights of :meth:`Rows.of`)."""
    return Rows.of(weights).weights


def _visible(mask, like: torch.Tensor) -> torch.Tensor:
    """The mask as a view of the shape of ``like``, on its device; None means every key is visible."""
    if mask is None:
        return torch.ones((), dtype=torch.bool, device=like.device).expand(like.shape)
    return bool_view("mask", mask, like.shape).to(like.device)


def _top_n_count(N, weights: torch.Tensor) -> int:
    L = weights.shape[-1]
    return check_int("N", N, low=1, high=L - 1)


# --- shared kernels (no validation) -----------------------------------------------------------------


def _row_blocks(visible: torch.Tensor, size: int | None = None):
    """Yield ``(rows, k)``: consecutive row slices, k = 1 + the last key that any row of the block sees (keys
    beyond are never needed; for a causal mask this halves the work), each block as long as its temporaries
    (leading dims x rows x k) hold at most ``size`` numbers (default _BLOCK_ELEMENTS; at least one row)."""
    size = _BLOCK_ELEMENTS if size is None else size
    *lead, R, L = visible.shape
    heads = math.prod(lead)
    if R == 0 or heads == 0:
        return
    seen = visible.reshape(heads, R, L).any(0)
    last = torch.where(seen.any(-1), L - seen.flip(-1).to(torch.int8).argmax(-1), 1).tolist()
    r0 = 0
    while r0 < R:
        k, r1 = last[r0], r0 + 1
        while r1 < R and heads * (r1 + 1 - r0) * max(k, last[r1]) <= size:
            k, r1 = max(k, last[r1]), r1 + 1
        yield slice(r0, r1), k
        r0 = r1


def _context(w: torch.Tensor, x: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """s = sum_{i in I_N} alpha_i x_i for every row."""
    return torch.where(selected, w, 0.0) @ x


def _key_distances(w: torch.Tensor, x: torch.Tensor, s: torch.Tensor, x2: torch.Tensor | None = None) -> torch.Tensor:
    """||alpha_i x_i - s_r|| for every row r and key i, shape (..., R, L); ``x2`` = the squared key norms
    (..., 1, L), when the caller has them already.

    Gram form ||a - s||^2 = alpha_i (alpha_i ||x_i||^2 - 2 <x_i, s>) + ||s||^2 with <x_i, s> from one
    matmul. Its rounding error is about d * eps * (||a||^2 + ||s||^2); where the result is below
    _CANCELLATION * ||s||^2 (a close to s) the entry is recomputed as a direct difference. That also
    catches every negative rounding result (if ||s|| = 0 the formula is alpha_i^2 ||x_i||^2 >= 0), so no clamp.
    """
    if x2 is None:
        x2 = x.square().sum(-1).unsqueeze(-2)
    s2 = s.square().sum(-1, keepdim=True)
    sq = torch.addcmul(s2, w, torch.addcmul(s @ x.mT, w, x2, value=-0.5), value=-2.0)
    close = sq < _CANCELLATION * s2
    if close.any():
        *lead, r, i = close.nonzero(as_tuple=True)
        xb = x.expand(*w.shape[:-2], *x.shape[-2:])
        diff = w[close].unsqueeze(-1) * xb[(*lead, i)] - s[(*lead, r)]
        sq[close] = diff.square().sum(-1)
    return sq.sqrt_()


def _distance_sum(w: torch.Tensor, x: torch.Tensor, visible: torch.Tensor, selected: torch.Tensor | None = None,
                  top: torch.Tensor | None = None, wsq: torch.Tensor | None = None, reach: torch.Tensor | None = None,
                  s: torch.Tensor | None = None, hidden: int = 0) -> torch.Tensor:
    """d-tilde, sum-of-norms reading: sum_{i visible, not in I} ||alpha_i x_i - s_r|| per row, s_r the context vector
    of the set I: ``selected`` (..., R, L), or ``top`` (..., R, N), the indices of its keys. When the caller has
    them: ``wsq`` = alpha_i^2 ||x_i||^2 (..., R, L) (it does not depend on the set), ``reach`` (..., R, 1), a bound on
    alpha_i ||x_i|| over the keys outside I (e.g. the N-th largest weight times the largest norm), the context
    vectors ``s`` (..., R, d), and ``hidden``: every key before it is visible in every row.

    The Gram form of :func:`_key_distances`, ||a - s||^2 = alpha_i^2 ||x_i||^2 - 2 alpha_i <x_i, s> + ||s||^2, with
    the same direct recomputation of the entries below _CANCELLATION * ||s||^2, needed only outside I. A row
    with reach <= 0.89 ||s|| has none: there ||a - s|| >= 0.11 ||s||, i.e. ||a - s||^2 >= 0.0121 ||s||^2, and the
    Gram form's rounding error (about 2 (d + 3) eps ||s||^2, since ||a|| <= ||s||) cannot bring it below 0.01 ||s||^2.
    """
    def chosen(index):  # the set on the rows ``index``, as a mask
        if selected is not None:
            return selected[index]
        return torch.zeros_like(visible[index]).scatter_(-1, top[index], True)

    if wsq is None:
        wsq = w * w * x.square().sum(-1).unsqueeze(-2)
    if s is None:
        s = _context(w, x, chosen(...))
    s2 = s.square().sum(-1, keepdim=True)
    sq = torch.addcmul(wsq, w, s @ x.mT, value=-2.0).add_(s2)
    suspect = (...,) if reach is None else (reach.square() > 0.89**2 * s2).squeeze(-1).nonzero(as_tuple=True)
    if reach is None or len(suspect[0]):
        close = (sq[suspect] < _CANCELLATION * s2[suspect]) & visible[suspect] & ~chosen(suspect)
        if close.any():
            *lead, i = close.nonzero(as_tuple=True)
            at = lead if reach is None else [t[lead[0]] for t in suspect]  # the entries' row indices in sq
            xb = x.expand(*w.shape[:-2], *x.shape[-2:])
            sq[(*at, i)] = (w[(*at, i)].unsqueeze(-1) * xb[(*at[:-1], i)] - s[tuple(at)]).square().sum(-1)
    if top is not None:
        sq.scatter_(-1, top, 0.0)
    else:
        sq.mul_(~selected)
    sq[..., hidden:].masked_fill_(~visible[..., hidden:], 0.0)
    return _sqrt_(sq).sum(-1)


def _lengths(visible: torch.Tensor) -> torch.Tensor:
    """L_r, the number of visible keys of each row."""
    return visible.sum(-1)


def _tied(ranked: torch.Tensor, valid: torch.Tensor, N: int) -> torch.Tensor:
    """The valid rows (L_r > N) where a tie straddles the top-N threshold: the (N + 1)-th largest score equals the
    N-th (``ranked``: each row's largest scores in decreasing order, at least N + 1 of them where a row has N + 1
    keys)."""
    if ranked.shape[-1] <= N:
        return torch.zeros_like(valid)
    return valid & (ranked[..., N] == ranked[..., N - 1])


def _select(scores: torch.Tensor, ranked: torch.Tensor, valid: torch.Tensor,
            N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-N set of each valid row (L_r > N): the keys whose score (the weight; -inf at masked keys) is at
    least the N-th largest, the lowest indices first among ties at that threshold. ``ranked`` as in :func:`_tied`.
    Other rows: every key whose score is at least the row's N-th largest (their visible keys, once intersected
    with the mask). Returns the set and the rows of :func:`_tied` (where it depends on the tie-breaking)."""
    threshold = ranked[..., N - 1 : N]
    selected = scores >= threshold
    tied = _tied(ranked, valid, N)
    if tied.any():  # keep the lowest indices
        above, at = scores[tied] > threshold[tied], scores[tied] == threshold[tied]
        need = N - above.sum(-1, keepdim=True)
        selected[tied] = above | (at & (at.cumsum(-1) <= need))
    return selected, tied


def _argsort(t: torch.Tensor) -> torch.Tensor:
    """t.argsort(-1) (order among ties: any); on the CPU through numpy's sort, two to six times faster than
    torch's."""
    if t.device.type != "cpu":
        return t.argsort(-1)
    return torch.from_numpy(np.argsort(t.contiguous().numpy(), axis=-1))


def _ranked(scores: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The m largest scores of each row (at most all of them) and their keys, in decreasing order: a partial sort
    (torch.topk) for a few, a full sort (:func:`_argsort`) for many. Order among ties: any."""
    m = min(m, scores.shape[-1])
    if 4 * m < scores.shape[-1]:
        return torch.topk(scores, m, dim=-1)
    order = _argsort(-scores)[..., :m]
    return scores.gather(-1, order), order


def _top_ns(w: torch.Tensor, visible: torch.Tensor, Ns, keys: bool = False) -> list[tuple]:
    """For each N of Ns (each <= L): the top-N set among visible keys (lowest index first among ties) and the rows
    with L_r > N; with ``keys`` also the set's keys (..., R, N) and the ranked weights (..., R, >= N + 1, the largest
    first: the (N + 1)-th bounds the weights outside the set). One sort serves every N."""
    scores = w.masked_fill(~visible, -torch.inf)
    ranked, order = _ranked(scores, max(Ns) + 1)
    lengths = _lengths(visible)
    out = []
    for N in Ns:
        valid = lengths > N
        selected, tied = _select(scores, ranked, valid, N)
        selected &= visible
        if not keys:
            out.append((selected, valid))
            continue
        top = order[..., :N]
        if tied.any():  # the lowest indices among the tied weights, not the order's
            top = top.clone()
            top[tied] = _compact(selected[tied], N)[0]
        out.append((selected, valid, top, ranked))
    return out


def _top_n(w: torch.Tensor, visible: torch.Tensor, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-N set among visible keys (lowest index first among ties) and the rows with L_r > N."""
    return _top_ns(w, visible, [N])[0]


def _distance_norm(w: torch.Tensor, x: torch.Tensor, selected: torch.Tensor, outside: torch.Tensor) -> torch.Tensor:
    """d-tilde, norm-of-sum reading: ||sum_{i in outside} (alpha_i x_i - s_r)|| per row."""
    total = (w * outside) @ x - outside.sum(-1, keepdim=True) * _context(w, x, selected)
    return torch.linalg.vector_norm(total, dim=-1)


def _cumulative_distance(w, x, selected, visible, reading: str) -> torch.Tensor:
    out = w.new_empty(w.shape[:-1])
    for rows, k in _row_blocks(visible):
        wb, sel, vis, xb = w[..., rows, :k], selected[..., rows, :k], visible[..., rows, :k], x[..., :k, :]
        if reading == "sum_of_norms":
            out[..., rows] = _distance_sum(wb, xb, vis, sel)
        else:
            out[..., rows] = _distance_norm(wb, xb, sel, vis & ~sel)
    return out


def _separability_rows(w, x, visible, top, valid, N: int, s=None, wsq=None, reach=None,
                       hidden: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """N_s / N, the radius r (NaN on invalid rows) and which of the set's keys ``top`` (..., R, N) are inside the
    ball (..., R, N), for rows w (..., R, L) of a block; optional as in :func:`_distance_sum`.

    The squared distances come from the Gram form with the direct recomputation of :func:`_key_distances` (outside
    the set only on the rows ``reach`` does not clear, see :func:`_distance_sum`). Square roots are taken of the
    smallest outside value (r) and of the set's N values only: fl(sqrt) is monotone, so min_i fl(sqrt(a_i)) =
    fl(sqrt(min_i a_i)) and the strict comparisons are those of the distances themselves."""
    if s is None:
        s = _weighted_sum(x, top, w.gather(-1, top))
    if wsq is None:
        wsq = w * w * x.square().sum(-1).unsqueeze(-2)
    s2 = s.square().sum(-1, keepdim=True)
    sq = torch.addcmul(wsq, w, s @ x.mT, value=-2.0).add_(s2)
    near = sq.gather(-1, top)  # the set's keys
    close = near < _CANCELLATION * s2
    if close.any():
        *lead, n = close.nonzero(as_tuple=True)
        i = top[(*lead, n)]
        xb = x.expand(*w.shape[:-2], *x.shape[-2:])
        near[close] = (w[(*lead, i)].unsqueeze(-1) * xb[(*lead[:-1], i)] - s[tuple(lead)]).square().sum(-1)
    suspect = (...,) if reach is None else (reach.square() > 0.89**2 * s2).squeeze(-1).nonzero(as_tuple=True)
    if reach is None or len(suspect[0]):
        chosen = torch.zeros_like(visible[suspect]).scatter_(-1, top[suspect], True)
        close = (sq[suspect] < _CANCELLATION * s2[suspect]) & visible[suspect] & ~chosen
        if close.any():
            *lead, i = close.nonzero(as_tuple=True)
            at = lead if reach is None else [t[lead[0]] for t in suspect]
            xb = x.expand(*w.shape[:-2], *x.shape[-2:])
            sq[(*at, i)] = (w[(*at, i)].unsqueeze(-1) * xb[(*at[:-1], i)] - s[tuple(at)]).square().sum(-1)
    sq.scatter_(-1, top, torch.inf)
    sq[..., hidden:].masked_fill_(~visible[..., hidden:], torch.inf)
    r = sq.amin(-1).sqrt_()
    inside = near.sqrt_() < r.unsqueeze(-1)
    ratio = inside.sum(-1, dtype=torch.float64) / N
    return ratio.masked_fill(~valid, torch.nan), r.masked_fill(~valid, torch.nan), inside


def _weighted_sum(x: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_n weights[..., r, n] x[..., keys[..., r, n], :] per row, shape (..., R, d); x (..., L, d), keys and
    weights (..., R, n). A weighted ``embedding_bag``: n vector additions per row, where a matmul with the
    zero-padded weights would take L."""
    lead = torch.broadcast_shapes(x.shape[:-2], keys.shape[:-2])
    L, d = x.shape[-2:]
    B, (R, n) = math.prod(lead), keys.shape[-2:]
    flat = x.expand(*lead, L, d).reshape(B * L, d)
    offsets = torch.arange(B, device=x.device).view(B, 1, 1) * L
    at = (keys.expand(*lead, R, n).reshape(B, R, n) + offsets).view(B * R, n)
    out = F.embedding_bag(at, flat, mode="sum", per_sample_weights=weights.expand(*lead, R, n).reshape(B * R, n))
    return out.view(*lead, R, d)


def _separability(w, x, top, visible, valid, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """N_s / N and r per row for the top-N sets ``top`` (..., R, N), block by block (an invalid row's keys may lie
    beyond its block's last visible key: they are clamped, its values are NaN anyway)."""
    ratio, radius = w.new_empty(w.shape[:-1]), w.new_empty(w.shape[:-1])
    for rows, k in _row_blocks(visible):
        ratio[..., rows], radius[..., rows], _ = _separability_rows(
            w[..., rows, :k], x[..., :k, :], visible[..., rows, :k], top[..., rows, :].clamp_max(k - 1),
            valid[..., rows], N)
    return ratio, radius


def _project(x: torch.Tensor, M: float) -> torch.Tensor:
    x = unit_scale(x, dims=1)[0]  # x / ||x|| is scale-free; the norm of x / c cannot overflow
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x.mul_(M).div_(torch.where(norm > 0, norm, 1.0))


def _draws(generator) -> torch.device:
    """Where random numbers are drawn: on the generator's device (the CPU for None, torch's default generator)."""
    return generator.device if generator is not None else torch.device("cpu")


def _directions(visible: torch.Tensor, generator) -> torch.Tensor:
    """Normalised standard normal draws, one per key (the masked keys' draws are set to 0, so that the seeded
    stream, and the book's directions, do not depend on the mask). Drawn where ``generator`` draws (the book's
    generators are CPU ones, so every device gets the same directions), then moved to the device of ``visible``."""
    z = torch.randn(visible.shape, generator=generator, dtype=torch.float64, device=_draws(generator))
    z = z.to(visible.device)
    z.masked_fill_(~visible, 0.0)
    return z / torch.linalg.vector_norm(z, dim=-1, keepdim=True)


def _expm1(y: torch.Tensor, c: float) -> torch.Tensor:
    """e^y - 1 for |y| <= c (y is overwritten). For c < _EXPM1 by its Taylor polynomial y + y^2/2! + ... + y^n/n!
    (Horner), cut where the remainder is below 2^-53 |y| (torch's expm1 is three times slower than exp); above, as
    exp(y) - 1, whose absolute error of about 1e-16 is below 1e-16 / (c |v_i - v_j|) of any difference
    D_i - D_j = e^{c v_i} - e^{c v_j} that Algorithm 5 forms."""
    if c >= _EXPM1:
        return y.exp_().sub_(1.0)
    n = 1
    while c**n / math.factorial(n + 1) >= 2.0**-53:  # the terms beyond y^n / n! sum to below 2^-53 |y|
        n += 1
    if n == 1:
        return y
    t = torch.mul(y, 1.0 / math.factorial(n)).add_(1.0 / math.factorial(n - 1))
    for m in range(n - 2, 0, -1):
        t.mul_(y).add_(1.0 / math.factorial(m))
    return t.mul_(y)


def _fd_gradients(logits, v, visible, Ts, epsilons) -> torch.Tensor:
    """g for every (T, eps) pair, shape (len(Ts), len(epsilons), ..., R).

    With z = l / T, p = softmax(z) (shared by all eps) and c = eps / T, the moved weights are
    softmax(z + c v) = p e^{c v} / <p, e^{c v}>. Writing D_i = e^{c v_i} - e^{c v_m}, m the row's largest logit
    (its largest weight at every T), and D-bar = <p, D>,

        softmax(z + c v) - p = p (D - D-bar) / (e^{c v_m} + D-bar),

    an exact identity without the cancellations of the direct difference (two nearly equal softmaxes lose about
    log10(|z| / (c |v|)) digits) and of D - D-bar at the largest weight (D_m = 0, so D-bar is a sum of small
    terms when p is nearly one-hot). D (from :func:`_expm1`) depends on c only: it is computed once for every
    (T, eps) with the same c. The form is used for c <= _DIRECT: there a weight p_i that underflows to 0 stands
    for a moved weight below e^{2c} 4.9e-324 < 1e-290, negligible. Larger c take the softmax of z + c v directly,
    and the difference at the largest logit from the others (minus their sum: both rows sum to one), which keeps
    nearly one-hot rows accurate. Masked logits are -inf and v is 0 there, so they stay out.
    """
    out = logits.new_empty((len(Ts), len(epsilons), *logits.shape[:-1]))
    pairs = {}  # c -> the (T, eps) indices with eps / T == c
    for a, T in enumerate(Ts):
        for b, eps in enumerate(epsilons):
            pairs.setdefault(eps / T, []).append((a, b))
    eps = torch.tensor(epsilons, dtype=logits.dtype, device=logits.device).view(-1, *(1,) * (logits.ndim - 1))
    for rows, k in _row_blocks(visible, _GRADIENT_BLOCK):
        lb = logits[..., rows, :k].masked_fill(~visible[..., rows, :k], -torch.inf)
        vb = v[..., rows, :k]
        top = lb.argmax(-1, keepdim=True)
        base = [torch.softmax(lb / T, dim=-1) for T in Ts]
        norm = lb.new_empty((len(Ts), len(epsilons), *lb.shape[:-1]))  # ||softmax(z + c v) - p|| (scale)
        scale = lb.new_ones((len(Ts), len(epsilons), *lb.shape[:-1], 1))  # e^{c v_m} + D-bar; 1 where direct
        moved, dbar = torch.empty_like(lb), lb.new_empty((*lb.shape[:-1], 1))
        for c, at in pairs.items():
            if c <= _DIRECT:
                D = _expm1(torch.mul(vb, c), c)
                Dm = D.gather(-1, top)
                D.sub_(Dm)
                for a, b in at:
                    torch.mul(base[a], D, out=moved)
                    torch.sum(moved, -1, keepdim=True, out=dbar)
                    torch.linalg.vector_norm(moved.addcmul_(base[a], dbar, value=-1.0), dim=-1, out=norm[a, b])
                    torch.add(Dm, 1.0, out=scale[a, b]).add_(dbar)
            else:  # at the largest logit the difference is minus the sum of the others (both rows sum to one)
                for a, b in at:
                    diff = torch.softmax(torch.add(lb / Ts[a], vb, alpha=c), dim=-1).sub_(base[a])
                    diff.scatter_(-1, top, 0.0).scatter_(-1, top, -diff.sum(-1, keepdim=True))
                    torch.linalg.vector_norm(diff, dim=-1, out=norm[a, b])
        out[..., rows] = norm / scale.squeeze(-1) / eps
    return out


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
    return _context(rows.weights, rows.x, bool_view("selected", selected, rows.weights.shape))


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
        scores = torch.rand(w.shape, generator=generator, dtype=torch.float64, device=_draws(generator)).to(w.device)
        scores.masked_fill_(~visible, -1.0)
        subset = torch.zeros_like(visible).scatter_(-1, torch.topk(scores, N, dim=-1).indices, True)
        total += _cumulative_distance(w, xs, subset & visible, visible, reading)
    return (total / n_samples * c.unsqueeze(-1)).masked_fill_(_lengths(visible) <= N, torch.nan)


def project_to_sphere(x, M: float = 1.0) -> torch.Tensor:
    """x_i -> M x_i / ||x_i||, the projection onto the sphere of radius M (Assumption 1, Algorithm 4).

    A zero vector stays zero (it has no direction).
    """
    M = check_positive("M", M)
    x = as_tensor("x", x)
    if x.ndim < 1 or not x.is_floating_point() or not torch.isfinite(x).all():
        raise ValueError(f"x must be a finite float tensor of shape (..., d), got shape {tuple(x.shape)}")
    return _project(x.to(torch.float64), M)


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
        xs, c = _project(xs, M), torch.ones_like(c)
    _, valid, top, _ = _top_ns(w, visible, [N], keys=True)[0]
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
    return _directions(visible, generator)


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
    return _fd_gradients(l, _directions(visible, generator), visible, [T], [eps])[0, 0]


def entropy(weights) -> torch.Tensor:
    """Shannon entropy -sum_i alpha_i log alpha_i of each row (natural log, 0 log 0 = 0), shape (..., R)."""
    w = Rows.of(weights).weights
    return -torch.special.xlogy(w, w).sum(-1)


def max_weight(weights) -> torch.Tensor:
    """max_i alpha_i of each row, shape (..., R)."""
    return Rows.of(weights).weights.amax(-1)
