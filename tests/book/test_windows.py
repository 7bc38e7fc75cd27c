"""``attn-companion windows``: the choice of windows, the aggregation across them, the command's argument errors, a
tiny real run on a local Dask cluster, and the ledger's "stable across K windows" column."""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from attn_utils import cli
from attn_utils.book import build, claims, runlog, sweep, windows
from attn_utils.book.chapters import reproducibility as repro


# --- the windows ------------------------------------------------------------------------------------------------

def reference_starts(k: int, n: int) -> list[int]:
    """Slow obvious reference: window j starts after the largest m with m * k <= j * n chapters."""
    starts = []
    for j in range(k):
        m = 0
        while (m + 1) * k <= j * n:
            m += 1
        starts.append(m + 1)
    return starts


def test_eight_windows_of_war_and_peace():
    assert windows.choose_windows(8, 365) == [1, 46, 92, 137, 183, 229, 274, 320]
    assert windows.choose_windows(1, 365) == [1]
    assert windows.choose_windows(365, 365) == list(range(1, 366))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 600).flatmap(lambda n: st.tuples(st.integers(1, n), st.just(n))))
def test_windows_are_distinct_increasing_in_range_and_deterministic(kn):
    k, n = kn
    starts = windows.choose_windows(k, n)
    assert starts == reference_starts(k, n) == windows.choose_windows(k, n)
    assert len(starts) == k and starts[0] == 1 and starts[-1] <= n
    assert all(a < b for a, b in zip(starts, starts[1:]))
    gaps = np.diff(starts + [n + 1])  # evenly spread: the runs of chapters differ in length by at most one
    assert gaps.max() - gaps.min() <= 1


@pytest.mark.parametrize("k", [0, -1, 366, 1000, 2.0, True])
def test_a_number_of_windows_outside_1_to_the_chapters_is_refused(k):
    with pytest.raises(ValueError, match=r"--windows must be an integer between 1 and 365 \(the chapters"):
        windows.choose_windows(k, 365)


def test_a_corpus_without_chapters_is_refused():
    with pytest.raises(ValueError, match="no chapters"):
        windows.choose_windows(2, 0)


# --- the aggregation --------------------------------------------------------------------------------------------

def rec(key: str, verdict: str, model: str = "gpt2", **values) -> dict:
    return {"key": key, "chapter": claims.specs()[key].chapter, "verdict": verdict, "model": model, "values": values}


def test_aggregate_stable_unstable_missing_and_spread():
    records = [
        [rec("ch1-vanishing-model", "reproduced", slope=-0.9, heads=144, L=1024),
         rec("ch3-fig3-decline", "reproduced", drop=0.5, note="text"),
         rec("ch1-corollary1-model", "holds", violations=0, tight_upper=0.2)],
        [rec("ch1-vanishing-model", "reproduced", slope=-1.1, heads=144, L=1024),
         rec("ch3-fig3-decline", "not reproduced", drop=0.1, note="text"),
         rec("ch1-corollary1-model", "holds", violations=0, tight_upper=0.4)],
        [rec("ch1-vanishing-model", "reproduced", slope=-0.7, heads=144, L=1024),
         rec("ch3-fig3-decline", "reproduced", drop=0.6, note="text")],  # ch1-corollary1-model: run failed
    ]
    out = {c["key"]: c for c in windows.aggregate(records)}
    assert [c["key"] for c in windows.aggregate(records)] == ["ch1-corollary1-model", "ch1-vanishing-model",
                                                              "ch3-fig3-decline"]  # chapter, then key
    slope = out["ch1-vanishing-model"]
    assert slope["stable"] and slope["seen"] == ["reproduced"] and slope["verdicts"] == ["reproduced"] * 3
    assert slope["headline"] == "slope"  # the rule: reproduced if -1.2 <= slope <= -0.5
    assert slope["values"]["slope"] == {"median": -0.9, "min": -1.1, "max": -0.7, "per_window": [-0.9, -1.1, -0.7]}
    assert slope["values"]["heads"]["min"] == slope["values"]["heads"]["max"] == 144
    decline = out["ch3-fig3-decline"]
    assert not decline["stable"] and decline["seen"] == ["reproduced", "not reproduced"]
    assert "note" not in decline["values"]  # not a number
    assert decline["values"]["drop"]["median"] == 0.5
    missing = out["ch1-corollary1-model"]
    assert missing["verdicts"] == ["holds", "holds", None] and not missing["stable"] and missing["seen"] == ["holds"]
    assert missing["headline"] == "violations"
    assert missing["values"]["tight_upper"] == {"median": pytest.approx(0.3), "min": 0.2, "max": 0.4,
                                                "per_window": [0.2, 0.4, None]}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=12))
def test_median_and_spread_match_numpy(xs):
    records = [[rec("ch1-vanishing-model", "reproduced", slope=x)] for x in xs]
    (c,) = windows.aggregate(records)
    s = c["values"]["slope"]
    assert s["median"] == pytest.approx(float(np.median(xs)), rel=1e-12, abs=1e-9)
    assert (s["min"], s["max"]) == (min(xs), max(xs)) and s["per_window"] == xs


def fake_result(claim_rows: list[dict], k: int) -> dict:
    starts = windows.choose_windows(k, 365)
    return {"K": k, "n_chapters": 365, "windows": [{"chapter": c, "title": f"T{c}", "chapters": [c, 365],
                                                   "offset": 0} for c in starts],
            "claims": claim_rows}


def test_csv_has_one_row_per_claim_with_each_windows_verdict_and_the_spread():
    records = [[rec("ch1-vanishing-model", v, slope=s)] for v, s in
               [("reproduced", -0.9), ("partly reproduced", -0.4), ("reproduced", -1.0)]]
    frame = windows.table(fake_result(windows.aggregate(records), 3))
    assert list(frame.columns) == ["claim", "chapter", "measured_on", "stable", "verdict_ch1", "verdict_ch122",
                                   "verdict_ch244", "headline", "slope_median", "slope_min", "slope_max"]
    row = frame.iloc[0]
    assert (row.stable, row.verdict_ch122, row.slope_median, row.slope_min) == (False, "partly reproduced", -0.9, -1.0)


def test_load_refuses_what_is_not_a_windows_result(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        windows.load(tmp_path / "nothing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not a JSON file"):
        windows.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"claims": []}))
    with pytest.raises(ValueError, match="not a result of `attn-companion windows`"):
        windows.load(tmp_path / "other.json")
    short = fake_result(windows.aggregate([[rec("ch1-vanishing-model", "reproduced", slope=-1.0)]]), 2)
    (tmp_path / "short.json").write_text(json.dumps(short))
    with pytest.raises(ValueError, match="'ch1-vanishing-model' lacks its verdicts in 2 windows"):
        windows.load(tmp_path / "short.json")


# --- the command's argument errors, before any work -------------------------------------------------------------

@pytest.fixture
def no_work(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("work started")
    monkeypatch.setattr(sweep, "sweep", refuse)
    monkeypatch.setattr(build, "build_book", refuse)


@pytest.mark.parametrize("argv, message", [
    (["--windows", "366"], "--windows must be an integer between 1 and 365"),
    (["--windows", "0"], "--windows must be an integer between 1 and 365"),
    (["-p", "chapters", "[1,2]"], "-p chapters: windows sets chapters"),
    (["-p", "offset", "5"], "-p offset: windows sets chapters"),
    (["-p", "colour", "red"], "-p colour: none of"),
    (["--notebooks", "ch0_setting"], "'ch0_setting' is not a model chapter"),
    (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], "--workers sizes the local cluster"),
    (["--workers", "0"], "--workers must be an integer >= 1"),
    (["-p", "model", "gpt2-random", "-p", "L", "4096"], "L must be at most the model's context of 1024"),
    (["-p", "n_trials", "0"], "parameter n_trials must be an integer >= 1"),
])
def test_windows_argument_errors_before_any_work(argv, message, tmp_path, capsys, no_work):
    out = tmp_path / "w"
    assert cli.main(["windows", "--out", str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_book_with_a_missing_windows_file_stops_before_building(tmp_path, capsys, no_work):
    assert cli.main(["book", "--out", str(tmp_path / "html"), "--windows", str(tmp_path / "w.json")]) == 2
    assert "--windows" in capsys.readouterr().err


def test_the_result_is_passed_to_the_build(tmp_path, monkeypatch):
    result = fake_result(windows.aggregate([[rec("ch1-vanishing-model", "reproduced", slope=-1.0)]] * 2), 2)
    path = tmp_path / "windows.json"
    path.write_text(json.dumps(result))
    seen = {}
    monkeypatch.setattr(build, "build_book", lambda parameters, **kw: seen.update(kw) or build.BookResult(
        tmp_path, tmp_path, {}))
    assert cli.main(["book", "--out", str(tmp_path / "html"), "--windows", str(path)]) == 0
    assert seen["windows"] == result
    assert cli.main(["book", "--out", str(tmp_path / "html")]) == 0
    assert seen["windows"] is None  # the default build: one window


# --- a tiny real run ----------------------------------------------------------------------------------------------

TINY = ["-p", "model", "gpt2-random", "-p", "L", "32", "-p", "synthetic_lengths", "[4,16]", "-p", "n_trials", "4",
        "-p", "Ts", "[1.0]"]


@pytest.mark.slow
def test_two_windows_of_ch1_on_a_local_cluster(tmp_path, capsys):
    out = tmp_path / "w"
    argv = ["windows", "--windows", "2", "--notebooks", "ch1_vanishing", "--workers", "2", "--out", str(out), *TINY]
    assert cli.main(argv) == 0
    said = capsys.readouterr().out
    assert "local Dask cluster: 2 worker processes" in said and "127.0.0.1" in said
    result = windows.load(out / "windows.json")
    assert result["K"] == 2 and [w["chapter"] for w in result["windows"]] == [1, 183]
    assert result["windows"][1]["title"].startswith("BOOK NINE") and result["windows"][1]["chapters"] == [183, 365]
    assert result["parameters"]["ch1_vanishing"] == {"n_trials": 4, "model": "gpt2-random", "L": 32,
                                                     "synthetic_lengths": [4, 16], "Ts": [1.0]}
    assert [r["status"] for r in result["runs"]["ch1_vanishing"]] == ["ok", "ok"]
    # every claim of ch1, each window's numbers read back from its own run folder
    by_key = {c["key"]: c for c in result["claims"]}
    assert set(by_key) == {k for k, s in claims.specs().items() if s.chapter == "ch1_vanishing"}
    for w, run in enumerate(result["runs"]["ch1_vanishing"]):
        params = json.loads((out / run["run"] / "params.json").read_text())
        assert params["chapters"] == result["windows"][w]["chapters"]
        for record in runlog.read("claims", out / run["run"]):
            c = by_key[record["key"]]
            assert c["verdicts"][w] == record["verdict"]
            for name, stats in c["values"].items():
                assert stats["per_window"][w] == float(record["values"][name])
    for c in by_key.values():
        assert c["stable"] == (len(set(c["verdicts"])) == 1)
        for stats in c["values"].values():
            assert stats["min"] <= stats["median"] <= stats["max"]
            assert stats["median"] == pytest.approx(statistics.median(stats["per_window"]))
    # the two windows read different text: the model's numbers differ, the synthetic ones do not
    assert len(set(by_key["ch1-vanishing-model"]["values"]["slope"]["per_window"])) == 2
    assert len(set(by_key["ch1-lemma1-synthetic"]["values"]["tightest"]["per_window"])) == 1
    frame = pd.read_csv(out / "windows.csv")
    assert set(frame.claim) == set(by_key) and {"verdict_ch1", "verdict_ch183"} <= set(frame.columns)
    assert (out / "ch1_vanishing" / "results.parquet").is_file()
    # the same command again skips both finished windows
    assert cli.main(argv) == 0
    assert "2 of 2 combinations already finished" in capsys.readouterr().out


# --- the ledger's column ----------------------------------------------------------------------------------------

def write_fake_records(folder: Path, across: dict | None) -> None:
    """A build's run records with three ledger rows: two model claims and a synthetic one."""
    for key, model, values in [("ch1-vanishing-model", "gpt2", dict(slope=-0.8, slope_with_token0=-0.3, heads=144,
                                                                   t_min=8, L=1024)),
                               ("ch3-fig3-decline", "gpt2", None),
                               ("ch1-lemma1-synthetic", "synthetic", dict(violations=0, rows=10, functions=5, L_min=2,
                                                                          L_max=64, tightest=0.99))]:
        if values is None:
            row = {"key": key, "chapter": "ch3_separability", "claim": "c", "paper": "p", "ours": "o",
                   "verdict": "reproduced", "model": model, "rule": "r", "note": "", "values": {}}
        else:
            row = asdict(claims.judge(key, model=model, **values))
        runlog.write("claims", key, {**row, "notebook": row["chapter"]}, folder=folder)
    if across is not None:
        runlog.write("windows", "windows", across, folder=folder)


def three_windows() -> dict:
    records = [[rec("ch1-vanishing-model", v, slope=s), rec("ch3-fig3-decline", d, drop=0.5),
                rec("ch1-lemma1-synthetic", "holds", model="synthetic", violations=0)]
               for v, s, d in [("reproduced", -0.8, "reproduced"), ("reproduced", -1.1, "not reproduced"),
                               ("reproduced", -0.6, "reproduced")]]
    return fake_result(windows.aggregate(records), 3)


def test_the_column_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv(runlog.RUN_DIR_ENV, str(tmp_path))
    write_fake_records(tmp_path, None)
    rows = repro.ledger()
    assert repro.windows() is None
    assert list(repro.wide(rows).columns) == ["chapter", "statement", "claim", "paper", "synthetic", "gpt2", "rule"]
    runlog.write("windows", "windows", three_windows())
    across = repro.windows()
    assert list(repro.wide(rows, across).columns)[-2:] == ["stable across 3 windows", "rule"]
    shown = repro.wide(rows, across)["stable across 3 windows"].tolist()
    assert "<th>stable across 3 windows</th>" in repro.ledger_html(rows, across)
    assert sorted(shown) == sorted(["", "yes; slope -0.8 [-1.1, -0.6]",
                                    "no: reproduced x2, not reproduced x1; drop 0.5 [0.5, 0.5]"])
    said = dict(zip(rows.key, repro.stability(rows, across)))
    assert said == {"ch1-vanishing-model": "yes; slope -0.8 [-1.1, -0.6]",
                    "ch3-fig3-decline": "no: reproduced x2, not reproduced x1; drop 0.5 [0.5, 0.5]",
                    "ch1-lemma1-synthetic": ""}
    note = repro.windows_summary(rows, across)["windows_note"]
    assert "1 of the 2 model claims measured there are stable" in note and "not measured there" not in note
    late = rows.assign(model=rows.model.where(rows.key != "ch3-fig3-decline", "smollm2-135m"))
    missing = {**across, "claims": [c for c in across["claims"] if c["key"] != "ch3-fig3-decline"]}
    note = repro.windows_summary(late, missing)["windows_note"]
    assert "1 of the 1 model claims measured there are stable" in note
    assert "1 model claims of ch3_separability were not measured there" in note


@pytest.mark.slow
def test_ch5_shows_the_column_when_the_build_has_a_windows_result(tmp_path):
    write_fake_records(tmp_path / "run", three_windows())
    out = tmp_path / "ch5.ipynb"
    src = build.NOTEBOOK_DIR / "ch5_reproducibility.py"
    build.execute_notebook(src, out, build.check_parameters(src, {}), run_dir=tmp_path / "run", progress=False)
    text = json.dumps(nbformat.read(out, as_version=4))
    assert "stable across 3 windows" in text and "yes; slope -0.8 [-1.1, -0.6]" in text
    assert "no: reproduced x2, not reproduced x1" in text
    assert "1 of the 2 model claims measured there are stable" in text  # the glued sentence
