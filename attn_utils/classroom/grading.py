"""The autograder: execute submitted notebooks in child processes under a time limit and score each exercise.

:func:`grade` runs each submission with papermill in a process of its own (killed with its kernel at
the time limit), lets :func:`attn_utils.classroom.exercises.report` run the checks inside the submission's kernel,
and writes a CSV with a score and feedback per student and exercise. Submission code never runs in the
grader's process. A submission that is not a notebook, whose chapter is unknown, that lost cells,
crashes outside its exercise cells or runs out of time scores zero with the reason.
"""
from __future__ import annotations

import copy
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jupytext
import nbformat
import psutil

from attn_utils.book import runlog
from attn_utils.classroom.exercises import GRADE_OUT_ENV, exercise_notebooks, exercises_of
from attn_utils.classroom.student import CELL_KEY, CHECK_TAG, EXERCISE_TAG, METADATA_KEY, per_notebook

__all__ = ["Grade", "grade"]

class Rejected(Exception):
    """A submission that scores zero as a whole; the message is the reason given to the student."""


@dataclass
class Grade:
    """One row of the grades CSV: a student's score for one exercise (or for a whole rejected file)."""

    student: str
    notebook: str
    exercise: str
    score: float
    max: float | None
    feedback: str
    submission: str


GRADING_CELL = """\
# Added by the grader: run the checks of every coding exercise in this kernel.
from attn_utils.classroom import exercises
exercises.report({notebook!r}, globals())"""


def _student_name(path: Path) -> str:
    """The folder name for ``alice/ch1_vanishing.ipynb`` (a copy handed back as is), else the file stem."""
    return path.parent.name if path.stem in exercise_notebooks() and path.parent.name else path.stem


def _read_submission(path: Path) -> nbformat.NotebookNode:
    """Parse a submission (.ipynb, or a py:percent .py) without executing anything."""
    if path.suffix not in (".ipynb", ".py"):
        raise Rejected(f"not a notebook: {path.name} is neither an .ipynb nor a .py file")
    try:
        nb = nbformat.read(path, as_version=4) if path.suffix == ".ipynb" else jupytext.read(path, fmt="py:percent")
        nbformat.validate(nb)
    except Exception as exc:  # any parse failure of an untrusted file
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise Rejected(f"not a notebook: {path.name} cannot be read ({type(exc).__name__}: {first})") from None
    return nb


def _chapter_of(nb: nbformat.NotebookNode) -> str:
    info = nb.metadata.get(METADATA_KEY)
    chapter = info.get("notebook") if isinstance(info, dict) else None
    if chapter not in exercise_notebooks():
        raise Rejected(f"cannot tell which chapter this is: its metadata has no '{METADATA_KEY}' chapter "
                       f"(hand in the student copy you were given, with its metadata)")
    return chapter


def _check_cells(nb: nbformat.NotebookNode, chapter: str) -> None:
    """Reject a submission whose exercise cells or other code cells of the student copy are gone."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    gone = [k for k in exercises_of(chapter)
            if not any(c.metadata.get("exercise") == k and EXERCISE_TAG in c.metadata.get("tags", []) for c in code)]
    if gone:
        raise Rejected(f"the exercise cell of {', '.join(gone)} was deleted (or lost its 'exercise' tag)")
    expected = nb.metadata[METADATA_KEY].get("code_cells")
    if not isinstance(expected, int):
        raise Rejected(f"its '{METADATA_KEY}' metadata lost the number of code cells (hand in the student copy "
                       f"you were given, with its metadata)")
    present = {c.metadata.get(CELL_KEY) for c in code}
    missing = sorted(set(range(expected)) - present)
    if missing:
        raise Rejected(f"{len(missing)} code cell(s) of the student copy were deleted or merged: cell(s) "
                       f"{', '.join(map(str, missing))} (numbered by '{CELL_KEY}' in the cell metadata)")


def _prepared(nb: nbformat.NotebookNode, chapter: str) -> nbformat.NotebookNode:
    """The submission as it is executed: errors in exercise and check cells do not stop the run (each
    exercise is scored on its own), and a last cell reports the checks."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        tags = cell.metadata.setdefault("tags", [])
        if cell.cell_type == "code" and (EXERCISE_TAG in tags or CHECK_TAG in tags):
            tags.append("raises-exception")
    nb.cells.append(nbformat.v4.new_code_cell(GRADING_CELL.format(notebook=chapter), metadata={"tags": ["grader"]}))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill papermill and everything it started (the kernel runs in a session of its own)."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    for p in [*family, proc]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(family, timeout=10)


def _first_line(source: str) -> str:
    return next((line for line in source.splitlines() if line.strip() and not line.startswith("#")), "")[:60]


def _crash_reason(executed: Path, log: Path) -> str:
    """Why a run stopped before the grading cell: the first error outside the exercise cells, or the log."""
    if executed.is_file():
        nb = nbformat.read(executed, as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
                continue
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    where = f"cell {cell.metadata.get(CELL_KEY, '?')} ({_first_line(cell.source)!r})"
                    return f"crashed in {where}: {out.ename}: {out.evalue}"[:500]
    tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return f"the notebook stopped before it could be graded: {tail[-1][:300] if tail else 'no output'}"


def _exercise_errors(executed: Path) -> dict[str, str]:
    """exercise key -> the error an exercise cell raised while the notebook ran (before the checks)."""
    errors = {}
    for cell in nbformat.read(executed, as_version=4).cells:
        key = cell.metadata.get("exercise")
        if key and EXERCISE_TAG in cell.metadata.get("tags", []):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    errors[key] = f"your exercise cell raised {out.ename}: {out.evalue}"[:300]
    return errors


def _execute(nb: nbformat.NotebookNode, chapter: str, parameters: Mapping[str, Any],
             time_limit: float) -> dict[str, tuple[float, str]]:
    """Execute a submission with papermill in a child process; return exercise -> (score, feedback)."""
    with tempfile.TemporaryDirectory(prefix="attn-grade-") as tmp:
        tmp = Path(tmp)
        source, executed, results, log = (tmp / n for n in ("submission.ipynb", "executed.ipynb",
                                                               "results.json", "papermill.log"))
        nbformat.write(_prepared(nb, chapter), source)
        cmd = [sys.executable, "-m", "papermill", str(source), str(executed), "--kernel", "python3",
               "--cwd", str(tmp), "--no-progress-bar", "--parameters_yaml", json.dumps(dict(parameters))]
        env = {**os.environ, GRADE_OUT_ENV: str(results), runlog.RUN_DIR_ENV: str(tmp / "run"),
               runlog.NOTEBOOK_ENV: chapter}
        with log.open("w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp,
                                    start_new_session=True)
            try:
                proc.wait(timeout=time_limit)
            except subprocess.TimeoutExpired:
                _kill_tree(proc)
                raise Rejected(f"did not finish within {time_limit:g} s (an endless loop, or too slow "
                               f"for the time limit)") from None
        if not results.is_file():
            raise Rejected(_crash_reason(executed, log))
        return _scores(results, executed, chapter)


def _scores(results: Path, executed: Path, chapter: str) -> dict[str, tuple[float, str]]:
    """exercise -> (score, feedback) from the grading cell's JSON and the errors of the exercise cells."""
    errors = _exercise_errors(executed) if executed.is_file() else {}
    try:
        reported = json.loads(results.read_text())
        return {key: (min(1.0, max(0.0, float(reported[key]["score"]))),
                      "; ".join(filter(None, [errors.get(key), str(reported[key]["feedback"])])))
                for key in exercises_of(chapter)}
    except (ValueError, KeyError, TypeError) as exc:  # the file was written inside the submission's kernel
        raise Rejected(f"the grading cell's report is unreadable ({type(exc).__name__}: {exc})") from None


def _grade_one(path: Path, parameters: Mapping[str, dict[str, Any]], time_limit: float) -> list[Grade]:
    student = _student_name(path)
    try:
        nb = _read_submission(path)
        chapter = _chapter_of(nb)
    except Rejected as exc:
        return [Grade(student, "", "", 0.0, None, str(exc), str(path))]
    try:
        _check_cells(nb, chapter)
        scores = _execute(nb, chapter, parameters[chapter], time_limit)
    except Rejected as exc:
        return [Grade(student, chapter, key, 0.0, 1.0, str(exc), str(path)) for key in exercises_of(chapter)]
    except Exception as exc:  # a failure of the grader on one file (a full disk, ...) must not stop the batch
        reason = f"could not be graded: {type(exc).__name__}: {exc}"
        return [Grade(student, chapter, key, 0.0, 1.0, reason, str(path)) for key in exercises_of(chapter)]
    return [Grade(student, chapter, key, round(score, 3), 1.0, feedback, str(path))
            for key, (score, feedback) in scores.items()]


def _write_csv(grades: list[Grade], out_csv: Path) -> None:
    columns = list(Grade.__dataclass_fields__)
    with out_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for g in grades:
            writer.writerow({c: "" if getattr(g, c) is None else getattr(g, c) for c in columns})


def _write_feedback(grades: list[Grade], folder: Path) -> None:
    """One markdown file per student: each submission's score and the feedback per exercise."""
    folder.mkdir(parents=True, exist_ok=True)
    for student in dict.fromkeys(g.student for g in grades):
        lines = [f"# Feedback for {student}", ""]
        for submission in dict.fromkeys(g.submission for g in grades if g.student == student):
            rows = [g for g in grades if g.submission == submission]
            total = sum(g.max or 0 for g in rows)
            lines += [f"## {rows[0].notebook or 'unknown chapter'} ({submission}): "
                      f"{sum(g.score for g in rows):g} / {total:g}", ""]
            lines += [f"- **{g.exercise or 'whole file'}** ({g.score:g}): {g.feedback}" for g in rows] + [""]
        (folder / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', student)}.md").write_text("\n".join(lines))


def grade(submissions: Iterable[Path | str], out_csv: Path | str, *, time_limit: float = 600.0,
          parameters: Mapping[str, Any] | None = None) -> list[Grade]:
    """Grade submitted notebooks; write ``out_csv`` and ``feedback/<student>.md`` beside it.

    Each submission runs with papermill in a process of its own, killed with its kernel after
    ``time_limit`` seconds; ``parameters`` (validated first; each notebook takes those it declares)
    go to every run, e.g. ``{"model": "gpt2-random", "L": 64}``. A submission that is not a notebook,
    whose chapter is unknown, that lost code cells, crashes outside its exercise cells or runs out of
    time scores zero with the reason; every other one gets a score in [0, 1] per coding exercise.
    The batch always finishes.
    """
    paths = [Path(s) for s in submissions]
    if not paths:
        raise ValueError("no submissions given")
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"submission {str(missing[0])!r} is not a file")
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0:
        raise ValueError(f"time_limit must be a number of seconds > 0, got {time_limit!r}")
    own = per_notebook(dict(parameters or {}), exercise_notebooks())
    grades: list[Grade] = []
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] grading {path}", flush=True)
        rows = _grade_one(path, own, float(time_limit))
        grades += rows
        print(f"[{i}/{len(paths)}] {rows[0].student}: {sum(g.score for g in rows):g} / "
              f"{sum(g.max or 0 for g in rows):g}  {_summary(rows)}", flush=True)
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    _write_csv(grades, out_csv)
    _write_feedback(grades, out_csv.parent / "feedback")
    print(f"grades of {len(paths)} submission(s) written to {out_csv}; feedback in {out_csv.parent / 'feedback'}")
    return grades


def _summary(rows: list[Grade]) -> str:
    """The reason shared by every row of a submission that scored zero, else nothing."""
    reasons = {g.feedback for g in rows}
    return reasons.pop() if len(reasons) == 1 and all(g.score == 0 for g in rows) else ""
