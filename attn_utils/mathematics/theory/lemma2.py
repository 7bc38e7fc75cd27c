"""Lemma 2 (the Jacobian of Eq. (3) and its norm), Corollary 3 as stated and corrected, and the two-logit
example of Sec. 2.3.

Statuses and layouts as in :mod:`attn_utils.mathematics.theory`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from attn_utils.mathematics.rows import Rows, check_distribution, float_tensor
from attn_utils.mathematics.validation import call_elementwise, check_finite, check_positive

__all__ = ["Corollary3Counterexample", "TwoLogitExample", "corollary3_bound", "corollary3_counterexample",
           "finite_difference_bound", "general_jacobian", "lemma2_bound", "softmax_jacobian",
           "softmax_jacobian_norm_bound", "two_logit_example"]


class Corollary3Counterexample(NamedTuple):
    """Two tied logits: the softmax Jacobian, its spectral norm, and the stated and corrected bounds."""

    logits: torch.Tensor
    weights: torch.Tensor
    jacobian: torch.Tensor
    spectral_norm: float
    stated_bound: float
    corrected_bound: float


class TwoLogitExample(NamedTuple):
    """The two logit vectors of the motivating example of Sec. 2.3."""

    l1: torch.Tensor
    l2: torch.Tensor


def _normalizer_values(F, dF, logits, theta):
    l = Rows.of(logits, name="logits", dtype=None, sums_to_one=False, row_axis=False).weights
    Fv, dFv = call_elementwise(F, l, theta, "F"), call_elementwise(dF, l, theta, "dF")
    if (Fv <= 0).any():
        raise ValueError("F must be positive at every logit (Eq. (3) needs a positive normalizer)")
    S = Fv.sum(-1, keepdim=True)
    return Fv, dFv, S, Fv / S


def general_jacobian(F: Callable, dF: Callable, logits, theta=None) -> torch.Tensor:
    """Jacobian d alpha_i / d l_k of Eq. (3), shape (..., L, L) (row i, column k).

    Reconstruction (ours; book/sources.md, Lemma 2): differentiating alpha_i = F_i / S, S = sum_j F_j, gives
    d alpha_i / d l_k = (F'_k / S) (delta_ik - alpha_i), i.e. J = diag(F') / S - alpha F'^T / S.
    F and dF (its derivative in l) are called as F(l, theta), or F(l) when theta is None.
    """
    _, dFv, S, alpha = _normalizer_values(F, dF, logits, theta)
    return (torch.diag_embed(dFv) - alpha.unsqueeze(-1) * dFv.unsqueeze(-2)) / S.unsqueeze(-1)


def lemma2_bound(F: Callable, dF: Callable, logits, theta=None) -> torch.Tensor:
    """Lemma 2: (max_k |F'_k| + ||alpha||_2 ||F'||_2) / (L min_j F_j) >= ||J||_2, shape (...,).

    Reconstruction (ours) of a lost display (book/sources.md, Lemma 2; the prose says both terms in the
    parentheses scale with 1 / min_j F). Proof: J = diag(F') / S - alpha F'^T / S, so by the triangle
    inequality ||J||_2 <= max_k |F'_k| / S + ||alpha||_2 ||F'||_2 / S (a diagonal matrix has norm
    max |entry|; a rank-one matrix u v^T has norm ||u|| ||v||), and S = sum_j F_j >= L min_j F_j > 0.
    """
    Fv, dFv, _, alpha = _normalizer_values(F, dF, logits, theta)
    top = dFv.abs().amax(-1) + alpha.norm(dim=-1) * dFv.norm(dim=-1)
    return top / (Fv.shape[-1] * Fv.amin(-1))


def softmax_jacobian(weights, T: float) -> torch.Tensor:
    """Jacobian of alpha = softmax(l / T) in l: (diag(alpha) - alpha alpha^T) / T, shape (..., L, L).

    Standard calculus (Eq. (3) with F = e^{l/T}, F' = F / T). ``weights`` (..., L) = softmax(l / T),
    each row a distribution.
    """
    T = check_positive("T", T)
    a = check_distribution("weights", Rows.of(weights, dtype=None, sums_to_one=False, row_axis=False).weights)
    return (torch.diag_embed(a) - a.unsqueeze(-1) * a.unsqueeze(-2)) / T


def corollary3_bound(T: float) -> float:
    """min{1 / (4T), sqrt(2)}: Corollary 3 exactly as the paper states it (book/sources.md, Corollary 3).

    Paper's statement (recovered). **False as a bound on the spectral norm ||d alpha / d l||_2**: two
    tied logits give 1 / (2T) (``corollary3_counterexample``). What does hold with 1 / (4T): every
    entry, |J_ik| <= 1 / (4T) (diagonal alpha_i (1 - alpha_i) / T, off-diagonal alpha_i alpha_k / T
    with alpha_i + alpha_k <= 1). The sqrt(2) is the diameter of the probability simplex, a cap on
    ||alpha - alpha'||_2, not on the Jacobian (which grows without bound as T -> 0).
    """
    T = check_positive("T", T)
    return min(1 / (4 * T), math.sqrt(2))


def softmax_jacobian_norm_bound(T: float) -> float:
    """1 / (2T), the tight bound on ||d softmax(l / T) / d l||_2 for every l and L.

    Corrected (ours) replacement of Corollary 3. Proof: J = (diag(alpha) - alpha alpha^T) / T is
    symmetric positive semi-definite, so ||J||_2 = max_{||v|| = 1} v^T J v, and
    v^T (diag(alpha) - alpha alpha^T) v = Var_alpha(v), the variance of the values v_i under alpha. By
    Popoviciu's inequality Var_alpha(v) <= (max v - min v)^2 / 4 <= (v_a^2 + v_b^2) / 2 <= 1/2.
    Tight: alpha = (1/2, 1/2) (two tied logits, L = 2) and v = (1, -1) / sqrt(2) give 1 / (2T); with
    further, lower logits the norm tends to 1 / (2T) as T -> 0.
    """
    T = check_positive("T", T)
    return 1 / (2 * T)


def finite_difference_bound(T: float, eps: float) -> float:
    """min{1 / (2T), sqrt(2) / eps}: a valid bound on ||softmax((l + eps v)/T) - softmax(l/T)||_2 / eps.

    Corrected (ours) version of the quantity g(T, eps) of Algorithm 5, for any l and unit v. Proof:
    the difference is the integral over t in [0, 1] of J(l + t eps v) (eps v), whose norm is at most
    eps / (2T) by ``softmax_jacobian_norm_bound``; and two probability vectors are at distance
    <= sqrt(2) (||p - p'||_2^2 <= ||p - p'||_1 max_i |p_i - p'_i| <= 2).
    """
    T, eps = check_positive("T", T), check_positive("eps", eps)
    return min(1 / (2 * T), math.sqrt(2) / eps)


def corollary3_counterexample(T: float) -> Corollary3Counterexample:
    """Two tied logits l = (0, 0): ||J||_2 = 1/(2T) exceeds Corollary 3's min{1/(4T), sqrt(2)}.

    It exceeds 1 / (4T) for every T, and sqrt(2) too when T < 1 / (2 sqrt(2)) ~ 0.354. Corrected (ours);
    see ``corollary3_bound`` and ``softmax_jacobian_norm_bound``.
    """
    T = check_positive("T", T)
    logits = torch.zeros(2, dtype=torch.float64)
    weights = torch.softmax(logits / T, dim=-1)
    J = softmax_jacobian(weights, T)
    norm = float(torch.linalg.matrix_norm(J, ord=2))
    return Corollary3Counterexample(logits, weights, J, norm, corollary3_bound(T), softmax_jacobian_norm_bound(T))


def two_logit_example(c: float, eps: float, rest: Sequence[float] = ()) -> TwoLogitExample:
    """The motivating example of Sec. 2.3: l1 = (c + eps, c, *rest), l2 = (c - eps, c + eps, *rest).

    Reconstruction (ours; book/sources.md, "Gradient sensitivity"): ||l1 - l2||_2 = ||(2 eps, -eps, 0, ...)|| =
    sqrt(5) eps, and the two largest logits swap order (key 0 leads in l1, key 1 in l2); every entry of
    ``rest`` must be below c - eps so those two stay on top. First-order prediction (ours, proven):
    with J = the softmax Jacobian at l2, ||alpha1 - alpha2 - J (l1 - l2)||_2 <= ||l1 - l2||^2 / (2 T^2)
    = 5 eps^2 / (2 T^2), since the second derivative of softmax(z) in direction h has norm
    <= 2 Var_alpha(h) <= ||h||^2; and ||alpha1 - alpha2|| <= sqrt(5) eps / (2T). So the change is
    O(eps / T). Returns float64 tensors.
    """
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c):
        raise ValueError(f"c must be a finite number, got {c!r}")
    eps = check_positive("eps", eps)
    rest_t = float_tensor("rest", list(rest)).to(torch.float64).reshape(-1)
    check_finite("rest", rest_t)
    if (rest_t >= c - eps).any():
        raise ValueError(f"every entry of rest must be < c - eps = {c - eps} so that the two top logits swap")
    head1 = torch.tensor([c + eps, c], dtype=torch.float64)
    head2 = torch.tensor([c - eps, c + eps], dtype=torch.float64)
    return TwoLogitExample(torch.cat([head1, rest_t]), torch.cat([head2, rest_t]))
