"""The setting chapter's helpers (attn_utils.book.chapters.setting) and the ledger chapter's
(attn_utils.book.chapters.reproducibility), on values known in advance."""
import json
import math
import re

import matplotlib
import pandas as pd
import pytest
import torch

from attn_utils.book import claims, figures
from attn_utils.book.chapters import reproducibility as repro
from attn_utils.book.chapters import setting
from attn_utils.mathematics import normalizers, registry

matplotlib.use("Agg")


def test_weights_table_is_the_normalizers_row_by_row():
    logits = torch.tensor([2.0, 0.0, -1.0, 0.5], dtype=torch.float64)
    table = setting.weights_table(logits, names=("softmax", "sparsemax"), Ts=(1.0, 0.5))
    assert len(table) == 2 * 2 * 4
    for (name, T), rows in table.groupby(["normalizer", "T"]):
        expected = registry.normalize(logits, name, T=T)
        assert rows.sort_values("key").weight.tolist() == pytest.approx(expected.tolist(), abs=1e-15)
    summary = setting.weights_summary(table)
    assert summary.loc[("softmax", 1.0), "total"] == pytest.approx(1.0)
    assert summary.loc[("softmax", 1.0), "nonzero"] == 4 and summary.loc[("sparsemax", 0.5), "nonzero"] == 1
    assert summary.loc[("softmax", 0.5), "largest"] > summary.loc[("softmax", 1.0), "largest"]


def test_layer_checks_and_heatmaps_on_a_known_layer():
    w = normalizers.softmax(torch.zeros(2, 5, 5, dtype=torch.float64), mask=normalizers.causal_mask(5))
    checks = setting.layer_checks(w, normalizers.causal_mask(5))
    assert checks["L_shown"] == 5 and checks["n_heads"] == 2 and checks["upper_max"] == 0
    assert checks["row_error"] < 1e-15
    assert checks["first_key_share"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 4)  # uniform rows t >= 2
    assert checks["uniform_first_share"] == pytest.approx(checks["first_key_share"])  # these rows are uniform
    assert checks["first_key_ratio"] == pytest.approx(1) and "no attention sink" in checks["sink_reading"]
    fig = setting.heatmaps(w, "test-model", heads=4)
    assert len([a for a in fig.axes if a.get_title().startswith("layer 0")]) == 2
    assert "test-model" in fig._suptitle.get_text()
    four = setting.heatmaps(normalizers.softmax(torch.zeros(4, 8, 8), mask=normalizers.causal_mask(8)), "m")
    panels = [a for a in four.axes if a.get_title().startswith("layer 0")]
    assert len({round(a.get_position().x0, 3) for a in panels}) == 2 and four.get_size_inches()[0] <= 7.5
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ["1", "2", "4", "6", "8"]  # positions from 1
    assert list(panels[0].get_xticks()) == [0, 1, 3, 5, 7]  # pixel p - 1 shows position p


def test_the_sink_reading_follows_the_comparison_with_the_uniform_share():
    uniform = sum(1 / t for t in range(2, 129)) / 127  # about 0.042 over 128 tokens
    assert "no attention sink" in setting.sink_reading(0.013, uniform) and "less than uniform" in \
        setting.sink_reading(0.013, uniform)
    assert "is an attention sink" in setting.sink_reading(0.5, uniform)
    assert "about what uniform" in setting.sink_reading(uniform * 1.5, uniform)
    w = torch.zeros(1, 4, 4, dtype=torch.float64)
    w[0, :, 0] = 1  # every row puts all its weight on the first token
    checks = setting.layer_checks(w, normalizers.causal_mask(4))
    assert checks["first_key_ratio"] == pytest.approx(3 / (1 / 2 + 1 / 3 + 1 / 4))


def test_layer_checks_and_heatmaps_of_an_encoder_mask_nothing():
    """An encoder's rows see every key: no weight is on a hidden key, nothing is hatched, the title says so; with the
    causal mask given for the same full rows, the weights above the diagonal are found."""
    w = normalizers.softmax(torch.zeros(2, 4, 4, dtype=torch.float64))  # uniform over all 4 keys
    everything = torch.ones(4, 4, dtype=torch.bool)
    assert setting.layer_checks(w, everything)["upper_max"] == 0
    assert setting.layer_checks(w, normalizers.causal_mask(4))["upper_max"] == pytest.approx(0.25)
    fig = setting.heatmaps(w, "enc", visible=everything)
    assert "bidirectional" in fig._suptitle.get_text()
    assert not any(p.get_hatch() for a in fig.axes for p in a.patches)


def test_the_masked_region_is_exactly_the_cells_above_the_diagonal():
    L = 7
    region = setting.masked_region(L).get_path()
    centres = [(j, t) for t in range(L) for j in range(L)]  # (x = key j, y = query t)
    inside = region.contains_points(centres).reshape(L, L)
    assert (inside == torch.ones(L, L, dtype=torch.bool).triu(1).numpy()).all()


def test_weights_figure_has_two_columns_and_the_normalizer_colours():
    logits = torch.tensor([2.0, 0.0, -1.0, 0.5], dtype=torch.float64)
    fig = setting.weights_figure(setting.weights_table(logits, Ts=(1.0, 0.25)))
    assert len(fig.axes) == len(setting.SHOWN) and fig.get_size_inches()[0] <= 7.5
    assert len({round(a.get_position().x0, 3) for a in fig.axes}) == 2
    for ax, name in zip(fig.axes, setting.SHOWN):
        assert ax.get_title() == registry.get(name).label and len(ax.patches) == 2 * 4
        assert all(matplotlib.colors.same_color(bar.get_facecolor()[:3], figures.NORMALIZER_COLOURS[name])
                   for bar in ax.patches)


@pytest.fixture
def build_records(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_COMPANION_RUN_DIR", str(tmp_path))
    return tmp_path


def test_the_ledger_chapter_refuses_an_empty_build(build_records):
    with pytest.raises(RuntimeError, match="no claims were recorded"):
        repro.ledger()


def test_summary_counts_and_table_1(build_records):
    for i, verdict in enumerate(["holds", "holds", "fails", "not reproduced"]):
        row = {"key": f"ch9-{i}", "chapter": "ch9", "claim": "c", "paper": "p", "ours": "o", "verdict": verdict,
               "model": "synthetic" if i < 3 else "smollm2-135m", "rule": "r", "note": "", "values": {},
               "notebook": "ch9"}
        (build_records / "claims").mkdir(exist_ok=True)
        (build_records / "claims" / f"ch9-{i}.json").write_text(json.dumps(row))
    rows = repro.ledger()
    s = repro.summary(rows)
    assert (s["n_claims"], s["n_holds"], s["n_fails"], s["n_not_reproduced"], s["n_reproduced"]) == (4, 2, 1, 1, 0)
    assert s["ledger_models"] == "smollm2-135m" and s["ledger_model_is_paper"].startswith("none of them is the paper's")
    handles, labels = repro.verdict_figure(rows).axes[0].get_legend_handles_labels()
    assert set(labels) == {"holds", "fails", "not reproduced"}
    assert all(matplotlib.colors.same_color(h.patches[0].get_facecolor(), repro.figures.VERDICT_COLOURS[label])
               for h, label in zip(handles, labels))  # one colour per verdict, as in the badges
    (build_records / "timings").mkdir()
    for name, seconds in (("Algorithm 1", 2.0), ("Algorithm 2", 3.0), ("Algorithm 4", 6.0)):
        (build_records / "timings" / f"{name}.json").write_text(
            json.dumps({"algorithm": name, "notebook": "x", "seconds": seconds}))
    table = repro.table1().set_index("algorithm")
    assert table.loc["Algorithms 1-2", "ours (s)"] == 5.0 and table.loc["Algorithms 1-2", "paper / ours"] == 732
    assert table.loc["Algorithm 4", "paper / ours"] == 70 and table.loc["Algorithm 5", "ours (s)"] == "not run"
    assert table.loc["Algorithm 3", "ours (s)"] == "not run" and math.isnan(table.loc["Algorithm 3", "paper / ours"])
    totals = repro.totals(repro.table1())
    assert totals["ours_total_s"] == 11 and totals["paper_total_h"] == (24 + 37 + 17 * 60 + 4 + 7 + 1) / 60
    assert set(claims.VERDICTS) <= set(repro.figures.VERDICT_COLOURS)
    assert len(set(repro.figures.VERDICT_COLOURS.values())) == len(repro.figures.VERDICT_COLOURS)


LEDGER_9 = ("ch9-a:\n  section: ch1-model\n  claim: weights <vanish>\n  glance: 'weights vanish like $1/L$'\n"
            "  brief: 'slope {s:.2f}'\n"
            "  paper: like 1/L\n  ours: 'slope {s}'\n"
            "  rule: [reproduced if s < -0.8, otherwise not reproduced]\n  headline: true\n"
            "ch9-b:\n  claim: a lemma\n  glance: Lemma 9\n  brief: '{v} violations'\n  paper: bound\n  ours: '{v}'\n"
            "  rule: [holds if v == 0, otherwise fails]\n"
            "ch9-c:\n  claim: a bound\n  glance: 'Bound: $x \\le 1$'\n  brief: '{max(x)} > 1'\n  paper: bound\n"
            "  ours: '{x}'\n  rule: [holds if max(x) <= 1, otherwise fails]\n")


def judged_9(monkeypatch, tmp_path, chapter: str, *cases: tuple[str, str, dict]):
    """The rows of :data:`LEDGER_9` stated as ``chapter``'s claims, judged per ``(key, model, values)``, in a build
    of the models m and n."""
    (tmp_path / f"{chapter}.yml").write_text(LEDGER_9)
    original = claims.specs
    monkeypatch.setattr(claims, "specs", lambda: original(tmp_path))
    monkeypatch.setattr(repro, "models", lambda rows=None: ("m", "n"))
    return pd.DataFrame([claims.judge(key, model=model, **values).__dict__ for key, model, values in cases])


def test_glance_lists_headline_and_failing_claims_with_badges_that_link_to_the_ledger(monkeypatch, tmp_path):
    rows = judged_9(monkeypatch, tmp_path, "ch9_test", ("ch9-a", "m", {"s": -0.1234}), ("ch9-a", "n", {"s": -0.9}),
                    ("ch9-b", "synthetic", {"v": 0}), ("ch9-c", "synthetic", {"x": [0.5, 2.25]}))
    table = repro.glance(rows)
    assert table.count("<tr>") == 3  # the header, the headline claim, the claim that fails; not the lemma that holds
    assert "Lemma 9" not in table
    assert '<a href="../notebooks/ch9_test.html#ch1-model">weights vanish like <span class="math notranslate ' \
           'nohighlight">\\(1/L\\)</span></a>' in table  # to the section that measures it
    link = "../notebooks/ch5_reproducibility.html#claim-ch9-a"
    assert f'<a class="verdict verdict-not-reproduced" href="{link}">not reproduced</a><br><small>slope -0.12' in table
    assert f'<a class="verdict verdict-reproduced" href="{link}">reproduced</a><br><small>slope -0.90' in table
    assert "<td>no</td>" in table and "same on every model?" in table  # the verdict depends on the model
    assert '<td colspan="2"><a class="verdict verdict-fails" href="../notebooks/ch5_reproducibility.html#claim-ch9-c' \
           '">fails</a><br><small>2.25 &gt; 1</small> <small>(synthetic data)</small>' in table
    monkeypatch.setattr(repro, "models", lambda rows=None: ("m",))
    assert "same on every model?" not in repro.glance(rows[rows.model != "n"])  # one model: nothing to compare
    counts = repro.verdict_counts(rows)
    assert counts == ('<p class="verdict-counts"><span class="verdict verdict-reproduced">reproduced</span> 1 '
                      '<span class="verdict verdict-not-reproduced">not reproduced</span> 1 '
                      '<span class="verdict verdict-holds">holds</span> 1 '
                      '<span class="verdict verdict-fails">fails</span> 1</p>')


def test_the_ledger_is_grouped_by_chapter_with_anchors_math_and_downloads(monkeypatch, tmp_path):
    import base64
    import io
    import json

    rows = judged_9(monkeypatch, tmp_path, "ch1_vanishing", ("ch9-a", "m", {"s": -0.1}), ("ch9-a", "n", {"s": -0.9}),
                    ("ch9-c", "synthetic", {"x": [0.5, 2.25]}))
    page = repro.ledger_html(rows)
    assert page.count('<tr class="chapter">') == 1
    assert '<a href="ch1_vanishing.html">Vanishing attention: Lemma 1 and Corollary 1</a>' in page  # its title
    assert ('<tr id="claim-ch9-a"><td><a href="ch1_vanishing.html#ch1-model"><strong>weights vanish like '
            '<span class="math') in page  # the statement links to the section that measures it
    assert "weights &lt;vanish&gt;" in page
    assert '<td colspan="2"><span class="verdict verdict-fails">fails</span><br><small>0.5, 2.25</small>' in page
    assert ("<br><small><em>the paper:</em> like 1/L</small><br><small><em>rule:</em> reproduced if s &lt; -0.8; "
            "otherwise not reproduced</small></td>") in page  # under the statement: four columns for three models
    links = dict(re.findall(r'download="([^"]+)" href="data:[^;]+(?:;charset=utf-8)?;base64,([^"]+)"',
                            repro.downloads(rows)))
    as_csv = pd.read_csv(io.StringIO(base64.b64decode(links["claims.csv"]).decode()))
    assert list(as_csv.columns) == repro.RECORD_FIELDS and list(as_csv.verdict) == list(rows.verdict)
    assert [json.loads(v) for v in as_csv["values"]] == list(rows["values"])
    as_json = json.loads(base64.b64decode(links["claims.json"]))
    assert as_json == rows[repro.RECORD_FIELDS].to_dict("records")
    items = repro.depend_list(rows)
    assert items.count("<li>") == 1 and 'href="../notebooks/ch5_reproducibility.html#claim-ch9-a"' in items
    assert "m: <span class=\"verdict verdict-not-reproduced\">" in items


def test_the_badges_of_the_first_page_use_the_figures_colours():
    from pathlib import Path

    css = (Path(__file__).resolve().parents[3] / "_static" / "verdicts.css").read_text()
    for verdict, colour in repro.figures.VERDICT_COLOURS.items():
        assert f".verdict-{verdict.replace(' ', '-')} {{ background: {colour}; }}" in css


def test_provenance_tables_and_the_ledger_table_for_reading(build_records):
    from attn_utils.book import runlog

    runlog.write("provenance", "ch9", {"notebook": "ch9", "model": "m", "requested": "auto", "weights_sha256": "a" * 64,
                                       "corpus": "c", "corpus_sha256": "b" * 64, "L": 64, "window_offsets": [0, 64],
                                       "seed": 0, "device": "cpu", "wall_time_s": 1.0})
    prov = repro.provenance()
    assert list(prov.columns) == list(dict.fromkeys(repro.PROVENANCE_WHAT + repro.PROVENANCE_HOW))
    assert prov.loc[0, "weights sha256"] == "a" * 16 and prov.loc[0, "offsets"] == "0, 64"
    rows = pd.DataFrame([{"key": "ch9-a", "verdict": "fails", "chapter": "ch9", "claim": "E -> A for N << L",
                          "glance": "E -> A", "paper": "p", "ours": "o", "rule": "r", "model": "synthetic"}])
    page = repro.ledger_html(rows)
    assert "N &lt;&lt; L" in page and '<span class="verdict verdict-fails">fails</span>' in page
    assert '<a href="ch9.html">ch9</a>' in page  # a chapter without a notebook: its name


def test_the_uniform_share_of_an_encoder_is_one_over_l():
    w = torch.zeros(1, 4, 4, dtype=torch.float64)
    w[0, :, 0] = 1
    checks = setting.layer_checks(w, torch.ones(4, 4, dtype=torch.bool))
    assert checks["uniform_first_share"] == pytest.approx(1 / 4) and checks["first_key_ratio"] == pytest.approx(4)
