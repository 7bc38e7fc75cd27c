"""Chapter 3, geometric separability: the machinery behind ``notebooks/ch3_separability``.

The objects (paper, Section 4 and Algorithm 4). One query row has weights alpha_1..alpha_L over vectors
x_1..x_L on the sphere of radius M (Assumption 1), pairwise at least delta apart (Assumption 2); I_N is the
top-N set, s = sum_{i in I_N} alpha_i x_i the context vector, X_i = ||s - alpha_i x_i|| for i in I_N, and
r = min_{j not in I_N} ||s - alpha_j x_j|| the radius of the selective ball. The separability fraction of
Definition (10) is N_s / N with N_s = #{i in I_N : X_i < r} (open ball, our convention). Theorem 2, Eq. (11),
in our reconstruction: xi_i^2 = M^2 S_1^2 - (delta^2 / 2)(S_1^2 - S_2) bounds X_i (proven), the lower bound
1 - sum_i xi_i / (N r) holds on every row (proven), the "upper bound" (1/N) sum_i exp(-(xi_i - r)_+^2 / (2 M^2))
does not (see ``theory.theorem2_upper_counterexample``). The formulas live in ``attn_utils.mathematics``; this
module runs them over the chapter's synthetic instances and the model's heads, and draws the figures.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from attn_utils.book import figures
from attn_utils.book.formatting import fmt
from attn_utils.mathematics import metrics, normalizers, theory

F64 = torch.float64
TOL = 1e-12            # slack allowed to rounding when a proven inequality is checked in float64
MODEL_TOL = 1e-9       # the same on model rows (float32 weights renormalized in float64)
SYN_D, SYN_ROWS = 64, 4  # dimension of the synthetic embeddings; query rows per synthetic instance
ROW_STRIDE = 8         # every ROW_STRIDE-th query row of the model is checked row by row
PLATEAU_TOL = 0.05     # a plateau: the median changes by at most this much over all later N of the grid
PAPER_STOP, PAPER_RANGE = 16, (0.70, 0.85)  # Fig. 3: the decline stops near N = 16, the plateau is 70-85 %


def _colors() -> dict[str, tuple]:
    palette = sns.color_palette(figures.PALETTE)
    return {"green": palette[2], "red": palette[3], "blue": palette[0]}


# --- Figure 1: the definition in two dimensions --------------------------------------------------------


@dataclass(frozen=True)
class Figure1:
    """A 2-D instance of the definition: points ``x`` on the circle of radius ``M``, ``weights`` (L,),
    the top-N mask ``selected``, the rescaled points ``scaled`` = alpha_i x_i, the context vector ``s``,
    the radius ``r``, the selected points strictly inside B_r(s) (``inside``), the nearest non-selected
    point (``nearest``, the one on the ball's boundary), N_s/N (``ratio``) and the logit scale ``sigma``."""

    x: np.ndarray
    weights: np.ndarray
    selected: np.ndarray
    scaled: np.ndarray
    s: np.ndarray
    r: float
    inside: np.ndarray
    nearest: int
    ratio: float
    M: float
    sigma: float

    @property
    def N(self) -> int:
        return int(self.selected.sum())

    @property
    def L(self) -> int:
        return len(self.weights)


def figure1_instance(seed: int = 0, L: int = 12, N: int = 4, sigma: float = 1.5, M: float = 1.0) -> Figure1:
    """``L`` points at uniform random angles on the circle of radius ``M`` (Assumption 1, d = 2) and one row of
    softmax weights of N(0, sigma^2) logits, drawn from ``torch.Generator().manual_seed(seed)``; top ``N``."""
    gen = torch.Generator().manual_seed(seed)
    angle = 2 * torch.pi * torch.rand(L, generator=gen, dtype=F64)
    x = M * torch.stack([angle.cos(), angle.sin()], dim=-1)
    w = torch.softmax(sigma * torch.randn(1, L, generator=gen, dtype=F64), dim=-1)
    sel, _ = metrics.top_n_mask(w, N)
    ratio, r = metrics.separability(w, x, N, M=M)
    s = metrics.context_vector(w, x, sel)[0]
    scaled = w[0, :, None] * x
    dist = torch.linalg.vector_norm(scaled - s, dim=-1)
    sel, r = sel[0], float(r[0])
    nearest = int(torch.where(~sel, dist, torch.inf).argmin())
    return Figure1(x.cpu().numpy(), w[0].cpu().numpy(), sel.cpu().numpy(), scaled.cpu().numpy(), s.cpu().numpy(), r,
                   (sel & (dist < r)).cpu().numpy(), nearest, float(ratio[0]), M, sigma)


def _figure1_markers() -> tuple[dict, dict]:
    """Scatter styles of the figure: selected keys as magenta stars (as in the paper), the others as black dots."""
    return dict(c="m", marker="*", s=150, zorder=3, linewidths=0), dict(c="k", s=16, zorder=3)


def draw_figure1_rescaling(fig1: Figure1) -> plt.Figure:
    """The paper's Figure 1, left and middle panels, from ``fig1``: (a) the points on the circle, (b) each point
    multiplied by its weight."""
    fig, axes = plt.subplots(1, 2, figsize=(7.4, 4.3), layout="constrained")
    circle = np.linspace(0, 2 * np.pi, 300)
    sel, sc, M = fig1.selected, fig1.scaled, fig1.M
    kw_sel, kw_rest = _figure1_markers()
    for ax, points, grey in ((axes[0], fig1.x, "0.7"), (axes[1], sc, "0.88")):
        ax.plot(M * np.cos(circle), M * np.sin(circle), color=grey, lw=1)
        ax.scatter(*points[~sel].T, label="not selected", **kw_rest)
        ax.scatter(*points[sel].T, label=f"selected (top {fig1.N})", **kw_sel)
        ax.set_aspect("equal")
    for i in range(fig1.L):
        axes[1].annotate("", xy=sc[i], xytext=fig1.x[i], arrowprops=dict(arrowstyle="->", color="0.65", lw=0.7))
    axes[0].set_title(r"(a) $x_i$ on the circle $\|x\|=M$", fontsize="medium")
    axes[1].set_title(r"(b) rescaled: $\alpha_i x_i$", fontsize="medium")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=2, frameon=False)
    figures.model_title(fig, "The paper's Figure 1 redrawn, (a)-(b): the weights pull the points to the origin",
                        "synthetic data, no model")
    return fig


def draw_figure1_ball(fig1: Figure1) -> plt.Figure:
    """The paper's Figure 1, right panel, from ``fig1``: the rescaled points near s, the selective ball B_r(s) whose
    radius reaches the nearest non-selected point, and which selected points lie strictly inside it."""
    c = _colors()
    fig, ax = plt.subplots(figsize=(6.0, 5.6), layout="constrained")
    sel, sc = fig1.selected, fig1.scaled
    kw_sel, kw_rest = _figure1_markers()
    ax.add_patch(plt.Circle(fig1.s, fig1.r, facecolor=c["green"], alpha=0.18, edgecolor=c["green"], ls="--",
                            label="the ball $B_r(s)$"))
    ax.plot(*np.stack([fig1.s, sc[fig1.nearest]]).T, color=c["green"], lw=1)
    ax.annotate("$r$", (fig1.s + sc[fig1.nearest]) / 2, textcoords="offset points", xytext=(4, 4), color=c["green"])
    ax.scatter(*sc[~sel].T, label="not selected", **kw_rest)
    ring = ax.scatter(*sc[fig1.inside].T, facecolors="none", edgecolors=c["green"], marker="o", s=330, lw=1.4,
                      zorder=3)
    star = ax.scatter(*sc[fig1.inside].T, **kw_sel)
    ax.scatter(*sc[sel & ~fig1.inside].T, facecolors="none", edgecolors="m", marker="*", s=150, lw=1, zorder=3,
               label="selected, outside")
    ax.scatter(*fig1.s, color=c["blue"], marker="X", s=80, zorder=4, label="context vector $s$")
    lo, hi = np.minimum(sc.min(0), fig1.s - fig1.r), np.maximum(sc.max(0), fig1.s + fig1.r)  # points and ball
    centre, half = (hi + lo) / 2, (hi - lo).max() / 2 * 1.08
    ax.set(xlim=(centre[0] - half, centre[0] + half), ylim=(centre[1] - half, centre[1] + half), aspect="equal")
    handles, labels = ax.get_legend_handles_labels()
    handles.insert(2, (ring, star))
    labels.insert(2, "selected, inside (distinguishable)")
    fig.legend(handles, labels, loc="outside lower center", ncol=2, frameon=False,
               handler_map={tuple: HandlerTuple(ndivide=1)})
    figures.model_title(fig, "The paper's Figure 1 redrawn, (c): the selective ball (zoom)",
                        "synthetic data, no model")
    return fig


# --- Theorem 2: the counterexample to the "upper bound" -------------------------------------------------


def selected_distances(weights: torch.Tensor, x: torch.Tensor, selected: torch.Tensor,
                       N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X, idx)``: X_i = ||s - alpha_i x_i|| for the N selected keys of every row, shape (..., R, N), and the
    keys' indices ``idx``; ``weights`` (..., R, L), ``x`` (..., L, d), ``selected`` the top-N mask."""
    s = metrics.context_vector(weights, x, selected)                                   # (..., R, d)
    idx = torch.topk(torch.where(selected, weights, -1.0), N, dim=-1).indices           # (..., R, N)
    rows = weights.shape[-2]
    x_top = torch.gather(x.unsqueeze(-3).expand(*x.shape[:-2], rows, *x.shape[-2:]), -2,
                         idx.unsqueeze(-1).expand(*idx.shape, x.shape[-1]))
    scaled = torch.gather(weights, -1, idx).unsqueeze(-1) * x_top
    return torch.linalg.vector_norm(scaled - s.unsqueeze(-2), dim=-1), idx


def counterexample(tol: float = TOL) -> dict:
    """The row of ``theory.theorem2_upper_counterexample`` measured: N, L, d, M, delta, r, the largest X_i, the
    smallest xi_i, the measured N_s / N, both bounds of Theorem 2, and whether the "upper bound" ``fails``
    (N_s / N > upper + ``tol``). Raises if a proven fact (lower bound, X_i <= xi_i) fails on it."""
    cx = theory.theorem2_upper_counterexample()
    sel, _ = metrics.top_n_mask(cx.weights, cx.N)
    ratio, r = metrics.separability(cx.weights, cx.x, cx.N, M=cx.M)
    bounds = theory.theorem2_bounds(cx.weights, sel, r, cx.M, cx.delta)
    xi = theory.theorem2_xi(cx.weights, sel, cx.M, cx.delta)[sel]
    X = torch.linalg.vector_norm(cx.weights[0, :, None] * cx.x - metrics.context_vector(cx.weights, cx.x, sel)[0],
                                 dim=-1)[sel[0]]
    row = {"N": cx.N, "L": cx.x.shape[0], "d": cx.x.shape[1], "M": cx.M, "delta": cx.delta, "r": float(r[0]),
           "max_X": float(X.max()), "min_xi": float(xi.min()), "ratio": float(ratio[0]),
           "upper": float(bounds.upper[0]), "lower": float(bounds.lower[0])}
    if not (row["ratio"] >= row["lower"] - tol and bool((X <= xi + tol).all())):
        raise AssertionError(f"a proven fact of Theorem 2 fails on the counterexample: {row}")
    return {**row, "fails": row["ratio"] > row["upper"] + tol}


#: The rows of :func:`counterexample_table`: key of :func:`counterexample` and what it is, in words.
COUNTEREXAMPLE_ROWS = {"N": "selected keys N", "L": "keys L", "d": "dimension d", "delta": "minimum distance δ",
                       "r": "radius r", "max_X": "largest Xᵢ", "min_xi": "smallest ξᵢ", "ratio": "measured Nₛ/N",
                       "upper": "'upper bound'", "lower": "lower bound"}


def counterexample_table(cx: dict) -> pd.DataFrame:
    """The counterexample of :func:`counterexample` as a two-column table (quantity, value)."""
    return pd.DataFrame({"quantity": list(COUNTEREXAMPLE_ROWS.values()),
                         "value": [cx[key] for key in COUNTEREXAMPLE_ROWS]})


# --- Theorem 2 on random spheres ----------------------------------------------------------------------


def sphere_min_distance(x: torch.Tensor, M: float, chunk: int = 8) -> torch.Tensor:
    """delta of every instance (n, L, d) whose points lie on the sphere of radius M, from the Gram matrix:
    ||x_i - x_j||^2 = 2 M^2 - 2 <x_i, x_j>, so delta^2 = 2 M^2 - 2 max_{i != j} <x_i, x_j>."""
    out = []
    for a in range(0, x.shape[0], chunk):
        gram = x[a:a + chunk] @ x[a:a + chunk].mT
        gram.diagonal(dim1=-2, dim2=-1).fill_(-torch.inf)
        out.append((2 * M * M - 2 * gram.amax((-2, -1))).clamp_min(0).sqrt())
    return torch.cat(out)


def synthetic_rows(L: int, Ns: Sequence[int], sigmas: Sequence[float], n_trials: int, M: float = 1.0,
                   seed: int = 0, d: int = SYN_D, n_rows: int = SYN_ROWS, tol: float = TOL) -> pd.DataFrame:
    """Theorem 2 on the paper's idealized model, one row of the table per (sigma, trial, N, query row).

    Per sigma (drawn in this order from ``torch.Generator().manual_seed(seed)``): ``n_trials`` instances of
    L points uniform on the sphere of radius M in R^d (Assumption 1; delta = the instance's minimum distance,
    Assumption 2) and ``n_rows`` softmax rows of N(0, sigma^2) logits, in float64. Columns: ``ratio`` = N_s/N,
    ``lower``/``upper`` (Eq. (11), ours), ``xi_gap`` = max_i (X_i - xi_i) (<= 0 by the spread lemma),
    ``delta`` and the violation flags of both bounds (beyond ``tol``).
    """
    gen = torch.Generator().manual_seed(seed)
    frames = []
    for sigma in sigmas:
        x = metrics.project_to_sphere(torch.randn(n_trials, L, d, generator=gen, dtype=F64), M)
        w = torch.softmax(sigma * torch.randn(n_trials, n_rows, L, generator=gen, dtype=F64), dim=-1)
        delta = sphere_min_distance(x, M)
        for N in Ns:
            sel, _ = metrics.top_n_mask(w, N)
            ratio, r = metrics.separability(w, x, N, M=M)
            X, idx = selected_distances(w, x, sel, N)
            bounds = theory.theorem2_bounds(w, sel, r, M, delta[:, None])
            xi = torch.gather(theory.theorem2_xi(w, sel, M, delta[:, None]), -1, idx)
            frames.append(pd.DataFrame({
                "sigma": sigma, "trial": np.repeat(np.arange(n_trials), n_rows),
                "row": np.tile(np.arange(n_rows), n_trials), "N": N, "ratio": ratio.flatten().cpu().numpy(),
                "lower": bounds.lower.flatten().cpu().numpy(), "upper": bounds.upper.flatten().cpu().numpy(),
                "xi_gap": (X - xi).amax(-1).flatten().cpu().numpy(),
                "delta": np.repeat(delta.cpu().numpy(), n_rows)}))
    syn = pd.concat(frames, ignore_index=True).sort_values(["sigma", "trial", "N", "row"], kind="stable",
                                                           ignore_index=True)
    syn["lower_violated"] = syn.ratio < syn.lower - tol
    syn["upper_violated"] = syn.ratio > syn.upper + tol
    return syn


def synthetic_table(syn: pd.DataFrame) -> pd.DataFrame:
    """Per (sigma, N), for reading: mean fraction and bounds, violation counts, largest X_i - xi_i."""
    return syn.groupby(["sigma", "N"]).agg(**{
        "mean Nₛ/N": ("ratio", "mean"), "mean lower bound": ("lower", "mean"),
        "mean 'upper bound'": ("upper", "mean"), "lower bound violated": ("lower_violated", "sum"),
        "'upper bound' violated": ("upper_violated", "sum"), "largest Xᵢ − ξᵢ": ("xi_gap", "max")}
    ).reset_index().rename(columns={"sigma": "σ"})


def synthetic_summary(syn: pd.DataFrame, tol: float = TOL) -> dict:
    """The numbers of the synthetic section: counts of violations (xi, lower, upper), the worst excess over the
    "upper bound" and where it occurs, the share of rows with N > 1 whose lower bound is negative, the range of
    delta, and the mean fraction over sigma and rows at the second and the last N (``falls``: whether it
    decreases at every step of the grid)."""
    worst = syn.loc[(syn.ratio - syn.upper).idxmax()]
    mean_by_n = syn.groupby("N").ratio.mean()
    first = min(1, len(mean_by_n) - 1)
    falls = bool(np.all(np.diff(mean_by_n.to_numpy()) <= 0)) if len(mean_by_n) > 1 else False
    n_upper = int(syn.upper_violated.sum())
    return {"rows": len(syn), "xi_violations": int((syn.xi_gap > tol).sum()), "max_xi_gap": float(syn.xi_gap.max()),
            "lower_violations": int(syn.lower_violated.sum()), "upper_violations": n_upper,
            "upper_share": n_upper / len(syn), "upper_excess": float((syn.ratio - syn.upper).max()),
            "worst_N": int(worst.N), "worst_sigma": float(worst.sigma), "worst_ratio": float(worst.ratio),
            "worst_upper": float(worst.upper), "vacuous": float((syn.lower[syn.N > 1] < 0).mean()),
            "delta_min": float(syn.delta.min()), "delta_max": float(syn.delta.max()),
            "N_first": int(mean_by_n.index[first]), "ratio_first": float(mean_by_n.iloc[first]),
            "N_last": int(mean_by_n.index[-1]), "ratio_last": float(mean_by_n.iloc[-1]), "falls": falls}


def draw_synthetic(syn: pd.DataFrame, L: int) -> plt.Figure:
    """Mean over rows of N_s/N and of both bounds against N, one colour per sigma: (a) the fraction and the
    "upper bound", (b) the proven lower bound."""
    means = syn.groupby(["sigma", "N"])[["ratio", "upper", "lower"]].mean().reset_index()
    styles = {"ratio": ("measured $N_s/N$", "-", "o"), "upper": ("'upper bound' (heuristic)", "--", "^"),
              "lower": ("lower bound (proven)", ":", "s")}
    palette = sns.color_palette(figures.PALETTE)
    Ns = sorted(syn.N.unique())
    fig, axes = plt.subplots(1, 2, figsize=(7.4, 4.4), layout="constrained")
    for ax, quantities in zip(axes, (["ratio", "upper"], ["lower"])):
        for k, (_sigma, part) in enumerate(means.groupby("sigma")):
            for q in quantities:
                ax.plot(part.N, part[q], ls=styles[q][1], marker=styles[q][2], ms=4, color=palette[k])
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ns, [str(n) for n in Ns])
        ax.minorticks_off()
        ax.set(xlabel="top-N size $N$", ylabel="mean over rows")
    axes[0].set_title("(a) $N_s/N$ and the 'upper bound'", fontsize="medium")
    axes[1].axhline(0, color="0.3", lw=1)
    axes[1].set_title("(b) the proven lower bound", fontsize="medium")
    handles = [Line2D([], [], color=palette[k], lw=2, label=f"$\\sigma$ = {sigma:g}")
               for k, sigma in enumerate(sorted(syn.sigma.unique()))]
    handles += [Line2D([], [], color="0.3", ls=ls, marker=m, ms=4, label=name) for name, ls, m in styles.values()]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False)
    figures.model_title(fig, f"Theorem 2 on random spheres (d = {SYN_D}, L = {L})", "synthetic data, no model")
    return fig


# --- the model: Figure 3 and the bounds row by row -------------------------------------------------------


def head_deltas(sep: pd.DataFrame) -> pd.Series:
    """delta of every (layer, head) from a table of ``algorithms.separability_vs_n``."""
    return sep[sep.N == sep.N.min()].set_index(["layer", "head"])["delta"]


def model_rowwise(weights: torch.Tensor, x: torch.Tensor, deltas: pd.Series, Ns: Sequence[int], M: float = 1.0,
                  stride: int = ROW_STRIDE, tol: float = MODEL_TOL, mask: torch.Tensor | None = None) -> pd.DataFrame:
    """Theorem 2 row by row on the model, one table row per (layer, head, N, checked query row).

    ``weights`` (layers, heads, L, L) and ``x`` (layers, heads, L, d) as captured; ``mask`` (L, L) the keys each
    row sees (``Session.visible``; None: the causal prefix); every ``stride``-th query row (t = stride - 1,
    2 stride - 1, ...), renormalized in float64, with the head's delta (``deltas``, see :func:`head_deltas`). Rows
    that see no more than N keys, or have r = 0, are left out. Columns: layer, head, N, ``ratio``, ``lower``,
    ``upper`` and the violation flags (beyond ``tol``).
    """
    n_layers, n_heads, L = weights.shape[0], weights.shape[1], weights.shape[-1]
    rows = torch.arange(stride - 1, L, stride, device=weights.device)
    visible = normalizers.causal_mask(L, device=weights.device) if mask is None else mask.to(weights.device)
    mask_rows = visible[rows]
    checks = []
    for layer in range(n_layers):
        w = weights[layer][:, rows, :].to(F64)
        w = w / w.sum(-1, keepdim=True)
        per_n = []
        for N in Ns:
            sel, valid = metrics.top_n_mask(w, N, mask=mask_rows)
            ratio, r = metrics.separability(w, x[layer].to(F64), N, mask=mask_rows, M=M)
            ok = valid & (r > 0)
            per_n.append((sel, ratio, ok, torch.where(ok, torch.nan_to_num(r, nan=1.0), 1.0)))
        sel_all = torch.stack([p[0] for p in per_n], 1)                            # (heads, N grid, rows, L)
        r_all = torch.stack([p[3] for p in per_n], 1)
        for h in range(n_heads):
            b = theory.theorem2_bounds(w[h].expand(len(Ns), -1, -1), sel_all[h], r_all[h], M,
                                       float(deltas[(layer, h)]))
            for a, N in enumerate(Ns):
                ok = per_n[a][2][h]
                checks.append(pd.DataFrame({"layer": layer, "head": h, "N": N,
                                            "ratio": per_n[a][1][h][ok].cpu().numpy(),
                                            "lower": b.lower[a][ok].cpu().numpy(),
                                            "upper": b.upper[a][ok].cpu().numpy()}))
    out = pd.concat(checks, ignore_index=True)
    out["lower_violated"] = out.ratio < out.lower - tol
    out["upper_violated"] = out.ratio > out.upper + tol
    return out


def measured_text(model: str, causal: bool, L: int, layers_note: str) -> str:
    """How the model part reads ``model``, for the prose: whose keys a row sees, and which layers are measured."""
    rows = (f"{model} is a causal decoder: row t sees the keys 1..t of its prefix, so the rows that see no more "
            "than N keys are the first N" if causal else
            f"{model} is an encoder: every row sees all {L} keys of the window (its mask is all True), so every row "
            "has the same length L and none is skipped")
    return f"{rows}. {layers_note}".strip()


def rowwise_summary(rowwise: pd.DataFrame) -> dict:
    """Rows checked, violations of both bounds, and the share of rows with N > 1 whose lower bound is < 0."""
    n = len(rowwise)
    upper = int(rowwise.upper_violated.sum())
    return {"rows": n, "lower_violations": int(rowwise.lower_violated.sum()), "upper_violations": upper,
            "upper_share": upper / max(n, 1), "vacuous": float((rowwise.lower[rowwise.N > 1] < 0).mean())}


def rowwise_table(rowwise: pd.DataFrame) -> pd.DataFrame:
    """Per N: the model rows checked and how many violate each bound of Theorem 2."""
    return rowwise.groupby("N").agg(**{"rows checked": ("ratio", "size"),
                                       "lower bound violated": ("lower_violated", "sum"),
                                       "'upper bound' violated": ("upper_violated", "sum")}).reset_index()


def per_n_stats(sep: pd.DataFrame) -> pd.DataFrame:
    """Per N, over the heads: median and max of the per-head mean N_s/N, means of both bounds."""
    return sep.groupby("N").agg(median=("separability", "median"), max=("separability", "max"),
                                mean_upper=("upper", "mean"), mean_lower=("lower", "mean"))


def per_n_table(sep: pd.DataFrame) -> pd.DataFrame:
    """Per N, for reading: over the heads, the smallest, median and largest per-head mean N_s/N, and the means of
    both bounds."""
    by_n = sep.groupby("N")
    return pd.DataFrame({"heads": by_n.size(), "smallest Nₛ/N": by_n.separability.min(),
                         "median Nₛ/N": by_n.separability.median(), "largest Nₛ/N": by_n.separability.max(),
                         "mean lower bound": by_n.lower.mean(), "mean 'upper bound'": by_n.upper.mean()}
                        ).reset_index()


def figure3_summary(sep: pd.DataFrame) -> dict:
    """The quantities the claims of Figure 3 are judged on, from a table of ``algorithms.separability_vs_n``.

    ``stop``: the smallest N > 1 of the grid after which the median over heads varies by at most PLATEAU_TOL
    (0 if none); ``drop``: how much the median fell from the first N to ``stop`` (NaN if none);
    ``plateau_median``: the median of the per-head fractions at N >= stop (else at the last N); ``track_gap``:
    max over N > 1 of |mean "upper bound" - max over heads|; ``late_max``/``late_share``: the largest per-head
    fraction at N >= min(16, last N) and the share of those values above 0.85; ``delta_median``, and the heads
    (``zero_heads``, ``zero_layers``) whose delta is below 1e-6 (two coinciding vectors).
    """
    stats = per_n_stats(sep)
    medians, grid = stats["median"], [int(n) for n in stats.index]
    stop = next((N for k, N in enumerate(grid[:-1]) if N > 1
                 and medians.iloc[k:].max() - medians.iloc[k:].min() <= PLATEAU_TOL), 0)
    plateau = sep.loc[sep.N >= (stop or grid[-1]), "separability"]
    tracked = stats[stats.index > 1]
    late_N = min(PAPER_STOP, grid[-1])
    late = sep.loc[sep.N >= late_N, "separability"]
    first = sep[sep.N == grid[0]]
    zero = first[first.delta < 1e-6]
    return {"grid": grid, "medians": [float(m) for m in medians], "stop": stop,
            "drop": float(medians.iloc[0] - medians.loc[stop]) if stop else float("nan"),
            "plateau_from": stop or grid[-1], "plateau_median": float(plateau.median()),
            "track_gap": float((tracked.mean_upper - tracked["max"]).abs().max()) if len(tracked) else float("nan"),
            "upper_min": float(tracked.mean_upper.min()) if len(tracked) else float("nan"),
            "late_N": late_N, "late_max": float(late.max()), "late_share": float((late > PAPER_RANGE[1]).mean()),
            "delta_median": float(first.delta.median()), "zero_heads": len(zero),
            "zero_layers": sorted(int(v) for v in zero.layer.unique())}


def figure3_prose(summary: dict) -> dict[str, str]:
    """The sentences of the comparison with Figure 3 that depend on the outcome."""
    s = summary
    stop_text = (f"the median changes by at most {PLATEAU_TOL:g} from N = {s['stop']} on" if s["stop"]
                 else f"no N of the grid after which the median changes by at most {PLATEAU_TOL:g}")
    zero_text = (f"in {s['zero_heads']} heads (layer {', '.join(map(str, s['zero_layers']))}) two of the window's "
                 f"vectors coincide and delta = 0" if s["zero_heads"]
                 else "no head has two coinciding vectors (delta > 0 everywhere)")
    medians_text = ", ".join(f"N={N}: {fmt(m, 2)}" for N, m in zip(s["grid"], s["medians"]))
    return {"stop_text": stop_text, "zero_text": zero_text, "medians_text": medians_text}


def draw_figure3(sep: pd.DataFrame, model: str, vectors: str, M: float) -> plt.Figure:
    """The paper's Figure 3: per N, boxes of the per-head mean N_s/N, the mean of both bounds over heads, the
    largest head, and the paper's 70-85 % band."""
    c, stats = _colors(), per_n_stats(sep)
    fig, ax = plt.subplots(figsize=(7.4, 5.2), layout="constrained")
    positions = np.arange(len(stats))
    ax.axhspan(*PAPER_RANGE, color="0.85", alpha=0.6, zorder=0, label="the paper's plateau, 0.70–0.85")
    sns.boxplot(data=sep, x="N", y="separability", color=c["green"], ax=ax, width=0.55, fliersize=2,
                boxprops=dict(alpha=0.85))
    ax.plot(positions, stats.mean_upper, "o-", color=c["red"], label="'upper bound' (heuristic), mean over heads")
    ax.plot(positions, stats["max"], "v--", color="k", ms=6, lw=1, label="largest head")
    ax.plot(positions, stats.mean_lower, "s-", color=c["blue"], label="lower bound (proven), mean over heads")
    ax.axhline(0, color="0.3", lw=0.8)
    ax.set_xlabel("top-N size $N$")
    ax.set_ylabel(r"per-head mean of $N_s/N$ over rows")
    handles, _ = ax.get_legend_handles_labels()
    handles.insert(1, Patch(facecolor=c["green"], edgecolor="0.3", label="$N_s/N$ of the heads (boxes)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False)
    L = int(sep.L.iloc[0])
    figures.model_title(fig, f"Separability against N (the paper's Figure 3), L = {L}, {vectors} vectors, M = {M:g}",
                        model)
    return fig


# --- the Discussion's coverage arithmetic -----------------------------------------------------------------


def coverage_table(ps: dict[str, float], H_max: int = 10) -> pd.DataFrame:
    """1 - (1 - p)^H for H = 1..H_max, one column per named p (``theory.multihead_coverage``)."""
    return pd.DataFrame({"H": range(1, H_max + 1),
                         **{name: [theory.multihead_coverage(p, H) for H in range(1, H_max + 1)]
                            for name, p in ps.items()}})
