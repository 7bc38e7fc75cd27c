"""The paper's Algorithms 1-5 (arXiv 2508.17821, appendix B), vectorised over heads and rows.

Inputs are one model's attention for one text: ``weights`` or ``logits`` of shape (layers, heads, L, L)
and vectors ``x`` of shape (layers, heads, L, d) (by project policy the per-head value vectors). Any
float dtype is accepted; each layer is cast to float64 on its own, so float32 storage halves the
memory and the arithmetic stays in float64. ``mask`` defaults to the causal mask (row t, 0-based,
sees keys 0..t); a (L, L) or (layers, heads, L, L) boolean mask may be given instead.

Each function processes one layer at a time and the rows in blocks (``metrics._row_blocks``), then
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

from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
from scipy.stats import ks_2samp
from tqdm.auto import tqdm

from attn_utils.mathematics import metrics, theory
from attn_utils.mathematics.normalizers import causal_mask
from attn_utils.mathematics.rows import Rows
from attn_utils.mathematics.validation import as_tensor, check_choice, check_int, check_positive

__all__ = [
    "CriticalN",
    "GradientSensitivity",
    "critical_n",
    "distance_vs_length",
    "distance_vs_n",
    "gradient_sensitivity",
    "separability_vs_n",
]


class CriticalN(NamedTuple):
    """Algorithm 3's output: one KS test per (L, N), and the critical N per L."""

    tests: pd.DataFrame
    summary: pd.DataFrame


class GradientSensitivity(NamedTuple):
    """Algorithm 5's output: mean g per (T, eps, layer, head), and the max over heads per (T, eps)."""

    heads: pd.DataFrame
    summary: pd.DataFrame


# --- input handling ---------------------------------------------------------------------------------


def _attention(name: str, value) -> torch.Tensor:
    t = as_tensor(name, value)
    if t.ndim != 4 or t.shape[-1] != t.shape[-2] or not t.is_floating_point():
        raise ValueError(f"{name} must be a float tensor of shape (layers, heads, L, L), got {tuple(t.shape)}")
    return t


def _vectors(x, attention: torch.Tensor) -> torch.Tensor:
    x = as_tensor("x", x)
    if x.ndim != 4 or x.shape[:3] != attention.shape[:3] or not x.is_floating_point():
        raise ValueError(
            f"x must be a float tensor of shape (layers, heads, L, d) = {tuple(attention.shape[:3])} + (d,), "
            f"got {tuple(x.shape)}"
        )
    return x


def _mask(mask, attention: torch.Tensor) -> torch.Tensor:
    """The visibility per layer: a (heads, L, L) view for each layer index."""
    L = attention.shape[-1]
    if mask is None:
        return causal_mask(L).expand(attention.shape)
    mask = as_tensor("mask", mask)
    if mask.dtype != torch.bool or mask.shape not in {(L, L), attention.shape}:
        raise ValueError(
            f"mask must be a boolean tensor of shape (L, L) = ({L}, {L}) or {tuple(attention.shape)}, "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    return mask.expand(attention.shape)


def _length(L, attention: torch.Tensor) -> int:
    return attention.shape[-1] if L is None else check_int("L", L, low=2, high=attention.shape[-1])


def _grid(name: str, values, low: int, high: int) -> list[int]:
    values = [check_int(name, v, low=low, high=high) for v in values]
    if not values:
        raise ValueError(f"{name} must hold at least one value")
    return sorted(set(values))


def _layer(weights: torch.Tensor, x: torch.Tensor, layer: int, L: int, rows=None,
           renormalize: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``layer`` cut to its leading L keys and rows (or to the query rows ``rows``), in float64,
    validated; with ``renormalize`` every row is divided by its sum (in float64, after the check)."""
    block = weights[layer, :, :L, :L] if rows is None else weights[layer, :, torch.as_tensor(rows), :L]
    checked = Rows.of(block, x[layer, :, :L])  # validated once per layer, in float64
    w = checked.weights
    if renormalize:
        total = w.sum(-1, keepdim=True)
        w = w / torch.where(total > 0, total, 1.0)
    return w, checked.x


def _frame(layer: int, grid: dict, values: dict) -> dict[str, np.ndarray]:
    """Columns for one row per head: the layer, the head, the grid values and the per-head ``values``."""
    heads = len(next(iter(values.values())))
    return {"layer": np.full(heads, layer), "head": np.arange(heads),
            **{k: np.full(heads, v) for k, v in grid.items()},
            **{k: np.asarray(v, dtype=float) for k, v in values.items()}}


def _concat(frames: list[dict], order: list[str]) -> pd.DataFrame:
    """One DataFrame from the columns of ``frames``, sorted by ``order``, layer and head."""
    table = pd.DataFrame({k: np.concatenate([f[k] for f in frames]) for k in frames[0]})
    return table.sort_values(order + ["layer", "head"], ignore_index=True)


class _RowMeans:
    """Per-head sums and counts of per-row quantities over valid rows, block by block."""

    def __init__(self, heads: int, names: tuple[str, ...]):
        self.sums = {n: torch.zeros(heads, dtype=torch.float64) for n in names}
        self.counts = {n: torch.zeros(heads, dtype=torch.float64) for n in names}

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


def _sampled_blocks(visible: torch.Tensor, rows: np.ndarray):
    """Like ``metrics._row_blocks`` for the sampled query rows ``rows`` (0-based positions, increasing) of
    ``visible`` (heads, R, L), R = len(rows): ``(positions, k)`` octave by octave (``octave_blocks``), split
    so that a block's temporaries hold about as many numbers as a block of ``metrics._row_blocks``."""
    heads, _, L = visible.shape
    for positions, _ in octave_blocks(rows):
        seen = visible[:, torch.as_tensor(positions)].reshape(-1, L).any(0).nonzero()
        k = int(seen[-1]) + 1 if len(seen) else 1
        step = max(1, metrics._BLOCK_ELEMENTS // max(1, heads * k))
        for a in range(0, len(positions), step):
            yield torch.as_tensor(positions[a : a + step]), k


def _distance_means(w, xs, visible, Ns, reading, farthest, sample=None) -> dict[int, dict[str, torch.Tensor]]:
    """For each N of Ns: per-head means over valid rows of d-tilde, the main sum E of Theorem 1 and
    (when ``farthest``, the lists of ``theory.farthest_keys(xs)``, are given) the fixed-set bound of
    Theorem 1, for one layer (heads, R, L). The N-independent work is done once per block of rows.
    ``sample = (rows, weight)`` (``sample_rows``): w and visible hold only those query rows, and the means
    are weighted by ``weight``."""
    names = ("distance", "expectation") if farthest is None else ("distance", "expectation", "bound")
    acc = {N: _RowMeans(w.shape[0], names) for N in Ns}
    selected_all = {N: torch.zeros_like(visible) for N in Ns} if farthest is not None else {}
    valid_all = {N: torch.zeros(visible.shape[:-1], dtype=torch.bool) for N in Ns}
    if sample is None:
        blocks, weight = metrics._row_blocks(visible), None
    else:
        blocks, weight = _sampled_blocks(visible, sample[0]), torch.as_tensor(sample[1], dtype=torch.float64)
    for rows, k in blocks:
        live = [N for N in Ns if N < k]  # the others: every row of the block sees <= N keys
        if not live:
            continue
        wb, vb, xb = w[:, rows, :k], visible[:, rows, :k], xs[:, :k]
        wt = None if weight is None else weight[rows]
        _, xm, sq, mm = theory._mean_vector_terms(wb, xb)
        for N, (selected, valid) in zip(live, metrics._top_ns(wb, vb, live)):
            valid_all[N][:, rows] = valid
            if farthest is not None:
                selected_all[N][:, rows, :k] = selected
            acc[N].add("distance", metrics._cumulative_distance(wb, xb, selected, vb, reading), valid, wt)
            acc[N].add("expectation", theory._main_sum(wb, vb, xm, sq, mm, N), valid, wt)
    for N, selected in selected_all.items():
        if valid_all[N].any():
            # rows that see <= N keys are left out of the means; select their visible keys so the call is valid
            selected |= visible & ~valid_all[N].unsqueeze(-1)
            acc[N].add("bound", theory.theorem1_fixed_bound(w, xs, selected, visible, farthest=farthest),
                       valid_all[N], weight)
    return {N: a.means() for N, a in acc.items()}


def _distance_table(weights, x, pairs, mask, reading, with_bound, progress, desc, rows_per_octave) -> pd.DataFrame:
    check_choice("reading", reading, metrics.READINGS)
    if rows_per_octave is not None:
        rows_per_octave = check_int("rows_per_octave", rows_per_octave, low=1)
    visible_all = _mask(mask, weights)
    lengths = sorted({L for L, _ in pairs})
    samples = {L: sample_rows(L, rows_per_octave) for L in lengths} if rows_per_octave is not None else {}
    union = np.unique(np.concatenate([r for r, _ in samples.values()])) if samples else None
    frames = []
    for layer in tqdm(range(weights.shape[0]), desc=desc, disable=not progress):
        w, xs = _layer(weights, x, layer, lengths[-1], rows=union, renormalize=True)
        farthest = theory.farthest_keys(xs, prefixes=lengths) if with_bound else None
        for L in lengths:
            Ns = sorted(N for L_, N in pairs if L_ == L)
            far = farthest.prefix(L) if with_bound else None
            if samples:
                rows, weight = samples[L]
                at = torch.as_tensor(np.searchsorted(union, rows))
                visible = visible_all[layer][:, torch.as_tensor(rows), :L]
                means = _distance_means(w[:, at, :L], xs[:, :L], visible, Ns, reading, far, (rows, weight))
            else:
                means = _distance_means(w[:, :L, :L], xs[:, :L], visible_all[layer, :, :L, :L], Ns, reading, far)
            frames += [_frame(layer, {"L": L, "N": N}, means[N]) for N in Ns]
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
    weights = _attention("weights", weights)
    x = _vectors(x, weights)
    lengths = _grid("lengths", lengths, low=2, high=weights.shape[-1])
    N = check_int("N", N, low=1, high=min(lengths) - 1)
    return _distance_table(weights, x, [(L, N) for L in lengths], mask, reading, True, progress, "Algorithm 1",
                           rows_per_octave)


def distance_vs_n(weights, x, Ns=(1, 5, 10, 20, 100), L: int | None = None, mask=None,
                  reading: str = "sum_of_norms", progress: bool = True,
                  rows_per_octave: int | None = None) -> pd.DataFrame:
    """Algorithm 2 (Fig. 2b): distance statistics at fixed L (default: all keys) for growing N.

    Same columns and conventions (renormalised rows, ``rows_per_octave``) as :func:`distance_vs_length`;
    every N must satisfy 1 <= N <= L - 1.
    """
    weights = _attention("weights", weights)
    x = _vectors(x, weights)
    L = _length(L, weights)
    Ns = _grid("N", Ns, low=1, high=L - 1)
    return _distance_table(weights, x, [(L, N) for N in Ns], mask, reading, True, progress, "Algorithm 2",
                           rows_per_octave)


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
    weights = _attention("weights", weights)
    x = _vectors(x, weights)
    alpha = check_positive("alpha", alpha)
    if alpha >= 1:
        raise ValueError(f"alpha must be a significance level in (0, 1), got {alpha}")
    lengths = _grid("lengths", lengths, low=2, high=weights.shape[-1])
    grids = {L: _grid("Ns", Ns(L) if callable(Ns) else Ns, low=1, high=None) for L in lengths}
    pairs = [(L, N) for L in lengths for N in grids[L] if N < L]
    if not pairs:
        raise ValueError("Ns must hold at least one N smaller than some length of lengths")
    means = _distance_table(weights, x, pairs, mask, reading, False, progress, "Algorithm 3", rows_per_octave)
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


# --- Algorithm 4: separability --------------------------------------------------------------------------


def separability_vs_n(weights, x, Ns=(1, 2, 4, 8, 16, 32, 64, 100), M: float = 1.0, L: int | None = None,
                      mask=None, progress: bool = True) -> pd.DataFrame:
    """Algorithm 4 (Fig. 3): separability N_s / N and the bounds of Theorem 2, for growing N.

    Per layer the head's vectors (first L keys) are projected onto the sphere of radius M
    (Assumption 1) and delta is their minimum pairwise distance (Assumption 2, per head). Per row:
    r = min_{i not in I_N} ||s - alpha_i x_i|| and N_s / N from ``metrics.separability`` (strict count,
    see there); lower and upper bounds from ``theory.theorem2_bounds``. Columns: layer, head, L, N,
    ``separability``, ``lower``, ``upper`` (means over valid rows; rows with r = 0 have no bounds and
    are left out of those two means), ``delta``.
    """
    weights = _attention("weights", weights)
    x = _vectors(x, weights)
    M = check_positive("M", M)
    L = _length(L, weights)
    Ns = _grid("N", Ns, low=1, high=L - 1)
    visible_all = _mask(mask, weights)
    frames = []
    for layer in tqdm(range(weights.shape[0]), desc="Algorithm 4", disable=not progress):
        w, xs = _layer(weights, x, layer, L)
        xs = metrics._project(xs, M)
        delta = metrics.min_pairwise_distance(xs)
        visible = visible_all[layer, :, :L, :L]
        acc = {N: _RowMeans(w.shape[0], ("separability", "lower", "upper")) for N in Ns}
        for rows, k in metrics._row_blocks(visible):
            live = [N for N in Ns if N < k]  # the others: every row of the block sees <= N keys
            if not live:
                continue
            wb, vb, xb = w[:, rows, :k], visible[:, rows, :k], xs[:, :k]
            for N, (selected, valid) in zip(live, metrics._top_ns(wb, vb, live)):
                ratio, r = metrics._separability(wb, xb, selected, vb, valid, N)
                acc[N].add("separability", ratio, valid)
                usable = valid & (r > 0)
                r = torch.where(usable, r, 1.0)  # invalid rows: any radius > 0, their bounds are discarded
                lower, upper = theory.theorem2_bounds(wb, selected, r, M, delta.unsqueeze(-1))
                acc[N].add("lower", lower, usable)
                acc[N].add("upper", upper, usable)
        frames += [_frame(layer, {"L": L, "N": N}, {**acc[N].means(), "delta": delta}) for N in Ns]
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
    logits = _attention("logits", logits)
    Ts = [check_positive("T", T) for T in Ts]
    epsilons = [check_positive("eps", eps) for eps in epsilons]
    if not Ts or not epsilons:
        raise ValueError("Ts and epsilons must each hold at least one value")
    seed = check_int("seed", seed, low=0)
    visible_all = _mask(mask, logits)
    generator = torch.Generator().manual_seed(seed)
    frames = []
    for layer in tqdm(range(logits.shape[0]), desc="Algorithm 5", disable=not progress):
        l, visible = logits[layer].to(torch.float64), visible_all[layer]
        if not (torch.isfinite(l) | ~visible).all():
            raise ValueError("logits must be finite at visible keys (NaN or inf found)")
        v = metrics._directions(visible, generator)
        g = metrics._fd_gradients(l, v, visible, Ts, epsilons)
        seen = visible.any(-1)
        means = torch.where(seen, g, 0.0).sum(-1) / seen.sum(-1)
        for a, T in enumerate(Ts):
            for b, eps in enumerate(epsilons):
                frames.append(_frame(layer, {"T": T, "eps": eps}, {"g": means[a, b]}))
    heads = _concat(frames, ["T", "eps"])
    summary = heads.groupby(["T", "eps"], sort=True, as_index=False)["g"].max()
    summary["corollary3_bound"] = [theory.corollary3_bound(T) for T in summary["T"]]
    summary["finite_difference_bound"] = [theory.finite_difference_bound(T, e) for T, e in zip(summary["T"], summary["eps"])]
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
