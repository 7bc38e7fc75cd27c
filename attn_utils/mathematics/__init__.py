"""The mathematics of *Limitations of Normalization in Attention Mechanism* (arXiv 2508.17821), as a library.

The names in ``__all__`` are the public API: import them from here (``from attn_utils.mathematics import
softmax, lemma1_bounds, top_n_mask``) or from the module that defines them, named in brackets. Every public
function validates its input once (:meth:`Rows.of` for rows of weights, logits and vectors) and raises
``ValueError`` naming the parameter and the allowed values; nothing here reads files, the environment or the
network, and the bounds are property-tested in float64.

* **Normalizers** (:mod:`.normalizers`): ``softmax`` (Eq. (2)), ``general`` (Eq. (3)), the remedies ``sparsemax``,
  ``entmax15``, ``ssmax``, ``self_adjust``, ``self_adjust_normalized`` and ``softmax1``, and ``causal_mask``.
  **Their registry** (:mod:`.registry`): one ``Normalizer`` record per rule (label, kind of rows, envelope,
  closed-form Jacobian, the facts the book states about it), ``REGISTRY``/``RECORDS``, ``COMPARED`` and
  ``normalize(logits, name, ...)``.
* **Rows** (:mod:`.rows`): ``Rows``, the one validated container of weights ``(..., R, L)``, vectors
  ``(..., L, d)`` and mask.
* **The bounds** (:mod:`.theory`, one module per result): Lemma 1 and Corollary 1, Theorem 1 for a fixed and
  for a random top-N set with Corollary 2, Theorem 2, Lemma 2 and Corollary 3 (as stated and corrected),
  multi-head coverage; each docstring says whether the statement is the paper's, our reconstruction or our
  correction.
* **The metrics** (:mod:`.metrics`): the top-N set, the context vector, the cumulative distance d~ of Eq. (7),
  the separability N_s / N of Definition (10), Algorithm 5's finite-difference gradient, entropy and more.
* **Algorithms 1-5** (:mod:`.algorithms`): ``distance_vs_length``, ``distance_vs_n``, ``critical_n``,
  ``separability_vs_n``, ``gradient_sensitivity`` (and ``theorem1_row_check``), over one model's attention
  (layers, heads, L, L), with the query-row sampling ``sample_rows``.
* **The lenses of chapter 6** (:mod:`.beyond`): the paper's lenses for any normalizer (envelopes, planted keys,
  distance and separability of non-negative rows, Jacobians, coverage by several heads).
* **Slopes** (:mod:`.fitting`): ``loglog_fit`` and ``loglog_slope``, the one log-log fit, with its NaN rule.

The names load with their module on first use (PEP 562), so that ``import attn_utils.mathematics.normalizers``
costs only what that module needs (a grading kernel imports no scipy or pandas).

Not public: :mod:`.kernels` (the computations the public functions share; inputs are trusted, so call through
the public functions or ``Rows.of``) and :mod:`.validation` (the checks behind the messages).
"""
from __future__ import annotations

import importlib

# the module of each public name; __all__ is their union, in this order
SOURCES: dict[str, tuple[str, ...]] = {
    "normalizers": (
        "causal_mask", "entmax15", "general", "self_adjust", "self_adjust_normalized", "softmax", "softmax1",
        "sparsemax", "ssmax",
    ),
    "registry": (
        "COMPARED", "NormBound", "Normalizer", "RECORDS", "REGISTRY", "normalize",
    ),
    "rows": (
        "Rows",
    ),
    "theory": (
        "Bounds", "Corollary2Bounds", "Corollary3Counterexample", "FarthestKeys", "Lemma1Constants",
        "Theorem2Instance", "TwoLogitExample", "corollary1_bounds", "corollary2_bounds", "corollary2_small_n_limit",
        "corollary3_bound", "corollary3_counterexample", "farthest_keys", "finite_difference_bound",
        "general_jacobian", "heads_for_coverage", "jensen_residual", "lemma1_bounds", "lemma1_constants",
        "lemma2_bound", "multihead_coverage", "softmax_jacobian", "softmax_jacobian_norm_bound",
        "theorem1_fixed_bound", "theorem1_random_expectation_exact", "theorem1_random_main_sum", "theorem2_bounds",
        "theorem2_upper_counterexample", "theorem2_xi", "two_logit_example",
    ),
    "metrics": (
        "READINGS", "context_vector", "cumulative_distance", "entropy", "expected_distance_mc",
        "finite_difference_gradient", "max_weight", "min_pairwise_distance", "project_to_sphere", "random_directions",
        "separability", "top_n_mask",
    ),
    "algorithms": (
        "CriticalN", "GradientSensitivity", "critical_n", "distance_vs_length", "distance_vs_n",
        "gradient_sensitivity", "octave_blocks", "sample_rows", "separability_vs_n", "theorem1_row_check",
    ),
    "beyond": (
        "CoverageResult", "Envelope", "FAMILIES", "Geometry", "association_from_counts", "coverage", "geometry",
        "geometry_weights", "head_association", "jacobian", "jvp", "lemma1_envelope", "lens_distance",
        "lens_separability", "planted_weight_bound", "row_stats", "separated_keys", "synthetic_rows", "unit_vectors",
    ),
    "fitting": (
        "LogLogFit", "loglog_fit", "loglog_slope",
    ),
}
__all__ = [name for names in SOURCES.values() for name in names]
_MODULE = {name: module for module, names in SOURCES.items() for name in names}


def __getattr__(name: str):
    module = _MODULE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

