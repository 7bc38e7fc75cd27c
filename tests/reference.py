"""Slow, obvious reference implementations: one row at a time, plain Python and numpy loops.

They define what ``attn_utils.mathematics.metrics`` and ``attn_utils.mathematics.algorithms`` must compute; the
tests compare the vectorised code against them. Arrays are numpy float64; a row is a 1-D array of L weights,
``vis`` its boolean visibility, ``x`` the (L, d) vectors of its head.
"""
from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pandas as pd
from scipy.stats import ks_2samp



# --- one row ------------------------------------------------------------------------------------------


def top_n(w, vis, N):
    """Indices of the N largest visible weights; among equal weights the lowest index first."""
    keys = [i for i in range(len(w)) if vis[i]]
    return sorted(sorted(keys, key=lambda i: (-w[i], i))[:N])


def context_vector(w, x, selected):
    s = np.zeros(x.shape[1])
    for i in selected:
        s = s + w[i] * x[i]
    return s


def outside(vis, selected):
    return [i for i in range(len(vis)) if vis[i] and i not in selected]


def cumulative_distance(w, x, selected, vis, reading="sum_of_norms"):
    s = context_vector(w, x, selected)
    if reading == "sum_of_norms":
        return sum(np.linalg.norm(w[i] * x[i] - s) for i in outside(vis, selected))
    total = np.zeros(x.shape[1])
    for i in outside(vis, selected):
        total = total + (w[i] * x[i] - s)
    return np.linalg.norm(total)


def expected_distance_exact(w, x, N, vis, reading="sum_of_norms"):
    """E over all C(L_r, N) subsets of the visible keys, by enumeration."""
    keys = [i for i in range(len(w)) if vis[i]]
    values = [cumulative_distance(w, x, list(c), vis, reading) for c in itertools.combinations(keys, N)]
    return sum(values) / len(values)


def separability(w, x, N, vis, M=1.0, normalize=True):
    """(N_s / N, r) with r = min over non-selected of ||s - alpha_i x_i|| and a strict "<" count."""
    if normalize:
        x = np.array([M * xi / np.linalg.norm(xi) for xi in x])
    selected = top_n(w, vis, N)
    s = context_vector(w, x, selected)
    r = min(np.linalg.norm(s - w[i] * x[i]) for i in outside(vis, selected))
    count = sum(1 for i in selected if np.linalg.norm(w[i] * x[i] - s) < r)
    return count / N, r


def fixed_bound(w, x, selected, vis):
    """Theorem 1, fixed set: (1 - abar) d_1 + max_{j in I} ||x_j|| (abar (L_r - N) - (1 - abar))."""
    out = outside(vis, selected)
    if not out:
        return 0.0
    abar = sum(w[j] for j in selected)
    rest = sum(w[i] for i in out)
    d1 = max(np.linalg.norm(x[i] - x[j]) for i in out for j in selected)
    return rest * d1 + max(np.linalg.norm(x[j]) for j in selected) * (abar * len(out) - rest)


def main_sum(w, x, N, vis):
    """Theorem 1, random set: ((L_r - N) / L_r) sum_i ||alpha_i x_i - (N / (L_r - 1)) sum_{j != i} alpha_j x_j||."""
    keys = [i for i in range(len(w)) if vis[i]]
    L_r = len(keys)
    if L_r <= N:
        return 0.0
    total = 0.0
    for i in keys:
        rest = [j for j in keys if j != i]
        others = w[rest] @ x[rest]  # sum_{j != i} alpha_j x_j, summed directly
        total += np.linalg.norm(w[i] * x[i] - N / (L_r - 1) * others)
    return (L_r - N) / L_r * total


def theorem2_row(w, selected, r, M, delta):
    """Theorem 2: xi_i^2 = M^2 S1^2 - (delta^2 / 2)(S1^2 - S2) over I minus i; (lower, upper) bounds."""
    xi = []
    for i in selected:
        others = [w[j] for j in selected if j != i]
        s1, s2 = sum(others), sum(a * a for a in others)
        xi.append(math.sqrt(max(M * M * s1 * s1 - delta * delta / 2 * (s1 * s1 - s2), 0.0)))
    N = len(selected)
    lower = 1 - sum(xi) / (N * r)
    upper = sum(math.exp(-max(v - r, 0.0) ** 2 / (2 * M * M)) for v in xi) / N
    return lower, upper


def min_pairwise_distance(x):
    return min(np.linalg.norm(x[i] - x[j]) for i in range(len(x)) for j in range(len(x)) if i != j)


def softmax(l, vis, T):
    """In the dtype of l (np.longdouble for an extended-precision reference)."""
    z = np.array([l[i] / T for i in range(len(l)) if vis[i]])
    e = np.exp(z - z.max())
    out = np.zeros(len(l), dtype=np.result_type(l, 1.0))
    out[np.flatnonzero(vis)] = e / e.sum()
    return out


def fd_gradient(l, v, vis, T, eps):
    return np.linalg.norm(softmax(l + eps * v, vis, T) - softmax(l, vis, T)) / eps


def fd_gradient_mp(l, v, vis, T, eps, digits=60):
    """fd_gradient in mpmath with ``digits`` significant digits: no cancellation worth the name, a reference for
    rows whose two softmaxes agree to many digits."""
    with mpmath.workdps(digits):
        keys = [i for i in range(len(l)) if vis[i]]

        def soft(shift):
            z = [(mpmath.mpf(float(l[i])) + shift * mpmath.mpf(float(v[i]))) / mpmath.mpf(T) for i in keys]
            top = max(z)
            e = [mpmath.exp(a - top) for a in z]
            total = mpmath.fsum(e)
            return [a / total for a in e]

        moved, base = soft(mpmath.mpf(eps)), soft(0)
        return float(mpmath.sqrt(mpmath.fsum((a - b) ** 2 for a, b in zip(moved, base))) / mpmath.mpf(eps))


def entropy(w):
    return -sum(a * math.log(a) for a in w if a > 0)


# --- the algorithms: loops over layers, heads and rows ----------------------------------------------


def causal(L):
    return np.tril(np.ones((L, L), dtype=bool))


def _head_rows(weights, x, layer, head, L, mask=None):
    """The leading L x L block of one head; row t is cut to its visible keys (the first t + 1 with the causal
    mask; ``mask`` (L_all, L_all) otherwise, the row then divided by its sum)."""
    w, xs = np.asarray(weights, dtype=float)[layer, head, :L, :L], np.asarray(x, dtype=float)[layer, head, :L]
    if mask is None:
        return [(t, w[t, : t + 1], xs[: t + 1]) for t in range(L)]
    keys = [np.flatnonzero(np.asarray(mask)[t, :L]) for t in range(L)]
    return [(t, w[t, k] / w[t, k].sum(), xs[k]) for t, k in enumerate(keys)]


def distance_table(weights, x, pairs, reading="sum_of_norms", with_bound=True, mask=None):
    """Algorithms 1-3: per (L, N, layer, head) the means over rows with more than N visible keys of d-tilde, of
    Theorem 1's main sum and (optionally) of its fixed-set bound, one row at a time."""
    layers, heads = np.asarray(weights).shape[:2]
    records = []
    for L, N in pairs:
        for layer in range(layers):
            for head in range(heads):
                d, e, b = [], [], []
                for _, w, xs in _head_rows(weights, x, layer, head, L, mask):
                    if len(w) <= N:
                        continue
                    vis = np.ones(len(w), dtype=bool)
                    selected = top_n(w, vis, N)
                    d.append(cumulative_distance(w, xs, selected, vis, reading))
                    e.append(main_sum(w, xs, N, vis))
                    if with_bound:
                        b.append(fixed_bound(w, xs, selected, vis))
                record = {"layer": layer, "head": head, "L": L, "N": N, "distance": np.mean(d),
                          "expectation": np.mean(e)}
                if with_bound:
                    record["bound"] = np.mean(b)
                records.append(record)
    return pd.DataFrame(records).sort_values(["L", "N", "layer", "head"], ignore_index=True)


def critical_n(weights, x, lengths, Ns, alpha):
    """Algorithm 3: per L, the first N (ascending) whose KS test does not reject at level alpha."""
    table = distance_table(weights, x, [(L, N) for L in lengths for N in Ns if N < L], with_bound=False)
    tests, summary = [], []
    for L in sorted(lengths):
        crit = -1
        for N in sorted(n for n in Ns if n < L):
            group = table[(table["L"] == L) & (table["N"] == N)]
            res = ks_2samp(group["distance"], group["expectation"])
            tests.append({"L": L, "N": N, "statistic": res.statistic, "pvalue": res.pvalue})
            if crit == -1 and res.pvalue > alpha:
                crit = N
        summary.append({"L": L, "critical_n": crit})
    return pd.DataFrame(tests), pd.DataFrame(summary)


def separability_table(weights, x, Ns, M=1.0, L=None):
    """Algorithm 4: per (N, layer, head) the means of N_s / N and of Theorem 2's bounds over valid rows."""
    layers, heads, L_all = np.asarray(weights).shape[:3]
    L = L_all if L is None else L
    records = []
    for N in Ns:
        for layer in range(layers):
            for head in range(heads):
                xs = np.array([M * v / np.linalg.norm(v) for v in np.asarray(x, dtype=float)[layer, head, :L]])
                delta = min_pairwise_distance(xs)
                ratios, lows, ups = [], [], []
                for t, w, _ in _head_rows(weights, x, layer, head, L):
                    if t + 1 <= N:
                        continue
                    vis = np.ones(t + 1, dtype=bool)
                    ratio, r = separability(w, xs[: t + 1], N, vis, M, normalize=False)
                    low, up = theorem2_row(w, top_n(w, vis, N), r, M, delta)
                    ratios.append(ratio)
                    lows.append(low)
                    ups.append(up)
                records.append({"layer": layer, "head": head, "L": L, "N": N, "separability": np.mean(ratios),
                                "lower": np.mean(lows), "upper": np.mean(ups), "delta": delta})
    return pd.DataFrame(records)


def gradient_table(logits, v, Ts, epsilons):
    """Algorithm 5 with given directions v (layers, heads, L, L): mean g over rows, per (T, eps, layer, head)."""
    logits, v = np.asarray(logits, dtype=float), np.asarray(v, dtype=float)
    layers, heads, L = logits.shape[:3]
    vis = causal(L)
    records = []
    for T in Ts:
        for eps in epsilons:
            for layer in range(layers):
                for head in range(heads):
                    g = [fd_gradient(logits[layer, head, t], v[layer, head, t], vis[t], T, eps) for t in range(L)]
                    records.append({"layer": layer, "head": head, "T": T, "eps": eps, "g": np.mean(g)})
    return pd.DataFrame(records)
