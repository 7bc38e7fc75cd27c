"""Tests of attn_utils.mathematics.normalizers: golden values, independent oracles, properties, gradients, bad input."""
from __future__ import annotations

import math

import entmax
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attn_utils.mathematics.normalizers import (
    causal_mask,
    general,
    self_adjust,
    self_adjust_normalized,
    softmax,
    softmax1,
    ssmax,
)
from attn_utils.mathematics.registry import REGISTRY, get, normalize

DISTRIBUTIONS = ["softmax", "general", "sparsemax", "entmax15", "ssmax"]
NOT_DISTRIBUTIONS = ["softmax1", "self_adjust", "self_adjust_normalized"]
DTYPES = [torch.float32, torch.float64]


def exp_F(l, T):
    """Softmax written as the F of Eq. (3)."""
    return torch.exp(l / T)


def positive_F(l):
    """A positive F that stays finite for |l| <= 1e4 in float32."""
    return torch.nn.functional.softplus(l) + 1e-3


def run(name, logits, mask=None, T=1.0, **extra):
    """Call a normalizer by name; "general" gets a positive F instead of a temperature."""
    if name == "general":
        return normalize(logits, "general", mask=mask, F=positive_F, **extra)
    return normalize(logits, name, mask=mask, T=T, **extra)


def random_case(seed, shape=(4, 6), scale=2.0, dtype=torch.float64):
    """Random logits and a random mask with one fully masked row and one fully visible row."""
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(shape, generator=g, dtype=dtype)
    mask = torch.rand(shape, generator=g) < 0.6
    mask[0] = False
    mask[1] = True
    return logits, mask


# --- golden values and registry ---------------------------------------------------------------


def test_entmax_readme_golden_values():
    x = torch.tensor([-2.0, 0.0, 0.5])
    assert torch.allclose(softmax(x), torch.tensor([0.0486, 0.3592, 0.5922]), atol=1e-4)
    assert torch.allclose(normalize(x, "sparsemax"), torch.tensor([0.0, 0.25, 0.75]), atol=1e-6)
    assert torch.allclose(normalize(x, "entmax15"), torch.tensor([0.0, 0.3260, 0.6740]), atol=1e-4)


def test_registry_and_sums_to_one_flags():
    assert set(REGISTRY) == set(DISTRIBUTIONS) | set(NOT_DISTRIBUTIONS)
    assert {n for n, r in REGISTRY.items() if r.sums_to_one} == set(DISTRIBUTIONS)


def test_tiny_temperature_is_exact_scaling():
    # with T = 1e-6 the logits (0, 1e-6) become (0, 1)
    out = softmax(torch.tensor([0.0, 1e-6], dtype=torch.float64), T=1e-6)
    expected = torch.tensor([1.0, math.e]) / (1.0 + math.e)
    assert torch.allclose(out, expected.double(), atol=1e-9)


def test_causal_mask():
    m = causal_mask(4)
    assert m.shape == (4, 4) and m.dtype == torch.bool
    assert m.tolist() == [[j <= t for j in range(4)] for t in range(4)]
    assert causal_mask(1).tolist() == [[True]]


def test_causal_mask_on_batched_logits_matches_row_by_row():
    L = 5
    logits = torch.randn(2, 3, L, L, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = softmax(logits, mask=causal_mask(L), T=0.5)
    for t in range(L):
        assert torch.allclose(out[..., t, : t + 1], torch.softmax(logits[..., t, : t + 1] / 0.5, -1))
        assert (out[..., t, t + 1 :] == 0).all()


# --- oracles ----------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [0.3, 1.0, 7.0])
def test_softmax_matches_torch_softmax(T):
    logits, mask = random_case(1)
    out = softmax(logits, mask=mask, T=T)
    ref = torch.softmax(logits.masked_fill(~mask, -math.inf) / T, -1)
    rows = mask.any(-1)
    assert torch.allclose(out[rows], ref[rows], atol=1e-12)
    assert (out[~rows] == 0).all()
    assert torch.allclose(softmax(logits, T=T), torch.softmax(logits / T, -1), atol=1e-12)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("T", [0.5, 2.0])
def test_sparse_normalizers_match_entmax_on_visible_keys(name, T):
    fn = getattr(entmax, name)
    for seed in range(5):
        logits, mask = random_case(seed, shape=(6, 7))
        out = normalize(logits, name, mask=mask, T=T)
        for row in range(logits.shape[0]):
            vis = mask[row]
            assert (out[row][~vis] == 0).all()
            if vis.any():
                assert torch.allclose(out[row][vis], fn(logits[row][vis] / T, dim=-1), atol=1e-12)
            else:
                assert (out[row] == 0).all()


def test_general_with_exp_is_softmax():
    logits, mask = random_case(2)
    for T in (0.25, 1.0, 3.0):
        out = general(logits, F=exp_F, theta=T, mask=mask)
        assert torch.allclose(out, softmax(logits, mask=mask, T=T), atol=1e-12)
    # theta=None calls F(l)
    assert torch.allclose(general(logits, F=torch.exp), softmax(logits), atol=1e-12)


def test_general_is_a_plain_ratio():
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    out = general(logits, F=lambda l, p: l**p, theta=2)
    assert torch.allclose(out, torch.tensor([[1.0, 4.0, 9.0, 16.0]], dtype=torch.float64) / 30)


@pytest.mark.parametrize("s", [0.5, 1.0, 2.0])
def test_ssmax_is_softmax_with_row_temperature(s):
    T = 0.8
    logits, mask = random_case(3, shape=(6, 8))
    mask[2] = False
    mask[2, 3] = True  # a row that sees a single key
    out = ssmax(logits, mask=mask, s=s, T=T)
    for row in range(logits.shape[0]):
        vis = mask[row]
        n = int(vis.sum())
        if n == 0:
            assert (out[row] == 0).all()
        elif n == 1:
            assert out[row][vis].item() == 1.0
        else:
            T_row = T / (s * math.log(n))
            assert torch.allclose(out[row][vis], torch.softmax(logits[row][vis] / T_row, -1), atol=1e-12)
        assert (out[row][~vis] == 0).all()


def test_ssmax_without_mask_uses_last_dim():
    logits = torch.randn(3, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    assert torch.allclose(ssmax(logits), torch.softmax(logits * math.log(10), -1), atol=1e-12)


def test_softmax1_matches_loop_formula():
    T = 1.5
    logits, mask = random_case(5, shape=(5, 6), scale=4.0)
    out = softmax1(logits, mask=mask, T=T)
    for row in range(logits.shape[0]):
        vis = [j for j in range(logits.shape[1]) if mask[row, j]]
        denom = 1.0 + sum(math.exp(logits[row, j].item() / T) for j in vis)
        for j in range(logits.shape[1]):
            expected = math.exp(logits[row, j].item() / T) / denom if j in vis else 0.0
            assert out[row, j].item() == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_self_adjust_matches_definition_and_is_not_a_distribution():
    T = 0.7
    logits, mask = random_case(6)
    out = self_adjust(logits, mask=mask, T=T)
    z = logits / T
    ref = torch.where(mask, z * softmax(logits, mask=mask, T=T), 0)
    assert torch.allclose(out, ref, atol=1e-12)
    assert (out < 0).any()
    assert not torch.allclose(out[1].sum(), torch.tensor(1.0, dtype=out.dtype))


def test_self_adjust_normalized_matches_paper_formula():
    T = 0.9
    logits, mask = random_case(7, shape=(6, 7))
    logits[3] = logits[3].abs() + 0.1  # a row of positive z: the factor is z / z_max
    out = self_adjust_normalized(logits, mask=mask, T=T)
    for row in range(logits.shape[0]):
        vis = mask[row]
        if not vis.any():
            assert (out[row] == 0).all()
            continue
        z = logits[row][vis] / T
        low, high = min(z.min().item(), 0.0), max(z.max().item(), 0.0)
        ref = (z - low) / (high - low) * torch.softmax(z, -1)
        assert torch.allclose(out[row][vis], ref, atol=1e-12)
        assert (out[row][~vis] == 0).all()
    # all-zero logits: the 0/0 factor is defined as 0
    assert (self_adjust_normalized(torch.zeros(2, 3)) == 0).all()


# --- properties (hypothesis) ------------------------------------------------------------------


@st.composite
def masked_logits(draw, bound=1e4):
    """Logits of shape (B, L) in [-bound, bound], a random mask, and sometimes ±inf at masked keys."""
    B = draw(st.integers(1, 3))
    L = draw(st.integers(1, 6))
    x = draw(arrays(np.float64, (B, L), elements=st.floats(-bound, bound, allow_nan=False)))
    mask = draw(arrays(np.bool_, (B, L)))
    if draw(st.booleans()):
        x[~mask] = draw(st.sampled_from([-np.inf, np.inf]))
    return x, mask


temperatures = st.floats(-6, 3).map(lambda e: 10.0**e)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", DISTRIBUTIONS)
@settings(max_examples=300, deadline=None)
@given(case=masked_logits(), T=temperatures)
def test_distributions_sum_to_one_and_respect_mask(name, dtype, case, T):
    x, mask = case
    logits, mask = torch.tensor(x, dtype=dtype), torch.tensor(mask)
    out = run(name, logits, mask=mask, T=T)
    assert out.dtype == dtype and out.shape == logits.shape
    assert torch.isfinite(out).all()
    assert (out[~mask] == 0).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert (out >= 0).all() and (out <= 1 + tol).all()
    sums = out.sum(-1)
    rows = mask.any(-1)
    assert torch.allclose(sums[rows], torch.ones_like(sums[rows]), atol=tol)
    assert (sums[~rows] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NOT_DISTRIBUTIONS)
@settings(max_examples=150, deadline=None)
@given(case=masked_logits(), T=temperatures)
def test_other_normalizers_are_finite_and_respect_mask(name, dtype, case, T):
    x, mask = case
    logits, mask = torch.tensor(x, dtype=dtype), torch.tensor(mask)
    out = run(name, logits, mask=mask, T=T)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert (out[~mask] == 0).all()
    assert (out[~mask.any(-1)] == 0).all()
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    if name == "softmax1":  # the sum S / (1 + S) < 1 rounds to 1 once S is large
        assert (out >= 0).all() and (out.sum(-1) <= 1 + tol).all()
        # softmax1 = softmax * S / (1 + S) = softmax * sigmoid(logsumexp(z)), to relative accuracy
        lse = torch.logsumexp(torch.where(mask, logits / T, -math.inf), -1, keepdim=True)
        ref = softmax(logits, mask=mask, T=T) * torch.sigmoid(torch.where(lse > -math.inf, lse, 0))
        assert torch.allclose(out, ref, rtol=10 * tol, atol=1e-30)
    if name == "self_adjust_normalized":
        p = softmax(logits, mask=mask, T=T)
        assert (out >= 0).all() and (out <= p * (1 + tol)).all()


@settings(max_examples=300, deadline=None)
@given(case=masked_logits(bound=10.0), T=st.floats(0.5, 5.0))
def test_softmax1_sums_strictly_below_one(case, T):
    x, mask = case
    logits, mask = torch.tensor(x), torch.tensor(mask)
    out = softmax1(logits, mask=mask, T=T)
    # 1 - sum = 1 / (1 + S) with S = sum of exp(z) over the visible keys; z <= 20 keeps it above eps
    S = torch.where(mask, torch.exp(torch.where(mask, logits, 0) / T), 0).sum(-1)
    assert (out.sum(-1) < 1).all()
    assert torch.allclose(1 - out.sum(-1), 1 / (1 + S), rtol=1e-6, atol=1e-14)


@settings(max_examples=300, deadline=None)
@given(case=masked_logits(), T=temperatures)
def test_softmax_is_shift_invariant_and_extreme_safe(case, T):
    x, mask = case
    logits, mask = torch.tensor(x), torch.tensor(mask)
    out = softmax(logits, mask=mask, T=T)
    shifted = softmax(logits + 123.0, mask=mask, T=T)
    assert torch.allclose(out, shifted, atol=1e-9)


# --- gradients --------------------------------------------------------------------------------

GRAD_CASES = {
    "softmax": dict(T=0.7),
    "general": dict(F=exp_F, theta=0.7),
    "ssmax": dict(s=1.3, T=0.7),
    "softmax1": dict(T=0.7),
    "self_adjust": dict(T=0.7),
    "self_adjust_normalized": dict(T=0.7),
    # random logits keep every key a finite distance from the support boundary, where these are smooth
    "sparsemax": dict(T=0.7),
    "entmax15": dict(T=0.7),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradcheck(name):
    logits, mask = random_case(8, shape=(4, 5))
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda l: normalize(l, name, mask=mask, **GRAD_CASES[name]), (logits,))


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradients_are_finite_with_infinite_masked_logits(name):
    logits, mask = random_case(9, shape=(4, 5))
    logits = logits.masked_fill(~mask, -math.inf).requires_grad_(True)
    normalize(logits, name, mask=mask, **GRAD_CASES[name]).square().sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert (logits.grad[~mask] == 0).all()
    assert logits.grad[mask].abs().sum() > 0


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [0, -1, -1e-9, math.nan, math.inf, "1"])
def test_bad_temperature(T):
    with pytest.raises(ValueError, match=r"T must be a finite number > 0"):
        softmax(torch.zeros(3), T=T)
    with pytest.raises(ValueError, match=r"T must be a finite number > 0"):
        normalize(torch.zeros(3), "entmax15", T=T)


@pytest.mark.parametrize("s", [0, -2.0, math.nan])
def test_bad_s(s):
    with pytest.raises(ValueError, match=r"s must be a finite number > 0"):
        normalize(torch.zeros(3), "ssmax", s=s)


def test_unknown_name_lists_known_names():
    with pytest.raises(ValueError, match=r"unknown normalizer 'softmax2'; known normalizers: .*softmax1"):
        normalize(torch.zeros(3), "softmax2")
    with pytest.raises(ValueError, match=r"unknown normalizer 'softmax2'"):
        get("softmax2")
    with pytest.raises(ValueError, match=r"normalizer 'softmax' takes the parameters \['T'\], not \['s'\]"):
        normalize(torch.zeros(3), "softmax", s=2.0)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_nan_logits(name):
    x = torch.tensor([0.0, math.nan, 1.0])
    with pytest.raises(ValueError, match=r"logits contains NaN"):
        run(name, x)
    with pytest.raises(ValueError, match=r"logits contains NaN"):  # even at a masked position
        run(name, x, mask=torch.tensor([True, False, True]))


def test_infinite_visible_logit():
    with pytest.raises(ValueError, match=r"logits may be infinite only at masked positions"):
        softmax(torch.tensor([0.0, math.inf]))


def test_overflowing_temperature():
    with pytest.raises(ValueError, match=r"logits / T overflows"):
        softmax(torch.tensor([1e30, 0.0]), T=1e-10)


@pytest.mark.parametrize("F", [lambda l: -torch.exp(l), lambda l: torch.zeros_like(l), lambda l: torch.exp(1e3 * l)])
def test_general_rejects_non_positive_or_non_finite_F(F):
    with pytest.raises(ValueError, match=r"F must be positive and finite"):
        general(torch.tensor([0.0, 1.0]), F=F)


def test_general_ignores_F_at_masked_keys_and_checks_its_inputs():
    # F is negative at l = -5, which is masked: accepted
    out = general(torch.tensor([-5.0, 1.0, 2.0]), F=lambda l: l + 1.0, mask=torch.tensor([False, True, True]))
    assert torch.allclose(out, torch.tensor([0.0, 2 / 5, 3 / 5]))
    with pytest.raises(ValueError, match=r"F must be a callable"):
        general(torch.zeros(3), F=2.0)
    with pytest.raises(ValueError, match=r"F must act elementwise"):
        general(torch.zeros(3), F=lambda l: l.sum() + 1)


@pytest.mark.parametrize("mask_shape", [(4,), (2, 5), (2, 3, 5)])
def test_mask_of_wrong_shape(mask_shape):
    with pytest.raises(ValueError, match=r"mask of shape .* does not broadcast to logits"):
        softmax(torch.zeros(3, 5), mask=torch.ones(mask_shape, dtype=torch.bool))


def test_mask_must_be_boolean():
    with pytest.raises(ValueError, match=r"mask must be a boolean tensor"):
        softmax(torch.zeros(3), mask=torch.ones(3))


def test_logits_need_a_key_axis():
    with pytest.raises(ValueError, match=r"logits must be a float tensor of shape \(\.\.\., L\) with at least one key"):
        softmax(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"logits must have at least one key"):
        softmax(torch.zeros(3, 0))


def test_causal_mask_bad_length():
    with pytest.raises(ValueError, match=r"L must be an integer"):
        causal_mask(0)
