"""Notebook parameters: one specification, checked in each notebook's first cell and by the CLI.

Every notebook of the book has a cell tagged ``parameters``; the cell after it calls
:func:`validate` on its own parameters, so an invalid value stops that notebook at once with a
``ValueError`` naming the parameter and the allowed values. ``attn-companion`` calls the same
function before it executes anything.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

NORMALIZER_NAMES = ("softmax", "sparsemax", "entmax15", "ssmax", "softmax1", "self_adjust", "self_adjust_normalized")


@dataclass(frozen=True)
class Spec:
    """What one parameter accepts: ``check(value)`` returns True when ``value`` is allowed."""

    allowed: str
    check: Callable[[Any], bool]
    doc: str


def _is_int(v, lo=None, hi=None) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)
            and (lo is None or v >= lo) and (hi is None or v <= hi))


def _is_real(v, lo=None, hi=None, open_lo=False) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return False
    if lo is not None and (v <= lo if open_lo else v < lo):
        return False
    return hi is None or v <= hi


def _int_list(lo, increasing=False):
    def check(v):
        if not isinstance(v, (list, tuple)) or not v or not all(_is_int(x, lo) for x in v):
            return False
        return not increasing or all(a < b for a, b in zip(v, v[1:]))
    return check


def _pos_list(v) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(_is_real(x, 0, open_lo=True) for x in v)


def _corpus(v) -> bool:
    return v == "war-and-peace" or (isinstance(v, str) and Path(v).expanduser().is_file())


def _chapters(v) -> bool:
    return v is None or (isinstance(v, (list, tuple)) and len(v) == 2 and _is_int(v[0], 1) and _is_int(v[1], 1)
                         and v[0] <= v[1])


SPECS: dict[str, Spec] = {
    "model": Spec("'auto', 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl', 'distilgpt2', 'smollm2-135m', "
                  "'gpt2-random', a Hugging Face id or a local folder",
                  lambda v: isinstance(v, str) and bool(v.strip()),
                  "the model whose attention is measured; 'auto' takes GPT-2 when it can be had, SmolLM2 otherwise"),
    "corpus": Spec("'war-and-peace' or the path of a UTF-8 text file", _corpus,
                   "the text fed to the model"),
    "chapters": Spec("None or [first, last] with 1 <= first <= last", _chapters,
                     "consecutive chapters of the novel (1-based, counted across its books); None = whole novel"),
    "offset": Spec("an integer >= 0", lambda v: _is_int(v, 0), "first token of the window in the tokenized text"),
    "L": Spec("an integer >= 2 (and at most the model's context)", lambda v: _is_int(v, 2),
              "window length in tokens"),
    "lengths": Spec("a non-empty increasing list of integers >= 2", _int_list(2, increasing=True),
                    "the grid of lengths L"),
    "N": Spec("an integer >= 1", lambda v: _is_int(v, 1), "size of the top-N set"),
    "Ns": Spec("a non-empty increasing list of integers >= 1", _int_list(1, increasing=True),
               "the grid of top-N sizes"),
    "Ts": Spec("a non-empty list of numbers > 0", _pos_list, "the grid of temperatures"),
    "epsilons": Spec("a non-empty list of numbers > 0", _pos_list, "logit perturbation sizes of g(T, eps)"),
    "ks_alpha": Spec("a number in (0, 1)", lambda v: _is_real(v, 0, 1, open_lo=True) and v < 1,
                     "significance level of the Kolmogorov-Smirnov test of Algorithm 3"),
    "seed": Spec("an integer >= 0", lambda v: _is_int(v, 0), "seed of every random draw"),
    "n_samples": Spec("an integer >= 1", lambda v: _is_int(v, 1), "Monte-Carlo samples"),
    "n_trials": Spec("an integer >= 1", lambda v: _is_int(v, 1), "random synthetic instances"),
    "sigmas": Spec("a non-empty list of numbers > 0", _pos_list,
                   "standard deviations of the N(0, sigma^2) logits of synthetic rows"),
    "M": Spec("a number > 0", lambda v: _is_real(v, 0, open_lo=True), "radius of the sphere of Assumption 1"),
    "vectors": Spec("'value', 'key' or 'query'", lambda v: v in ("value", "key", "query"),
                    "which per-head vectors play the role of the x_i"),
    "logit_scale": Spec("'raw' (q.k) or 'model' (q.k times the model's scaling)", lambda v: v in ("raw", "model"),
                        "the scale of the logits l on which temperatures act"),
    "distance_reading": Spec("'sum_of_norms' or 'norm_of_sum'", lambda v: v in ("sum_of_norms", "norm_of_sum"),
                             "which reading of the cumulative distance (Eq. 7) is measured"),
    "normalizers": Spec(f"a non-empty list drawn from {list(NORMALIZER_NAMES)}",
                        lambda v: isinstance(v, (list, tuple)) and bool(v) and all(x in NORMALIZER_NAMES for x in v),
                        "the normalizers compared"),
    "rows_per_octave": Spec("None (every query row) or an integer >= 1", lambda v: v is None or _is_int(v, 1),
                            "query rows sampled per octave of positions [2^k, 2^(k+1)) in the distance experiments"),
    "long_lengths": Spec("None (2L and 4L, as far as the model's context allows) or a non-empty increasing list of "
                         "integers > L within the model's context (checked once the model is loaded)",
                         lambda v: v is None or _int_list(3, increasing=True)(v),
                         "windows longer than L for the long-context measurements (chapter ch6_beyond)"),
}


def validate(**values: Any) -> None:
    """Check every given parameter against :data:`SPECS`; raise ``ValueError`` on the first bad one."""
    for name, value in values.items():
        spec = SPECS.get(name)
        if spec is None:
            raise ValueError(f"unknown parameter {name!r}; known parameters: {sorted(SPECS)}")
        if not spec.check(value):
            raise ValueError(f"parameter {name} must be {spec.allowed}, got {value!r}")
