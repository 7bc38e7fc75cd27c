"""Chapter 6, ch6_beyond: the paper's four lenses applied to the remedies its Discussion names; one module per lens.

The mathematics (envelopes, closed-form Jacobians, the homogeneous distance and separability lenses, coverage
by several heads) is in :mod:`attn_utils.mathematics.beyond`; this package runs it over the chapter's grids, on
synthetic rows and on the logits a pretrained model produces, and turns the results into tidy tables (one row
per normalizer and grid value, or per layer, head and sampled row), the numbers of the prose, the values of
the ledger's claims and the figures. Every function takes the normalizers measured (``names``) so that the
chapter runs with any subset of :data:`attn_utils.mathematics.registry.COMPARED`.

The four lenses: Lemma 1 (weights vanish like 1/L when the logits are bounded, Eq. (3)), Theorem 1 (the
cumulative distance d~ of Eq. (7) against N and L), Theorem 2 (the separability N_s / N of Definition (10)) and
Lemma 2 / Corollary 3 (the sensitivity of the weights to the logits, Algorithm 5). Modules: :mod:`.common`
(constants, labels, figure layout), :mod:`.logits` (the model's forward pass), :mod:`.lemma1`, :mod:`.geometry`
(Theorems 1 and 2), :mod:`.gradient`, :mod:`.long_windows` (the paper's curves beyond L), :mod:`.heads` (coverage
by several heads) and :mod:`.conclusions` (the summary); this package re-exports what the notebook calls.
"""
from attn_utils.book.chapters.beyond.common import geometric, label, listing, norm_kw
from attn_utils.book.chapters.beyond.conclusions import summary, summary_tables
from attn_utils.book.chapters.beyond.geometry import (
    GeometryModel,
    GeometrySynthetic,
    geometry_model,
    geometry_synthetic,
    plot_distance_synthetic,
    plot_geometry_model,
    plot_separability_synthetic,
)
from attn_utils.book.chapters.beyond.gradient import (
    GradientModel,
    GradientSynthetic,
    gradient_model,
    gradient_synthetic,
    plot_gradient_model,
    plot_gradient_synthetic,
)
from attn_utils.book.chapters.beyond.heads import Coverage, coverage, plot_coverage
from attn_utils.book.chapters.beyond.lemma1 import (
    Lemma1Model,
    Lemma1Synthetic,
    lemma1_model,
    lemma1_synthetic,
    plot_lemma1_model,
    plot_lemma1_synthetic,
)
from attn_utils.book.chapters.beyond.logits import Block, ModelLogits, capture_logits, lens_memory
from attn_utils.book.chapters.beyond.long_windows import LongContext, long_context, plot_long_context

__all__ = [
    "Block",
    "Coverage",
    "GeometryModel",
    "GeometrySynthetic",
    "GradientModel",
    "GradientSynthetic",
    "Lemma1Model",
    "Lemma1Synthetic",
    "LongContext",
    "ModelLogits",
    "capture_logits",
    "coverage",
    "geometric",
    "geometry_model",
    "geometry_synthetic",
    "gradient_model",
    "gradient_synthetic",
    "label",
    "lemma1_model",
    "lemma1_synthetic",
    "lens_memory",
    "listing",
    "long_context",
    "norm_kw",
    "plot_coverage",
    "plot_distance_synthetic",
    "plot_geometry_model",
    "plot_gradient_model",
    "plot_gradient_synthetic",
    "plot_lemma1_model",
    "plot_lemma1_synthetic",
    "plot_long_context",
    "plot_separability_synthetic",
    "summary",
    "summary_tables",
]
