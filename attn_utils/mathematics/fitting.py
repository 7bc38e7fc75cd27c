"""Power laws fitted on log-log axes: the one slope fit of the book.

The book reads growth and decay rates as log-log slopes: d~ against L (Fig. 2a; slope 1 is linear growth), the
largest weight against the row length (Lemma 1's 1/L is slope -1), g against T (Corollary 3's 1/T is slope -1).

**The NaN rule.** A point enters the fit only where x and y are both finite and > 0 (the only points a log-log
axis can show: a NaN marks a quantity without a valid row, a 0 an exact zero such as a sparse normalizer's weight);
the others are left out, and :attr:`LogLogFit.points` says how many remained. With fewer than two points the
slope and the intercept are NaN. A caller that wants a range of x (e.g. t >= t_min) selects it before fitting; one
whose claim needs every point of its range (chapter 4's 1/T law, which a g of exactly 0 departs from) compares
``points`` with the number of points it passed.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["LogLogFit", "loglog_fit", "loglog_slope"]


class LogLogFit(NamedTuple):
    """The least-squares line log y = slope * log x + intercept, and the number of points it went through."""

    slope: float
    intercept: float
    points: int

    def __call__(self, x) -> np.ndarray:
        """The fitted power law exp(intercept) * x^slope at ``x``."""
        return np.exp(np.polyval([self.slope, self.intercept], np.log(np.asarray(x, dtype=float))))


def loglog_fit(x, y) -> LogLogFit:
    """Least-squares fit of log y against log x over the points where both are finite and positive (the NaN rule
    of this module). A power law y = c x^k gives slope k and intercept log c; NaN with fewer than two points."""
    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same number of points, got {x.size} and {y.size}")
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    n = int(keep.sum())
    if n < 2:
        return LogLogFit(float("nan"), float("nan"), n)
    slope, intercept = np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)
    return LogLogFit(float(slope), float(intercept), n)


def loglog_slope(x, y) -> float:
    """The slope of :func:`loglog_fit`: k for a power law y = c x^k; NaN with fewer than two usable points."""
    return loglog_fit(x, y).slope
