"""Chapter 4 (gradient sensitivity): the logit scale of Session.capture, and attn_utils.book.chapters.gradient
against closed forms, slow loops and the rules of its ledger file."""
import ast
import math
import string

import matplotlib
import numpy as np
import pandas as pd
import pytest
import torch

from attn_utils.book import claims
from attn_utils.book.chapters import gradient
from attn_utils.book.session import Session
from attn_utils.mathematics import algorithms

matplotlib.use("Agg")
F64 = torch.float64


# --- Session.capture(logit_scale=...) ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def session(tiny_gpt2):
    return Session.open(model=tiny_gpt2, L=24, seed=0)


@pytest.fixture(scope="module")
def eager(session):
    with torch.inference_mode():  # the base model: eager attentions without the LM head
        return session.model.base_model(input_ids=session.input_ids[None], output_attentions=True).attentions


@pytest.mark.parametrize("logit_scale", ["raw", "model"])
def test_softmax_of_the_logits_on_either_scale_is_the_eager_models_attention(session, eager, logit_scale):
    c = session.capture(what=("logits", "mask"), dtype=F64, logit_scale=logit_scale)
    assert len(c.layers) == len(eager)
    rebuilt = torch.softmax(c.logits / c.temperature[:, None, None, None] + c.mask[:, None], dim=-1)
    for layer, reference in enumerate(eager):
        assert (rebuilt[layer] - reference[0].double()).abs().max() <= 1e-5


def test_model_scale_is_the_raw_product_times_the_scaling_and_its_temperature_is_one(session):
    raw = session.capture(what=("q", "k", "logits"), dtype=F64)
    scaled = session.capture(what=("logits",), dtype=F64, logit_scale="model")
    head_dim = raw.q.shape[-1]
    assert torch.allclose(raw.scaling, torch.full_like(raw.scaling, head_dim ** -0.5))
    assert torch.allclose(raw.logits, raw.q @ raw.k.transpose(-1, -2), atol=1e-4)  # capture's own convention
    assert torch.equal(scaled.logits, raw.logits * raw.scaling[:, None, None, None])
    assert torch.equal(raw.temperature, 1 / raw.scaling)
    assert float(raw.temperature.median()) == pytest.approx(math.sqrt(head_dim))
    assert torch.equal(scaled.temperature, torch.ones(len(raw.layers), dtype=F64))


def test_model_scale_keeps_the_capture_dtype_and_other_fields(session):
    raw = session.capture(what=("logits", "weights"))
    scaled = session.capture(what=("logits", "weights"), logit_scale="model")
    assert scaled.logits.dtype == raw.logits.dtype == torch.float32
    assert torch.equal(scaled.weights, raw.weights) and scaled.layers == raw.layers
    assert session.capture(what=("weights",), logit_scale="model").logits is None


def test_an_unknown_logit_scale_is_refused(session):
    with pytest.raises(ValueError, match="logit_scale is 'raw' or 'model', got 'scaled'"):
        session.capture(what=("logits",), logit_scale="scaled")


# --- the motivating example --------------------------------------------------------------------------------------


def test_two_logit_example_against_closed_forms():
    eps = 1e-4
    table = gradient.two_logit_table(eps=eps, c=0.0, rest=(-1.0, -2.0))
    summary = gradient.two_logit_summary(table, eps=eps, c=0.0, rest=(-1.0, -2.0))
    assert len(table) == 41 and table["T"].min() == pytest.approx(1e-6) and table["T"].max() == pytest.approx(1e4)
    assert summary["ex_dist"] == pytest.approx(math.sqrt(5))
    # alpha = (1/2, 1/2): J h = (1/4) [[1, -1], [-1, 1]] (2, -1) = (3/4, -3/4), norm 3 sqrt(2) / 4
    assert summary["ex_sharp_constant"] == pytest.approx(3 * math.sqrt(2) / 4, rel=1e-12)
    # alpha uniform on 4 keys: J h = h / 4 - (sum h) / 16, h = (2, -1, 0, 0)
    assert summary["ex_flat_constant"] == pytest.approx(math.sqrt(0.4375 ** 2 + 0.3125 ** 2 + 2 * 0.0625 ** 2))
    # the proven bounds hold, and the change saturates at the simplex's diameter sqrt 2 when T << eps
    assert summary["ex_remainder_ratio"] <= 1 and summary["ex_change_ratio"] <= 1 + 1e-12
    assert summary["ex_change_smallT"] == pytest.approx(math.sqrt(2), rel=1e-9)
    lo, hi = summary["ex_ratio_lo"], summary["ex_ratio_hi"]
    assert summary["ex_flat_constant"] - 1e-3 <= lo <= hi <= summary["ex_sharp_constant"] + 1e-3
    fig = gradient.plot_two_logit(table)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert fig.axes[0].get_legend() is None and len(labels) == 3 and fig.get_figwidth() <= 7.5
    matplotlib.pyplot.close(fig)


def test_two_logit_rows_match_a_direct_computation():
    T, eps = 0.3, 1e-2
    row = gradient.two_logit_table(eps=eps, c=1.0, rest=(-3.0,), Ts=[T]).iloc[0]
    l1, l2 = torch.tensor([1 + eps, 1.0, -3.0], dtype=F64), torch.tensor([1 - eps, 1 + eps, -3.0], dtype=F64)
    a1, a2 = torch.softmax(l1 / T, -1), torch.softmax(l2 / T, -1)
    J = torch.autograd.functional.jacobian(lambda x: torch.softmax(x / T, -1), l2)
    assert row["change"] == pytest.approx(float((a1 - a2).norm()), rel=1e-12)
    assert row["first order"] == pytest.approx(float((J @ (l1 - l2)).norm()), rel=1e-10)
    assert row["change bound"] == pytest.approx(math.sqrt(5) * eps / (2 * T))


# --- random instances, Lemma 2, Corollary 3 ----------------------------------------------------------------------


def test_random_logits_of_each_kind():
    gen = torch.Generator().manual_seed(3)
    for kind in gradient.KINDS:
        l, T = gradient.random_logits(50, 6, kind, gen, log_T=(-1.0, 1.0))
        assert l.shape == (50, 6) and T.shape == (50, 1) and l.dtype == F64
        assert ((T >= math.exp(-1.0)) & (T <= math.exp(1.0))).all()
        if kind == "two tied maxima":
            assert torch.equal(l[:, 0], l[:, 1]) and torch.equal(l[:, 0], l.amax(-1))
        if kind == "one dominant":
            assert (l[:, 0] - l[:, 1:].amax(-1) >= 20 * T[:, 0] - 1e-9).all()


def test_spectral_norm_is_the_largest_singular_value():
    A = torch.randn(4, 5, 5, dtype=F64, generator=torch.Generator().manual_seed(1))
    assert np.allclose(gradient.spectral_norm(A), [float(torch.linalg.svdvals(a)[0]) for a in A])


def test_lemma2_check_holds_and_counts_right():
    check = gradient.lemma2_check(n_trials=30, seed=0)
    per_cell = 2  # 30 // (5 lengths x 3 kinds)
    assert len(check) == per_cell * len(gradient.LENGTHS) * len(gradient.KINDS) * len(gradient.NORMALIZERS)
    summary = gradient.lemma2_summary(check)
    assert summary["violations"] == 0 and summary["max_error"] < 1e-10 and summary["min_ratio"] >= 1
    assert summary["instances"] == 30 and summary["pairs"] == len(check)
    table = gradient.lemma2_table(check)
    assert set(table.normalizer) == set(gradient.NORMALIZERS) and (table["instances"] == 30).all()
    assert table["bound violated"].sum() == 0 and table["smallest bound / norm"].min() == summary["min_ratio"]
    # the normalizers' derivatives are right (against autograd), so the Jacobian check compares like with like
    l, theta = torch.linspace(-2, 2, 7, dtype=F64, requires_grad=True), (torch.tensor(0.7, dtype=F64), 2.0)
    for F, dF in gradient.NORMALIZERS.values():
        (grad,) = torch.autograd.grad(F(l, theta).sum(), l)
        assert torch.allclose(grad, dF(l.detach(), theta), rtol=1e-12)


def test_lemma2_summary_sees_a_violation():
    check = pd.DataFrame({"normalizer": ["softmax", "softplus"], "relative error": [0.0, 1e-3],
                          "norm": [2.0, 1.0], "bound": [1.0, 3.0]})
    check["bound / norm"] = check["bound"] / check["norm"]
    check["violated"] = check["norm"] > check["bound"]
    summary = gradient.lemma2_summary(check)
    assert summary["violations"] == 1 and summary["min_ratio"] == 0.5 and summary["max_error"] == 1e-3
    assert claims.judge("ch4-lemma2", model="synthetic", **gradient.claim_values("ch4-lemma2", summary)).verdict \
        == "fails"


def test_counterexample_against_closed_forms():
    table = gradient.counterexample_table()
    T = table["T"].to_numpy()
    assert np.allclose(table["spectral norm ||J||_2"], 1 / (2 * T), rtol=1e-12)
    assert np.allclose(table["norm / stated bound"], (1 / (2 * T)) / np.minimum(1 / (4 * T), math.sqrt(2)))
    summary = gradient.counterexample_summary(table)
    assert summary["norm"] == pytest.approx(5.0) and summary["stated"] == pytest.approx(math.sqrt(2))
    assert summary["quarter"] == pytest.approx(2.5) and summary["ratio_min"] == pytest.approx(2.0)
    verdict = claims.judge("ch4-corollary3-spectral", model="synthetic",
                           **gradient.claim_values("ch4-corollary3-spectral", summary)).verdict
    assert verdict == "fails"


def test_corollary3_check_against_a_slow_loop():
    eps = [1e-2, 1.0]
    check = gradient.corollary3_check(n_trials=15, epsilons=eps, seed=4)
    assert len(check) == 15 * len(eps) and set(check["eps"]) == set(eps)
    # replay the draws of the first cell (kind Gaussian, L = 2) and recompute one instance by hand
    gen = torch.Generator().manual_seed(5)
    l, T = gradient.random_logits(1, 2, "Gaussian", gen)
    a = torch.softmax(l[0] / T[0], -1)
    J = torch.autograd.functional.jacobian(lambda x: torch.softmax(x / T[0], -1), l[0])
    row = check.iloc[0]
    assert row["kind"] == "Gaussian" and row["L"] == 2 and row["T"] == pytest.approx(float(T))
    assert row["norm"] == pytest.approx(float(torch.linalg.matrix_norm(J, 2)), rel=1e-10)
    assert row["entry"] == pytest.approx(float(J.abs().max()), rel=1e-10)
    v = torch.randn(1, 2, dtype=F64, generator=gen)[0]
    v = v / v.norm()
    g = float((torch.softmax((l[0] + eps[0] * v) / T[0], -1) - a).norm() / eps[0])
    assert row["g"] == pytest.approx(g, rel=1e-10)
    summary = gradient.corollary3_summary(check)
    assert summary["norm_max"] <= 1 + 1e-12 and summary["entry_max"] <= 1 + 1e-12 and summary["fd_max"] <= 1 + 1e-12
    assert summary["instances"] == 15 and summary["pairs"] == 30 and summary["autograd_error"] < 1e-12
    table = gradient.corollary3_table(check)
    table = table.set_index("logits")
    assert table["instances"].sum() == 15 and table.loc["two tied maxima", "share with ‖J‖₂ above the stated bound"] > 0
    assert table["largest 2T‖J‖₂"].max() == summary["norm_max"]


# --- Figure 4 ----------------------------------------------------------------------------------------------------


def _summary(Ts, epsilons, g):
    """A summary of Algorithm 5 with g(T, eps) given."""
    from attn_utils.mathematics import theory
    rows = [{"T": T, "eps": e, "g": g(T, e)} for T in Ts for e in epsilons]
    frame = pd.DataFrame(rows)
    frame["corollary3_bound"] = [theory.corollary3_bound(T) for T in frame["T"]]
    frame["finite_difference_bound"] = [theory.finite_difference_bound(T, e) for T, e in zip(frame["T"], frame["eps"])]
    return frame


def _verdicts(found):
    return {key.removeprefix("ch4-fig4-"): claims.judge(key, model="m", **gradient.claim_values(key, found)).verdict
            for key in gradient.FIGURE4_CLAIMS}


TS = [1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0]
EPS = [1e-3, 1e-1, 10.0]


def test_findings_of_an_ideal_figure_4():
    # g = 0.2 / T: a 1/T law; below T = 1 slightly smaller for larger eps, from T = 1 on the same for every eps
    def f(e):
        return 1 - 0.01 * math.log10(e) - 0.03  # 1, 0.98, 0.96

    def g(T, e):
        return (0.2 / T) * (f(e) if T < 1 else 1.0)

    found = gradient.figure4_findings(_summary(TS, EPS, g), EPS, T_model=1.0, logit_scale="raw")
    assert np.allclose(found["slopes"], -1) and max(found["slope_misfit"]) < 1e-9
    assert found["order_hits"] == [True, True, True] and found["hits"] == 3 and found["n_low"] == 3
    assert found["spread"] == pytest.approx(1.0) and found["n_hot"] == 3
    assert (found["T_lo"], found["T_hi"]) == (0.1, 10.0) and max(found["grid_decades"]) < 1e-12
    assert np.allclose(found["drops"], [100 * f(e) for e in EPS])
    assert np.allclose(found["slopes_high"], -1) and found["T_high_min"] == 10.0
    assert found["ratio_max"] == pytest.approx(max(g(T, e) / min(1 / (4 * T), math.sqrt(2)) for T in TS for e in EPS))
    assert found["g_at_model"] == [g(1.0, e) for e in EPS] and found["T_min"] == 1e-3
    verdicts = _verdicts(found)
    assert verdicts == {"inverse-T": "reproduced", "eps-order": "reproduced", "collapse": "reproduced",
                        "drop": "reproduced", "under-dashed": "not reproduced", "close-to-limit": "reproduced"}


def test_findings_of_a_flat_figure_4():
    # saturated rows: g flat at small T, eps in the wrong order at one temperature, no drop, far below the bound
    def g(T, e):
        return 1e-4 * (2 if (T == 1e-2 and e == 10.0) else 1) * (1 + 0.5 * (T >= 1) * math.log10(e) ** 2)

    found = gradient.figure4_findings(_summary(TS, EPS, g), EPS, T_model=10.0, logit_scale="model")
    assert np.allclose(found["slope_misfit"], [abs(s + 1) for s in found["slopes"]])
    assert found["order_hits"] == [True, False, True] and found["hits"] == 2
    assert found["spread"] == pytest.approx((1 + 0.5 * 9) / 1.5) and found["valid_ok"]
    assert found["slopes_high"] == [] and found["T_high_min"] == 100.0  # only 100 >= 10 x 10: no slope
    assert _verdicts(found) == {"inverse-T": "not reproduced", "eps-order": "partly reproduced",
                                "collapse": "not reproduced", "drop": "not reproduced",
                                "under-dashed": "reproduced", "close-to-limit": "not reproduced"}


def test_findings_say_not_comparable_when_the_grid_lacks_the_temperatures():
    Ts = [3.0, 1000.0]
    found = gradient.figure4_findings(_summary(Ts, [0.1], lambda T, e: 1 / T), [0.1], T_model=3.0, logit_scale="raw")
    assert found["slopes"] == [] and found["n_low"] == 0 and math.isnan(found["close"])
    assert max(found["grid_decades"]) > 0.3
    verdicts = _verdicts(found)
    assert {k: verdicts[k] for k in ("inverse-T", "eps-order", "collapse", "drop", "close-to-limit")} == \
        dict.fromkeys(("inverse-T", "eps-order", "collapse", "drop", "close-to-limit"), "not comparable")


def test_a_slope_left_undefined_by_a_zero_g_counts_as_off_the_law():
    def g(T, e):
        return 0.0 if (e == 10.0 and T == 1e-3) else 0.25 / T

    found = gradient.figure4_findings(_summary(TS, EPS, g), EPS, T_model=1.0, logit_scale="raw")
    assert math.isnan(found["slopes"][2]) and found["slope_misfit"][2] == math.inf
    assert _verdicts(found)["inverse-T"] == "partly reproduced"


def test_top_two_gaps_against_a_loop():
    logits = torch.randn(2, 3, 7, 7, generator=torch.Generator().manual_seed(2))
    gaps = gradient.top_two_gaps(logits)
    expected = [float(torch.sort(logits[a, h, t, :t + 1], descending=True).values[:2].diff().neg())
                for a in range(2) for h in range(3) for t in range(1, 7)]
    assert gaps.dtype == F64 and np.allclose(gaps.numpy(), expected)


def test_figure_4_pipeline_on_a_random_model(session):
    captured = session.capture(what=("logits",), logit_scale="raw")
    T_model = float(captured.temperature.median())
    Ts = sorted({0.01, 0.1, 1.0, 10.0} | {T_model})
    summary = algorithms.gradient_sensitivity(captured.logits, Ts, epsilons=EPS, seed=0, progress=False).summary
    found = gradient.figure4_findings(summary, EPS, T_model, "raw")
    assert found["valid_ok"] and found["T_model"] == 4.0 and len(found["slopes"]) == len(EPS)  # sqrt(head_dim 16)
    assert gradient.temperature_range(captured.temperature) == "the same in every layer"
    for key in gradient.FIGURE4_CLAIMS:
        assert claims.judge(key, model=session.name, **gradient.claim_values(key, found)).verdict in claims.VERDICTS
    prose = gradient.figure4_prose(found)
    assert prose["fig4_scale"] == "raw" and prose["fig4_slopes"].startswith("ε=0.001: ")
    table = gradient.g_table(summary)
    assert list(table["T"]) == Ts and list(table.columns[1:]) == ["g at ε = 0.001", "g at ε = 0.1", "g at ε = 10"]
    assert table.set_index("T").loc[0.1, "g at ε = 10"] == summary.set_index(["T", "eps"]).loc[(0.1, 10.0), "g"]
    fig = gradient.plot_figure4(summary, T_model, "raw", session.name, L=session.L, heads=4)
    assert fig.axes[0].get_xscale() == "log" and session.name in fig._suptitle.get_text()
    assert fig.get_figwidth() <= 7.5 and fig.axes[0].get_legend() is None and len(fig.legends) == 1
    matplotlib.pyplot.close(fig)


# --- the ledger file ---------------------------------------------------------------------------------------------


def test_every_claim_of_the_chapter_is_stated_and_judged_on_the_values_it_names():
    stated = {key: spec for key, spec in claims.specs().items() if spec.chapter == "ch4_gradient"}
    assert set(stated) == set(gradient.CLAIM_VALUES)
    assert sum(spec.headline for spec in stated.values()) <= 3
    for key, spec in stated.items():
        names = set(gradient.CLAIM_VALUES[key])
        used = {node.id for _, condition in spec.rule.cases for node in ast.walk(ast.parse(condition, mode="eval"))
                if isinstance(node, ast.Name) and node.id not in claims._FUNCTIONS}
        fields = {field for _, field, _, _ in string.Formatter().parse(spec.ours) if field}
        assert used <= names and fields <= names, (key, used - names, fields - names)


def test_top_two_gaps_read_the_model_mask():
    """All-True mask (an encoder): every row's gap is over all L logits; the causal default skips row 0."""
    logits = torch.tensor([[[[0.0, 3.0, 1.0], [2.0, 0.5, 0.0], [1.0, 1.0, 4.0]]]])
    enc = gradient.top_two_gaps(logits, torch.ones(3, 3, dtype=torch.bool))
    assert enc.tolist() == [2.0, 1.5, 3.0]
    assert gradient.top_two_gaps(logits).tolist() == [1.5, 3.0]  # rows 1..2 of the causal prefix
