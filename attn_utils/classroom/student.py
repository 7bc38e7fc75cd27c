"""Student copies of the notebooks: every solution replaced by a stub that raises NotImplementedError.

:func:`student_copies` writes, for each notebook with a coding exercise, an ``.ipynb`` and its paired
``.py`` in which each cell tagged ``solution`` keeps only its functions' signatures and docstrings
(with a hint from :data:`attn_utils.classroom.exercises.EXERCISES`), and the solution prose is gone. The copies
carry the metadata the grader (:mod:`attn_utils.classroom.grading`) uses to recognise a chapter and deleted cells.
"""
from __future__ import annotations

import ast
import copy
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jupytext
import nbformat

from attn_utils.book import build
from attn_utils.classroom.exercises import EXERCISES, exercise_notebooks, exercises_of
from attn_utils.book.params import validate

__all__ = ["per_notebook", "student_copies", "student_notebook"]

METADATA_KEY = "attn_companion"     # notebook metadata of a student copy: chapter, code cells, exercises
CELL_KEY = "ac_cell"                # cell metadata: the number of a code cell in the student copy
SOLUTION_TAG, EXERCISE_TAG, CHECK_TAG = "solution", "exercise", "exercise-check"

STUDENT_README = """\
# Exercises: student copies

Each notebook is a chapter of the companion book to *Limitations of Normalization in Attention
Mechanism*, with its exercises at the end. For a coding exercise, write the functions of the cell that
starts with `# Exercise chN-exK`, replacing each `raise NotImplementedError(...)`, then run the check
cell below it: it shows a green line when your functions pass and a hint when they do not. Answer the
derivation exercises as your teacher asks (a markdown cell, or on paper).

Run a notebook in Jupyter, or from a shell with the companion installed:

    attn-companion run ch1_vanishing.py -p model gpt2-random -p L 64

Until every exercise of a notebook is solved, that run stops at the first check that fails.

Do not delete or merge cells, rename the functions, or remove the notebook's metadata: the grader
uses them, and a notebook with a deleted code cell scores zero. Hand in the `.ipynb` (or the `.py`).
"""


def per_notebook(parameters: Mapping[str, Any], stems: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Validate ``parameters`` and give each notebook those it declares; a parameter none declares is an error."""
    declared = {stem: build.notebook_parameters(build.NOTEBOOK_DIR / f"{stem}.py") for stem in stems}
    known = set().union(*declared.values())
    unknown = sorted(set(parameters) - known)
    if unknown:
        raise ValueError(f"none of the notebooks {', '.join(declared)} has a parameter {unknown[0]!r}; "
                         f"their parameters: {sorted(known)}")
    validate(**parameters)
    return {stem: {k: v for k, v in parameters.items() if k in names} for stem, names in declared.items()}


def _plain_exercise(first: str, lines: Iterator[str]) -> list[str]:
    """An ``{exercise}`` directive (``first`` is its opening line) as plain markdown that Jupyter renders."""
    title, label, body = first.removeprefix("```{exercise}").strip(), "", []
    for line in lines:
        s = line.strip()
        if s == "```":
            break
        if s.startswith(":label:"):
            label = s.split(None, 1)[1]
        elif body or not s.startswith(":"):  # options come first
            body.append(line)
    return [f"**Exercise {label}: {title}**", *body]


def _student_markdown(text: str, inside: str | None) -> tuple[str, str | None]:
    """Drop solution blocks (which may span cells) and turn ``{exercise}`` directives into plain markdown.

    ``inside`` is the key of the solution block open at the start of the cell (None outside one); the
    key open at the end is returned with the new text.
    """
    out: list[str] = []
    lines = iter(text.splitlines())
    for line in lines:
        s = line.strip()
        if s.startswith("```{solution-start}"):
            inside = s.split(None, 1)[1]
        elif s.startswith("```{solution-end}"):
            next(lines, None)  # the directive's closing fence
            inside = None
        elif inside is not None:
            continue
        elif s.startswith("```{exercise}"):
            out += _plain_exercise(s, lines)
        else:
            out.append(line)
    text = re.sub(r"\n\s*\n(\s*\n)+", "\n\n", "\n".join(out))  # removed blocks leave runs of blank lines
    return text.strip("\n"), inside


def _stub(source: str, key: str) -> str:
    """A solution cell reduced to its functions' signatures and docstrings, each raising NotImplementedError.

    Every other top-level statement of the cell (the worked example) is dropped.
    """
    lines, hints = source.splitlines(), EXERCISES[key].hints
    stubs = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        first, body = min([node.lineno] + [d.lineno for d in node.decorator_list]), node.body[0]
        if body.lineno == node.lineno:
            raise ValueError(f"solution of {key}: put the body of {node.name}() on its own lines")
        has_doc = ast.get_docstring(node) is not None
        keep = lines[first - 1: body.end_lineno if has_doc else body.lineno - 1]
        message = json.dumps(f"Exercise {key}: {hints.get(node.name, 'write this helper')}")
        stubs.append("\n".join(keep + [" " * body.col_offset + f"raise NotImplementedError({message})"]))
    if not stubs:
        raise ValueError(f"the solution cell of {key} defines no function to turn into a stub")
    return (f"# Exercise {key}: write the function(s) below, replacing each `raise NotImplementedError`.\n"
            + "\n\n\n".join(stubs))


def _set_defaults(source: str, values: Mapping[str, Any]) -> str:
    """The parameters cell with the defaults of ``values`` written in (one assignment per line)."""
    lines = source.splitlines()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in values:
            v, line = node.value, lines[node.value.lineno - 1]
            value = values[node.targets[0].id]
            literal = json.dumps(value) if isinstance(value, str) else repr(value)
            lines[v.lineno - 1] = line[:v.col_offset] + literal + line[v.end_col_offset:]
    return "\n".join(lines)


def student_notebook(src: Path, parameters: Mapping[str, Any] | None = None) -> nbformat.NotebookNode:
    """The student copy of the notebook source ``src`` (py:percent), as a notebook without outputs.

    Solution cells become stubs tagged ``exercise``; check cells are tagged ``exercise-check``; the
    solution prose and directives go. Every code cell is numbered in its metadata (``ac_cell``) and the
    notebook metadata records the chapter and the number of code cells, so the grader can tell which
    chapter a submission is and whether cells were deleted. ``parameters`` replace defaults.
    """
    master, cells, inside, last = jupytext.read(src), [], None, None
    for cell in master.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "markdown":
            text, inside = _student_markdown(cell.source, inside)
            last = inside or last
            if text.strip():
                cells.append(nbformat.v4.new_markdown_cell(text))
        elif SOLUTION_TAG in tags:
            if inside is None:
                raise ValueError(f"{src.name}: a cell tagged 'solution' lies outside solution-start/solution-end")
            cells.append(nbformat.v4.new_code_cell(_stub(cell.source, inside),
                                                   metadata={"tags": [EXERCISE_TAG], "exercise": inside}))
        elif inside is None:
            new = nbformat.v4.new_code_cell(cell.source, metadata=copy.deepcopy(dict(cell.metadata)))
            if CHECK_TAG in tags:
                new.metadata["exercise"] = last
            if "parameters" in tags:
                new.source = _set_defaults(new.source, parameters or {})
            cells.append(new)
    code = [c for c in cells if c.cell_type == "code"]
    for i, c in enumerate(code):
        c.metadata[CELL_KEY] = i
    for i, c in enumerate(cells):
        c.id = f"cell-{i:03d}"
    return nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": dict(master.metadata.get("kernelspec", {})),
        "jupytext": {"formats": "ipynb,py:percent", "notebook_metadata_filter": METADATA_KEY},
        METADATA_KEY: {"notebook": src.stem, "code_cells": len(code), "exercises": exercises_of(src.stem)}})


def student_copies(out_dir: Path, notebooks: Iterable[str] | None = None,
                   parameters: Mapping[str, Any] | None = None) -> list[Path]:
    """Write student copies (``.ipynb`` and paired ``.py``) of ``notebooks`` (default: every one with an
    exercise) and a README into ``out_dir``; return the ``.ipynb`` files.

    ``parameters`` (validated first) become the copies' defaults, e.g. ``{"model": "gpt2-random", "L": 64}``
    for fast classroom runs; each notebook takes those it declares.
    """
    stems = [build.resolve_notebook(n).stem for n in notebooks] if notebooks else exercise_notebooks()
    without = [s for s in stems if s not in exercise_notebooks()]
    if without:
        raise ValueError(f"notebook {without[0]!r} has no coding exercise; notebooks with exercises: "
                         f"{exercise_notebooks()}")
    defaults = per_notebook(dict(parameters or {}), stems)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem in stems:
        nb = student_notebook(build.NOTEBOOK_DIR / f"{stem}.py", defaults[stem])
        nbformat.write(nb, out_dir / f"{stem}.ipynb")
        jupytext.write(nb, out_dir / f"{stem}.py", fmt="py:percent")
        written.append(out_dir / f"{stem}.ipynb")
    (out_dir / "README.md").write_text(STUDENT_README)
    return written
