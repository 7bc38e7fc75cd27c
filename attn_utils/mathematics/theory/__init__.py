"""The paper's bounds as executable, vectorised formulas, with their proofs and status: one module per result.

Every result of arXiv 2508.17821 ("Limitations of Normalization in Attention Mechanism") that the
book checks is computed here: :mod:`.lemma1` (Lemma 1, Corollary 1), :mod:`.theorem1_fixed` (Theorem 1 for
a fixed top-N set), :mod:`.theorem1_random` (Theorem 1 for a random set, Corollary 2), :mod:`.theorem2`
(Theorem 2), :mod:`.lemma2` (Lemma 2, Corollary 3, the example of Sec. 2.3) and :mod:`.coverage` (multi-head
coverage); this package re-exports their public names. The available copies of the paper lost most display
formulas (the book's page "Sources and reconstructions", ``book/sources.md``, says statement by statement what
survived), so each docstring says where a formula comes from:

* **Paper's statement (recovered)**: the formula survived in the paper's text or a public summary of it.
* **Reconstruction (ours)**: we rebuilt the formula from the paper's prose and proof sketch; the proof
  given here is ours, and the test suite checks it numerically.
* **Corrected (ours)**: the recovered statement is false as written; we give a counterexample and a
  valid replacement.

Layout conventions (shared with ``metrics`` and ``algorithms``). ``weights`` has shape (..., R, L):
the attention weights of R query rows over L keys. ``x`` has shape (..., L, d): the key-side vectors
of one head, shared by its rows; its leading dims broadcast against those of ``weights``. ``mask``
(optional, bool, broadcastable to ``weights``; True = visible key) hides keys; a row's length L_r is
its number of visible keys, and every row must see at least one key. ``selected`` (bool, same layout)
marks each row's top-N set I_N. Masked entries of ``weights`` are ignored; the visible entries of a
row must form a probability distribution. Results keep the (promoted) floating dtype of the inputs.
Large inputs, e.g. weights of shape (12, 12, 1024, 1024) with d = 64, are processed in chunks of
rows, and pairwise distances come from Gram matrices, ||a - b||^2 = |a|^2 + |b|^2 - 2<a, b>, clamped
at 0. Near-zero distances therefore carry an absolute error of about sqrt(machine eps) times the
vectors' scale; all other values are accurate to rounding. Every key-side vector result is homogeneous of
degree 1 in x, f(c x) = c f(x) for c > 0, so each head's x is divided by the power of two c at its
largest entry (exact) and the result multiplied back: |x| up to the float maximum gives finite results.
Input with zero keys (L = 0) is refused; zero rows (R = 0 or an empty batch dim) give empty results.
"""
from attn_utils.mathematics.theory.coverage import (
    MAX_HEADS,
    heads_for_coverage,
    multihead_coverage,
)
from attn_utils.mathematics.theory.lemma1 import (
    Bounds,
    Lemma1Constants,
    corollary1_bounds,
    lemma1_bounds,
    lemma1_constants,
)
from attn_utils.mathematics.theory.lemma2 import (
    Corollary3Counterexample,
    TwoLogitExample,
    corollary3_bound,
    corollary3_counterexample,
    finite_difference_bound,
    general_jacobian,
    lemma2_bound,
    softmax_jacobian,
    softmax_jacobian_norm_bound,
    two_logit_example,
)
from attn_utils.mathematics.theory.theorem1_fixed import (
    FARTHEST,
    FarthestKeys,
    farthest_keys,
    theorem1_fixed_bound,
)
from attn_utils.mathematics.theory.theorem1_random import (
    MAX_EXACT_L,
    Corollary2Bounds,
    corollary2_bounds,
    corollary2_small_n_limit,
    jensen_residual,
    theorem1_random_expectation_exact,
    theorem1_random_main_sum,
)
from attn_utils.mathematics.theory.theorem2 import (
    Theorem2Instance,
    theorem2_bounds,
    theorem2_upper_counterexample,
    theorem2_xi,
)

__all__ = [
    "Bounds",
    "Corollary2Bounds",
    "Corollary3Counterexample",
    "FARTHEST",
    "FarthestKeys",
    "Lemma1Constants",
    "MAX_EXACT_L",
    "MAX_HEADS",
    "Theorem2Instance",
    "TwoLogitExample",
    "corollary1_bounds",
    "corollary2_bounds",
    "corollary2_small_n_limit",
    "corollary3_bound",
    "corollary3_counterexample",
    "farthest_keys",
    "finite_difference_bound",
    "general_jacobian",
    "heads_for_coverage",
    "jensen_residual",
    "lemma1_bounds",
    "lemma1_constants",
    "lemma2_bound",
    "multihead_coverage",
    "softmax_jacobian",
    "softmax_jacobian_norm_bound",
    "theorem1_fixed_bound",
    "theorem1_random_expectation_exact",
    "theorem1_random_main_sum",
    "theorem2_bounds",
    "theorem2_upper_counterexample",
    "theorem2_xi",
    "two_logit_example",
]
