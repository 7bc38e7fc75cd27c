"""Slow, obvious reference implementations: one row at a time, plain Python and numpy loops.

They define what ``attn_utils.metrics`` and ``attn_utils.experiments`` must compute; the tests compare
the vectorised code against them. Arrays are numpy float64; a row is a 1-D array of L weights, ``vis``
its boolean visibility, ``x`` the (L, d) vectors of its head.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import torch
from scipy.stats import ks_2samp

from attn_utils import theory


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


def min_pairwise_distance(x):
    return min(np.linalg.norm(x[i] - x[j]) for i in range(len(x)) for j in range(len(x)) if i != j)


def softmax(l, vis, T):
    z = np.array([l[i] / T for i in range(len(l)) if vis[i]])
    e = np.exp(z - z.max())
    out = np.zeros(len(l))
    out[np.flatnonzero(vis)] = e / e.sum()
    return out


def fd_gradient(l, v, vis, T, eps):
    return np.linalg.norm(softmax(l + eps * v, vis, T) - softmax(l, vis, T)) / eps


def entropy(w):
    return -sum(a * math.log(a) for a in w if a > 0)


# --- the algorithms: loops over layers, heads and rows ----------------------------------------------


def causal(L):
    return np.tril(np.ones((L, L), dtype=bool))


def _t(a):
    return torch.as_tensor(np.asarray(a, dtype=float))


def _onehot(indices, L):
    out = np.zeros(L, dtype=bool)
    out[list(indices)] = True
    return out


def _head_rows(weights, x, layer, head, L):
    """The leading L x L causal block of one head; row t is cut to its t + 1 visible keys."""
    w, xs = np.asarray(weights, dtype=float)[layer, head, :L, :L], np.asarray(x, dtype=float)[layer, head, :L]
    return [(t, w[t, : t + 1], xs[: t + 1]) for t in range(L)]


def distance_table(weights, x, pairs, reading="sum_of_norms", with_bound=True):
    """Algorithms 1-3: per (L, N, layer, head) the means over rows with t + 1 > N keys of d-tilde, of
    Theorem 1's main sum and (optionally) of its fixed-set bound; theory is called one row at a time."""
    layers, heads = np.asarray(weights).shape[:2]
    records = []
    for L, N in pairs:
        for layer in range(layers):
            for head in range(heads):
                d, e, b = [], [], []
                for t, w, xs in _head_rows(weights, x, layer, head, L):
                    if t + 1 <= N:
                        continue
                    vis = np.ones(t + 1, dtype=bool)
                    selected = top_n(w, vis, N)
                    d.append(cumulative_distance(w, xs, selected, vis, reading))
                    e.append(float(theory.theorem1_random_main_sum(_t([w]), _t(xs), N)[0]))
                    if with_bound:
                        sel = torch.as_tensor(_onehot(selected, t + 1)).unsqueeze(0)
                        b.append(float(theory.theorem1_fixed_bound(_t([w]), _t(xs), sel)[0]))
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
                    sel = torch.as_tensor(_onehot(top_n(w, vis, N), t + 1)).unsqueeze(0)
                    low, up = theory.theorem2_bounds(_t([w]), sel, r, M, delta)
                    ratios.append(ratio)
                    lows.append(float(low[0]))
                    ups.append(float(up[0]))
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
