"""``attn-companion sweep`` on real Dask clusters: worker processes on 127.0.0.1, a failing combination, a worker
killed mid-sweep, a re-run that skips what finished, and ``--scheduler``.

The notebook swept is a fast chapter written here (FAST): Lemma 1 for softmax (C1 = e^{-2M}, C2 = e^{2M} for logits
in [-M, M]) on seeded synthetic rows, recorded as two real ledger claims, in about the time a kernel takes to
start. A book chapter takes 30 s to minutes per run at the smallest parameters, which is what
tests/book/test_book.py and tests/cli/test_documented_commands.py execute; here the cluster, the transport of results,
the table and the index are under test. Its failing combination is a value the preflight accepts and the
notebook cannot compute: M = 1000 overflows the textbook softmax exp(x_i) / sum_j exp(x_j) (numpy raises
FloatingPointError under ``errstate(over="raise")``).
"""
from __future__ import annotations

import base64
import json
import logging
import os
import signal
import socket
import textwrap
import threading
import time
from dataclasses import asdict
from pathlib import Path

import dask
import nbformat
import pandas as pd
import pytest
from distributed import Client, LocalCluster

from attn_utils import cli
from attn_utils.book import claims, sweep
from attn_utils.book.figures import VERDICT_COLOURS

FAST = textwrap.dedent('''\
    # ---
    # jupyter:
    #   kernelspec: {display_name: Python 3, language: python, name: python3}
    # ---

    # %% [markdown]
    # # Lemma 1 for softmax on synthetic rows

    # %% tags=["parameters"]
    M = 1.0  # logits drawn uniformly from [-M, M]
    synthetic_lengths = [4, 16, 64]  # row lengths L
    n_trials = 50  # rows per length
    seed = 0  # seed

    # %%
    import numpy as np
    from attn_utils.book import claims

    rng = np.random.default_rng(seed)
    tight, largest = [], []
    for L in synthetic_lengths:
        logits = rng.uniform(-M, M, (n_trials, L))
        with np.errstate(over="raise"):  # the textbook softmax, without subtracting the row's maximum
            weights = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        c1, c2 = np.exp(-2 * M), np.exp(2 * M)
        tight.append(np.maximum(weights.max(1) / (c2 / L), (c1 / L) / weights.min(1)))
        largest.append(np.median(weights.max(1)))
    tight = np.concatenate(tight)
    claims.record("ch1-lemma1-synthetic", model="synthetic", violations=int((tight > 1 + 1e-9).sum()),
                  rows=tight.size, functions=1, L_min=min(synthetic_lengths), L_max=max(synthetic_lengths),
                  tightest=tight.max())
    slope = np.polyfit(np.log(synthetic_lengths), np.log(largest), 1)[0]
    claims.record("ch1-vanishing-model", model="synthetic", slope=slope, slope_with_token0=slope, heads=1,
                  t_min=min(synthetic_lengths), L=max(synthetic_lengths))
    ''')
CLAIMS = ["ch1-lemma1-synthetic", "ch1-vanishing-model"]


@pytest.fixture
def fast(tmp_path) -> Path:
    src = tmp_path / "fast.py"
    src.write_text(FAST)
    return src


def _files(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {p.relative_to(folder).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _check_table(table: pd.DataFrame, src: Path, runs: Path, values: list[float]) -> None:
    """The tidy table against the run folders: a row per (combination, claim), the verdicts and the numeric values
    of each claim's JSON, and a row without claim for a failed combination."""
    assert list(table.columns[:4]) == ["M", "run", "claim", "chapter"]
    assert {"verdict", "measured_on", "model_used", "status", "seconds", "worker", "error"} <= set(table.columns)
    for m in values:
        folder = sweep.run_folder(src, {"M": m}, runs)
        rows = table[table["M"] == m]
        assert set(rows["run"]) == {folder.name}
        status = json.loads((folder / "status.json").read_text())
        assert set(rows["status"]) == {status["status"]}
        if status["status"] != "ok":
            assert len(rows) == 1 and rows["claim"].isna().all() and rows["error"].iloc[0] == status["error"]
            continue
        assert sorted(rows["claim"]) == CLAIMS
        for key in CLAIMS:
            (row,) = rows[rows["claim"] == key].to_dict("records")
            recorded = json.loads((folder / "claims" / f"{key}--{row['measured_on']}.json").read_text())
            assert row["verdict"] == recorded["verdict"] and row["measured_on"] == "synthetic"
            assert {k: row[f"value_{k}"] for k in recorded["values"]} == pytest.approx(recorded["values"], rel=1e-12)
            assert row["seconds"] == pytest.approx(status["seconds"]) and row["worker"] == status["worker"]


@pytest.mark.slow
def test_sweep_on_the_embedded_local_cluster(fast, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert cli.main(["sweep", str(fast), "-p", "M", "0.5,2,1000", "--workers", "2", "--out", str(runs)]) == 1
    out, err = capsys.readouterr()  # one combination failed; the others ran
    assert "local Dask cluster: 2 worker processes, one thread each, scheduler tcp://127.0.0.1:" in out
    assert "Dask dashboard: off (the scheduler has no bokeh package" in out
    assert "failed: M=1000: notebook fast.py failed: FloatingPointError: overflow" in err
    assert err.strip().endswith(f"1 of 3 runs failed; see {runs / 'fast' / 'index.html'}")

    folder = runs / "fast"
    table = pd.read_parquet(folder / "results.parquet")
    assert len(table) == 2 * len(CLAIMS) + 1
    _check_table(table, fast, runs, [0.5, 2, 1000])
    csv = pd.read_csv(folder / "results.csv")
    assert list(csv.columns) == list(table.columns) and csv["verdict"].tolist() == table["verdict"].tolist()
    assert all(w.startswith("tcp://127.0.0.1:") for w in table["worker"])

    page = (folder / "index.html").read_text()
    assert "http://" not in page and "https://" not in page  # self-contained
    for row in table.dropna(subset=["claim"]).itertuples():  # the grid: each verdict on its colour
        assert f"<td style='background:{VERDICT_COLOURS[row.verdict]}'>{row.verdict}</td>" in page
    assert page.count("<th class='failed'") == 1 and "M=1000<br>failed" in page
    assert "<h3>Against M</h3>" in page
    plots = page.split("src='data:image/svg+xml;base64,")[1:]
    assert len(plots) == len(CLAIMS)  # each claim has headline numbers that vary with M
    assert base64.b64decode(plots[0].split("'")[0]).lstrip().startswith(b"<?xml")
    listing = json.loads((folder / "index.json").read_text())
    assert [(r["parameters"], r["status"]) for r in listing] == [({"M": 0.5}, "ok"), ({"M": 2}, "ok"),
                                                                 ({"M": 1000}, "failed")]


def _kill_a_busy_worker(client: Client, pids: dict[str, int], killed: dict) -> None:
    """SIGKILL the process of a worker still at the same tasks half a second after it was first seen at them."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        busy = {worker: keys for worker, keys in client.processing().items() if keys}
        if busy:
            worker, keys = next(iter(busy.items()))
            time.sleep(0.5)
            if client.processing()[worker] == keys:  # still at it
                os.kill(pids[worker], signal.SIGKILL)
                killed.update(worker=worker, keys=list(keys))
                return
        time.sleep(0.05)


@pytest.mark.slow
def test_scheduler_option_a_worker_killed_mid_sweep_and_a_rerun(fast, tmp_path, capsys):
    runs = tmp_path / "runs"
    argv = ["sweep", str(fast), "-p", "M", "0.5,2,1000", "--out", str(runs)]
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        argv += ["--scheduler", cluster.scheduler_address]
        pids = client.run(os.getpid)
        killed: dict = {}
        killer = threading.Thread(target=_kill_a_busy_worker, args=(client, pids, killed))
        killer.start()
        code = cli.main(argv)
        killer.join()
        story = {key: [finish for _, _, finish, *_ in cluster.scheduler.story(key)] for key in killed["keys"]}
        out, err = capsys.readouterr()
        assert code == 1 and err.strip().endswith("1 of 3 runs failed; see " + str(runs / "fast" / "index.html"))
        assert "local Dask cluster" not in out and "Dask dashboard: off" in out
        # the tasks of the killed worker (the one it executed, and one it may have held in waiting) were
        # processing there, then again elsewhere
        assert killed["keys"] and all(story[key].count("processing") == 2 for key in killed["keys"])
        table = pd.read_parquet(runs / "fast" / "results.parquet")
        _check_table(table, fast, runs, [0.5, 2, 1000])  # the sweep completed
        for m in [m for m in (0.5, 2, 1000) if any(sweep.run_slug({"M": m}) in key for key in killed["keys"])]:
            assert table.loc[table["M"] == m, "worker"].iloc[0].split()[0] != killed["worker"]

        # a re-run skips the finished combinations (their files untouched) and runs the failed one again
        done = {m: _files(sweep.run_folder(fast, {"M": m}, runs)) for m in (0.5, 2)}
        failed = sweep.run_folder(fast, {"M": 1000}, runs) / "status.json"
        before = failed.stat().st_mtime_ns
        assert cli.main(argv) == 1
        out, err = capsys.readouterr()
        assert "2 of 3 combinations already finished (status ok): skipped" in out
        assert "1/1" in err and "failed: M=1000" in err
        assert {m: _files(sweep.run_folder(fast, {"M": m}, runs)) for m in (0.5, 2)} == done
        assert failed.stat().st_mtime_ns > before
    again = pd.read_parquet(runs / "fast" / "results.parquet")
    ok = table["M"] != 1000
    pd.testing.assert_frame_equal(again[ok], table[ok])
    _check_table(again, fast, runs, [0.5, 2, 1000])


@pytest.mark.parametrize("extra, message", [
    (["--workers", "0"], "--workers must be an integer >= 1, got 0"),
    (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], "--workers sizes the local cluster"),
])
def test_bad_cluster_options_are_refused(fast, tmp_path, capsys, extra, message):
    assert cli.main(["sweep", str(fast), "-p", "M", "1", "--out", str(tmp_path / "runs"), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()



def _claim(slope: float) -> bytes:
    recorded = claims.judge("ch1-vanishing-model", model="gpt2-random", slope=slope, slope_with_token0=slope,
                            heads=144, t_min=16, L=64)
    return json.dumps({**asdict(recorded), "notebook": "nb"}).encode()


def test_table_and_index_of_results_as_tasks_return_them(tmp_path):
    """Without a cluster: a list-valued parameter becomes its JSON text, and the headline numbers are a table when
    no swept parameter has several numeric values; a task's file outside its run folder is refused."""
    src, grid = tmp_path / "nb.py", {"Ts": [[1, 2], [0.5]], "model": ["gpt2-random"]}
    combos = sweep.combinations(grid)
    assert combos == [{"Ts": [1, 2], "model": "gpt2-random"}, {"Ts": [0.5], "model": "gpt2-random"}]
    for params, slope in zip(combos, (-0.9, -0.4)):
        files = {"claims/ch1-vanishing-model.json": _claim(slope), "provenance/nb.json": b'{"model": "gpt2-random"}'}
        sweep._store(src, sweep.run_folder(src, params, tmp_path), params,
                     {"files": files, "status": {"status": "ok", "seconds": 2.5, "worker": "tcp://127.0.0.1:1 (vm)"}})
    table = sweep.results_table(src, ["Ts", "model"], combos, tmp_path)
    assert table["Ts"].tolist() == ["[1, 2]", "[0.5]"] and table["model_used"].tolist() == ["gpt2-random"] * 2
    assert table["verdict"].tolist() == ["reproduced", "partly reproduced"]  # the ledger's rule on the slopes
    assert table["value_slope"].tolist() == [-0.9, -0.4] and table["value_heads"].tolist() == [144, 144]
    table.to_parquet(tmp_path / "t.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), table)
    runs = [(p, sweep.run_folder(src, p, tmp_path)) for p in combos]
    page = sweep.write_index("nb", ["Ts", "model"], runs, table, tmp_path / "nb").read_text()
    assert "<h3>Against" not in page and "<th>value_slope</th>" in page and "<td>-0.4</td>" in page
    assert f"<td style='background:{VERDICT_COLOURS['partly reproduced']}'>partly reproduced</td>" in page
    kept = _files(runs[0][1])
    with pytest.raises(ValueError, match="a task returned files outside its run folder"):
        sweep._store(src, runs[0][1], {}, {"files": {"../escaped.json": b"{}"}, "status": {"status": "ok"}})
    assert not (runs[0][1].parent / "escaped.json").exists() and _files(runs[0][1]) == kept


def test_figures_of_an_executed_notebook_are_extracted(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[
        nbformat.v4.new_output("display_data", data={"image/svg+xml": "<svg xmlns='http://www.w3.org/2000/svg'/>"}),
        nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(b"\x89PNG").decode()})]),
        nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output("display_data", data={  # glued
            "application/papermill.record/image/svg+xml": "<svg/>", "application/papermill.record/text/plain": "f"})])])
    nbformat.write(nb, tmp_path / "nb.ipynb")
    files = sweep.extract_figures(tmp_path / "nb.ipynb", tmp_path / "figures")
    assert [f.name for f in files] == ["cell00_out0.svg", "cell00_out1.png", "cell01_out0.svg"]
    assert files[0].read_text().startswith("<svg") and files[1].read_bytes() == b"\x89PNG"


def test_an_unreachable_scheduler_is_named_and_nothing_is_written(fast, tmp_path, capsys):
    port = socket.socket()  # a loopback port with nothing listening
    port.bind(("127.0.0.1", 0))
    address = f"tcp://127.0.0.1:{port.getsockname()[1]}"
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        assert cli.main(["sweep", str(fast), "-p", "M", "1", "--out", str(tmp_path / "runs"), "--scheduler",
                         address]) == 2
    port.close()
    assert f"--scheduler {address}: cannot reach the Dask scheduler" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
