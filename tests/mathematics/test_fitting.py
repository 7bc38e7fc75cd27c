"""Tests of attn_utils.mathematics.fitting: power laws are recovered, the one NaN rule, bad input."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils.mathematics.fitting import loglog_fit, loglog_slope


@settings(max_examples=60, deadline=None)
@given(k=st.floats(-3, 3), log_c=st.floats(-5, 5), n=st.integers(2, 30), start=st.floats(0.1, 100))
def test_a_power_law_gives_its_exponent_and_constant(k, log_c, n, start):
    x = start * 2.0 ** np.arange(n)
    fit = loglog_fit(x, np.exp(log_c) * x ** k)
    assert fit.slope == pytest.approx(k, abs=1e-9) and fit.intercept == pytest.approx(log_c, abs=1e-8)
    assert fit.points == n
    np.testing.assert_allclose(fit(x), np.exp(log_c) * x ** k, rtol=1e-8)


def test_the_nan_rule_leaves_out_points_a_log_axis_cannot_show():
    x = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    y = 3 * x ** 2
    y[1], y[3] = np.nan, 0.0
    x[5] = -1.0
    fit = loglog_fit(x, y)
    assert fit.slope == pytest.approx(2.0) and fit.points == 3
    assert math.isnan(loglog_slope([1.0, 2.0], [1.0, np.nan])) and loglog_fit([1.0, 2.0], [1.0, np.nan]).points == 1
    assert math.isnan(loglog_slope([], []))
    assert math.isnan(loglog_fit([1.0, np.inf, 3.0], [1.0, 2.0, -3.0]).intercept)


def test_the_same_numbers_as_a_plain_least_squares_fit_of_the_logs():
    """Where every point is usable the fit is numpy's, to the last bit (the chapters' fits before this module)."""
    rng = np.random.default_rng(0)
    x, y = np.sort(rng.uniform(1, 1000, 20)), rng.uniform(0.01, 5, 20)
    assert loglog_slope(x, y) == float(np.polyfit(np.log(x), np.log(y), 1)[0])
    assert loglog_fit(x, y).intercept == float(np.polyfit(np.log(x), np.log(y), 1)[1])


def test_x_and_y_must_have_the_same_number_of_points():
    with pytest.raises(ValueError, match="same number of points"):
        loglog_slope([1, 2, 3], [1, 2])
