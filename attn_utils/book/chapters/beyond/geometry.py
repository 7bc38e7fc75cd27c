"""Lenses 2 and 3 of chapter ch6_beyond, Theorems 1 and 2: the cumulative distance d~ of Eq. (7) and the
separability N_s / N of Definition (10) for every normalizer, on synthetic rows and on the model's logits."""
from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from attn_utils.book import figures
from attn_utils.book.chapters.beyond.common import (
    A_SYN,
    D_SYN,
    F64,
    GAP,
    GROWS,
    N_SETS,
    PAPER_BAND,
    REL_TOL,
    S_SYN,
    T_SYN,
    by_quantity,
    geometric,
    label,
    legend_below,
    lines,
    listing,
    n_axis,
    norm_kw,
    two_panels,
)
from attn_utils.book.chapters.beyond.logits import ModelLogits
from attn_utils.mathematics import beyond, metrics, registry
from attn_utils.mathematics.fitting import loglog_slope


# --- on synthetic rows (Prop. ch6-prop-count) ---------------------------------------------------------------


@dataclass
class GeometrySynthetic:
    """d~ and N_s / N of synthetic rows: ``table`` has one row per (normalizer, L, N)."""

    names: list[str]
    N: int
    L_hi: int
    table: pd.DataFrame
    count_violations: int
    count_rows: int

    @property
    def slopes(self) -> dict[str, float]:
        """Log-log slope of the median d~ against L at top-N size N, per normalizer."""
        at = self.table[self.table.N == self.N]
        return {n: loglog_slope(at[at.name == n].L, at[at.name == n].distance) for n in self.names}

    def at_longest(self) -> dict[str, pd.DataFrame]:
        """The tables the chapter shows, at the largest length: one per quantity, one column per N."""
        return by_quantity(self.table[self.table.L == self.L_hi], self.names, {
            "distance": f"Median d̃ over the synthetic rows of length {self.L_hi}",
            "separability": f"Mean Nₛ/N over the synthetic rows of length {self.L_hi}",
            "support < N": "Share of these rows whose support is smaller than N",
            "separability, support >= N": "Mean Nₛ/N over the rows whose support holds N keys (n/a: no such row)"})

    def prose(self) -> dict:
        at = self.table[self.table.L == self.L_hi]
        n_max = int(at.N.max())
        sep = at[at.N == n_max].set_index("name")
        short = [n for n in self.names if sep.loc[n, "support < N"] > 0]
        slopes = self.slopes
        return {"N_used": self.N, "syn_Nmax": n_max, "grows_rule": GROWS, "count_violations": self.count_violations,
                "count_rows": self.count_rows, "syn_dist_slopes": listing(self.names, slopes, 2),
                "syn_sep_at_Nmax": listing(self.names, sep["separability"], 2),
                "syn_support_short": ("the support is smaller than N on " + listing(short, sep["support < N"],
                                                                                   percent=True) + " of the rows")
                if short else "no row of any normalizer has a support smaller than N",
                "syn_grow": listing(n for n in self.names if slopes[n] >= GROWS),
                "syn_flat": listing(n for n in self.names if not slopes[n] >= GROWS)}

    def claim(self) -> dict:
        return {"violations": self.count_violations, "pairs": self.count_rows, "normalizers": len(self.names),
                "slopes": listing(self.names, self.slopes, 2)}


def geometry_synthetic(names, lengths, N: int, Ns, n_trials: int, generator: torch.Generator) -> GeometrySynthetic:
    """Typical rows against N_SETS sets of vectors uniform on the unit sphere of R^D_SYN: per normalizer, d~ (Eq. (7),
    sum-of-norms reading) and N_s / N (Definition (10)) with ``beyond.geometry``, at N against every length and at
    every N of ``Ns`` at the largest length, and the bound of Prop. ch6-prop-count,
    |d~ - (L - N) ||s||| <= max_i ||x_i|| * (weight outside the top-N set), on every (row, N)."""
    names, lengths = geometric(names), list(lengths)
    L_hi = max(lengths)
    x_sets = beyond.unit_vectors((N_SETS, L_hi), D_SYN, generator=generator)
    per_set = max(1, n_trials // N_SETS)
    logit_sets = beyond.synthetic_rows("typical", N_SETS * per_set, L_hi, A_SYN, GAP, generator).view(N_SETS, per_set,
                                                                                                      L_hi)
    rows, violations, pairs = [], 0, 0
    for length in lengths:
        grid = sorted({n for n in [N, *Ns] if n < length}) if length == L_hi else ([N] if N < length else [])
        if not grid:
            continue
        x = x_sets[:, :length]
        for name in names:
            w = registry.normalize(logit_sets[..., :length], name, **norm_kw(name, T_SYN, S_SYN))
            support = (w > 0).sum(-1)
            for n_top, g in beyond.geometry(w, x, grid, sphere=x, keys=False).items():
                count_term = (length - n_top) * (torch.where(g.selected, w, 0.0) @ x).norm(dim=-1)
                slack = torch.where(g.selected, 0.0, w).sum(-1)  # R = 1 for unit vectors
                violations += int(((g.distance - count_term).abs() > slack * (1 + REL_TOL) + 1e-12).sum())
                pairs += int(g.valid.sum())
                full = support >= n_top
                rows.append({"normalizer": label(name), "name": name, "L": length, "N": n_top,
                             "distance": float(g.distance.nanmedian()), "(L-N) |s|": float(count_term.median()),
                             "separability": float(g.separability.nanmean()),
                             "support < N": float((~full).double().mean()),
                             "separability, support >= N": float(g.separability[full].nanmean()) if full.any()
                             else float("nan")})
    return GeometrySynthetic(names, N, L_hi, pd.DataFrame(rows), violations, pairs)


def plot_distance_synthetic(res: GeometrySynthetic, seed: int) -> plt.Figure:
    """Median d~ of synthetic rows, one line per normalizer: (a) against L at N, (b) against N at the largest L."""
    fig, axes = two_panels()
    at_N, at_hi = res.table[res.table.N == res.N], res.table[res.table.L == res.L_hi]
    lines(at_N, "L", "distance", axes[0], res.names)
    axes[0].set(xscale="log", yscale="log", xlabel="row length $L$", ylabel=f"median $\\tilde d$ (N = {res.N})")
    axes[0].set_title("(a) against the length", fontsize="medium")
    lines(at_hi, "N", "distance", axes[1], res.names)
    axes[1].set(yscale="log", xlabel="top-N size $N$", ylabel="median $\\tilde d$")
    axes[1].set_title(f"(b) against N (L = {res.L_hi})", fontsize="medium")
    n_axis(axes[1], at_hi.N)
    legend_below(fig, axes[0])
    figures.model_title(fig, f"Theorem 1 lens on synthetic rows (seed {seed})", "synthetic data, no model")
    return fig


def plot_separability_synthetic(res: GeometrySynthetic, seed: int) -> plt.Figure:
    """Mean N_s / N of synthetic rows against N at the largest length, one line per normalizer."""
    fig, ax = plt.subplots(figsize=(6.4, 4.8), layout="constrained")
    at_hi = res.table[res.table.L == res.L_hi]
    lines(at_hi, "N", "separability", ax, res.names)
    ax.set(xlabel="top-N size $N$", ylabel="mean $N_s/N$", ylim=(0, 1.05))
    n_axis(ax, at_hi.N)
    legend_below(fig, ax)
    figures.model_title(fig, f"Theorem 2 lens on synthetic rows (L = {res.L_hi}, seed {seed})",
                        "synthetic data, no model")
    return fig


# --- on the model -----------------------------------------------------------------------------------------------


@dataclass
class GeometryModel:
    """d~ and N_s / N of every sampled row t <= L (value vectors): ``rows`` one row per (normalizer, N, layer, head,
    row); ``summary`` the median over heads of the per-head means, per (normalizer, N). ``coverage_inputs`` keeps
    softmax's top-N sets and separated keys per N of ``Ns``, block by block, for the multi-head test."""

    names: list[str]
    N: int
    grid: list[int]
    rows: pd.DataFrame
    summary: pd.DataFrame
    route_error: float
    coverage_inputs: dict = field(repr=False)

    @property
    def N_max(self) -> int:
        return max(self.grid)

    def at(self, n_top: int) -> pd.DataFrame:
        return self.summary[self.summary.N == n_top].set_index("name")

    def table(self) -> dict[str, pd.DataFrame]:
        """The tables the chapter shows: one per quantity, one column per N."""
        return by_quantity(self.summary, self.names, {
            "distance": "On the model: median over heads of the per-head mean d̃",
            "separability": "On the model: median over heads of the per-head mean Nₛ/N",
            "support < N": "On the model: share of the rows whose support is smaller than N",
            "separability, support >= N": "On the model: the same Nₛ/N, only over the rows whose support holds N keys "
                                          "(n/a: no such row)"})

    def prose(self) -> dict:
        sep = self.at(self.N_max)
        dist = self.at(self.N) if self.N in set(self.summary.N) else sep
        short = [n for n in self.names if sep.loc[n, "support < N"] > 0]
        share = self.rows[self.rows.N == self.N].groupby("name")["count share"].median() \
            if "count share" in self.rows else None
        return {"route_err": self.route_error, "m_Nmax": self.N_max, "m_sep": listing(self.names, sep.separability, 2),
                "m_dist": listing(self.names, dist.distance),
                "m_short": listing(short, sep["support < N"], percent=True) if short else "no normalizer",
                "m_sep_full": listing(short, sep["separability, support >= N"], 2) if short else "n/a",
                "m_count_share": listing(self.names, share) if share is not None and share.notna().any() else "n/a"}


def geometry_model(m: ModelLogits, names, N: int, Ns) -> GeometryModel:
    """``beyond.geometry`` on every sampled row t <= L of every head (value vectors; on the sphere for N_s / N) for
    N and every N of ``Ns``; at N also the share of d~ that is the count term (L_r - N) ||s|| of Prop.
    ch6-prop-count. The fast path is checked against the library route (``beyond.lens_distance`` and
    ``lens_separability``, through ``attn_utils.mathematics.metrics``) on layer 0 of the last block."""
    names, main = geometric(names), m.blocks["main"]
    v = m.values[:, :, :max(b.K for b in main)].to(F64)
    sphere = metrics.project_to_sphere(v)
    grid = sorted({N, *Ns})
    frames, coverage_inputs = [], {n: [] for n in Ns}
    for block in main:
        grid_b = [n for n in grid if n < block.K]
        if not grid_b:
            continue
        for name in names:
            w = registry.normalize(block.logits, name, mask=block.mask, **norm_kw(name, 1.0, m.s))
            support = (w > 0).sum(-1)
            result = beyond.geometry(w, v[:, :, :block.K], grid_b, block.mask, sphere=sphere[:, :, :block.K],
                                     keys=name == "softmax")
            for n_top, g in result.items():
                frame = m.tidy(block.rows, name=name, N=n_top, distance=g.distance, separability=g.separability,
                               support=support)
                if n_top == N:
                    s_norm = (torch.where(g.selected, w, 0.0) @ v[:, :, :block.K]).norm(dim=-1)
                    share = ((block.mask.sum(-1) - n_top) * s_norm) / g.distance
                    frame["count share"] = share.flatten().cpu().numpy()
                frames.append(frame)
                if name == "softmax" and n_top in coverage_inputs:
                    coverage_inputs[n_top].append((g.selected, g.separated, g.valid))
    rows = pd.concat(frames, ignore_index=True)
    last = main[-1]
    n_chk, vk = min(N, last.K - 1), v[:1, :, :last.K]
    w0 = registry.normalize(last.logits[:1], "softmax1", mask=last.mask)
    fast = beyond.geometry(w0, vk, n_chk, last.mask, keys=False)
    d_gap = fast.distance - beyond.lens_distance(w0, vk, n_chk, last.mask)
    s_gap = fast.separability - beyond.lens_separability(w0, vk, n_chk, last.mask)
    route = max(np.nanmax(np.abs(d_gap.cpu().numpy())), np.nanmax(np.abs(s_gap.cpu().numpy())))
    return GeometryModel(names, N, grid, rows, _geometry_summary(m, rows, grid), float(route), coverage_inputs)


def _geometry_summary(m: ModelLogits, rows: pd.DataFrame, grid) -> pd.DataFrame:
    """Per (normalizer, N): the medians over heads of the per-head means of d~, N_s / N and N_s / N on the rows whose
    support holds N keys, and the share of valid rows t <= L whose support is smaller than N."""
    def heads(frame, column):
        return pd.concat([m.head_means(frame[frame.N == n], column, m.L).assign(N=n) for n in grid], ignore_index=True)

    full = rows[rows.support >= rows.N]
    valid = rows[(m.seen(rows.row) > rows.N) & (rows.row < m.L)]
    short = (valid.support < valid.N).groupby([valid.name, valid.N]).mean().rename("support < N")
    full_sep = heads(full, "separability").rename(columns={"separability": "separability, support >= N"})
    summary = (heads(rows, "distance").groupby(["name", "N"]).distance.median().to_frame()
               .join(heads(rows, "separability").groupby(["name", "N"]).separability.median())
               .join(full_sep.groupby(["name", "N"])["separability, support >= N"].median())
               .join(short).reset_index())
    summary["normalizer"] = summary.name.map(lambda n: registry.get(n).label)
    return summary


def plot_geometry_model(res: GeometryModel, m: ModelLogits, corpus: str) -> plt.Figure:
    """Median over heads of the per-head means against N, one line per normalizer: (a) d~, (b) N_s / N with the
    paper's 0.70-0.85 band."""
    fig, axes = two_panels()
    lines(res.summary, "N", "distance", axes[0], res.names)
    axes[0].set(yscale="log", xlabel="top-N size $N$", ylabel="median over heads of mean $\\tilde d$")
    axes[0].set_title("(a) distance", fontsize="medium")
    lines(res.summary, "N", "separability", axes[1], res.names)
    axes[1].axhspan(*PAPER_BAND, color="0.85", alpha=0.6, zorder=0, label="the paper's 0.70–0.85")
    axes[1].set(xlabel="top-N size $N$", ylabel="median over heads of mean $N_s/N$", ylim=(0, 1.05))
    axes[1].set_title("(b) separability", fontsize="medium")
    for ax in axes:
        n_axis(ax, res.summary.N)
    legend_below(fig, *axes)
    figures.model_title(fig, f"Theorem 1 and 2 lenses on the model's logits, re-normalized (L = {m.L})", m.model)
    return fig
