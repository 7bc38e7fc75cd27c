"""Chapter 2's machinery (attn_utils.book.chapters.distance): synthetic instances with known answers, the model
pipeline on a tiny GPT-2 against the library's algorithms and a row-by-row loop, and the ledger's rules on hand-made
values."""
import itertools
import math

import matplotlib
import numpy as np
import pandas as pd
import pytest
import reference as ref
import torch
from helpers import causal_attention

from attn_utils.book import claims, runlog
from attn_utils.book.chapters import distance
from attn_utils.book.session import Session
from attn_utils.mathematics import algorithms, metrics, theory

matplotlib.use("Agg")
F64 = torch.float64


def generator(seed=0):
    return torch.Generator().manual_seed(seed)


# --- synthetic instances ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", distance.FAMILIES)
def test_each_family_is_what_it_says(family):
    length, n_top, batch = 9, 3, 5
    w, x, sel = distance.make_batch(family, length, n_top, batch, generator())
    assert w.shape == (batch, 1, length) and x.shape == (batch, length, distance.DIM) and sel.shape == w.shape
    assert torch.allclose(w.sum(-1), torch.ones(batch, 1, dtype=F64)) and (sel.sum(-1) == n_top).all()
    assert torch.equal(sel, metrics.top_n_mask(w, n_top)[0])
    if family == "tied weights":
        assert torch.equal(w, torch.full_like(w, 1 / length)) and sel[:, 0, :n_top].all()  # ties: earlier keys
    if family == "one dominant weight":
        assert (w.amax(-1) > 1 - length * math.exp(-distance.HOT + 2 * distance.LOGIT_SCALE * 4)).all()
    if family == "equal vectors":
        assert torch.equal(x, x[:, :1].expand_as(x))
    if family == "antipodal (extremal)":
        e = torch.zeros(distance.DIM, dtype=F64)
        e[0] = 1
        assert torch.equal(x, torch.where(sel[:, 0, :, None], e, -e))
    again = distance.make_batch(family, length, n_top, batch, generator())
    assert all(torch.equal(a, b) for a, b in zip((w, x, sel), again))  # the generator decides everything


def test_the_antipodal_family_attains_the_bound_in_closed_form():
    """Exercise 1: d~ = (1 - abar) + abar (L - N) = the bound, in both readings."""
    for length, n_top in [(5, 1), (16, 4), (33, 32)]:
        w, x, sel = distance.make_batch("antipodal (extremal)", length, n_top, 7, generator(length))
        abar = (w * sel).sum(-1)[:, 0]
        closed = (1 - abar) + abar * (length - n_top)
        bound = theory.theorem1_fixed_bound(w, x, sel)[:, 0]
        for reading in metrics.READINGS:
            d = metrics.cumulative_distance(w, x, sel, reading=reading)[:, 0]
            torch.testing.assert_close(d, closed, rtol=1e-12, atol=0)
        torch.testing.assert_close(bound, closed, rtol=1e-12, atol=0)


def test_fixed_set_instances_and_their_summary():
    fixed = distance.fixed_set_instances(200, generator())
    configs = [(f, n, k) for f in distance.FAMILIES for n in distance.SYNTHETIC_LENGTHS
               for k in distance.top_sizes(f, n)]
    assert len(fixed) == len(configs) * math.ceil(200 / len(configs))
    assert not fixed["violates (sum_of_norms)"].any() and not fixed["violates (norm_of_sum)"].any()
    assert (fixed["norm_of_sum"] <= fixed["sum_of_norms"] * (1 + 1e-12)).all()
    extremal = fixed[fixed["family"] == "antipodal (extremal)"]
    np.testing.assert_allclose(extremal["ratio (sum_of_norms)"], 1.0, rtol=1e-12)
    assert extremal["violates sqrt form"].any()  # the square-root completion is false
    # where the last factor is at most 1 its root is at least the factor: the root form is the weaker there
    summary = distance.fixed_set_summary(fixed)
    assert summary["instances"].sum() == len(fixed) and list(summary.index) == list(distance.FAMILIES)
    assert distance.fixed_ratio_figure(fixed).get_size_inches()[0] <= 7.5
    assert summary.loc["antipodal (extremal)", "violations of the sqrt form"] == extremal["violates sqrt form"].sum()
    facts = distance.fixed_set_facts(fixed)
    assert facts["s_fixed_viol_son"] == 0 and facts["s_fixed_tight_extremal"] < 1e-12
    assert facts["s_fixed_sqrt_extremal_n"] == len(extremal) and facts["s_bad_refused"]
    assert facts["s_bad_d"] == pytest.approx(0.8) and facts["s_bad_bound"] == pytest.approx(-0.8)


def test_closed_forms_are_the_enumerated_expectation():
    w, x, _ = distance.make_batch("generic", 7, 1, 3, generator(4))
    first, last = distance.closed_form_expectations(w, x)
    for b in range(3):
        assert float(first[b]) == pytest.approx(float(theory.theorem1_random_expectation_exact(w[b, 0], x[b], 1)),
                                                rel=1e-12)
        assert float(last[b]) == pytest.approx(float(theory.theorem1_random_expectation_exact(w[b, 0], x[b], 6)),
                                               rel=1e-12)


def test_random_set_checks_find_the_proven_inequality():
    exact, closed, mc = distance.random_set_checks(8, 64, generator())
    per_family = 4  # max(4, n_trials // 250)
    assert len(exact) == per_family * len(distance.EXACT_FAMILIES) * sum(n - 1 for n in distance.EXACT_LENGTHS)
    assert (exact["residual"] >= -1e-12 * exact["exact"]).all()  # Jensen: E <= E[d~]
    assert exact.loc[exact["N"] == exact["L"] - 1, "residual"].abs().max() < 1e-12  # eps = 0 at N = L - 1
    assert (closed["main sum"] <= closed["exact"] * (1 + 1e-12)).all()
    assert set(mc["N"]) == {1, 5, 16, 64, 63, 255} and mc["standard error"].gt(0).all()
    facts = distance.random_set_facts(exact, closed, mc)
    assert facts["s_exact_viol"] == 0 and facts["s_closed_viol"] == 0 and facts["s_jensen_last"] < 1e-12
    assert 0 <= facts["s_jensen_monotone"] <= 100 and facts["s_exact_n"] == len(exact)
    fig = distance.jensen_figure(exact)
    assert len(fig.axes) == 1 and fig.get_size_inches()[0] <= 7.5


def test_corollary2_certificates_hold():
    small_n, large_n = distance.corollary2_checks(generator())
    assert small_n["gap holds"].all() and large_n["cap holds"].all()
    assert len(small_n) == 2 * distance.COR_ROWS * len(distance.COR_LENGTHS)
    assert sorted(set(large_n["N"])) == list(range(1, distance.COR_L2))
    facts = distance.corollary2_facts(small_n, large_n)
    assert facts["s_cor_fail"] == 0
    assert facts["s_cor_offset_last"] > 2 * facts["s_cor_centred_last"]  # a common offset keeps ||m|| away from 0
    assert abs(facts["s_cor_centred_last"] - 1) < 0.05  # centred vectors: E -> A as L grows
    fig = distance.corollary2_figure(small_n, large_n)
    assert len(fig.axes) == 2 and fig.get_size_inches()[0] <= 7.5  # (i) and (ii) side by side, no more


# --- panel (c) grid, the row check and the sampling checks -------------------------------------------------------


def test_critical_grid():
    assert distance.critical_grid(32) == [1, 4, 8, 12, 16, 20, 22, 24, 26, 28, 30, 31]
    grid = distance.critical_grid(1024)
    assert 61 in grid and grid[0] == 16 and grid[-1] == 1023 and grid == sorted(set(grid))
    assert distance.critical_grid(2) == [1]


@pytest.fixture(scope="module")
def attention():
    """Random causal attention (2 layers, 3 heads, L = 24), stored in float32 like a captured model's."""
    w, x, _, _ = causal_attention(5)
    return w.float(), x.float()


def test_row_bound_check_against_a_loop(attention):
    w, x = attention
    Ns, per_octave = (1, 3, 9), 2
    got = distance.row_bound_check(w, x, Ns, reading="sum_of_norms", rows_per_octave=per_octave)
    rows, _ = algorithms.sample_rows(w.shape[-1], per_octave)
    checked, ratios = 0, []
    for layer, head, t, n in itertools.product(range(w.shape[0]), range(w.shape[1]), rows, Ns):
        if t + 1 <= n:
            continue
        row = w[layer, head, t, : t + 1].double().numpy()
        row = row / row.sum()
        xs, vis = x[layer, head, : t + 1].double().numpy(), np.ones(t + 1, dtype=bool)
        selected = ref.top_n(row, vis, n)
        ratios.append(ref.cumulative_distance(row, xs, selected, vis) / ref.fixed_bound(row, xs, selected, vis))
        checked += 1
    assert got["checked"] == checked and got["violations"] == 0
    assert got["largest_ratio"] == pytest.approx(max(ratios), rel=1e-10)


def test_sampling_checks(attention):
    w, x = attention
    facts, table = distance.sampling_checks(w, x, N=2, lengths=[8, 16, 24], alpha=0.01, reading="sum_of_norms",
                                            rows_per_octave=4)
    assert facts["m_check_lengths"] == [8] and facts["m_check_agreement"] < 1e-12 and facts["m_crit_check"] == "1 of 1"
    assert list(table.index) == ["median relative error", "largest relative error"]
    assert 0 < facts["m_sample_med"] <= facts["m_sample_max"]
    every, _ = distance.sampling_checks(w, x, N=2, lengths=[8, 16], alpha=0.01, reading="sum_of_norms",
                                        rows_per_octave=None)
    assert every["m_sample_max"] == 0 and every["m_check_agreement"] == 0 and every["m_crit_check"] == "2 of 2"
    # a run over every row measures the sample a quicker run would take: here it holds every row of the window
    assert every["m_sample_k"] == distance.QUICK_ROWS_PER_OCTAVE and every["m_sample_rows"] == w.shape[-1]
    assert facts["m_sample_k"] == 4 and facts["m_sample_share"] == pytest.approx(100 * facts["m_sample_rows"] / 24)


def encoder_window(n, seed=0):
    """A bidirectional attention window of n tokens (every row sees every key), float32 like a capture; its values
    depend on n (as an encoder's do on the whole window)."""
    g = generator(100 + n + seed)
    w = torch.softmax(2 * torch.randn(2, 3, n, n, generator=g, dtype=F64), -1)
    return w.float(), torch.randn(2, 3, n, 4, generator=g, dtype=F64).float()


def _loop_mean(w, x, n_top):
    """Per head, the mean over every row of d~ (all keys visible): the slow reference for an encoder's window."""
    means = {}
    for layer, head in itertools.product(range(w.shape[0]), range(w.shape[1])):
        values = []
        for t in range(w.shape[2]):
            row = w[layer, head, t].double().numpy()
            row, vis = row / row.sum(), np.ones(len(row), dtype=bool)
            xs = x[layer, head].double().numpy()
            values.append(ref.cumulative_distance(row, xs, ref.top_n(row, vis, n_top), vis))
        means[layer, head] = np.mean(values)
    return means


def test_figure2_on_an_encoder_reads_one_window_per_length(run_dir):
    asked = []

    def windows(n):
        asked.append(n)
        return encoder_window(n)

    weights, x = encoder_window(24)
    options = dict(reading="sum_of_norms", rows_per_octave=None)
    fig2 = distance.figure2(weights, x, N=3, lengths=[8, 16, 24], Ns=[1, 3, 9], alpha=0.01, windows=windows,
                            **options)
    assert asked == [8, 16, 24]
    for n in (8, 16):  # each length is its own window, every row of it seeing all n keys
        got = fig2.by_length[fig2.by_length.L == n].set_index(["layer", "head"])["distance"]
        want = _loop_mean(*encoder_window(n), 3)
        assert got.to_dict() == pytest.approx(want, rel=1e-9)
    by_n = fig2.by_n[fig2.by_n.N == 9].set_index(["layer", "head"])["distance"]
    assert by_n.to_dict() == pytest.approx(_loop_mean(weights, x, 9), rel=1e-9)
    assert set(fig2.critical["L"]) == {8, 16, 24}
    check = distance.row_bound_check(weights, x, [1, 3, 9], causal=False, **options)
    assert check["checked"] == 2 * 3 * 24 * 3 and check["violations"] == 0
    facts, _ = distance.sampling_checks(weights, x, N=3, lengths=[8, 16, 24], alpha=0.01, causal=False,
                                        reading="sum_of_norms", rows_per_octave=4)
    assert facts["m_check_lengths"] == [8] and facts["m_check_agreement"] < 1e-12 and facts["m_crit_check"] == "1 of 1"


# --- Figure 2 on a tiny GPT-2 -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def captured(tiny_gpt2):
    session = Session.open(model=tiny_gpt2, L=64, seed=0)
    weights, x, facts = distance.capture(session, "value")
    return session, weights, x, facts


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_COMPANION_RUN_DIR", str(tmp_path))
    return tmp_path


def test_capture_facts(captured, tiny_gpt2):
    session, weights, x, facts = captured
    assert weights.shape == (2, 2, 64, 64) and x.shape[:3] == (2, 2, 64)
    assert facts["m_L"] == 64 and facts["ch2_model"] == tiny_gpt2 and "4 heads" in facts["m_heads"]
    assert facts["m_rowsum_dev"] == max(float((weights[i].double().sum(-1) - 1).abs().max()) for i in range(2))
    assert 0 < facts["m_rowsum_dev"] < 1e-5


def test_figure2_on_the_model_is_the_library_s_algorithms(captured, run_dir):
    _, weights, x, _ = captured
    options = dict(reading="sum_of_norms", rows_per_octave=8)
    fig2 = distance.figure2(weights, x, N=5, lengths=[16, 32, 64], Ns=[1, 5, 20], alpha=0.01, **options)
    want = algorithms.distance_vs_length(weights, x, N=5, lengths=[16, 32, 64], progress=False, **options)
    pd.testing.assert_frame_equal(fig2.by_length, want)
    assert (fig2.by_length["distance"] <= fig2.by_length["bound"]).all() and (fig2.by_n["L"] == 64).all()
    assert fig2.rows == len(algorithms.sample_rows(64, 8)[0])
    full = algorithms.critical_n(weights, x, [16, 32, 64], distance.critical_grid, rows_per_octave=8, progress=False)
    for L_, crit in zip(fig2.critical["L"], fig2.critical["critical N"]):
        ran = fig2.tests[fig2.tests["L"] == L_]
        grid = distance.critical_grid(L_)
        assert ran["N"].tolist() == (grid if crit < 0 else [n for n in grid if n <= crit])  # an upward scan
        assert crit == (-1 if ran["reject"].all() else ran.loc[~ran["reject"], "N"].iloc[0])
        assert crit == full.summary.set_index("L").loc[L_, "critical_n"]
    assert {"Algorithms_1-2", "Algorithm_3"} <= {p.stem.split("--")[-1] for p in (run_dir / "timings").glob("*.json")}
    recorded = [r["seconds"] for r in runlog.read("timings") if r["algorithm"] in distance.TIMED]
    assert len(recorded) == 2 and distance.run_seconds() == pytest.approx(sum(recorded)) and sum(recorded) > 0
    check = distance.row_bound_check(weights, x, [1, 5, 20], **options)
    assert check["violations"] == 0 and 0 < check["largest_ratio"] <= 1
    facts = distance.figure2_facts(fig2, N=5, alpha=0.01, reading="sum_of_norms")
    means = fig2.by_length.groupby("L")["distance"].mean()
    assert facts["m_slope_d"] == pytest.approx(np.polyfit(np.log([16, 32, 64]), np.log(means.to_numpy()), 1)[0])
    assert not facts["m_has_20_100"] and math.isnan(facts["m_plateau"])
    assert facts["m_plateau_text"].startswith("not measured")
    ab = distance.figure2_ab_figure(fig2, N=5, title="t", model="gpt2-random")
    c = distance.figure2_c_figure(fig2, alpha=0.01, model="gpt2-random")
    assert [len(f.axes) for f in (ab, c)] == [2, 1]  # at most two panels side by side in the text column
    assert all("gpt2-random" in f._suptitle.get_text() and f.get_size_inches()[0] <= 7.5 for f in (ab, c))
    legend = ab.legends[0]  # one legend below both panels, in the paper's colours (distance green, E blue, bound red)
    assert [t.get_text() for t in legend.get_texts()] == list(distance.QUANTITY_COLOURS)
    assert all(matplotlib.colors.same_color(line.get_color(), colour)
               for line, colour in zip(legend.get_lines(), distance.QUANTITY_COLOURS.values()))


def _table(values: dict[int, tuple[float, float, float]], column: str, L: int = 1024) -> pd.DataFrame:
    """A one-head table of Algorithm 1 or 2 with the given (distance, expectation, bound) per grid value."""
    return pd.DataFrame([{"layer": 0, "head": 0, "L": L if column == "N" else k, "N": k if column == "N" else 5,
                          "distance": d, "expectation": e, "bound": b} for k, (d, e, b) in values.items()])


def test_figure2_facts_on_known_panels():
    by_length = _table({32: (1.0, 1.0, 3.0), 64: (2.0, 1.0, 5.0), 128: (4.0, 1.0, 9.0)}, "L")  # d ~ L / 32
    by_n = _table({5: (10.0, 5.0, 30.0), 20: (12.0, 9.0, 24.0), 100: (11.4, 10.8, 22.8)}, "N")
    critical = pd.DataFrame({"L": [32, 64], "critical N": [28, 3], "critical N / L": [28 / 32, 3 / 64]})
    tests = pd.DataFrame({"L": [32, 64], "N": [1, 3], "N / L": [1 / 32, 3 / 64], "statistic": [1.0, 0.1],
                          "pvalue": [1e-5, 0.5], "reject": [True, False]})
    fig2 = distance.Figure2(by_length, by_n, tests, critical, rows=100)
    f = distance.figure2_facts(fig2, N=5, alpha=0.01, reading="norm_of_sum")
    assert f["m_slope_d"] == pytest.approx(1.0) and f["m_slope_e"] == pytest.approx(0.0)
    # m_conservative: the median of 3, 2.5, 2.25, 3, 2, 2
    assert f["m_safe_fraction"] == 1.0 and f["m_conservative"] == pytest.approx(2.375)
    assert f["m_plateau"] == pytest.approx(0.05) and f["m_plateau_text"] == "5 %"
    assert f["m_ratio_20"] == pytest.approx(2.0) and f["m_ratio_100"] == pytest.approx(2.0)
    assert f["m_gap_5"] == pytest.approx(0.5) and f["m_gap_100"] == pytest.approx(1 - 10.8 / 11.4)
    assert f["m_crit_within"] == [False, True] and f["m_crit_ledger"] == "L=32: 28; L=64: 3"
    assert f["m_crit_table"] == ("L=32: N=28 (0.88 L; between 2 and 28, as the grid steps from 1 to 28), "
                                 "L=64: N=3 (0.05 L, the smallest size tested)")
    assert f["m_p_006_tested"] == 2 and not f["m_p_006_reject_all"] and f["m_p_006_accepted"] == "64"
    assert f["m_rows_text"] == "100 sampled query rows per head (9.77 % of the rows)"
    assert f["m_reading"] == "norm of sum"
    assert distance.rows_text(1024, 1024) == "every query row (1024 per head)"


# --- the ledger's rules, on hand-made values ---------------------------------------------------------------------

NAN = float("nan")
RC, PR, NR, NC = "reproduced", "partly reproduced", "not reproduced", "not comparable"


def judge(key, **values):
    return claims.judge(key, model="m", **values).verdict


@pytest.mark.parametrize("slope, verdict", [(NAN, NR), (-1.0, NR), (0.79, NR), (0.8, RC), (1.0, RC), (1.2, RC),
                                            (1.2001, NR), (3.0, NR)])
def test_linear_rules(slope, verdict):
    for key in ("ch2-fig2a-distance-linear", "ch2-fig2a-expectation-linear"):
        assert judge(key, N=5, slope=slope, lengths=[32, 64]) == verdict


@pytest.mark.parametrize("measured, plateau, verdict", [(False, 0.0, NC), (False, NAN, NC), (True, 0.0999, RC),
                                                        (True, 0.1, RC), (True, 0.1001, NR), (True, NAN, NR)])
def test_plateau_rule(measured, plateau, verdict):
    assert judge("ch2-fig2b-plateau", L=1024, plateau=plateau, plateau_text="x", measured=measured) == verdict


@pytest.mark.parametrize("measured, ratio_20, ratio_100, verdict", [
    (False, 1.0, 0.5, NC), (True, 1.0, 0.5, RC), (True, 0.5, 0.5, NR), (True, 0.5, 1.0, NR), (True, NAN, 0.5, NR),
    (True, 1.0, NAN, NR)])
def test_bound_tightens_rule(measured, ratio_20, ratio_100, verdict):
    assert judge("ch2-fig2b-bound-tightens", L=1024, ratio_20=ratio_20, ratio_100=ratio_100,
                 measured=measured) == verdict


@pytest.mark.parametrize("measured, gap_5, gap_100, verdict", [
    (False, 0.5, 0.0, NC), (True, 0.5, 0.1, RC), (True, NAN, 0.05, RC), (True, 0.5, 0.1001, PR), (True, 0.3, 0.3, NR),
    (True, 0.2, 0.3, NR), (True, 0.5, NAN, NR)])
def test_converge_rule(measured, gap_5, gap_100, verdict):
    assert judge("ch2-fig2b-converge", L=1024, gap_5=gap_5, gap_100=gap_100, gap_5_text="x", gap_100_text="y",
                 measured=measured) == verdict


@pytest.mark.parametrize("fractions, verdict", [([0.01, 0.06], RC), ([0.06], RC), ([0.01, 0.0601], PR),
                                                ([NAN, 0.03], PR), ([0.2, 0.05, 0.9], PR), ([0.5, 0.7], NR),
                                                ([NAN], NR)])
def test_critical_n_rule(fractions, verdict):
    within = [bool(f <= 0.06) for f in fractions]  # what the chapter records: NaN (no size accepted) is not within
    assert judge("ch2-fig2c-critical-n", critical="c", alpha=0.01, within=within, fractions=fractions) == verdict


@pytest.mark.parametrize("safe, violations, verdict", [(1.0, 0, "reproduced"), (0.99, 0, "not reproduced"),
                                                       (1.0, 2, "not reproduced")])
def test_bound_rules(safe, violations, verdict):
    assert judge("ch2-fig2a-bound-safe", safe_fraction=safe, conservative=3.0, violations=violations) == verdict
    model = judge("ch2-thm1-fixed-model", violations=violations, checked=10, Ns=[1], largest_ratio=0.5)
    assert model == ("holds" if violations == 0 else "fails")


def test_synthetic_rules():
    common = dict(violations_son=0, instances=9, sqrt_violations=3)
    assert judge("ch2-thm1-fixed-synthetic", violations_nos=0, **common) == "holds"
    assert judge("ch2-thm1-fixed-synthetic", violations_nos=1, **common) == "fails"
    base = dict(exact_violations=0, exact_cases=5, closed_violations=0, closed_cases=5, z_max=4, mc_violations=0,
                mc_rows=5, monotone_percent=80.0)
    assert judge("ch2-thm1-random-synthetic", **base) == "holds"
    assert judge("ch2-thm1-random-synthetic", **{**base, "mc_violations": 1}) == "fails"
    cor = dict(cases=9, L=8, N=5, ratio_centred=1.0, ratio_offset=3.0)
    assert judge("ch2-cor2-synthetic", failures=0, **cor) == "holds"
    assert judge("ch2-cor2-synthetic", failures=1, **cor) == "fails"


def test_readings_follow_the_verdicts():
    facts = {"m_p_006_reject_all": False, "m_p_006_tested": 0, "m_p_006_max": float("nan"), "m_p_006_accepted": ""}
    recorded = {k: claims.judge(k, model="m", **v) for k, v in {
        "ch2-fig2a-distance-linear": dict(N=5, slope=1.0, lengths=[1]),
        "ch2-fig2a-expectation-linear": dict(N=5, slope=0.1, lengths=[1]),
        "ch2-fig2a-bound-safe": dict(safe_fraction=1.0, conservative=2.0, violations=0),
        "ch2-fig2b-plateau": dict(L=1, plateau=float("nan"), plateau_text="x", measured=False),
        "ch2-fig2b-bound-tightens": dict(L=1, ratio_20=2.0, ratio_100=1.0, measured=True),
        "ch2-fig2b-converge": dict(L=1, gap_5=0.5, gap_100=0.3, gap_5_text="", gap_100_text="", measured=True),
        "ch2-fig2c-critical-n": dict(critical="", alpha=0.01, within=[False], fractions=[0.5])}.items()}
    read = distance.figure2_readings(facts, recorded)
    assert read["m_read_d"].startswith("linear growth") and read["m_read_e"] == "The main sum does not follow"
    assert read["m_read_plateau"] == "not comparable with the paper" and read["m_read_tighten_short"] == "tightens"
    assert "but slowly" in read["m_read_converge"] and read["m_crit_verdict"] == "not reproduced"
    assert read["m_read_006"].startswith("No test was run")
    assert read["m_rule_slope"] == recorded["ch2-fig2a-distance-linear"].rule
