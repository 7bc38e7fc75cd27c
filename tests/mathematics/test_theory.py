"""Tests of attn_utils.mathematics.theory: every proven bound on 1000 hypothesis cases, the vectorised functions
against plain per-row loops, the Jacobians against autograd, the documented counterexamples, bad input."""
from __future__ import annotations

import contextlib
import itertools
import math
import signal

import numpy as np
import pytest
import reference as ref
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils.mathematics import kernels
from attn_utils.mathematics import theory as th

MANY = settings(max_examples=1000, deadline=None)
F64 = torch.float64
LOGIT_KINDS = ["gauss", "tied", "dominant", "uniform", "sharp"]
X_KINDS = ["gauss", "duplicates", "same", "tiny", "huge"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The cases are tiny: one intra-op thread avoids thread start-up and contention costs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- plain generators and per-row reference loops (numpy) ------------------------------------------


def make_logits(rng, kind, shape, scale=1.0):
    """Logits of one of the adversarial kinds: ties, one dominant key, all equal, or very sharp."""
    if kind == "gauss":
        return rng.normal(size=shape) * scale
    if kind == "tied":
        return rng.integers(0, 3, size=shape).astype(float) * scale
    if kind == "dominant":
        l = rng.normal(size=shape)
        np.put_along_axis(l, rng.integers(0, shape[-1], size=(*shape[:-1], 1)), 60.0, axis=-1)
        return l
    if kind == "uniform":
        return np.zeros(shape)
    return rng.normal(size=shape) / 1e-3  # "sharp": softmax at T = 1e-3


def make_x(rng, kind, L, d):
    if kind == "duplicates":
        return rng.normal(size=(3, d))[rng.integers(0, 3, size=L)]
    if kind == "same":
        return np.repeat(rng.normal(size=(1, d)), L, axis=0)
    return rng.normal(size=(L, d)) * {"gauss": 1.0, "tiny": 1e-3, "huge": 1e3}[kind]


def make_mask(rng, kind, R, L):
    if kind == "none":
        return None
    if kind == "causal":  # row r sees keys 0..max(L - R, 0) + r (the last rows of a causal matrix)
        return np.arange(L)[None, :] <= np.minimum(max(L - R, 0) + np.arange(R), L - 1)[:, None]
    mask = rng.random((R, L)) < 0.6
    mask[np.arange(R), rng.integers(0, L, size=R)] = True
    return mask


def masked_softmax(logits, mask):
    if mask is not None:
        logits = np.where(mask, logits, -np.inf)
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def top_n(w, mask, N):
    """Top-min(N, L_r) set of each row's visible weights (ties broken by index)."""
    vis = np.ones_like(w, bool) if mask is None else mask
    order = np.argsort(-np.where(vis, w, -1.0), axis=-1, kind="stable")
    sel = np.zeros_like(w, bool)
    for idx in np.ndindex(w.shape[:-1]):
        k = min(N, int(vis[idx].sum()))
        sel[idx][order[idx][:k]] = True
    return sel


def t(a):
    return torch.as_tensor(a, dtype=F64)


def dtilde(w, x, sel, vis, reading):
    """The measured distance of one row, both readings, by a plain loop."""
    s = sum(w[j] * x[j] for j in range(len(w)) if sel[j])
    terms = [w[i] * x[i] - s for i in range(len(w)) if vis[i] and not sel[i]]
    if not terms:
        return 0.0
    if reading == "sum":
        return sum(np.linalg.norm(v) for v in terms)
    return np.linalg.norm(sum(terms))


def loop_exact_expectation(w, x, N):
    L, values = len(w), []
    for I in itertools.combinations(range(L), N):
        sel = np.isin(np.arange(L), I)
        values.append(dtilde(w, x, sel, np.ones(L, bool), "sum"))
    return np.mean(values)


def loop_xi(w, sel, M, delta):
    xi = np.zeros_like(w)
    I = [j for j in range(len(w)) if sel[j]]
    for i in I:
        rest = [j for j in I if j != i]
        sq = M**2 * sum(w[j] ** 2 for j in rest)
        sq += (M**2 - delta**2 / 2) * sum(w[j] * w[k] for j in rest for k in rest if j != k)
        xi[i] = math.sqrt(max(sq, 0.0))
    return xi


def separability(w, x, sel):
    """(N_s / N, r, X_i) of one row, with r = min over unselected ||s - alpha_j x_j||."""
    s = sum(w[j] * x[j] for j in range(len(w)) if sel[j])
    X = np.array([np.linalg.norm(s - w[i] * x[i]) for i in range(len(w)) if sel[i]])
    r = min(np.linalg.norm(s - w[j] * x[j]) for j in range(len(w)) if not sel[j])
    return float((X <= r).mean()), r, X


@st.composite
def rows_case(draw, max_L=12):
    """(weights (R, L), x (L, d), mask or None, N) drawn from adversarial families."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    L = draw(st.integers(2, max_L))
    N = {"1": 1, "L-1": L - 1, "any": int(rng.integers(1, L))}[draw(st.sampled_from(["1", "L-1", "any"]))]
    R = int(rng.integers(1, 7))
    mask = make_mask(rng, draw(st.sampled_from(["none", "none", "causal", "random"])), R, L)
    logits = make_logits(rng, draw(st.sampled_from(LOGIT_KINDS)), (R, L), rng.choice([0.1, 1.0, 5.0]))
    x = make_x(rng, draw(st.sampled_from(X_KINDS)), L, int(rng.integers(1, 5)))
    return masked_softmax(logits, mask), x, mask, N


# --- Lemma 1 and Corollary 1 --------------------------------------------------------------------------


NORMALIZERS = [
    (lambda l, T: torch.exp(l / T), lambda l, T: torch.exp(l / T) / T, "T"),
    (lambda l: 1 + l**2, lambda l: 2 * l, None),
    # softplus without its linear cut-over above 20 (threshold): there autograd would take 1 for sigmoid(l)
    (lambda l: torch.nn.functional.softplus(l, threshold=1000.0) + 0.1, lambda l: torch.sigmoid(l), None),
    (lambda l: 2 + torch.sin(3 * l), lambda l: 3 * torch.cos(3 * l), None),
]


@MANY
@given(st.integers(0, 3), st.floats(0.01, 20), st.integers(1, 12), st.floats(0.05, 5), st.integers(0, 2**32 - 1))
def test_lemma1_bounds_hold(which, a, L, T, seed):
    F, _, uses_theta = NORMALIZERS[which]
    theta = T if uses_theta else None
    rng = np.random.default_rng(seed)
    l = torch.tensor(np.clip(rng.uniform(-a, a, L) * rng.choice([1, 2], L), -a, a), dtype=F64)
    Fl = F(l) if theta is None else F(l, theta)
    alpha = Fl / Fl.sum()
    lower, upper = th.lemma1_bounds(F, a, L, theta)  # e^{2a/T} may overflow to inf (then lower = 0)
    assert (alpha >= lower * (1 - 1e-10)).all() and (alpha <= upper * (1 + 1e-10)).all()
    assert lower <= 1 / L <= upper


def test_lemma1_constants_exact_cases():
    assert math.isclose(th.lemma1_constants(lambda l, T: torch.exp(l / T), 2.0, 0.5).C2, math.exp(8), rel_tol=1e-12)
    C = th.lemma1_constants(lambda l: 2 + torch.sin(3 * l), 3.0)  # interior extrema 1 and 3
    assert math.isclose(C.m_F, 1, rel_tol=1e-12) and math.isclose(C.M_F, 3, rel_tol=1e-12)


@MANY
@given(rows_case(), st.sampled_from([1e-3, 0.1, 1.0, 8.0]), st.integers(0, 2**32 - 1))
def test_corollary1_bounds_hold(case, T, seed):
    _, k, mask, _ = case
    R = 1 if mask is None else mask.shape[0]
    q = np.random.default_rng(seed).normal(size=(R, k.shape[1])) * 0.3
    alpha = masked_softmax(q @ k.T / T, mask)
    lower, upper = th.corollary1_bounds(t(q), t(k), T, None if mask is None else torch.as_tensor(mask))
    vis = np.ones_like(alpha, bool) if mask is None else mask
    assert np.all(~vis | (alpha >= lower.numpy()[:, None] * (1 - 1e-12)))
    assert np.all(~vis | (alpha <= upper.numpy()[:, None] * (1 + 1e-12)))


# --- Theorem 1, fixed set -------------------------------------------------------------------------------


def scale_of(x):
    return 1e-7 * (1 + np.linalg.norm(x, axis=-1).max())


@MANY
@given(rows_case())
def test_theorem1_fixed_bound_holds_for_both_readings(case):
    w, x, mask, N = case
    sel = top_n(w, mask, N)
    bound = th.theorem1_fixed_bound(t(w), t(x), torch.as_tensor(sel), None if mask is None else torch.as_tensor(mask))
    vis = np.ones_like(w, bool) if mask is None else mask
    for r in range(w.shape[0]):
        for reading in ("sum", "norm_of_sum"):
            assert dtilde(w[r], x, sel[r], vis[r], reading) <= bound[r].item() + scale_of(x)


@MANY
@given(st.integers(0, 2**32 - 1), st.integers(3, 10), st.sampled_from(X_KINDS))
def test_theorem1_fixed_bound_needs_only_abar_dominance(seed, L, x_kind):
    """Any set I with sum_I alpha >= every unselected alpha, not only a top-N set."""
    rng = np.random.default_rng(seed)
    w = masked_softmax(rng.normal(size=(1, L)) * 2, None)
    x = make_x(rng, x_kind, L, 3)
    order = rng.permutation(L)
    sel = np.zeros((1, L), bool)
    for j in order:  # grow a random set until its mass dominates every outside weight
        sel[0, j] = True
        if w[0][sel[0]].sum() >= w[0][~sel[0]].max(initial=0):
            break
    if sel.all():
        return
    bound = th.theorem1_fixed_bound(t(w), t(x), torch.as_tensor(sel)).item()
    assert dtilde(w[0], x, sel[0], np.ones(L, bool), "sum") <= bound + scale_of(x)


@MANY
@given(rows_case(max_L=40), st.sampled_from([1, 2, 3, 32]))
def test_theorem1_fixed_bound_reads_d1_off_the_farthest_lists(case, m):
    """d_1 from farthest_keys' lists (short lists force the direct fallback often) equals the loop's."""
    w, x, mask, N = case
    sel = top_n(w, mask, N)
    far = th.farthest_keys(t(x), m)
    got = th.theorem1_fixed_bound(t(w), t(x), torch.as_tensor(sel), None if mask is None else torch.as_tensor(mask),
                                  farthest=far)
    vis = np.ones_like(w, bool) if mask is None else mask
    for r in range(w.shape[0]):
        want = ref.fixed_bound(w[r], x, np.flatnonzero(sel[r]), vis[r])
        assert abs(got[r].item() - want) <= 1e-10 * (1 + abs(want)) + scale_of(x), (r, got[r].item(), want)


def test_farthest_keys_lists():
    """Each list holds the m farthest keys of the prefix, largest first; levels double up to L."""
    x = torch.randn(2, 37, 3, dtype=F64)
    far = th.farthest_keys(x, 4)
    assert far.levels == (4, 8, 16, 32, 37)
    d2 = torch.cdist(x, x) ** 2
    for K, v, i in zip(far.levels, far.sq_distances, far.indices):
        assert v.shape == i.shape == (2, K, 4)
        want = d2[:, :K, :K].sort(-1, descending=True).values[..., :4]
        torch.testing.assert_close(v, want, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(d2[:, :K, :K].gather(-1, i), v, rtol=1e-10, atol=1e-10)
    both = th.farthest_keys(x, 4, prefixes=[10, 32])
    assert both.levels == (4, 8, 10, 16, 32, 37)
    head = both.prefix(10)
    assert head.levels == (4, 8, 10)
    torch.testing.assert_close(head.sq_distances[-1], th.farthest_keys(x[:, :10], 4).sq_distances[-1])
    with pytest.raises(ValueError, match="L must be one of the levels"):
        both.prefix(12)


def test_theorem1_fixed_bound_fails_without_dominance():
    """alpha = (0.1, 0.9), I = {0}, x_0 = x_1: d~ = 0.8 but the formula gives -0.8; the function refuses."""
    w, x, sel = np.array([0.1, 0.9]), np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([True, False])
    assert math.isclose(dtilde(w, x, sel, np.ones(2, bool), "sum"), 0.8)
    assert math.isclose(ref.fixed_bound(w, x, np.flatnonzero(sel), np.ones(2, bool)), -0.8)
    with pytest.raises(ValueError, match="selected"):
        th.theorem1_fixed_bound(t(w[None]), t(x), torch.as_tensor(sel[None]))


# --- Theorem 1, random set; Corollary 2 ---------------------------------------------------------------


@MANY
@given(rows_case(max_L=8))
def test_main_sum_below_exact_expectation(case):
    w, x, _, N = case
    row = t(masked_softmax(np.log(w[0] + 1e-300), None))
    E = th.theorem1_random_main_sum(row[None], t(x), N)[0]
    exact = th.theorem1_random_expectation_exact(row, t(x), N)
    eps = th.jensen_residual(exact, E)
    assert eps >= -scale_of(x)  # E's near-zero terms carry the Gram expansion's ~sqrt(machine eps) error
    if N == len(row) - 1:  # one excluded key: s_I is determined, Jensen is an equality
        assert abs(eps) <= scale_of(x)


@pytest.mark.parametrize("seed, monotone", [(0, True), (1, False)])
def test_exact_expectation_matches_loop_and_residual_shape(seed, monotone):
    """The residual vanishes at N = L - 1; on the way it may fall steadily (seed 0) or first rise (seed 1)."""
    rng = np.random.default_rng(seed)
    L = 8
    w, x = masked_softmax(rng.normal(size=L) * 1.5, None), rng.normal(size=(L, 3))
    residuals = []
    for N in range(1, L):
        exact = th.theorem1_random_expectation_exact(t(w), t(x), N).item()
        assert math.isclose(exact, loop_exact_expectation(w, x, N), rel_tol=1e-12)
        residuals.append(exact - th.theorem1_random_main_sum(t(w[None]), t(x), N).item())
    assert min(residuals) >= 0 and abs(residuals[-1]) < 1e-12
    assert (max(np.diff(residuals)) <= 0) == monotone


def test_main_sum_is_not_a_lower_bound_for_the_norm_of_sum_reading():
    rng = np.random.default_rng(0)
    exceed = 0
    for _ in range(60):
        L = int(rng.integers(3, 8))
        N = int(rng.integers(1, L))
        w, x = masked_softmax(rng.normal(size=L) * 2, None), rng.normal(size=(L, 2))
        values = [dtilde(w, x, np.isin(np.arange(L), I), np.ones(L, bool), "norm_of_sum")
                  for I in itertools.combinations(range(L), N)]
        exceed += th.theorem1_random_main_sum(t(w[None]), t(x), N).item() > np.mean(values) + 1e-9
    assert exceed > 0


@MANY
@given(rows_case())
def test_corollary2_certificates(case):
    w, x, mask, N = case
    tm = None if mask is None else torch.as_tensor(mask)
    E = th.theorem1_random_main_sum(t(w), t(x), N, tm)
    A = th.corollary2_small_n_limit(t(w), t(x), tm)
    gap, cap = th.corollary2_bounds(t(w), t(x), N, tm)
    tol = scale_of(x) * 10
    assert ((E - A).abs() <= gap + tol).all() and (E <= cap + tol).all()


def test_corollary2_limits_precisely():
    # Zero attention output (antipodal pairs, equal weights): E = A (1 - N(N-1)/(L(L-1))) -> A.
    for L, N in [(8, 1), (8, 3), (64, 5), (512, 5)]:
        x = np.concatenate([np.eye(2)[[0]].repeat(L // 2, 0), -np.eye(2)[[0]].repeat(L // 2, 0)])
        w = np.full((1, L), 1 / L)
        E = th.theorem1_random_main_sum(t(w), t(x), N).item()
        A = th.corollary2_small_n_limit(t(w), t(x)).item()
        assert math.isclose(E, A * (1 - N * (N - 1) / (L * (L - 1))), rel_tol=1e-10)
    # Equal embeddings: E = 0 at N = 1 for every L while A = 1, so E -> A fails; E(L - 1) = (L - 2) / L.
    for L in (8, 64, 512):
        x, w = np.ones((L, 1)), np.full((1, L), 1 / L)
        assert abs(th.theorem1_random_main_sum(t(w), t(x), 1).item()) < 1e-6
        assert math.isclose(th.corollary2_small_n_limit(t(w), t(x)).item(), 1.0)
        assert math.isclose(th.theorem1_random_main_sum(t(w), t(x), L - 1).item(), (L - 2) / L, rel_tol=1e-9)


# --- vectorised functions against plain loops ---------------------------------------------------------


@pytest.fixture(params=["none", "causal", "random"])
def batch_case(request):
    rng = np.random.default_rng(abs(hash(request.param)) % 2**32)
    B, R, L, d = (2, 3), 7, 9, 4
    mask = make_mask(rng, request.param, R, L)
    w = masked_softmax(rng.normal(size=(*B, R, L)) * 2, mask)
    x = rng.normal(size=(*B, L, d))
    return w, x, mask


def rows_of(w, mask):
    vis = np.ones(w.shape, bool) if mask is None else np.broadcast_to(mask, w.shape)
    return list(np.ndindex(w.shape[:-1])), vis


def test_loops_theorem1_and_corollary2(batch_case, monkeypatch):
    w, x, mask = batch_case
    tm = None if mask is None else torch.as_tensor(mask)
    N = 3
    sel = top_n(w, np.broadcast_to(mask, w.shape) if mask is not None else None, N)
    idx, vis = rows_of(w, mask)
    results = {}
    for chunk in (kernels.CHUNK_ELEMENTS, 1):  # also one row per chunk
        monkeypatch.setattr(kernels, "CHUNK_ELEMENTS", chunk)
        results[chunk] = (
            th.theorem1_fixed_bound(t(w), t(x), torch.as_tensor(sel), tm),
            th.theorem1_random_main_sum(t(w), t(x), N, tm),
            th.corollary2_small_n_limit(t(w), t(x), tm),
            *th.corollary2_bounds(t(w), t(x), N, tm),
        )
    for a, b in zip(*results.values()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    fixed, E, A, gap, cap = results[1]
    for i in idx:
        xb, wr, vr = x[i[:-1]], w[i], vis[i]
        assert abs(fixed[i].item() - ref.fixed_bound(wr, xb, np.flatnonzero(sel[i]), vr)) < 1e-10
        assert abs(E[i].item() - ref.main_sum(wr, xb, N, vr)) < 1e-10
        assert abs(A[i].item() - sum(wr[j] * np.linalg.norm(xb[j]) for j in range(len(wr)) if vr[j])) < 1e-10
        keys = np.flatnonzero(vr)
        L_r, n_r = len(keys), min(N, len(keys))
        if L_r > N:
            m = sum(wr[j] * xb[j] for j in keys)
            U = sum(np.linalg.norm(m - wr[j] * xb[j]) for j in keys)
            c = N / (L_r - 1)
            assert abs(gap[i].item() - (n_r / L_r * A[i].item() + (L_r - N) / L_r * c * U)) < 1e-10
            assert abs(cap[i].item() - (L_r - N) / L_r * ((1 + c) * A[i].item() + c * L_r * np.linalg.norm(m))) < 1e-10


def test_loops_corollary1(batch_case):
    w, k, mask = batch_case
    q = np.random.default_rng(5).normal(size=(*w.shape[:-1], k.shape[-1]))
    lower, upper = th.corollary1_bounds(t(q), t(k), 2.0, None if mask is None else torch.as_tensor(mask))
    idx, vis = rows_of(w, mask)
    for i in idx:
        delta = np.linalg.norm(q[i]) * max(np.linalg.norm(k[i[:-1]][j]) for j in range(w.shape[-1]) if vis[i][j])
        L_r = vis[i].sum()
        assert math.isclose(lower[i].item(), math.exp(-delta) / L_r, rel_tol=1e-12)
        assert math.isclose(upper[i].item(), math.exp(delta) / L_r, rel_tol=1e-12)


def test_loops_theorem2(batch_case):
    w, _, _ = batch_case
    w = masked_softmax(np.log(w + 1e-300), None)
    sel = top_n(w, None, 4)
    M, delta = 1.5, 0.7
    r = np.random.default_rng(1).uniform(0.05, 1, size=w.shape[:-1])
    xi = th.theorem2_xi(t(w), torch.as_tensor(sel), M, delta)
    lower, upper = th.theorem2_bounds(t(w), torch.as_tensor(sel), t(r), M, delta)
    for i in np.ndindex(w.shape[:-1]):
        ref = loop_xi(w[i], sel[i], M, delta)
        np.testing.assert_allclose(xi[i].numpy(), ref, rtol=0, atol=1e-12)
        chosen = ref[sel[i]]
        assert abs(lower[i].item() - (1 - chosen.sum() / (len(chosen) * r[i]))) < 1e-10
        up = np.mean(np.exp(-np.maximum(chosen - r[i], 0) ** 2 / (2 * M**2)))
        assert abs(upper[i].item() - up) < 1e-12
    # one delta per head (a tensor broadcast over the rows) equals per-head calls with a number
    deltas = np.random.default_rng(2).uniform(0, 2 * M, size=(*w.shape[:-2], 1))
    lower_t, upper_t = th.theorem2_bounds(t(w), torch.as_tensor(sel), t(r), M, t(deltas))
    xi_t = th.theorem2_xi(t(w), torch.as_tensor(sel), M, t(deltas))
    for h in np.ndindex(w.shape[:-2]):
        lo_h, up_h = th.theorem2_bounds(t(w[h]), torch.as_tensor(sel[h]), t(r[h]), M, float(deltas[h][0]))
        torch.testing.assert_close(lower_t[h], lo_h, rtol=0, atol=1e-12)
        torch.testing.assert_close(upper_t[h], up_h, rtol=0, atol=1e-12)
        torch.testing.assert_close(xi_t[h], th.theorem2_xi(t(w[h]), torch.as_tensor(sel[h]), M, float(deltas[h][0])))


def test_dtype_and_broadcasting():
    rng = np.random.default_rng(3)
    w = torch.tensor(masked_softmax(rng.normal(size=(4, 5, 6)), None), dtype=torch.float32)
    x = torch.tensor(rng.normal(size=(6, 2)), dtype=torch.float32)  # shared by the batch
    assert th.theorem1_random_main_sum(w, x, 2).dtype == torch.float32
    assert th.theorem1_random_main_sum(w, x, 2).shape == (4, 5)
    causal = torch.ones(5, 6, dtype=torch.bool).tril(1)
    w = torch.softmax(torch.randn(4, 5, 6).masked_fill(~causal, -math.inf), -1)
    assert th.corollary2_small_n_limit(w, x, causal).shape == (4, 5)


def x_side_results(w, x, sel, mask, N, farthest=None):
    """Every theory function that takes key vectors x; all are homogeneous of degree 1 in x."""
    return (th.theorem1_fixed_bound(w, x, sel, mask, farthest=farthest), th.theorem1_random_main_sum(w, x, N, mask),
            th.corollary2_small_n_limit(w, x, mask), *th.corollary2_bounds(w, x, N, mask))


@settings(max_examples=200, deadline=None)
@given(rows_case(), st.sampled_from([-1000, -600, -40, 3, 600, 1000]))
def test_x_side_bounds_are_homogeneous_exactly(case, k):
    """f(2^k x) = 2^k f(x) bit for bit, also where the squares of 2^k x leave the float range (|x| ~ 1e180,
    1e300), with and without the caller's farthest lists of the scaled x."""
    w, x, mask, N = case
    N = min(N, w.shape[-1] - 1)
    tw, tm, sel = t(w), None if mask is None else torch.as_tensor(mask), torch.as_tensor(top_n(w, mask, N))
    c = 2.0**k
    if (np.abs(x).max() * c) >= np.finfo(float).max or np.abs(x[x != 0]).min(initial=1) * c < np.finfo(float).tiny:
        return  # 2^k x itself would overflow or lose bits
    want = x_side_results(tw, t(x), sel, tm, N)
    got = x_side_results(tw, t(x) * c, sel, tm, N)
    for a, b in zip(want, got):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a * c, rtol=0, atol=0)
    # short lists (m = 2) take the direct fallback for some rows: compare with the same lists of x
    want = th.theorem1_fixed_bound(tw, t(x), sel, tm, farthest=th.farthest_keys(t(x), 2))
    got = th.theorem1_fixed_bound(tw, t(x) * c, sel, tm, farthest=th.farthest_keys(t(x) * c, 2))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want * c, rtol=0, atol=0)


@settings(max_examples=200, deadline=None)
@given(rows_case(), st.sampled_from([1e-150, 3.7, 1e200, 1.5e300]))
def test_x_side_bounds_of_huge_x_are_finite_and_scale(case, c):
    """|x| near 1e200 used to give NaN (overflowing squares in the Gram matrices); now f(c x) = c f(x)
    up to the rounding of c x (Gram form: absolute error ~ sqrt(eps) times the scale, see ``scale_of``)."""
    w, x, mask, N = case
    N = min(N, w.shape[-1] - 1)
    tw, tm, sel = t(w), None if mask is None else torch.as_tensor(mask), torch.as_tensor(top_n(w, mask, N))
    for a, b in zip(x_side_results(tw, t(x), sel, tm, N), x_side_results(tw, t(x * c), sel, tm, N)):
        assert torch.isfinite(b).all()
        np.testing.assert_allclose(b.numpy() / c, a.numpy(), rtol=1e-9, atol=scale_of(x))


def test_farthest_keys_of_huge_x():
    """The lists are ranked on the scaled x: the indices of 2^600 x are those of x, and the squared
    distances (~1e361) beyond the float range are inf, not NaN."""
    x = torch.randn(2, 20, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    far, huge = th.farthest_keys(x, 4), th.farthest_keys(x * 2.0**600, 4)
    for a, b, i, j in zip(far.sq_distances, huge.sq_distances, far.indices, huge.indices):
        assert torch.equal(i, j) and torch.equal(b, a * 2.0**600 * 2.0**600)  # inf, or 0 for a key itself
        assert torch.isinf(b[a > 0]).all()


def test_theorem1_fixed_bound_recomputes_lists_that_overflowed():
    """farthest built on float32 x of size 1e30 holds inf squared distances (float32 range); the bound in
    float64 (promoted by the weights) ignores them and stays equal to the one computed without lists."""
    rng = np.random.default_rng(4)
    w, x = masked_softmax(rng.normal(size=(5, 12)), None), torch.tensor(rng.normal(size=(12, 3)) * 1e30,
                                                                        dtype=torch.float32)
    sel = torch.as_tensor(top_n(w, None, 3))
    far = th.farthest_keys(x, 4)
    assert torch.isinf(far.sq_distances[-1]).any()
    got = th.theorem1_fixed_bound(t(w), x, sel, farthest=far)
    assert got.dtype == F64 and torch.isfinite(got).all()
    torch.testing.assert_close(got, th.theorem1_fixed_bound(t(w), x, sel), rtol=0, atol=0)


EMPTY_KEYS = [  # zero keys (L = 0): refused, naming the parameter
    (lambda: th.corollary1_bounds(X, X[:0], 1.0), "k"),
    (lambda: th.farthest_keys(X[:0]), "x"),
    (lambda: th.farthest_keys(torch.empty(2, 0, 3, dtype=F64)), "x"),
    (lambda: th.theorem1_fixed_bound(W[:, :0], X[:0], SEL[:, :0]), "weights"),
    (lambda: th.theorem1_random_main_sum(W[:, :0], X[:0], 1), "weights"),
    (lambda: th.corollary2_small_n_limit(W[:, :0], X[:0]), "weights"),
    (lambda: th.corollary2_bounds(W[:, :0], X[:0], 1), "weights"),
    (lambda: th.theorem2_xi(W[:, :0], SEL[:, :0], 1.0, 0.1), "weights"),
    (lambda: th.theorem2_bounds(W[:, :0], SEL[:, :0], 0.5, 1.0, 0.1), "weights"),
    (lambda: th.softmax_jacobian(W[:, :0], 1.0), "weights"),
]


@pytest.mark.parametrize("call, name", EMPTY_KEYS)
def test_zero_keys_are_refused(call, name):
    with pytest.raises(ValueError, match=f"{name} must have at least one key"):
        call()


@pytest.mark.parametrize("rows", [(0,), (0, 2), (3, 0)])
def test_zero_rows_give_empty_results(rows):
    """A batch without rows (R = 0 or an empty batch dim) is legitimate: every result is empty."""
    w, sel = W.expand(*rows, 3), SEL.expand(*rows, 3)
    x = X.expand(*rows[:-1], 3, 2)
    for out in (*x_side_results(w, x, sel, None, 1), *x_side_results(w, x, sel, sel | True, 1),
                *th.theorem2_bounds(w, sel, 0.5, 1.0, 0.1), *th.corollary1_bounds(x[..., :0, :], x, 1.0)):
        assert out.shape == rows[:-1] + (0,) or out.shape == rows, out.shape
        assert out.numel() == 0
    assert th.theorem2_xi(w, sel, 1.0, 0.1).shape == (*rows, 3)
    far = th.farthest_keys(X.expand(0, 3, 2))
    assert far.batch == (0,) and all(v.shape[0] == 0 for v in far.sq_distances)


def test_fully_masked_row_is_named():
    mask = torch.tensor([[True, True, True], [False, False, False]])
    w = t([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]])
    with pytest.raises(ValueError, match=r"mask must leave at least one visible key in every row; row \(1,\)"):
        th.theorem1_random_main_sum(w, X, 1, mask)
    with pytest.raises(ValueError, match=r"mask .* row \(1,\)"):
        th.corollary1_bounds(X[:2], X, 1.0, mask)


# --- Theorem 2 ------------------------------------------------------------------------------------------


@MANY
@given(st.integers(0, 2**32 - 1), st.integers(3, 12), st.sampled_from([2, 3, 8]), st.sampled_from(LOGIT_KINDS),
       st.sampled_from([0.5, 1.0, 3.0]), st.sampled_from([1.0, 0.5, 0.0]))
def test_theorem2_lower_bound_and_xi_dominate(seed, L, d, kind, M, shrink):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(L, d))
    x = M * x / np.linalg.norm(x, axis=1, keepdims=True)
    delta = shrink * float(torch.pdist(t(x)).min())  # any lower bound on the separation is allowed
    w = masked_softmax(make_logits(rng, kind, (1, L), 1.0), None)
    N = int(rng.integers(1, L))
    sel = top_n(w, None, N)
    frac, r, X = separability(w[0], x, sel[0])
    xi = th.theorem2_xi(t(w), torch.as_tensor(sel), M, delta)[0].numpy()[sel[0]]
    assert np.all(X <= xi + 1e-12 * M)
    if r > 1e-12:
        lower, _ = th.theorem2_bounds(t(w), torch.as_tensor(sel), r, M, delta)
        assert lower.item() <= frac + 1e-12


def test_theorem2_upper_bound_counterexample():
    w, x, N, M, delta = th.theorem2_upper_counterexample()
    assert torch.allclose(x.norm(dim=-1), torch.full((x.shape[0],), M, dtype=F64))  # Assumption 1 (sphere)
    assert torch.pdist(x).min().item() >= delta - 1e-15  # Assumption 2
    sel = top_n(w.numpy(), None, N)
    assert w[0, sel[0]].min() > w[0, ~sel[0]].max()  # a strict top-N set
    frac, r, X = separability(w[0].numpy(), x.numpy(), sel[0])
    lower, upper = th.theorem2_bounds(w, torch.as_tensor(sel), r, M, delta)
    assert frac == 1.0 and X.max() < 0.8 * r
    assert upper.item() < 0.70 and frac > upper.item() + 0.3
    assert lower.item() <= frac


def test_theorem2_upper_bound_fails_on_uniform_sphere_data():
    """Not only constructed cases: i.i.d. uniform unit vectors (d = 64) also exceed it row by row."""
    rng = np.random.default_rng(0)
    violations = 0
    for _ in range(40):
        x = rng.normal(size=(16, 64))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        w = masked_softmax(rng.normal(size=(1, 16)), None)
        sel = top_n(w, None, 4)
        frac, r, _ = separability(w[0], x, sel[0])
        _, upper = th.theorem2_bounds(t(w), torch.as_tensor(sel), r, 1.0, float(torch.pdist(t(x)).min()))
        violations += frac > upper.item() + 1e-12
    assert violations >= 5


# --- Lemma 2 and Corollary 3 ------------------------------------------------------------------------------


@MANY
@given(st.integers(0, 3), st.integers(1, 12), st.sampled_from(LOGIT_KINDS), st.floats(0.05, 5),
       st.integers(0, 2**32 - 1))
def test_lemma2_bound_and_jacobian(which, L, kind, T, seed):
    F, dF, uses_theta = NORMALIZERS[which]
    theta = T if uses_theta else None
    l = t(np.clip(make_logits(np.random.default_rng(seed), kind, (L,)), -30 * T, 30 * T))
    J = th.general_jacobian(F, dF, l, theta)
    assert torch.linalg.matrix_norm(J, ord=2) <= th.lemma2_bound(F, dF, l, theta) * (1 + 1e-12)
    if seed % 10 == 0:  # autograd on a tenth of the cases (it is slow)
        def alpha(v):
            Fv = F(v) if theta is None else F(v, theta)
            return Fv / Fv.sum()

        ref = torch.autograd.functional.jacobian(alpha, l)
        torch.testing.assert_close(J, ref, rtol=1e-10, atol=1e-12 * (1 + ref.abs().max().item()))


def test_general_jacobian_batched_matches_loop():
    F, dF, _ = NORMALIZERS[2]
    l = torch.randn(3, 4, 6, dtype=F64, generator=torch.Generator().manual_seed(0))
    J, bound = th.general_jacobian(F, dF, l), th.lemma2_bound(F, dF, l)
    for i in np.ndindex(3, 4):
        Fv, dFv = F(l[i]).numpy(), dF(l[i]).numpy()
        S, a = Fv.sum(), Fv / Fv.sum()
        ref = np.array([[dFv[k] / S * ((i_ == k) - a[i_]) for k in range(6)] for i_ in range(6)])
        np.testing.assert_allclose(J[i].numpy(), ref, rtol=0, atol=1e-12)
        b = (np.abs(dFv).max() + np.linalg.norm(a) * np.linalg.norm(dFv)) / (6 * Fv.min())
        assert math.isclose(bound[i].item(), b, rel_tol=1e-12)


@MANY
@given(st.integers(1, 12), st.sampled_from(LOGIT_KINDS), st.sampled_from([1e-3, 0.05, 0.3, 1.0, 10.0]),
       st.sampled_from([1e-3, 0.1, 10.0]), st.integers(0, 2**32 - 1))
def test_softmax_jacobian_corrected_bounds(L, kind, T, eps, seed):
    rng = np.random.default_rng(seed)
    l = t(make_logits(rng, kind, (L,)) * T)  # logits on the scale of T, so that ties matter
    alpha = torch.softmax(l / T, -1)
    J = th.softmax_jacobian(alpha, T)
    assert torch.linalg.matrix_norm(J, ord=2) <= th.softmax_jacobian_norm_bound(T) * (1 + 1e-12)
    assert J.abs().max() <= 1 / (4 * T) * (1 + 1e-12)  # the sense in which 1/(4T) holds: every entry
    v = t(rng.normal(size=L))
    v /= v.norm()
    g = (torch.softmax((l + eps * v) / T, -1) - alpha).norm() / eps
    assert g <= th.finite_difference_bound(T, eps) * (1 + 1e-9)


@pytest.mark.parametrize("T", [1e-3, 0.1, 1.0, 7.0])
def test_softmax_jacobian_matches_autograd(T):
    l = torch.tensor([0.3, -1.2, 0.3, 2.0, 0.0], dtype=F64) * T
    ref = torch.autograd.functional.jacobian(lambda v: torch.softmax(v / T, -1), l)
    torch.testing.assert_close(th.softmax_jacobian(torch.softmax(l / T, -1), T), ref, rtol=1e-12, atol=1e-12 / T)
    batch = torch.softmax(torch.randn(2, 3, 4, dtype=F64), -1)
    J = th.softmax_jacobian(batch, T)
    for i in np.ndindex(2, 3):
        a = batch[i].numpy()
        np.testing.assert_allclose(J[i].numpy(), (np.diag(a) - np.outer(a, a)) / T, rtol=0, atol=1e-12 / T)


@pytest.mark.parametrize("T", [1e-3, 0.1, 0.3, 1 / (2 * math.sqrt(2)) * 0.99, 1.0, 10.0])
def test_corollary3_counterexample(T):
    ce = th.corollary3_counterexample(T)
    assert math.isclose(ce.spectral_norm, 1 / (2 * T), rel_tol=1e-12)
    assert ce.spectral_norm > 1 / (4 * T) * 1.99 and ce.spectral_norm > ce.stated_bound
    assert ce.stated_bound == th.corollary3_bound(T) == min(1 / (4 * T), math.sqrt(2))
    if T < 1 / (2 * math.sqrt(2)):
        assert ce.spectral_norm > math.sqrt(2)
    assert math.isclose(ce.corrected_bound, ce.spectral_norm, rel_tol=1e-12)  # the corrected bound is tight
    assert math.isclose(ce.jacobian.diagonal().max().item(), 1 / (4 * T), rel_tol=1e-12)  # the entry bound is attained


def test_tied_top_logits_approach_the_corrected_bound():
    for T in (1.0, 0.1, 0.01):
        l = torch.tensor([1.0, 1.0, 0.0, -0.5], dtype=F64)
        norm = torch.linalg.matrix_norm(th.softmax_jacobian(torch.softmax(l / T, -1), T), ord=2).item()
        assert 1 / (4 * T) < norm <= 1 / (2 * T) * (1 + 1e-12)
    assert norm * 2 * T > 1 - 1e-12


# --- the two-logit example --------------------------------------------------------------------------------


@MANY
@given(st.floats(-5, 5), st.floats(1e-4, 0.5), st.sampled_from([1e-2, 0.1, 1.0, 3.0]),
       st.lists(st.floats(-20, -6), max_size=5))
def test_two_logit_example_first_order(c, eps, T, rest):
    l1, l2 = th.two_logit_example(c, eps, rest)
    diff = l1 - l2
    assert math.isclose(diff.norm().item(), math.sqrt(5) * eps, rel_tol=1e-9)
    assert l1[0] > l1[1] and l2[1] > l2[0] and (l1[2:] < l1[:2].min()).all() and (l2[2:] < l2[:2].min()).all()
    a1, a2 = torch.softmax(l1 / T, -1), torch.softmax(l2 / T, -1)
    pred = th.softmax_jacobian(a2, T) @ diff
    assert (a1 - a2 - pred).norm() <= 5 * eps**2 / (2 * T**2) * (1 + 1e-9) + 1e-15
    assert (a1 - a2).norm() <= math.sqrt(5) * eps / (2 * T) * (1 + 1e-9)


def test_two_logit_example_prediction_is_order_eps_over_T():
    T = 0.1
    ratios = []
    for eps in (1e-2, 1e-3, 1e-4):
        l1, l2 = th.two_logit_example(3.0, eps, [0.0, -1.0])
        a1, a2 = torch.softmax(l1 / T, -1), torch.softmax(l2 / T, -1)
        pred = (th.softmax_jacobian(a2, T) @ (l1 - l2)).norm()
        assert abs((a1 - a2).norm() / pred - 1) < 10 * eps / T
        ratios.append(pred.item() / (eps / T))
    assert max(ratios) / min(ratios) < 1.1  # ~ 3 sqrt(2) / 4 (eps / T) near the tie


# --- multi-head coverage ---------------------------------------------------------------------------------


def test_multihead_coverage_paper_numbers():
    assert math.isclose(th.multihead_coverage(0.8, 3), 0.992)
    assert th.heads_for_coverage(0.8, 0.99) == 3
    assert th.heads_for_coverage(1.0, 0.999) == 1 and th.heads_for_coverage(0.5, 0.0) == 1


@MANY
@given(st.floats(1e-3, 1.0), st.floats(0.0, 0.999999))
def test_heads_for_coverage_is_minimal(p, target):
    H = th.heads_for_coverage(p, target)
    assert th.multihead_coverage(p, H) >= target
    assert H == 1 or th.multihead_coverage(p, H - 1) < target


@contextlib.contextmanager
def time_limit(seconds):
    """Fail (TimeoutError) instead of hanging when the body runs longer than ``seconds``."""
    def stop(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@settings(max_examples=300, deadline=None)
@given(st.floats(0.01, 1.0), st.floats(0.0, 0.9999))
def test_heads_for_coverage_matches_a_slow_loop(p, target):
    H = 1
    while th.multihead_coverage(p, H) < target:  # at most ~920 steps for p >= 0.01
        H += 1
    assert th.heads_for_coverage(p, target) == H


@pytest.mark.parametrize("p", [1e-13, 3e-14, 1e-15, 6e-16])
@pytest.mark.parametrize("target", [1e-6, 0.5, 0.99])
def test_heads_for_coverage_tiny_p_is_closed_form(p, target):
    """p <= 1e-13 used to loop for ever (1 - p rounds, the float loop walked ~1e10 steps)."""
    with time_limit(5):
        H = th.heads_for_coverage(p, target)
    assert isinstance(H, int)
    assert math.isclose(H, math.log1p(-target) / math.log1p(-p), rel_tol=1e-12, abs_tol=1)
    assert th.multihead_coverage(p, H) >= target > th.multihead_coverage(p, H - 1)


def test_multihead_coverage_is_accurate_for_tiny_p():
    """1 - (1 - p)^H lost ~3 digits at p = 1e-13 (1 - p rounds); -expm1(H log1p(-p)) does not."""
    assert math.isclose(th.multihead_coverage(1e-13, 10**13), -math.expm1(-1.0 - 0.5e-13), rel_tol=1e-14)
    assert th.multihead_coverage(1e-300, 1) == 1e-300
    assert th.multihead_coverage(1.0, 5) == 1.0 and th.multihead_coverage(0.0, 5) == 0.0


@pytest.mark.parametrize("p, target", [(1e-17, 0.5), (1e-300, 0.99), (5e-324, 0.99), (1e-16, 0.999)])
def test_heads_for_coverage_refuses_astronomical_answers(p, target):
    """More than MAX_HEADS = 2^53 heads (no longer exact as a float count): ValueError naming p and target."""
    with time_limit(5), pytest.raises(ValueError, match=r"p = .* too small for target = .*MAX_HEADS"):
        th.heads_for_coverage(p, target)
    assert th.heads_for_coverage(1e-15, 0.5) <= th.MAX_HEADS


# --- bad input ------------------------------------------------------------------------------------------


W = t([[0.5, 0.3, 0.2]])
X = t([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
SEL = torch.tensor([[True, False, False]])
EXP = NORMALIZERS[0]


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: th.lemma1_constants(EXP[0], 0.0, 1.0), "a"),
        (lambda: th.lemma1_constants(lambda l: l, 1.0), "F"),
        (lambda: th.lemma1_bounds(EXP[0], 1.0, 0, 1.0), "L"),
        (lambda: th.corollary1_bounds(X, X, 0.0), "T"),
        (lambda: th.corollary1_bounds(X, X, -1.0), "T"),
        (lambda: th.corollary1_bounds(X, X[:, :1], 1.0), "q"),
        (lambda: th.corollary1_bounds(X, X, 1.0, torch.ones(2, 2, dtype=torch.bool)), "mask"),
        (lambda: th.corollary1_bounds(X * math.nan, X, 1.0), "q"),
        (lambda: th.theorem1_fixed_bound(W * math.nan, X, SEL), "weights"),
        (lambda: th.theorem1_fixed_bound(W * 2, X, SEL), "weights"),
        (lambda: th.theorem1_fixed_bound(W, X[:2], SEL), "x"),
        (lambda: th.theorem1_fixed_bound(W, X * math.nan, SEL), "x"),
        (lambda: th.theorem1_fixed_bound(W, X, SEL & False), "selected"),
        (lambda: th.theorem1_fixed_bound(W, X, SEL.long()), "selected"),
        (lambda: th.theorem1_fixed_bound(W, X, ~SEL, torch.tensor([[True, True, False]])), "selected"),
        (lambda: th.theorem1_fixed_bound(W, X, SEL, torch.zeros(1, 3, dtype=torch.bool)), "mask"),
        (lambda: th.theorem1_fixed_bound(W, X, SEL, farthest=th.farthest_keys(X[:2])), "farthest"),
        (lambda: th.theorem1_fixed_bound(W, X, SEL, farthest=th.farthest_keys(torch.stack([X] * 2))), "farthest"),
        (lambda: th.farthest_keys(X, 0), "m"),
        (lambda: th.farthest_keys(X, 2, prefixes=[4]), "prefixes"),
        (lambda: th.farthest_keys(X * math.nan), "x"),
        (lambda: th.theorem1_random_main_sum(W, X, 0), "N"),
        (lambda: th.theorem1_random_main_sum(W, X, 3), "N"),
        (lambda: th.theorem1_random_main_sum(W, X, 1.5), "N"),
        (lambda: th.theorem1_random_expectation_exact(torch.full((17,), 1 / 17, dtype=F64), torch.ones(17, 2), 2), "L"),
        (lambda: th.theorem1_random_expectation_exact(W[0], X, 3), "N"),
        (lambda: th.theorem1_random_expectation_exact(W[0] * 2, X, 1), "weights_row"),
        (lambda: th.jensen_residual(t([1.0, 2.0]), t([1.0])), "main_sum"),
        (lambda: th.corollary2_bounds(W, X, 0), "N"),
        (lambda: th.corollary2_small_n_limit(W[0], X), "weights"),
        (lambda: th.theorem2_xi(W, SEL, 0.0, 0.1), "M"),
        (lambda: th.theorem2_xi(W, SEL, 1.0, -0.1), "delta"),
        (lambda: th.theorem2_xi(W, SEL, 1.0, 2.5), "delta"),
        (lambda: th.theorem2_xi(W, SEL, 1.0, t([0.1, 0.2])), "delta"),
        (lambda: th.theorem2_xi(W, SEL, 1.0, True), "delta"),
        (lambda: th.theorem2_xi(W * 3, SEL, 1.0, 0.5), "weights"),
        (lambda: th.theorem2_bounds(W, SEL, 0.0, 1.0, 0.5), "r"),
        (lambda: th.theorem2_bounds(W, SEL, t([0.1, 0.2]), 1.0, 0.5), "r"),
        (lambda: th.general_jacobian(lambda l: -torch.ones_like(l), lambda l: l, X[0]), "F"),
        (lambda: th.general_jacobian(EXP[0], EXP[1], X[0] * math.nan, 1.0), "logits"),
        (lambda: th.lemma2_bound("not callable", EXP[1], X[0]), "F"),
        (lambda: th.softmax_jacobian(W, 0.0), "T"),
        (lambda: th.softmax_jacobian(W * 2, 1.0), "weights"),
        (lambda: th.corollary3_bound(0.0), "T"),
        (lambda: th.softmax_jacobian_norm_bound(-2.0), "T"),
        (lambda: th.finite_difference_bound(1.0, 0.0), "eps"),
        (lambda: th.corollary3_counterexample(math.inf), "T"),
        (lambda: th.two_logit_example(1.0, 0.0), "eps"),
        (lambda: th.two_logit_example(math.nan, 0.1), "c"),
        (lambda: th.two_logit_example(1.0, 0.1, [0.95]), "rest"),
        (lambda: th.multihead_coverage(1.5, 2), "p"),
        (lambda: th.multihead_coverage(0.5, 0), "H"),
        (lambda: th.heads_for_coverage(0.0, 0.5), "p"),
        (lambda: th.heads_for_coverage(0.8, 1.2), "target"),
        (lambda: th.heads_for_coverage(0.8, 1.0), "target"),
        (lambda: th.heads_for_coverage(0.8, -0.1), "target"),
        (lambda: th.heads_for_coverage(0.8, math.nan), "target"),
        (lambda: th.heads_for_coverage(math.nan, 0.5), "p"),
        (lambda: th.heads_for_coverage(-1e-3, 0.5), "p"),
        (lambda: th.heads_for_coverage(1.5, 0.5), "p"),
        (lambda: th.heads_for_coverage(True, 0.5), "p"),
    ],
)
def test_bad_input_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()
