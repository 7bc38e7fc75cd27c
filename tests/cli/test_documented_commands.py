"""Every ``make`` and ``attn-companion`` command that a reader is shown works: in README.md, the book's prose pages
(``book/*.md``) and its chapters (the markdown cells of ``notebooks/*.py``).

The commands are read from the pages themselves (code blocks and inline code). Each one's runs, the (notebook,
parameters) pairs it executes, pass the preflight with the parameters as documented. Then every run executes with L
scaled to 64 and model gpt2-random, the other parameters as documented over the small build of tests/book/test_book.py;
a run identical to one of that build (which test_book.py executes) or to another run is executed once. A chapter of
the course that ``attn-companion student`` writes is executed by grading its unsolved released copy, as ``attn-companion
grade`` does.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from typing import NamedTuple

import jupytext
import nbformat
import pytest

from attn_utils import cli
from attn_utils.book import build, sweep, windows
from attn_utils.classroom import exercises, grading, student
from helpers import SMALL

ROOT = Path(__file__).resolve().parents[2]
# the pages a reader sees: the README, the book's prose pages and its chapters
DOCS = ("README.md", *(f"book/{p.name}" for p in sorted((ROOT / "book").glob("*.md"))),
        *(f"notebooks/{p.name}" for p in sorted((ROOT / "notebooks").glob("*.py"))))
MAKE_TARGETS = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")
SCALED = {"model": "gpt2-random", "L": 64}
# how many random instances, and how long the synthetic rows: scaled to the small build's, like L
SIZES = ("n_trials", "n_samples", "synthetic_lengths")


class Command(NamedTuple):
    doc: str
    shown: str
    argv: tuple[str, ...]  # attn-companion's arguments; () for a make target that runs no notebook


class Run(NamedTuple):
    kind: str  # "notebook" (a source in notebooks/) or "student copy" (graded as a submission)
    notebook: str
    parameters: str  # JSON, sorted keys

    @property
    def values(self) -> dict:
        return json.loads(self.parameters)


def _run(kind: str, notebook: str, parameters: dict) -> Run:
    """The run of ``notebook`` with those of ``parameters`` that it declares and that differ from its defaults."""
    declared = build.notebook_parameters(build.NOTEBOOK_DIR / f"{notebook}.py")
    own = {k: v for k, v in parameters.items() if k in declared and v != declared[k]}
    return Run(kind, notebook, json.dumps(own, sort_keys=True))


def page_text(doc: str) -> str:
    """A page's markdown: a chapter's markdown cells (its py:percent source), a prose page's file."""
    path = ROOT / doc
    if path.suffix == ".py":
        return "\n\n".join(cell.source for cell in jupytext.read(path).cells if cell.cell_type == "markdown")
    return path.read_text()


def code_lines(markdown: str) -> list[str]:
    """The lines of the code blocks (``\\`` continuations joined) and the inline code spans of a markdown text."""
    lines = [line for block in FENCE.findall(markdown) for line in block.replace("\\\n", " ").splitlines()]
    return lines + [" ".join(span.split()) for span in INLINE.findall(FENCE.sub("", markdown))]


def to_argv(line: str) -> tuple[str, ...] | None:
    """``attn-companion``'s arguments for a shell line that runs it or ``make`` with a target of the Makefile
    (``make book PARAMS=...`` runs ``attn-companion book --params ...``; other make targets run no notebook: ``()``);
    None for any other line (the program is the line's first word, after any ``NAME=value``)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        words = words[1:]
    if words[:1] == ["make"]:
        if not all(w in MAKE_TARGETS or "=" in w for w in words[1:]):
            return None  # prose that begins with "make"
        assignments = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        return ("book", "--params", assignments.get("PARAMS", "")) if "book" in words[1:] else ()
    return tuple(words[1:]) if words and Path(words[0]).name == "attn-companion" else None


def documented_commands() -> list[Command]:
    """Every make / attn-companion command of :data:`DOCS`, in the order shown (a repeated one once)."""
    found: dict[tuple[str, ...], Command] = {}
    for doc in DOCS:
        for line in code_lines(page_text(doc)):
            argv = to_argv(line)
            if argv is not None:
                found.setdefault(argv if argv else (line,), Command(doc, line.split("#")[0].strip(), argv))
    return list(found.values())


def runs_of(command: Command) -> list[Run]:
    """The runs a command makes, with its parameters as documented."""
    if not command.argv:
        return []
    args = cli.parser().parse_args(command.argv)
    if args.command == "book":
        parameters = {**cli._params_line(args.params), **cli._parameters(args.parameter)}
        models = parameters.pop("models", None)  # each model chapter on each model of the build
        per_model = [{**parameters, "model": m} for m in models] if isinstance(models, list) else [parameters]
        return [_run("notebook", nb.stem, values) for nb in build.book_notebooks() for values in per_model]
    if args.command == "run":
        return [_run("notebook", build.resolve_notebook(args.notebook).stem, cli._parameters(args.parameter))]
    if args.command == "sweep":  # wherever its tasks run (--scheduler): here, the same runs
        combos = sweep.combinations(cli._parameters(args.parameter, multi=True))
        return [_run("notebook", build.resolve_notebook(args.notebook).stem, c) for c in combos]
    if args.command == "windows":  # every window of every chapter, with the parameters the command gives them
        *_, grids = windows.plan(args.k, args.notebooks, cli._parameters(args.parameter))
        return [_run("notebook", nb, c) for nb, grid in grids.items() for c in sweep.combinations(grid)]
    if args.command == "student":  # the course's notebooks, run as nbgrader grades them
        stems = [build.resolve_notebook(n).stem for n in args.notebooks] or exercises.exercise_notebooks()
        return [_run("student copy", s, cli._parameters(args.parameter)) for s in stems]
    if args.command == "grade":  # the notebooks of a course, with the parameters it was written with
        return [_run("student copy", s, {}) for s in exercises.exercise_notebooks()]
    return []  # params, corpus: no notebook runs


def scaled(run: Run) -> Run:
    """The run with L = 64, model gpt2-random and the small build's :data:`SIZES`, a notebook's other parameters
    over the small build's (a student copy's: as documented)."""
    base = SMALL if run.kind == "notebook" else {k: SMALL[k] for k in SIZES}
    sizes = {k: SMALL[k] for k in SIZES if k in run.values}
    return _run(run.kind, run.notebook, {**base, **run.values, **sizes, **SCALED})


def executions(commands: list[Command]) -> dict[Run, list[str]]:
    """The distinct scaled runs of ``commands`` that the small build does not make, with the commands that make
    them. To keep ``make test`` short, runs that differ only in ``seed`` count as one, and so do runs that differ
    only in the window (``chapters``, ``offset``: the windows of ``attn-companion windows``; tests/book/test_windows.py
    executes one in the middle of the novel) (neither changes a code path; the preflight above checks every
    documented value), and a course is graded on its first chapter."""
    small = {_run("notebook", nb.stem, SMALL) for nb in build.book_notebooks()}
    todo: dict[Run, list[str]] = {}
    for command in commands:
        runs = [scaled(run) for run in runs_of(command)]
        courses = [r for r in runs if r.kind == "student copy"]
        for run in [r for r in runs if r.kind == "notebook"] + courses[:1]:
            run = _run(run.kind, run.notebook, {**run.values, "seed": SMALL.get("seed", 0)}) \
                if run.kind == "notebook" and "seed" in run.values else run
            if run.kind == "notebook" and {"chapters", "offset"} & set(run.values):  # the small build's window
                run = _run(run.kind, run.notebook, {k: v for k, v in run.values.items()
                                                    if k not in ("chapters", "offset")})
            if run not in small:
                todo.setdefault(run, []).append(command.shown)
    return todo


# --- reading the commands -------------------------------------------------------------------------------------

PAGE = '''\
Build it:

```bash
make book PARAMS="L=512 seed=1"   # a comment
.venv/bin/attn-companion grade subs/*/*.ipynb --out g.csv \\
    -p model gpt2-random -p L 64
pip install -e .
```

Or name them, e.g. `attn-companion student --out handout/
ch1_vanishing ch4_gradient`; see `-p NAME VALUE` and `make test`.

```bash
git clone REPOSITORY attn-companion && cd attn-companion
OMP_NUM_THREADS=1 .venv/bin/attn-companion params ch2_distance
```

Not commands: `make sure it survives`, `author = {The attn-companion contributors}`.
'''


def test_commands_are_read_from_code_blocks_and_inline_code():
    argvs = [to_argv(line) for line in code_lines(PAGE)]
    assert [a for a in argvs if a is not None] == [
        ("book", "--params", "L=512 seed=1"),
        ("grade", "subs/*/*.ipynb", "--out", "g.csv", "-p", "model", "gpt2-random", "-p", "L", "64"),
        ("params", "ch2_distance"),
        ("student", "--out", "handout/", "ch1_vanishing", "ch4_gradient"),
        (),  # make test: no notebook
    ]


def test_the_pages_show_the_commands_this_test_knows():
    shown = {c.argv for c in documented_commands()}
    for argv in [("book", "--params", "L=512 seed=1"), ("book", "--params", "model=gpt2 L=512 seed=3"),
                 ("run", "ch2_distance", "-p", "L", "512", "-p", "seed", "1"),
                 ("sweep", "ch4_gradient", "-p", "logit_scale", "raw,model", "-p", "seed", "0,1", "--workers", "2"),
                 ("sweep", "ch2_distance", "-p", "L", "256,512,1024", "--scheduler", "tcp://127.0.0.1:8786"),
                 ("windows",), ("book", "--windows", "runs/windows/windows.json")]:
        assert argv in shown
    # the commands that start a Dask cluster by hand are shown, and are not read as attn-companion's
    rerun = code_lines((ROOT / "book" / "rerun.md").read_text())
    dask = [line for line in rerun if ".venv/bin/dask " in line]
    assert len(dask) == 2 and all(to_argv(line) is None for line in dask)
    assert {a[0] for a in shown if a} >= {"book", "run", "sweep", "windows", "params", "student", "grade"}
    for command in documented_commands():  # every one is a valid command line
        if command.argv:
            cli.parser().parse_args(command.argv)


def test_the_windows_command_runs_each_chapter_on_each_window_and_executes_what_the_small_build_does_not():
    command = Command("x", "", ("windows", "--windows", "3", "--notebooks", "ch1_vanishing", "ch2_distance"))
    runs = runs_of(command)
    assert [(r.notebook, r.values["chapters"]) for r in runs] == [
        (nb, [c, 365]) for nb in ("ch1_vanishing", "ch2_distance") for c in (1, 122, 244)]
    assert all(r.values.get("n_trials") == windows.SHORT_SYNTHETIC[r.notebook]["n_trials"] for r in runs)
    # scaled, a window's run is the small build's (its window and its synthetic sizes are the small build's)
    assert executions([command]) == {}
    wider = Command("x", "", ("windows", "--windows", "2", "--notebooks", "ch2_distance", "-p", "N", "3"))
    assert list(executions([wider])) == [_run("notebook", "ch2_distance", {**SMALL, "N": 3, **SCALED})]


def test_runs_are_scaled_and_deduplicated():
    sweep_ch2 = Command("x", "", ("sweep", "ch2_distance", "-p", "N", "5,10,20", "--workers", "2"))
    run_ch2 = Command("x", "", ("run", "ch2_distance", "-p", "N", "10", "-p", "L", "512"))
    book = Command("x", "", ("book", "--params", "model=gpt2 L=512"))
    assert [r.values.get("N") for r in runs_of(sweep_ch2)] == [None, 10, 20]  # N = 5: ch2's default
    todo = executions([sweep_ch2, run_ch2, book])
    # so the first run of the sweep is the small build's, and so is every notebook of the book here
    assert sorted(r.values["N"] for r in todo) == [10, 20] and {r.notebook for r in todo} == {"ch2_distance"}
    ten = _run("notebook", "ch2_distance", {**SMALL, "N": 10, **SCALED})
    assert ten in todo and ten.values["L"] == 64 and ten.values["lengths"] == SMALL["lengths"]
    assert todo[ten] == ["", ""]  # made by the sweep and by the run
    teach = executions([Command("x", "", ("student", "--out", "c", "ch1_vanishing", "-p", "L", "100")),
                        Command("y", "", ("grade", "--course", "c", "s/a.ipynb"))])
    sizes = {k: SMALL[k] for k in SIZES}  # a course's copies run at the small build's synthetic sizes too
    assert teach[_run("student copy", "ch1_vanishing", {**sizes, **SCALED})] == [""]  # graded on its first chapter
    first = exercises.exercise_notebooks()[0]  # grade's course: graded on its first chapter
    assert set(teach) == {_run("student copy", s, {**sizes, **SCALED}) for s in ("ch1_vanishing", first)}


# --- the preflight, as documented ------------------------------------------------------------------------------

def _as_documented(run: Run) -> dict:
    """The documented parameters; a hub model becomes gpt2-random (same context and tokenizer: no network here)."""
    values = run.values
    if values.get("model", "auto") not in ("auto", "gpt2-random", "smollm2-135m"):
        values["model"] = "gpt2-random"
    return values


def _preflight(runs: list[Run]) -> None:
    build.preflight([(build.NOTEBOOK_DIR / f"{r.notebook}.py", _as_documented(r)) for r in runs])


def test_documented_parameters_pass_the_preflight():
    """One preflight for the distinct runs of all the commands (the model and the corpus are read once); on a
    failure, the commands that fail are named."""
    commands = documented_commands()
    try:
        _preflight(list(dict.fromkeys(r for c in commands for r in runs_of(c))))
    except ValueError as err:
        failing = []
        for command in commands:
            try:
                _preflight(runs_of(command))
            except ValueError as again:
                failing.append(f"{command.shown} ({command.doc}): {again}")
        pytest.fail(f"{err}\ndocumented commands that fail:\n" + "\n".join(failing))


@pytest.mark.parametrize("command", [c for c in documented_commands()
                                     if c.argv[:1] == ("params",) or c.argv == ("corpus",)], ids=lambda c: c.shown)
def test_documented_commands_that_run_no_notebook(command, capsys):
    assert cli.main(list(command.argv)) == 0


# --- the executions ---------------------------------------------------------------------------------------------

TODO = executions(documented_commands())
NOTEBOOK_RUNS = [r for r in TODO if r.kind == "notebook"]
STUDENT_COPIES = [r for r in TODO if r.kind == "student copy"]


@pytest.mark.slow
@pytest.mark.parametrize("run", NOTEBOOK_RUNS, ids=lambda r: f"{r.notebook}:{r.parameters}")
def test_documented_run_executes(run, tmp_path):
    try:
        sweep.run_one(build.NOTEBOOK_DIR / f"{run.notebook}.py", run.values, tmp_path, progress=False)
    except build.NotebookFailed as err:
        pytest.fail(f"{err} (run by: {'; '.join(TODO[run])})")


@pytest.mark.slow
@pytest.mark.skipif(not STUDENT_COPIES, reason="no documented command writes a course")
def test_documented_courses_are_graded(tmp_path):
    """The chapters that the documented courses are graded on, released in one course (each with the parameters of
    its command) and their unsolved copies graded in one ``grade`` run, as a class's submissions are."""
    course, submissions = tmp_path / "course", []
    for run in STUDENT_COPIES:
        (released,) = student.write_course(course, [run.notebook], run.values)
        submission = tmp_path / "submissions" / "alice" / released.name
        submission.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(released, submission)
        submissions.append(submission)
    rows = grading.grade(course, submissions, tmp_path / "grades.csv")
    assert len(rows) == len(STUDENT_COPIES)
    for run, row in zip(STUDENT_COPIES, rows):
        made_by = "; ".join(TODO[run])
        assert row.status == "graded", f"{row.feedback} (run by: {made_by})"
        graded = nbformat.read(course / "autograded" / row.student_id / run.notebook / f"{run.notebook}.ipynb",
                               as_version=4)
        errors = [(cell.metadata.get("nbgrader", {}), out) for cell in graded.cells
                  for out in cell.get("outputs", []) if out.output_type == "error"]
        # an unsolved copy runs to the end: only the test cells fail, on the stubs' NotImplementedError
        assert errors, f"no test cell failed (run by: {made_by})"
        for meta, out in errors:
            assert meta.get("grade") and out.ename == "NotImplementedError", \
                f"{meta.get('grade_id', 'a chapter cell')}: {out.ename}: {out.evalue} (run by: {made_by})"
