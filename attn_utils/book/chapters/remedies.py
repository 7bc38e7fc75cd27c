"""Chapter ch6_beyond: the paper's four lenses applied to the remedies its Discussion names.

The mathematics (envelopes, closed-form Jacobians, the homogeneous distance and separability lenses, coverage
by several heads) is in :mod:`attn_utils.mathematics.lenses`; this module runs it over the chapter's grids, on
synthetic rows and on the logits a pretrained model produces, and turns the results into tidy tables (one row
per normalizer and grid value, or per layer, head and sampled row), the numbers of the prose, the values of
the ledger's claims and the figures. Every function takes the normalizers measured (``names``) so that the
chapter runs with any subset of :data:`attn_utils.mathematics.registry.COMPARED`.

The four lenses: Lemma 1 (weights vanish like 1/L when the logits are bounded, Eq. (3)), Theorem 1 (the
cumulative distance d~ of Eq. (7) against N and L), Theorem 2 (the separability N_s / N of Definition (10)) and
Lemma 2 / Corollary 3 (the sensitivity of the weights to the logits, Algorithm 5).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import psutil
import seaborn as sns
import torch

from attn_utils.book import figures
from attn_utils.book.formatting import fmt
from attn_utils.mathematics import algorithms, lenses, metrics, registry
from attn_utils.mathematics.normalizers import causal_mask
from attn_utils.models import capture

F64 = torch.float64
REL_TOL = 1e-9          # float64 rounding allowance when a bound is attained
A_SYN, GAP, S_SYN, T_SYN = 2.0, 2.0, 1.0, 1.0  # synthetic rows: logit bound a, planted gap g, SSMax s, temperature
D_SYN, N_SETS = 64, 4   # synthetic vectors: dimension and number of independent sets
L_G = 32                # keys per synthetic row of the gradient lens
T_FIT = 16              # the slope fits on the model ignore the rows shorter than this
KEEP_RATIO = 0.5        # a rule keeps the planted key: median weight at the largest L >= this x that at the smallest
GROWS = 0.5             # d~ "grows" with L if its log-log slope is at least this
USABLE = 0.1            # usable gradient: median norm at the smallest T >= this x its largest median over the grid
PAPER_BAND = (0.70, 0.85)  # the paper's separability plateau (Fig. 3)
# the lenses hold, besides the float64 logits of the sampled rows, temporaries of about twice their size (measured:
# peak memory grows by 2.9 bytes per byte of logits between 4 and 16 rows per octave on SmolLM2)
LENS_MEMORY = 3.0
#: Which rules Lemma 1 or Prop. ch6-prop-still-vanish force to vanish (the others escape, Prop. ch6-prop-escape).
VANISH_THEORY = {"softmax": True, "softmax1": True, "self_adjust": True, "self_adjust_normalized": True,
                 "ssmax": False, "sparsemax": False, "entmax15": False}
COLOR = figures.NORMALIZER_COLOURS
FIGSIZE = (7.4, 4.9)     # two panels side by side in the text column, and a legend of up to three rows below


# --- the normalizers ---------------------------------------------------------------------------------------


def label(name: str) -> str:
    return registry.get(name).label


def geometric(names) -> list[str]:
    """The normalizers whose rows are non-negative: the lenses of Theorems 1 and 2 need alpha >= 0."""
    return [n for n in names if registry.get(n).kind != "signed"]


def norm_kw(name: str, T: float, s: float) -> dict:
    """Keyword arguments of ``normalize``: every normalizer takes T, scalable softmax also s."""
    return registry.get(name).keywords(T=T, s=s)


def listing(names, value=None, digits: int = 3, percent: bool = False) -> str:
    """'label value, label value, ...' for the prose (only labels when ``value`` is None); 'none' when empty."""
    names = list(names)
    if not names:
        return "none"
    if value is None:
        return ", ".join(label(n) for n in names)
    text = (lambda v: f"{100 * v:.0f}%") if percent else (lambda v: fmt(v, digits))
    return ", ".join(f"{label(n)} {text(value[n])}" for n in names)


def _lines(data: pd.DataFrame, x: str, y: str, ax, names, *, legend=True) -> None:
    """One line per normalizer, in the colours and order of every figure of the chapter."""
    order = [label(n) for n in names]
    sns.lineplot(data=data, x=x, y=y, hue="normalizer", style="normalizer", hue_order=order, style_order=order,
                 markers=True, dashes=False, palette={label(n): COLOR[n] for n in names}, ax=ax, legend=legend)


def _n_axis(ax, values) -> None:
    """A log-scaled x axis with one plain tick per value (the top-N sizes)."""
    values = sorted(set(int(v) for v in values))
    ax.set_xscale("log")
    ax.set_xticks(values, [str(v) for v in values])
    ax.minorticks_off()


def _two_panels(sharey: bool = False):
    """A figure of two panels side by side that fits the text column, with room below for one legend."""
    return plt.subplots(1, 2, figsize=FIGSIZE, sharey=sharey, layout="constrained")


def _legend_below(fig, *axes, ncol: int = 3) -> None:
    """One legend for the whole figure, below its panels, from the labelled artists of ``axes`` (each label once);
    the per-panel legends go, so that no legend covers data."""
    entries = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(text, handle)
    for ax in fig.axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    fig.legend(list(entries.values()), list(entries), loc="outside lower center", ncol=ncol, frameon=False,
               fontsize=10)


def _nothing_to_draw(message: str) -> plt.Figure:
    """A figure that says why nothing is drawn, so that the chapter's figure directive always finds a figure."""
    fig, ax = plt.subplots(figsize=(7.4, 1.2), layout="constrained")
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    return fig


def _by_quantity(frame: pd.DataFrame, names, captions: dict[str, str]) -> dict[str, pd.DataFrame]:
    """One table per column of ``frame`` (one row per normalizer and N) named in ``captions``, keyed by its caption:
    rows the geometric normalizers of ``names`` in order, columns ``N = ...``."""
    order = [label(n) for n in geometric(names)]
    return {caption: frame.pivot(index="normalizer", columns="N", values=column).reindex(order)
            .rename(columns=lambda n: f"N = {n}").rename_axis(columns=None) for column, caption in captions.items()}


def _by_temperature(table: pd.DataFrame, column: str, names) -> pd.DataFrame:
    """``column`` of a table with one row per (normalizer, T): rows the normalizers of ``names``, columns ``T = ...``."""
    wide = table.pivot(index="normalizer", columns="T", values=column).reindex([label(n) for n in names])
    return wide.rename(columns=lambda T: f"T = {fmt(T)}").rename_axis(columns=None)


# --- Lens 1 on synthetic rows: envelopes and planted keys (Props. ch6-prop-still-vanish, ch6-prop-escape) ------


@dataclass
class Lemma1Synthetic:
    """Lemma 1's lens on synthetic rows: ``table`` has one row per (normalizer, family, L) with medians over rows."""

    names: list[str]
    lengths: list[int]
    n_trials: int
    table: pd.DataFrame
    envelope_violations: int
    planted_violations: int

    def _max(self, family: str, length: int) -> pd.Series:
        t = self.table
        return t[(t.family == family) & (t.L == length)].set_index("name")["max weight"]

    @property
    def planted_lo(self) -> pd.Series:
        return self._max("planted", min(self.lengths))

    @property
    def planted_hi(self) -> pd.Series:
        return self._max("planted", max(self.lengths))

    @property
    def escapes(self) -> dict[str, bool]:
        """Measured: the planted key keeps at least KEEP_RATIO of its weight from the smallest to the largest L."""
        return {n: bool(self.planted_hi[n] >= KEEP_RATIO * self.planted_lo[n]) for n in self.names}

    def extremes(self) -> pd.DataFrame:
        """Median largest weight at the smallest and the largest length, per normalizer and family."""
        t = self.table[self.table.L.isin([min(self.lengths), max(self.lengths)])]
        return t.pivot_table(index="normalizer", columns=["family", "L"], values="max weight").reindex(
            [label(n) for n in self.names])

    def prose(self) -> dict:
        lo, hi, esc = min(self.lengths), max(self.lengths), self.escapes
        typical = self._max("typical", hi)
        wrong = [n for n in self.names if esc[n] == VANISH_THEORY[n]]
        values = {"syn_a": A_SYN, "syn_gap": GAP, "syn_Lhi": hi, "syn_Llo": lo, "keep_ratio": KEEP_RATIO,
                  "syn_rows_lemma": 2 * len(self.lengths) * self.n_trials * len(self.names),
                  "env_violations": self.envelope_violations, "planted_violations": self.planted_violations,
                  "escapers": listing(n for n in self.names if esc[n]),
                  "vanishers": listing(n for n in self.names if not esc[n]),
                  "escape_match": "agrees with the two propositions for every normalizer" if not wrong else
                                  "disagrees with the propositions for " + listing(wrong),
                  "ssmax_approx": 2 * S_SYN * A_SYN * math.log(hi) / (T_SYN * hi)}
        for n in registry.COMPARED:  # every name, so that the prose resolves whichever normalizers were chosen
            values[f"planted_{n}"] = self.planted_hi[n] if n in self.names else "n/a (not measured)"
            values[f"typical_{n}"] = typical[n] if n in self.names else "n/a (not measured)"
        return values

    def envelope_claim(self) -> dict:
        return {"envelope_violations": self.envelope_violations, "planted_violations": self.planted_violations,
                "rows": 2 * len(self.lengths) * self.n_trials, "normalizers": len(self.names),
                "L_lo": min(self.lengths), "L_hi": max(self.lengths), "a": A_SYN, "g": GAP, "T": T_SYN, "s": S_SYN}

    def escape_claim(self) -> dict:
        lo, hi, esc = self.planted_lo, self.planted_hi, self.escapes
        return {"L_lo": min(self.lengths), "L_hi": max(self.lengths),
                "weights": "; ".join(f"{label(n)} {fmt(lo[n])} -> {fmt(hi[n])}" for n in self.names),
                "escapes": [esc[n] for n in self.names], "predicted": [not VANISH_THEORY[n] for n in self.names]}


def lemma1_synthetic(names, lengths, n_trials: int, generator: torch.Generator) -> Lemma1Synthetic:
    """For each length, ``n_trials`` typical rows (logits uniform on [-a, a]) and as many planted rows (key 0 ahead
    of every other logit by >= g), at T = 1 and SSMax s = 1. Every weight is checked against its envelope
    (``lenses.lemma1_envelope``) and every planted key of softmax, SSMax, sparsemax and 1.5-entmax against its
    guarantee (``lenses.planted_weight_bound``); a bound counts as violated beyond a relative REL_TOL."""
    names, lengths = list(names), list(lengths)
    rows, envelope_violations, planted_violations = [], 0, 0
    for length in lengths:
        for family in lenses.FAMILIES:
            logits = lenses.synthetic_rows(family, n_trials, length, A_SYN, GAP, generator=generator)
            for name in names:
                w = registry.normalize(logits, name, **norm_kw(name, T_SYN, S_SYN))
                st = lenses.row_stats(w)
                env = lenses.lemma1_envelope(name, A_SYN, length, T=T_SYN, s=S_SYN)
                envelope_violations += int(((st["max"] > env.upper * (1 + REL_TOL))
                                            | (st["min"] < env.lower * (1 - REL_TOL))).sum())
                if family == "planted" and name in ("softmax", "ssmax", "sparsemax", "entmax15"):
                    bound = lenses.planted_weight_bound(name, GAP, length, T=T_SYN, s=S_SYN)
                    planted_violations += int((w[:, 0] < bound * (1 - REL_TOL)).sum())
                rows.append({"normalizer": label(name), "name": name, "family": family, "L": length,
                             "max weight": float(st["max"].median()),
                             "L x max weight": float((length * st["max"]).median()),
                             "L x min weight": float((length * st["min"]).median()),
                             "support": float(st["support"].double().median()), "mass": float(st["mass"].median())})
    return Lemma1Synthetic(names, lengths, n_trials, pd.DataFrame(rows), envelope_violations, planted_violations)


def plot_lemma1_synthetic(res: Lemma1Synthetic, seed: int) -> plt.Figure:
    """Median largest weight against L, one line per normalizer: (a) typical rows, (b) rows with a planted key."""
    fig, axes = _two_panels(sharey=True)
    grid = np.array(res.lengths, dtype=float)
    titles = {"typical": f"(a) typical rows, logits in [-{A_SYN:g}, {A_SYN:g}]",
              "planted": f"(b) planted key, gap ≥ {GAP:g}"}
    for ax, family in zip(axes, lenses.FAMILIES):
        _lines(res.table[res.table.family == family], "L", "max weight", ax, res.names)
        ax.plot(grid, np.minimum(1, 1 / grid), ":", color="grey", label="$1/L$")
        ax.set(xscale="log", yscale="log", xlabel="row length $L$", ylabel="median of $\\max_i|\\alpha_i|$")
        ax.set_title(titles[family], fontsize="medium")
    _legend_below(fig, axes[0])
    figures.model_title(fig, f"Lemma 1 lens on synthetic rows ({res.n_trials} rows per point, seed {seed})",
                        "synthetic data, no model")
    return fig


# --- Lenses 2 and 3 on synthetic rows (Prop. ch6-prop-count) -------------------------------------------------


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
        return {n: lenses.loglog_slope(at[at.name == n].L, at[at.name == n].distance) for n in self.names}

    def at_longest(self) -> dict[str, pd.DataFrame]:
        """The tables the chapter shows, at the largest length: one per quantity, one column per N."""
        return _by_quantity(self.table[self.table.L == self.L_hi], self.names, {
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
    sum-of-norms reading) and N_s / N (Definition (10)) with ``lenses.geometry``, at N against every length and at
    every N of ``Ns`` at the largest length, and the bound of Prop. ch6-prop-count,
    |d~ - (L - N) ||s||| <= max_i ||x_i|| * (weight outside the top-N set), on every (row, N)."""
    names, lengths = geometric(names), list(lengths)
    L_hi = max(lengths)
    x_sets = lenses.unit_vectors((N_SETS, L_hi), D_SYN, generator=generator)
    per_set = max(1, n_trials // N_SETS)
    logit_sets = lenses.synthetic_rows("typical", N_SETS * per_set, L_hi, A_SYN, GAP, generator).view(N_SETS, per_set,
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
            for n_top, g in lenses.geometry(w, x, grid, sphere=x, keys=False).items():
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
    fig, axes = _two_panels()
    at_N, at_hi = res.table[res.table.N == res.N], res.table[res.table.L == res.L_hi]
    _lines(at_N, "L", "distance", axes[0], res.names)
    axes[0].set(xscale="log", yscale="log", xlabel="row length $L$", ylabel=f"median $\\tilde d$ (N = {res.N})")
    axes[0].set_title("(a) against the length", fontsize="medium")
    _lines(at_hi, "N", "distance", axes[1], res.names)
    axes[1].set(yscale="log", xlabel="top-N size $N$", ylabel="median $\\tilde d$")
    axes[1].set_title(f"(b) against N (L = {res.L_hi})", fontsize="medium")
    _n_axis(axes[1], at_hi.N)
    _legend_below(fig, axes[0])
    figures.model_title(fig, f"Theorem 1 lens on synthetic rows (seed {seed})", "synthetic data, no model")
    return fig


def plot_separability_synthetic(res: GeometrySynthetic, seed: int) -> plt.Figure:
    """Mean N_s / N of synthetic rows against N at the largest length, one line per normalizer."""
    fig, ax = plt.subplots(figsize=(6.4, 4.8), layout="constrained")
    at_hi = res.table[res.table.L == res.L_hi]
    _lines(at_hi, "N", "separability", ax, res.names)
    ax.set(xlabel="top-N size $N$", ylabel="mean $N_s/N$", ylim=(0, 1.05))
    _n_axis(ax, at_hi.N)
    _legend_below(fig, ax)
    figures.model_title(fig, f"Theorem 2 lens on synthetic rows (L = {res.L_hi}, seed {seed})",
                        "synthetic data, no model")
    return fig


# --- Lens 4 on synthetic rows (Prop. ch6-prop-jacobians) -----------------------------------------------------


def _ratio_at_smallest(table: pd.DataFrame, column: str, names) -> dict[str, float]:
    """Per normalizer: ``column`` at the smallest T over its largest value on the grid (0 if that is 0)."""
    out = {}
    for name in names:
        sub = table[table.name == name].set_index("T")[column]
        out[name] = float(sub.loc[min(sub.index)] / sub.max()) if sub.max() > 0 else 0.0
    return out


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
        return _by_temperature(self.table, "median norm", self.names)

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
    """Rows whose ||J||_2 breaks Prop. ch6-prop-jacobians: <= 1/(2T) (softmax, softmax-1), <= s log(n)/(2T)
    (SSMax), <= 1/T (1.5-entmax), exactly 1/T or 0 by the support size (sparsemax); no bound for self-adjust."""
    if name in ("softmax", "softmax1"):
        return int((norm > (1 + REL_TOL) / (2 * T)).sum())
    if name == "ssmax":
        return int((norm > (1 + REL_TOL) * S_SYN * math.log(rows.shape[-1]) / (2 * T)).sum())
    if name == "entmax15":
        return int((norm > (1 + REL_TOL) / T).sum())
    if name == "sparsemax":
        support = (registry.normalize(rows, "sparsemax", T=T) > 0).sum(-1)
        expected = torch.where(support >= 2, torch.full_like(norm, 1 / T), torch.zeros_like(norm))
        return int(((norm - expected).abs() > REL_TOL * (1 + expected)).sum())
    return 0


def gradient_synthetic(names, Ts, n_trials: int, generator: torch.Generator) -> GradientSynthetic:
    """The closed-form Jacobians (``lenses.jacobian``) against autograd on 3 rows at T = 0.5, then the exact spectral
    norm ||J||_2 of ``n_trials`` typical rows of L_G keys at every T of ``Ts``, checked against its bound."""
    names = list(names)
    check_rows = lenses.synthetic_rows("typical", 3, L_G, A_SYN, GAP, generator)
    error = 0.0
    for name in names:
        J = lenses.jacobian(check_rows, name, **norm_kw(name, 0.5, S_SYN))
        for r in range(len(check_rows)):
            auto = torch.autograd.functional.jacobian(
                lambda row: registry.normalize(row.unsqueeze(0), name, **norm_kw(name, 0.5, S_SYN))[0], check_rows[r])
            error = max(error, float((auto - J[r]).abs().max() / auto.abs().max().clamp(min=1e-300)))
    rows = lenses.synthetic_rows("typical", n_trials, L_G, A_SYN, GAP, generator)
    table, violations = [], 0
    for name in names:
        for T in Ts:
            norm = torch.linalg.matrix_norm(lenses.jacobian(rows, name, **norm_kw(name, T, S_SYN)), ord=2)
            violations += _norm_violations(name, norm, rows, T)
            table.append({"normalizer": label(name), "name": name, "T": T, "median norm": float(norm.median()),
                          "median T x norm": float((T * norm).median()),
                          "share of zero Jacobians": float((norm == 0).double().mean())})
    return GradientSynthetic(names, list(Ts), n_trials, pd.DataFrame(table), error, violations)


def plot_gradient_synthetic(res: GradientSynthetic, seed: int) -> plt.Figure:
    """Against T, one line per normalizer: (a) the median spectral norm ||J||_2 with 1/(2T) and 1/T, (b) the share
    of rows whose Jacobian is exactly zero."""
    fig, axes = _two_panels()
    _lines(res.table, "T", "median norm", axes[0], res.names)
    T_dense = np.logspace(np.log10(min(res.Ts)), np.log10(max(res.Ts)), 100)
    axes[0].plot(T_dense, 1 / (2 * T_dense), "k--", lw=1, label="$1/(2T)$")
    axes[0].plot(T_dense, 1 / T_dense, "k:", lw=1, label="$1/T$")
    axes[0].set(xscale="log", yscale="symlog", xlabel="temperature $T$", ylabel="median $\\|J\\|_2$")
    axes[0].set_ylim(bottom=0)
    axes[0].set_title("(a) the norm of the Jacobian", fontsize="medium")
    _lines(res.table, "T", "share of zero Jacobians", axes[1], res.names)
    axes[1].set(xscale="log", xlabel="temperature $T$", ylabel="share of rows with $J = 0$", ylim=(-0.02, 1.02))
    axes[1].set_title("(b) rows with no gradient at all", fontsize="medium")
    _legend_below(fig, axes[0])
    figures.model_title(fig, f"Gradient lens on synthetic rows ({L_G} keys, {res.n_trials} rows, seed {seed})",
                        "synthetic data, no model")
    return fig


# --- the model's logits ----------------------------------------------------------------------------------------


@dataclass
class Block:
    """Sampled query rows of one octave: ``rows`` (0-based), K = keys the last of them sees, the scaled logits
    ``(layers, heads, len(rows), K)`` in float64 and the causal ``mask`` ``(len(rows), K)``."""

    rows: np.ndarray
    K: int
    logits: torch.Tensor
    mask: torch.Tensor


@dataclass
class ModelLogits:
    """What the chapter keeps of one forward pass over the window of ``L_run`` >= L tokens: the scaled logits
    l = q.k * scaling of the sampled query rows (``blocks["main"]``: rows t <= L; ``blocks["extra"]``: the further
    rows of the longer windows) and every head's value vectors."""

    model: str
    context: int
    L: int
    long_lengths: list[int]
    rows_per_octave: int | None
    samples: dict[int, tuple[np.ndarray, np.ndarray]]
    blocks: dict[str, list[Block]]
    values: torch.Tensor        # (layers, heads, L_run, d), the model's dtype
    softmax_error: float        # max |softmax of our logits - the model's attention| (sanity check)
    kv_heads: int

    @property
    def L_run(self) -> int:
        return max([self.L, *self.long_lengths])

    @property
    def s(self) -> float:
        """SSMax's parameter on the model, 1 / log L: it coincides with the model's softmax on a row of L keys."""
        return 1.0 / math.log(self.L)

    @property
    def n_layers(self) -> int:
        return int(self.values.shape[0])

    @property
    def device(self) -> torch.device:
        """Where the logits are kept and analysed: the device the model ran on."""
        return self.values.device

    @property
    def n_heads(self) -> int:
        return int(self.values.shape[1])

    @property
    def main_rows(self) -> np.ndarray:
        return self.samples[self.L][0]

    @property
    def n_extra_rows(self) -> int:
        return sum(len(b.rows) for b in self.blocks.get("extra", []))

    def row_weights(self, length: int) -> pd.Series:
        """Row index -> how many rows it stands for among the rows t <= length (exact at octave ends): the sample of
        that length, or the complete octaves of the L sample for a power of two below L."""
        if length in self.samples:
            rows, weight = self.samples[length]
        else:
            keep = self.samples[self.L][0] < length
            rows, weight = self.samples[self.L][0][keep], self.samples[self.L][1][keep]
        return pd.Series(weight, index=rows)

    def head_means(self, frame: pd.DataFrame, column: str, length: int) -> pd.DataFrame:
        """Per (normalizer, layer, head): the weighted mean of ``column`` over the valid sampled rows t <= length,
        each row weighted by the rows it stands for (the estimator of chapter ch2_distance)."""
        weights = self.row_weights(length)
        sub = frame[frame.row.isin(weights.index)].copy()
        sub["w"] = sub.row.map(weights) * sub[column].notna()
        sub["wx"] = sub.w * sub[column].fillna(0)
        out = sub.groupby(["name", "layer", "head"])[["wx", "w"]].sum()
        return (out.wx / out.w.replace(0, np.nan)).rename(column).reset_index()

    def tidy(self, rows: np.ndarray, **columns) -> pd.DataFrame:
        """A frame with one row per (layer, head, sampled row) from ``(layers, heads, rows)`` tensors or scalars."""
        n = len(rows)
        base = {"layer": np.repeat(np.arange(self.n_layers), self.n_heads * n),
                "head": np.tile(np.repeat(np.arange(self.n_heads), n), self.n_layers),
                "row": np.tile(rows, self.n_layers * self.n_heads)}
        return pd.DataFrame({**{k: v.flatten().cpu().numpy() if torch.is_tensor(v) else v for k, v in columns.items()},
                             **base})

    def facts(self, session_summary: dict) -> pd.DataFrame:
        return pd.Series({**session_summary, "window read": f"{self.L_run} tokens (rows t <= {self.L} for the "
                                                            "normalizer lenses)"}, name="value").to_frame()

    def prose(self) -> dict:
        return {"model_name": self.model, "m_L": self.L, "m_Lrun": self.L_run, "m_rows": len(self.main_rows),
                "m_heads": f"{self.n_layers} layers x {self.n_heads} heads = {self.n_layers * self.n_heads} heads",
                "m_rows_extra": self.n_extra_rows, "m_err": self.softmax_error, "m_s": fmt(self.s, 4),
                "m_every_row_gib": fmt(lens_memory({"n_layers": self.n_layers, "n_heads": self.n_heads},
                                                   _row_sets(self.L, self.long_lengths, None)[2]) / 2**30)}


def capture_logits(session, long_lengths, rows_per_octave, threads: int | None = None) -> ModelLogits:
    """One forward pass over the longest window (``Session.longer``; ``long_lengths`` resolved by
    ``lenses.resolve_long_lengths`` against the model's context), keeping layer by layer the scaled logits of the
    rows sampled per octave (``algorithms.sample_rows``, grouped by ``algorithms.octave_blocks``) and the value
    vectors. Checks on the last block of every layer that softmax of the kept logits is the model's attention.
    ``threads``: torch threads for the forward pass (the chapter's small operations run on one)."""
    L = session.L
    long_run = lenses.resolve_long_lengths(long_lengths, L, session.context)  # ValueError names long_lengths
    reader = session.longer(max([L, *long_run]))
    samples, row_sets, groups = _row_sets(L, long_run, rows_per_octave)
    main, device = row_sets["main"], reader.input_ids.device
    _check_memory(lens_memory(session.provenance.architecture, groups), rows_per_octave, reader.L, device)
    stored = {g: [[] for _ in blocks] for g, blocks in groups.items()}
    values, check = [], {"err": 0.0}

    def collect(layer):  # on the session's device, where the forward pass runs and the lenses then run
        q, k, v, w = (t[0] for t in (layer.q, layer.k, layer.v, layer.weights))
        for g, blocks in groups.items():
            for b, (pos, K) in enumerate(blocks):
                rows = torch.as_tensor(row_sets[g][pos], device=device)
                stored[g][b].append((q[:, rows] @ k[:, :K].mT) * layer.scaling)
        values.append(v.clone())
        pos, K = groups["main"][-1]
        rows = torch.as_tensor(main[pos], device=device)
        ours = torch.softmax(stored["main"][-1][-1].masked_fill(~causal_mask(K, device=device)[rows], -torch.inf), -1)
        check["err"] = max(check["err"], float((ours - w[:, rows, :K]).abs().max()))

    previous = torch.get_num_threads()
    torch.set_num_threads(threads or previous)
    try:
        capture.capture(reader.model, reader.input_ids, collect, dtype=None, what=("q", "k", "v", "weights"))
    finally:
        torch.set_num_threads(previous)
    blocks = {g: [Block(row_sets[g][pos], K, torch.stack(stored[g][b]).to(F64),
                        causal_mask(K, device=device)[torch.as_tensor(row_sets[g][pos], device=device)])
                  for b, (pos, K) in enumerate(blocks)]
              for g, blocks in groups.items()}
    arch = session.provenance.architecture
    return ModelLogits(session.name, session.context, L, long_run, rows_per_octave, samples, blocks,
                       torch.stack(values), check["err"], int(arch.get("n_kv_heads") or arch["n_heads"]))


def _row_sets(L: int, long_run: list[int], rows_per_octave):
    """The sampled rows of each length (``algorithms.sample_rows``), the rows kept (``main``: t <= L; ``extra``: the
    further rows of the longer windows) and their blocks of one octave each (``algorithms.octave_blocks``)."""
    samples = {Lp: algorithms.sample_rows(Lp, rows_per_octave) for Lp in [L, *long_run]}
    main = samples[L][0]
    extra = np.setdiff1d(np.concatenate([samples[Lp][0] for Lp in long_run]), main) if long_run else np.array([], int)
    row_sets = {"main": main, **({"extra": extra} if len(extra) else {})}
    return samples, row_sets, {g: algorithms.octave_blocks(rows) for g, rows in row_sets.items()}


def lens_memory(arch: dict, groups: dict) -> float:
    """Bytes that the lenses need for the blocks ``groups`` of a row sample (:func:`_row_sets`): the float64 logits
    of its (row, key) pairs in every layer and head, times :data:`LENS_MEMORY` for the temporaries."""
    keys = sum(len(pos) * K for blocks in groups.values() for pos, K in blocks)
    return LENS_MEMORY * 8 * keys * arch["n_layers"] * arch["n_heads"]


def _check_memory(need: float, rows_per_octave, L_run: int, device: torch.device) -> None:
    """Refuse, before the forward pass, a row sample that needs ``need`` bytes (:func:`lens_memory`) when that
    does not fit in the memory available now on ``device`` (a GPU's free memory, or the machine's): the chapter
    would otherwise be killed minutes later for want of memory."""
    available = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else psutil.virtual_memory().available
    if need > available:
        raise ValueError(f"rows_per_octave={rows_per_octave!r} over a {L_run}-token window needs about "
                         f"{need / 2**30:.3g} GiB for the logits of its rows and the lenses' temporaries, and "
                         f"{available / 2**30:.3g} GiB of memory is available; sample fewer rows (a smaller "
                         f"rows_per_octave) or read a shorter window (long_lengths)")


# --- Lens 1 on the model -----------------------------------------------------------------------------------------


@dataclass
class Lemma1Model:
    """Lemma 1's lens on the model: ``rows`` has one row per (normalizer, layer, head, sampled row); ``curve`` the
    medians over heads per (normalizer, t)."""

    names: list[str]
    L: int
    rows: pd.DataFrame
    curve: pd.DataFrame

    def _slope(self, name: str, column: str, lo: float = T_FIT, hi: float | None = None) -> float:
        c = self.curve[(self.curve.name == name) & (self.curve.t >= lo) & (self.curve.t <= (hi or self.L))]
        return lenses.loglog_slope(c.t, c[column])

    @property
    def slopes(self) -> dict[str, float]:
        """Log-log slope of the median largest weight, first token excluded, over T_FIT <= t <= L."""
        return {n: self._slope(n, "max, token 0 excluded") for n in self.names}

    def continued_slope(self, name: str) -> float:
        """The same slope over the rows t > L of the longer window (NaN without one)."""
        if name not in self.names:
            return float("nan")
        return self._slope(name, "max, token 0 excluded", lo=self.L + 1, hi=math.inf)

    @property
    def zeros(self) -> pd.Series:
        return self.rows[self.rows.t <= self.L].groupby("name").zeros.mean()

    @property
    def entropy(self) -> pd.Series:
        return self.rows[self.rows.t <= self.L].groupby("name").entropy.median().clip(lower=0.0) + 0.0  # no "-0"

    def table(self) -> pd.DataFrame:
        last = self.curve[self.curve.t == self.curve[self.curve.t <= self.L].t.max()].set_index("name")
        return pd.DataFrame({
            f"slope of median max (token 0 excluded), t >= {T_FIT}": self.slopes,
            "slope of median max (all keys)": {n: self._slope(n, "max") for n in self.names},
            "median max at the last row <= L": last["max, token 0 excluded"], "share of exact zeros": self.zeros,
            "median entropy": self.entropy}).reindex(self.names).rename(index=lambda n: registry.get(n).label)

    def prose(self) -> dict:
        slopes, soft = self.slopes, self.slopes.get("softmax", float("nan"))
        values = {f"mslope_{n}": slopes[n] if n in self.names else "n/a (not measured)" for n in registry.COMPARED}
        sparse = [n for n in self.names if n in ("sparsemax", "entmax15")]
        values.update({
            "T_FIT": T_FIT,
            "m_zeros_sparse": listing(sparse, self.zeros, percent=True) if sparse else
                              "no sparse normalizer in this run",
            "m_entropy": listing([n for n in self.names if registry.get(n).kind == "distribution"], self.entropy),
            "m_soft_flat": "On this model the largest weight of softmax itself hardly decays with t, so the "
                           "re-normalized logits cannot show an advantage of the length-aware rule; the planted "
                           "rows of the synthetic check can." if "softmax" in self.names and abs(soft) <= 0.2 else
                           "Softmax's largest weight decays with t on this model; the rules whose slope is closer to 0 "
                           "keep more weight on a single content token."})
        return values

    def ssmax_claim(self) -> dict:
        return {"ssmax": self.slopes["ssmax"], "softmax": self.slopes["softmax"], "t_fit": T_FIT, "L": self.L}

    def sparse_claim(self) -> dict:
        sparse = [n for n in ("sparsemax", "entmax15") if n in self.names]
        zeros, entropy = self.zeros, self.entropy
        return {"zeros": [float(zeros[n]) for n in sparse], "entropies": [float(entropy[n]) for n in sparse],
                "softmax_entropy": float(entropy["softmax"]),
                "rules": "; ".join(f"{label(n)}: {100 * zeros[n]:.0f}% exact zeros, median entropy {fmt(entropy[n])}"
                                   for n in sparse)}


def lemma1_model(m: ModelLogits, names) -> Lemma1Model:
    """Every normalizer on every sampled row at T = 1 (SSMax with s = 1/log L): the largest weight magnitude, the
    same without the first key (the attention sink), the share of exact zeros, the mass and the entropy."""
    frames = []
    for block in (b for blocks in m.blocks.values() for b in blocks):
        for name in names:
            w = registry.normalize(block.logits, name, mask=block.mask, **norm_kw(name, 1.0, m.s))
            st = lenses.row_stats(w, block.mask)
            nosink = lenses.row_stats(w[..., 1:], block.mask[:, 1:])["max"] if block.K > 1 else \
                torch.full_like(st["max"], torch.nan)
            entropy = -torch.special.xlogy(w, w).sum(-1) if registry.get(name).kind == "distribution" else \
                torch.full_like(st["max"], torch.nan)
            frames.append(m.tidy(block.rows, name=name, normalizer=label(name), max=st["max"],
                                 **{"max, token 0 excluded": nosink},
                                 zeros=1 - st["support"].double() / st["length"].double(), mass=st["mass"],
                                 entropy=entropy))
    rows = pd.concat(frames, ignore_index=True)
    rows["t"] = rows.row + 1
    curve = rows.groupby(["name", "normalizer", "t"])[["max", "max, token 0 excluded"]].median().reset_index()
    return Lemma1Model(list(names), m.L, rows, curve)


def plot_lemma1_model(res: Lemma1Model, m: ModelLogits, corpus: str) -> plt.Figure:
    """Median over heads of the largest weight against the row length t, one line per normalizer: (a) all keys,
    (b) the first key (the attention sink) left out; a grey line at t = L when a longer window was read."""
    fig, axes = _two_panels(sharey=True)
    t = res.curve.t.unique()
    for ax, column, title in zip(axes, ("max", "max, token 0 excluded"), ("(a) all keys", "(b) first key left out")):
        _lines(res.curve, "t", column, ax, res.names)
        ax.plot(t, 1 / t, ":", color="grey", label="$1/t$")
        if m.long_lengths:
            ax.axvline(m.L, color="0.5", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="row length $t$ (keys seen)",
               ylabel="median over heads of $\\max_i|\\alpha_i|$")
        ax.set_title(title, fontsize="medium")
    _legend_below(fig, axes[0])
    figures.model_title(fig, f"Lemma 1 lens on the model's logits, re-normalized ({m.L_run}-token window)", m.model)
    return fig


# --- Lenses 2 and 3 on the model -------------------------------------------------------------------------------


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
        return _by_quantity(self.summary, self.names, {
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
    """``lenses.geometry`` on every sampled row t <= L of every head (value vectors; on the sphere for N_s / N) for
    N and every N of ``Ns``; at N also the share of d~ that is the count term (L_r - N) ||s|| of Prop.
    ch6-prop-count. The fast path is checked against the library route (``lenses.lens_distance`` and
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
            result = lenses.geometry(w, v[:, :, :block.K], grid_b, block.mask, sphere=sphere[:, :, :block.K],
                                     keys=name == "softmax")
            for n_top, g in result.items():
                frame = m.tidy(block.rows, name=name, N=n_top, distance=g.distance, separability=g.separability,
                               support=support)
                if n_top == N:
                    s_norm = (torch.where(g.selected, w, 0.0) @ v[:, :, :block.K]).norm(dim=-1)
                    frame["count share"] = (((block.mask.sum(-1) - n_top) * s_norm) / g.distance).flatten().cpu().numpy()
                frames.append(frame)
                if name == "softmax" and n_top in coverage_inputs:
                    coverage_inputs[n_top].append((g.selected, g.separated, g.valid))
    rows = pd.concat(frames, ignore_index=True)
    last = main[-1]
    n_chk, vk = min(N, last.K - 1), v[:1, :, :last.K]
    w0 = registry.normalize(last.logits[:1], "softmax1", mask=last.mask)
    fast = lenses.geometry(w0, vk, n_chk, last.mask, keys=False)
    route = max(np.nanmax(np.abs((fast.distance - lenses.lens_distance(w0, vk, n_chk, last.mask)).cpu().numpy())),
                np.nanmax(np.abs((fast.separability - lenses.lens_separability(w0, vk, n_chk, last.mask)).cpu().numpy())))
    return GeometryModel(names, N, grid, rows, _geometry_summary(m, rows, grid), float(route), coverage_inputs)


def _geometry_summary(m: ModelLogits, rows: pd.DataFrame, grid) -> pd.DataFrame:
    """Per (normalizer, N): the medians over heads of the per-head means of d~, N_s / N and N_s / N on the rows whose
    support holds N keys, and the share of valid rows t <= L whose support is smaller than N."""
    def heads(frame, column):
        return pd.concat([m.head_means(frame[frame.N == n], column, m.L).assign(N=n) for n in grid], ignore_index=True)

    full = rows[rows.support >= rows.N]
    valid = rows[(rows.row + 1 > rows.N) & (rows.row < m.L)]
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
    fig, axes = _two_panels()
    _lines(res.summary, "N", "distance", axes[0], res.names)
    axes[0].set(yscale="log", xlabel="top-N size $N$", ylabel="median over heads of mean $\\tilde d$")
    axes[0].set_title("(a) distance", fontsize="medium")
    _lines(res.summary, "N", "separability", axes[1], res.names)
    axes[1].axhspan(*PAPER_BAND, color="0.85", alpha=0.6, zorder=0, label="the paper's 0.70–0.85")
    axes[1].set(xlabel="top-N size $N$", ylabel="median over heads of mean $N_s/N$", ylim=(0, 1.05))
    axes[1].set_title("(b) separability", fontsize="medium")
    for ax in axes:
        _n_axis(ax, res.summary.N)
    _legend_below(fig, *axes)
    figures.model_title(fig, f"Theorem 1 and 2 lenses on the model's logits, re-normalized (L = {m.L})", m.model)
    return fig


# --- Lens 4 on the model -------------------------------------------------------------------------------------------


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
        return _by_temperature(self.table, "median", self.names)

    def prose(self) -> dict:
        return {"m_keep": listing(n for n in self.names if self.keeps[n]),
                "m_lose": listing(n for n in self.names if not self.keeps[n]),
                "m_usable_ratios": listing(self.names, self.usable)}

    def self_adjust_claim(self) -> dict:
        sa = "self_adjust" if "self_adjust" in self.names else "self_adjust_normalized"
        return {"T": min(self.Ts), "normalizer": label(sa), "self_adjust": self.usable[sa],
                "softmax": self.usable["softmax"]}


def gradient_model(m: ModelLogits, names, Ts, seed: int) -> GradientModel:
    """The exact directional derivative ||J(l_t) v_t|| (``lenses.jvp``) of every normalizer at every T along one
    random unit direction v_t per row (seeded by ``seed + 1``, shared by all normalizers and temperatures): the
    eps -> 0 limit of Algorithm 5's g(T, eps), averaged per head over the rows t <= L."""
    gen = torch.Generator().manual_seed(seed + 1)
    main = m.blocks["main"]
    directions = [metrics.random_directions(b.mask.expand(b.logits.shape), gen) for b in main]
    frames = []
    for name in names:
        for T in Ts:
            for block, d in zip(main, directions):
                jv = lenses.jvp(block.logits, d, name, mask=block.mask, **norm_kw(name, T, m.s)).norm(dim=-1)
                frames.append(m.tidy(block.rows, name=name, T=T, g=jv))
    rows = pd.concat(frames, ignore_index=True)
    heads = pd.concat([m.head_means(rows[rows["T"] == T], "g", m.L).assign(T=T) for T in Ts], ignore_index=True)
    table = heads.groupby(["name", "T"]).g.agg(["max", "median"]).reset_index()
    table["normalizer"] = table.name.map(lambda n: registry.get(n).label)
    return GradientModel(list(names), list(Ts), table)


def plot_gradient_model(res: GradientModel, m: ModelLogits, seed: int) -> plt.Figure:
    """The directional derivative ||J v|| per head, averaged over rows, against T, one line per normalizer: (a) the
    largest head, as the paper's g, (b) the median head."""
    fig, axes = _two_panels(sharey=True)
    for ax, stat in zip(axes, ("max", "median")):
        _lines(res.table, "T", stat, ax, res.names)
        ax.set(xscale="log", yscale="log", xlabel="T (multiple of the model's own)",
               ylabel="mean $\\|Jv\\|$ of a head")
        ax.set_title("(a) largest head" if stat == "max" else "(b) median head", fontsize="medium")
    _legend_below(fig, axes[0])
    figures.model_title(fig, f"Gradient lens on the model's logits (rows t ≤ {m.L}, seed {seed})", m.model)
    return fig


# --- summary ---------------------------------------------------------------------------------------------------------


def summary(names, lem: Lemma1Synthetic, geo_syn: GeometrySynthetic, grad_syn: GradientSynthetic,
            lem_m: Lemma1Model, geo_m: GeometryModel, grad_m: GradientModel) -> tuple[pd.DataFrame, str, str]:
    """The summary table (one row per normalizer), a sentence per normalizer assembled from the same numbers, and
    the sentence on which rules both escape Lemma 1 and keep a usable gradient."""
    lo, hi, esc = lem.planted_lo, lem.planted_hi, lem.escapes
    slopes, zeros, syn_slopes = lem_m.slopes, lem_m.zeros, geo_syn.slopes
    sep, dist = geo_m.at(geo_m.N_max), geo_m.at(geo_m.N)
    keeps = {n: grad_syn.keeps[n] and grad_m.keeps[n] for n in names}
    geo = set(geo_m.names)
    table = pd.DataFrame({label(n): {
        "rows are": registry.get(n).kind,
        "forced to vanish (Lemma 1 or Prop.)": fmt(VANISH_THEORY[n]),
        f"planted key, weight at L={min(lem.lengths)} -> {max(lem.lengths)} (synthetic)":
            f"{fmt(lo[n])} -> {fmt(hi[n])}",
        "escapes Lemma 1 (measured)": fmt(esc[n]),
        "model: slope of max weight vs t (token 0 excluded)": fmt(slopes[n], 2),
        "model: exact zeros": f"{100 * zeros[n]:.0f}%",
        f"synthetic: slope of d~ vs L (N={geo_syn.N})": fmt(syn_slopes[n], 2) if n in geo else "n/a (signed)",
        f"model: d~ at N={geo_m.N}": fmt(dist.loc[n, "distance"]) if n in geo else "n/a (signed)",
        f"model: N_s/N at N={geo_m.N_max}": fmt(sep.loc[n, "separability"], 2) if n in geo else "n/a (signed)",
        f"gradient kept at T={fmt(min(grad_syn.Ts))} (synthetic, model)":
            f"{fmt(grad_syn.usable[n], 2)}, {fmt(grad_m.usable[n], 2)}",
        "keeps a usable gradient": fmt(keeps[n])} for n in names}).T
    table.index.name = "normalizer"

    def sentence(n: str) -> str:
        parts = ["escapes Lemma 1" if esc[n] else "does not escape Lemma 1"]
        mine = sep.loc[n, "separability"] if n in geo else None
        if n == "softmax":
            parts.append(f"separates {fmt(mine, 2)} of its top {geo_m.N_max} (the reference)")
        elif n in geo:
            ref = sep.loc["softmax", "separability"] if "softmax" in sep.index else float("nan")
            relation = ("" if not math.isfinite(ref) else " about as much as softmax" if abs(mine - ref) <= 0.05 else
                        " more than softmax" if mine > ref else " less than softmax")
            short = sep.loc[n, "support < N"]
            tail = f"; its support is smaller than N on {100 * short:.0f}% of the rows)" if short > 0.5 else ")"
            parts.append(f"separates{relation} at N = {geo_m.N_max} ({fmt(mine, 2)}{tail}")
        else:
            parts.append("has no distance or separability (signed weights)")
        parts.append("keeps a usable gradient at small T" if keeps[n] else "loses its gradient at small T")
        return f"{label(n)}: " + ", ".join(parts) + "."

    both = [n for n in names if esc[n] and keeps[n]]
    both_text = (f"Only {listing(both)} both escapes Lemma 1 and keeps a usable gradient" if both else
                 "No rule measured here both escapes Lemma 1 and keeps a usable gradient")
    return table, " ".join(sentence(n) for n in names), both_text


def summary_tables(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The summary table of :func:`summary` in two parts that each fit the text column, keyed by their captions: the
    columns of Lemma 1's lens, then those from the distance lens on."""
    cut = next(i for i, c in enumerate(table.columns) if c.startswith("synthetic: slope of d~"))
    return {"The remedies under Lemma 1's lens": table.iloc[:, :cut],
            "The remedies under the distance, separability and gradient lenses": table.iloc[:, cut:]}


# --- beyond L: the paper's curves on the longer window -----------------------------------------------------------


@dataclass
class LongContext:
    """The paper's curves with the model's own softmax up to the longest window: ``curves`` one row per window
    length L' (mean and median over heads of the per-head mean d~ at N, Fig. 2a), ``separability`` one row per
    (window, N) (median over heads, Fig. 3)."""

    m: ModelLogits = field(repr=False)
    N: int
    grid: list[int]
    curves: pd.DataFrame
    separability: pd.DataFrame

    def _slope(self, part: pd.DataFrame) -> float:
        return lenses.loglog_slope(part.L, part.distance) if len(part) >= 2 else float("nan")

    @property
    def slope_below(self) -> float:
        return self._slope(self.curves[self.curves.L <= self.m.L]) if len(self.curves) else float("nan")

    @property
    def slope_above(self) -> float:
        return self._slope(self.curves[self.curves.L >= self.m.L]) if len(self.curves) else float("nan")

    @property
    def N_plateau(self) -> int:
        L = self.m.L
        return max((n for n in self.grid if 16 <= n < L), default=max((n for n in self.grid if n < L), default=self.N))

    def plateau(self, length: int) -> float:
        """Median over heads of N_s / N at N_plateau on the window of ``length`` tokens (NaN if not measured)."""
        s = self.separability
        hit = s[(s.Lp == length) & (s.N == self.N_plateau)] if len(s) else s
        return float(hit.separability.iloc[0]) if len(hit) else float("nan")

    def prose(self, lem_m: Lemma1Model) -> dict:
        m, long = self.m, bool(self.m.long_lengths)
        return {"long_text": f"{m.model} has a context of {m.context} tokens, so we read windows of "
                             f"{', '.join(map(str, m.long_lengths))} tokens as well." if long else
                             f"{m.model} has a context of {m.context} tokens: no window longer than L = {m.L} fits, so "
                             "this part shows the curves up to L only and its claims are not comparable.",
                "slope_below": fmt(self.slope_below, 2),
                "slope_above": fmt(self.slope_above, 2) if long else "n/a (no longer window)",
                "N_plateau": self.N_plateau, "sep_L": self.plateau(m.L),
                "sep_Lrun": self.plateau(m.L_run) if long else "n/a",
                "cont_softmax": fmt(lem_m.continued_slope("softmax") if long else float("nan"), 2),
                "cont_ssmax": fmt(lem_m.continued_slope("ssmax") if long else float("nan"), 2)}

    def distance_claim(self) -> dict:
        return {"N": self.N, "L": self.m.L, "L_run": self.m.L_run, "longer": bool(self.m.long_lengths),
                "slope_above": self.slope_above, "slope_below": self.slope_below}

    def separability_claim(self) -> dict:
        return {"N": self.N_plateau, "L": self.m.L, "L_run": self.m.L_run, "longer": bool(self.m.long_lengths),
                "at_L": self.plateau(self.m.L), "at_L_run": self.plateau(self.m.L_run)}


def long_context(m: ModelLogits, geo: GeometryModel) -> LongContext:
    """Softmax's d~ and N_s / N on the rows t > L of the longer window, added to those of the rows t <= L; then per
    window length L' (the powers of two from 32 below L, L and the long lengths) the row-weighted means per head
    over the rows t <= L' (causal mask: they are the rows of an L'-token window at the same offset)."""
    soft = [geo.rows[geo.rows.name == "softmax"]] if "softmax" in geo.names else []
    if soft and m.blocks.get("extra"):
        v = m.values.to(F64)
        sphere = metrics.project_to_sphere(v)
        for block in m.blocks["extra"]:
            w = registry.normalize(block.logits, "softmax", mask=block.mask)
            result = lenses.geometry(w, v[:, :, :block.K], [n for n in geo.grid if n < block.K], block.mask,
                                     sphere=sphere[:, :, :block.K], keys=False)
            soft += [m.tidy(block.rows, name="softmax", N=n, distance=g.distance, separability=g.separability)
                     for n, g in result.items()]
    soft = pd.concat(soft, ignore_index=True) if soft else pd.DataFrame()
    lengths = sorted({2 ** k for k in range(5, 40) if 2 ** k < m.L} | {m.L} | set(m.long_lengths))
    curves, sep = [], []
    for Lp in lengths if len(soft) else []:
        if geo.N < Lp:
            d = m.head_means(soft[soft.N == geo.N], "distance", Lp)
            curves.append({"L": Lp, "distance": float(d.distance.mean()),
                           "distance, median head": float(d.distance.median())})
    for Lp in ([m.L, m.L_run] if m.L_run > m.L else [m.L]) if len(soft) else []:
        for n in (n for n in geo.grid if n < Lp):
            s = m.head_means(soft[soft.N == n], "separability", Lp)
            sep.append({"window": f"L = {Lp}", "Lp": Lp, "N": n, "separability": float(s.separability.median())})
    return LongContext(m, geo.N, geo.grid, pd.DataFrame(curves), pd.DataFrame(sep))


def plot_long_context(res: LongContext, corpus: str) -> plt.Figure:
    """The paper's curves with the model's softmax up to the longest window: (a) d~ at N against the window length
    L' (Fig. 2a) with a line of slope 1, (b) N_s / N against N at L and at the longest window (Fig. 3)."""
    m, curves = res.m, res.curves
    if not len(curves):
        return _nothing_to_draw("Softmax is not among the normalizers measured: the paper's curves are not drawn.")
    fig, axes = _two_panels()
    axes[0].plot(curves.L, curves.distance, "o-", color=COLOR["softmax"], label="mean over heads")
    axes[0].plot(curves.L, curves["distance, median head"], "s--", color=COLOR["softmax"], alpha=0.6,
                 label="median head")
    ref_L = np.array(curves.L, dtype=float)
    anchor = curves.set_index("L").distance.get(m.L, curves.distance.iloc[-1])
    axes[0].plot(ref_L, anchor * ref_L / m.L, ":", color="grey", label="linear in $L$ (slope 1)")
    axes[0].axvline(m.L, color="0.5", lw=0.8)
    axes[0].set(xscale="log", yscale="log", xlabel="window length $L'$", ylabel=f"mean $\\tilde d$ (N = {res.N})")
    axes[0].set_title("(a) distance (Fig. 2a)", fontsize="medium")
    sns.lineplot(data=res.separability, x="N", y="separability", hue="window", style="window", markers=True,
                 dashes=False, ax=axes[1])
    axes[1].axhspan(*PAPER_BAND, color="0.85", alpha=0.6, zorder=0, label="the paper's 0.70–0.85")
    axes[1].set(xlabel="top-N size $N$", ylabel="median over heads of $N_s/N$", ylim=(0, 1.05))
    axes[1].set_title("(b) separability (Fig. 3)", fontsize="medium")
    _n_axis(axes[1], res.separability.N)
    _legend_below(fig, *axes)
    figures.model_title(fig, f"The paper's curves up to {m.L_run} tokens (the model's own softmax)", m.model)
    return fig


# --- several heads: coverage and independence (Def. ch6-def-coverage, Prop. ch6-prop-coverage) -------------------


@dataclass
class Coverage:
    """``table``: one row per N (observed coverage, the two predictions, the permutation test); ``phis``: one row per
    (N, layer, pair of heads) with the phi coefficient of their separation on the keys both select."""

    m: ModelLogits = field(repr=False)
    Ns: list[int]
    n_samples: int
    table: pd.DataFrame
    phis: pd.DataFrame

    @property
    def N(self) -> int | None:
        """The N the prose and the claims report: the largest N <= 16 of the grid (else the largest measured)."""
        if not len(self.table):
            return None
        measured = set(self.table.N)
        return int(max([n for n in self.Ns if n <= 16 and n in measured] or [self.table.N.max()]))

    @property
    def row(self) -> pd.Series:
        return self.table.set_index("N").loc[self.N]

    def shown(self) -> pd.DataFrame:
        """The table on its side, one column per N, so that it fits the text column."""
        return self.table.set_index("N").T.rename(columns=lambda n: f"N = {n}").rename_axis(columns=None)

    @property
    def pvalue_text(self) -> str:
        p = self.row["permutation p-value"]
        return f"< {1 / self.n_samples:.2g}" if p == 0 else f"= {fmt(p)}"

    def prose(self) -> dict:
        if self.N is None:
            return {k: "n/a" for k in ("cov_N", "cov_p", "cov_U", "cov_obs", "cov_ind", "cov_paper", "cov_z",
                                        "cov_pvalue", "cov_nperm", "cov_layers", "phi_median", "phi_share", "phi_same",
                                        "phi_other", "cov_direction", "cov_paper_relation", "cov_formula_text")}
        r, N = self.row, self.N
        paper, observed, z = r["paper 1-(1-p)^H"], r["observed coverage"], r["z (observed vs null)"]
        at = self.phis[self.phis.N == N].dropna()
        same, other = at[at.pair == "same key/value head"].phi, at[at.pair != "same key/value head"].phi
        gap = paper - observed
        return {"cov_N": N, "cov_p": r["mean p = N_s/N"], "cov_U": fmt(r["mean |U| / N"], 3), "cov_obs": observed,
                "cov_ind": r["independence given selection"], "cov_paper": paper, "cov_z": fmt(z, 2),
                "cov_pvalue": self.pvalue_text, "cov_nperm": self.n_samples,
                "cov_layers": f"{int(r['layers rejecting at 0.01'])} of {self.m.n_layers}",
                "phi_median": at.phi.median() if len(at) else "n/a",
                "phi_share": f"{100 * (at.pvalue < 0.01).mean():.0f}%" if len(at) else "n/a",
                "phi_same": same.median() if len(same) else "n/a (every head has its own key/value head)",
                "phi_other": other.median() if len(other) else "n/a",
                "cov_direction": "about as many keys as independent heads would" if not abs(z) >= 2 else
                                 "fewer keys than independent heads would (the heads separate overlapping sets)"
                                 if z < 0 else
                                 "more keys than independent heads would (the heads complement each other)",
                "cov_paper_relation": "matches (within 0.05)" if abs(gap) <= 0.05 else
                                      "overstates" if gap > 0 else "understates",
                "cov_formula_text": f"is not a good model of these heads: at N = {N} it predicts {fmt(paper)}, while "
                                    f"{fmt(observed)} of the keys are covered" if abs(gap) > 0.05 else
                                    f"matches these heads to within 0.05 at N = {N} ({fmt(paper)} predicted, "
                                    f"{fmt(observed)} observed)"}

    def coverage_claim(self) -> dict:
        r = self.row
        return {"N": self.N, "heads": self.m.n_heads, "observed": r["observed coverage"], "p": r["mean p = N_s/N"],
                "paper": r["paper 1-(1-p)^H"], "independent": r["independence given selection"]}

    def independence_claim(self) -> dict:
        r = self.row
        return {"N": self.N, "z": r["z (observed vs null)"], "pvalue": r["permutation p-value"],
                "p_text": self.pvalue_text, "permutations": self.n_samples,
                "layers_rejecting": int(r["layers rejecting at 0.01"]), "layers": self.m.n_layers}


def coverage(m: ModelLogits, geo: GeometryModel, Ns, n_samples: int, seed: int) -> Coverage:
    """Per N of ``Ns``, over every layer and sampled row t <= L (softmax, value vectors on the sphere): the observed
    coverage of the universe U (``lenses.coverage``), the paper's 1 - (1 - p)^H with p the mean N_s / N, the
    expectation under independence given each head's top-N set (Prop. ch6-prop-coverage), and a permutation test of
    that independence (``n_samples`` within-head shuffles seeded by ``seed + 2``; the pooled total and each layer);
    per pair of heads, the phi coefficient (``lenses.head_association``)."""
    gen = torch.Generator().manual_seed(seed + 2)
    n_layers, n_heads = m.n_layers, m.n_heads
    group_of = np.arange(n_heads) // max(1, n_heads // m.kv_heads)  # key/value head of each query head (GQA)
    iu = np.triu_indices(n_heads, 1)
    same = np.broadcast_to((group_of[iu[0]] == group_of[iu[1]])[None, :], (n_layers, len(iu[0])))
    rows, phis = [], []
    for n_top in Ns:
        if not geo.coverage_inputs.get(n_top):
            continue
        total = dict.fromkeys(("covered", "union", "expected", "p"), 0.0) | {"rows": 0}
        f64 = dict(dtype=F64, device=m.device)
        null, null_layer = torch.zeros(n_samples, **f64), torch.zeros(n_samples, n_layers, **f64)
        obs_layer, exp_layer, counts = torch.zeros(n_layers, **f64), torch.zeros(n_layers, **f64), None
        for sel, sep, ok in geo.coverage_inputs[n_top]:
            res = lenses.coverage(sel, sep, ok, n_top, n_perm=n_samples, generator=gen)
            v = res.valid
            for key in ("covered", "union", "expected"):
                total[key] += float(getattr(res, key)[v].sum())
            total["p"] += float((res.separated.double() / n_top).mean(-2)[v].sum())
            total["rows"] += int(v.sum())
            null, null_layer = null + res.null.sum(-1), null_layer + res.null
            obs_layer += torch.where(v, res.covered, 0).sum(-1).double()
            exp_layer += torch.where(v, res.expected, 0.0).sum(-1)
            assoc = lenses.head_association(sel, sep, ok)
            counts = {k: assoc[k] + (counts[k] if counts else 0) for k in ("n11", "n10", "n01", "n00")}
        if total["rows"] == 0:
            continue
        rows.append(_coverage_row(n_top, n_heads, n_samples, total, null, null_layer, obs_layer, exp_layer))
        assoc = lenses.association_from_counts(**counts)
        phis.append(pd.DataFrame({"N": n_top, "phi": assoc["phi"].cpu().numpy()[:, iu[0], iu[1]].flatten(),
                                  "pvalue": assoc["pvalue"].cpu().numpy()[:, iu[0], iu[1]].flatten(),
                                  "pair": np.where(same, "same key/value head",
                                                   "different key/value heads").flatten()}))
    phis = pd.concat(phis, ignore_index=True) if phis else pd.DataFrame(columns=["N", "phi", "pvalue", "pair"])
    return Coverage(m, list(Ns), n_samples, pd.DataFrame(rows), phis)


def _coverage_row(n_top, n_heads, n_samples, total, null, null_layer, obs_layer, exp_layer) -> dict:
    """One row of the coverage table: pooled totals, the z-score and two-sided permutation p-value of the observed
    total against the null, and how many layers reject independence on their own at 0.01."""
    spread = float(null.std()) if n_samples > 1 else float("nan")
    observed, expected = total["covered"], total["expected"]
    pvalue = float(((null - expected).abs() >= abs(observed - expected) - 1e-9).double().mean())
    per_layer = ((null_layer - exp_layer).abs() >= (obs_layer - exp_layer).abs() - 1e-9).double().mean(0)
    p_bar = total["p"] / total["rows"]
    return {"N": n_top, "rows": total["rows"], "mean p = N_s/N": p_bar,
            "mean |U| / N": total["union"] / total["rows"] / n_top, "observed coverage": observed / total["union"],
            "independence given selection": expected / total["union"], "paper 1-(1-p)^H": 1 - (1 - p_bar) ** n_heads,
            "z (observed vs null)": (observed - expected) / spread if spread > 0 else float("nan"),
            "permutation p-value": pvalue, "layers rejecting at 0.01": int((per_layer < 0.01).sum())}


def plot_coverage(res: Coverage, corpus: str, seed: int) -> plt.Figure:
    """(a) Against N: the observed coverage, its two predictions and the mean p; (b) per N, box plots of the phi
    coefficient of the pairs of heads of a layer."""
    if not len(res.table):
        return _nothing_to_draw("Softmax is not among the normalizers measured, or no N of the grid is below L: no coverage to draw.")
    fig, axes = _two_panels()
    t = res.table
    for column, style in (("observed coverage", "o-"), ("independence given selection", "s--"),
                          ("paper 1-(1-p)^H", "^:"), ("mean p = N_s/N", "v-.")):
        axes[0].plot(t.N, t[column], style, label=column)
    axes[0].set(xlabel="top-N size $N$", ylabel="share of U (or p)", ylim=(0, 1.05))
    axes[0].set_title("(a) coverage by a layer's heads", fontsize="medium")
    _n_axis(axes[0], t.N)
    sns.boxplot(data=res.phis.dropna(), x="N", y="phi", hue="pair", ax=axes[1], fliersize=1, linewidth=0.8)
    axes[1].axhline(0, color="black", lw=0.8)
    axes[1].set(xlabel="top-N size $N$", ylabel="phi of a pair of heads")
    axes[1].set_title("(b) pairs of heads", fontsize="medium")
    _legend_below(fig, *axes, ncol=2)
    m = res.m
    figures.model_title(fig, f"Coverage by {m.n_heads} heads per layer ({res.n_samples} permutations, seed {seed})",
                        m.model)
    return fig