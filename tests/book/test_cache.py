"""The execution cache: a rebuild with nothing changed executes nothing, a prose edit shows up without executing,
a change of code, parameters or library executes again, a damaged entry is never used, --no-cache executes."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import nbformat
import papermill
import pytest

from attn_utils import cli
from attn_utils.book import build, cache, runlog, sweep

ROOT = Path(__file__).resolve().parents[2]

NOTEBOOK = textwrap.dedent('''\
    # %% [markdown]
    # # Cached chapter
    #
    # The answer is {glue:text}`answer`.

    # %% tags=["parameters"]
    N = 3  # size
    seed = 0  # seed

    # %%
    from attn_utils.book.params import checked
    p = checked(N=N, seed=seed)
    from myst_nb import glue
    from attn_utils.book import runlog
    import random
    value = random.Random().random()  # differs from one execution to the next
    glue("answer", f"{p.N * 2} ({value})", display=False)
    runlog.write("claims", "tiny-claim", {"key": "tiny-claim", "value": value})
    ''')


@pytest.fixture
def book(tmp_path):
    root = tmp_path / "proj"
    (root / "book").mkdir(parents=True)
    (root / "notebooks").mkdir()
    shutil.copy(ROOT / "_config.yml", root / "_config.yml")
    shutil.copy(ROOT / "book" / "references.bib", root / "book" / "references.bib")
    (root / "book" / "intro.md").write_text("# Intro\n")
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: notebooks/tiny\n")
    (root / "notebooks" / "tiny.py").write_text(NOTEBOOK)
    return root


@pytest.fixture
def executions(monkeypatch):
    """Count the notebooks papermill executes."""
    seen = []
    real = papermill.execute_notebook

    def counting(*args, **kwargs):
        seen.append(Path(args[0]).stem)
        return real(*args, **kwargs)

    monkeypatch.setattr(papermill, "execute_notebook", counting)
    return seen


def _answer(out: Path) -> str:
    page = (out / "notebooks" / "tiny.html").read_text()
    return page.split("The answer is", 1)[1][:200]


def _claims(result) -> list[dict]:
    return runlog.read("claims", result.records)


@pytest.mark.slow
def test_second_build_restores_prose_edit_shows_and_changes_execute(book, tmp_path, executions, capsys):
    store = cache.Cache(tmp_path / "cache")
    out = tmp_path / "html"
    first = build.build_book({}, root=book, out=out, progress=False, cache=store)
    assert executions == ["tiny"] and not first.executions["tiny"].cached
    answer, claims_first = _answer(out), _claims(first)
    # nothing changed: nothing executes; the same glued values and records
    second = build.build_book({}, root=book, out=out, progress=False, cache=store)
    assert executions == ["tiny"] and second.executions["tiny"].cached
    assert _answer(out) == answer and _claims(second) == claims_first
    assert second.executions["tiny"].seconds == first.executions["tiny"].seconds
    assert "[1/1] tiny from cache (executed " in capsys.readouterr().out
    status = (out / "notebooks" / "tiny.html").read_text()  # the page exists; the status record says what happened
    assert status and json.loads((second.records / "status" / "executions.json").read_text())["tiny"]["cached"]
    # a prose edit: shows up, executes nothing
    src = book / "notebooks" / "tiny.py"
    src.write_text(src.read_text().replace("# The answer is", "# Edited prose. The answer is"))
    build.build_book({}, root=book, out=out, progress=False, cache=store)
    assert executions == ["tiny"] and "Edited prose." in (out / "notebooks" / "tiny.html").read_text()
    assert _answer(out) == answer
    # a new parameter value executes again, and so does --no-cache
    build.build_book({"N": 4}, root=book, out=out, progress=False, cache=store)
    assert executions == ["tiny", "tiny"] and _answer(out) != answer and "8 (" in _answer(out)
    build.build_book({"N": 4}, root=book, out=out, progress=False, cache=store, reuse=False)
    assert executions == ["tiny", "tiny", "tiny"]
    # a code edit executes again
    src.write_text(src.read_text().replace("p.N * 2", "p.N * 3"))
    build.build_book({}, root=book, out=out, progress=False, cache=store)
    assert executions == ["tiny"] * 4


def test_key_covers_code_parameters_library_and_environment(book, tmp_path, monkeypatch):
    src = book / "notebooks" / "tiny.py"
    p3, p4 = build.check_parameters(src, {}), build.check_parameters(src, {"N": 4})
    base = cache.key(src, p3)
    assert cache.key(src, p3) == base and cache.key(src, p4) != base
    src.write_text(src.read_text().replace("# The answer is", "# Prose only. The answer is"))
    assert cache.key(src, p3) == base  # markdown is not part of the key
    src.write_text(src.read_text().replace("p.N * 2", "p.N * 2 + 0"))
    assert cache.key(src, p3) != base
    src.write_text(NOTEBOOK)
    # a library module that changes (here: a copy of the package, edited) changes the key
    package = tmp_path / "attn_utils"
    shutil.copytree(cache.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache, "PACKAGE", package)
    cache.package_digest.cache_clear()
    try:
        copied = cache.key(src, p3)
        (package / "mathematics" / "metrics.py").write_text((package / "mathematics" / "metrics.py").read_text()
                                                            + "\n# an edit\n")
        cache.package_digest.cache_clear()
        assert cache.key(src, p3) != copied
    finally:
        cache.package_digest.cache_clear()
    monkeypatch.setattr(cache, "environment", lambda: {"installed": "another version of a package"})
    assert cache.key(src, p3) != base


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "entry"])
def test_a_damaged_entry_is_not_used(tmp_path, damage):
    store = cache.Cache(tmp_path / "cache")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    store.put("k" * 64, nbformat.writes(notebook).encode(), {"claims/a.json": b'{"x": 1}'}, 1.5, cache.now())
    entry = store.get("k" * 64)
    assert entry is not None and entry.records == {"claims/a.json": b'{"x": 1}'} and entry.seconds == 1.5
    folder = tmp_path / "cache" / ("k" * 64)
    target = folder / "records" / "claims" / "a.json"
    if damage == "truncate":
        target.write_bytes(b'{"x"')
    elif damage == "flip":
        target.write_bytes(b'{"x": 2}')
    elif damage == "delete":
        target.unlink()
    else:
        (folder / cache.ENTRY).write_text("{not json")
    assert store.get("k" * 64) is None and not folder.exists()  # removed: the next execution stores it again


def test_entries_are_written_aside_then_renamed(tmp_path):
    store = cache.Cache(tmp_path / "cache")
    store.put("a" * 64, b"{}", {}, 1.0, cache.now())
    store.put("a" * 64, b"{}", {}, 2.0, cache.now())  # the same key again: one entry, no temporary folder left
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["a" * 64]


def test_merge_keeps_the_prose_of_the_source_and_the_outputs_of_the_execution(book, tmp_path):
    src = book / "notebooks" / "tiny.py"
    out = tmp_path / "tiny.ipynb"
    build.execute_notebook(src, out, build.check_parameters(src, {"N": 5}), progress=False)
    executed = nbformat.read(out, as_version=4)
    src.write_text(src.read_text().replace("# # Cached chapter", "# # Renamed chapter"))
    merged = cache.merge(src, executed)
    assert merged.cells[0].source.startswith("# Renamed chapter")
    code = [c for c in merged.cells if c.cell_type == "code"]
    assert [c.source for c in code] == [c.source for c in executed.cells if c.cell_type == "code"]
    assert "injected-parameters" in code[1].metadata.tags and code[2].outputs == [c for c in executed.cells
                                                                               if c.cell_type == "code"][2].outputs
    src.write_text(src.read_text().replace("p.N * 2", "p.N * 7"))
    with pytest.raises(ValueError, match="the cached execution is of other code"):
        cache.merge(src, executed)


def test_run_takes_a_cached_execution_and_no_cache_executes(book, tmp_path, executions, capsys):
    src = book / "notebooks" / "tiny.py"
    store = cache.Cache(tmp_path / "cache")
    first = sweep.run_one(src, {"N": 2}, tmp_path / "runs", progress=False, cache=store)
    status = json.loads((first.parent / "status.json").read_text())
    assert status["status"] == "ok" and status["cached"] is False and executions == ["tiny"]
    claims = runlog.read("claims", first.parent)
    again = sweep.run_one(src, {"N": 2}, tmp_path / "runs", progress=False, cache=store)
    assert json.loads((again.parent / "status.json").read_text())["cached"] is True and executions == ["tiny"]
    assert runlog.read("claims", again.parent) == claims
    assert "tiny.py from cache (executed" in capsys.readouterr().out
    sweep.run_one(src, {"N": 2}, tmp_path / "runs", progress=False, cache=store, reuse=False)
    assert executions == ["tiny", "tiny"]


def test_no_cache_flag_reaches_the_build(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(build, "build_book", lambda parameters, **kw: seen.update(kw) or build.BookResult(
        tmp_path, tmp_path, {}))
    assert cli.main(["book", "--no-cache", "--out", str(tmp_path / "html")]) == 0
    assert seen["reuse"] is False
    assert cli.main(["book", "--out", str(tmp_path / "html")]) == 0
    assert seen["reuse"] is True


def test_a_relative_out_folder_holds_the_records_too(book, tmp_path, monkeypatch):
    """The kernel runs in the notebook's folder: a relative run folder must reach it resolved."""
    monkeypatch.chdir(tmp_path)
    out = sweep.run_one(book / "notebooks" / "tiny.py", {"N": 2}, Path("runs"), progress=False,
                        cache=cache.Cache(tmp_path / "cache"))
    assert runlog.read("claims", tmp_path / out.parent) and not (book / "notebooks" / "runs").exists()
