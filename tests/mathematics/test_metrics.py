"""Tests of attn_utils.mathematics.metrics: agreement with the loop reference, precision, conventions, properties,
bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest
import reference as ref
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils.mathematics import metrics, theory
from helpers import HEADS, LAYERS, L, causal_attention, close

NS = [1, 3, 7, 20]


@pytest.fixture(scope="module")
def data():
    return causal_attention(0)


def each_row(shape):
    """Indices (layer, head, row) of every row, and the head index (layer, head) of its vectors."""
    for index in np.ndindex(*shape[:-1]):
        yield index, index[:-1]


# --- agreement with the loop reference ----------------------------------------------------------------


@pytest.mark.parametrize("N", NS)
def test_top_n_matches_reference(data, N):
    w, _, mask, _ = data
    selected, valid = metrics.top_n_mask(w, N, mask)
    vis = mask.expand(w.shape).numpy()
    for index, _ in each_row(w.shape):
        assert valid[index] == (vis[index].sum() > N)
        expected = ref.top_n(w[index].numpy(), vis[index], N)
        assert np.flatnonzero(selected[index].numpy()).tolist() == expected


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("reading", metrics.READINGS)
def test_cumulative_distance_matches_reference(data, N, reading):
    w, x, mask, _ = data
    selected, _ = metrics.top_n_mask(w, N, mask)
    got = metrics.cumulative_distance(w, x, selected, mask, reading=reading)
    s = metrics.context_vector(w, x, selected)
    vis = mask.expand(w.shape).numpy()
    for index, head in each_row(w.shape):
        sel = np.flatnonzero(selected[index].numpy()).tolist()
        close(s[index], ref.context_vector(w[index].numpy(), x[head].numpy(), sel))
        close(got[index], ref.cumulative_distance(w[index].numpy(), x[head].numpy(), sel, vis[index], reading))


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("normalize", [True, False])
def test_separability_matches_reference(data, N, normalize):
    w, x, mask, _ = data
    ratio, r = metrics.separability(w, 3 * x, N, mask, M=2.0, normalize=normalize)
    vis = mask.expand(w.shape).numpy()
    for index, head in each_row(w.shape):
        if vis[index].sum() <= N:
            assert math.isnan(ratio[index]) and math.isnan(r[index])
            continue
        want = ref.separability(w[index].numpy(), 3 * x[head].numpy(), N, vis[index], M=2.0, normalize=normalize)
        close((ratio[index], r[index]), want)


def test_min_pairwise_distance_matches_reference(data):
    _, x, _, _ = data
    got = metrics.min_pairwise_distance(x)
    assert got.shape == (LAYERS, HEADS)
    for head in np.ndindex(LAYERS, HEADS):
        close(got[head], ref.min_pairwise_distance(x[head].numpy()))


@pytest.mark.parametrize("T", [1e-3, 0.1, 1.0, 30.0])
@pytest.mark.parametrize("eps", [1e-3, 1e-1, 10.0])
def test_finite_difference_gradient_matches_reference(data, T, eps):
    _, _, mask, logits = data
    got = metrics.finite_difference_gradient(logits, T, eps, mask, generator=torch.Generator().manual_seed(7))
    v = metrics.random_directions(mask.expand(logits.shape), torch.Generator().manual_seed(7)).numpy()
    vis = mask.expand(logits.shape).numpy()
    want = np.zeros(got.shape)
    for index, _ in each_row(logits.shape):
        want[index] = ref.fd_gradient(logits[index].numpy(), v[index], vis[index], T, eps)
    # a difference of two rounded distributions is exact only to ~1e-16 absolute, hence atol / eps
    close(got, want, atol=1e-14 / eps)


def test_entropy_and_max_weight_match_reference(data):
    w = data[0]
    ent, top = metrics.entropy(w), metrics.max_weight(w)
    for index, _ in each_row(w.shape):
        close(ent[index], ref.entropy(w[index].numpy()))
        assert top[index] == w[index].max()


# --- precision ------------------------------------------------------------------------------------------


def test_near_cancellation_is_exact():
    """alpha_1 x_1 equals s up to 1e-7 relative: the Gram form alone would lose about 8 digits."""
    g = torch.Generator().manual_seed(3)
    w = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    x = torch.randn(4, 16, generator=g, dtype=torch.float64) * 100
    x[1] = x[0] * (0.4 / 0.3) * (1 + 1e-7)
    selected, _ = metrics.top_n_mask(w, 1)
    got = metrics.cumulative_distance(w, x, selected)
    want = ref.cumulative_distance(w[0].numpy(), x.numpy(), [0], np.ones(4, dtype=bool))
    close(got[0], want, rtol=1e-12)
    ratio, r = metrics.separability(w, x, 1, normalize=False)
    close(r[0], np.linalg.norm(0.3 * x[1].numpy() - 0.4 * x[0].numpy()), rtol=1e-9)
    assert ratio[0] == 1.0  # the selected point is s itself: distance exactly 0 < r


def test_near_duplicate_vectors_keep_their_distance():
    x = torch.randn(10, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[7] = x[2] + 1e-9 * torch.nn.functional.normalize(torch.ones(64, dtype=torch.float64), dim=0)
    close(metrics.min_pairwise_distance(x), ref.min_pairwise_distance(x.numpy()), rtol=1e-12)
    close(metrics.min_pairwise_distance(x), 1e-9, rtol=1e-6)


# --- conventions -----------------------------------------------------------------------------------------


def test_ties_break_towards_the_lowest_index():
    w = torch.tensor([[0.1, 0.3, 0.3, 0.3], [0.25, 0.25, 0.25, 0.25], [0.3, 0.1, 0.3, 0.3]], dtype=torch.float64)
    selected, valid = metrics.top_n_mask(w, 2)
    assert selected.tolist() == [[False, True, True, False], [True, True, False, False], [True, False, True, False]]
    assert valid.all()
    again, _ = metrics.top_n_mask(w.clone(), 2)
    assert torch.equal(selected, again)


def test_ties_with_a_mask():
    w = torch.full((1, 6), 1 / 6, dtype=torch.float64)
    mask = torch.tensor([[False, True, False, True, True, True]])
    selected, valid = metrics.top_n_mask(w, 2, mask)
    assert selected.tolist() == [[False, True, False, True, False, False]] and valid.item()


def test_short_rows_are_invalid(data):
    w, x, mask, _ = data
    N = 5
    _, valid = metrics.top_n_mask(w, N, mask)
    assert valid[..., :N].eq(False).all() and valid[..., N:].all()  # row t sees t + 1 keys
    ratio, _ = metrics.separability(w, x, N, mask)
    mc = metrics.expected_distance_mc(w, x, N, mask, n_samples=2, generator=torch.Generator().manual_seed(0))
    assert ratio[..., :N].isnan().all() and mc[..., :N].isnan().all()
    assert not ratio[..., N:].isnan().any() and not mc[..., N:].isnan().any()


def test_leading_dims_broadcast(data):
    w, x, mask, _ = data
    one_row_set = w[0, 0]  # (R, L) weights against (layers, heads, L, d) vectors
    selected, _ = metrics.top_n_mask(one_row_set, 3, mask)
    got = metrics.cumulative_distance(one_row_set, x, selected, mask)
    want = metrics.cumulative_distance(one_row_set.expand(w.shape), x, selected.expand(w.shape), mask)
    assert got.shape == (LAYERS, HEADS, L)
    close(got, want, rtol=0, atol=0)


def test_float32_input_is_computed_in_float64(data):
    w, x, mask, _ = data
    selected, _ = metrics.top_n_mask(w, 3, mask)
    got = metrics.cumulative_distance(w.float(), x.float(), selected, mask)
    assert got.dtype == torch.float64
    close(got, metrics.cumulative_distance(w, x, selected, mask), rtol=1e-5)


def test_expected_distance_mc_converges_to_enumeration():
    w, x, mask, _ = causal_attention(5, layers=1, heads=1, L=8, d=4)
    w, x = w[0, 0], x[0, 0]
    for N in (1, 3, 6):
        mc = metrics.expected_distance_mc(w, x, N, mask, n_samples=1500, generator=torch.Generator().manual_seed(2))
        exact = [ref.expected_distance_exact(w[t].numpy(), x.numpy(), N, mask[t].numpy()) for t in range(N, 8)]
        close(mc[N:], exact, rtol=0.03)  # observed <= 1.5 % with this seed
        # the enumeration also confirms that Theorem 1's main sum is a lower bound (Jensen)
        main = theory.theorem1_random_main_sum(w, x, N, mask)[N:]
        assert (main <= torch.tensor(exact) + 1e-12).all()


# --- properties (hypothesis) ----------------------------------------------------------------------------


@st.composite
def attention_rows(draw):
    """A few rows of softmax weights over L keys with a random mask (>= 1 visible key per row), and x."""
    L = draw(st.integers(2, 9))
    R = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([0.0, 0.5, 3.0, 30.0]))  # 0.0: all weights tied
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(R, L, generator=g) < 0.7
    mask[:, 0] = True
    logits = scale * torch.randn(R, L, generator=g, dtype=torch.float64)
    weights = torch.softmax(logits.masked_fill(~mask, -torch.inf), -1)
    x = torch.randn(L, 3, generator=g, dtype=torch.float64)
    N = draw(st.integers(1, L - 1))
    return weights, x, mask, logits, N


@settings(max_examples=60, deadline=None)
@given(attention_rows())
def test_distance_properties(case):
    w, x, mask, _, N = case
    selected, valid = metrics.top_n_mask(w, N, mask)
    assert (selected.sum(-1)[valid] == N).all()
    assert (selected & ~mask).sum() == 0
    low = torch.where(selected, w, torch.inf).amin(-1)
    high = torch.where(mask & ~selected, w, -torch.inf).amax(-1)
    assert (low[valid] >= high[valid]).all()
    total = metrics.cumulative_distance(w, x, selected, mask)
    folded = metrics.cumulative_distance(w, x, selected, mask, reading="norm_of_sum")
    assert (total >= 0).all() and (folded <= total + 1e-12).all()
    assert (total[~valid] == 0).all()  # no non-selected key: empty sum
    assert (total <= theory.theorem1_fixed_bound(w, x, selected, mask) + 1e-9).all()


@settings(max_examples=60, deadline=None)
@given(attention_rows())
def test_separability_ratio_is_a_fraction(case):
    w, x, mask, _, N = case
    ratio, r = metrics.separability(w, x, N, mask)
    _, valid = metrics.top_n_mask(w, N, mask)
    assert ((ratio[valid] >= 0) & (ratio[valid] <= 1)).all() and (r[valid] >= 0).all()
    assert (ratio[valid] * N == (ratio[valid] * N).round()).all()


@settings(max_examples=60, deadline=None)
@given(attention_rows(), st.sampled_from([1e-3, 0.05, 1.0, 50.0]), st.sampled_from([1e-3, 0.1, 10.0]))
def test_gradient_is_below_its_valid_bound(case, T, eps):
    _, _, mask, logits, _ = case
    g = metrics.finite_difference_gradient(logits, T, eps, mask, generator=torch.Generator().manual_seed(0))
    assert (g >= 0).all() and (g <= theory.finite_difference_bound(T, eps) * (1 + 1e-9)).all()


@settings(max_examples=60, deadline=None)
@given(attention_rows())
def test_entropy_and_max_weight_ranges(case):
    w, _, mask, _, _ = case
    n = mask.sum(-1).double()
    ent, top = metrics.entropy(w), metrics.max_weight(w)
    assert (ent >= -1e-12).all() and (ent <= n.log() + 1e-12).all()
    assert (top >= 1 / n - 1e-12).all() and (top <= 1).all()


def test_random_directions_are_unit_vectors_on_visible_keys(data):
    mask = data[2].expand(4, L, L)
    v = metrics.random_directions(mask, torch.Generator().manual_seed(0))
    close(torch.linalg.vector_norm(v, dim=-1), 1.0)
    assert (v[~mask] == 0).all()


@settings(max_examples=100, deadline=None)
@given(attention_rows(), st.sampled_from([-900, -500, 0, 7, 600, 1000]))
def test_distances_are_homogeneous_exactly(case, k):
    """f(2^k x) = 2^k f(x) bit for bit (r too, and the ratio is unchanged), also where the squares of
    2^k x overflow (|x| ~ 1e180, 1e300) or underflow."""
    w, x, mask, _, N = case
    c = 2.0**k
    selected, _ = metrics.top_n_mask(w, N, mask)

    def mc(v):
        return metrics.expected_distance_mc(w, v, N, mask, n_samples=3, generator=torch.Generator().manual_seed(1))

    for f in (lambda v: metrics.cumulative_distance(w, v, selected, mask),
              lambda v: metrics.cumulative_distance(w, v, selected, mask, reading="norm_of_sum"),
              lambda v: metrics.separability(w, v, N, mask, normalize=False)[1],
              lambda v: metrics.min_pairwise_distance(v),
              mc):
        want, got = f(x), f(x * c)
        assert not (got.isnan() & ~want.isnan()).any()
        np.testing.assert_array_equal(got.numpy(), (want * c).numpy())
    for normalize in (True, False):  # the ratio is scale-free
        np.testing.assert_array_equal(metrics.separability(w, x * c, N, mask, normalize=normalize)[0].numpy(),
                                      metrics.separability(w, x, N, mask, normalize=normalize)[0].numpy())
    sphere = metrics.project_to_sphere(x, 2.0).numpy()
    np.testing.assert_array_equal(metrics.project_to_sphere(x * c, 2.0).numpy(), sphere)


@settings(max_examples=100, deadline=None)
@given(attention_rows(), st.sampled_from([1e-150, 3.7, 1e200, 1.5e300]))
def test_distances_of_huge_vectors_are_finite(case, c):
    """|x| near 1e200 used to give NaN (the squares overflow); now d(c x) = c d(x) up to the rounding of c x."""
    w, x, mask, _, N = case
    selected, valid = metrics.top_n_mask(w, N, mask)
    for reading in metrics.READINGS:
        got = metrics.cumulative_distance(w, x * c, selected, mask, reading=reading)
        assert torch.isfinite(got).all()
        close(got / c, metrics.cumulative_distance(w, x, selected, mask, reading=reading), rtol=1e-9, atol=1e-7)
    ratio, r = metrics.separability(w, x * c, N, mask, normalize=False)
    assert torch.isfinite(r[valid]).all()
    close(r[valid] / c, metrics.separability(w, x, N, mask, normalize=False)[1][valid], rtol=1e-9, atol=1e-7)
    close(metrics.min_pairwise_distance(x * c) / c, metrics.min_pairwise_distance(x), rtol=1e-9)
    close(metrics.project_to_sphere(x * c), metrics.project_to_sphere(x), rtol=1e-12)


def test_huge_vectors_match_the_reference():
    w, x, mask, _ = causal_attention(2, layers=1, heads=2, L=10, d=4)
    selected, _ = metrics.top_n_mask(w, 3, mask)
    got = metrics.cumulative_distance(w, x * 1e200, selected, mask)
    vis = mask.expand(w.shape).numpy()
    for index, head in each_row(w.shape):
        sel = np.flatnonzero(selected[index].numpy()).tolist()
        want = ref.cumulative_distance(w[index].numpy(), x[head].numpy(), sel, vis[index], "sum_of_norms")
        close(got[index] / 1e200, want, rtol=1e-9)


# --- empty input -----------------------------------------------------------------------------------------


ZERO_KEYS = torch.empty(2, 3, 0, dtype=torch.float64)


@pytest.mark.parametrize("call, name", [
    (lambda: metrics.max_weight(ZERO_KEYS), "weights"),
    (lambda: metrics.entropy(ZERO_KEYS), "weights"),
    (lambda: metrics.top_n_mask(ZERO_KEYS, 1), "weights"),
    (lambda: metrics.context_vector(ZERO_KEYS, torch.empty(2, 0, 4), ZERO_KEYS > 0), "weights"),
    (lambda: metrics.cumulative_distance(ZERO_KEYS, torch.empty(2, 0, 4), ZERO_KEYS > 0), "weights"),
    (lambda: metrics.separability(ZERO_KEYS, torch.empty(2, 0, 4), 1), "weights"),
    (lambda: metrics.expected_distance_mc(ZERO_KEYS, torch.empty(2, 0, 4), 1), "weights"),
    (lambda: metrics.finite_difference_gradient(ZERO_KEYS, 1.0, 0.1), "logits"),
    (lambda: metrics.random_directions(ZERO_KEYS > 0), "mask"),
])
def test_zero_keys_are_refused(call, name):
    with pytest.raises(ValueError, match=f"{name} must have at least one key"):
        call()


@pytest.mark.parametrize("lead", [(0,), (0, 3), (2, 0)])
def test_zero_rows_give_empty_results(lead):
    """No rows (R = 0, or an empty batch dim) is a legitimate batch: every per-row result is empty."""
    w = torch.full((*lead, 5), 0.2, dtype=torch.float64)
    x = torch.randn(*lead[:-1], 5, 2, dtype=torch.float64)
    selected, valid = metrics.top_n_mask(w, 2)
    assert selected.shape == w.shape and valid.shape == lead
    outs = [metrics.max_weight(w), metrics.entropy(w), metrics.cumulative_distance(w, x, selected),
            metrics.cumulative_distance(w, x, selected, reading="norm_of_sum"), *metrics.separability(w, x, 2),
            metrics.expected_distance_mc(w, x, 2, n_samples=2), metrics.finite_difference_gradient(w, 1.0, 0.1),
            metrics.finite_difference_gradient(w, 1.0, 0.1, w > 0)]
    assert all(o.shape == lead for o in outs), [o.shape for o in outs]
    assert metrics.context_vector(w, x, selected).shape == (*lead, 2)
    assert metrics.random_directions(w > 0).shape == w.shape
    assert metrics.min_pairwise_distance(torch.empty(*lead, 5, 2)).shape == lead


@pytest.mark.parametrize("call", [
    lambda m: metrics.finite_difference_gradient(torch.zeros(m.shape, dtype=torch.float64), 1.0, 0.1, m),
    lambda m: metrics.random_directions(m),
])
def test_fully_masked_row_is_refused(call):
    """A row without a visible key has no softmax and no unit direction (it used to give NaN)."""
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[1, 2] = False
    with pytest.raises(ValueError, match=r"mask must leave at least one visible key in every row; row \(1, 2\)"):
        call(mask)
    mask[1, 2, 3] = True  # one visible key: g = 0 (softmax is constant), v = +-e_3
    assert call(mask)[1, 2].abs().max() in (0.0, 1.0)


# --- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, name", [
    (lambda w, x, m: metrics.top_n_mask(w, 0, m), "N"),
    (lambda w, x, m: metrics.top_n_mask(w, L, m), "N"),
    (lambda w, x, m: metrics.separability(w, x, 1.5, m), "N"),
    (lambda w, x, m: metrics.separability(w, x, 2, m, M=0.0), "M"),
    (lambda w, x, m: metrics.expected_distance_mc(w, x, L, m), "N"),
    (lambda w, x, m: metrics.expected_distance_mc(w, x, 2, m, n_samples=0), "n_samples"),
    (lambda w, x, m: metrics.cumulative_distance(w, x[..., :-1, :], w > 0.5, m), "x"),
    (lambda w, x, m: metrics.cumulative_distance(w, x, w > 0.5, m, reading="max"), "reading"),
    (lambda w, x, m: metrics.cumulative_distance(w, x, torch.ones_like(w, dtype=torch.bool), m), "selected"),
    (lambda w, x, m: metrics.cumulative_distance(w, x[:1, :2], w > 0.5, m), "x"),
    (lambda w, x, m: metrics.context_vector(w, x, (w > 0.5).double()), "selected"),
    (lambda w, x, m: metrics.top_n_mask(w, 2, m.double()), "mask"),
    (lambda w, x, m: metrics.top_n_mask(w, 2, m[:5]), "mask"),
    (lambda w, x, m: metrics.top_n_mask(w * 2, 2, m), "weights"),
    (lambda w, x, m: metrics.top_n_mask(-w, 2, m), "weights"),
    (lambda w, x, m: metrics.top_n_mask(torch.where(w > 0.5, torch.nan, w), 2, m), "weights"),
    (lambda w, x, m: metrics.separability(w, x.clone().fill_(torch.nan), 2, m), "x"),
    (lambda w, x, m: metrics.finite_difference_gradient(w, 0.0, 0.1, m), "T"),
    (lambda w, x, m: metrics.finite_difference_gradient(w, -1.0, 0.1, m), "T"),
    (lambda w, x, m: metrics.finite_difference_gradient(w, 1.0, 0.0, m), "eps"),
    (lambda w, x, m: metrics.finite_difference_gradient(w.clone().fill_(torch.nan), 1.0, 0.1, m), "logits"),
    (lambda w, x, m: metrics.finite_difference_gradient(w[0, 0, 0], 1.0, 0.1), "logits"),
    (lambda w, x, m: metrics.project_to_sphere(x, M=-1.0), "M"),
    (lambda w, x, m: metrics.min_pairwise_distance(x[..., :1, :]), "x"),
])
def test_bad_input_names_the_parameter(data, call, name):
    w, x, mask, _ = data
    with pytest.raises(ValueError, match=name):
        call(w, x, mask)
