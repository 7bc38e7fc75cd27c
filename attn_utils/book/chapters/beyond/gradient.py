"""Lens 4 of chapter ch6_beyond, Lemma 2 and Corollary 3: the sensitivity of the weights to the logits (the
closed-form Jacobians and their norms on synthetic rows, the directional derivative on the model's logits)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from attn_utils.book import figures
from attn_utils.book.chapters.beyond.common import (
    A_SYN,
    GAP,
    L_G,
    REL_TOL,
    S_SYN,
    USABLE,
    by_temperature,
    label,
    legend_below,
    lines,
    listing,
    norm_kw,
    two_panels,
)
from attn_utils.book.chapters.beyond.logits import ModelLogits
from attn_utils.mathematics import beyond, metrics, registry


def _ratio_at_smallest(table: pd.DataFrame, column: str, names) -> dict[str, float]:
    """Per normalizer: ``column`` at the smallest T over its largest value on the grid (0 if that is 0)."""
    out = {}
    for name in names:
        sub = table[table.name == name].set_index("T")[column]
        out[name] = float(sub.loc[min(sub.index)] / sub.max()) if sub.max() > 0 else 0.0
    return out


# --- on synthetic rows (Prop. ch6-prop-jacobians) -----------------------------------------------------------


@dataclass
class GradientSynthetic:
    """Spectral norms ||J||_2 on synthetic rows: ``table`` has one row per (normalizer, T)."""

    names: list[str]
    Ts: list[float]
    n_trials: int
    table: pd.DataFrame
    autograd_error: float
    bound_violations: int

    @property
    def usable(self) -> dict[str, float]:
        return _ratio_at_smallest(self.table, "median norm", self.names)

    @property
    def keeps(self) -> dict[str, bool]:
        return {n: r >= USABLE for n, r in self.usable.items()}

    def norms(self) -> pd.DataFrame:
        """Median ||J||_2 per normalizer (rows) and temperature (columns)."""
        return by_temperature(self.table, "median norm", self.names)

    def prose(self) -> dict:
        T_mid = min(self.Ts, key=lambda T: abs(math.log(T / 0.1)))  # the grid temperature closest to 0.1
        zero = self.table[self.table["T"] == T_mid].set_index("name")["share of zero Jacobians"]
        return {"LG": L_G, "ad_error": self.autograd_error, "bound_violations": self.bound_violations,
                "T_min": min(self.Ts), "usable_rule": USABLE, "T_mid": T_mid,
                "syn_keep": listing(n for n in self.names if self.keeps[n]),
                "syn_lose": listing(n for n in self.names if not self.keeps[n]),
                "syn_usable_ratios": listing(self.names, self.usable),
                "zero_mid": listing(self.names, zero, percent=True)}

    def claim(self) -> dict:
        return {"autograd_error": self.autograd_error, "violations": self.bound_violations, "rows": self.n_trials,
                "temperatures": len(self.Ts), "normalizers": len(self.names)}


def _norm_violations(name: str, norm: torch.Tensor, rows: torch.Tensor, T: float) -> int:
    """Rows whose ||J||_2 breaks Prop. ch6-prop-jacobians, the ``jacobian_norm`` of the normalizer's record (SSMax
    with s = S_SYN): <= 1/(2T) (softmax, softmax-1), <= s log(n)/(2T) (SSMax), <= 1/T (1.5-entmax), exactly 1/T or
    0 by the support size (sparsemax), beyond a relative REL_TOL. 0 for a record without a bound (self-adjust);
    ``ValueError`` for an unknown name."""
    bound = registry.get(name).jacobian_norm
    if bound is None:
        return 0
    value = bound.value(rows, T, S_SYN)
    if bound.exact:
        return int(((norm - value).abs() > REL_TOL * (1 + value)).sum())
    return int((norm > (1 + REL_TOL) * value).sum())


def gradient_synthetic(names, Ts, n_trials: int, generator: torch.Generator) -> GradientSynthetic:
    """The closed-form Jacobians (``beyond.jacobian``) against autograd on 3 rows at T = 0.5, then the exact spectral
    norm ||J||_2 of ``n_trials`` typical rows of L_G keys at every T of ``Ts``, checked against its bound."""
    names = list(names)
    check_rows = beyond.synthetic_rows("typical", 3, L_G, A_SYN, GAP, generator)
    error = 0.0
    for name in names:
        J = beyond.jacobian(check_rows, name, **norm_kw(name, 0.5, S_SYN))
        for r in range(len(check_rows)):
            auto = torch.autograd.functional.jacobian(
                lambda row: registry.normalize(row.unsqueeze(0), name, **norm_kw(name, 0.5, S_SYN))[0], check_rows[r])
            error = max(error, float((auto - J[r]).abs().max() / auto.abs().max().clamp(min=1e-300)))
    rows = beyond.synthetic_rows("typical", n_trials, L_G, A_SYN, GAP, generator)
    table, violations = [], 0
    for name in names:
        for T in Ts:
            norm = torch.linalg.matrix_norm(beyond.jacobian(rows, name, **norm_kw(name, T, S_SYN)), ord=2)
            violations += _norm_violations(name, norm, rows, T)
            table.append({"normalizer": label(name), "name": name, "T": T, "median norm": float(norm.median()),
                          "median T x norm": float((T * norm).median()),
                          "share of zero Jacobians": float((norm == 0).double().mean())})
    return GradientSynthetic(names, list(Ts), n_trials, pd.DataFrame(table), error, violations)


def plot_gradient_synthetic(res: GradientSynthetic, seed: int) -> plt.Figure:
    """Against T, one line per normalizer: (a) the median spectral norm ||J||_2 with 1/(2T) and 1/T, (b) the share
    of rows whose Jacobian is exactly zero."""
    fig, axes = two_panels()
    lines(res.table, "T", "median norm", axes[0], res.names)
    T_dense = np.logspace(np.log10(min(res.Ts)), np.log10(max(res.Ts)), 100)
    axes[0].plot(T_dense, 1 / (2 * T_dense), "k--", lw=1, label="$1/(2T)$")
    axes[0].plot(T_dense, 1 / T_dense, "k:", lw=1, label="$1/T$")
    axes[0].set(xscale="log", yscale="symlog", xlabel="temperature $T$", ylabel="median $\\|J\\|_2$")
    axes[0].set_ylim(bottom=0)
    axes[0].set_title("(a) the norm of the Jacobian", fontsize="medium")
    lines(res.table, "T", "share of zero Jacobians", axes[1], res.names)
    axes[1].set(xscale="log", xlabel="temperature $T$", ylabel="share of rows with $J = 0$", ylim=(-0.02, 1.02))
    axes[1].set_title("(b) rows with no gradient at all", fontsize="medium")
    legend_below(fig, axes[0])
    figures.model_title(fig, f"Gradient lens on synthetic rows ({L_G} keys, {res.n_trials} rows, seed {seed})",
                        "synthetic data, no model")
    return fig


# --- on the model -----------------------------------------------------------------------------------------------


@dataclass
class GradientModel:
    """||J(l_t) v_t|| on the model: ``table`` has, per (normalizer, T), the max and the median over heads of the
    per-head mean over the rows t <= L."""

    names: list[str]
    Ts: list[float]
    table: pd.DataFrame

    @property
    def usable(self) -> dict[str, float]:
        return _ratio_at_smallest(self.table, "median", self.names)

    @property
    def keeps(self) -> dict[str, bool]:
        return {n: r >= USABLE for n, r in self.usable.items()}

    def medians(self) -> pd.DataFrame:
        """Median over heads of the per-head mean ||J v||, per normalizer (rows) and temperature (columns)."""
        return by_temperature(self.table, "median", self.names)

    def prose(self) -> dict:
        return {"m_keep": listing(n for n in self.names if self.keeps[n]),
                "m_lose": listing(n for n in self.names if not self.keeps[n]),
                "m_usable_ratios": listing(self.names, self.usable)}

    def self_adjust_claim(self) -> dict:
        sa = "self_adjust" if "self_adjust" in self.names else "self_adjust_normalized"
        return {"T": min(self.Ts), "normalizer": label(sa), "self_adjust": self.usable[sa],
                "softmax": self.usable["softmax"]}


def gradient_model(m: ModelLogits, names, Ts, seed: int) -> GradientModel:
    """The exact directional derivative ||J(l_t) v_t|| (``beyond.jvp``) of every normalizer at every T along one
    random unit direction v_t per row (seeded by ``seed + 1``, shared by all normalizers and temperatures): the
    eps -> 0 limit of Algorithm 5's g(T, eps), averaged per head over the rows t <= L."""
    gen = torch.Generator().manual_seed(seed + 1)
    main = m.blocks["main"]
    directions = [metrics.random_directions(b.mask.expand(b.logits.shape), gen) for b in main]
    frames = []
    for name in names:
        for T in Ts:
            for block, d in zip(main, directions):
                jv = beyond.jvp(block.logits, d, name, mask=block.mask, **norm_kw(name, T, m.s)).norm(dim=-1)
                frames.append(m.tidy(block.rows, name=name, T=T, g=jv))
    rows = pd.concat(frames, ignore_index=True)
    heads = pd.concat([m.head_means(rows[rows["T"] == T], "g", m.L).assign(T=T) for T in Ts], ignore_index=True)
    table = heads.groupby(["name", "T"]).g.agg(["max", "median"]).reset_index()
    table["normalizer"] = table.name.map(lambda n: registry.get(n).label)
    return GradientModel(list(names), list(Ts), table)


def plot_gradient_model(res: GradientModel, m: ModelLogits, seed: int) -> plt.Figure:
    """The directional derivative ||J v|| per head, averaged over rows, against T, one line per normalizer: (a) the
    largest head, as the paper's g, (b) the median head."""
    fig, axes = two_panels(sharey=True)
    for ax, stat in zip(axes, ("max", "median")):
        lines(res.table, "T", stat, ax, res.names)
        ax.set(xscale="log", yscale="log", xlabel="T (multiple of the model's own)",
               ylabel="mean $\\|Jv\\|$ of a head")
        ax.set_title("(a) largest head" if stat == "max" else "(b) median head", fontsize="medium")
    legend_below(fig, axes[0])
    figures.model_title(fig, f"Gradient lens on the model's logits (rows t ≤ {m.L}, seed {seed})", m.model)
    return fig
