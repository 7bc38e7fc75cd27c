"""What every lens of chapter ch6_beyond shares: its constants, the normalizers' labels and keywords, the prose's
lists, and the layout of its figures and tables."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
import torch

from attn_utils.book import figures
from attn_utils.book.formatting import fmt
from attn_utils.mathematics import registry

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


def lines(data: pd.DataFrame, x: str, y: str, ax, names, *, legend=True) -> None:
    """One line per normalizer, in the colours and order of every figure of the chapter."""
    order = [label(n) for n in names]
    sns.lineplot(data=data, x=x, y=y, hue="normalizer", style="normalizer", hue_order=order, style_order=order,
                 markers=True, dashes=False, palette={label(n): COLOR[n] for n in names}, ax=ax, legend=legend)


def n_axis(ax, values) -> None:
    """A log-scaled x axis with one plain tick per value (the top-N sizes)."""
    values = sorted(set(int(v) for v in values))
    ax.set_xscale("log")
    ax.set_xticks(values, [str(v) for v in values])
    ax.minorticks_off()


def two_panels(sharey: bool = False):
    """A figure of two panels side by side that fits the text column, with room below for one legend."""
    return plt.subplots(1, 2, figsize=FIGSIZE, sharey=sharey, layout="constrained")


def legend_below(fig, *axes, ncol: int = 3) -> None:
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


def nothing_to_draw(message: str) -> plt.Figure:
    """A figure that says why nothing is drawn, so that the chapter's figure directive always finds a figure."""
    fig, ax = plt.subplots(figsize=(7.4, 1.2), layout="constrained")
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    return fig


def by_quantity(frame: pd.DataFrame, names, captions: dict[str, str]) -> dict[str, pd.DataFrame]:
    """One table per column of ``frame`` (one row per normalizer and N) named in ``captions``, keyed by its caption:
    rows the geometric normalizers of ``names`` in order, columns ``N = ...``."""
    order = [label(n) for n in geometric(names)]
    return {caption: frame.pivot(index="normalizer", columns="N", values=column).reindex(order)
            .rename(columns=lambda n: f"N = {n}").rename_axis(columns=None) for column, caption in captions.items()}


def by_temperature(table: pd.DataFrame, column: str, names) -> pd.DataFrame:
    """``column`` of a table with one row per (normalizer, T): rows the normalizers of ``names``,
    columns ``T = ...``."""
    wide = table.pivot(index="normalizer", columns="T", values=column).reindex([label(n) for n in names])
    return wide.rename(columns=lambda T: f"T = {fmt(T)}").rename_axis(columns=None)
