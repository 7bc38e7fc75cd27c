"""Lens 1 of chapter ch6_beyond, Lemma 1 (weights vanish like 1/L when the logits are bounded): the envelopes and
the planted keys on synthetic rows, and the largest weight against the row length on the model's logits."""
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
    KEEP_RATIO,
    REL_TOL,
    S_SYN,
    T_FIT,
    T_SYN,
    label,
    legend_below,
    lines,
    listing,
    norm_kw,
    two_panels,
)
from attn_utils.book.chapters.beyond.logits import ModelLogits
from attn_utils.book.formatting import fmt
from attn_utils.mathematics import beyond, registry
from attn_utils.mathematics.fitting import loglog_slope


# --- on synthetic rows: envelopes and planted keys (Props. ch6-prop-still-vanish, ch6-prop-escape) ---------


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
        wrong = [n for n in self.names if esc[n] == registry.get(n).vanishes]
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
                "escapes": [esc[n] for n in self.names],
                "predicted": [not registry.get(n).vanishes for n in self.names]}


def lemma1_synthetic(names, lengths, n_trials: int, generator: torch.Generator) -> Lemma1Synthetic:
    """For each length, ``n_trials`` typical rows (logits uniform on [-a, a]) and as many planted rows (key 0 ahead
    of every other logit by >= g), at T = 1 and SSMax s = 1. Every weight is checked against its envelope
    (``beyond.lemma1_envelope``) and every planted key of a normalizer with a guarantee (softmax, SSMax, sparsemax
    and 1.5-entmax: the ``planted`` field of its record) against it (``beyond.planted_weight_bound``); a bound counts
    as violated beyond a relative REL_TOL."""
    names, lengths = list(names), list(lengths)
    rows, envelope_violations, planted_violations = [], 0, 0
    for length in lengths:
        for family in beyond.FAMILIES:
            logits = beyond.synthetic_rows(family, n_trials, length, A_SYN, GAP, generator=generator)
            for name in names:
                w = registry.normalize(logits, name, **norm_kw(name, T_SYN, S_SYN))
                st = beyond.row_stats(w)
                env = beyond.lemma1_envelope(name, A_SYN, length, T=T_SYN, s=S_SYN)
                envelope_violations += int(((st["max"] > env.upper * (1 + REL_TOL))
                                            | (st["min"] < env.lower * (1 - REL_TOL))).sum())
                if family == "planted" and registry.get(name).planted is not None:
                    bound = beyond.planted_weight_bound(name, GAP, length, T=T_SYN, s=S_SYN)
                    planted_violations += int((w[:, 0] < bound * (1 - REL_TOL)).sum())
                rows.append({"normalizer": label(name), "name": name, "family": family, "L": length,
                             "max weight": float(st["max"].median()),
                             "L x max weight": float((length * st["max"]).median()),
                             "L x min weight": float((length * st["min"]).median()),
                             "support": float(st["support"].double().median()), "mass": float(st["mass"].median())})
    return Lemma1Synthetic(names, lengths, n_trials, pd.DataFrame(rows), envelope_violations, planted_violations)


def plot_lemma1_synthetic(res: Lemma1Synthetic, seed: int) -> plt.Figure:
    """Median largest weight against L, one line per normalizer: (a) typical rows, (b) rows with a planted key."""
    fig, axes = two_panels(sharey=True)
    grid = np.array(res.lengths, dtype=float)
    titles = {"typical": f"(a) typical rows, logits in [-{A_SYN:g}, {A_SYN:g}]",
              "planted": f"(b) planted key, gap ≥ {GAP:g}"}
    for ax, family in zip(axes, beyond.FAMILIES):
        lines(res.table[res.table.family == family], "L", "max weight", ax, res.names)
        ax.plot(grid, np.minimum(1, 1 / grid), ":", color="grey", label="$1/L$")
        ax.set(xscale="log", yscale="log", xlabel="row length $L$", ylabel="median of $\\max_i|\\alpha_i|$")
        ax.set_title(titles[family], fontsize="medium")
    legend_below(fig, axes[0])
    figures.model_title(fig, f"Lemma 1 lens on synthetic rows ({res.n_trials} rows per point, seed {seed})",
                        "synthetic data, no model")
    return fig


# --- on the model -----------------------------------------------------------------------------------------------


@dataclass
class Lemma1Model:
    """Lemma 1's lens on the model: ``rows`` has one row per (normalizer, layer, head, sampled row); ``curve`` the
    medians over heads per (normalizer, t)."""

    names: list[str]
    L: int
    rows: pd.DataFrame
    curve: pd.DataFrame
    causal: bool = True

    def _slope(self, name: str, column: str, lo: float = T_FIT, hi: float | None = None) -> float:
        c = self.curve[(self.curve.name == name) & (self.curve.t >= lo) & (self.curve.t <= (hi or self.L))]
        return loglog_slope(c.t, c[column])

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
        return {"ssmax": self.slopes["ssmax"], "softmax": self.slopes["softmax"], "t_fit": T_FIT, "L": self.L,
                "causal": self.causal}

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
            st = beyond.row_stats(w, block.mask)
            nosink = beyond.row_stats(w[..., 1:], block.mask[:, 1:])["max"] if block.K > 1 else \
                torch.full_like(st["max"], torch.nan)
            entropy = -torch.special.xlogy(w, w).sum(-1) if registry.get(name).kind == "distribution" else \
                torch.full_like(st["max"], torch.nan)
            frames.append(m.tidy(block.rows, name=name, normalizer=label(name), max=st["max"],
                                 **{"max, token 0 excluded": nosink},
                                 zeros=1 - st["support"].double() / st["length"].double(), mass=st["mass"],
                                 entropy=entropy))
    rows = pd.concat(frames, ignore_index=True)
    rows["t"] = m.seen(rows.row)  # the row's length: the keys it sees (all L on an encoder)
    curve = rows.groupby(["name", "normalizer", "t"])[["max", "max, token 0 excluded"]].median().reset_index()
    return Lemma1Model(list(names), m.L, rows, curve, m.causal)


def plot_lemma1_model(res: Lemma1Model, m: ModelLogits, corpus: str) -> plt.Figure:
    """Median over heads of the largest weight against the row length t, one line per normalizer: (a) all keys,
    (b) the first key (the attention sink) left out; a grey line at t = L when a longer window was read."""
    fig, axes = two_panels(sharey=True)
    t = res.curve.t.unique()
    for ax, column, title in zip(axes, ("max", "max, token 0 excluded"), ("(a) all keys", "(b) first key left out")):
        lines(res.curve, "t", column, ax, res.names)
        ax.plot(t, 1 / t, ":", color="grey", label="$1/t$")
        if m.long_lengths:
            ax.axvline(m.L, color="0.5", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="row length $t$ (keys seen)",
               ylabel="median over heads of $\\max_i|\\alpha_i|$")
        ax.set_title(title, fontsize="medium")
    legend_below(fig, axes[0])
    figures.model_title(fig, f"Lemma 1 lens on the model's logits, re-normalized ({m.L_run}-token window)", m.model)
    return fig
