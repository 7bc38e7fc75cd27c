"""Beyond L in chapter ch6_beyond: the paper's curves (Figs. 2a and 3) with the model's own softmax on the windows
longer than L."""
from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from attn_utils.book import figures
from attn_utils.book.chapters.beyond.common import (
    COLOR,
    F64,
    PAPER_BAND,
    legend_below,
    n_axis,
    nothing_to_draw,
    two_panels,
)
from attn_utils.book.chapters.beyond.geometry import GeometryModel
from attn_utils.book.chapters.beyond.lemma1 import Lemma1Model
from attn_utils.book.chapters.beyond.logits import ModelLogits
from attn_utils.book.formatting import fmt
from attn_utils.mathematics import beyond, metrics, registry
from attn_utils.mathematics.fitting import loglog_slope


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
        return loglog_slope(part.L, part.distance)

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
        if not m.causal:
            text = (f"{m.model} is an encoder: a row's weights depend on the whole window, so the rows t <= L' of one "
                    f"window are not an L'-token window, and an L-sweep would need one forward pass per length; "
                    f"its {m.context} positions leave no length above L = {m.L} to sweep to anyway. This part "
                    "therefore draws nothing for it and its claims are not comparable.")
        elif long:
            text = f"{m.model} has a context of {m.context} tokens, so we read windows of " \
                   f"{', '.join(map(str, m.long_lengths))} tokens as well."
        else:
            text = f"{m.model} has a context of {m.context} tokens: no window longer than L = {m.L} fits, so " \
                   "this part shows the curves up to L only and its claims are not comparable."
        return {"long_text": text,
                "slope_below": fmt(self.slope_below, 2),
                "slope_above": fmt(self.slope_above, 2) if long else "n/a (no longer window)",
                "N_plateau": self.N_plateau, "sep_L": self.plateau(m.L),
                "sep_Lrun": self.plateau(m.L_run) if long else "n/a",
                "cont_softmax": fmt(lem_m.continued_slope("softmax") if long else float("nan"), 2),
                "cont_ssmax": fmt(lem_m.continued_slope("ssmax") if long else float("nan"), 2)}

    def distance_claim(self) -> dict:
        return {"N": self.N, "L": self.m.L, "L_run": self.m.L_run, "longer": bool(self.m.long_lengths),
                "causal": self.m.causal, "slope_above": self.slope_above, "slope_below": self.slope_below}

    def separability_claim(self) -> dict:
        return {"N": self.N_plateau, "L": self.m.L, "L_run": self.m.L_run, "longer": bool(self.m.long_lengths),
                "causal": self.m.causal, "at_L": self.plateau(self.m.L), "at_L_run": self.plateau(self.m.L_run)}


def long_context(m: ModelLogits, geo: GeometryModel) -> LongContext:
    """Softmax's d~ and N_s / N on the rows t > L of the longer window, added to those of the rows t <= L; then per
    window length L' (the powers of two from 32 below L, L and the long lengths) the row-weighted means per head
    over the rows t <= L' (causal mask: they are the rows of an L'-token window at the same offset). On an encoder
    they are not, and nothing is measured: the curves are empty."""
    soft = [geo.rows[geo.rows.name == "softmax"]] if "softmax" in geo.names and m.causal else []
    if soft and m.blocks.get("extra"):
        v = m.values.to(F64)
        sphere = metrics.project_to_sphere(v)
        for block in m.blocks["extra"]:
            w = registry.normalize(block.logits, "softmax", mask=block.mask)
            result = beyond.geometry(w, v[:, :, :block.K], [n for n in geo.grid if n < block.K], block.mask,
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
    if not m.causal:
        return nothing_to_draw(f"{m.model} is an encoder: one window gives no curve over window lengths, and its "
                               f"{m.context} positions leave no length above L = {m.L}.")
    if not len(curves):
        return nothing_to_draw("Softmax is not among the normalizers measured: the paper's curves are not drawn.")
    fig, axes = two_panels()
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
    n_axis(axes[1], res.separability.N)
    legend_below(fig, *axes)
    figures.model_title(fig, f"The paper's curves up to {m.L_run} tokens (the model's own softmax)", m.model)
    return fig
