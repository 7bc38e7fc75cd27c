"""The paper's Algorithms 1-5 (arXiv 2508.17821, appendix B), vectorised over heads and rows.

Inputs are one model's attention for one text: ``weights`` or ``logits`` of shape (layers, heads, L, L)
and vectors ``x`` of shape (layers, heads, L, d) (by project policy the per-head value vectors). Any
float dtype is accepted; each layer is cast to float64 on its own, so float32 storage halves the
memory and the arithmetic stays in float64. ``mask`` defaults to the causal mask (row t, 0-based,
sees keys 0..t); a boolean mask that broadcasts to (layers, heads, L, L), e.g. (L, L), may be given instead.
The shapes are checked up front by :meth:`Rows.of` without a copy, each layer's values when it is read. The
window is the data: for a shorter one pass its leading L x L block (and the first L vectors).

Each function processes one layer at a time and the rows in blocks (``kernels.row_blocks``), then
averages per-row quantities over the *valid* rows of each head: rows that see more than N keys
(L_r > N; the causal convention is ours, see book/sources.md). Results are tidy ``pandas`` DataFrames with
one row per (grid value, layer, head). ``progress=False`` silences the tqdm bar over layers.

Query-row sampling (Algorithms 1-3). The paper averages over every query row t. With
``rows_per_octave=K`` the distance algorithms average instead over the rows of ``sample_rows(L, K)``
for each length L: every row of an octave [2^o, 2^(o+1)) of positions that holds at most K rows, K evenly
spread rows of a larger octave, each weighted by the number of rows of its octave it stands for, so the
head means are weighted means over the sampled valid rows (an estimate of the full means whose cost grows
like K L instead of L^2). ``rows_per_octave=None`` (the default) evaluates every row, exactly as
the paper does; so does any K at least as large as the last octave (L / 2 rows).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
from scipy.stats import ks_2samp
from tqdm.auto import tqdm

from attn_utils.mathematics import kernels, metrics, theory
from attn_utils.mathematics.normalizers import causal_mask
from attn_utils.mathematics.rows import Rows, unit_scale
from attn_utils.mathematics.validation import check_choice, check_int, check_positive

__all__ = [
    "CriticalN",
    "GradientSensitivity",
    "critical_n",
    "distance_vs_length",
    "distance_vs_n",
    "gradient_sensitivity",
    "octave_blocks",
    "sample_rows",
    "separability_vs_n",
    "theorem1_row_check",
]


class CriticalN(NamedTuple):
    """Algorithm 3's output: one KS test per (L, N), and the critical N per L."""

    tests: pd.DataFrame
    summary: pd.DataFrame


class GradientSensitivity(NamedTuple):
    """Algorithm 5's output: mean g per (T, eps, layer, head), and the max over heads per (T, eps)."""

    heads: pd.DataFrame
    summary: pd.DataFrame


# Rows of a block of ``_distance_rows`` x their keys, summed over heads: small enough for the temporaries to stay
# in the processor's cache (4 MB each), large enough that the per-block work of Python stays small.
_DISTANCE_BLOCK = 1 << 19


# --- input handling ---------------------------------------------------------------------------------


def _inputs(name: str, weights, x=None, mask=None) -> Rows:
    """One model's attention ``weights`` (or logits) (layers, heads, L, L), its vectors ``x`` (layers, heads, L, d) and
    the visibility (``mask`` broadcastable to the weights; None: the causal mask), their shapes checked by
    :meth:`Rows.of` without a copy: each layer's values are checked in float64 when it is read (:func:`_layer`)."""
    rows = Rows.of(weights, x, mask, name=name, lead=("layers", "heads"), square=True, values=False)
    if mask is None:
        causal = causal_mask(rows.weights.shape[-1], device=rows.weights.device).expand(rows.weights.shape)
        rows = replace(rows, visible=causal, masked=True)
    return rows


def _grid(name: str, values, low: int, high: int) -> list[int]:
    values = [check_int(name, v, low=low, high=high) for v in values]
    if not values:
        raise ValueError(f"{name} must hold at least one value")
    return sorted(set(values))


def _layer(weights: torch.Tensor, x: torch.Tensor, visible: torch.Tensor, layer: int, L: int, rows=None,
           renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer ``layer`` cut to its leading L keys and rows (or to the query rows ``rows``), in float64, validated
    (rows summing to one); x cut to L keys; ``visible`` (the layer's (heads, L_all, L_all) mask) cut the same way.
    With ``renormalize`` the weights of masked keys are set to 0 and every row is divided by its sum (in float64,
    after the check)."""
    rows = slice(None, L) if rows is None else rows
    checked = Rows.of(weights[layer, :, rows, :L], x[layer, :, :L])  # validated once per layer, in float64
    w, vis = checked.weights, visible[:, rows, :L]
    if renormalize:
        w = torch.where(vis, w, 0.0)
        total = w.sum(-1, keepdim=True)
        w = w / torch.where(total > 0, total, 1.0)
    return w, checked.x, vis


def _each_layer(fn, n_layers: int, desc: str, progress: bool) -> list:
    """[fn(layer) for every layer], the layers spread over torch.get_num_threads() threads that each compute with
    one torch thread: the layers are independent, and whole layers in parallel keep every core busy where the
    threads of one operation would wait for each other (and spin against the other processes of a shared machine).
    torch's thread count is restored afterwards."""
    threads = torch.get_num_threads()
    workers = min(threads, n_layers)
    bar = tqdm(total=n_layers, desc=desc, disable=not progress)

    def run(layer: int):
        result = fn(layer)
        bar.update()
        return result

    if workers <= 1:
        try:
            return [run(layer) for layer in range(n_layers)]
        finally:
            bar.close()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(run, range(n_layers)))
    finally:
        torch.set_num_threads(threads)
        bar.close()


def _frame(layer: int, grid: dict, values: dict) -> dict[str, np.ndarray]:
    """Columns for one row per head: the layer, the head, the grid values and the per-head ``values``."""
    heads = len(next(iter(values.values())))
    return {"layer": np.full(heads, layer), "head": np.arange(heads),
            **{k: np.full(heads, v) for k, v in grid.items()},
            **{k: np.asarray(v.cpu() if torch.is_tensor(v) else v, dtype=float) for k, v in values.items()}}


def _concat(frames: list[dict], order: list[str]) -> pd.DataFrame:
    """One DataFrame from the columns of ``frames``, sorted by ``order``, layer and head."""
    table = pd.DataFrame({k: np.concatenate([f[k] for f in frames]) for k in frames[0]})
    return table.sort_values(order + ["layer", "head"], ignore_index=True)


class _RowMeans:
    """Per-head sums and counts of per-row quantities over valid rows, block by block."""

    def __init__(self, heads: int, names: tuple[str, ...], device=None):
        self.sums = {n: torch.zeros(heads, dtype=torch.float64, device=device) for n in names}
        self.counts = {n: torch.zeros(heads, dtype=torch.float64, device=device) for n in names}

    def add(self, name: str, values: torch.Tensor, valid: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        """Add the valid rows of ``values`` (heads, R); ``weight`` (R,): how many rows each one stands for."""
        if weight is None:
            self.sums[name] += torch.where(valid, values, 0.0).sum(-1)
            self.counts[name] += valid.sum(-1)
        else:
            weight = torch.where(valid, weight, 0.0)
            self.sums[name] += (torch.where(valid, values, 0.0) * weight).sum(-1)
            self.counts[name] += weight.sum(-1)

    def means(self) -> dict[str, torch.Tensor]:
        return {n: self.sums[n] / self.counts[n] for n in self.sums}  # 0 / 0 = NaN: no valid row


# --- Algorithms 1-3: distances ------------------------------------------------------------------------


def _distance_rows(w, xs, visible, need: dict, reading: str, farthest=None, expectation: bool = True) -> dict:
    """Per-row quantities of Algorithms 1-3 for one layer: w (heads, R, L) (zero at masked keys), xs (heads, L, d),
    visible (heads, R, L); ``need`` = {N: (R,) bool numpy array, the rows wanted at that N}. For each N: d-tilde
    (``reading``), the main sum E of Theorem 1 and, when ``farthest`` (``theory.farthest_keys(xs)``) is given, the
    fixed-set bound (E is left out without ``expectation``). Returns {N: ({name: (heads, R)}, valid)}, valid
    (heads, R) = wanted and L_r > N (the other entries are 0).

    Per block of rows, once: the keys in decreasing order of weight (numpy's sort) and the terms of E. At each N,
    in increasing order: the context vectors, by adding to those of the previous N the keys ranked between
    (``embedding_bag``: a weighted sum of N keys costs N, not L, vector additions), and the other quantities on
    the block's rows from the first one that is wanted and sees more than N keys to the last wanted one."""
    heads, R, L = w.shape
    names = ("distance",) + (("expectation",) if expectation else ()) + (("bound",) if farthest is not None else ())
    out = {N: ({n: w.new_zeros(heads, R) for n in names}, torch.zeros(heads, R, dtype=torch.bool, device=w.device))
           for N in need}
    lengths = visible.sum(-1, keepdim=True)  # (heads, R, 1)
    longest_row = lengths.amax(0).squeeze(-1).cpu().numpy()  # (R,): the most keys any head's row sees
    x2 = xs.square().sum(-1).unsqueeze(-2)
    longest = x2.amax(-1, keepdim=True).sqrt()  # (heads, 1, 1): the largest norm
    if farthest is not None:
        xu, unit = unit_scale(xs)  # the bound is computed on x / c per head (see theory.theorem1_fixed_bound)
        norms = xu.norm(dim=-1)
    for rows, k in kernels.row_blocks(visible, _DISTANCE_BLOCK):
        wanted = {N: need[N][rows] & (longest_row[rows] > N) for N in need if N < k}
        live = sorted(N for N, keep in wanted.items() if keep.any())
        if not live:
            continue
        wb, vb, xb, lb = w[:, rows, :k], visible[:, rows, :k], xs[:, :k], lengths[:, rows]
        r = wb.shape[1]
        scores = wb.masked_fill(~vb, -torch.inf)
        ranked, order = kernels.rank_scores(scores, live[-1] + 1)
        hidden = int(vb.all(0).all(0).logical_not().nonzero()[0]) if not vb.all() else k  # keys before: all visible
        if expectation:
            wsq, wxm, mm = kernels.main_sum_terms(wb, xb, x2[..., :k])
        else:
            wsq = wb * wb * x2[..., :k]
        context, done = wb.new_zeros(heads, r, xs.shape[-1]), 0  # sum of the keys ranked < done
        for N in live:
            band = order[..., done:N]
            context += kernels.weighted_sum(xs, band, wb.gather(-1, band))  # xs: contiguous, no copy
            done = N
            at = np.flatnonzero(wanted[N])
            rs = slice(int(at[0]), int(at[-1]) + 1)  # block rows rs.start.. are rows rows.start + rs.start..
            sw, sv, sl = wb[:, rs], vb[:, rs], lb[:, rs]
            valid = (sl.squeeze(-1) > N) & torch.from_numpy(need[N][rows][rs]).to(sl.device)
            top, s = _top_set(scores[:, rs], ranked[:, rs], order[:, rs], context[:, rs], sw, xb, valid, N)
            sel, keys = None, top
            if farthest is not None or reading != "sum_of_norms" or 8 * N > k:  # the set as a mask
                sel = torch.zeros_like(sv).scatter_(-1, top, True)
                top = None
            if reading == "sum_of_norms":  # alpha_i <= the N-th largest weight outside the set
                dist = kernels.distance_sum(sw, xb, sv, sel, top, wsq[:, rs], ranked[:, rs, N - 1 : N] * longest, s,
                                             hidden)
            else:
                dist = kernels.distance_norm(sw, xb, sel, sv & ~sel)
            values = {"distance": dist}
            if expectation:
                values["expectation"] = kernels.main_sum(wsq[:, rs], wxm[:, rs], mm[:, rs], sv, sl, N, hidden)
            if farthest is not None:
                values["bound"] = _fixed_bound(sw, sel, sv & ~sel, valid, keys, ranked[:, rs], N, xu, unit, norms,
                                               farthest)
            target = slice(rows.start + rs.start, rows.start + rs.stop)
            table, ok = out[N]
            for name, value in values.items():
                table[name][:, target] = torch.where(valid, value, 0.0)
            ok[:, target] = valid
    return out


def _top_set(scores, ranked, order, context, w, x, valid, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-N set of each row of a block (heads, r, k) as its keys (heads, r, N), and its context vectors: the
    first N keys of ``order`` (the keys by decreasing score, ``ranked`` their scores) and ``context`` (their
    weighted sum of x), except on the valid rows where a tie straddles the threshold (``kernels.tied_rows``): there
    the lowest indices among the tied keys (``kernels.select_top``), summed directly."""
    top, s = order[..., :N], context
    tied = kernels.tied_rows(ranked, valid, N)
    if tied.any():
        sel = kernels.select_top(scores[tied], ranked[tied], valid[tied], N)[0]
        top, s = top.clone(), s.clone()
        top[tied] = kernels.compact(sel, N)[0]
        s[tied] = (torch.where(sel, w[tied], 0.0).unsqueeze(-2) @ x[tied.nonzero()[:, 0]]).squeeze(-2)
    return top, s


def _fixed_bound(w, sel, outside, valid, keys, ranked, N: int, xu, unit, norms, farthest) -> torch.Tensor:
    """Theorem 1's fixed-set bound (``theory.theorem1_fixed_bound``) of the valid rows of a block of top-N sets:
    w, sel, outside (heads, r, k); ``keys`` (heads, r, N) the sets' keys; ``ranked`` (heads, r, >= N) each row's
    largest weights, in decreasing order;
    xu (heads, L, d) the vectors divided by their powers of two ``unit`` (heads,), ``norms`` their norms (heads, L);
    ``farthest`` the lists of xs. 0 on the other rows."""
    b, r = valid.nonzero(as_tuple=True)
    idx = keys[b, r]  # (P, N)
    unsel = outside[b, r]
    d1 = kernels.sqrt0(kernels.max_cross_sq_distance(xu, farthest, unit, b, idx, torch.ones_like(idx, dtype=torch.bool),
                                                     unsel))
    abar = ranked[b, r, :N].sum(-1)
    rest = torch.where(unsel, w[b, r], 0.0).sum(-1)
    m_sel = norms[b].gather(-1, idx).amax(-1)
    bound = w.new_zeros(valid.shape)
    bound[b, r] = (rest * d1 + m_sel * (abar * unsel.sum(-1) - rest)) * unit[b]
    return bound


def _row_weights(pairs, samples, union: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """For each (L, N) of ``pairs``: the weight (R,) of each row of ``union`` in the head means at L (the rows of
    ``samples[L]`` with their weights, 0 elsewhere)."""
    out = {}
    for L, N in pairs:
        rows, weight = samples[L]
        out[L, N] = np.zeros(len(union))
        out[L, N][np.searchsorted(union, rows)] = weight
    return out


def _distance_table(inputs: Rows, pairs, reading, with_bound, progress, desc, rows_per_octave) -> pd.DataFrame:
    """Algorithms 1-3: per (L, N) of ``pairs`` and per head, the means over the valid rows of length L (every row,
    or the rows of ``sample_rows(L, rows_per_octave)`` weighted) of d-tilde, E and (``with_bound``) the bound.

    Row t of the leading L x L block equals row t of the whole window cut to L keys whenever it sees no key >= L
    (always with the causal mask): then every length reads the same per-row values, computed once per N over the
    rows that some length needs. Otherwise (a mask that shows row t a key >= L) each length is computed apart."""
    check_choice("reading", reading, metrics.READINGS)
    if rows_per_octave is not None:
        rows_per_octave = check_int("rows_per_octave", rows_per_octave, low=1)
    weights, x, visible_all = inputs.weights, inputs.x, inputs.visible
    lengths = sorted({L for L, _ in pairs})
    samples = {L: sample_rows(L, rows_per_octave) for L in lengths}
    union = np.unique(np.concatenate([r for r, _ in samples.values()]))
    at = torch.as_tensor(union, device=weights.device)
    row_weight_np = _row_weights(pairs, samples, union)
    row_weight = {pair: torch.as_tensor(w, device=weights.device) for pair, w in row_weight_np.items()}
    # whether any row t of some length L sees a key >= L (then that length's rows differ from the full window's)
    beyond = torch.zeros(len(union), lengths[-1], dtype=torch.bool, device=weights.device)
    for L in lengths:
        beyond[union < L, L:] = True

    def layer_frames(layer: int) -> list[dict]:
        w, xs, visible = _layer(weights, x, visible_all[layer], layer, lengths[-1], at)
        farthest = theory.farthest_keys(xs, prefixes=lengths) if with_bound else None
        if not (visible & beyond).any():
            groups = [(pairs, w, xs, visible, farthest)]
        else:
            groups = []
            for L in lengths:
                wl, xl, vl = _layer(weights, x, visible_all[layer], layer, L, at[union < L])
                wl = torch.cat([wl, wl.new_zeros(wl.shape[0], len(union) - wl.shape[1], L)], 1)
                vl = torch.cat([vl, vl.new_zeros(vl.shape[0], len(union) - vl.shape[1], L)], 1)
                groups.append(([(L_, N) for L_, N in pairs if L_ == L], wl, xl, vl,
                               farthest.prefix(L) if with_bound else None))
        frames = []
        for group, wg, xg, vg, far in groups:
            need = {}
            for L, N in group:
                need[N] = need.get(N, np.zeros(len(union), dtype=bool)) | (row_weight_np[L, N] > 0)
            per_row = _distance_rows(wg, xg, vg, need, reading, far)
            for L, N in group:
                values, valid = per_row[N]
                weight = torch.where(valid, row_weight[L, N], 0.0)
                frames.append(_frame(layer, {"L": L, "N": N},
                                     {name: (v * weight).sum(-1) / weight.sum(-1) for name, v in values.items()}))
        return frames

    frames = [f for layer in _each_layer(layer_frames, weights.shape[0], desc, progress) for f in layer]
    return _concat(frames, ["L", "N"])


def distance_vs_length(weights, x, N: int = 5, lengths=(32, 64, 128, 256, 512, 1024), mask=None,
                       reading: str = "sum_of_norms", progress: bool = True,
                       rows_per_octave: int | None = None) -> pd.DataFrame:
    """Algorithm 1 (Fig. 2a): distance statistics at fixed N for growing context length L.

    For each L the leading L x L block of each head is used: with a causal mask the first L rows see
    only the first L keys, so the block is exactly the attention of the L-token prefix (with another
    mask it is not, and its rows no longer sum to one, which raises ValueError). Columns: layer, head,
    L, N, ``distance`` (mean d-tilde, Eq. (7), ``metrics.cumulative_distance``), ``expectation`` (mean
    main sum E of Theorem 1's random part, ``theory.theorem1_random_main_sum``), ``bound`` (mean
    Theorem 1 fixed-set bound, ``theory.theorem1_fixed_bound``). E and the bound are derived for the
    sum-of-norms reading; for ``reading="norm_of_sum"`` the bound still holds, E is not a lower bound.
    Each row is renormalised in float64 before it is measured (attention stored in float32 sums to one
    only up to ~1e-7). ``rows_per_octave``: None averages over every query row; an integer K averages
    over the rows of ``sample_rows(L, K)`` of each L, weighted (see the module docstring).
    """
    inputs = _inputs("weights", weights, x, mask)
    lengths = _grid("lengths", lengths, low=2, high=inputs.weights.shape[-1])
    N = check_int("N", N, low=1, high=min(lengths) - 1)
    return _distance_table(inputs, [(L, N) for L in lengths], reading, True, progress, "Algorithm 1", rows_per_octave)


def distance_vs_n(weights, x, Ns=(1, 5, 10, 20, 100), mask=None, reading: str = "sum_of_norms",
                  progress: bool = True, rows_per_octave: int | None = None) -> pd.DataFrame:
    """Algorithm 2 (Fig. 2b): distance statistics at the window's length L (all its keys; pass the leading
    L x L block for a shorter one) for growing N.

    Same columns and conventions (renormalised rows, ``rows_per_octave``) as :func:`distance_vs_length`;
    every N must satisfy 1 <= N <= L - 1.
    """
    inputs = _inputs("weights", weights, x, mask)
    L = inputs.weights.shape[-1]
    Ns = _grid("N", Ns, low=1, high=L - 1)
    return _distance_table(inputs, [(L, N) for N in Ns], reading, True, progress, "Algorithm 2", rows_per_octave)


def critical_n(weights, x, lengths, Ns, alpha: float = 0.01, mask=None, reading: str = "sum_of_norms",
               progress: bool = True, rows_per_octave: int | None = None) -> CriticalN:
    """Algorithm 3 (Fig. 2c): the critical top-N per context length L, by a two-sample KS test.

    For each L and each N < L of the grid, the per-(layer, head) means d-bar and E-bar (as in
    Algorithm 1, over the leading L x L block) form two samples of layers x heads values, compared by
    ``scipy.stats.ks_2samp``. The critical N of L is the smallest N of the grid whose test does not
    reject equality at level alpha (p > alpha); -1 if every test rejects. The paper's text and Fig. 2
    use alpha = 0.01, its pseudocode 0.05 (book/sources.md); the default follows the text. Pairs with
    N >= L are skipped. ``Ns`` may also be a function of L returning that length's grid (e.g. sizes
    proportional to L). ``rows_per_octave`` as in :func:`distance_vs_length`.

    Returns ``CriticalN(tests, summary)``: ``tests`` has columns L, N, statistic, pvalue, reject;
    ``summary`` has L, critical_n, critical_fraction (= critical_n / L, NaN when -1).
    """
    inputs = _inputs("weights", weights, x, mask)
    alpha = check_positive("alpha", alpha)
    if alpha >= 1:
        raise ValueError(f"alpha must be a significance level in (0, 1), got {alpha}")
    lengths = _grid("lengths", lengths, low=2, high=inputs.weights.shape[-1])
    grids = {L: _grid("Ns", Ns(L) if callable(Ns) else Ns, low=1, high=None) for L in lengths}
    pairs = [(L, N) for L in lengths for N in grids[L] if N < L]
    if not pairs:
        raise ValueError("Ns must hold at least one N smaller than some length of lengths")
    means = _distance_table(inputs, pairs, reading, False, progress, "Algorithm 3", rows_per_octave)
    tests = []
    for (L, N), group in means.groupby(["L", "N"], sort=True):
        result = ks_2samp(group["distance"].to_numpy(), group["expectation"].to_numpy())
        tests.append({"L": L, "N": N, "statistic": result.statistic, "pvalue": result.pvalue,
                      "reject": bool(result.pvalue <= alpha)})
    tests = pd.DataFrame(tests)
    summary = []
    for L, group in tests.groupby("L", sort=True):
        accepted = group.loc[~group["reject"], "N"]
        crit = int(accepted.iloc[0]) if len(accepted) else -1
        summary.append({"L": L, "critical_n": crit, "critical_fraction": crit / L if crit > 0 else np.nan})
    return CriticalN(tests, pd.DataFrame(summary))


def theorem1_row_check(weights, x, Ns, tol: float = 1e-9, mask=None, reading: str = "sum_of_norms",
                       progress: bool = True, rows_per_octave: int | None = None) -> dict:
    """Theorem 1 (fixed set) row by row at the full length: for every N of ``Ns`` and every query row (or the rows
    of ``sample_rows(L, rows_per_octave)``) of every head that sees more than N keys, rows renormalised in
    float64 as in :func:`distance_vs_length`, whether d-tilde exceeds the bound ``theory.theorem1_fixed_bound`` of
    its top-N set by more than ``tol``: d > bound (1 + tol) + tol. Returns ``{"checked": rows checked,
    "violations": their number, "largest_ratio": the largest d / bound over the rows with bound > 0}``.
    """
    inputs = _inputs("weights", weights, x, mask)
    weights, x, visible_all = inputs.weights, inputs.x, inputs.visible
    check_choice("reading", reading, metrics.READINGS)
    tol = float(tol)
    if not tol >= 0:
        raise ValueError(f"tol must be a number >= 0, got {tol!r}")
    if rows_per_octave is not None:
        rows_per_octave = check_int("rows_per_octave", rows_per_octave, low=1)
    L = weights.shape[-1]
    Ns = _grid("Ns", Ns, low=1, high=L - 1)
    rows = torch.as_tensor(sample_rows(L, rows_per_octave)[0], device=weights.device)
    need = {N: np.ones(len(rows), dtype=bool) for N in Ns}

    def layer_counts(layer: int) -> tuple[int, int, float]:
        w, xs, visible = _layer(weights, x, visible_all[layer], layer, L, rows)
        per_row = _distance_rows(w, xs, visible, need, reading, theory.farthest_keys(xs), expectation=False)
        checked = violations = 0
        largest = 0.0
        for values, valid in per_row.values():
            d, bound = values["distance"][valid], values["bound"][valid]
            checked += int(valid.sum())
            violations += int((d > bound * (1 + tol) + tol).sum())
            if (bound > 0).any():
                largest = max(largest, float((d[bound > 0] / bound[bound > 0]).max()))
        return checked, violations, largest

    counts = _each_layer(layer_counts, weights.shape[0], "Theorem 1 rows", progress)
    return {"checked": sum(c[0] for c in counts), "violations": sum(c[1] for c in counts),
            "largest_ratio": max(c[2] for c in counts)}


# --- Algorithm 4: separability --------------------------------------------------------------------------


def separability_vs_n(weights, x, Ns=(1, 2, 4, 8, 16, 32, 64, 100), M: float = 1.0, mask=None,
                      progress: bool = True) -> pd.DataFrame:
    """Algorithm 4 (Fig. 3): separability N_s / N and the bounds of Theorem 2, for growing N, at the window's
    length L (all its keys; pass the leading L x L block for a shorter one).

    Per layer the head's vectors are projected onto the sphere of radius M
    (Assumption 1) and delta is their minimum pairwise distance (Assumption 2, per head). Per row:
    r = min_{i not in I_N} ||s - alpha_i x_i|| and N_s / N from ``metrics.separability`` (strict count,
    see there); lower and upper bounds from ``theory.theorem2_bounds``. Columns: layer, head, L, N,
    ``separability``, ``lower``, ``upper`` (means over valid rows; rows with r = 0 have no bounds and
    are left out of those two means), ``delta``.
    """
    inputs = _inputs("weights", weights, x, mask)
    weights, x, visible_all = inputs.weights, inputs.x, inputs.visible
    M = check_positive("M", M)
    L = weights.shape[-1]
    Ns = _grid("N", Ns, low=1, high=L - 1)

    def layer_frames(layer: int) -> list[dict]:
        w, xs, visible = _layer(weights, x, visible_all[layer], layer, L, renormalize=False)
        xs = kernels.project(xs, M).contiguous()
        delta = metrics.min_pairwise_distance(xs).unsqueeze(-1)
        longest = xs.norm(dim=-1).amax(-1).view(-1, 1, 1)  # M, or 0 for a head of zero vectors
        acc = {N: _RowMeans(w.shape[0], ("separability", "lower", "upper"), w.device) for N in Ns}
        for rows, k in kernels.row_blocks(visible, _DISTANCE_BLOCK):
            live = [N for N in Ns if N < k]  # the others: every row of the block sees <= N keys
            if not live:
                continue
            wb, vb, xb = w[:, rows, :k], visible[:, rows, :k], xs[:, :k]
            hidden = int(vb.all(0).all(0).logical_not().nonzero()[0]) if not vb.all() else k  # before: all visible
            wsq = wb * wb * xb.square().sum(-1).unsqueeze(-2)
            scores = wb.masked_fill(~vb, -torch.inf)
            ranked, order = kernels.rank_scores(scores, live[-1] + 1)
            lengths = vb.sum(-1)
            context, done = wb.new_zeros(*wb.shape[:2], xs.shape[-1]), 0  # the sum over the keys ranked < done
            for N in live:
                band = order[..., done:N]
                context += kernels.weighted_sum(xs, band, wb.gather(-1, band))  # xs: contiguous, no copy
                done = N
                valid = lengths > N
                top, s = _top_set(scores, ranked, order, context, wb, xb, valid, N)
                # the (N + 1)-th largest weight bounds those outside the set
                ratio, r, _ = kernels.separability_rows(wb, xb, vb, top, valid, N, s, wsq,
                                                         ranked[..., N : N + 1] * longest, hidden)
                acc[N].add("separability", ratio, valid)
                usable = valid & (r > 0)
                r = torch.where(usable, r, 1.0)  # invalid rows: any radius > 0, their bounds are discarded
                lower, upper = kernels.theorem2_selected(ranked[..., :N], torch.ones_like(top, dtype=torch.bool),
                                                r.unsqueeze(-1), M, delta.unsqueeze(-1))
                acc[N].add("lower", lower, usable)
                acc[N].add("upper", upper, usable)
        return [_frame(layer, {"L": L, "N": N}, {**acc[N].means(), "delta": delta.squeeze(-1)}) for N in Ns]

    frames = [f for layer in _each_layer(layer_frames, weights.shape[0], "Algorithm 4", progress) for f in layer]
    return _concat(frames, ["N"])


# --- Algorithm 5: gradient sensitivity ---------------------------------------------------------------


def gradient_sensitivity(logits, Ts, epsilons=(1e-3, 1e-1, 10), mask=None, seed: int = 0,
                         progress: bool = True) -> GradientSensitivity:
    """Algorithm 5 (Fig. 4): the finite-difference Jacobian norm g(T, eps).

    Per row t, g_t = ||softmax((l_t + eps v_t) / T) - softmax(l_t / T)|| / eps over the visible keys,
    with one random unit direction v_t per row (seeded by ``seed``) shared by every (T, eps): common
    random numbers, so the curves differ only through T and eps. The per-head value is the mean over
    all rows that see at least one key (row 0 of a causal mask has g = 0 and counts, as in the paper's
    average over t = 1..L). The logit scale (raw q.k, or the model's q.k / sqrt(d_head), ...) is the
    caller's convention: T multiplies whatever is passed.

    Returns ``GradientSensitivity(heads, summary)``: ``heads`` has columns T, eps, layer, head, g;
    ``summary`` has T, eps, g (the max over layers and heads, the paper's g(T, eps)),
    ``corollary3_bound`` (the paper's min{1/(4T), sqrt 2}) and ``finite_difference_bound`` (a valid
    bound on g, ``theory.finite_difference_bound``).
    """
    inputs = _inputs("logits", logits, mask=mask)
    logits, visible_all = inputs.weights, inputs.visible
    Ts = [check_positive("T", T) for T in Ts]
    epsilons = [check_positive("eps", eps) for eps in epsilons]
    if not Ts or not epsilons:
        raise ValueError("Ts and epsilons must each hold at least one value")
    seed = check_int("seed", seed, low=0)
    generator = torch.Generator().manual_seed(seed)
    drawn = [threading.Event() for _ in range(logits.shape[0])]  # the layers draw their directions in order

    def layer_frames(layer: int) -> list[dict]:
        try:
            l, visible = logits[layer].to(torch.float64), visible_all[layer]
            if not (torch.isfinite(l) | ~visible).all():
                raise ValueError("logits must be finite at visible keys (NaN or inf found)")
            if layer:
                drawn[layer - 1].wait()
            v = kernels.unit_directions(visible, generator)
        finally:
            drawn[layer].set()
        g = kernels.fd_gradients(l, v, visible, Ts, epsilons)
        seen = visible.any(-1)
        means = torch.where(seen, g, 0.0).sum(-1) / seen.sum(-1)
        return [_frame(layer, {"T": T, "eps": eps}, {"g": means[a, b]})
                for a, T in enumerate(Ts) for b, eps in enumerate(epsilons)]

    frames = [f for layer in _each_layer(layer_frames, logits.shape[0], "Algorithm 5", progress) for f in layer]
    heads = _concat(frames, ["T", "eps"])
    summary = heads.groupby(["T", "eps"], sort=True, as_index=False)["g"].max()
    summary["corollary3_bound"] = [theory.corollary3_bound(T) for T in summary["T"]]
    summary["finite_difference_bound"] = [theory.finite_difference_bound(T, e)
                                          for T, e in zip(summary["T"], summary["eps"])]
    return GradientSensitivity(heads, summary)


# --- sampled query rows (chapters 2 and 6) ----------------------------------------------------------


def sample_rows(length: int, per_octave: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Query rows (0-based) sampled per octave of positions, and how many rows each one stands for.

    Row 0 is always kept; positions [a, 2a) for a = 1, 2, 4, ... keep ``per_octave`` evenly spread rows
    (every row when the octave is no larger, or when ``per_octave`` is None). The weights sum to ``length``.
    """
    length = check_int("length", length, low=1)
    if per_octave is not None:
        per_octave = check_int("per_octave", per_octave, low=1)
    rows, weight = [0], [1.0]
    a = 1
    while a < length:
        b = min(2 * a, length)
        if per_octave is None or b - a <= per_octave:
            t = np.arange(a, b)
        else:
            t = a + np.floor((np.arange(per_octave) + 0.5) * (b - a) / per_octave).astype(int)
        rows += t.tolist()
        weight += [(b - a) / len(t)] * len(t)
        a = b
    return np.array(rows), np.array(weight)


def octave_blocks(rows) -> list[tuple[np.ndarray, int]]:
    """Group sampled rows (0-based, increasing) by octave: ``(positions in rows, K)`` per group, where K =
    1 + the largest row of the group is the number of keys any row of the group can see (causal mask)."""
    rows = np.asarray(rows)
    if rows.ndim != 1 or len(rows) == 0 or (rows < 0).any() or (np.diff(rows) <= 0).any():
        raise ValueError("rows must be a non-empty increasing 1-D array of row indices >= 0")
    octave = np.array([int(t).bit_length() for t in rows])
    return [(np.flatnonzero(octave == o), int(rows[octave == o].max()) + 1) for o in np.unique(octave)]
