"""The book's figures: one seaborn style, and titles that always name the model."""
from __future__ import annotations

import matplotlib.pyplot as plt
import seaborn as sns

PALETTE = "colorblind"
# one colour per verdict in every table and figure (Okabe-Ito hues, distinguishable with colour-blindness)
VERDICT_COLOURS = {"holds": "#7fd1ae", "reproduced": "#56B4E9", "partly reproduced": "#F0E442",
                   "not reproduced": "#E69F00", "fails": "#CC79A7", "not comparable": "#c8c8c8"}


def set_style() -> None:
    """The one style of every figure in the book."""
    sns.set_theme(style="whitegrid", context="notebook", palette=PALETTE)
    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 110, "figure.constrained_layout.use": True})


def model_title(fig: plt.Figure, title: str, model: str) -> None:
    """Put ``title`` and the model's name on ``fig``, so an exported PNG still says what produced it."""
    fig.suptitle(f"{title}\n[{model}]", fontsize="medium")
