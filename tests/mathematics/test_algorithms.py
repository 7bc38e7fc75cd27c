"""Tests of attn_utils.mathematics.algorithms (Algorithms 1-5) against the loop reference, and their conventions."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import reference as ref
import torch
from scipy.stats import ks_2samp
from helpers import HEADS, LAYERS, L, causal_attention, close

from attn_utils.mathematics import algorithms, kernels, metrics, theory

LENGTHS = (8, 16, L)


@pytest.fixture(scope="module")
def data():
    return causal_attention(11)


def same(got: pd.DataFrame, want: pd.DataFrame, columns, rtol=1e-10, atol=1e-12):
    keys = [c for c in ("L", "N", "T", "eps", "layer", "head") if c in want.columns]
    got = got.sort_values(keys, ignore_index=True)
    want = want.sort_values(keys, ignore_index=True)
    assert len(got) == len(want)
    for key in keys:
        np.testing.assert_array_equal(got[key].to_numpy(), want[key].to_numpy())
    for column in columns:
        np.testing.assert_allclose(got[column].to_numpy(), want[column].to_numpy(), rtol=rtol, atol=atol,
                                   err_msg=column)


def test_distance_vs_length_matches_reference(data):
    w, x, _, _ = data
    got = algorithms.distance_vs_length(w, x, N=3, lengths=LENGTHS, progress=False)
    assert list(got.columns) == ["layer", "head", "L", "N", "distance", "expectation", "bound"]
    assert len(got) == len(LENGTHS) * LAYERS * HEADS
    same(got, ref.distance_table(w, x, [(n, 3) for n in LENGTHS]), ["distance", "expectation", "bound"])
    assert (got["distance"] <= got["bound"]).all()


@pytest.mark.parametrize("reading, Ns", [("sum_of_norms", (1, 5, 10, 20)), ("norm_of_sum", (5,))])
def test_distance_vs_n_matches_reference(data, reading, Ns):
    w, x, _, _ = data
    got = algorithms.distance_vs_n(w, x, Ns=Ns, reading=reading, progress=False)
    same(got, ref.distance_table(w, x, [(L, n) for n in Ns], reading), ["distance", "expectation", "bound"])


def test_prefix_block_equals_a_shorter_input(data):
    """For a causal model, the leading L x L block is the attention of the L-token prefix."""
    w, x, _, _ = data
    long = algorithms.distance_vs_length(w, x, N=2, lengths=(16,), progress=False)
    short = algorithms.distance_vs_n(w[:, :, :16, :16], x[:, :, :16], Ns=(2,), progress=False)
    same(long, short, ["distance", "expectation", "bound"], rtol=0, atol=0)


def test_critical_n_matches_scipy_and_reference(data):
    w, x, _, _ = data
    Ns = (1, 2, 4, 8, 16)
    result = algorithms.critical_n(w, x, LENGTHS, Ns, alpha=0.01, progress=False)
    want_tests, want_summary = ref.critical_n(w, x, LENGTHS, Ns, 0.01)
    same(result.tests, want_tests, ["statistic", "pvalue"])
    assert result.summary["critical_n"].tolist() == want_summary["critical_n"].tolist()
    # one test recomputed with a direct scipy call on the per-head means of Algorithm 1
    means = algorithms.distance_vs_length(w, x, N=4, lengths=(16,), progress=False)
    direct = ks_2samp(means["distance"], means["expectation"])
    row = result.tests[(result.tests["L"] == 16) & (result.tests["N"] == 4)].iloc[0]
    assert row["statistic"] == direct.statistic and row["pvalue"] == direct.pvalue
    assert (result.tests["N"] < result.tests["L"]).all()  # N >= L is skipped


def test_critical_n_decision_rule(data):
    w, x, _, _ = data
    Ns = (2, 4, 8)
    # with 6 heads a KS p-value is never below 0.0021, so alpha = 0.001 never rejects ...
    accept = algorithms.critical_n(w, x, LENGTHS, Ns, alpha=0.001, progress=False).summary
    assert accept["critical_n"].tolist() == [2, 2, 2]
    np.testing.assert_allclose(accept["critical_fraction"], [2 / n for n in LENGTHS])
    # ... and alpha = 0.999 rejects whenever the samples differ at all
    reject = algorithms.critical_n(w, x, LENGTHS, Ns, alpha=0.999, progress=False)
    assert (reject.summary["critical_n"] == -1).all() and reject.summary["critical_fraction"].isna().all()
    assert reject.tests["reject"].all()


def test_separability_vs_n_matches_reference(data):
    w, x, _, _ = data
    Ns = (1, 2, 5, 12)
    got = algorithms.separability_vs_n(w, x, Ns=Ns, M=1.5, progress=False)
    assert list(got.columns) == ["layer", "head", "L", "N", "separability", "lower", "upper", "delta"]
    same(got, ref.separability_table(w, x, Ns, M=1.5), ["separability", "lower", "upper", "delta"])
    assert got["separability"].between(0, 1).all() and (got["lower"] <= got["separability"] + 1e-12).all()


def test_separability_vs_n_on_a_prefix(data):
    w, x, _, _ = data
    got = algorithms.separability_vs_n(w[:, :, :16, :16], x[:, :, :16], Ns=(3,), progress=False)
    same(got, ref.separability_table(w, x, (3,), L=16), ["separability", "lower", "upper", "delta"])


def test_gradient_sensitivity_matches_reference(data):
    _, _, mask, logits = data
    Ts, epsilons = (1e-2, 0.3, 5.0), (1e-3, 1e-1, 10.0)
    got = algorithms.gradient_sensitivity(logits, Ts, epsilons, seed=4, progress=False)
    generator = torch.Generator().manual_seed(4)  # the experiment draws one layer after another
    v = torch.stack([metrics.random_directions(mask.expand(HEADS, L, L), generator) for _ in range(LAYERS)])
    want = ref.gradient_table(logits, v, Ts, epsilons)
    same(got.heads, want, ["g"], atol=1e-11)
    summary = got.summary
    assert len(summary) == len(Ts) * len(epsilons)
    maxima = want.groupby(["T", "eps"], as_index=False)["g"].max()
    np.testing.assert_allclose(summary["g"], maxima["g"], rtol=1e-10, atol=1e-11)
    assert summary["corollary3_bound"].tolist() == [theory.corollary3_bound(T) for T in summary["T"]]
    bound = [theory.finite_difference_bound(T, e) for T, e in zip(summary["T"], summary["eps"])]
    assert summary["finite_difference_bound"].tolist() == bound
    assert (summary["g"] <= summary["finite_difference_bound"]).all()


def test_gradient_sensitivity_is_reproducible(data):
    logits = data[3]
    a = algorithms.gradient_sensitivity(logits, (0.5,), (0.1,), seed=1, progress=False)
    b = algorithms.gradient_sensitivity(logits, (0.5,), (0.1,), seed=1, progress=False)
    pd.testing.assert_frame_equal(a.heads, b.heads)


def test_float32_storage_and_explicit_mask(data):
    w, x, mask, _ = data
    base = algorithms.distance_vs_n(w, x, Ns=(3,), progress=False)
    stored = algorithms.distance_vs_n(w.float(), x.float(), Ns=(3,), mask=mask, progress=False)
    same(stored, base, ["distance", "expectation", "bound"], rtol=1e-5)
    full = algorithms.distance_vs_n(w, x, Ns=(3,), mask=mask.expand(w.shape), progress=False)
    same(full, base, ["distance", "expectation", "bound"], rtol=0, atol=0)


@pytest.mark.parametrize("call, name", [
    (lambda w, x, l: algorithms.distance_vs_length(w, x, N=8, lengths=LENGTHS), "N"),
    (lambda w, x, l: algorithms.distance_vs_length(w, x, N=2, lengths=(8, 2 * L)), "lengths"),
    (lambda w, x, l: algorithms.distance_vs_n(w, x, Ns=(1, L)), "N"),
    (lambda w, x, l: algorithms.distance_vs_n(w, x, Ns=(0,)), "N"),
    (lambda w, x, l: algorithms.distance_vs_n(w[..., :1, :1], x[..., :1, :], Ns=(1,)), "N"),
    (lambda w, x, l: algorithms.distance_vs_n(w, x, Ns=(2,), reading="mean"), "reading"),
    (lambda w, x, l: algorithms.distance_vs_n(w[0], x, Ns=(2,)), "weights"),
    (lambda w, x, l: algorithms.distance_vs_n(w, x[:, :1], Ns=(2,)), "x"),
    (lambda w, x, l: algorithms.distance_vs_n(w, x, Ns=(2,), mask=torch.ones(3, 3, dtype=torch.bool)), "mask"),
    (lambda w, x, l: algorithms.distance_vs_n(w * 1.5, x, Ns=(2,)), "weights"),
    (lambda w, x, l: algorithms.distance_vs_n(w, x.clone().fill_(torch.nan), Ns=(2,)), "x"),
    (lambda w, x, l: algorithms.critical_n(w, x, LENGTHS, (2,), alpha=0.0), "alpha"),
    (lambda w, x, l: algorithms.critical_n(w, x, LENGTHS, (2,), alpha=1.0), "alpha"),
    (lambda w, x, l: algorithms.critical_n(w, x, (8,), (8, 16)), "Ns"),
    (lambda w, x, l: algorithms.separability_vs_n(w, x, Ns=(2,), M=0), "M"),
    (lambda w, x, l: algorithms.gradient_sensitivity(l, (0.0,)), "T"),
    (lambda w, x, l: algorithms.gradient_sensitivity(l, (1.0,), (-1.0,)), "eps"),
    (lambda w, x, l: algorithms.gradient_sensitivity(l, (1.0,), seed=-1), "seed"),
    (lambda w, x, l: algorithms.gradient_sensitivity(l.clone().fill_(torch.nan), (1.0,)), "logits"),
])
def test_bad_input_names_the_parameter(data, call, name):
    w, x, _, logits = data
    with pytest.raises(ValueError, match=name):
        call(w, x, logits)


# --- sampled rows -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 2, 7, 64, 1000, 4096])
@pytest.mark.parametrize("per_octave", [None, 1, 3, 8])
def test_sample_rows(length, per_octave):
    rows, weight = algorithms.sample_rows(length, per_octave)
    assert rows[0] == 0 and (np.diff(rows) > 0).all() and rows[-1] < length
    assert abs(weight.sum() - length) < 1e-9 * length
    if per_octave is None:
        assert rows.tolist() == list(range(length))
    blocks = algorithms.octave_blocks(rows)
    assert sorted(np.concatenate([b for b, _ in blocks]).tolist()) == list(range(len(rows)))
    for positions, K in blocks:
        assert K == rows[positions].max() + 1 and K <= 2 * rows[positions].min() + 2


def test_sample_rows_bad_input():
    with pytest.raises(ValueError, match="length must be"):
        algorithms.sample_rows(0, 4)
    with pytest.raises(ValueError, match="per_octave must be"):
        algorithms.sample_rows(8, 0)
    with pytest.raises(ValueError, match="rows must be"):
        algorithms.octave_blocks([3, 1])


# --- query-row sampling of Algorithms 1-3 (rows_per_octave) -------------------------------------------------


def sampled_reference(weights, x, pairs, per_octave, reading="sum_of_norms"):
    """Algorithms 1-2 on the rows of sample_rows(L, per_octave), one row at a time: per (L, N, layer, head) the
    means of d-tilde, the main sum and the fixed-set bound over the sampled rows with t + 1 > N keys, each row
    weighted by the number of rows it stands for."""
    layers, heads = np.asarray(weights).shape[:2]
    records = []
    for L_, N in pairs:
        rows, weight = algorithms.sample_rows(L_, per_octave)
        for layer in range(layers):
            for head in range(heads):
                sums, total = np.zeros(3), 0.0
                for t, c in zip(rows, weight):
                    if t + 1 <= N:
                        continue
                    w = np.asarray(weights[layer, head, t, : t + 1], dtype=float)
                    xs = np.asarray(x[layer, head, : t + 1], dtype=float)
                    vis = np.ones(t + 1, dtype=bool)
                    selected = ref.top_n(w, vis, N)
                    sums += c * np.array([ref.cumulative_distance(w, xs, selected, vis, reading),
                                          ref.main_sum(w, xs, N, vis), ref.fixed_bound(w, xs, selected, vis)])
                    total += c
                records.append({"layer": layer, "head": head, "L": L_, "N": N,
                                **dict(zip(("distance", "expectation", "bound"), sums / total))})
    return pd.DataFrame(records)


@pytest.mark.parametrize("per_octave", [1, 2, 3])
def test_sampled_rows_match_the_weighted_loop_reference(data, per_octave):
    w, x, _, _ = data
    got = algorithms.distance_vs_length(w, x, N=3, lengths=LENGTHS, rows_per_octave=per_octave, progress=False)
    same(got, sampled_reference(w, x, [(n, 3) for n in LENGTHS], per_octave), ["distance", "expectation", "bound"])
    got = algorithms.distance_vs_n(w, x, Ns=(1, 5, 20), rows_per_octave=per_octave, reading="norm_of_sum",
                                   progress=False)
    want = sampled_reference(w, x, [(L, n) for n in (1, 5, 20)], per_octave, "norm_of_sum")
    same(got, want, ["distance", "expectation", "bound"])


def test_sampling_every_row_is_the_paper_s_full_average(data):
    """A row budget at least as large as the last octave keeps every row with weight 1: the full means."""
    w, x, _, _ = data
    full = algorithms.distance_vs_length(w, x, N=2, lengths=LENGTHS, progress=False)
    for per_octave in (L // 2, 10 * L):
        sampled = algorithms.distance_vs_length(w, x, N=2, lengths=LENGTHS, rows_per_octave=per_octave, progress=False)
        same(sampled, full, ["distance", "expectation", "bound"], rtol=1e-12, atol=1e-14)
    # a small budget changes the means: the option is not ignored
    small = algorithms.distance_vs_length(w, x, N=2, lengths=(L,), rows_per_octave=1, progress=False)
    assert not np.allclose(small["distance"], full[full["L"] == L]["distance"], rtol=1e-6)


def test_critical_n_on_sampled_rows_and_a_grid_per_length(data):
    w, x, _, _ = data
    grid = lambda length: (1, length // 4, length // 2)  # noqa: E731
    result = algorithms.critical_n(w, x, LENGTHS, grid, alpha=0.01, rows_per_octave=2, progress=False)
    assert sorted(zip(result.tests["L"], result.tests["N"])) == sorted((n, k) for n in LENGTHS for k in grid(n))
    for L_ in LENGTHS:
        means = algorithms.distance_vs_length(w, x, N=L_ // 4, lengths=(L_,), rows_per_octave=2, progress=False)
        direct = ks_2samp(means["distance"], means["expectation"])
        row = result.tests[(result.tests["L"] == L_) & (result.tests["N"] == L_ // 4)].iloc[0]
        assert row["statistic"] == pytest.approx(direct.statistic) and row["pvalue"] == pytest.approx(direct.pvalue)
    full = algorithms.critical_n(w, x, LENGTHS, (1, 2, 4, 8, 16), rows_per_octave=L, progress=False)
    want_tests, want_summary = ref.critical_n(w, x, LENGTHS, (1, 2, 4, 8, 16), 0.01)
    same(full.tests, want_tests, ["statistic", "pvalue"])
    assert full.summary["critical_n"].tolist() == want_summary["critical_n"].tolist()


def test_rows_are_renormalised_before_they_are_measured(data):
    """Attention stored in float32 sums to one only up to ~1e-7: each row is divided by its sum first."""
    w, x, _, _ = data
    g = torch.Generator().manual_seed(3)
    off = w * (1 + 1e-7 * torch.randn(*w.shape[:-1], 1, generator=g, dtype=torch.float64))
    for per_octave in (None, 2):
        base = algorithms.distance_vs_n(w, x, Ns=(2, 7), rows_per_octave=per_octave, progress=False)
        moved = algorithms.distance_vs_n(off, x, Ns=(2, 7), rows_per_octave=per_octave, progress=False)
        same(moved, base, ["distance", "expectation", "bound"], rtol=1e-12)


@pytest.mark.parametrize("per_octave", [0, -1, 1.5])
def test_bad_rows_per_octave(data, per_octave):
    w, x, _, _ = data
    with pytest.raises(ValueError, match="rows_per_octave"):
        algorithms.distance_vs_n(w, x, Ns=(2,), rows_per_octave=per_octave, progress=False)


# --- the fast paths: shared rows, ties, the bound's lists, threads, Algorithm 5's identity -----------------


def tied_attention(seed, layers=2, heads=3, L=24, d=8):
    """Causal softmax attention of integer logits in {0, 1, 2}: many exactly equal weights in every row."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    logits = torch.randint(0, 3, (layers, heads, L, L), generator=g).to(torch.float64)
    weights = torch.softmax(logits.masked_fill(~mask, -torch.inf), -1)
    return weights, torch.randn(layers, heads, L, d, generator=g, dtype=torch.float64)


def test_tied_weights_match_the_reference():
    """Ties straddling the top-N threshold: the lowest indices are kept, as the loop reference does."""
    w, x = tied_attention(5)
    Ns = (1, 2, 3, 5, 8, 13)
    got = algorithms.distance_vs_n(w, x, Ns=Ns, progress=False)
    same(got, ref.distance_table(w, x, [(L, n) for n in Ns]), ["distance", "expectation", "bound"])
    got = algorithms.separability_vs_n(w, x, Ns=Ns, progress=False)
    same(got, ref.separability_table(w, x, Ns), ["separability", "lower", "upper", "delta"])
    result = algorithms.critical_n(w, x, LENGTHS, (1, 3, 5, 7), alpha=0.01, progress=False)
    want_tests, want_summary = ref.critical_n(w, x, LENGTHS, (1, 3, 5, 7), 0.01)
    same(result.tests, want_tests, ["statistic", "pvalue"])
    assert result.summary["critical_n"].tolist() == want_summary["critical_n"].tolist()


def test_a_mask_that_shows_keys_beyond_a_length_is_computed_per_length(data):
    """With every key visible, row t of the 8-key block sees 8 keys and row t of the whole window L: the lengths
    cannot share their rows (the weights beyond t are 0, so the blocks still sum to one)."""
    w, x, _, _ = data
    full = torch.ones(L, L, dtype=torch.bool)
    got = algorithms.distance_vs_length(w, x, N=3, lengths=LENGTHS, mask=full, progress=False)
    same(got, ref.distance_table(w, x, [(n, 3) for n in LENGTHS], mask=full.numpy()),
         ["distance", "expectation", "bound"])
    causal = algorithms.distance_vs_length(w, x, N=3, lengths=LENGTHS, progress=False)
    assert not np.allclose(got["distance"], causal["distance"])  # the zero-weight keys count as outside keys


def test_fixed_bound_when_the_farthest_keys_are_selected():
    """The largest weights sit on the keys farthest from every other key, so the first entries of the farthest-key
    lists are selected keys: the bound needs the lists' later entries and the direct computation."""
    g = torch.Generator().manual_seed(2)
    L_, d = 40, 4
    x = torch.randn(1, 2, L_, d, generator=g, dtype=torch.float64)
    x[..., :6, :] *= 50  # six far-away keys ...
    logits = torch.randn(1, 2, L_, L_, generator=g, dtype=torch.float64)
    logits[..., :6] += 6  # ... carry the largest weights
    mask = torch.ones(L_, L_, dtype=torch.bool).tril()
    w = torch.softmax(logits.masked_fill(~mask, -torch.inf), -1)
    got = algorithms.distance_vs_n(w, x, Ns=(1, 3, 6, 9), progress=False)
    same(got, ref.distance_table(w, x, [(L_, n) for n in (1, 3, 6, 9)]), ["distance", "expectation", "bound"])


@pytest.mark.parametrize("call", [
    lambda w, x, l: algorithms.critical_n(w, x, LENGTHS, (1, 4, 9), progress=False).tests,
    lambda w, x, l: algorithms.distance_vs_length(w, x, N=2, lengths=LENGTHS, rows_per_octave=3, progress=False),
    lambda w, x, l: algorithms.separability_vs_n(w, x, Ns=(1, 5), progress=False),
    lambda w, x, l: algorithms.gradient_sensitivity(l, (0.01, 1.0), (1e-3, 10.0), seed=2, progress=False).heads,
])
def test_layers_on_threads_give_the_same_numbers(data, call):
    """The layers spread over torch's threads (each computing with one): the same numbers, in the same order, as
    one layer after another; torch's thread count is restored, and Algorithm 5 draws its directions in layer
    order either way."""
    w, x, _, logits = data
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = call(w, x, logits)
        torch.set_num_threads(2)
        two = call(w, x, logits)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    pd.testing.assert_frame_equal(one, two)


def test_gradient_sensitivity_is_accurate_against_extended_precision():
    """Algorithm 5 against the loop formula in 60-digit arithmetic (mpmath): every (T, eps), including the small
    eps / T where subtracting two float64 softmaxes loses digits and the rows so close to one-hot that g is
    1e-14, to 1e-12 relative (and 0 where the true g is below 1e-150: the squares of its entries underflow in
    float64, for the direct difference as well)."""
    g = torch.Generator().manual_seed(7)
    L_ = 10
    mask = torch.ones(L_, L_, dtype=torch.bool).tril()
    logits = 30 * torch.randn(1, 2, L_, L_, generator=g, dtype=torch.float64)
    Ts, epsilons = (1e-3, 0.05, 1.0, 1000.0), (1e-3, 0.1, 10.0)
    got = algorithms.gradient_sensitivity(logits, Ts, epsilons, seed=3, progress=False).heads
    v = metrics.random_directions(mask.expand(2, L_, L_), torch.Generator().manual_seed(3))
    for row in got.itertuples():
        want = np.mean([ref.fd_gradient_mp(logits[0, row.head, t], v[row.head, t], mask[t], row.T, row.eps)
                        for t in range(L_)])
        assert abs(row.g - want) <= 1e-12 * want + 1e-150, (row.T, row.eps, row.g, want)


@pytest.mark.parametrize("c", [1e-6, 3.3e-5, 1e-3, 9.9e-3, 1e-2, 0.5, 20.0])
def test_expm1_of_algorithm_5(c):
    """e^y - 1 for |y| <= c: the Taylor polynomial below 1e-2 to about one ulp, exp(y) - 1 above to about 1e-16
    absolute."""
    y = (2 * torch.rand(10000, generator=torch.Generator().manual_seed(1), dtype=torch.float64) - 1) * c
    got, want = kernels.expm1(y.clone(), c), torch.expm1(y)
    if c < kernels.EXPM1:
        close(got, want, rtol=3e-16, atol=0)
    else:
        close(got, want, rtol=3e-16, atol=3e-16)


def test_small_row_blocks_give_the_same_numbers(data, monkeypatch):
    """The block sizes only cut the work: blocks of two rows give the numbers of the default blocks."""
    w, x, _, logits = data
    calls = {
        "distance": lambda: algorithms.distance_vs_n(w, x, Ns=(1, 5, 20), progress=False),
        "critical": lambda: algorithms.critical_n(w, x, LENGTHS, (1, 4, 9), progress=False).tests,
        "separability": lambda: algorithms.separability_vs_n(w, x, Ns=(1, 5), progress=False),
        "gradient": lambda: algorithms.gradient_sensitivity(logits, (0.01, 1.0), (1e-3, 10.0), progress=False).heads,
    }
    whole = {name: call() for name, call in calls.items()}
    block = 2 * HEADS * L
    for module, name in ((algorithms, "_DISTANCE_BLOCK"), (kernels, "GRADIENT_BLOCK"), (kernels, "BLOCK_ELEMENTS")):
        monkeypatch.setattr(module, name, block)
    for name, call in calls.items():
        got = call()
        numeric = [c for c in got.columns if c not in ("layer", "head", "L", "N", "T", "eps", "reject")]
        same(got, whole[name], numeric, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("per_octave", [None, 2])
def test_theorem1_row_check_matches_the_loop(data, per_octave):
    """Every checked row, its violations and the largest d / bound, against the loop reference row by row."""
    w, x, _, _ = data
    Ns, tol = (1, 3, 7), 1e-9
    got = algorithms.theorem1_row_check(w, x, Ns, tol=tol, progress=False, rows_per_octave=per_octave)
    rows = algorithms.sample_rows(L, per_octave)[0]
    checked, violations, ratios = 0, 0, []
    for layer, head, N in np.ndindex(LAYERS, HEADS, len(Ns)):
        for t, row, xs in ref._head_rows(w, x, layer, head, L):
            if t not in rows or len(row) <= Ns[N]:
                continue
            vis, sel = np.ones(len(row), dtype=bool), ref.top_n(row, np.ones(len(row), dtype=bool), Ns[N])
            d, bound = ref.cumulative_distance(row, xs, sel, vis), ref.fixed_bound(row, xs, sel, vis)
            checked += 1
            violations += d > bound * (1 + tol) + tol
            if bound > 0:
                ratios.append(d / bound)
    assert got["checked"] == checked and got["violations"] == violations == 0
    close(got["largest_ratio"], max(ratios), rtol=1e-10)


def test_theorem1_row_check_bad_input(data):
    w, x, _, _ = data
    with pytest.raises(ValueError, match="tol"):
        algorithms.theorem1_row_check(w, x, (2,), tol=-1.0)
    with pytest.raises(ValueError, match="Ns"):
        algorithms.theorem1_row_check(w, x, (L,))
