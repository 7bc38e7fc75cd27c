"""Grading with nbgrader: collect the submissions into a course, autograde them, write grades and feedback.

:func:`grade` takes a course folder written by :func:`attn_utils.classroom.student.write_course` and
either submitted files (standalone) or nothing (inside an nbgrader course: what ``nbgrader collect`` or
``nbgrader zip_collect`` put in ``submitted/``). For each submission it

1. collects it: reads it without running anything (``.ipynb``, or a py:percent ``.py``), finds its
   chapter, and copies it to ``submitted/<student id>/<chapter>/<chapter>.ipynb`` with a timestamp, as
   ``nbgrader collect`` does; a file that is not a notebook, or whose chapter is not in the course,
   gets its row without running; another file in a student's folder (``alice/notes.txt``) is reported
   and not graded;
2. runs ``nbgrader autograde`` (the cells put back into the released notebook's order and metadata,
   test and read-only cells restored from the gradebook, checksums checked, a time limit per cell, the
   kernel in the classroom's sandbox, the hidden tests judged outside it: the classroom's
   :class:`~attn_utils.classroom.nbgrader_support.ReleasedCells` and
   :class:`~attn_utils.classroom.nbgrader_support.GuardedExecute`);
3. writes the submission's row into the CSV and its student's markdown feedback at once, so an
   interrupted batch keeps what finished, and a re-run skips every submission whose file has not
   changed since its row was written.

At the end ``nbgrader generate_feedback`` makes the HTML feedback (one run per chapter) and ``nbgrader
export`` writes the gradebook's CSV beside the grades. Student ids are the
students' names made safe for paths and URLs by a reversible escape (:func:`student_id`), so two names
never share a feedback file; a name whose escape is longer than :data:`MAX_ID` characters keeps its
beginning and a hash, and the gradebook keeps every name (:func:`student_name` reads it back); the CSV
gives both.
"""
from __future__ import annotations

import csv
import datetime as dt
import errno
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import jupytext
import nbformat

from attn_utils.classroom import nbgrader_support as support
from attn_utils.classroom import sandbox

__all__ = ["MAX_ID", "Row", "grade", "student_id", "student_name"]


@dataclass
class Row:
    """One row of the grades CSV: one submission."""

    student: str          # the name: the submission's folder, or its file name without the extension
    student_id: str       # nbgrader's id of the student (student_id(student))
    notebook: str         # the chapter, "" when it could not be told
    status: str           # "graded", "rejected" (not run) or "failed" (nbgrader could not grade it)
    score: float          # autograded points earned
    max_score: float      # autograded points available
    manual_points: float  # points of the answers the teacher grades by hand (formgrader)
    feedback: str         # what failed, part by part, or why the file was not graded
    feedback_file: str    # the student's markdown feedback, relative to the CSV's folder
    submission: str       # the file graded
    sha256: str           # of the file graded: a re-run skips a row whose file has not changed


COLUMNS = [f.name for f in fields(Row)]


# --- student ids --------------------------------------------------------------------------------------------

_SAFE = re.compile(r"[A-Za-z0-9_.-]")
MAX_ID = 100   # characters of a student id (a file name: at most 255 bytes)
_HASHED = re.compile(r"~[0-9a-f]{16}$")


def student_id(name: str) -> str:
    """A path- and URL-safe id for a student's name: letters, digits, ``_ . -`` stay (``.`` and ``-`` not in
    front), every other character becomes ``=<hex code point>=``; when that is longer than :data:`MAX_ID`,
    its first whole characters and ``~`` and 16 hex digits of the name's sha256."""
    if not name:
        raise ValueError("a student's name is empty")
    parts = [c if _SAFE.fullmatch(c) and not (i == 0 and c in ".-") else f"={ord(c):x}=" for i, c in enumerate(name)]
    sid = "".join(parts)
    if len(sid) <= MAX_ID:
        return sid
    head, room = [], MAX_ID - 17
    for part in parts:
        if len(part) > room:
            break
        head.append(part)
        room -= len(part)
    return "".join(head) + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]


def student_name(sid: str, course: Path | str | None = None) -> str:
    """The name :func:`student_id` made ``sid`` from: undone from the id itself, or, for a shortened id, read from
    the gradebook of ``course`` (where :func:`grade` records every student's name)."""
    if not _HASHED.search(sid):
        return re.sub(r"=([0-9a-f]+)=", lambda m: chr(int(m.group(1), 16)), sid)
    from nbgrader.api import Gradebook, MissingEntry

    if course is None:
        raise ValueError(f"student id {sid!r} was shortened: its name is in the course's gradebook")
    with Gradebook(f"sqlite:///{Path(course) / 'gradebook.db'}", support.COURSE_ID) as gb:
        try:
            return gb.find_student(sid).last_name
        except MissingEntry:
            raise ValueError(f"student id {sid!r} was shortened and is not in the gradebook of {course}") from None


# --- collecting -------------------------------------------------------------------------------------------------


class Rejected(Exception):
    """A submission that is not run; the message is the reason given to the student."""


@dataclass
class Submission:
    path: Path
    student: str
    sid: str
    sha256: str
    notebook: str = ""
    nb: nbformat.NotebookNode | None = None
    reason: str = ""
    ignored: list[str] = field(default_factory=list)  # cells whose nbgrader metadata the grading ignores


def _name_in_course(sid: str, course: Path) -> str:
    """The name of the student whose nbgrader id is ``sid`` (an id of the course's own, if it is not one of ours)."""
    try:
        return student_name(sid, course)
    except ValueError:
        return sid


def _name_of(path: Path, chapters: list[str]) -> str:
    """The folder name for ``alice/ch1_vanishing.ipynb`` (a copy handed back as is), else the file stem."""
    return path.parent.name if path.stem in chapters and path.parent.name else path.stem


def _stray(path: Path, chapters: list[str]) -> bool:
    """A file beside a student's submission (``alice/notes.txt`` next to ``alice/ch0_setting.ipynb``) whose name
    is no chapter: not a submission, and not a student."""
    return path.stem not in chapters and any((path.parent / f"{c}{suffix}").is_file()
                                             for c in chapters for suffix in (".ipynb", ".py"))


def _read(path: Path) -> nbformat.NotebookNode:
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


def _chapter(nb: nbformat.NotebookNode, path: Path, chapters: list[str]) -> str:
    info = nb.metadata.get(support.METADATA_KEY)
    chapter = info.get("notebook") if isinstance(info, dict) else None
    if chapter is None:
        chapter = path.stem if path.stem in chapters else (chapters[0] if len(chapters) == 1 else None)
    if chapter not in chapters:
        raise Rejected(f"cannot tell which chapter of this course it is ({', '.join(chapters)}): hand in the "
                       f"notebook you were given, with its metadata, or name the file after its chapter")
    return chapter


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _plan(course: Path, submissions: list[Path] | None) -> tuple[list[Submission], list[Path]]:
    """Every submission with its student, id and chapter (or why it is not run), and the stray files; nothing is
    run or copied."""
    chapters = sorted(p.name for p in (course / "release").iterdir() if p.is_dir()) \
        if (course / "release").is_dir() else []
    if not chapters:
        raise ValueError(f"course {course}: no released assignment in release/ (run attn-companion student first)")
    if submissions is None:  # inside an nbgrader course: what nbgrader collect put in submitted/
        found = sorted((course / "submitted").glob("*/*/*.ipynb"))
        found = [p for p in found if p.parent.name in chapters and p.stem == p.parent.name]
        if not found:
            raise ValueError(f"course {course}: nothing in submitted/<student>/<chapter>/ (run nbgrader collect, or "
                             f"name the submission files)")
        plan = [Submission(p, _name_in_course(p.parent.parent.name, course), p.parent.parent.name, _sha256(p))
                for p in found]
        strays: list[Path] = []
    else:
        if not submissions:
            raise ValueError("no submissions given")
        missing = [p for p in submissions if not p.is_file()]
        if missing:
            raise ValueError(f"submission {str(missing[0])!r} is not a file")
        plan, strays = [], [p for p in submissions if _stray(p, chapters)]
        for p in submissions:
            if p not in strays:
                name = _name_of(p, chapters)
                plan.append(Submission(p, name, student_id(name), _sha256(p)))
    released = {}
    for s in plan:
        try:
            s.nb = _read(s.path)
            s.notebook = _chapter(s.nb, s.path, chapters)
        except Rejected as exc:
            s.reason = str(exc)
            continue
        if s.notebook not in released:
            released[s.notebook] = nbformat.read(course / "release" / s.notebook / f"{s.notebook}.ipynb", as_version=4)
        s.ignored = support.restore_cells(s.nb.cells, released[s.notebook].cells)[1]
    seen: dict[tuple[str, str], Submission] = {}
    ids: dict[str, Submission] = {}
    for s in plan:
        other = ids.setdefault(s.sid.casefold(), s)
        if other.sid != s.sid:  # one folder on a case-insensitive file system
            raise ValueError(f"students {other.student!r} ({other.path}) and {s.student!r} ({s.path}) differ only in "
                             f"letter case: rename one")
        if s.notebook:
            other = seen.setdefault((s.sid, s.notebook), s)
            if other is not s:
                raise ValueError(f"{other.path} and {s.path} are both {s.student!r}'s {s.notebook}: keep one")
    return plan, strays


def _collect(course: Path, s: Submission) -> None:
    """Put a submission where ``nbgrader collect`` would: ``submitted/<id>/<chapter>/<chapter>.ipynb``."""
    folder = course / "submitted" / s.sid / s.notebook
    target = folder / f"{s.notebook}.ipynb"
    if s.path.resolve() == target.resolve():
        return
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    if s.path.suffix == ".ipynb":
        shutil.copyfile(s.path, target)  # the same bytes: a later run from submitted/ sees the same checksum
    else:
        nbformat.write(s.nb, target)
    stamp = dt.datetime.fromtimestamp(s.path.stat().st_mtime, dt.timezone.utc)
    (folder / "timestamp.txt").write_text(stamp.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))


# --- grading one submission ----------------------------------------------------------------------------------------


def _failure(result: dict) -> str:
    """The reason nbgrader gives for a failed step: its last error line."""
    text = (result.get("log", "") + "\n" + result.get("error", "")).splitlines()
    errors = [line.split("]", 1)[-1].strip() for line in text if "[ERROR]" in line or "Error" in line]
    errors = [e for e in errors if e and not e.startswith(("There was an error processing", "Please see"))]
    return (errors[-1] if errors else (text[-1] if text else "no log"))[:300]


def _interrupted(result: dict) -> bool:
    return "KeyboardInterrupt" in result.get("error", "")


def _first_error(cell: nbformat.NotebookNode) -> str:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return f"{out.get('ename', 'Error')}: {out.get('evalue', '')}".strip()
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            return f"wrote to stderr: {out.get('text', '').strip()[:200]}"
    return ""


@dataclass
class Cell:
    name: str
    score: float | None
    max_score: float
    manual: bool          # an answer the teacher grades (a markdown cell)
    pending: bool         # nbgrader waits for the teacher's grade (an unchanged answer scores 0 at once)
    message: str


def _cells(course: Path, s: Submission) -> list[Cell]:
    """The graded cells of an autograded submission, from the gradebook, with the error each failed test raised."""
    from nbgrader.api import Gradebook

    autograded = course / "autograded" / s.sid / s.notebook / f"{s.notebook}.ipynb"
    messages = {}
    if autograded.is_file():
        for cell in nbformat.read(autograded, as_version=4).cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if grade_id:
                messages[grade_id] = _first_error(cell)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", support.COURSE_ID) as gb:
        submitted = gb.find_submission_notebook(s.notebook, s.notebook, s.sid)
        return [Cell(g.name, g.score, float(g.max_score), g.cell.cell_type == "markdown", bool(g.needs_manual_grade),
                     messages.get(g.name, "")) for g in submitted.grades]


def _message(cell: Cell) -> str:
    return (cell.message or "no points").splitlines()[0][:400]


def _summary(cells: list[Cell]) -> str:
    """The failed tests and why, a reason shared by all of them said once."""
    failed = [c for c in cells if not c.manual and (c.score or 0) < c.max_score]
    if not failed:
        return "every autograded test passed"
    if len(failed) > 1 and len({_message(c) for c in failed}) == 1:
        return f"{len(failed)} tests failed ({', '.join(c.name for c in failed)}): {_message(failed[0])}"
    return "; ".join(f"{c.name}: {_message(c)}" for c in failed)


def _grade_one(course: Path, api, s: Submission, out_dir: Path) -> tuple[Row, list[Cell]]:
    row = Row(s.student, s.sid, s.notebook, "rejected", 0.0, 0.0, 0.0, s.reason, _feedback_name(s.sid),
              str(s.path), s.sha256)
    if s.reason:
        return row, []
    _collect(course, s)
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", support.COURSE_ID) as gb:
        gb.update_or_create_student(s.sid, last_name=s.student)  # the name, for student_name and the formgrader
    result = api.autograde(s.notebook, s.sid, force=True, create=True)
    if _interrupted(result):
        raise KeyboardInterrupt
    cells = _cells(course, s)
    row.max_score = sum(c.max_score for c in cells if not c.manual)
    row.manual_points = sum(c.max_score for c in cells if c.manual)
    if not result["success"]:
        if "[Errno 28]" in result.get("error", "") + result.get("log", ""):  # ENOSPC: the next ones would fail too
            raise OSError(errno.ENOSPC, "No space left on device", str(course))
        row.status, row.feedback = "failed", f"nbgrader could not grade it: {_failure(result)}"
        return row, cells
    row.status = "graded"
    row.score = round(sum(c.score or 0 for c in cells if not c.manual), 6)
    row.feedback = _summary(cells) + (f"; {_ignored(s)}" if s.ignored else "")
    return row, cells


def _ignored(s: Submission) -> str:
    return (f"ignored the nbgrader metadata of {len(s.ignored)} cell(s) the course did not give or that were changed "
            f"({'; '.join(s.ignored)}): the cells of the released notebook are graded")


def _html_feedback(api, course: Path, rows: list[Row], out_dir: Path) -> None:
    """``nbgrader generate_feedback`` for every chapter with a graded submission whose HTML is not beside the
    CSV yet (one run per chapter), copied to ``feedback/<student id>/<chapter>.html``."""
    missing = [r for r in rows if r.status == "graded" and not _html(out_dir, r).is_file()]
    for chapter in sorted({r.notebook for r in missing}):
        result = api.generate_feedback(chapter, force=True)
        if _interrupted(result):
            raise KeyboardInterrupt
        if not result["success"]:
            print(f"nbgrader generate_feedback {chapter} failed: {_failure(result)}", flush=True)
    for r in missing:
        made = course / "feedback" / r.student_id / r.notebook / f"{r.notebook}.html"
        if made.is_file():
            _html(out_dir, r).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(made, _html(out_dir, r))


def _html(out_dir: Path, row: Row) -> Path:
    return out_dir / "feedback" / row.student_id / f"{row.notebook}.html"


# --- the CSV and the feedback files ------------------------------------------------------------------------------


def _slot(row: Row) -> tuple[str, str]:
    """A row replaces an earlier one of the same student and chapter (or file, when it has no chapter)."""
    return (row.student_id, row.notebook or row.submission)


def _feedback_name(sid: str) -> str:
    return f"feedback/{sid}.md"


def _check_out(out_csv: Path) -> None:
    """Refuse an output file that cannot be written, before any grading."""
    full = out_csv.resolve() if out_csv.parent.exists() else Path(os.path.abspath(out_csv))
    if full.is_dir():
        raise ValueError(f"--out {out_csv}: is a folder, not a CSV file")
    existing = next(p for p in full.parents if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {out_csv}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out_csv}: {existing} is not writable")
    if full.exists() and not os.access(full, os.W_OK):
        raise ValueError(f"--out {out_csv}: the file is not writable")
    feedback = full.parent / "feedback"
    if feedback.exists() and not (feedback.is_dir() and os.access(feedback, os.W_OK | os.X_OK)):
        raise ValueError(f"--out {out_csv}: {feedback} is not a writable folder")


def _read_rows(out_csv: Path) -> list[Row]:
    """The rows of an earlier run, if ``out_csv`` holds one with our columns (else none: it is rewritten)."""
    try:
        with out_csv.open(newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != COLUMNS:
                return []
            rows = []
            for r in reader:
                rows.append(Row(**{**r, "score": float(r["score"]), "max_score": float(r["max_score"]),
                                   "manual_points": float(r["manual_points"])}))
            return rows
    except (OSError, ValueError, TypeError, csv.Error):
        return []


def _write_rows(rows: list[Row], out_csv: Path) -> None:
    """Write the CSV whole, through a temporary file renamed over it (an interruption leaves the old one)."""
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_csv.parent, prefix=f".{out_csv.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(asdict(r) for r in rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out_csv)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_feedback(rows: list[Row], details: dict[str, tuple[list[Cell], str]], out_dir: Path, sid: str) -> None:
    """The markdown feedback of one student: each submission's score and every test that failed, with its hint
    (``details``: the cells of each submission graded in this run, and what its grading ignored)."""
    mine = [r for r in rows if r.student_id == sid]
    lines = [f"# Feedback for {mine[0].student}", ""]
    for r in mine:
        head = f"## {r.notebook or 'unknown chapter'} ({Path(r.submission).name})"
        if r.status == "rejected":
            lines += [head, "", f"Not graded: {r.feedback}", ""]
            continue
        lines += [head, "", f"Autograded: **{r.score:g} / {r.max_score:g}** points"
                  + (f"; {r.manual_points:g} more points for your written answers, graded by your teacher."
                     if r.manual_points else "."), ""]
        if r.status == "failed":
            lines += [f"The grader could not run it: {r.feedback}", ""]
        cells, note = details.get(f"{r.student_id}/{r.notebook}/{r.sha256}", ([], ""))
        if note:
            lines += [note[0].upper() + note[1:] + ".", ""]
        if cells:
            for c in cells:
                if c.manual and c.pending:
                    lines.append(f"- `{c.name}`: graded by your teacher ({c.max_score:g} points)")
                elif c.manual:
                    lines.append(f"- `{c.name}`: {c.score or 0:g} / {c.max_score:g}"
                                 + (": no answer" if c.score is None or c.score == 0 else ""))
                else:
                    score = c.score or 0
                    note = "" if score >= c.max_score else f": {_message(c)}"
                    lines.append(f"- `{c.name}`: {score:g} / {c.max_score:g}{note}")
        else:
            lines.append(f"- {r.feedback}")
        if r.status == "graded":
            lines.append(f"\nThe graded notebook, with every output: `{_html(out_dir, r).relative_to(out_dir)}`.")
        lines.append("")
    path = out_dir / _feedback_name(sid)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def _export(api, out_dir: Path) -> Path | None:
    """``nbgrader export``: the gradebook's CSV (one row per student and assignment) beside the grades."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    plugin = CsvExportPlugin()
    plugin.to = str(out_dir / "gradebook.csv")
    with Gradebook(api.coursedir.db_url, support.COURSE_ID) as gb:
        plugin.export(gb)
    return Path(plugin.to)


# --- the batch --------------------------------------------------------------------------------------------------


def grade(course: Path | str, submissions: Iterable[Path | str] | None = None,
          out_csv: Path | str = "grades.csv", *, time_limit: float | None = None, sandboxed: bool = True) -> list[Row]:
    """Grade ``submissions`` (files; None: everything in the course's ``submitted/``) with nbgrader in ``course``.

    Writes ``out_csv`` (one row per submission, appended as each finishes), ``feedback/<student id>.md``
    and ``feedback/<student id>/<chapter>.html`` beside it, and ``gradebook.csv`` (``nbgrader export``).
    ``time_limit`` replaces the course's seconds per cell for this run. Each kernel runs in the classroom's
    sandbox (:mod:`attn_utils.classroom.sandbox`; ``sandboxed=False``: with the caller's permissions, where
    the machine allows no sandbox); the stray files beside the submissions are reported. Everything that can be
    checked is checked before the first submission runs; a submission whose row is already in ``out_csv`` with the
    same file content is not graded again. Returns the rows of this batch.
    """
    course = Path(course)
    if not support.is_course(course):
        raise ValueError(f"course {course}: not a course written by attn-companion student "
                         f"(no {support.CONFIG_FILE} of ours)")
    if not support.judged_outside(course):
        raise ValueError(f"course {course}: written by an earlier attn-companion, whose hidden tests ran inside the "
                         f"students' kernels; write the course again with attn-companion student (a new folder)")
    if time_limit is not None:
        time_limit = support.check_time_limit(time_limit)
    out_csv = Path(out_csv)
    _check_out(out_csv)
    if not os.access(course, os.W_OK | os.X_OK):
        raise ValueError(f"course {course}: not writable")
    plan, strays = _plan(course, None if submissions is None else [Path(p) for p in submissions])
    if sandboxed:
        try:
            print(f"sandbox: {sandbox.probe().describe()}", flush=True)
        except sandbox.SandboxUnavailable as exc:
            raise sandbox.SandboxUnavailable(f"{exc}; grade where the sandbox can be made (a Linux machine or "
                                             f"container that allows namespaces), or pass --no-sandbox: the "
                                             f"submissions then run with your permissions") from None
    else:
        print("sandbox: none (--no-sandbox): the submissions run with your permissions", flush=True)
    for path in strays:
        print(f"not graded: {path} (a file beside a student's submission whose name is no chapter of the course)")
    out_dir = out_csv.resolve().parent
    rows = _read_rows(out_csv)
    done = {(r.student_id, r.notebook, r.sha256): r for r in rows}
    batch: list[Row] = []
    details: dict[str, tuple[list[Cell], str]] = {}
    hidden = [course, out_dir, *{s.path.resolve().parent for s in plan}]
    try:
        with tempfile.TemporaryDirectory(prefix="attn-grade-") as tmp, support.nbgrader_env(Path(tmp)):
            api = support.course_api(course, timeout=time_limit, sandbox=sandboxed, hidden_paths=hidden)
            for i, s in enumerate(plan, 1):
                key = (s.sid, s.notebook, s.sha256)
                if key in done:
                    batch.append(done[key])
                    print(f"[{i}/{len(plan)}] {s.student}: already graded, skipped ({s.path})", flush=True)
                    continue
                print(f"[{i}/{len(plan)}] grading {s.path} ({s.student}, {s.notebook or 'unknown chapter'})",
                      flush=True)
                row, cells = _grade_one(course, api, s, out_dir)
                _html(out_dir, row).unlink(missing_ok=True)  # the feedback of an earlier version of the file
                slots = [_slot(r) for r in rows]
                if _slot(row) in slots:  # a new version of a file graded before takes its row
                    rows[slots.index(_slot(row))] = row
                else:
                    rows.append(row)
                _write_rows(rows, out_csv)
                details[f"{s.sid}/{s.notebook}/{s.sha256}"] = (cells, _ignored(s) if s.ignored else "")
                _write_feedback(rows, details, out_dir, s.sid)
                batch.append(row)
                extra = f" (+{row.manual_points:g} by hand)" if row.manual_points else ""
                print(f"[{i}/{len(plan)}] {s.student}: {row.status}, {row.score:g} / {row.max_score:g}{extra}"
                      + ("" if row.status == "graded" else f": {row.feedback}"), flush=True)
            _html_feedback(api, course, rows, out_dir)
            exported = _export(api, out_dir)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise RuntimeError(f"no space left on the device ({exc.filename or out_dir}): the rows of the submissions "
                           f"graded before are kept in {out_csv}; free some space and run the same command again, "
                           f"which skips them") from None
    print(f"{len(plan)} submission(s): grades in {out_csv}, feedback in {out_dir / 'feedback'}, "
          f"nbgrader's export in {exported}" + (f"; {len(strays)} stray file(s) not graded" if strays else ""))
    return batch
