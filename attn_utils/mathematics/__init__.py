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

Not public: :mod:`.kernels` (the computations the public functions share; inputs are trusted, so call through
the public functions or ``Rows.of``) and :mod:`.validation` (the checks behind the messages).
"""
from attn_utils.mathematics.algorithms import (
    CriticalN,
    GradientSensitivity,
    critical_n,
    distance_vs_length,
    distance_vs_n,
    gradient_sensitivity,
    octave_blocks,
    sample_rows,
    separability_vs_n,
    theorem1_row_check,
)
from attn_utils.mathematics.beyond import (
    FAMILIES,
    CoverageResult,
    Envelope,
    Geometry,
    association_from_counts,
    coverage,
    geometry,
    geometry_weights,
    head_association,
    jacobian,
    jvp,
    lemma1_envelope,
    lens_distance,
    lens_separability,
    planted_weight_bound,
    row_stats,
    separated_keys,
    synthetic_rows,
    unit_vectors,
)
from attn_utils.mathematics.fitting import LogLogFit, loglog_fit, loglog_slope
from attn_utils.mathematics.metrics import (
    READINGS,
    context_vector,
    cumulative_distance,
    entropy,
    expected_distance_mc,
    finite_difference_gradient,
    max_weight,
    min_pairwise_distance,
    project_to_sphere,
    random_directions,
    separability,
    top_n_mask,
)
from attn_utils.mathematics.normalizers import (
    causal_mask,
    entmax15,
    general,
    self_adjust,
    self_adjust_normalized,
    softmax,
    softmax1,
    sparsemax,
    ssmax,
)
from attn_utils.mathematics.registry import COMPARED, RECORDS, REGISTRY, NormBound, Normalizer, normalize
from attn_utils.mathematics.rows import Rows
from attn_utils.mathematics.theory import (
    Bounds,
    Corollary2Bounds,
    Corollary3Counterexample,
    FarthestKeys,
    Lemma1Constants,
    Theorem2Instance,
    TwoLogitExample,
    corollary1_bounds,
    corollary2_bounds,
    corollary2_small_n_limit,
    corollary3_bound,
    corollary3_counterexample,
    farthest_keys,
    finite_difference_bound,
    general_jacobian,
    heads_for_coverage,
    jensen_residual,
    lemma1_bounds,
    lemma1_constants,
    lemma2_bound,
    multihead_coverage,
    softmax_jacobian,
    softmax_jacobian_norm_bound,
    theorem1_fixed_bound,
    theorem1_random_expectation_exact,
    theorem1_random_main_sum,
    theorem2_bounds,
    theorem2_upper_counterexample,
    theorem2_xi,
    two_logit_example,
)

__all__ = [
    # normalizers and their registry
    "COMPARED", "NormBound", "Normalizer", "RECORDS", "REGISTRY", "causal_mask", "entmax15", "general", "normalize",
    "self_adjust", "self_adjust_normalized", "softmax", "softmax1", "sparsemax", "ssmax",
    # rows
    "Rows",
    # the bounds
    "Bounds", "Corollary2Bounds", "Corollary3Counterexample", "FarthestKeys", "Lemma1Constants", "Theorem2Instance",
    "TwoLogitExample", "corollary1_bounds", "corollary2_bounds", "corollary2_small_n_limit", "corollary3_bound",
    "corollary3_counterexample", "farthest_keys", "finite_difference_bound", "general_jacobian",
    "heads_for_coverage", "jensen_residual", "lemma1_bounds", "lemma1_constants", "lemma2_bound",
    "multihead_coverage", "softmax_jacobian", "softmax_jacobian_norm_bound", "theorem1_fixed_bound",
    "theorem1_random_expectation_exact", "theorem1_random_main_sum", "theorem2_bounds",
    "theorem2_upper_counterexample", "theorem2_xi", "two_logit_example",
    # the metrics
    "READINGS", "context_vector", "cumulative_distance", "entropy", "expected_distance_mc",
    "finite_difference_gradient", "max_weight", "min_pairwise_distance", "project_to_sphere", "random_directions",
    "separability", "top_n_mask",
    # Algorithms 1-5
    "CriticalN", "GradientSensitivity", "critical_n", "distance_vs_length", "distance_vs_n", "gradient_sensitivity",
    "octave_blocks", "sample_rows", "separability_vs_n", "theorem1_row_check",
    # the lenses of chapter 6
    "CoverageResult", "Envelope", "FAMILIES", "Geometry", "association_from_counts", "coverage", "geometry",
    "geometry_weights", "head_association", "jacobian", "jvp", "lemma1_envelope", "lens_distance",
    "lens_separability", "planted_weight_bound", "row_stats", "separated_keys", "synthetic_rows", "unit_vectors",
    # slopes
    "LogLogFit", "loglog_fit", "loglog_slope",
]
