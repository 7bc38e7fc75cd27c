"""The notebook sources: paired copies in sync, documented and validated parameters."""
from __future__ import annotations

import ast

import jupytext
import nbformat
import pytest

from attn_utils.book import build
from attn_utils.book.params import SPECS

SOURCES = sorted(build.NOTEBOOK_DIR.glob("*.py"))


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_paired_ipynb_matches_source(src):
    """The committed .ipynb (for Binder/Colab) holds the same cells as the .py source, without outputs."""
    paired = src.with_suffix(".ipynb")
    assert paired.exists(), f"{paired.name} missing: run `make pair`"
    a, b = jupytext.read(src), nbformat.read(paired, as_version=4)
    assert [(c.cell_type, c.source) for c in a.cells] == [(c.cell_type, c.source) for c in b.cells], \
        f"{paired.name} is out of date: run `make pair`"
    assert not any(c.get("outputs") for c in b.cells), f"{paired.name} carries outputs"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_parameters_are_documented_and_validated(src):
    nb = jupytext.read(src)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    index = next((i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])), None)
    assert index is not None, "no cell tagged 'parameters'"
    declared = build.notebook_parameters(src)
    if not declared:
        return
    for line in cells[index].source.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            assert "#" in line, f"undocumented parameter line: {line!r}"
    unknown = set(declared) - set(SPECS)
    assert not unknown, f"parameters without a specification in attn_utils.book.params.SPECS: {unknown}"
    calls = [n for n in ast.walk(ast.parse(cells[index + 1].source))
             if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == "checked"]
    assert calls, "the cell after the parameters must call checked(...)"
    checked = {k.arg for k in calls[0].keywords}
    assert checked == set(declared), f"checked() must receive every parameter; missing {set(declared) - checked}"


@pytest.mark.parametrize("name, value", [("L", 0), ("model", ""), ("seed", -1)])
def test_invalid_parameter_stops_before_the_notebook(tmp_path, name, value):
    """An invalid value raises ValueError naming the parameter, before any heavy work: the boundary check, whose
    result is the only way into execute_notebook."""
    src = build.NOTEBOOK_DIR / "ch0_setting.py"
    with pytest.raises(ValueError, match=f"parameter {name} must be"):
        build.check_parameters(src, {name: value})


def test_notebook_itself_rejects_invalid_parameter(tmp_path):
    """Run by hand (papermill directly, no pre-check), the notebook stops in the cell after its parameters."""
    import papermill

    src = build.NOTEBOOK_DIR / "ch0_setting.py"
    nb_in = tmp_path / "in.ipynb"
    nbformat.write(jupytext.read(src), nb_in)
    with pytest.raises(papermill.PapermillExecutionError) as err:
        papermill.execute_notebook(str(nb_in), str(tmp_path / "out.ipynb"), parameters={"L": -5},
                                   kernel_name="python3", progress_bar=False, cwd=str(src.parent))
    assert err.value.ename == "ParameterError" and "parameter L must be" in err.value.evalue  # a ValueError
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    failing = next(i for i, c in enumerate(code) if any(o.get("output_type") == "error" for o in c.outputs))
    assert "injected-parameters" in code[failing - 1].metadata.get("tags", []), "must fail right after the parameters"


# --- chapter shape: the argument on the page, the machinery in the library ---------------------------------

MAX_CODE_SHARE, MAX_CELL_LINES = 0.35, 25
BOOKKEEPING = ("glue(", "glue_values(", "claims.record(", "record(")
EXERCISE_TAGS = {"solution", "exercise", "exercise-check"}


def _code_lines(cell) -> list[str]:
    return [line for line in cell.source.splitlines() if line.strip()]


def _tags(cell) -> set[str]:
    return set(cell.metadata.get("tags", []))


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_chapter_reads_like_a_book(src):
    """At most 35 % of a chapter's non-blank lines are code; no code cell over 25 non-blank lines; no function or
    class defined outside an exercise's solution; bookkeeping (glue, ledger records) is in hidden cells."""
    cells = jupytext.read(src).cells
    code = sum(len(_code_lines(c)) for c in cells if c.cell_type == "code")
    prose = sum(len(_code_lines(c)) for c in cells if c.cell_type == "markdown")
    assert code <= MAX_CODE_SHARE * (code + prose), \
        f"{src.stem}: {code} of {code + prose} non-blank lines are code ({code / (code + prose):.0%} > 35 %)"
    for i, cell in enumerate(c for c in cells if c.cell_type == "code"):
        lines = _code_lines(cell)
        assert len(lines) <= MAX_CELL_LINES, f"{src.stem}: code cell {i} has {len(lines)} non-blank lines"
        if not _tags(cell) & EXERCISE_TAGS:
            defined = [n.name for n in ast.walk(ast.parse(cell.source))
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            assert not defined, f"{src.stem}: code cell {i} defines {defined}; move it into attn_utils"
        if any(word in line for line in lines for word in BOOKKEEPING) and "parameters" not in _tags(cell):
            assert "remove-cell" in _tags(cell), \
                f"{src.stem}: code cell {i} does bookkeeping (glue / ledger records) but is not tagged remove-cell"
