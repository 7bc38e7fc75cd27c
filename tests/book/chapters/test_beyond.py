"""Chapter ch6_beyond's machinery (attn_utils.book.chapters.beyond), Session.longer, and the chapter's ledger rules.

The synthetic pipelines are checked against slow recomputations from the same random draws; the model pipelines
run on a tiny seeded GPT-2 (offline, random weights) at a small L and are checked against the model's own attention and
the library's metrics; every rule of the ledger file is checked on hand-made values against the verdicts it must
give.
"""
from __future__ import annotations

import math
import types

import numpy as np
import pandas as pd
import pytest
import torch

from attn_utils.book import claims
from attn_utils.book.chapters import beyond as ch6
from attn_utils.book.chapters.beyond import common
from attn_utils.book.chapters.beyond import gradient as ch6_gradient
from attn_utils.book.chapters.beyond import logits as ch6_logits
from attn_utils.book.formatting import fmt
from attn_utils.book.session import Session
from attn_utils.mathematics import algorithms, beyond, metrics, registry
from attn_utils.mathematics.normalizers import causal_mask

NAMES = list(registry.COMPARED)
L, LONG, PER_OCTAVE = 32, 64, 2


# --- Session.longer -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def session(tiny_gpt2):
    return Session.open(model=tiny_gpt2, L=L, offset=7)


def test_longer_window_extends_the_same_window(session, tiny_gpt2):
    longer = session.longer(LONG)
    assert longer.L == LONG and session.L == L and longer.model is session.model
    assert torch.equal(longer.input_ids[:L], session.input_ids)
    fresh = Session.open(model=tiny_gpt2, L=LONG, offset=7)
    assert torch.equal(longer.input_ids, fresh.input_ids)
    assert session.provenance.L == LONG and session.provenance.window_offsets == (7,)
    assert session.longer(L) is session


# --- synthetic pipelines ---------------------------------------------------------------------------------------------


def test_lemma1_synthetic_against_a_recomputation():
    lengths, n = [4, 64, 1024], 16
    res = ch6.lemma1_synthetic(NAMES, lengths, n, torch.Generator().manual_seed(3))
    assert res.envelope_violations == 0 and res.planted_violations == 0
    assert len(res.table) == len(lengths) * 2 * len(NAMES)
    assert res.escapes == {name: not registry.get(name).vanishes for name in NAMES}
    again = torch.Generator().manual_seed(3)
    for length in lengths:
        for family in beyond.FAMILIES:
            rows = beyond.synthetic_rows(family, n, length, common.A_SYN, common.GAP, again)
            expected = float(torch.softmax(rows, -1).amax(-1).median())
            got = res.table.set_index(["name", "family", "L"]).loc[("softmax", family, length), "max weight"]
            assert got == pytest.approx(expected, rel=1e-12)
    values = res.escape_claim()
    assert claims.judge("ch6-lemma1-escape", model="synthetic", **values).verdict == "holds"
    values["escapes"][0] = not values["escapes"][0]
    assert claims.judge("ch6-lemma1-escape", model="synthetic", **values).verdict == "fails"
    assert claims.judge("ch6-envelopes", model="synthetic", **res.envelope_claim()).verdict == "holds"


def test_geometry_synthetic_against_the_metrics():
    lengths, N, Ns, n = [16, 128], 3, [2, 6], 8
    res = ch6.geometry_synthetic(NAMES, lengths, N, Ns, n, torch.Generator().manual_seed(4))
    assert res.count_violations == 0 and set(res.table.name) == set(ch6.geometric(NAMES))
    assert set(res.table[res.table.L == 128].N) == {2, 3, 6} and set(res.table[res.table.L == 16].N) == {3}
    gen = torch.Generator().manual_seed(4)
    x = beyond.unit_vectors((common.N_SETS, 128), common.D_SYN, gen)
    logits = beyond.synthetic_rows("typical", common.N_SETS * 2, 128, common.A_SYN, common.GAP, gen)
    logits = logits.view(common.N_SETS, 2, 128)
    w = torch.softmax(logits[..., :16], -1)
    selected, _ = metrics.top_n_mask(w, N)
    distance = metrics.cumulative_distance(w, x[:, :16], selected)
    row = res.table.set_index(["name", "L", "N"]).loc[("softmax", 16, N)]
    assert row["distance"] == pytest.approx(float(distance.median()), rel=1e-10)
    separability, _ = metrics.separability(w, x[:, :16], N)
    assert row["separability"] == pytest.approx(float(separability.mean()), rel=1e-12)
    assert claims.judge("ch6-distance-count", model="synthetic", **res.claim()).verdict == "holds"


def test_gradient_synthetic_bounds_and_usable_gradients():
    res = ch6.gradient_synthetic(NAMES, [0.001, 0.1, 1.0], 12, torch.Generator().manual_seed(5))
    assert res.autograd_error < 1e-10 and res.bound_violations == 0
    norms = res.table.set_index(["name", "T"])["median norm"]
    for T in (0.1, 1.0):
        assert norms[("softmax", T)] <= 1 / (2 * T) and norms[("sparsemax", T)] in (0.0, pytest.approx(1 / T))
    assert res.keeps["self_adjust"] and not res.keeps["softmax"] and not res.keeps["sparsemax"]
    assert res.usable["softmax"] == pytest.approx(norms[("softmax", 0.001)] / norms.loc["softmax"].max())
    assert claims.judge("ch6-jacobians", model="synthetic", **res.claim()).verdict == "holds"


def test_norm_violations_are_counted():
    rows = beyond.synthetic_rows("typical", 4, 8, 2.0, generator=torch.Generator().manual_seed(0))
    big = torch.full((4,), 10.0, dtype=torch.float64)
    assert ch6_gradient._norm_violations("softmax", big, rows, 1.0) == 4
    zero = torch.zeros(4, dtype=torch.float64)
    assert ch6_gradient._norm_violations("sparsemax", zero, rows, 0.01) == 0   # one-key supports: J = 0
    assert ch6_gradient._norm_violations("sparsemax", zero, rows, 100.0) == 4  # full supports: ||J|| = 1/T, not 0
    assert ch6_gradient._norm_violations("self_adjust", big, rows, 1.0) == 0
    with pytest.raises(ValueError, match="unknown normalizer 'softmax2'"):  # not "no violations"
        ch6_gradient._norm_violations("softmax2", big, rows, 1.0)


# --- model pipelines on a tiny GPT-2 -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_run(tiny_gpt2):
    s = Session.open(model=tiny_gpt2, L=L)
    logits = ch6.capture_logits(s, [LONG], PER_OCTAVE)
    lemma = ch6.lemma1_model(logits, NAMES)
    geometry = ch6.geometry_model(logits, NAMES, 3, [2, 4])
    gradient = ch6.gradient_model(logits, NAMES, [0.01, 1.0], seed=0)
    return s, logits, lemma, geometry, gradient


def test_a_sample_that_would_not_fit_in_memory_is_refused_before_the_forward_pass(model_run, monkeypatch):
    s, logits, *_ = model_run
    arch = s.provenance.architecture
    kept = sum(b.logits.nbytes for g in logits.blocks.values() for b in g)  # the float64 logits the run holds
    need = ch6.lens_memory(arch, ch6_logits._row_sets(L, [LONG], PER_OCTAVE)[2])
    assert need == ch6_logits.LENS_MEMORY * kept
    every_row = ch6.capture_logits(s, [LONG], None)  # each row t <= L of the long window, measured
    kept_every_row = sum(b.logits.nbytes for g in every_row.blocks.values() for b in g)
    assert kept_every_row > kept
    assert logits.prose()["m_every_row_gib"] == fmt(ch6_logits.LENS_MEMORY * kept_every_row / 2**30)
    capture = ch6_logits.capture.capture
    forward = []
    monkeypatch.setattr(ch6_logits.capture, "capture", lambda *a, **k: forward.append(1))
    monkeypatch.setattr(ch6_logits.psutil, "virtual_memory", lambda: types.SimpleNamespace(available=need - 1))
    with pytest.raises(ValueError,
                       match=r"rows_per_octave=2 over a 64-token window needs about .* GiB of memory is available"):
        ch6.capture_logits(s, [LONG], PER_OCTAVE)
    assert not forward
    monkeypatch.setattr(ch6_logits.capture, "capture", capture)
    monkeypatch.setattr(ch6_logits.psutil, "virtual_memory", lambda: types.SimpleNamespace(available=need))
    again = ch6.capture_logits(s, [LONG], PER_OCTAVE)  # exactly what fits: the forward pass runs
    assert again.blocks.keys() == logits.blocks.keys()
    for group, blocks in logits.blocks.items():
        assert all(torch.equal(a.logits, b.logits) for a, b in zip(again.blocks[group], blocks, strict=True))


def test_captured_logits_are_the_models(model_run):
    s, logits, *_ = model_run
    assert logits.softmax_error < 1e-5 and logits.L_run == LONG and logits.long_lengths == [LONG]
    assert np.array_equal(logits.main_rows, algorithms.sample_rows(L, PER_OCTAVE)[0])
    assert logits.n_extra_rows == len(np.setdiff1d(algorithms.sample_rows(LONG, PER_OCTAVE)[0], logits.main_rows))
    full = s.longer(LONG).capture(what=("logits", "weights"), dtype=torch.float64)
    for block in logits.blocks["main"] + logits.blocks["extra"]:
        rows = torch.as_tensor(block.rows)
        expected = full.logits[:, :, rows, :block.K] * full.scaling.view(-1, 1, 1, 1)
        assert torch.allclose(block.logits, expected, rtol=1e-4, atol=1e-4)
        assert torch.equal(block.mask, causal_mask(block.K)[rows])
    assert logits.row_weights(L).sum() == L and logits.row_weights(LONG).sum() == LONG
    assert logits.row_weights(16).sum() == 16  # the complete octaves of the L sample


def test_lemma1_model_is_the_models_attention(model_run):
    s, logits, lemma, *_ = model_run
    weights = s.longer(LONG).capture(what=("weights",), dtype=torch.float64).weights
    soft = lemma.rows[lemma.rows.name == "softmax"].set_index(["layer", "head", "row"])
    extra = logits.blocks["extra"][-1].rows
    for layer, head, row in [(0, 0, 5), (1, 0, int(logits.main_rows[-1])), (1, 1, int(extra[-1]))]:
        w = weights[layer, head, row, :row + 1]
        assert soft.loc[(layer, head, row), "max"] == pytest.approx(float(w.max()), abs=1e-5)
        assert soft.loc[(layer, head, row), "max, token 0 excluded"] == pytest.approx(float(w[1:].max()), abs=1e-5)
    assert set(lemma.curve.t) == set(np.concatenate([b.rows for bs in logits.blocks.values() for b in bs]) + 1)
    assert lemma.zeros["softmax"] == 0 and lemma.zeros["sparsemax"] > 0
    table = lemma.table()
    assert list(table.index) == [registry.get(n).label for n in NAMES]
    assert math.isfinite(lemma.continued_slope("softmax")) and math.isnan(lemma.continued_slope("nope"))


def test_geometry_model_against_the_metrics(model_run):
    s, logits, _, geometry, _ = model_run
    captured = s.capture(what=("weights", "v"), dtype=torch.float64)
    rows = geometry.rows[(geometry.rows.name == "softmax") & (geometry.rows.N == 2)].set_index(["layer", "head", "row"])
    for layer, head, row in [(0, 0, 5), (1, 1, int(logits.main_rows[-1]))]:
        w = captured.weights[layer, head, row:row + 1, :row + 1]
        x = captured.v[layer, head, :row + 1]
        ratio, _ = metrics.separability(w, x, 2)
        assert rows.loc[(layer, head, row), "separability"] == pytest.approx(float(ratio[0]), abs=1e-12)
        selected, _ = metrics.top_n_mask(w, 2)
        distance = metrics.cumulative_distance(w, x, selected)
        assert rows.loc[(layer, head, row), "distance"] == pytest.approx(float(distance[0]), rel=1e-4)
    # the per-head mean weights each sampled row by the rows it stands for
    weights = logits.row_weights(L)
    one = geometry.rows[(geometry.rows.name == "softmax") & (geometry.rows.N == 2) & (geometry.rows.layer == 1)
                        & (geometry.rows["head"] == 1)].dropna(subset=["separability"])
    expected = (one.separability * one.row.map(weights)).sum() / one.row.map(weights).sum()
    means = logits.head_means(geometry.rows[geometry.rows.N == 2], "separability", L)
    means = means.set_index(["name", "layer", "head"])
    assert means.loc[("softmax", 1, 1), "separability"] == pytest.approx(expected, rel=1e-12)
    assert geometry.route_error < 1e-9 and "self_adjust" not in geometry.names
    shares = geometry.rows[geometry.rows.N == 3]["count share"].dropna()
    assert len(shares) and (shares > 0).all()
    assert sorted(geometry.coverage_inputs) == [2, 4] and all(geometry.coverage_inputs[n] for n in (2, 4))


def test_gradient_model_and_summary(model_run):
    _, logits, lemma, geometry, gradient = model_run
    assert set(gradient.table.name) == set(NAMES) and set(gradient.table["T"]) == {0.01, 1.0}
    assert (gradient.table["max"] >= gradient.table["median"]).all()
    assert set(gradient.usable) == set(NAMES) and all(0 <= r <= 1 for r in gradient.usable.values())
    syn = ch6.lemma1_synthetic(NAMES, [4, 256], 8, torch.Generator().manual_seed(0))
    geo_syn = ch6.geometry_synthetic(NAMES, [8, 64], 3, [2, 4], 8, torch.Generator().manual_seed(0))
    grad_syn = ch6.gradient_synthetic(NAMES, [0.01, 1.0], 8, torch.Generator().manual_seed(0))
    table, sentences, both = ch6.summary(NAMES, syn, geo_syn, grad_syn, lemma, geometry, gradient)
    assert list(table.index) == [registry.get(n).label for n in NAMES]
    assert table.loc["self-adjust softmax", f"model: d~ at N={geometry.N}"] == "n/a (signed)"
    assert all(registry.get(n).label + ":" in sentences for n in NAMES) and "usable gradient" in both


def test_long_context_and_coverage(model_run):
    _, logits, lemma, geometry, _ = model_run
    long = ch6.long_context(logits, geometry)
    assert list(long.curves.L) == [L, LONG] and set(long.separability.Lp) == {L, LONG}
    assert long.N_plateau == 4 and math.isfinite(long.plateau(LONG)) and math.isnan(long.plateau(999))
    assert math.isnan(long.slope_below)  # a single length up to L
    ratio = long.curves.set_index("L").distance
    assert long.slope_above == pytest.approx(math.log(ratio[LONG] / ratio[L]) / math.log(2))
    prose = long.prose(lemma)
    assert "windows of 64 tokens" in prose["long_text"]
    coverage = ch6.coverage(logits, geometry, [2, 4], 20, seed=0)
    assert list(coverage.table.N) == [2, 4] and coverage.N == 4
    row = coverage.row
    assert 0 <= row["observed coverage"] <= 1 and 0 <= row["permutation p-value"] <= 1
    assert row["paper 1-(1-p)^H"] == pytest.approx(1 - (1 - row["mean p = N_s/N"]) ** logits.n_heads)
    assert len(coverage.phis) == 2 * logits.n_layers * logits.n_heads * (logits.n_heads - 1) // 2
    assert set(coverage.prose()) >= {"cov_N", "cov_formula_text", "phi_same"}
    for key, values in [("ch6-multihead-coverage", coverage.coverage_claim()),
                        ("ch6-heads-independent", coverage.independence_claim()),
                        ("ch6-long-distance", long.distance_claim()),
                        ("ch6-long-separability", long.separability_claim()),
                        ("ch6-ssmax-model", lemma.ssmax_claim()), ("ch6-sparse-model", lemma.sparse_claim())]:
        assert claims.judge(key, model="gpt2-random", **values).verdict in claims.VERDICTS


def test_a_model_without_longer_windows_is_not_comparable(model_run):
    _, logits, _, geometry, _ = model_run
    short = ch6.ModelLogits(**{**logits.__dict__, "long_lengths": [], "blocks": {"main": logits.blocks["main"]},
                                    "context": L})
    long = ch6.long_context(short, geometry)
    assert list(long.curves.L) == [L] and math.isnan(long.slope_above)
    for key, values in [("ch6-long-distance", long.distance_claim()),
                        ("ch6-long-separability", long.separability_claim())]:
        assert claims.judge(key, model="m", **values).verdict == "not comparable"
    assert "no window longer than L = 32 fits" in long.prose(ch6.Lemma1Model(NAMES, L, pd.DataFrame(),
                                                                                   pd.DataFrame()))["long_text"]


def test_independence_groups_share_no_key_value_head():
    smollm = ch6.heads.independence_groups([h // 3 for h in range(9)])
    assert smollm.tolist() == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert ch6.heads.independence_groups(list(range(12))).tolist() == [list(range(12))]  # MiniLM: no sharing
    assert ch6.heads.independence_groups([0, 0, 0, 0]).tolist() == [[0], [1], [2], [3]]  # Gemma: no pair
    with pytest.raises(ValueError, match="kv_head"):
        ch6.heads.independence_groups([0, 0, 1])


def test_coverage_test_between_heads_sharing_no_key_value_head(model_run):
    _, logits, _, geometry, _ = model_run
    H = logits.n_heads
    shared = ch6.ModelLogits(**{**logits.__dict__, "kv_head": [0] * H, "kv_heads": 1})
    row = ch6.coverage(shared, geometry, [4], 20, seed=0).row
    assert row["head pairs tested per layer"] == 0 and math.isnan(row["permutation p-value"])
    free = ch6.coverage(logits, geometry, [4], 20, seed=0)
    assert free.row["head pairs tested per layer"] == H * (H - 1) // 2
    assert row["observed coverage"] == free.row["observed coverage"]  # the coverage is that of all the heads
    verdict = claims.judge("ch6-heads-independent", model="m", **ch6.coverage(shared, geometry, [4], 20, 0)
                           .independence_claim()).verdict
    assert verdict == "not comparable"


def test_an_encoder_sees_every_key_and_is_not_comparable_on_t_slopes(model_run):
    _, logits, _, geometry, _ = model_run
    assert logits.seen([0, 5]).tolist() == [1, 6]
    K = logits.L
    main = [ch6.Block(b.rows, K, torch.zeros(*b.logits.shape[:2], len(b.rows), K, dtype=torch.float64),
                      torch.ones(len(b.rows), K, dtype=torch.bool)) for b in logits.blocks["main"]]
    enc = ch6.ModelLogits(**{**logits.__dict__, "long_lengths": [], "blocks": {"main": main}, "causal": False,
                             "values": logits.values[:, :, :K]})
    assert enc.seen([0, 5]).tolist() == [K, K]
    lem = ch6.lemma1_model(enc, ["softmax", "ssmax"])
    assert set(lem.rows.t) == {K}  # every row has the same L keys
    soft = lem.rows[lem.rows.name == "softmax"]
    assert np.allclose(soft["max"], 1 / K)  # zero logits over all K keys: uniform weights
    assert claims.judge("ch6-ssmax-model", model="m", **lem.ssmax_claim()).verdict == "not comparable"
    long = ch6.long_context(enc, ch6.geometry_model(enc, ["softmax"], 4, [2, 4]))
    assert not len(long.curves)
    assert claims.judge("ch6-long-distance", model="m", **long.distance_claim()).verdict == "not comparable"
    assert "encoder" in long.prose(lem)["long_text"]


# --- what the chapter shows: figures that fit the text column, tables that fit it too ---------------------------------


def test_figures_have_two_panels_at_most_and_one_legend_below(model_run):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    _, logits, lemma, geometry, gradient = model_run
    syn = ch6.lemma1_synthetic(NAMES, [4, 64], 4, torch.Generator().manual_seed(0))
    geo_syn = ch6.geometry_synthetic(NAMES, [8, 64], 3, [2, 4], 8, torch.Generator().manual_seed(0))
    grad_syn = ch6.gradient_synthetic(NAMES, [0.01, 1.0], 8, torch.Generator().manual_seed(0))
    long = ch6.long_context(logits, geometry)
    coverage = ch6.coverage(logits, geometry, [2, 4], 8, seed=0)
    drawn = [ch6.plot_lemma1_synthetic(syn, 0), ch6.plot_distance_synthetic(geo_syn, 0),
             ch6.plot_separability_synthetic(geo_syn, 0), ch6.plot_gradient_synthetic(grad_syn, 0),
             ch6.plot_lemma1_model(lemma, logits, "c"), ch6.plot_geometry_model(geometry, logits, "c"),
             ch6.plot_gradient_model(gradient, logits, 0), ch6.plot_long_context(long, "c"),
             ch6.plot_coverage(coverage, "c", 0)]
    for fig in drawn:
        assert len(fig.axes) <= 2 and fig.get_figwidth() <= 7.5
        assert not any(ax.get_legend() for ax in fig.axes) and len(fig.legends) == 1   # one legend, below
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert len(labels) == len(set(labels))
    normalizers = [t.get_text() for t in drawn[0].legends[0].get_texts()]
    assert normalizers[:len(NAMES)] == [registry.get(n).label for n in NAMES]
    lines = {line.get_label(): line.get_color() for line in drawn[0].axes[0].get_lines()}
    assert all(matplotlib.colors.same_color(lines[registry.get(n).label], common.COLOR[n]) for n in NAMES)


def test_tables_fit_the_text_column(model_run):
    _, logits, lemma, geometry, gradient = model_run
    geo_syn = ch6.geometry_synthetic(NAMES, [8, 64], 3, [2, 4], 8, torch.Generator().manual_seed(0))
    order = [registry.get(n).label for n in ch6.geometric(NAMES)]
    for tables in (geo_syn.at_longest(), geometry.table()):
        assert len(tables) == 4
        for frame in tables.values():
            assert list(frame.index) == order and list(frame.columns) == ["N = 2", "N = 3", "N = 4"]
    distances = geometry.table()["On the model: median over heads of the per-head mean d̃"]
    assert distances.loc["softmax", "N = 2"] == geometry.at(2).loc["softmax", "distance"]
    medians = gradient.medians()
    assert list(medians.columns) == ["T = 0.01", "T = 1"] and list(medians.index) == [registry.get(n).label
                                                                                      for n in NAMES]
    assert medians.loc["softmax", "T = 1"] == gradient.table.set_index(["name", "T"]).loc[("softmax", 1.0), "median"]
    coverage = ch6.coverage(logits, geometry, [2, 4], 8, seed=0)
    shown = coverage.shown()
    assert list(shown.columns) == ["N = 2", "N = 4"] and shown.loc["observed coverage", "N = 4"] == \
        coverage.row["observed coverage"]
    assert shown.columns.name is None and shown.loc["rows", "N = 2"] == coverage.table.rows[0]
    syn = ch6.lemma1_synthetic(NAMES, [4, 64], 4, torch.Generator().manual_seed(0))
    assert list(syn.extremes().index) == [registry.get(n).label for n in NAMES]
    grad_syn = ch6.gradient_synthetic(NAMES, [0.01, 1.0], 8, torch.Generator().manual_seed(0))
    table, _, _ = ch6.summary(NAMES, syn, geo_syn, grad_syn, lemma, geometry, gradient)
    parts = ch6.summary_tables(table)
    assert len(parts) == 2 and all(len(p.columns) <= 6 for p in parts.values())
    assert pd.concat(parts.values(), axis=1).equals(table)


# --- the ledger's rules, on hand-made values --------------------------------------------------------------------------

NAN = float("nan")
RC, PR, NR, NC = "reproduced", "partly reproduced", "not reproduced", "not comparable"

RULE_CASES = {
    # not comparable if |softmax| <= 0.2; reproduced if |ssmax| <= 0.2; partly if ssmax > softmax + 0.2
    "ch6-ssmax-model": [({"ssmax": 0.0, "softmax": 0.2}, NC), ({"ssmax": 1.0, "softmax": -0.1}, NC),
                        ({"ssmax": 0.2, "softmax": -1.0}, RC), ({"ssmax": -0.2, "softmax": 0.5}, RC),
                        ({"ssmax": -0.5, "softmax": -1.0}, PR), ({"ssmax": 1.5, "softmax": 1.0}, PR),
                        ({"ssmax": -0.9, "softmax": -1.0}, NR), ({"ssmax": 0.5, "softmax": 1.0}, NR),
                        ({"ssmax": NAN, "softmax": 1.0}, NR), ({"ssmax": 0.0, "softmax": NAN}, RC)],
    # reproduced if self_adjust >= 0.1 and not softmax >= 0.1; partly if self_adjust > softmax
    "ch6-self-adjust-gradient": [({"self_adjust": 0.1, "softmax": 0.05}, RC),
                                 ({"self_adjust": 0.5, "softmax": NAN}, RC),
                                 ({"self_adjust": 0.5, "softmax": 0.1}, PR),
                                 ({"self_adjust": 0.05, "softmax": 0.01}, PR),
                                 ({"self_adjust": 0.2, "softmax": 0.3}, NR),
                                 ({"self_adjust": NAN, "softmax": 0.0}, NR)],
    # not comparable without a longer window or a finite slope; reproduced in [0.8, 1.2]; partly in [0.5, 1.5]
    "ch6-long-distance": [({"longer": False, "slope_above": 1.0}, NC), ({"longer": True, "slope_above": NAN}, NC),
                          ({"longer": True, "slope_above": float("inf")}, NC),
                          ({"longer": True, "slope_above": 0.8}, RC), ({"longer": True, "slope_above": 1.2}, RC),
                          ({"longer": True, "slope_above": 0.5}, PR), ({"longer": True, "slope_above": 1.5}, PR),
                          ({"longer": True, "slope_above": 0.49}, NR), ({"longer": True, "slope_above": 1.6}, NR),
                          ({"longer": True, "slope_above": -1.0}, NR)],
    # the same on at_L_run with [0.70, 0.85] and [0.60, 0.95]
    "ch6-long-separability": [({"longer": False, "at_L_run": 0.8}, NC), ({"longer": True, "at_L_run": NAN}, NC),
                              ({"longer": True, "at_L_run": 0.7}, RC), ({"longer": True, "at_L_run": 0.85}, RC),
                              ({"longer": True, "at_L_run": 0.6}, PR), ({"longer": True, "at_L_run": 0.95}, PR),
                              ({"longer": True, "at_L_run": 0.9}, PR), ({"longer": True, "at_L_run": 0.59}, NR),
                              ({"longer": True, "at_L_run": 0.96}, NR)],
    # reproduced if every zeros > 0.5 and every entropy < softmax's; partly if one of them is
    "ch6-sparse-model": [({"zeros": [0.6, 0.9], "entropies": [1.0, 2.0], "softmax_entropy": 2.5}, RC),
                         ({"zeros": [0.7], "entropies": [1.0], "softmax_entropy": 1.2}, RC),
                         ({"zeros": [0.6, 0.5], "entropies": [1.0, 2.0], "softmax_entropy": 2.5}, PR),
                         ({"zeros": [0.7, 0.9], "entropies": [1.0, 3.0], "softmax_entropy": 2.5}, PR),
                         ({"zeros": [0.3, 0.2], "entropies": [1.0, 3.0], "softmax_entropy": 2.5}, PR),
                         ({"zeros": [0.3, 0.2], "entropies": [3.0, 3.5], "softmax_entropy": 2.5}, NR),
                         ({"zeros": [0.5], "entropies": [2.5], "softmax_entropy": 2.5}, NR)],
    # reproduced if |observed - paper| <= 0.05; partly if |observed - independent| <= 0.05
    "ch6-multihead-coverage": [({"observed": 0.90, "paper": 0.93, "independent": 0.5}, RC),
                               ({"observed": 0.90, "paper": 0.80, "independent": 0.88}, PR),
                               ({"observed": 0.90, "paper": 0.96, "independent": 0.92}, PR),
                               ({"observed": 0.90, "paper": 0.80, "independent": 0.70}, NR),
                               ({"observed": NAN, "paper": 0.90, "independent": 0.90}, NR)],
    "ch6-heads-independent": [({"pvalue": 0.0}, NR), ({"pvalue": 0.005}, NR), ({"pvalue": 0.01}, RC),
                              ({"pvalue": 0.5}, RC), ({"pvalue": NAN}, NR)],
    # the causal-only claims on an encoder, and the independence of heads without a pair that shares no key/value head
    "ch6-ssmax-model:encoder": [({"causal": False, "ssmax": -1.0, "softmax": -1.0}, NC)],
    "ch6-long-distance:encoder": [({"causal": False, "longer": True, "slope_above": 1.0}, NC)],
    "ch6-long-separability:encoder": [({"causal": False, "longer": True, "at_L_run": 0.8}, NC)],
    "ch6-heads-independent:no-pairs": [({"pairs": 0, "pvalue": 0.5}, NC), ({"pairs": 0, "pvalue": 0.0}, NC)],
    "ch6-envelopes": [({"envelope_violations": 0, "planted_violations": 0}, "holds"),
                      ({"envelope_violations": 1, "planted_violations": 0}, "fails"),
                      ({"envelope_violations": 0, "planted_violations": 2}, "fails")],
    "ch6-jacobians": [({"autograd_error": 1e-16, "violations": 0}, "holds"),
                      ({"autograd_error": 1e-10, "violations": 0}, "fails"),
                      ({"autograd_error": 0.0, "violations": 1}, "fails")],
    "ch6-distance-count": [({"violations": 0}, "holds"), ({"violations": 3}, "fails")],
}


def rule(key):
    return claims.specs()[key].rule


@pytest.mark.parametrize("key", RULE_CASES)
def test_rules_give_the_expected_verdicts(key):
    """Each case on a causal model with pairs of heads that share no key/value head, unless it says otherwise."""
    for values, verdict in RULE_CASES[key]:
        assert rule(key.split(":")[0]).verdict({"causal": True, "pairs": 3, **values}) == verdict, values


def test_the_chapter_states_at_most_three_headline_claims():
    stated = [s for s in claims.specs().values() if s.chapter == "ch6_beyond"]
    assert len(stated) == 11 and sum(s.headline for s in stated) <= 3
