"""The setting chapter: one row of logits under every normalizer, and a first look at the model's attention."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from matplotlib.colors import PowerNorm
from matplotlib.patches import Patch, Polygon

from attn_utils.book import figures
from attn_utils.mathematics import registry

SHOWN = ("softmax", "sparsemax", "entmax15", "ssmax", "softmax1", "self_adjust")
MASKED_COLOUR = "#bdbdbd"  # keys a query cannot see: grey and hatched, never the colour of a small weight


def weights_table(logits: torch.Tensor, names=SHOWN, Ts=(1.0, 0.25)) -> pd.DataFrame:
    """One row per (normalizer, T, key): the weight that ``registry.normalize`` gives the key's logit."""
    return pd.DataFrame([{"normalizer": name, "T": T, "key": i, "weight": float(w)}
                         for T in Ts for name in names
                         for i, w in enumerate(registry.normalize(logits, name, T=T))])


def weights_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per (normalizer, T): the total weight, the largest weight and the number of non-zero weights."""
    return table.groupby(["normalizer", "T"], sort=False).weight.agg(total="sum", largest="max",
                                                         nonzero=lambda w: int((w != 0).sum()))


def weights_figure(table: pd.DataFrame) -> plt.Figure:
    """Bars of the weights per key, one panel per normalizer in two columns, each panel on its own y scale
    (self-adjust's values are not a distribution and would flatten the others on a common axis); a normalizer's
    bars have its colour of the whole book, one shade per temperature."""
    names, Ts = list(dict.fromkeys(table.normalizer)), list(dict.fromkeys(table["T"]))
    n_keys, n_rows = int(table.key.max()) + 1, math.ceil(len(names) / 2)
    fig, axes = plt.subplots(n_rows, 2, figsize=(7.5, 1.9 * n_rows + 1.1), sharex=True, squeeze=False)
    width, shades = 0.8 / len(Ts), np.linspace(0.35, 1.0, len(Ts))
    for ax, name in zip(axes.flat, names):
        for k, (T, shade) in enumerate(zip(Ts, shades)):
            rows = table[(table.normalizer == name) & (table["T"] == T)]
            ax.bar(rows.key + (k - (len(Ts) - 1) / 2) * width, rows.weight, width,
                   color=figures.NORMALIZER_COLOURS[name], alpha=shade)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_title(registry.get(name).label, fontsize="medium")
    for ax in axes.flat[len(names):]:
        ax.remove()
    for ax in axes[:, 0]:
        ax.set_ylabel("weight")
    for ax in axes[-1]:
        ax.set(xlabel="key", xticks=range(n_keys))
    fig.legend(handles=[Patch(color="grey", alpha=shade, label=f"T = {T:g}") for T, shade in zip(Ts, shades)],
               loc="outside lower center", ncols=len(Ts), fontsize="small")
    figures.model_title(fig, f"One row of {n_keys} synthetic logits under each normalizer (own y scale per panel)",
                        "synthetic data, no model")
    return fig


SINK_FACTOR = 2  # our rule: a first token with at least twice its uniform share is an attention sink


def layer_checks(weights: torch.Tensor, visible: torch.Tensor) -> dict:
    """For one layer's weights ``(heads, L, L)`` and the keys each row sees (``visible``, ``(L, L)`` booleans): the
    largest deviation of a row sum from 1, the largest weight on a key the row cannot see, the mean weight that the
    rows t = 2..L (counting from 1) give to the first token, the same mean for uniform attention over the keys each
    row sees (mean(1/t) when causal, 1/L on an encoder), their ratio, and the reading of :func:`sink_reading`."""
    L = int(weights.shape[-1])
    visible = visible.to(weights.device)
    share = float(weights[:, 1:, 0].mean())
    uniform = float((1 / visible[1:].sum(-1).double()).mean()) if L > 1 else 1.0
    return {"L_shown": L, "n_heads": int(weights.shape[0]),
            "row_error": float((weights.sum(-1) - 1).abs().max()),
            "upper_max": float(weights.masked_fill(visible, 0).abs().max()),
            "first_key_share": share, "uniform_first_share": uniform, "first_key_ratio": share / uniform,
            "sink_reading": sink_reading(share, uniform)}


def sink_reading(share: float, uniform: float) -> str:
    """What a first-token share says against the uniform share: an attention sink from ``SINK_FACTOR``
    times the uniform share, less than uniform below 1 / ``SINK_FACTOR`` times, about uniform in between."""
    ratio = share / uniform
    if ratio >= SINK_FACTOR:
        return (f"{ratio:.1f} times the uniform share: in this layer the first token is an attention sink, "
                "a key that takes far more weight than its place in the row gives it")
    if ratio <= 1 / SINK_FACTOR:
        return (f"{ratio:.2f} times the uniform share: this layer gives the first token less than uniform "
                "attention would, so it is no attention sink here")
    return (f"{ratio:.2f} times the uniform share: about what uniform attention gives it, so the first token is "
            "no attention sink in this layer")


def masked_region(L: int) -> Polygon:
    """The cells (t, j) with j > t of an L x L image (pixel centres at integers): the keys a causal query cannot
    see, as one staircase polygon, hatched."""
    corners = [(0.5, -0.5), (L - 0.5, -0.5)]
    for k in range(L - 1, 0, -1):
        corners += [(k + 0.5, k - 0.5), (k - 0.5, k - 0.5)]
    return Polygon(corners, closed=True, fill=False, hatch="///", edgecolor="#7f7f7f", linewidth=0)


def heatmaps(weights: torch.Tensor, model: str, heads: int = 4, visible: torch.Tensor | None = None) -> plt.Figure:
    """Heat maps of the first ``heads`` heads of one layer, two per row, ticks at token positions (from 1, as in the
    notation), on a square-root colour scale (small weights stay visible); keys a query cannot see (``visible``
    False; default the causal mask, above the diagonal) are grey and, when causal, hatched, so a masked key is not
    mistaken for a zero weight. An encoder's rows see every key: nothing is masked."""
    shown, L = min(heads, weights.shape[0]), weights.shape[-1]
    n_cols = min(2, shown)
    n_rows = math.ceil(shown / n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.3 * n_cols + 0.9, 3.2 * n_rows + 0.7), squeeze=False)
    cmap = sns.color_palette("mako_r", as_cmap=True).with_extremes(bad=MASKED_COLOUR)
    masked = np.triu(np.ones((L, L), dtype=bool), 1) if visible is None else ~visible.cpu().numpy()
    causal = bool((masked == np.triu(np.ones((L, L), dtype=bool), 1)).all())
    step = max(1, L // 4)
    ticks = np.unique(np.r_[1, np.arange(step, L + 1, step)])  # positions counted from 1; pixel p - 1
    for h, ax in enumerate(axes.flat):
        if h >= shown:
            ax.remove()
            continue
        image = ax.imshow(np.ma.masked_array(weights[h].float().cpu().numpy(), masked), cmap=cmap,
                          norm=PowerNorm(0.5, vmin=0, vmax=1), interpolation="nearest")
        if causal:
            ax.add_patch(masked_region(L))
        ax.grid(False)
        ax.set_xticks(ticks - 1, labels=[str(t) for t in ticks])
        ax.set_yticks(ticks - 1, labels=[str(t) for t in ticks])
        ax.set(title=f"layer 0, head {h}", xlabel="key position $j$",
               ylabel="query position $t$" if h % n_cols == 0 else "")
    fig.colorbar(image, ax=axes, shrink=0.8, label="weight (square-root scale)")
    said = "grey, hatched: masked keys" if causal else "bidirectional: every key is visible"
    figures.model_title(fig, f"Attention weights on War and Peace, first {L} tokens ({said})", model)
    return fig
