"""The setting chapter: one row of logits under every normalizer, and a first look at the model's attention."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch

from attn_utils.book import figures
from attn_utils.mathematics import registry

SHOWN = ("softmax", "sparsemax", "entmax15", "ssmax", "softmax1", "self_adjust")


def weights_table(logits: torch.Tensor, names=SHOWN, Ts=(1.0, 0.25)) -> pd.DataFrame:
    """One row per (normalizer, T, key): the weight that ``registry.normalize`` gives the key's logit."""
    return pd.DataFrame([{"normalizer": name, "T": T, "key": i, "weight": float(w)}
                         for T in Ts for name in names
                         for i, w in enumerate(registry.normalize(logits, name, T=T))])


def weights_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per (normalizer, T): the total weight, the largest weight and the number of non-zero weights."""
    return table.groupby(["normalizer", "T"]).weight.agg(total="sum", largest="max",
                                                         nonzero=lambda w: int((w != 0).sum()))


def weights_figure(table: pd.DataFrame) -> plt.Figure:
    """Bars of the weights per key, one panel per normalizer with its own scale (self-adjust's weights are not a
    distribution and would flatten the others on a common axis)."""
    grid = sns.catplot(data=table, x="key", y="weight", hue="T", col="normalizer", col_wrap=3, kind="bar",
                       height=2.2, aspect=1.4, palette=figures.PALETTE, col_order=list(dict.fromkeys(table.normalizer)),
                       sharey=False)
    grid.set_titles("{col_name}")
    grid.figure.suptitle("One row of 12 synthetic logits under each normalizer (synthetic data, no model)", y=1.03)
    return grid.figure


def layer_checks(weights: torch.Tensor) -> dict:
    """For one layer's weights ``(heads, L, L)``: the largest deviation of a row sum from 1, the largest weight
    above the diagonal, and the mean weight that the rows t >= 2 give to the first token."""
    return {"L_shown": int(weights.shape[-1]), "n_heads": int(weights.shape[0]),
            "row_error": float((weights.sum(-1) - 1).abs().max()), "upper_max": float(weights.triu(1).abs().max()),
            "first_key_share": float(weights[:, 1:, 0].mean())}


def heatmaps(weights: torch.Tensor, model: str, heads: int = 4) -> plt.Figure:
    """Heat maps of the first ``heads`` heads of one layer; keys a query cannot see (above the diagonal) are grey,
    so a masked key is not mistaken for a zero weight."""
    shown = min(heads, weights.shape[0])
    L = weights.shape[-1]
    masked = np.triu(np.ones((L, L), dtype=bool), 1)
    fig, axes = plt.subplots(1, shown, figsize=(3.2 * shown, 3.3))
    ticks = max(1, L // 4)
    for h, ax in enumerate(np.atleast_1d(axes)):
        ax.set_facecolor("#d9d9d9")
        sns.heatmap(weights[h].float().numpy(), mask=masked, ax=ax, cmap="mako_r", vmin=0, vmax=1, square=True,
                    cbar=h == shown - 1, cbar_kws={"label": "weight"}, xticklabels=ticks, yticklabels=ticks)
        ax.set(title=f"layer 0, head {h}", xlabel="key position", ylabel="query position" if h == 0 else "")
    figures.model_title(fig, f"Attention weights on War and Peace, first {L} tokens (grey: masked keys)", model)
    return fig
