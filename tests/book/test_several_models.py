"""Several models in one build (issue 19): the models of a build, each chapter on each model, claims per model, the
chapters' last section and the ledger's columns per model. Tiny records and fake architectures, no model loaded."""
import base64

import nbformat
import numpy as np
import pandas as pd
import pytest
import torch

from attn_utils.book import build, claims, compare, params, runlog
from attn_utils.book.chapters import reproducibility as repro
from attn_utils.book.params import ParameterError
from attn_utils.book.session import Session
from attn_utils.models.provenance import Provenance


def test_the_models_of_a_build(monkeypatch):
    assert params.book_models(["gemma3-270m", "minilm-l6"]) == ("gemma3-270m", "minilm-l6")
    assert params.book_models(model="gpt2-random") == ("gpt2-random",)
    asked = []
    monkeypatch.setattr(params._FactReader, "_auto", staticmethod(lambda: asked.append(1) or ("smollm2-135m", "x")))
    cache: dict = {}
    assert params.book_models("auto", cache=cache) == params.EMBEDDED_MODELS
    assert params.book_models("auto", cache=cache) == params.EMBEDDED_MODELS and asked == [1]  # the hub asked once
    monkeypatch.setattr(params._FactReader, "_auto", staticmethod(lambda: ("gpt2", "cached")))
    assert params.book_models("auto") == ("gpt2", *params.EMBEDDED_MODELS)
    for bad, message in ((["a", "a"], "distinct"), ([], "non-empty"), ("gpt2", "list"), (["auto"], "model names"),
                         ([3], "model names")):
        with pytest.raises(ParameterError, match=message):
            params.book_models(bad)
    with pytest.raises(ParameterError, match="not both"):
        params.book_models(["gpt2"], model="gpt2")


def test_bracketed_bare_words_read_as_a_list():
    assert build.parse_value("[smollm2-135m,minilm-l6]") == ["smollm2-135m", "minilm-l6"]
    assert build.parse_value("[1, 2]") == [1, 2] and build.parse_value("[1,") == "[1,"
    assert build.parse_value("[[a],b]") == "[[a],b]"  # nested bare words stay text (and are refused by a spec)


def test_another_model_reads_as_much_of_the_window_as_fits(monkeypatch):
    """resolve_on lowers L to the model's context, and the rules derive the rest from it (lengths above L dropped);
    the first model keeps L and is refused beyond its context."""
    monkeypatch.setattr(params._FactReader, "read", lambda self, name, known: {"context": 512}.get(name))
    q = params.resolve_on("minilm-l6", {"model": "auto", "L": 1024, "lengths": [256, 512, 1024], "N": 5})
    assert (q.model, q.L, q.lengths, q.given["L"]) == ("minilm-l6", 512, (256, 512), 512)
    assert params.resolve_on("minilm-l6", {"model": "auto", "L": 128}).L == 128
    with pytest.raises(ParameterError, match="at most the model's context of 512"):
        params.resolve({"model": "minilm-l6", "L": 1024})


def test_claims_are_recorded_per_model(tmp_path, monkeypatch):
    monkeypatch.setenv(runlog.RUN_DIR_ENV, str(tmp_path))
    spec = claims.ClaimSpec("ch9-a", "ch9_x", "claim a", "p", "{x}", claims.Rule.parse(["otherwise reproduced"]))
    monkeypatch.setattr(claims, "specs", lambda: {"ch9-a": spec})
    for model, x in (("m1", 1), ("org/m2", 2), ("m1", 3)):  # re-recording on m1 replaces its row
        claims.record("ch9-a", model=model, x=x)
    rows = claims.load()
    assert sorted(rows.model) == ["m1", "org/m2"] and len(list((tmp_path / "claims").glob("*.json"))) == 2
    assert rows.set_index("model").ours.to_dict() == {"m1": "3", "org/m2": "2"}


def _row(key, model, verdict, chapter="ch9_x", ours="x 1"):
    return {"key": key, "chapter": chapter, "claim": f"claim {key}", "paper": "p", "ours": ours, "verdict": verdict,
            "model": model, "rule": "r", "note": "", "values": {}, "notebook": chapter}


def test_which_verdicts_depend_on_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv(runlog.RUN_DIR_ENV, str(tmp_path))
    runlog.write("build", "models", {"models": ["b", "a"]})
    rows = pd.DataFrame([_row("k1", "a", "reproduced"), _row("k1", "b", "reproduced"),
                         _row("k2", "a", "reproduced"), _row("k2", "b", "not reproduced"),
                         _row("k3", "b", "reproduced"),  # not recorded on a: differs
                         _row("k4", claims.SYNTHETIC, "holds")])
    assert repro.models(rows) == ("b", "a")
    assert repro.depends(rows, ("b", "a")) == ["k2", "k3"] and repro.depends(rows, ("b",)) == []
    s = repro.summary(rows)
    assert (s["n_models"], s["n_model_keys"], s["n_depend"], s["n_same"], s["n_keys"]) == (2, 3, 2, 1, 4)
    assert "none of them is the paper's" in s["ledger_model_is_paper"]
    data = repro.wide(rows.assign(glance=rows.claim))
    assert list(data.columns) == ["chapter", "statement", "claim", "paper", "synthetic", "b", "a", "rule"]
    assert data.loc["k2", "b"] == "not reproduced: x 1" and data.loc["k3", "a"] == ""


def test_the_chapter_section_shows_every_model(tmp_path, monkeypatch):
    spec = claims.ClaimSpec("ch9-a", "ch9_x", "claim a", "p", "o", claims.Rule.parse(["otherwise reproduced"]))
    monkeypatch.setattr(claims, "specs", lambda: {"ch9-a": spec, "ch9-b": spec})
    records = [_row("ch9-a", "m1", "reproduced"), _row("ch9-a", "m2", "not reproduced", ours="x <2>"),
               _row("ch9-b", "m1", "reproduced"), _row("ch9-b", "m2", "reproduced"),
               _row("ch9-a", "other", "fails"), _row("ch9-a", claims.SYNTHETIC, "holds")]
    rows = compare.by_model(records, "ch9_x", ("m1", "m2"))
    assert list(rows) == ["ch9-a", "ch9-b"] and set(rows["ch9-a"]) == {"m1", "m2"}
    verdicts = {k: {m: r["verdict"] for m, r in per.items()} for k, per in rows.items()}
    assert claims.depend_on_model(verdicts, ("m1", "m2")) == ["ch9-a"]
    assert claims.depend_on_model(verdicts, ("m1",)) == []
    text = compare.section("ch9_x", ("m1", "m2"), records, {"m2": {"fig": "../_models/ch9_x/m2--fig.svg"}})
    assert "2 models: m1, m2" in text and "1 have the same verdict" in text and "x &lt;2&gt;" in text
    assert "one model" in compare.section("ch9_x", ("m1",), records, {})


def test_glued_figures_are_found_by_name(tmp_path):
    nb = nbformat.v4.new_notebook()
    png = base64.b64encode(b"\x89PNG fake").decode()
    nb.cells = [nbformat.v4.new_code_cell("", outputs=[
        nbformat.v4.new_output("display_data", data={"application/papermill.record/image/png": png},
                               metadata={"scrapbook": {"name": "fig_a",
                                                       "mime_prefix": "application/papermill.record/"}}),
        nbformat.v4.new_output("display_data", data={"image/svg+xml": "<svg/>"},
                               metadata={"scrapbook": {"name": "fig_b", "mime_prefix": ""}})])]
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    found = compare.glued_figures(path, ["fig_a", "fig_b"])
    assert found == {"fig_a": ("png", b"\x89PNG fake"), "fig_b": ("svg", b"<svg/>")}
    assert compare.glued_figures(tmp_path / "missing.ipynb", ["fig_a"]) == {}


def _session(arch: dict, L: int) -> Session:
    prov = Provenance(model="fake", architecture={"n_layers": 4, "n_heads": 2, "n_kv_heads": 2, "head_dim": 8,
                                                  "context_length": 4096, **arch})
    return Session(model=None, tokenizer=None, provenance=prov, corpus=None,
                   input_ids=torch.zeros(L, dtype=torch.long))


@pytest.mark.parametrize("arch, L, layers", [
    ({"causal": True, "sliding_layers": [], "sliding_window": None}, 1024, [0, 1, 2, 3]),
    ({"causal": True, "sliding_layers": [0, 1, 2], "sliding_window": 512}, 1024, [3]),
    ({"causal": True, "sliding_layers": [0, 1, 2], "sliding_window": 512}, 512, [0, 1, 2, 3]),
    ({"causal": False, "sliding_layers": [], "sliding_window": None}, 64, [0, 1, 2, 3]),
])
def test_the_layers_measured_see_their_whole_prefix(arch, L, layers):
    s = _session(arch, L)
    assert s.layers == layers and s.n_layers == len(layers)
    for layer in s.layers:  # every measured row sees its whole prefix, or every key on an encoder
        seen = s.visible(layer)
        want = torch.ones(L, L, dtype=torch.bool) if not arch["causal"] else torch.ones(L, L, dtype=torch.bool).tril()
        assert torch.equal(seen, want)
    assert ("only the 1 layers 3" in s.layers_note) == (layers == [3])
    assert s.causal == arch["causal"]


def test_an_encoder_has_no_longer_window():
    s = _session({"causal": False, "sliding_layers": [], "sliding_window": None}, 8)
    assert np.array_equal(s.visible(0).numpy(), np.ones((8, 8), dtype=bool))


def test_windows_sweep_claims_by_models_by_windows():
    """`attn-companion windows -p models [a,b]`: the grid takes each model; the verdicts across windows are kept
    per claim and model."""
    from attn_utils.book import windows

    _, starts, _, grids = windows.plan(2, ["ch3_separability"], {"models": ["smollm2-135m", "minilm-l6"]})
    assert grids["ch3_separability"]["model"] == ["smollm2-135m", "minilm-l6"] and len(starts) == 2
    rec = lambda model, verdict: {**_row("k", model, verdict), "values": {"x": 1.0}}  # noqa: E731
    out = windows.aggregate([[rec("a", "reproduced"), rec("b", "reproduced")],
                             [rec("a", "reproduced"), rec("b", "not reproduced")]])
    assert [(c["model"], c["stable"]) for c in out] == [("a", True), ("b", False)]


def test_a_run_on_another_model_checks_less_and_records_no_synthetic_claim(tmp_path, monkeypatch):
    monkeypatch.setattr(params._FactReader, "read", lambda self, name, known: {"context": 8192}.get(name))
    q = params.resolve_on("gemma3-270m", {"model": "auto", "L": 64, "n_trials": 3000, "N": 5}, notebook="ch2_distance")
    assert q.n_trials == params.SHORT_SYNTHETIC["ch2_distance"]["n_trials"] and q.facts["variant"] is True
    small = params.resolve_on("gemma3-270m", {"model": "auto", "L": 64, "n_trials": 20}, notebook="ch2_distance")
    assert small.n_trials == 20  # never more than asked
    assert "variant" not in params.resolve_on("gemma3-270m", {"model": "auto", "L": 64}).facts
    monkeypatch.setenv(runlog.RUN_DIR_ENV, str(tmp_path))
    spec = claims.ClaimSpec("ch9-a", "ch9_x", "c", "p", "o", claims.Rule.parse(["otherwise holds"]))
    monkeypatch.setattr(claims, "specs", lambda: {"ch9-a": spec})
    monkeypatch.setenv(runlog.VARIANT_ENV, "1")
    claims.record("ch9-a", model=claims.SYNTHETIC)
    claims.record("ch9-a", model="gemma3-270m")
    assert claims.load().model.tolist() == ["gemma3-270m"]


def test_a_model_whose_claims_are_all_not_comparable_shows_no_figure(monkeypatch):
    spec = claims.ClaimSpec("ch9-a", "ch9_x", "c", "p", "{x}", claims.Rule.parse(
        ["not comparable if not causal", "reproduced if x > 0", "otherwise not reproduced"]))
    monkeypatch.setattr(claims, "specs", lambda: {"ch9-a": spec})
    assert claims.judge("ch9-a", model="m", x=1, causal=True).verdict == "reproduced"
    assert claims.judge("ch9-a", model="enc", x=1, causal=False).verdict == "not comparable"
    records = [{**_row("ch9-a", "dec", "reproduced")}, {**_row("ch9-a", "enc", "not comparable")}]
    monkeypatch.setitem(compare.FIGURES, "ch9_x", {"fig": ("A title", "A description of what the figure draws")})
    text = compare.section("ch9_x", ("dec", "enc"), records, {"dec": {"fig": "a.svg"}, "enc": {"fig": "b.svg"}})
    assert "No figure is shown for enc" in text and "{figure} a.svg" in text and "b.svg" not in text
    assert ":alt: A description of what the figure draws, measured on dec" in text
    assert "A title, measured on dec." in text


@pytest.mark.parametrize("record, said", [
    ({"given": {"models": "auto"}, "models": ["smollm2-135m", "gemma3-270m"]},
     "could not be loaded on the machine that built this book (the technical reason is in"),
    ({"given": {"models": "auto"}, "models": ["gpt2", "smollm2-135m"]}, "GPT-2 small, the paper's own model, could be"),
    ({"given": {"models": ["minilm-l6", "gemma3-270m"]}, "models": ["minilm-l6", "gemma3-270m"]},
     "requested explicitly (models=['minilm-l6', 'gemma3-270m'])"),
    ({"given": {"model": "gemma3-270m"}, "models": ["gemma3-270m"]}, "one model (model='gemma3-270m')"),
])
def test_the_first_page_says_how_the_models_were_chosen(tmp_path, monkeypatch, record, said):
    monkeypatch.setenv(runlog.RUN_DIR_ENV, str(tmp_path))
    assert repro.chosen() == "This run was not part of a book build."
    runlog.write("build", "models", record)
    assert said in repro.chosen()
