"""Tests of attn_utils.mathematics.beyond: loop references, autograd oracles, the chapter's propositions, bad input."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import reference as ref
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2_contingency

from attn_utils.mathematics import beyond, kernels, metrics, normalizers, registry

F64 = torch.float64
MANY = settings(max_examples=1000, deadline=None)
SOME = settings(max_examples=200, deadline=None)
NAMES = registry.COMPARED


def kwargs(name, T=1.0, s=1.0):
    return registry.get(name).keywords(T=T, s=s)


def close(a, b, rtol=1e-10, atol=1e-12):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rtol, atol=atol)


def random_rows(seed, shape=(5, 9), scale=2.0, masked=True):
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(shape, generator=g, dtype=F64)
    mask = torch.rand(shape, generator=g) < 0.7
    mask[..., 0] = True  # every row sees a key
    if not masked:
        mask[:] = True
    return logits, mask


def causal_heads(seed, layers=2, heads=3, L=20, d=6, name="softmax", scale=2.0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    logits = scale * torch.randn(layers, heads, L, L, generator=g, dtype=F64)
    x = torch.randn(layers, heads, L, d, generator=g, dtype=F64)
    return registry.normalize(logits, name, mask=mask), x, mask


# --- slow references ------------------------------------------------------------------------------------


def ref_row_stats(w, vis):
    keys = [i for i in range(len(w)) if vis[i]]
    mags = [abs(w[i]) for i in keys]
    return {"max": max(mags), "min": min(mags), "mass": sum(w[i] for i in keys),
            "support": sum(1 for i in keys if w[i] != 0), "length": len(keys)}


def ref_distances(w, x, s):
    return [np.linalg.norm(w[i] * x[i] - s) for i in range(len(w))]


def ref_separated(w, x, N, vis, M=1.0):
    """Selected and separated keys of one row (the strict count of metrics.separability)."""
    x = np.array([M * xi / np.linalg.norm(xi) for xi in x])
    sel = ref.top_n(w, vis, N)
    s = ref.context_vector(w, x, sel)
    dist = ref_distances(w, x, s)
    r = min(dist[i] for i in ref.outside(vis, sel))
    return sel, [i for i in sel if dist[i] < r]


def ref_coverage_row(sel_sets, sep_sets, N):
    """|U|, covered, and the expected number covered by brute-force enumeration of every shuffle."""
    union = sorted(set().union(*sel_sets))
    covered = len(set().union(*sep_sets))
    options = [list(itertools.combinations(sorted(s), len(t))) for s, t in zip(sel_sets, sep_sets)]
    total, count = 0.0, 0
    for choice in itertools.product(*options):
        total += len(set().union(*map(set, choice)))
        count += 1
    return len(union), covered, total / count


# --- Lemma 1 lens ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_row_stats_matches_loop(name):
    logits, mask = random_rows(1)
    w = registry.normalize(logits, name, mask=mask)
    got = beyond.row_stats(w, mask)
    for r in range(w.shape[0]):
        expected = ref_row_stats(w[r].numpy(), mask[r].numpy())
        for key, value in expected.items():
            close(got[key][r], value)


def test_row_stats_row_without_keys_is_nan():
    w = torch.tensor([[0.5, 0.5], [0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True], [False, False]])
    got = beyond.row_stats(w, mask)
    assert math.isnan(got["max"][1]) and math.isnan(got["min"][1]) and got["length"][1] == 0


@st.composite
def bounded_rows(draw):
    L = draw(st.integers(1, 300))
    a = draw(st.floats(0.0, 4.0))
    T = draw(st.floats(0.2, 5.0))
    s = draw(st.floats(0.1, 2.0))
    seed = draw(st.integers(0, 2**31 - 1))
    pattern = draw(st.sampled_from(["uniform", "one high", "one low", "signs"]))
    g = torch.Generator().manual_seed(seed)
    if pattern == "uniform":
        l = (2 * torch.rand(L, generator=g, dtype=F64) - 1) * a
    elif pattern == "signs":
        high = torch.full((L,), a, dtype=F64)
        l = torch.where(torch.rand(L, generator=g, dtype=F64) < 0.5, high, -high)
    else:
        l = torch.full((L,), -a if pattern == "one high" else a, dtype=F64)
        l[0] = -l[0]
    return l, a, T, s


@MANY
@given(bounded_rows(), st.sampled_from(NAMES))
def test_lemma1_envelope_holds(case, name):
    """Propositions 1-2 of the chapter: every weight magnitude lies in the envelope of its normalizer."""
    l, a, T, s = case
    w = registry.normalize(l.unsqueeze(0), name, **kwargs(name, T, s))[0].abs()
    env = beyond.lemma1_envelope(name, a, len(l), T=T, s=s)
    assert float(w.max()) <= env.upper * (1 + 1e-9) + 1e-300
    assert float(w.min()) >= env.lower * (1 - 1e-9)


@pytest.mark.parametrize("name", ["softmax", "softmax1", "self_adjust", "self_adjust_normalized"])
def test_length_independent_normalizers_vanish(name):
    """Their envelope upper bound is O(1/L): L * upper stays bounded."""
    uppers = [L * beyond.lemma1_envelope(name, 1.0, L).upper for L in (10**3, 10**5, 10**7)]
    assert max(uppers) <= math.e ** 2 * 1.0001 and uppers[-1] >= 0.5 * uppers[0]


def test_envelope_escapes():
    assert beyond.lemma1_envelope("ssmax", 1.0, 10**6, T=1.0, s=1.0).upper == 1.0  # 2sa/T = 2 >= 1
    assert beyond.lemma1_envelope("ssmax", 0.1, 10**6, T=1.0, s=1.0).upper < 1e-3  # 2sa/T < 1: still decays
    assert beyond.lemma1_envelope("sparsemax", 1.0, 10**6) == beyond.Envelope(0.0, 1.0)


@MANY
@given(st.sampled_from(["softmax", "ssmax", "sparsemax", "entmax15"]), st.integers(1, 400),
       st.floats(0.0, 5.0), st.floats(0.2, 3.0), st.floats(0.2, 2.0), st.integers(0, 2**31 - 1))
def test_planted_weight_bound_holds(name, L, gap, T, s, seed):
    g = torch.Generator().manual_seed(seed)
    l = -gap - 2 * torch.rand(L, generator=g, dtype=F64)  # every other logit at least `gap` below the planted one
    l[0] = 0.0
    w = registry.normalize(l.unsqueeze(0), name, **kwargs(name, T, s))[0]
    assert float(w[0]) >= beyond.planted_weight_bound(name, gap, L, T=T, s=s) * (1 - 1e-9)


def test_planted_weight_bound_limits():
    assert beyond.planted_weight_bound("softmax", 2.0, 10**6) < 1e-4
    assert beyond.planted_weight_bound("ssmax", 2.0, 10**6) > 0.999   # s gap / T = 2 > 1
    assert beyond.planted_weight_bound("ssmax", 0.5, 10**6) < 0.01    # s gap / T < 1
    assert beyond.planted_weight_bound("sparsemax", 1.0, 10**6) == 1.0
    assert beyond.planted_weight_bound("entmax15", 1.99, 10**6) == 1e-6
    assert beyond.planted_weight_bound("entmax15", 2.0, 10**6) == 1.0


# --- Theorem 1 and 2 lenses for rows that are not distributions -------------------------------------------


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "softmax1", "self_adjust_normalized"])
@pytest.mark.parametrize("N", [1, 3, 7])
def test_lens_distance_and_separability_match_loop(name, N):
    """d-tilde and N_s / N computed directly on the (not rescaled) weights, one row at a time."""
    w, x, mask = causal_heads(2, name=name)
    dist = beyond.lens_distance(w, x, N, mask)
    sep = beyond.lens_separability(w, x, N, mask, M=2.0)
    for index in np.ndindex(*w.shape[:-1]):
        row, vis, xs = w[index].numpy(), mask[index[-1]].numpy(), x[index[:-1]].numpy()
        if vis.sum() <= N or row.sum() == 0:
            assert math.isnan(dist[index]) and math.isnan(sep[index])
            continue
        sel = ref.top_n(row, vis, N)
        close(dist[index], ref.cumulative_distance(row, xs, sel, vis))
        close(sep[index], ref.separability(row, xs, N, vis, M=2.0)[0])


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "ssmax", "softmax1", "self_adjust_normalized"])
@pytest.mark.parametrize("N", [1, 4])
def test_geometry_fast_path_matches_library_route(name, N):
    """geometry() (one pass) against lens_distance / lens_separability (through attn_utils.mathematics.metrics)."""
    w, x, mask = causal_heads(11, name=name, L=24)
    g = beyond.geometry(w, x, N, mask, M=0.5)
    close(g.distance, beyond.lens_distance(w, x, N, mask))
    close(g.separability, beyond.lens_separability(w, x, N, mask, M=0.5))
    sphere = metrics.project_to_sphere(x, 0.5)
    again = beyond.geometry(w, x, N, mask, sphere=sphere)
    close(again.separability, g.separability)
    assert (again.separated == g.separated).all() and (g.separated <= g.selected).all()


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
def test_geometry_is_the_metric_on_distributions(name):
    """For distributions, geometry() gives exactly what metrics.cumulative_distance and metrics.separability give,
    and the separated keys it returns count N_s."""
    w, x, mask = causal_heads(17, name=name, L=30)
    result = beyond.geometry(w, x, [2, 5], mask)
    for N, g in result.items():
        selected, _ = metrics.top_n_mask(w, N, mask)
        distance = metrics.cumulative_distance(w, x, selected, mask)
        ratio, _ = metrics.separability(w, x, N, mask)
        assert torch.equal(g.selected, selected)
        close(g.distance, torch.where(g.valid, distance, torch.nan))
        close(g.separability, ratio, rtol=0, atol=0)
        close(torch.where(g.valid, g.separated.sum(-1).to(F64) / N, torch.nan), ratio, rtol=0, atol=0)
    quick = beyond.geometry(w, x, 5, mask, keys=False)
    assert quick.separated is None and torch.equal(quick.separability.isnan(), result[5].separability.isnan())


def test_geometry_refuses_signed_weights():
    logits, _ = random_rows(12)
    with pytest.raises(ValueError, match="signed weights"):
        beyond.geometry(normalizers.self_adjust(logits), torch.randn(9, 3, dtype=F64), 2)


@MANY
@given(st.integers(0, 2**31 - 1), st.floats(1e-3, 1e3), st.integers(1, 6))
def test_homogeneity(seed, c, N):
    """Proposition (homogeneity): d-tilde(c alpha) = c d-tilde(alpha); N_s / N does not change."""
    g = torch.Generator().manual_seed(seed)
    L = 8
    w = torch.softmax(2 * torch.randn(3, L, generator=g, dtype=F64), -1)
    x = torch.randn(L, 4, generator=g, dtype=F64)
    d1, d2 = beyond.lens_distance(w, x, N), beyond.lens_distance(c * w, x, N)
    close(d2, c * d1, rtol=1e-9)
    close(beyond.lens_separability(c * w, x, N), beyond.lens_separability(w, x, N))


def test_softmax1_geometry_is_softmax_scaled_by_mass():
    w, x, mask = causal_heads(3, name="softmax")
    g = torch.Generator().manual_seed(3)
    logits = 2 * torch.randn(w.shape, generator=g, dtype=F64)
    soft, one = normalizers.softmax(logits, mask=mask), normalizers.softmax1(logits, mask=mask)
    _, mass = beyond.geometry_weights(one)
    close(beyond.lens_distance(one, x, 4, mask), mass * beyond.lens_distance(soft, x, 4, mask), rtol=1e-9)
    close(beyond.lens_separability(one, x, 4, mask), beyond.lens_separability(soft, x, 4, mask))


def test_geometry_weights_zero_rows_and_signed_rows():
    w = torch.tensor([[0.2, 0.2, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    normed, mass = beyond.geometry_weights(w)
    close(normed[0], [0.5, 0.5, 0.0])
    close(mass, [0.4, 0.0])
    assert (normed[1] == 0).all()
    x = torch.randn(3, 2, dtype=F64)
    assert math.isnan(beyond.lens_distance(w, x, 1)[1]) and math.isnan(beyond.lens_separability(w, x, 1)[1])
    signed = normalizers.self_adjust(torch.tensor([[-1.0, 0.5, 2.0]], dtype=F64))
    with pytest.raises(ValueError, match="signed weights"):
        beyond.geometry_weights(signed)


# --- gradients -------------------------------------------------------------------------------------------


def autograd_jacobian(logits, name, mask, T, s):
    """The reference: autograd on the library normalizer, one row at a time."""
    out = torch.zeros(*logits.shape, logits.shape[-1], dtype=F64)
    for r in range(logits.shape[0]):
        out[r] = torch.autograd.functional.jacobian(
            lambda l: registry.normalize(l.unsqueeze(0), name, mask=mask[r:r + 1], **kwargs(name, T, s))[0],
            logits[r])
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jacobian_matches_autograd(name, seed):
    logits, mask = random_rows(seed, scale=[0.5, 2.0, 6.0][seed])
    T, s = [0.3, 1.0, 4.0][seed], 1.7
    J = beyond.jacobian(logits, name, mask=mask, T=T, s=s)
    close(J, autograd_jacobian(logits, name, mask, T, s), rtol=1e-10, atol=1e-12)
    assert (J[~mask.unsqueeze(-1).expand_as(J)] == 0).all() and (J[~mask.unsqueeze(-2).expand_as(J)] == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_jvp_is_jacobian_times_v_and_matches_finite_differences(name):
    logits, mask = random_rows(4, shape=(6, 11))
    g = torch.Generator().manual_seed(4)
    v = torch.randn(logits.shape, generator=g, dtype=F64)
    got = beyond.jvp(logits, v, name, mask=mask, T=0.8, s=1.3)
    J = beyond.jacobian(logits, name, mask=mask, T=0.8, s=1.3)
    close(got, (J @ torch.where(mask, v, 0.0).unsqueeze(-1)).squeeze(-1))
    h = 1e-6
    fd = (registry.normalize(logits + h * v, name, mask=mask, **kwargs(name, 0.8, 1.3))
          - registry.normalize(logits - h * v, name, mask=mask, **kwargs(name, 0.8, 1.3))) / (2 * h)
    close(got, fd, rtol=1e-5, atol=1e-6)


def spectral(J):
    return torch.linalg.matrix_norm(J, ord=2)


@MANY
@given(st.integers(2, 24), st.floats(0.01, 10.0), st.floats(0.1, 8.0), st.floats(0.2, 3.0), st.integers(0, 2**31 - 1),
       st.booleans())
def test_jacobian_norm_bounds(L, T, scale, s, seed, tie):
    """The chapter's gradient proposition: spectral norms of every closed-form Jacobian."""
    g = torch.Generator().manual_seed(seed)
    l = scale * torch.randn(1, L, generator=g, dtype=F64)
    if tie:
        l[0, 1] = l[0, 0] = l.max()
    tol = 1 + 1e-9
    for name in ("softmax", "softmax1"):
        assert float(spectral(beyond.jacobian(l, name, T=T))) <= tol / (2 * T)
    assert float(spectral(beyond.jacobian(l, "ssmax", T=T, s=s))) <= tol * s * math.log(L) / (2 * T)
    assert float(spectral(beyond.jacobian(l, "entmax15", T=T))) <= tol / T
    support = int((normalizers.sparsemax(l, T=T) > 0).sum())
    expected = 1 / T if support >= 2 else 0.0
    assert abs(float(spectral(beyond.jacobian(l, "sparsemax", T=T))) - expected) <= 1e-9 * (1 + expected)


def test_self_adjust_keeps_a_gradient_as_T_falls():
    """T * J -> e_k e_k^T for self-adjust softmax (k = the largest logit); the others vanish."""
    l = torch.tensor([[1.0, 0.3, -0.5, 0.9]], dtype=F64)
    for T in (2e-3, 1e-3):  # the gap to the second logit is 0.1 = 50 T or more
        J = beyond.jacobian(l, "self_adjust", T=T)
        target = torch.zeros(4, 4, dtype=F64)
        target[0, 0] = 1.0
        close(T * J[0], target, atol=1e-3)
        for name in ("softmax", "softmax1", "ssmax", "sparsemax", "entmax15", "self_adjust_normalized"):
            assert float(T * spectral(beyond.jacobian(l, name, T=T))) < 1e-3


# --- several heads ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("N", [1, 2, 5])
def test_separated_keys_match_loop_and_metrics(name, N):
    w, x, mask = causal_heads(5, name=name)
    selected, separated, valid = beyond.separated_keys(w, x, N, mask, M=1.5)
    ratio, _ = metrics.separability(w, x, N, mask, M=1.5)
    close(torch.where(valid, separated.sum(-1).to(F64) / N, torch.nan), ratio)
    for index in np.ndindex(*w.shape[:-1]):
        row, vis, xs = w[index].numpy(), mask[index[-1]].numpy(), x[index[:-1]].numpy()
        if vis.sum() <= N:
            assert not valid[index] and not separated[index].any()
            continue
        sel, sep = ref_separated(row, xs, N, vis, M=1.5)
        assert np.flatnonzero(selected[index].numpy()).tolist() == sel
        assert np.flatnonzero(separated[index].numpy()).tolist() == sep


def head_sets(seed, N, heads=3, L=12, layers=2):
    w, x, mask = causal_heads(seed, layers=layers, heads=heads, L=L, d=4)
    return beyond.separated_keys(w, x, N, mask)


@pytest.mark.parametrize("N", [2, 3])
def test_coverage_matches_brute_force(N):
    selected, separated, valid = head_sets(6, N)
    result = beyond.coverage(selected, separated, valid, N)
    H = selected.shape[-3]
    for layer in range(selected.shape[0]):
        for r in range(selected.shape[-2]):
            if not valid[layer, :, r].all():
                assert not result.valid[layer, r] and math.isnan(result.expected[layer, r])
                continue
            sel = [set(np.flatnonzero(selected[layer, h, r].numpy())) for h in range(H)]
            sep = [set(np.flatnonzero(separated[layer, h, r].numpy())) for h in range(H)]
            union, covered, expected = ref_coverage_row(sel, sep, N)
            assert result.union[layer, r] == union and result.covered[layer, r] == covered
            close(result.expected[layer, r], expected)
            p = np.mean([len(t) / N for t in sep])
            close(result.paper[layer, r], 1 - (1 - p) ** H)


def test_coverage_null_distribution():
    N = 3
    selected, separated, valid = head_sets(7, N, heads=4, L=16)
    result = beyond.coverage(selected, separated, valid, N, n_perm=4000, generator=torch.Generator().manual_seed(0))
    assert result.null.shape == (4000, selected.shape[0])
    expected = torch.where(result.valid, result.expected, 0.0).sum(-1)
    spread = result.null.std(0) / math.sqrt(4000)
    assert ((result.null.mean(0) - expected).abs() <= 5 * spread + 1e-9).all()
    # each draw keeps every head's count, so no total exceeds the union or falls below the largest head
    assert (result.null <= torch.where(result.valid, result.union, 0).sum(-1)).all()


def test_coverage_null_is_degenerate_when_nothing_can_move():
    """Heads that separate all or none of their keys: every permutation gives the observed coverage."""
    selected, _, valid = head_sets(8, 2)
    separated = selected.clone()
    separated[:, 1] = False
    result = beyond.coverage(selected, separated, valid, 2, n_perm=50, generator=torch.Generator().manual_seed(1))
    observed = torch.where(result.valid, result.covered, 0).sum(-1).to(F64)
    assert (result.null == observed).all()
    close(torch.where(result.valid, result.expected, 0.0).sum(-1), observed)


def test_head_association_matches_contingency_tables():
    selected, separated, valid = head_sets(9, 4, heads=3, L=20)
    got = beyond.head_association(selected, separated, valid)
    ok = valid.all(-2)
    for layer in range(selected.shape[0]):
        for h, k in itertools.product(range(3), repeat=2):
            table = np.zeros((2, 2))
            for r in range(selected.shape[-2]):
                if not ok[layer, r]:
                    continue
                for i in range(selected.shape[-1]):
                    if selected[layer, h, r, i] and selected[layer, k, r, i]:
                        table[int(not separated[layer, h, r, i]), int(not separated[layer, k, r, i])] += 1
            assert got["n"][layer, h, k] == table.sum()
            if (table.sum(0) > 0).all() and (table.sum(1) > 0).all():
                a, b, c, d = table.ravel()
                close(got["phi"][layer, h, k], (a * d - b * c) / math.sqrt(table.sum(0).prod() * table.sum(1).prod()))
                statistic, pvalue, _, _ = chi2_contingency(table, correction=False)
                close(got["chi2"][layer, h, k], statistic, rtol=1e-8)
                close(got["pvalue"][layer, h, k], pvalue, rtol=1e-6, atol=1e-300)
            else:
                assert math.isnan(got["phi"][layer, h, k])


def test_association_counts_add_up_over_blocks():
    selected, separated, valid = head_sets(13, 3, heads=3, L=20)
    whole = beyond.head_association(selected, separated, valid)
    parts = [beyond.head_association(selected[..., rows, :], separated[..., rows, :], valid[..., rows])
             for rows in (slice(0, 9), slice(9, 20))]
    summed = beyond.association_from_counts(*(sum(p[k] for p in parts) for k in ("n11", "n10", "n01", "n00")))
    for key in ("n", "phi", "pvalue"):
        close(summed[key], whole[key])


# --- synthetic instances -------------------------------------------------------------------------------------


def test_synthetic_rows_families():
    g = torch.Generator().manual_seed(0)
    typical = beyond.synthetic_rows("typical", 50, 40, 2.0, generator=g)
    assert typical.shape == (50, 40) and typical.dtype == F64 and typical.abs().max() <= 2.0
    assert typical.min() < -1.5 and typical.max() > 1.5
    planted = beyond.synthetic_rows("planted", 50, 40, 2.0, 1.5, generator=g)
    assert (planted[:, 0] == 2.0).all() and (planted[:, 1:] <= 0.5).all() and (planted[:, 1:] >= -2.0).all()
    assert (planted[:, :1] - planted[:, 1:] >= 1.5).all()  # the gap of planted_weight_bound
    again = beyond.synthetic_rows("typical", 50, 40, 2.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again, typical)  # one torch.rand draw from the generator
    with pytest.raises(ValueError, match="family must be one of"):
        beyond.synthetic_rows("flat", 2, 3, 1.0)
    with pytest.raises(ValueError, match="gap <= 2a"):
        beyond.synthetic_rows("planted", 2, 3, 1.0, 3.0)


def test_unit_vectors_lie_on_the_sphere():
    x = beyond.unit_vectors((3, 7), 5, torch.Generator().manual_seed(1))
    assert x.shape == (3, 7, 5)
    close(x.norm(dim=-1), torch.ones(3, 7))


# --- bad input ---------------------------------------------------------------------------------------------


def test_bad_input():
    l = torch.randn(2, 4, dtype=F64)
    with pytest.raises(ValueError, match="unknown normalizer 'softmax2'"):
        beyond.jacobian(l, "softmax2")
    with pytest.raises(ValueError, match="T must be"):
        beyond.jvp(l, l, "softmax", T=0.0)
    with pytest.raises(ValueError, match="v of shape"):
        beyond.jvp(l, torch.randn(3), "softmax")
    with pytest.raises(ValueError, match="mask must be a boolean"):
        beyond.row_stats(l.softmax(-1), mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="a must be"):
        beyond.lemma1_envelope("softmax", -1.0, 4)
    with pytest.raises(ValueError, match="L must be"):
        beyond.lemma1_envelope("softmax", 1.0, 0)
    with pytest.raises(ValueError, match="normalizer 'softmax1' has no planted-key guarantee"):
        beyond.planted_weight_bound("softmax1", 1.0, 4)
    with pytest.raises(ValueError, match="N must be"):
        beyond.lens_distance(l.softmax(-1), torch.randn(4, 3, dtype=F64), 4)
    sel, sep, valid = head_sets(10, 2)
    with pytest.raises(ValueError, match="inside selected"):
        beyond.coverage(sel, sep | ~sel, valid, 2)
    with pytest.raises(ValueError, match="exactly N"):
        beyond.coverage(sel, sep, valid, 3)
    with pytest.raises(ValueError, match="valid of shape"):
        beyond.coverage(sel, sep, torch.ones(5, dtype=torch.bool), 2)
    with pytest.raises(ValueError, match="x must be"):
        beyond.separated_keys(l.softmax(-1), torch.randn(5, 3, dtype=F64), 1)


def test_geometry_in_small_row_blocks_is_the_same(monkeypatch):
    """Blocks of a few rows cut the keys at each block's last visible key; the top-N keys of a row that sees at
    most N keys then reach beyond its block (they are clamped, the row is invalid): the same numbers."""
    w, x, mask = causal_heads(23, name="sparsemax", L=30)
    whole = beyond.geometry(w, x, [1, 4, 9], mask)
    monkeypatch.setattr(kernels, "BLOCK_ELEMENTS", 2 * w.shape[0] * w.shape[1] * 30)
    assert len(list(kernels.row_blocks(mask.expand(w.shape)))) > 5
    for N, g in beyond.geometry(w, x, [1, 4, 9], mask).items():
        close(g.distance, whole[N].distance, rtol=1e-13, atol=0)
        close(g.separability, whole[N].separability, rtol=0, atol=0)
        assert torch.equal(g.separated, whole[N].separated) and torch.equal(g.valid, whole[N].valid)
