"""Chapter 3 (geometric separability): the pipelines of attn_utils.book.chapters.separability against slow loops,
closed forms and known answers, and the ledger's rules on hand-made values."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attn_utils.book import claims  # noqa: E402
from attn_utils.book.chapters import separability as sep_ch  # noqa: E402
from attn_utils.mathematics import algorithms, metrics  # noqa: E402

F64 = torch.float64


# --- slow references ---------------------------------------------------------------------------------------


def loop_row(w, x, N, M=1.0, delta=None):
    """(N_s / N, r, lower bound of Theorem 2) of one row by plain loops; x projected onto the sphere of radius M."""
    w = [float(v) for v in w]
    pts = [M * xi / xi.norm() for xi in x]
    L = len(w)
    top = sorted(range(L), key=lambda i: (-w[i], i))[:N]
    s = sum(w[i] * pts[i] for i in top)
    r = min(float((s - w[j] * pts[j]).norm()) for j in range(L) if j not in top)
    n_s = sum(1 for i in top if float((s - w[i] * pts[i]).norm()) < r)
    lower = None
    if delta is not None:
        xis = []
        for i in top:
            others = [w[j] for j in top if j != i]
            s1, s2 = sum(others), sum(a * a for a in others)
            xis.append(math.sqrt(max(M * M * s1 * s1 - delta * delta / 2 * (s1 * s1 - s2), 0.0)))
        lower = 1 - sum(xis) / (N * r)
    return n_s / N, r, lower


# --- Figure 1 and the counterexample ---------------------------------------------------------------------


def test_figure1_instance_counts_like_a_loop():
    fig1 = sep_ch.figure1_instance(seed=3, L=12, N=4, sigma=1.5, M=2.0)
    ratio, r, _ = loop_row(torch.from_numpy(fig1.weights), torch.from_numpy(fig1.x), 4, M=2.0)
    assert fig1.N == 4 and fig1.L == 12 and np.allclose(np.linalg.norm(fig1.x, axis=1), 2.0)
    assert fig1.ratio == ratio == fig1.inside.sum() / 4 and fig1.r == pytest.approx(r, abs=1e-12)
    assert not fig1.selected[fig1.nearest]
    assert np.linalg.norm(fig1.scaled[fig1.nearest] - fig1.s) == pytest.approx(fig1.r, abs=1e-12)
    assert len(sep_ch.draw_figure1_rescaling(fig1).axes) == 2
    ball = sep_ch.draw_figure1_ball(fig1)
    labels = [t.get_text() for t in ball.legends[0].get_texts()]
    assert len(ball.axes) == 1 and len(labels) == len(set(labels)) == 5   # one entry per kind of point


def test_counterexample_breaks_the_upper_bound_and_keeps_the_lower():
    cx = sep_ch.counterexample()
    assert cx["fails"] and cx["ratio"] == 1.0 and cx["upper"] == pytest.approx(0.69, abs=0.01)
    assert cx["max_X"] < cx["r"] < cx["min_xi"] and cx["lower"] <= cx["ratio"]
    values = {k: cx[k] for k in ("N", "d", "M", "ratio", "upper", "r", "max_X", "min_xi")}
    assert claims.judge("ch3-thm2-upper-counterexample", model="synthetic", **values).verdict == "fails"
    table = sep_ch.counterexample_table(cx)
    assert list(table.value) == [cx[k] for k in sep_ch.COUNTEREXAMPLE_ROWS] and table.quantity.is_unique


# --- the synthetic pipeline ------------------------------------------------------------------------------------


def test_selected_distances_match_loops():
    g = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(2, 3, 10, generator=g, dtype=F64), -1)
    x = torch.randn(2, 10, 5, generator=g, dtype=F64)
    sel, _ = metrics.top_n_mask(w, 4)
    X, idx = sep_ch.selected_distances(w, x, sel, 4)
    for b in range(2):
        for row in range(3):
            keys = [int(i) for i in idx[b, row]]
            assert sorted(keys) == sorted(int(i) for i in sel[b, row].nonzero())
            s = sum(w[b, row, i] * x[b, i] for i in keys)
            for a, i in enumerate(keys):
                assert float(X[b, row, a]) == pytest.approx(float((s - w[b, row, i] * x[b, i]).norm()), abs=1e-13)


def test_sphere_min_distance_is_the_minimum_pairwise_distance():
    x = metrics.project_to_sphere(torch.randn(5, 40, 8, generator=torch.Generator().manual_seed(1), dtype=F64), 1.5)
    got = sep_ch.sphere_min_distance(x, 1.5, chunk=2)
    assert torch.allclose(got, metrics.min_pairwise_distance(x), atol=1e-9)


def test_synthetic_rows_against_loops_and_the_proven_facts():
    L, Ns, sigmas, n_trials, M, seed = 20, [1, 2, 5], [0.5, 2.0], 3, 1.5, 7
    syn = sep_ch.synthetic_rows(L, Ns, sigmas, n_trials, M=M, seed=seed, d=6, n_rows=2)
    assert len(syn) == len(sigmas) * n_trials * len(Ns) * 2
    assert list(syn[["sigma", "trial", "N", "row"]].itertuples(index=False)) == \
        sorted(syn[["sigma", "trial", "N", "row"]].itertuples(index=False))
    assert (syn[syn.N == 1].ratio == 1).all() and (syn.xi_gap <= 1e-12).all() and not syn.lower_violated.any()
    gen = torch.Generator().manual_seed(seed)   # the same draws, in the documented order
    for sigma in sigmas:
        x = metrics.project_to_sphere(torch.randn(n_trials, L, 6, generator=gen, dtype=F64), M)
        w = torch.softmax(sigma * torch.randn(n_trials, 2, L, generator=gen, dtype=F64), dim=-1)
        delta = float(metrics.min_pairwise_distance(x[1]))
        for N in Ns:
            for row in range(2):
                got = syn[(syn.sigma == sigma) & (syn.trial == 1) & (syn.N == N) & (syn.row == row)].iloc[0]
                ratio, _, lower = loop_row(w[1, row], x[1], N, M=M, delta=delta)
                assert got.ratio == ratio and got.lower == pytest.approx(lower, abs=1e-10)
                assert got.delta == pytest.approx(delta, abs=1e-9)
    s = sep_ch.synthetic_summary(syn)
    assert s["rows"] == len(syn) and s["lower_violations"] == 0 and s["xi_violations"] == 0
    assert s["upper_violations"] == int((syn.ratio > syn.upper + 1e-12).sum())
    assert s["N_first"] == 2 and s["N_last"] == 5 and s["ratio_last"] == pytest.approx(syn[syn.N == 5].ratio.mean())
    table = sep_ch.synthetic_table(syn)
    assert table.shape[0] == len(sigmas) * len(Ns)
    assert int(table["'upper bound' violated"].sum()) == s["upper_violations"]
    assert table["largest Xᵢ − ξᵢ"].max() == pytest.approx(s["max_xi_gap"])


# --- the model pipeline -------------------------------------------------------------------------------------


def test_model_rowwise_matches_loops_on_causal_rows():
    g = torch.Generator().manual_seed(2)
    L, stride, M, Ns = 24, 5, 1.0, [1, 3, 6]
    logits = torch.randn(2, 2, L, L, generator=g).masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), -torch.inf)
    weights, x = torch.softmax(logits, -1), torch.randn(2, 2, L, 4, generator=g)
    deltas = pd.Series({(layer, h): float(metrics.min_pairwise_distance(metrics.project_to_sphere(x[layer, h], M)))
                        for layer in range(2) for h in range(2)})
    rowwise = sep_ch.model_rowwise(weights, x, deltas, Ns, M=M, stride=stride)
    for (layer, h, N), got in rowwise.groupby(["layer", "head", "N"]):
        rows = [t for t in range(stride - 1, L, stride) if t + 1 > N]     # row t sees keys 0..t
        assert len(got) == len(rows)
        for t, (_, g_row) in zip(rows, got.iterrows()):
            w = weights[layer, h, t, : t + 1].to(F64)
            ratio, _, lower = loop_row(w / w.sum(), x[layer, h, : t + 1].to(F64), N, M, deltas[(layer, h)])
            assert g_row.ratio == ratio and g_row.lower == pytest.approx(lower, abs=1e-9)
    s = sep_ch.rowwise_summary(rowwise)
    assert s["rows"] == len(rowwise) and s["lower_violations"] == 0
    table = sep_ch.rowwise_table(rowwise)
    assert list(table.N) == Ns and table["rows checked"].sum() == s["rows"]
    assert table["'upper bound' violated"].sum() == s["upper_violations"]


def test_the_model_pipeline_on_a_tiny_gpt2(tiny_gpt2):
    from attn_utils.book.session import Session

    session = Session.open(model=tiny_gpt2, L=32)
    captured = session.capture(layers=[0, 1], what=("weights", "v"))
    x = session.vectors(captured, "value")
    sep = algorithms.separability_vs_n(captured.weights, x, Ns=[1, 2, 4, 8], progress=False)
    rowwise = sep_ch.model_rowwise(captured.weights, x, sep_ch.head_deltas(sep), [1, 2, 4, 8])
    assert rowwise.lower_violated.sum() == 0 and (rowwise[rowwise.N == 1].ratio == 1).all()
    assert set(rowwise.layer) == {0, 1} and len(rowwise) == 2 * 2 * sum(len(range(7, 32, 8)) - (N >= 8) for N in
                                                                         [1, 2, 4, 8])
    summary = sep_ch.figure3_summary(sep)
    assert summary["grid"] == [1, 2, 4, 8] and summary["medians"][0] == 1.0
    assert sep_ch.draw_figure3(sep, session.name, "value", 1.0).axes


# --- Figure 3: the summary and the ledger's rules ----------------------------------------------------------------


def test_figure3_summary_on_a_known_table():
    medians = {1: 1.0, 2: 0.95, 4: 0.85, 8: 0.78, 16: 0.76, 32: 0.75}
    sep = pd.DataFrame([{"layer": 0, "head": h, "L": 64, "N": N, "separability": m + d, "lower": -1.0,
                         "upper": m + d + 0.05, "delta": 0.1 * h} for N, m in medians.items() for h, d in
                        enumerate([-0.02, 0.0, 0.02])])
    s = sep_ch.figure3_summary(sep)
    assert s["grid"] == list(medians) and s["medians"] == pytest.approx(list(medians.values()))
    assert s["stop"] == 8 and s["drop"] == pytest.approx(0.22) and s["plateau_from"] == 8
    assert s["plateau_median"] == pytest.approx(0.76) and s["track_gap"] == pytest.approx(0.03)
    assert s["late_N"] == 16 and s["late_max"] == pytest.approx(0.78) and s["late_share"] == 0
    assert s["delta_median"] == pytest.approx(0.1) and s["zero_heads"] == 1 and s["zero_layers"] == [0]
    assert "from N = 8 on" in sep_ch.figure3_prose(s)["stop_text"]
    table = sep_ch.per_n_table(sep)
    assert list(table.N) == list(medians) and (table.heads == 3).all()
    assert list(table["median Nₛ/N"]) == pytest.approx(list(medians.values()))
    assert list(table["largest Nₛ/N"] - table["smallest Nₛ/N"]) == pytest.approx([0.04] * len(medians))


NAN = float("nan")
RC, PR, NR = "reproduced", "partly reproduced", "not reproduced"
GRID = {"grid": [1, 2, 4, 8, 16, 32], "medians": [1.0, 0.95, 0.85, 0.78, 0.76, 0.75]}  # for the claim's text only


@pytest.mark.parametrize("stop, drop, verdict", [(16, 0.22, RC), (8, 0.06, RC), (32, 0.3, RC), (2, 0.4, PR),
                                                 (4, 0.3, PR), (64, 0.3, PR), (16, 0.05, NR), (16, NAN, NR),
                                                 (0, NAN, NR)])
def test_decline_rule(stop, drop, verdict):
    assert claims.judge("ch3-fig3-decline", model="m", stop=stop, drop=drop, **GRID).verdict == verdict


@pytest.mark.parametrize("stop, plateau_median, verdict", [(8, 0.76, RC), (8, 0.70, RC), (8, 0.85, RC),
                                                           (8, 0.69, NR), (8, 0.86, NR), (8, NAN, NR), (0, 0.76, NR)])
def test_plateau_rule(stop, plateau_median, verdict):
    assert claims.judge("ch3-fig3-plateau", model="m", stop=stop, plateau_from=stop or 32,
                        plateau_median=plateau_median).verdict == verdict


@pytest.mark.parametrize("gap, verdict", [(0.03, RC), (0.1, RC), (0.15, PR), (0.2, PR), (0.25, NR), (NAN, NR)])
def test_upper_tracks_max_rule(gap, verdict):
    assert claims.judge("ch3-fig3-upper-tracks-max", model="m", gap=gap).verdict == verdict


@pytest.mark.parametrize("late_max, verdict", [(0.5, RC), (0.85, RC), (0.86, NR), (1.0, NR), (NAN, NR)])
def test_four_fifths_cap_rule(late_max, verdict):
    assert claims.judge("ch3-four-fifths-cap", model="m", late_N=16, late_max=late_max,
                        late_share=0.0).verdict == verdict


def test_coverage_table_is_the_closed_form():
    table = sep_ch.coverage_table({"a": 0.8, "b": 0.5}, H_max=6)
    assert list(table.H) == list(range(1, 7))
    assert np.allclose(table.a, 1 - 0.2 ** table.H) and np.allclose(table.b, 1 - 0.5 ** table.H)
    assert claims.judge("ch3-multihead-coverage", model="synthetic", coverage=table.a[2], H=3, p_ours=0.5,
                        measured_on="m", H_ours=7).verdict == "holds"


def test_model_rowwise_with_an_encoders_all_true_mask_checks_every_row():
    """An encoder's rows see all L keys: no row is skipped for seeing too few keys, unlike the causal default."""
    gen = torch.Generator().manual_seed(3)
    L, d = 16, 4
    w = torch.softmax(torch.randn(1, 1, L, L, generator=gen, dtype=torch.float64), -1)
    x = torch.randn(1, 1, L, d, generator=gen, dtype=torch.float64)
    deltas = pd.Series({(0, 0): 0.0})
    enc = sep_ch.model_rowwise(w, x, deltas, [4], stride=2, mask=torch.ones(L, L, dtype=torch.bool))
    assert len(enc) == L // 2 and not enc.lower_violated.any()
    causal_w = torch.softmax(torch.randn(1, 1, L, L, generator=gen, dtype=torch.float64)
                             .masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), -torch.inf), -1)
    assert len(sep_ch.model_rowwise(causal_w, x, deltas, [4], stride=2)) == L // 2 - 2  # rows 1, 3 see <= 4
    assert "encoder" in sep_ch.measured_text("m", False, L, "")
