"""The shared kernels of the mathematics: the computations behind the public functions, without any checks.

**Inputs are trusted; call through the public functions or Rows.of.** These functions are public to the package
(``metrics``, ``theory``, ``algorithms`` and ``beyond`` share them) but they validate nothing: they expect the
layout of :mod:`attn_utils.mathematics.rows` already checked (weights ``(..., R, L)`` in float64 with rows that
sum to one where a result needs it, vectors ``(..., L, d)``, boolean visibilities of the weights' shape), and
they neither copy nor convert their inputs. A caller outside the package uses the public API
(:mod:`attn_utils.mathematics`), which validates once and then calls these.

Their numerical conventions are those of the public functions that document them: the top-N set takes the lowest
indices among ties (``metrics.top_n_mask``); distances come from Gram forms with the entries close to cancellation
recomputed as direct differences (``metrics.cumulative_distance``); Theorem 1's fixed-set bound reads d_1 off the
lists of ``theory.farthest_keys``; Algorithm 5's differences use the identity of :func:`fd_gradients`.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from attn_utils.mathematics.rows import unit_scale

# --- sizes of the blocks ---------------------------------------------------------------------------------------------


# Temporaries of one row block hold about this many float64 numbers (8 MB each).
BLOCK_ELEMENTS = 1 << 20
# The same for Algorithm 5, whose many passes over a block run fastest from the processor's cache (512 kB each).
GRADIENT_BLOCK = 1 << 16
#: Rough number of tensor elements one chunk of (head, row) pairs may allocate per temporary (:func:`chunked`).
CHUNK_ELEMENTS = 1 << 22
# Algorithm 5 takes the softmax of z + c v directly above this c = eps / T, and exp(c v) - 1 for expm1(c v) from
# EXPM1 on (see fd_gradients).
DIRECT = 20.0
EXPM1 = 1e-2
# The Gram form of ||a - s||^2 has rounding error <~ (d + 3) eps (||a||^2 + ||s||^2). Where the result is
# >= CANCELLATION * ||s||^2 that is <~ 300 (d + 3) eps relative (1e-12 for d = 64, float64); smaller
# entries (a close to s) are recomputed as direct differences.
CANCELLATION = 1e-2


# --- blocks of rows and of heads -------------------------------------------------------------------------------------


def row_blocks(visible: torch.Tensor, size: int | None = None):
    """Yield ``(rows, k)``: consecutive row slices, k = 1 + the last key that any row of the block sees (keys
    beyond are never needed; for a causal mask this halves the work), each block as long as its temporaries
    (leading dims x rows x k) hold at most ``size`` numbers (default BLOCK_ELEMENTS; at least one row)."""
    size = BLOCK_ELEMENTS if size is None else size
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


def chunked(n_heads: int, n_rows: int, row_cost: int, fn: Callable[[slice, slice], object]):
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


# --- top-N sets ------------------------------------------------------------------------------------------------------


def compact(sel: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The indices of the (at most n) True entries of each row of ``sel`` (..., L), in increasing order,
    as (..., n), padded with the row's first index; and which entries are real. O(L) per row."""
    slot = torch.where(sel, sel.cumsum(-1) - 1, n)  # n: a scratch slot for the False entries
    keys = torch.arange(sel.shape[-1], device=sel.device).expand(sel.shape)
    idx = torch.zeros(*sel.shape[:-1], n + 1, dtype=torch.long, device=sel.device).scatter_(-1, slot, keys)[..., :n]
    real = torch.arange(n, device=sel.device) < sel.sum(-1, keepdim=True)
    return torch.where(real, idx, idx[..., :1]), real


def tied_rows(ranked: torch.Tensor, valid: torch.Tensor, N: int) -> torch.Tensor:
    """The valid rows (L_r > N) where a tie straddles the top-N threshold: the (N + 1)-th largest score equals the
    N-th (``ranked``: each row's largest scores in decreasing order, at least N + 1 of them where a row has N + 1
    keys)."""
    if ranked.shape[-1] <= N:
        return torch.zeros_like(valid)
    return valid & (ranked[..., N] == ranked[..., N - 1])


def select_top(scores: torch.Tensor, ranked: torch.Tensor, valid: torch.Tensor,
               N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-N set of each valid row (L_r > N): the keys whose score (the weight; -inf at masked keys) is at
    least the N-th largest, the lowest indices first among ties at that threshold. ``ranked`` as in :func:`tied_rows`.
    Other rows: every key whose score is at least the row's N-th largest (their visible keys, once intersected
    with the mask). Returns the set and the rows of :func:`tied_rows` (where it depends on the tie-breaking)."""
    threshold = ranked[..., N - 1 : N]
    selected = scores >= threshold
    tied = tied_rows(ranked, valid, N)
    if tied.any():  # keep the lowest indices
        above, at = scores[tied] > threshold[tied], scores[tied] == threshold[tied]
        need = N - above.sum(-1, keepdim=True)
        selected[tied] = above | (at & (at.cumsum(-1) <= need))
    return selected, tied


def argsort(t: torch.Tensor) -> torch.Tensor:
    """t.argsort(-1) (order among ties: any); on the CPU through numpy's sort, two to six times faster than
    torch's."""
    if t.device.type != "cpu":
        return t.argsort(-1)
    return torch.from_numpy(np.argsort(t.contiguous().numpy(), axis=-1))


def rank_scores(scores: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The m largest scores of each row (at most all of them) and their keys, in decreasing order: a partial sort
    (torch.topk) for a few, a full sort (:func:`argsort`) for many. Order among ties: any."""
    m = min(m, scores.shape[-1])
    if 4 * m < scores.shape[-1]:
        return torch.topk(scores, m, dim=-1)
    order = argsort(-scores)[..., :m]
    return scores.gather(-1, order), order


def top_sets(w: torch.Tensor, visible: torch.Tensor, Ns, keys: bool = False) -> list[tuple]:
    """For each N of Ns (each <= L): the top-N set among visible keys (lowest index first among ties) and the rows
    with L_r > N; with ``keys`` also the set's keys (..., R, N) and the ranked weights (..., R, >= N + 1, the largest
    first: the (N + 1)-th bounds the weights outside the set). One sort serves every N."""
    scores = w.masked_fill(~visible, -torch.inf)
    ranked, order = rank_scores(scores, max(Ns) + 1)
    lengths = visible.sum(-1)
    out = []
    for N in Ns:
        valid = lengths > N
        selected, tied = select_top(scores, ranked, valid, N)
        selected &= visible
        if not keys:
            out.append((selected, valid))
            continue
        top = order[..., :N]
        if tied.any():  # the lowest indices among the tied weights, not the order's
            top = top.clone()
            top[tied] = compact(selected[tied], N)[0]
        out.append((selected, valid, top, ranked))
    return out


# --- context vectors, distances and separability ---------------------------------------------------------------------


def sqrt0(t: torch.Tensor) -> torch.Tensor:
    """sqrt(max(t, 0)): the square root of a squared distance that rounding may have made slightly negative."""
    return t.clamp_min(0).sqrt()


def sqrt_(t: torch.Tensor) -> torch.Tensor:
    """t.sqrt_(), through numpy for a contiguous CPU tensor: the same correctly rounded IEEE square roots, about
    twice as fast as torch's float64 kernel on CPU."""
    if t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad:
        a = t.numpy()
        np.sqrt(a, out=a)
        return t
    return t.sqrt_()


def context_vectors(w: torch.Tensor, x: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """s = sum_{i in I_N} alpha_i x_i for every row."""
    return torch.where(selected, w, 0.0) @ x


def weighted_sum(x: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
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


def distance_sum(w: torch.Tensor, x: torch.Tensor, visible: torch.Tensor, selected: torch.Tensor | None = None,
                 top: torch.Tensor | None = None, wsq: torch.Tensor | None = None, reach: torch.Tensor | None = None,
                 s: torch.Tensor | None = None, hidden: int = 0) -> torch.Tensor:
    """d-tilde, sum-of-norms reading: sum_{i visible, not in I} ||alpha_i x_i - s_r|| per row, s_r the context vector
    of the set I: ``selected`` (..., R, L), or ``top`` (..., R, N), the indices of its keys. When the caller has
    them: ``wsq`` = alpha_i^2 ||x_i||^2 (..., R, L) (it does not depend on the set), ``reach`` (..., R, 1), a bound on
    alpha_i ||x_i|| over the keys outside I (e.g. the N-th largest weight times the largest norm), the context
    vectors ``s`` (..., R, d), and ``hidden``: every key before it is visible in every row.

    The Gram form ||a - s||^2 = alpha_i^2 ||x_i||^2 - 2 alpha_i <x_i, s> + ||s||^2 (<x_i, s> from one matmul), whose
    rounding error is about d eps (||a||^2 + ||s||^2): the entries below CANCELLATION * ||s||^2 (a close to s, which
    also catches every negative rounding result) are recomputed as direct differences, needed only outside I. A row
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
        s = context_vectors(w, x, chosen(...))
    s2 = s.square().sum(-1, keepdim=True)
    sq = torch.addcmul(wsq, w, s @ x.mT, value=-2.0).add_(s2)
    suspect = (...,) if reach is None else (reach.square() > 0.89**2 * s2).squeeze(-1).nonzero(as_tuple=True)
    if reach is None or len(suspect[0]):
        close = (sq[suspect] < CANCELLATION * s2[suspect]) & visible[suspect] & ~chosen(suspect)
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
    return sqrt_(sq).sum(-1)


def distance_norm(w: torch.Tensor, x: torch.Tensor, selected: torch.Tensor, outside: torch.Tensor) -> torch.Tensor:
    """d-tilde, norm-of-sum reading: ||sum_{i in outside} (alpha_i x_i - s_r)|| per row."""
    total = (w * outside) @ x - outside.sum(-1, keepdim=True) * context_vectors(w, x, selected)
    return torch.linalg.vector_norm(total, dim=-1)


def separability_rows(w, x, visible, top, valid, N: int, s=None, wsq=None, reach=None,
                      hidden: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """N_s / N, the radius r (NaN on invalid rows) and which of the set's keys ``top`` (..., R, N) are inside the
    ball (..., R, N), for rows w (..., R, L) of a block; optional as in :func:`distance_sum`.

    The squared distances come from the Gram form with the direct recomputation of :func:`distance_sum` (outside
    the set only on the rows ``reach`` does not clear). Square roots are taken of the
    smallest outside value (r) and of the set's N values only: fl(sqrt) is monotone, so min_i fl(sqrt(a_i)) =
    fl(sqrt(min_i a_i)) and the strict comparisons are those of the distances themselves."""
    if s is None:
        s = weighted_sum(x, top, w.gather(-1, top))
    if wsq is None:
        wsq = w * w * x.square().sum(-1).unsqueeze(-2)
    s2 = s.square().sum(-1, keepdim=True)
    sq = torch.addcmul(wsq, w, s @ x.mT, value=-2.0).add_(s2)
    near = sq.gather(-1, top)  # the set's keys
    close = near < CANCELLATION * s2
    if close.any():
        *lead, n = close.nonzero(as_tuple=True)
        i = top[(*lead, n)]
        xb = x.expand(*w.shape[:-2], *x.shape[-2:])
        near[close] = (w[(*lead, i)].unsqueeze(-1) * xb[(*lead[:-1], i)] - s[tuple(lead)]).square().sum(-1)
    suspect = (...,) if reach is None else (reach.square() > 0.89**2 * s2).squeeze(-1).nonzero(as_tuple=True)
    if reach is None or len(suspect[0]):
        chosen = torch.zeros_like(visible[suspect]).scatter_(-1, top[suspect], True)
        close = (sq[suspect] < CANCELLATION * s2[suspect]) & visible[suspect] & ~chosen
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


def project(x: torch.Tensor, M: float) -> torch.Tensor:
    """M x_i / ||x_i|| for every vector of x (..., d), zero vectors kept (``metrics.project_to_sphere``)."""
    x = unit_scale(x, dims=1)[0]  # x / ||x|| is scale-free; the norm of x / c cannot overflow
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x.mul_(M).div_(torch.where(norm > 0, norm, 1.0))


# --- Theorem 1 -------------------------------------------------------------------------------------------------------


#: Entries of the lists of ``theory.farthest_keys`` that :func:`max_cross_sq_distance` tries first.
FIRST = 4


def _best_candidates(far, a: int, m: int, h, j, ok_j, u) -> tuple[torch.Tensor, torch.Tensor]:
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


def max_cross_sq_distance(x, far, unit, heads, idx, valid, unsel) -> torch.Tensor:
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


def main_sum_terms(w: torch.Tensor, x: torch.Tensor, x2: torch.Tensor | None = None):
    """The N-independent terms of ``main_sum`` for rows w (b, r, L) (zero at masked keys) and keys x (b, L, d):
    alpha_i^2 |x_i|^2 and alpha_i <x_i, m> (b, r, L), and |m|^2 (b, r, 1), m = sum_j alpha_j x_j. ``x2``: the
    squared key norms (b, 1, L), when the caller has them."""
    m = w @ x
    if x2 is None:
        x2 = x.square().sum(-1).unsqueeze(-2)
    return w * w * x2, w * (m @ x.mT), m.square().sum(-1, keepdim=True)


def main_sum(wsq, wxm, mm, vis, lengths, N: int, hidden: int = 0) -> torch.Tensor:
    """E of ``theorem1_random_main_sum`` per row (b, r), from the terms of ``main_sum_terms`` (unchanged, so they
    serve several N) and the row lengths L_r (b, r, 1). With c = N / (L_r - 1):
    ||(1 + c) alpha_i x_i - c m||^2 = (1 + c)^2 alpha_i^2 |x_i|^2 - 2 c (1 + c) alpha_i <x_i, m> + c^2 |m|^2.
    ``hidden``: every key before it is visible in every row (so only the keys from there on are masked)."""
    zero = wsq.new_zeros(())
    L_r = lengths.to(wsq.dtype)
    c = torch.where(L_r > N, N / (L_r - 1).clamp_min(1), zero)
    t2 = torch.addcmul(c * c * mm, wsq, (1 + c).square()).addcmul_(wxm, c * (1 + c), value=-2.0).clamp_min_(0)
    t2[..., hidden:].masked_fill_(~vis[..., hidden:], 0)
    total = sqrt_(t2).sum(-1, keepdim=True)
    return torch.where(L_r > N, (L_r - N) / L_r * total, zero).squeeze(-1)


# --- Theorem 2 -------------------------------------------------------------------------------------------------------


def _leave_one_out(v: torch.Tensor) -> torch.Tensor:
    """sum_{j != i} v_j for every i, from prefix and suffix sums: no subtraction, so a dominant v_i
    does not wipe out the precision of the small remainder."""
    pad = torch.zeros_like(v[..., :1])
    before = torch.cat([pad, v[..., :-1]], -1).cumsum(-1)
    after = torch.cat([v[..., 1:], pad], -1).flip(-1).cumsum(-1).flip(-1)
    return before + after


def xi_values(w: torch.Tensor, sel: torch.Tensor, M: float, delta: torch.Tensor) -> torch.Tensor:
    """xi_i of ``theory.theorem2_xi`` at the selected keys ``sel`` (0 elsewhere): xi_i^2 = M^2 S_1^2 - (delta^2 / 2)
    (S_1^2 - S_2), S_1 and S_2 the sum and the sum of squares of the selected weights other than alpha_i."""
    zero = w.new_zeros(())
    ws = torch.where(sel, w, zero)
    s1 = _leave_one_out(ws)  # sum over I \ {i} of alpha_j
    s2 = _leave_one_out(ws * ws)  # ... of alpha_j^2
    cross = (s1 * s1 - s2).clamp_min(0)  # sum over j != k in I \ {i} of alpha_j alpha_k
    return torch.where(sel, sqrt0(M * M * s1 * s1 - delta * delta / 2 * cross), zero)


def theorem2_selected(ws: torch.Tensor, s: torch.Tensor, r: torch.Tensor, M: float,
                      delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper) of ``theorem2_bounds`` from the selected weights ``ws`` (..., n) alone (``s``: which entries
    are real; the others are 0), r and delta (..., 1)."""
    xi = xi_values(ws, s, M, delta)
    n = s.sum(-1).to(ws.dtype)
    lower = 1 - xi.sum(-1) / (n * r.squeeze(-1))
    tail = (xi - r).clamp_min_(0).square_().mul_(-1 / (2 * M * M)).exp_().masked_fill_(~s, 0)
    return lower, tail.sum(-1) / n


# --- Algorithm 5: random directions and finite differences -----------------------------------------------------------


def draw_device(generator) -> torch.device:
    """Where random numbers are drawn: on the generator's device (the CPU for None, torch's default generator)."""
    return generator.device if generator is not None else torch.device("cpu")


def unit_directions(visible: torch.Tensor, generator) -> torch.Tensor:
    """Normalised standard normal draws, one per key (the masked keys' draws are set to 0, so that the seeded
    stream, and the book's directions, do not depend on the mask). Drawn where ``generator`` draws (the book's
    generators are CPU ones, so every device gets the same directions), then moved to the device of ``visible``."""
    z = torch.randn(visible.shape, generator=generator, dtype=torch.float64, device=draw_device(generator))
    z = z.to(visible.device)
    z.masked_fill_(~visible, 0.0)
    return z / torch.linalg.vector_norm(z, dim=-1, keepdim=True)


def expm1(y: torch.Tensor, c: float) -> torch.Tensor:
    """e^y - 1 for |y| <= c (y is overwritten). For c < EXPM1 by its Taylor polynomial y + y^2/2! + ... + y^n/n!
    (Horner), cut where the remainder is below 2^-53 |y| (torch's expm1 is three times slower than exp); above, as
    exp(y) - 1, whose absolute error of about 1e-16 is below 1e-16 / (c |v_i - v_j|) of any difference
    D_i - D_j = e^{c v_i} - e^{c v_j} that Algorithm 5 forms."""
    if c >= EXPM1:
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


def fd_gradients(logits, v, visible, Ts, epsilons) -> torch.Tensor:
    """g for every (T, eps) pair, shape (len(Ts), len(epsilons), ..., R).

    With z = l / T, p = softmax(z) (shared by all eps) and c = eps / T, the moved weights are
    softmax(z + c v) = p e^{c v} / <p, e^{c v}>. Writing D_i = e^{c v_i} - e^{c v_m}, m the row's largest logit
    (its largest weight at every T), and D-bar = <p, D>,

        softmax(z + c v) - p = p (D - D-bar) / (e^{c v_m} + D-bar),

    an exact identity without the cancellations of the direct difference (two nearly equal softmaxes lose about
    log10(|z| / (c |v|)) digits) and of D - D-bar at the largest weight (D_m = 0, so D-bar is a sum of small
    terms when p is nearly one-hot). D (from :func:`expm1`) depends on c only: it is computed once for every
    (T, eps) with the same c. The form is used for c <= DIRECT: there a weight p_i that underflows to 0 stands
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
    for rows, k in row_blocks(visible, GRADIENT_BLOCK):
        lb = logits[..., rows, :k].masked_fill(~visible[..., rows, :k], -torch.inf)
        vb = v[..., rows, :k]
        top = lb.argmax(-1, keepdim=True)
        base = [torch.softmax(lb / T, dim=-1) for T in Ts]
        norm = lb.new_empty((len(Ts), len(epsilons), *lb.shape[:-1]))  # ||softmax(z + c v) - p|| (scale)
        scale = lb.new_ones((len(Ts), len(epsilons), *lb.shape[:-1], 1))  # e^{c v_m} + D-bar; 1 where direct
        moved, dbar = torch.empty_like(lb), lb.new_empty((*lb.shape[:-1], 1))
        for c, at in pairs.items():
            if c <= DIRECT:
                D = expm1(torch.mul(vb, c), c)
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


