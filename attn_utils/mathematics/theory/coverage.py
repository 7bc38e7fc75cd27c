"""Multi-head coverage (the paper's Discussion): the share of top-N keys that H independent heads cover.

Status as in :mod:`attn_utils.mathematics.theory`.
"""
from __future__ import annotations

import math

from attn_utils.mathematics.validation import check_int

__all__ = ["MAX_HEADS", "heads_for_coverage", "multihead_coverage"]


#: Largest answer of ``heads_for_coverage``: up to 2^53 every integer H is a float64, so H and H - 1
#: are told apart and the minimal H is exact.
MAX_HEADS = 2**53


def _check_number(name: str, value, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _coverage(p: float, H: int) -> float:
    return -math.expm1(H * math.log1p(-p)) if p < 1 else 1.0


def multihead_coverage(p: float, H: int) -> float:
    """1 - (1 - p)^H: the fraction of top-N tokens covered by H independent heads that each separate a
    fraction p (the paper's Discussion; paper's statement, recovered). Computed as
    -expm1(H log1p(-p)), accurate also for tiny p; non-decreasing in H."""
    p = _check_number("p", p, 0.0, 1.0)
    H = check_int("H", H, low=1)
    return _coverage(p, H)


def heads_for_coverage(p: float, target: float) -> int:
    """The smallest H >= 1 with multihead_coverage(p, H) >= target (p = 0.8, target = 0.99 gives 3).

    Closed form: (1 - p)^H <= 1 - target iff H >= log1p(-target) / log1p(-p), so H is the ceiling of
    that ratio; a bounded search (galloping then bisection, O(log H) steps) corrects its rounding
    against ``multihead_coverage``, which is non-decreasing in H. Needs 0 < p <= 1 and 0 <= target < 1
    (target = 1 only with p = 1). Returns an exact int up to MAX_HEADS = 2^53; a larger answer (tiny p)
    raises ValueError.
    """
    p = _check_number("p", p, 0.0, 1.0)
    if p == 0:
        raise ValueError("p must be in (0, 1]: with p = 0 no number of heads covers anything")
    target = _check_number("target", target, 0.0, 1.0)
    if target == 1 and p < 1:
        raise ValueError("target must be in [0, 1): coverage 1 needs p = 1")
    if p == 1 or target == 0:
        return 1
    ratio = math.log1p(-target) / math.log1p(-p)
    if not ratio <= MAX_HEADS:  # also catches ratio = inf (p below ~1e-308)
        raise ValueError(
            f"p = {p!r} is too small for target = {target!r}: log1p(-target) / log1p(-p) = {ratio:.3g} heads "
            f"exceeds MAX_HEADS = 2^53 (the largest count returned exactly); use a larger p or a smaller target"
        )

    def enough(H: int) -> bool:
        return H >= 1 and _coverage(p, H) >= target

    guess = max(1, math.ceil(ratio))
    step = 1
    if enough(guess):  # gallop down to a failing lo (or 0), then bisect (lo, hi]
        hi, lo = guess, guess - 1
        while enough(lo):
            hi, step = lo, 2 * step
            lo = max(0, hi - step)
    else:  # gallop up to a passing hi
        lo, hi = guess, guess + 1
        while not enough(hi):
            lo, step = hi, 2 * step
            hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi
