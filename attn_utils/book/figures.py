"""The book's figures: one seaborn style, vector output, titles that name the model, and numbered figures.

Every figure of a chapter is drawn by a function of ``attn_utils.book.chapters``, then glued under a name with
:func:`glue_figure` and placed in the prose by a MyST ``{glue:figure}`` directive with a ``:name:`` (so that it
is numbered and can be cited with ``{numref}``), an ``:alt:`` text that describes it, and a caption.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from attn_utils.mathematics import registry

PALETTE = "colorblind"
# one colour per normalizer in every figure of the book (seaborn's colour-blind palette, in registry order)
NORMALIZER_COLOURS = dict(zip(registry.COMPARED, sns.color_palette(PALETTE, len(registry.COMPARED))))
# one colour per verdict in every table and figure (Okabe-Ito hues, distinguishable with colour-blindness)
VERDICT_COLOURS = {"holds": "#7fd1ae", "reproduced": "#56B4E9", "partly reproduced": "#F0E442",
                   "not reproduced": "#E69F00", "fails": "#CC79A7", "not comparable": "#c8c8c8"}


def set_style() -> None:
    """The one style of every figure in the book: seaborn's whitegrid, SVG output (sharp at any zoom), and
    pandas tables that are never truncated."""
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    sns.set_theme(style="whitegrid", context="notebook", palette=PALETTE)
    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 220, "figure.constrained_layout.use": True,
                         "svg.hashsalt": "attn-companion"})  # stable ids: the same figure gives the same SVG
    set_matplotlib_formats("svg")
    pd.set_option("display.max_rows", None, "display.max_columns", None, "display.width", None)


def model_title(fig: plt.Figure, title: str, model: str) -> None:
    """Put ``title`` and the model's name on ``fig``, so an exported image still says what produced it."""
    fig.suptitle(f"{title}\n[{model}]", fontsize="medium")


def glue_figure(name: str, fig: plt.Figure) -> None:
    """Glue ``fig`` under ``name`` for a ``{glue:figure}`` directive, and close it (it is shown only there)."""
    from myst_nb import glue

    glue(name, fig, display=False)
    plt.close(fig)
