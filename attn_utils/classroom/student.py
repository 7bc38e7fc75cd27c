"""The nbgrader course of the book's exercises: source notebooks with solutions and tests, released copies without.

:func:`write_course` writes a folder that nbgrader knows: ``nbgrader_config.py``, one assignment per
chapter under ``source/`` (written here from the chapter's py:percent source) and ``release/`` (made by
``nbgrader generate_assignment``), and the gradebook. In a source notebook

- the chapter's code cells are read-only nbgrader cells (nbgrader restores them when it grades); the
  parameters cell carries the values given to :func:`write_course`;
- each derivation exercise is followed by a manually graded answer cell holding the book's solution,
  worth one point per numbered question; the students' copy says ``YOUR ANSWER HERE``;
- each coding exercise's cell tagged ``solution`` keeps its functions' signatures and docstrings, the
  bodies between ``### BEGIN SOLUTION`` / ``### END SOLUTION`` (the students' copy raises
  ``NotImplementedError`` there), and the worked example goes;
- the check cell becomes one autograded test cell per part of the exercise (one point each): the
  visible check of :mod:`attn_utils.classroom.exercises`, whose hint is the feedback, then a
  ``### BEGIN HIDDEN TESTS`` block from :mod:`attn_utils.classroom.hidden`;
- the solution prose and the directives of the book go; an ``{exercise}`` becomes plain markdown.

With ``exercises_only`` a notebook holds only its chapter's exercises, after one read-only cell with the
chapter's light imports (torch, math, ``attn_utils.mathematics``): no model is loaded, so a submission
grades in seconds. :mod:`attn_utils.classroom.grading` grades what comes back.
"""
from __future__ import annotations

import ast
import builtins
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jupytext
import nbformat

from attn_utils.book import build
from attn_utils.book.params import validate
from attn_utils.classroom import nbgrader_support as support
from attn_utils.classroom.exercises import EXERCISES, exercise_notebooks, exercises_of
from attn_utils.classroom.hidden import hidden_block, test_id
from attn_utils.classroom.limits import DEFAULT_TIME_LIMIT

__all__ = ["course_notebook", "per_notebook", "write_course"]

SOLUTION_TAG, CHECK_TAG = "solution", "exercise-check"

# Imports a notebook of exercises only keeps from its chapter: cheap ones (no model, no plotting).
LIGHT_MODULES = ("math", "random", "itertools", "functools", "collections", "numpy", "torch", "attn_utils.mathematics")

STUDENT_README = """\
# Exercises of *Limitations of Normalization in Attention Mechanism*

`{stem}.ipynb` is a chapter of the companion book with its exercises at the end, as an nbgrader
assignment.

- **Coding exercise**: write the functions of the cell that starts with `# Exercise chN-exK`, replacing
  each `raise NotImplementedError()`. The test cells below it check one part each and show a hint when
  a part fails. The grader runs the same checks and hidden tests of its own, on new random inputs.
- **Derivation**: write your answer in the markdown cell that says `YOUR ANSWER HERE`. Your teacher
  grades it.

Do not delete, split or merge the cells you were given, and do not rename the functions; the read-only
cells and the test cells are put back as they were when the notebook is graded, so editing them
changes nothing. Each cell may run for at most {time_limit:g} seconds when it is graded.

Hand in `{stem}.ipynb` as your teacher asks (nbgrader's Assignments tab, or the file itself).
"""

COURSE_README = """\
# An nbgrader course of the companion's exercises

Written by `attn-companion student`. Inside an nbgrader course, copy `source/<chapter>/` into the
course's `source/` folder (and this folder's `nbgrader_config.py` lines into the course's), then run
`nbgrader generate_assignment <chapter>` there. Standalone, grade the notebooks that come back with

    attn-companion grade --course {course} SUBMISSION ...

`release/<chapter>/` is what students get. `source/` holds the solutions and the hidden tests: never
hand it out. See the book's "For teachers" page.
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


# --- cells --------------------------------------------------------------------------------------------------


def _meta(grade_id: str, *, grade: bool = False, solution: bool = False, locked: bool = False,
          points: float | None = None) -> dict[str, Any]:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution,
            "task": False}
    if grade:
        meta["points"] = points
    return {"nbgrader": meta}


def _plain_exercise(first: str, lines: Iterator[str]) -> tuple[str, str, list[str]]:
    """An ``{exercise}`` directive (``first`` is its opening line): its label, title and body lines."""
    title, label, body = first.strip().removeprefix("```{exercise}").strip(), "", []
    for line in lines:
        s = line.strip()
        if s == "```":
            break
        if s.startswith(":label:"):
            label = s.split(None, 1)[1]
        elif body or not s.startswith(":"):  # options come first
            body.append(line)
    return label, title.removeprefix(f"{label}:").strip() if label else title, body


def _points(body: list[str]) -> int:
    """One point per numbered question of a derivation (at least one)."""
    return max(1, sum(1 for line in body if re.match(r"\d+\.\s", line)))


def _solution_cell(source: str, key: str) -> str:
    """A solution cell as nbgrader's: each function's body between solution delimiters, the rest dropped."""
    lines, hint = source.splitlines(), EXERCISES[key].hints
    parts = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef):
            continue  # the worked example
        first, body = min([node.lineno] + [d.lineno for d in node.decorator_list]), node.body[0]
        if body.lineno == node.lineno:
            raise ValueError(f"solution of {key}: put the body of {node.name}() on its own lines")
        has_doc = ast.get_docstring(node) is not None
        head_end = body.end_lineno if has_doc else body.lineno - 1
        code = lines[head_end: node.end_lineno]
        if not code:
            raise ValueError(f"solution of {key}: {node.name}() has a docstring and no code")
        pad = " " * (node.body[1].col_offset if has_doc and len(node.body) > 1 else body.col_offset)
        parts.append("\n".join([*lines[first - 1: head_end],
                                f"{pad}# {hint.get(node.name, 'a helper of the exercise')}",
                                f"{pad}### BEGIN SOLUTION", *code, f"{pad}### END SOLUTION"]))
    if not parts:
        raise ValueError(f"the solution cell of {key} defines no function")
    return (f"# Exercise {key}: write the function(s) below, replacing each `raise NotImplementedError()`.\n"
            + "\n\n\n".join(parts))


def _test_cell(key: str, part: str) -> nbformat.NotebookNode:
    names = EXERCISES[key].names
    source = "\n".join([
        f"# Test of {key}, part {part!r} (1 point). It shows a hint when your functions fail it; the grader",
        "# also runs hidden tests of this part on new inputs.",
        "from attn_utils.classroom import exercises",
        "",
        f"exercises.check({key!r}, {', '.join(names)}, part={part!r})",
        hidden_block(key, part, names),
    ])
    return nbformat.v4.new_code_cell(source, metadata=_meta(test_id(key, part), grade=True, locked=True, points=1))


def _answer_cell(key: str, points: int, prose: list[str]) -> nbformat.NotebookNode:
    text = "\n".join(prose).strip("\n") or "(the book gives no written solution)"
    source = (f"**Your answer to exercise {key}** ({points} point{'s' if points > 1 else ''}, graded by your "
              f"teacher):\n\n### BEGIN SOLUTION\n{text}\n### END SOLUTION")
    return nbformat.v4.new_markdown_cell(source, metadata=_meta(f"{key}-answer", grade=True, solution=True,
                                                                points=points))


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


def _light_imports(source: str) -> list[str]:
    """The top-level import statements of a cell that import only :data:`LIGHT_MODULES`."""
    lines, kept = source.splitlines(), []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules = [node.module or ""]
        else:
            continue
        if all(any(m == light or m.startswith(light + ".") for light in LIGHT_MODULES) for m in modules):
            kept.append("\n".join(lines[node.lineno - 1: node.end_lineno]))
    return kept


def _bound_names(statements: list[str]) -> set[str]:
    names = set()
    for node in ast.parse("\n".join(statements)).body:
        for alias in node.names:
            names.add((alias.asname or alias.name).split(".")[0])
    return names


def _free_names(source: str) -> set[str]:
    """Names the functions of a cell read but neither assign, import, define nor take as parameters (nor a
    builtin); the rest of the cell (the worked example) does not count."""
    tree, loaded, bound = ast.parse(source), set(), set(dir(builtins))
    tree.body = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return loaded - bound


class _Course:
    """Builds the cells of one source notebook from the chapter's cells."""

    def __init__(self, stem: str, parameters: Mapping[str, Any], exercises_only: bool):
        self.stem, self.parameters, self.exercises_only = stem, parameters, exercises_only
        self.cells: list[nbformat.NotebookNode] = []
        self.text: list[str] = []
        self.points: dict[str, int] = {}
        self.prose: list[str] = []  # the solution of the derivation whose block is open (it may span cells)
        self.code = 0

    def flush(self) -> None:
        text = re.sub(r"\n\s*\n(\s*\n)+", "\n\n", "\n".join(self.text)).strip("\n")
        if text.strip():
            self.cells.append(nbformat.v4.new_markdown_cell(text))
        self.text = []

    def locked(self, source: str, tags: list[str] | None = None) -> None:
        self.flush()
        metadata = _meta(f"{self.stem}-cell-{self.code:02d}", locked=True)
        if tags:
            metadata["tags"] = list(tags)
        self.cells.append(nbformat.v4.new_code_cell(source, metadata=metadata))
        self.code += 1

    def add(self, cell: nbformat.NotebookNode) -> None:
        self.flush()
        self.cells.append(cell)


def course_notebook(src: Path, parameters: Mapping[str, Any] | None = None,
                    exercises_only: bool = False) -> nbformat.NotebookNode:
    """The nbgrader source notebook of the chapter ``src`` (py:percent): see the module."""
    master, stem = jupytext.read(src), Path(src).stem
    coding = set(exercises_of(stem))
    course = _Course(stem, dict(parameters or {}), exercises_only)
    cells = master.cells
    start = next((i for i, c in enumerate(cells) if c.cell_type == "markdown" and "```{exercise}" in c.source), None)
    if start is None:
        raise ValueError(f"{src.name} has no exercise")
    if exercises_only:
        title = next((line for c in cells if c.cell_type == "markdown" for line in c.source.splitlines()
                      if line.startswith("# ")), f"# {stem}")
        imports = list(dict.fromkeys(i for c in cells[:start] if c.cell_type == "code"
                                     for i in _light_imports(c.source)))
        solutions = "\n".join(c.source for c in cells if SOLUTION_TAG in c.metadata.get("tags", []))
        missing = sorted(_free_names(solutions) - _bound_names(imports))
        if missing:
            raise ValueError(f"{src.name}: the solutions use {', '.join(missing)}, which the chapter's light imports "
                             f"do not define; grade the whole chapter instead of --exercises-only")
        course.text = [f"{title} (exercises)", "",
                       f"The exercises of the chapter `{stem}` of the companion book; read the chapter in the book."]
        course.locked("\n".join([*imports, "from attn_utils.classroom import exercises  # the checks of the tests"]))
        first = cells[start].source
        heading = first.find("## Exercises")
        cells = [nbformat.v4.new_markdown_cell(first[heading:] if heading >= 0 else first), *cells[start + 1:]]
    inside, last = None, None  # the solution block open (its exercise key), the last one closed
    for cell in cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "markdown":
            inside, last = _markdown(course, cell.source, inside, coding, last)
        elif SOLUTION_TAG in tags:
            if inside not in coding:
                raise ValueError(f"{src.name}: a cell tagged 'solution' lies outside the solution block of a "
                                 f"coding exercise")
            course.add(nbformat.v4.new_code_cell(_solution_cell(cell.source, inside),
                                                 metadata=_meta(f"{inside}-solution", solution=True)))
        elif CHECK_TAG in tags:
            key = next(iter(re.findall(r"""check\(\s*["']([^"']+)["']""", cell.source)), last)
            if key not in coding:
                raise ValueError(f"{src.name}: the check cell {cell.source!r:.60} names no coding exercise")
            for part in EXERCISES[key].parts:
                course.add(_test_cell(key, part))
        elif inside is None:
            source = cell.source
            if "parameters" in tags:
                source = _set_defaults(source, course.parameters)
            course.locked(source, tags)
    if inside is not None:
        raise ValueError(f"{src.name}: the solution block of {inside} is not closed")
    course.flush()
    for i, c in enumerate(course.cells):
        c.id = f"cell-{i:03d}"
    return nbformat.v4.new_notebook(cells=course.cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        support.METADATA_KEY: {"notebook": stem, "exercises": sorted(course.points) + sorted(coding),
                       "parameters": dict(course.parameters), "exercises_only": exercises_only}})


def _markdown(course: _Course, text: str, inside: str | None, coding: set[str],
              last: str | None) -> tuple[str | None, str | None]:
    """Add a markdown cell of the chapter; return the solution block open at its end and the last one closed."""
    lines = iter(text.splitlines())
    for line in lines:
        s = line.strip()
        if s.startswith("```{solution-start}"):
            inside, course.prose = s.split(None, 1)[1], []
            next((x for x in lines if x.strip() == "```"), None)  # the directive's options and closing fence
        elif s.startswith("```{solution-end}"):
            next(lines, None)  # the directive's closing fence
            if inside not in coding:
                if inside not in course.points:
                    raise ValueError(f"{course.stem}: the solution of {inside} comes before its exercise")
                course.add(_answer_cell(inside, course.points[inside], course.prose))
            inside, last = None, inside
        elif inside is not None:
            course.prose.append(line)
        elif s.startswith("```{exercise}"):
            label, title, body = _plain_exercise(s, lines)
            if label not in coding:
                course.points[label] = _points(body)
            course.text += [f"**Exercise {label}: {title}**", "", *body]
        else:
            course.text.append(line)
    return inside, last


# --- the course folder ----------------------------------------------------------------------------------------


def _check_folder(out: Path, stems: list[str]) -> None:
    """Refuse a folder that is not empty and not a course of ours, or whose chapters were already graded."""
    full = out.resolve()
    existing = next(p for p in (full, *full.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {out}: {existing} is not a folder")
    if existing == full and any(full.iterdir()) and not support.is_course(full):
        raise ValueError(f"--out {out}: the folder is not empty and holds no course written by attn-companion "
                         f"(no {support.CONFIG_FILE} of ours): give a new folder")
    graded = [s for s in stems if any((full / "autograded").glob(f"*/{s}"))]
    if graded:
        raise ValueError(f"--out {out}: {graded[0]} was already graded in this course; write the new version into "
                         f"a new folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: {existing} is not writable")


def write_course(out: Path | str, notebooks: Iterable[str] | None = None,
                 parameters: Mapping[str, Any] | None = None, *, time_limit: float = DEFAULT_TIME_LIMIT,
                 exercises_only: bool = False) -> list[Path]:
    """Write the nbgrader course of ``notebooks`` (default: every one with an exercise) into ``out``; return the
    released notebooks (``release/<chapter>/<chapter>.ipynb``).

    ``parameters`` (validated first; each notebook takes those it declares) become the defaults of the
    read-only parameters cells, e.g. ``{"model": "gpt2-random", "L": 64}`` for fast classroom runs.
    ``time_limit`` is the seconds one cell may run when nbgrader grades it (in ``nbgrader_config.py``).
    Everything is checked before anything is written.
    """
    stems = [build.resolve_notebook(n).stem for n in notebooks] if notebooks else exercise_notebooks()
    without = [s for s in stems if s not in exercise_notebooks()]
    if without:
        raise ValueError(f"notebook {without[0]!r} has no coding exercise; notebooks with exercises: "
                         f"{exercise_notebooks()}")
    time_limit = support.check_time_limit(time_limit)
    defaults = per_notebook(dict(parameters or {}), stems)
    out = Path(out)
    _check_folder(out, stems)
    sources = {stem: course_notebook(build.NOTEBOOK_DIR / f"{stem}.py", defaults[stem], exercises_only)
               for stem in stems}  # every chapter converts before anything is written
    new = not out.exists()
    try:
        return _write(out, sources, defaults, time_limit, exercises_only)
    except BaseException:
        if new:  # a failed or interrupted first write leaves no folder behind
            shutil.rmtree(out, ignore_errors=True)
        raise


def _write(out: Path, sources: dict[str, nbformat.NotebookNode], defaults: dict[str, dict[str, Any]],
           time_limit: float, exercises_only: bool) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    support.write_config(out, timeout=time_limit, parameters=defaults, exercises_only=exercises_only)
    (out / "README.md").write_text(COURSE_README.format(course=out))
    released = []
    with support.nbgrader_env():
        api = support.course_api(out)
        for stem, nb in sources.items():
            folder = out / "source" / stem
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            nbformat.write(nb, folder / f"{stem}.ipynb")
            (folder / "README.md").write_text(STUDENT_README.format(stem=stem, time_limit=time_limit))
            result = api.generate_assignment(stem, force=True, create=True)
            if not result["success"]:
                log = (result.get("log", "") + result.get("error", "")).strip().splitlines()
                raise RuntimeError(f"nbgrader generate_assignment {stem} failed: {' | '.join(log[-3:])}")
            released.append(out / "release" / stem / f"{stem}.ipynb")
    return released
