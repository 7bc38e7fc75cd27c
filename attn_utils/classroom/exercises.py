"""The checks of the book's coding exercises, with hints.

:data:`EXERCISES` registers every coding exercise of the book. :func:`check` compares a reader's
functions with references built on ``attn_utils`` and, when they disagree, raises :class:`CheckFailed`
with a hint that names the likely mistake; :func:`evaluate` does the same without raising and returns a
:class:`Result` with a score. Both take one ``part`` of an exercise or all of them.

In a class these checks are the *visible* tests of the nbgrader course that
:mod:`attn_utils.classroom.student` writes (one test cell per part, the hint as its feedback); the
grade itself also rests on the hidden tests of :mod:`attn_utils.classroom.hidden`, which do not go
through this module (a student's notebook can patch it). ``book/teachers.md`` tells the whole workflow.
"""
from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from attn_utils.mathematics import metrics, normalizers


def _theory():
    """attn_utils.mathematics.theory, imported on first use (it loads scipy, which the kernels of most
    chapters' checks do not need)."""
    from attn_utils.mathematics import theory

    return theory

__all__ = ["EXERCISES", "CheckFailed", "Exercise", "Result", "check", "evaluate", "exercise_notebooks",
           "exercises_of"]

F64 = torch.float64


class CheckFailed(AssertionError):
    """A reader's function gave a wrong answer; the message says what to look at."""


# --- helpers of the checks ----------------------------------------------------------------------------


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * scale


def _tensor(what: str, value: Any, shape: tuple[int, ...], nan_hint: str = "") -> torch.Tensor:
    """``value`` as a float64 tensor of ``shape`` without NaN, or CheckFailed saying what is wrong."""
    try:
        t = torch.as_tensor(value, dtype=F64)
    except (TypeError, ValueError, RuntimeError):
        raise CheckFailed(f"{what} returned a {type(value).__name__}, expected a tensor of shape {shape}") from None
    if tuple(t.shape) != tuple(shape):
        raise CheckFailed(f"{what} returned shape {tuple(t.shape)} but expected {tuple(shape)}")
    if torch.isnan(t).any():
        raise CheckFailed(f"NaN in the output of {what}{nan_hint}")
    return t


def _number(what: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise CheckFailed(f"{what} returned {value!r}, expected a number") from None


def _close(got: torch.Tensor | float, expected: torch.Tensor | float, rtol: float, atol: float) -> bool:
    got, expected = torch.as_tensor(got, dtype=F64), torch.as_tensor(expected, dtype=F64)
    return got.shape == expected.shape and bool(torch.allclose(got, expected, rtol=rtol, atol=atol))


def _compare(what: str, got, expected, explain: str, mistakes: Iterable[tuple[Any, str]] = (),
             rtol: float = 1e-9, atol: float = 1e-12) -> None:
    """Pass if ``got`` matches ``expected``; else name the first mistake it matches, or ``explain``."""
    if _close(got, expected, rtol, atol):
        return
    if torch.as_tensor(got).numel() == 1:
        found = f"{what} returned {float(got):.6g}, expected {float(expected):.6g}"
    else:
        gap = float((torch.as_tensor(got, dtype=F64) - torch.as_tensor(expected, dtype=F64)).abs().max())
        found = f"{what} differs from the reference by up to {gap:.3g}"
    hint = next((h for wrong, h in mistakes if _close(got, wrong, rtol, atol)), explain)
    raise CheckFailed(f"{found}: {hint}")


# --- ch0-ex2: a causal softmax ----------------------------------------------------------------------


def _causal_reference(logits: torch.Tensor, T: float) -> torch.Tensor:
    return normalizers.softmax(logits, mask=normalizers.causal_mask(logits.shape[-1]), T=T)


def _causal_output(f, logits: torch.Tensor, T: float) -> torch.Tensor:
    shape = tuple(logits.shape)
    return _tensor(f"causal_softmax(logits of shape {shape}, T={T})", f.causal_softmax(logits.clone(), T), shape,
                   nan_hint=": masked entries must be -inf *before* the exponential (0 * inf is NaN), "
                            "and each row's largest logit subtracted")


def _causal_shape(f) -> None:
    _causal_output(f, _randn(2, 3, 5, 5, seed=1), 1.0)


def _causal_sums(f) -> None:
    w = _causal_output(f, _randn(4, 6, 6, seed=2, scale=2), 1.0)
    sums = w.sum(-1)
    if torch.allclose(sums, torch.ones_like(sums), atol=1e-9):
        return
    if torch.allclose(w.sum(-2), torch.ones_like(sums), atol=1e-9):
        hint = "they sum to one along axis -2: normalize over the keys (the last axis), not over the queries"
    elif float(w.triu(1).abs().max()) == 0:
        hint = ("the future keys are zero but still counted: mask the logits (with -inf) before the "
                "softmax instead of zeroing weights after it")
    else:
        hint = "divide each row by its own sum over the visible keys"
    raise CheckFailed(f"your weights do not sum to one along the last axis (row sums between "
                      f"{float(sums.min()):.3g} and {float(sums.max()):.3g}): {hint}")


def _causal_mask_applied(f) -> None:
    w = _causal_output(f, _randn(3, 7, 7, seed=3, scale=2), 1.0)
    leak = float(w.triu(1).abs().max())
    if leak > 0:
        raise CheckFailed(f"a query gives weight {leak:.3g} to a later key: apply the causal mask "
                          f"(query t sees the keys 0..t only)")


def _causal_temperature(f) -> None:
    logits = _randn(3, 6, 6, seed=4, scale=2)
    for T in (0.25, 4.0):
        w = _causal_output(f, logits, T)
        _compare(f"causal_softmax(logits, T={T})", w, _causal_reference(logits, T),
                 "the weights are softmax(l / T) over the visible keys",
                 [(_causal_reference(logits, 1 / T), "the temperature divides the logits: softmax(l / T), not l * T"),
                  (_causal_reference(logits, 1.0), "the result does not depend on T: divide the logits by T")])


def _causal_large_logits(f) -> None:
    logits = _randn(2, 6, 6, seed=5, scale=1000)
    w = _tensor("causal_softmax(logits of size 1000, T=1)", f.causal_softmax(logits.clone(), 1.0), (2, 6, 6),
                nan_hint=": exp overflows; subtract each row's largest visible logit before exponentiating")
    _compare("causal_softmax(logits of size 1000, T=1)", w, _causal_reference(logits, 1.0),
             "subtract each row's largest visible logit before exponentiating")


def _causal_values(f) -> None:
    logits = _randn(2, 9, 9, seed=6, scale=3)
    _compare("causal_softmax(logits, T=0.7)", _causal_output(f, logits, 0.7), _causal_reference(logits, 0.7),
             "the weights should be normalizers.softmax(logits, mask=causal_mask(L), T=T)")


# --- ch1-ex2: the largest weight Lemma 1 allows ----------------------------------------------------------

_EXP = ("exp(l / 0.5)", lambda l: torch.exp(l / 0.5))
_SOFTPLUS = ("softplus", torch.nn.functional.softplus)
_COS = ("2 + cos(3 l)", lambda l: 2 + torch.cos(3 * l))


def _bound(f, F, a: float, L: int, rtol: float) -> None:
    label, fn = F
    what = f"max_weight_bound(F, a={a:g}, L={L}) with F(l) = {label}"
    got = _number(what, f.max_weight_bound(fn, a, L))
    expected = _theory().lemma1_bounds(fn, a, L).upper
    C2, ends = expected * L, fn(torch.tensor([-a, a], dtype=F64))
    _compare(what, got, expected, "it should be C2/L = max F / (L min F), extrema over [-a, a]",
             [(C2, "you forgot to divide by L"),
              (1 / (C2 * L), "that is the lower bound C1/L; the upper one is C2/L = max F / (L min F)"),
              (float(ends.max() / ends.min()) / L,
               "F is not monotone: take max F and min F over the whole of [-a, a], not at its endpoints")],
             rtol=rtol, atol=0)


def _bound_softmax(f) -> None:
    _bound(f, _EXP, 2.0, 10, 1e-6)


def _bound_lengths(f) -> None:
    for L in (2, 10, 1000):
        _bound(f, _SOFTPLUS, 1.5, L, 1e-6)


def _bound_non_monotone(f) -> None:
    _bound(f, _COS, 2.0, 10, 1e-3)


def _extreme_rows(f) -> None:
    a, L = 2.0, 100_000
    for label, fn in (_EXP, _COS):
        what = f"extreme_row(F, a=2, L={L}) with F(l) = {label}"
        row = _tensor(what, f.extreme_row(fn, a, L), (L,))
        if float(row.abs().max()) > a * (1 + 1e-12):
            raise CheckFailed(f"{what} has logits up to {float(row.abs().max()):.4g}: they must lie in [-a, a]")
        bound, top = _theory().lemma1_bounds(fn, a, L).upper, float(normalizers.general(row, F=fn).max())
        if top < 0.9 * bound:
            raise CheckFailed(f"the largest weight of {what} is {top:.3g}, only {top / bound:.0%} of the bound "
                              f"{bound:.3g}: put one logit where F is largest and all others where F is smallest")


# --- ch2-ex2: top-N set, context vector and distance by loops -------------------------------------------


def _distance_output(f, w: torch.Tensor, x: torch.Tensor, N: int):
    what = f"distance_by_loop(weights_row, x, n_top={N})"
    out = f.distance_by_loop(w.clone(), x.clone(), N)
    if not (isinstance(out, (tuple, list)) and len(out) == 3):
        raise CheckFailed(f"{what} should return three things (the top-N set, s, the distance), got {out!r:.80}")
    top, s, total = out
    return what, _index_set(what, top, len(w)), _tensor(f"{what} (its s)", s, (x.shape[1],)), _number(what, total)


def _index_set(what: str, top: Any, L: int) -> set[int]:
    """A top-N set given as indices (set, list, tensor) or as a boolean mask of length L."""
    t = torch.as_tensor(list(top) if isinstance(top, (set, frozenset)) else top)
    if t.dtype == torch.bool and t.shape == (L,):
        t = t.nonzero().flatten()
    try:
        return {int(i) for i in t.flatten().tolist()}
    except (TypeError, ValueError):
        raise CheckFailed(f"{what} returned a top-N set {top!r:.80} that is not a collection of key indices") from None


def _reference_top(w: torch.Tensor, N: int) -> torch.Tensor:
    return metrics.top_n_mask(w[None], N)[0][0]


def _distance_row(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.softmax(_randn(40, seed=seed, scale=3), -1), _randn(40, 8, seed=seed + 1)


def _distance_top(f) -> None:
    w, x = _distance_row(10)
    what, top, _, _ = _distance_output(f, w, x, 5)
    expected = set(_reference_top(w, 5).nonzero().flatten().tolist())
    if len(top) != 5:
        raise CheckFailed(f"{what} returned a top set of {len(top)} keys, expected N = 5 (off by one?)")
    if top != expected:
        raise CheckFailed(f"{what} returned the keys {sorted(top)}, but the 5 largest weights are at "
                          f"{sorted(expected)}")


def _distance_ties(f) -> None:
    w = torch.tensor([0.1, 0.2, 0.1, 0.2, 0.2, 0.2], dtype=F64)
    what, top, _, _ = _distance_output(f, w, _randn(6, 3, seed=12), 2)
    if top != {1, 3}:
        raise CheckFailed(f"with weights {w.tolist()} and N = 2, {what} chose {sorted(top)}: among equal weights "
                          f"the earlier key enters the top-N set first, so the set is [1, 3]")


def _distance_context(f) -> None:
    w, x = _distance_row(20)
    what, _, s, _ = _distance_output(f, w, x, 5)
    sel = _reference_top(w, 5)
    _compare(f"{what}: s", s, metrics.context_vector(w[None], x, sel[None])[0],
             "s is the sum of alpha_i x_i over the top-N set",
             [(w @ x, "s sums alpha_i x_i over the top-N set only, not over every key"),
              (x[sel].sum(0), "s = sum of alpha_i x_i: weight each x_i by alpha_i")])


def _distance_total(f) -> None:
    w, x = _distance_row(30)
    what, _, _, total = _distance_output(f, w, x, 5)
    sel = _reference_top(w, 5)
    s = metrics.context_vector(w[None], x, sel[None])[0]
    gaps = (w[:, None] * x - s).norm(dim=-1)
    _compare(what, total, float(metrics.cumulative_distance(w[None], x, sel[None])[0]),
             "the distance is the sum over the keys outside the top-N set of ||alpha_i x_i - s||",
             [(float(metrics.cumulative_distance(w[None], x, sel[None], reading="norm_of_sum")[0]),
               "you computed the norm of the sum ||sum (alpha_i x_i - s)||; the distance is the sum of the "
               "norms, sum ||alpha_i x_i - s||"),
              (float((x - s).norm(dim=-1)[~sel].sum()),
               "weight each x_i by alpha_i: the terms are ||alpha_i x_i - s||"),
              (float(gaps.sum()), "sum only over the keys outside the top-N set")])


# --- ch3-ex2: N_s by hand ----------------------------------------------------------------------------------


def _separability_row(seed: int, L: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.softmax(_randn(L, seed=seed, scale=1.5), -1), _randn(L, d, seed=seed + 1, scale=3)


def _separability_output(f, w: torch.Tensor, x: torch.Tensor, N: int) -> tuple[str, float, float]:
    what = f"separability_by_loop(weights_row, x, n_top={N})"
    out = f.separability_by_loop(w.clone(), x.clone(), N)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise CheckFailed(f"{what} should return two things (N_s and r), got {out!r:.80}")
    return what, _number(what, out[0]), _number(what, out[1])


def _separability_radius(f) -> None:
    w, x = _separability_row(40, 50, 16)
    what, _, r = _separability_output(f, w, x, 8)
    sel = _reference_top(w, 8)
    unit = metrics.project_to_sphere(x)
    s = metrics.context_vector(w[None], unit, sel[None])[0]
    _compare(f"{what}: r", r, float(metrics.separability(w[None], x, 8)[1][0]),
             "r is the smallest distance from s to a non-selected point alpha_j x_j",
             [(float(metrics.separability(w[None], x, 8, normalize=False)[1][0]),
               "project the x_i onto the unit sphere first (x_i / ||x_i||)"),
              (float((s - unit).norm(dim=-1)[~sel].min()), "the radius uses alpha_j x_j, not x_j"),
              (float((s - w[:, None] * unit).norm(dim=-1)[sel].min()),
               "r is taken over the keys outside the top-N set, j not in I_N")])


def _separability_count(f, seed: int, L: int, d: int, N: int) -> None:
    w, x = _separability_row(seed, L, d)
    what, n_s, _ = _separability_output(f, w, x, N)
    ratio = float(metrics.separability(w[None], x, N)[0][0])
    expected = round(ratio * N)
    if n_s == expected:
        return
    if math.isclose(n_s, ratio) and ratio != expected:
        raise CheckFailed(f"{what} returned {n_s:.4g}: return the count N_s, not the ratio N_s / N")
    raise CheckFailed(f"{what} returned N_s = {n_s:g}, expected {expected}: count the selected keys i with "
                      f"||s - alpha_i x_i|| strictly less than r")


def _separability_counts(f) -> None:
    _separability_count(f, 40, 50, 16, 8)


def _separability_other_rows(f) -> None:
    _separability_count(f, 50, 20, 3, 3)
    _separability_count(f, 60, 30, 2, 12)


# --- ch4-ex2: g(T, eps) for one row --------------------------------------------------------------------


def _generator() -> torch.Generator:
    """The generator handed to g_row and to the library alike, so that both draw the same direction."""
    return torch.Generator().manual_seed(7)


def _g_reference(row: torch.Tensor, T: float, eps: float) -> float:
    return float(metrics.finite_difference_gradient(row[None], T, eps, generator=_generator())[0])


def _g_mistakes(row: torch.Tensor, T: float, eps: float) -> list[tuple[float, str]]:
    v = torch.randn(row.shape, generator=_generator(), dtype=F64)
    u = v / v.norm()
    v32 = torch.randn(row.shape, generator=_generator(), dtype=torch.float32).to(F64)

    def g(direction, scale=lambda l: l / T):
        moved = torch.softmax(scale(row + eps * direction), -1) - torch.softmax(scale(row), -1)
        return float(moved.norm() / eps)

    return [(g(u) * eps, "divide the change of the weights by eps"),
            (g(u, lambda l: l * T), "the temperature divides the logits: softmax((l + eps v) / T), not * T"),
            (g(v), "normalize the direction v to unit length"),
            (g(v32 / v32.norm()),
             "draw v in float64: torch.randn(row.shape, generator=generator, dtype=torch.float64)"),
            (float((torch.softmax(row / T + eps * u, -1) - torch.softmax(row / T, -1)).norm() / eps),
             "perturb the logits before dividing by T: softmax((l + eps v) / T)")]


def _g_value(f, row: torch.Tensor, T: float, eps: float) -> float:
    return _number(f"g_row(row, T={T:g}, eps={eps:g}, generator)",
                   f.g_row(row.clone(), T, eps, _generator()))


def _g_compare(f, T: float, eps: float) -> None:
    row = _randn(30, seed=70, scale=2)
    _compare(f"g_row(row, T={T:g}, eps={eps:g}, generator)", _g_value(f, row, T, eps), _g_reference(row, T, eps),
             "it should be ||softmax((l + eps v)/T) - softmax(l/T)|| / eps with v = a standard Gaussian vector "
             "drawn with the generator you are given, divided by its norm",
             _g_mistakes(row, T, eps), rtol=1e-7, atol=1e-12)


def _g_one_row(f) -> None:
    _g_compare(f, 1.0, 1e-3)


def _g_temperatures(f) -> None:
    _g_compare(f, 0.1, 0.5)
    _g_compare(f, 10.0, 1e-2)


def _g_bound(f) -> None:
    row = _randn(30, seed=71, scale=4)
    for T in (0.01, 0.1, 1.0, 10.0):
        for eps in (1e-3, 1.0, 100.0):
            value, bound = _g_value(f, row, T, eps), _theory().finite_difference_bound(T, eps)
            if value > bound * (1 + 1e-9):
                raise CheckFailed(f"g_row(row, T={T:g}, eps={eps:g}) = {value:.4g} exceeds the bound "
                                  f"min(1/(2T), sqrt(2)/eps) = {bound:.4g}, which holds for every row")


def _g_input_unchanged(f) -> None:
    row = _randn(30, seed=72)
    before = row.clone()
    f.g_row(row, 1.0, 0.1, _generator())
    if not torch.equal(row, before):
        raise CheckFailed("g_row changed its input row in place: compute l + eps v into a new tensor")


# --- ch6-ex2: the sparsemax Jacobian from its support ----------------------------------------------------


def _sparsemax_row(row: torch.Tensor, T: float) -> torch.Tensor:
    return normalizers.sparsemax(row.unsqueeze(0), T=T)[0]


def _sparsemax_reference(row: torch.Tensor, T: float) -> torch.Tensor:
    """The Jacobian by automatic differentiation (independent of the support formula)."""
    return torch.autograd.functional.jacobian(lambda r: _sparsemax_row(r, T), row)


def _sparsemax_mistakes(row: torch.Tensor, T: float) -> list[tuple[torch.Tensor, str]]:
    def from_support(on: torch.Tensor, scale: float) -> torch.Tensor:
        on = on.to(F64)
        return (torch.diag(on) - torch.outer(on, on) / on.sum()) * scale

    on = _sparsemax_row(row, T) > 0
    soft = torch.softmax(row / T, -1)
    return [(from_support(on, T), "divide by T: the weights are sparsemax(l / T), so the chain rule gives a 1/T"),
            (from_support(on, 1.0), "divide by T, not by 1: the weights are sparsemax(l / T)"),
            (from_support(torch.ones_like(on), 1 / T),
             "S is the support of the weights (the keys with alpha_i > 0), not every key"),
            (torch.diag(on.to(F64)) / T, "subtract 1_S 1_S^T / |S|: the weights must keep summing to one"),
            (from_support(row > 0, 1 / T), "S is where the *weights* are positive, not where the logits are"),
            ((torch.diag(soft) - torch.outer(soft, soft)) / T,
             "that is the softmax Jacobian; sparsemax's depends only on its support S")]


def _sparsemax_compare(f, row: torch.Tensor, T: float) -> None:
    what = f"sparsemax_jacobian(row of {len(row)} logits, T={T:g})"
    got = _tensor(what, f.sparsemax_jacobian(row.clone(), T), (len(row), len(row)))
    _compare(what, got, _sparsemax_reference(row, T),
             "it should be (diag(1_S) - 1_S 1_S^T / |S|) / T with S the keys where sparsemax(l / T) > 0",
             _sparsemax_mistakes(row, T))


def _sparsemax_values(f) -> None:
    for seed in range(80, 84):
        _sparsemax_compare(f, _randn(12, seed=seed, scale=2), 1.0)


def _sparsemax_temperatures(f) -> None:
    _sparsemax_compare(f, _randn(12, seed=85, scale=2), 0.1)
    _sparsemax_compare(f, _randn(12, seed=86, scale=2), 5.0)


def _sparsemax_single_key(f) -> None:
    row = _randn(9, seed=87)
    row[3] = 40.0  # one key takes all the weight: |S| = 1 and the Jacobian vanishes
    _sparsemax_compare(f, row, 1.0)


def _sparsemax_input_unchanged(f) -> None:
    row = _randn(12, seed=88)
    before = row.clone()
    f.sparsemax_jacobian(row, 0.5)
    if not torch.equal(row, before):
        raise CheckFailed("sparsemax_jacobian changed its input row in place: work on a copy")


# --- the registry --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exercise:
    """A coding exercise: the functions a reader writes, a hint per function, and the checks."""

    key: str                    # the exercise's label in the book, e.g. "ch1-ex2"
    notebook: str               # the notebook that holds it
    hints: dict[str, str]       # function name -> hint, in the order the functions are passed to check()
    parts: dict[str, Callable[[SimpleNamespace], None]]  # part name -> check raising CheckFailed

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.hints)


EXERCISES: dict[str, Exercise] = {ex.key: ex for ex in [
    Exercise("ch0-ex2", "ch0_setting",
             {"causal_softmax": "return softmax(l / T) over the keys j <= t of each query row t, zeros elsewhere"},
             {"shape": _causal_shape, "rows sum to one": _causal_sums, "causal mask": _causal_mask_applied,
              "temperature": _causal_temperature, "large logits": _causal_large_logits, "values": _causal_values}),
    Exercise("ch1-ex2", "ch1_vanishing",
             {"max_weight_bound": "return the upper bound C2 / L of Lemma 1 for F on [-a, a]",
              "extreme_row": "return L logits in [-a, a]: one where F is largest, the others where F is smallest"},
             {"softmax": _bound_softmax, "several lengths": _bound_lengths, "non-monotone F": _bound_non_monotone,
              "extreme row": _extreme_rows}),
    Exercise("ch2-ex2", "ch2_distance",
             {"distance_by_loop": "return the top-N set, the context vector s and the distance, with plain loops"},
             {"top-N set": _distance_top, "ties": _distance_ties, "context vector": _distance_context,
              "distance": _distance_total}),
    Exercise("ch3-ex2", "ch3_separability",
             {"separability_by_loop": "return (N_s, r) for one row, the x_i projected onto the unit sphere"},
             {"radius": _separability_radius, "count": _separability_counts, "other rows": _separability_other_rows}),
    Exercise("ch4-ex2", "ch4_gradient",
             {"g_row": "return ||softmax((l + eps v)/T) - softmax(l/T)|| / eps for a random unit direction v "
                       "drawn with generator"},
             {"one row": _g_one_row, "temperatures": _g_temperatures, "bound": _g_bound,
              "input unchanged": _g_input_unchanged}),
    Exercise("ch6-ex2", "ch6_beyond",
             {"sparsemax_jacobian": "return (diag(1_S) - 1_S 1_S^T / |S|) / T, S = the support of sparsemax(row / T)"},
             {"values": _sparsemax_values, "temperatures": _sparsemax_temperatures,
              "one-key support": _sparsemax_single_key, "input unchanged": _sparsemax_input_unchanged}),
]}


def exercise_notebooks() -> list[str]:
    """The notebooks that hold a coding exercise."""
    return sorted({ex.notebook for ex in EXERCISES.values()})


def exercises_of(notebook: str) -> list[str]:
    """The keys of the coding exercises of ``notebook``, in order."""
    return [key for key, ex in EXERCISES.items() if ex.notebook == notebook]


# --- running the checks ----------------------------------------------------------------------------------


_TODO = "not implemented yet"


@dataclass
class Result:
    """The outcome of the checks of one exercise: which parts passed, and a hint for each failure."""

    key: str
    passed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (part, hint)
    unimplemented: str | None = None  # the message of a NotImplementedError, if a function raised one

    @property
    def score(self) -> float:
        """The fraction of the parts that passed."""
        return len(self.passed) / (len(self.passed) + len(self.failed))

    @property
    def feedback(self) -> str:
        if not self.failed:
            return f"all {len(self.passed)} checks passed"
        if self.unimplemented and not self.passed and all(h.startswith(_TODO) for _, h in self.failed):
            return f"{_TODO} (NotImplementedError: {self.unimplemented})"  # once, not once per part
        return "; ".join(f"{part}: {hint}" for part, hint in self.failed)

    def tested(self) -> str:
        """What the checks test: the exercise's functions and the parts checked (``causal_softmax`` on: shape,
        rows sum to one, ...)."""
        names = ", ".join(f"`{n}`" for n in EXERCISES[self.key].names) if self.key in EXERCISES else "the functions"
        return f"checks {names} on: {', '.join(self.passed + [p for p, _ in self.failed])}"

    def __repr__(self) -> str:
        if not self.failed:
            return f"{self.key} {self.tested()}. All {len(self.passed)} pass for the function defined above."
        return f"{self.key}: {len(self.failed)} of {len(self.passed) + len(self.failed)} checks failed: {self.feedback}"

    def _repr_html_(self) -> str:
        colour, mark = ("#1a7f37", "&#10004;") if not self.failed else ("#b35900", "&#10008;")
        return f"<p style='color:{colour}'><b>{mark} {html.escape(repr(self))}</b></p>"


def _exercise(key: str) -> Exercise:
    if key not in EXERCISES:
        raise ValueError(f"unknown exercise {key!r}; coding exercises: {sorted(EXERCISES)}")
    return EXERCISES[key]


def _parts(ex: Exercise, part: str | None) -> list[str]:
    if part is None:
        return list(ex.parts)
    if part not in ex.parts:
        raise ValueError(f"exercise {ex.key} has no part {part!r}; its parts: {list(ex.parts)}")
    return [part]


def evaluate(key: str, namespace: Mapping[str, Any], part: str | None = None) -> Result:
    """Run the checks of exercise ``key`` (every part, or only ``part``) on the functions named in
    ``namespace``; never raises for them."""
    ex, result = _exercise(key), Result(key)
    parts = _parts(ex, part)
    missing = [name for name in ex.names if not callable(namespace.get(name))]
    if missing:
        hint = f"{missing[0]} is not defined: keep the function name of the exercise cell"
        result.failed = [(p, hint) for p in parts]
        return result
    functions = SimpleNamespace(**{name: namespace[name] for name in ex.names})
    for name in parts:
        try:
            ex.parts[name](functions)
            result.passed.append(name)
        except CheckFailed as exc:
            result.failed.append((name, str(exc)))
        except NotImplementedError as exc:
            result.unimplemented = result.unimplemented or str(exc) or f"exercise {key} is not implemented yet"
            result.failed.append((name, f"{_TODO} (NotImplementedError: {exc})"))
        except (Exception, SystemExit) as exc:  # a reader's function may raise anything
            result.failed.append((name, f"your function raised {type(exc).__name__}: {exc}"))
    return result


def check(key: str, *functions: Callable, part: str | None = None) -> Result:
    """Check a reader's functions for exercise ``key`` (in the order of ``EXERCISES[key].names``), on every
    part or only on ``part``.

    Returns the :class:`Result` when every part passes; re-raises ``NotImplementedError`` for a stub;
    otherwise raises :class:`CheckFailed` whose message holds a hint for each failed part.
    """
    __tracebackhide__ = True  # IPython shows the hint, not this frame
    ex = _exercise(key)
    if len(functions) != len(ex.names):
        raise TypeError(f"check({key!r}, ...) takes the functions {', '.join(ex.names)}; got {len(functions)}")
    result = evaluate(key, dict(zip(ex.names, functions)), part)
    if result.unimplemented:
        raise NotImplementedError(result.unimplemented)
    if result.failed:
        raise CheckFailed(f"{key}: {result.feedback}")
    return result
