"""The build pipeline, the CLI and the parameter checks (on a tiny throw-away book)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attn_utils import cli

from attn_utils.book import build, params, sweep

ROOT = Path(__file__).resolve().parents[2]

NOTEBOOK = textwrap.dedent('''\
    # ---
    # jupyter:
    #   kernelspec: {display_name: Python 3, language: python, name: python3}
    # ---

    # %% [markdown]
    # # Tiny chapter

    # %% tags=["parameters"]
    N = 3  # size of the top-N set
    seed = 0  # seed

    # %%
    from attn_utils.book.params import checked
    p = checked(N=N, seed=seed)
    print("checked:", dict(p.given), dict(p.facts))
    from myst_nb import glue
    import matplotlib.pyplot as plt
    glue("answer", N * 2, display=False)
    fig, ax = plt.subplots(figsize=(2, 2)); ax.plot([0, N]); plt.show()

    # %% [markdown]
    # The answer is {glue:text}`answer`.
    ''')


@pytest.fixture
def tiny_book(tmp_path):
    """A minimal book with the project's configuration and one notebook."""
    root = tmp_path / "proj"
    (root / "book").mkdir(parents=True)
    (root / "notebooks").mkdir()
    shutil.copy(ROOT / "_config.yml", root / "_config.yml")
    shutil.copy(ROOT / "book" / "references.bib", root / "book" / "references.bib")
    (root / "book" / "intro.md").write_text("# Intro\n\nHello {cite}`vaswani2017attention`.\n\n"
                                            "```{bibliography}\n```\n")
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: notebooks/tiny\n")
    (root / "notebooks" / "tiny.py").write_text(NOTEBOOK)
    return root


def test_parse_and_split_values():
    assert build.parse_value("5") == 5 and build.parse_value("1e-3") == 1e-3
    assert build.parse_value("[32, 64]") == [32, 64] and build.parse_value("None") is None
    assert build.parse_value("gpt2") == "gpt2"
    assert build.split_values("1,[2, 3],abc") == [1, [2, 3], "abc"]


@pytest.mark.parametrize("name, value, fragment", [
    ("L", 1, "parameter L must be an integer >= 2"),
    ("N", 0, "parameter N must be an integer >= 1"),
    ("Ts", [1.0, -2.0], "parameter Ts must be a non-empty list of numbers in [1e-06, 1e+06]"),
    ("ks_alpha", 1.5, "parameter ks_alpha must be a number in (0, 1)"),
    ("lengths", [64, 32], "increasing"),
    ("corpus", "/no/such/file.txt", "parameter corpus"),
    ("vectors", "hidden", "'value', 'key' or 'query'"),
    ("bogus", 1, "unknown parameter 'bogus'"),
])
def test_validate_rejects_bad_values(name, value, fragment):
    with pytest.raises(ValueError) as err:
        params.validate(**{name: value})
    assert fragment in str(err.value)


def test_validate_accepts_good_values():
    good = dict(L=1024, N=5, Ns=[1, 5, 10], Ts=[1e-3, 10], ks_alpha=0.01, lengths=[32, 64], corpus="war-and-peace",
                chapters=[1, 3], seed=0, model="auto", vectors="value", logit_scale="raw")
    p = params.validate(**good)
    frozen = {k: tuple(v) if isinstance(v, list) else v for k, v in good.items()}  # lists are frozen as tuples
    assert dict(p) == dict(p.given) == frozen and dict(p.facts) == {}  # no rule dropped or changed a value
    assert p.L == 1024 and p.Ns == (1, 5, 10) and p.model == "auto"
    shorter = params.validate(L=8, Ns=[1, 5, 10])  # the one derived value: Ns not below L are dropped
    assert dict(shorter) == {"L": 8, "Ns": (1, 5)} and shorter.given["Ns"] == (1, 5, 10)


def test_notebook_parameters_and_unknown_parameter(tiny_book):
    src = tiny_book / "notebooks" / "tiny.py"
    assert build.notebook_parameters(src) == {"N": 3, "seed": 0}
    with pytest.raises(ValueError, match="tiny has no parameter 'L'"):
        build.check_parameters(src, {"L": 5})
    with pytest.raises(ValueError, match="parameter N must be"):
        build.check_parameters(src, {"N": -1})


@pytest.mark.slow
def test_build_book_then_failed_build_keeps_previous(tiny_book, tmp_path):
    out = tmp_path / "html"
    result = build.build_book({"N": 4}, root=tiny_book, out=out, progress=False)
    page = (out / "notebooks" / "tiny.html").read_text()
    assert "The answer is" in page and ">8<" in page  # glue 2 * N reached the prose
    assert set(result.executions) == {"tiny"} and result.executions["tiny"].seconds > 0
    assert result.records == tmp_path / "html-records" and (result.records / "status").is_dir()
    # a notebook that raises: the pipeline names it, and the previous book stays
    src = tiny_book / "notebooks" / "tiny.py"
    src.write_text(src.read_text().replace("p = checked(N=N, seed=seed)", "raise ValueError('boom from the notebook')"))
    with pytest.raises(build.NotebookFailed, match="tiny.py failed: ValueError: boom"):
        build.build_book({}, root=tiny_book, out=out, progress=False)
    assert (out / "notebooks" / "tiny.html").read_text() == page
    assert not list(tmp_path.glob("html.old")) and not list(out.parent.glob(".staging-*"))


def test_build_book_rejects_bad_parameters_before_running(tiny_book, tmp_path):
    with pytest.raises(ValueError, match="no notebook has a parameter 'L'"):
        build.build_book({"L": 5}, root=tiny_book, out=tmp_path / "html")
    with pytest.raises(ValueError, match="parameter N must be an integer >= 1"):
        build.build_book({"N": 0}, root=tiny_book, out=tmp_path / "html")
    assert not (tmp_path / "html").exists()


def test_sweep_validates_all_combinations_first(tiny_book, tmp_path):
    src = tiny_book / "notebooks" / "tiny.py"
    with pytest.raises(ValueError, match="parameter N must be"):
        sweep.sweep(src, {"N": [2, 0]}, tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_cli_reports_bad_parameter_and_unknown_notebook(capsys):
    assert cli.main(["run", "no_such_notebook"]) == 2
    assert "notebook 'no_such_notebook' not found" in capsys.readouterr().err
    assert cli.main(["book", "-p", "no_such_param", "1"]) == 2
    assert "no notebook has a parameter 'no_such_param'" in capsys.readouterr().err


@pytest.mark.slow
def test_run_marks_failed_runs_and_a_rejected_run_writes_nothing(tiny_book, tmp_path):
    src = tiny_book / "notebooks" / "tiny.py"
    runs = tmp_path / "runs"
    with pytest.raises(ValueError, match="parameter N must be"):
        sweep.run_one(src, {"N": 0}, runs)
    assert not runs.exists()
    ok = sweep.run_one(src, {"N": 2}, runs, progress=False)
    status = json.loads((ok.parent / "status.json").read_text())
    assert status["status"] == "ok" and status["seconds"] > 0
    src.write_text(src.read_text().replace("p = checked(N=N, seed=seed)", "raise ValueError('boom from the notebook')"))
    with pytest.raises(build.NotebookFailed):
        sweep.run_one(src, {"N": 3}, runs, progress=False)
    failed = sweep.run_folder(src, {"N": 3}, runs)
    status = json.loads((failed / "status.json").read_text())
    assert status["status"] == "failed" and "boom from the notebook" in status["error"]
    assert "boom from the notebook" in (failed / "tiny.ipynb").read_text()  # the traceback is kept
    assert [f.suffix for f in (ok.parent / "figures").iterdir()] == [".png"]  # the figure of the run


def test_new_build_removes_stale_staging_folders(tiny_book, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [tmp_path / f".staging-{dead.pid}-abc", tmp_path / ".staging-x1y2z3"]  # a killed build; an old name
    live = tmp_path / f".staging-{os.getpid()}-abc"  # a build running now
    for folder in (*stale, live):
        (folder / "_run").mkdir(parents=True)
    src = tiny_book / "notebooks" / "tiny.py"
    src.write_text(src.read_text().replace("p = checked(N=N, seed=seed)", "raise ValueError('boom')"))
    with pytest.raises(build.NotebookFailed):
        build.build_book({}, root=tiny_book, out=tmp_path / "html", progress=False)
    assert not any(folder.exists() for folder in stale) and live.is_dir()
    assert list(tmp_path.glob(".staging-*")) == [live]


def test_kernel_prints_no_encryption_warning(tiny_book, tmp_path, capfd):
    src = tiny_book / "notebooks" / "tiny.py"
    build.execute_notebook(src, tmp_path / "tiny.ipynb", build.check_parameters(src, {}), progress=False)
    err = capfd.readouterr().err
    assert "without encryption" not in err


def test_the_notebook_receives_the_preflights_parameters_and_checks_nothing_again(tiny_book, tmp_path, monkeypatch):
    """The values the preflight checked reach the kernel as they are (facts included); a notebook whose values are
    not those (here: an edited preflight result) stops instead of checking again."""
    import nbformat

    src = tiny_book / "notebooks" / "tiny.py"
    (checked,) = build.preflight([(src, {"N": 4})])
    build.execute_notebook(src, tmp_path / "tiny.ipynb", checked, progress=False)
    outputs = [o.get("text", "") for c in nbformat.read(tmp_path / "tiny.ipynb", as_version=4).cells
               for o in c.get("outputs", [])]
    assert "checked: {'N': 4, 'seed': 0} {}\n" in outputs
    stale = tmp_path / "stale.json"
    stale.write_text(params.Parameters({"N": 5, "seed": 0}).to_json())
    monkeypatch.setenv(params.PARAMETERS_ENV, str(stale))
    with pytest.raises(RuntimeError, match="are not those its preflight checked"):
        params.checked(N=4, seed=0)
    assert params.checked(N=5, seed=0) == params.Parameters({"N": 5, "seed": 0})
    with pytest.raises(TypeError, match="takes the Parameters of preflight"):
        build.execute_notebook(src, tmp_path / "raw.ipynb", {"N": 4}, progress=False)


def test_run_slug_is_stable_and_distinct():
    a = sweep.run_slug({"N": 5, "L": 64})
    assert a == sweep.run_slug({"L": 64, "N": 5}) and a != sweep.run_slug({"N": 6, "L": 64})
    assert a.startswith("L=64_N=5-")
