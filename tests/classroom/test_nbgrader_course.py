"""The nbgrader course of the exercises (attn-companion student) and its grading (attn-companion grade).

One `grade` command grades a whole class of honest and dishonest submissions of chapter 0 (its exercises
only, so each kernel imports torch and nothing heavier), the attacks of issue 23 among them (a module
fixture; three tests read it); one more runs a kernel to interrupt it; the rest runs no kernel.
"""
from __future__ import annotations

import ast
import contextlib
import copy
import csv
import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import psutil
import pytest
from nbgrader.api import Gradebook

from attn_utils import cli
from attn_utils.book import build
from attn_utils.classroom import exercises, grading, hidden, nbgrader_support, student
from helpers import busy_cores, master, solution_cells, solution_prose

SMALL = {"model": "gpt2-random", "L": 64}
TESTS = [hidden.test_id("ch0-ex2", p) for p in exercises.EXERCISES["ch0-ex2"].parts]


def nbgrader_meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def grade_id(cell) -> str | None:
    return nbgrader_meta(cell).get("grade_id")


def gradebook(course: Path) -> Gradebook:
    return Gradebook(f"sqlite:///{course / 'gradebook.db'}", nbgrader_support.COURSE_ID)


# --- the course of every chapter (no kernel) --------------------------------------------------------------------


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("course") / "course"
    released = student.write_course(out, parameters=SMALL)
    assert [p.parent.name for p in released] == exercises.exercise_notebooks()
    return out


def source_and_release(course: Path, stem: str) -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    return (nbformat.read(course / "source" / stem / f"{stem}.ipynb", as_version=4),
            nbformat.read(course / "release" / stem / f"{stem}.ipynb", as_version=4))


def test_course_folder_is_an_nbgrader_course(course):
    config = (course / "nbgrader_config.py").read_text()
    assert config.startswith(nbgrader_support.MARKER) and nbgrader_support.is_course(course)
    assert "c.Execute.timeout = 300" in config and "model = 'gpt2-random', L = 64" in config
    assert "GuardedExecute" in config and "c.OverwriteCells.add_missing_cells = True" in config
    for stem in exercises.exercise_notebooks():
        assert (course / "source" / stem / f"{stem}.ipynb").is_file()
        assert (course / "release" / stem / "README.md").is_file()
    with gradebook(course) as gb:
        assert sorted(a.name for a in gb.assignments) == exercises.exercise_notebooks()


@pytest.mark.parametrize("stem", exercises.exercise_notebooks())
def test_release_holds_no_solution_and_no_hidden_test(course, stem):
    _, release = source_and_release(course, stem)
    text = "\n".join(c.source for c in release.cells)
    elsewhere = {line.strip() for c in master(stem).cells if "solution" not in c.metadata.get("tags", [])
                 for line in c.source.splitlines()}
    for key, source in solution_cells(stem).items():
        tree = ast.parse(source)
        kept = {i for node in tree.body if isinstance(node, ast.FunctionDef)
                for i in range(node.lineno, (node.body[0].end_lineno if ast.get_docstring(node) else node.lineno) + 1)}
        secret = [line.strip() for i, line in enumerate(source.splitlines(), 1)
                  if i not in kept and len(line.strip()) > 8 and line.strip() not in elsewhere]
        assert secret, f"{key}: nothing to look for"
        leaked = [line for line in secret if line in text]
        assert not leaked, f"the release of {stem} holds solution code of {key}: {leaked[:3]}"
    prose = [line for line in solution_prose(stem) if line in text]
    assert not prose, f"the release of {stem} keeps solution prose: {prose[:2]}"
    for marker in ("{solution", "{exercise}", "BEGIN SOLUTION", "HIDDEN TESTS", "_hidden_test", "random.Random"):
        assert marker not in text, f"the release of {stem} holds {marker!r}"
    assert text.count("raise NotImplementedError()") >= 1 and "YOUR ANSWER HERE" in text


@pytest.mark.parametrize("stem", exercises.exercise_notebooks())
def test_exercises_become_nbgrader_cells(course, stem):
    source, release = source_and_release(course, stem)
    cells = {grade_id(c): c for c in source.cells if grade_id(c)}
    labels = re.findall(r"```\{exercise\}.*\n:label: (\S+)", "\n".join(c.source for c in master(stem).cells))
    for key in labels:
        if key in exercises.EXERCISES:  # coding: an autograded answer, then one locked test of 1 point per part
            answer = cells[f"{key}-solution"]
            assert nbgrader_meta(answer)["solution"] and not nbgrader_meta(answer)["grade"]
            assert answer.source.count("### BEGIN SOLUTION") == len(exercises.EXERCISES[key].names)
            for part in exercises.EXERCISES[key].parts:
                test = cells[hidden.test_id(key, part)]
                meta = nbgrader_meta(test)
                assert meta["grade"] and meta["locked"] and meta["points"] == 1 and not meta["solution"]
                assert f"exercises.check({key!r}" in test.source and f"part={part!r}" in test.source
                assert hidden.hidden_block(key, part, exercises.EXERCISES[key].names) in test.source
        else:  # derivation: a manually graded markdown answer, with the book's solution in the source only
            answer = cells[f"{key}-answer"]
            meta = nbgrader_meta(answer)
            assert answer.cell_type == "markdown" and meta["grade"] and meta["solution"] and meta["points"] >= 1
            assert "### BEGIN SOLUTION" in answer.source
    chapter = [c for c in source.cells if c.cell_type == "code" and grade_id(c).startswith(stem)]
    assert chapter and all(nbgrader_meta(c)["locked"] for c in chapter)
    params = next(c.source for c in release.cells if "parameters" in c.metadata.get("tags", []))
    assert re.search(r'^model = "gpt2-random" +#', params, re.M) and re.search(r"^L = 64 +#", params, re.M)
    assert source.metadata["attn_companion"]["notebook"] == stem


def test_gradebook_holds_autograded_tests_and_manually_graded_answers(course):
    with gradebook(course) as gb:
        notebook = gb.find_notebook("ch2_distance", "ch2_distance")
        cells = {c.name: (c.cell_type, c.max_score) for c in notebook.grade_cells}
        solutions = {c.name for c in notebook.solution_cells}
    answers = {n for n in cells if n.endswith("-answer")}
    assert answers == {"ch2-ex1-answer", "ch2-ex3-answer"} and answers <= solutions
    assert all(cells[n][0] == "markdown" for n in answers)  # formgrader: "manually graded answer"
    tests = {n for n in cells if "-test-" in n}
    assert len(tests) == len(exercises.EXERCISES["ch2-ex2"].parts) and not tests & solutions
    assert all(cells[n] == ("code", 1) for n in tests)


@pytest.mark.parametrize("stem", exercises.exercise_notebooks())
def test_exercises_only_notebooks_import_no_model(stem):
    nb = student.course_notebook(build.NOTEBOOK_DIR / f"{stem}.py", {}, exercises_only=True)
    setup = next(c for c in nb.cells if c.cell_type == "code")
    assert nbgrader_meta(setup)["locked"]
    for node in ast.parse(setup.source).body:
        module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
        assert any(module == m or module.startswith(m + ".")
                   for m in (*student.LIGHT_MODULES, "attn_utils.classroom")), module
    assert not any("Session" in c.source for c in nb.cells)
    assert sum(1 for c in nb.cells if "-test-" in (grade_id(c) or "")) == \
        sum(len(exercises.EXERCISES[k].parts) for k in exercises.exercises_of(stem))


@pytest.mark.parametrize("kwargs, message", [
    ({"parameters": {"bogus": 1}}, "has a parameter 'bogus'"),
    ({"parameters": {"L": 0}}, "parameter L must be"),
    ({"notebooks": ["ch5_reproducibility"]}, "'ch5_reproducibility' has no coding exercise"),
    ({"notebooks": ["ch9_missing"]}, "notebook 'ch9_missing' not found"),
    ({"time_limit": 0}, "time_limit must be a number of seconds in (0, 86400]"),
])
def test_write_course_rejects_bad_input(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        student.write_course(tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_write_course_refuses_a_folder_that_is_not_a_course(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty and holds no course"):
        student.write_course(tmp_path, ["ch0_setting"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


# --- student ids -----------------------------------------------------------------------------------------------


def test_student_ids_are_unique_safe_and_reversible():
    names = ["Josà", "José Ñ 学生", "Jos_", "Jos", "Jos=e0=", "O'Neil \"Ann\"", "-rf", ".hidden", "a/b", "Ann", "ann",
             "x" * 60]
    ids = [grading.student_id(n) for n in names]
    assert len(set(ids)) == len(names)
    assert [grading.student_name(i) for i in ids] == names
    assert all(re.fullmatch(r"[A-Za-z0-9_=][A-Za-z0-9_.=-]*", i) for i in ids)
    naive = {re.sub(r"[^A-Za-z0-9_.-]+", "_", n) for n in ("Josà", "José Ñ 学生")}
    assert naive == {"Jos_"}  # the collision of the grader this one replaces
    assert grading.student_id("alice_smith") == "alice_smith"


# --- grading: a whole class in one command ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_course(tmp_path_factory) -> Path:
    """Chapter 0's exercises only, 8 s per cell: written by the `student` command."""
    out = tmp_path_factory.mktemp("small") / "course"
    assert cli.main(["student", "--out", str(out), "ch0_setting", "--exercises-only", "--time-limit", "8",
                     "-p", "model", "gpt2-random", "-p", "L", "64"]) == 0
    return out


def released(course: Path) -> nbformat.NotebookNode:
    return nbformat.read(course / "release" / "ch0_setting" / "ch0_setting.ipynb", as_version=4)


SOLVED = "\n".join(line for line in solution_cells("ch0_setting")["ch0-ex2"].split("\n\n\ndemo")[0].splitlines())
WRONG = SOLVED.replace("e / e.sum(dim=-1", "e / e.sum(dim=-2")  # normalized over the queries
STUB = "def causal_softmax(logits, T=1.0):\n    raise NotImplementedError()\n"
NAN = "def causal_softmax(logits, T=1.0):\n    return torch.full_like(logits, float('nan'))\n"  # earns nothing


def submission(folder: Path, name: str, course: Path, *, answer: str | None = None, derivation: str | None = None,
               tests: str | None = None, after: dict[str, str] | None = None, edit=None) -> Path:
    """The released notebook with the exercise cell replaced by ``answer``, the derivation by ``derivation``, every
    test cell's source by ``tests``, a new cell with ``after[grade id]`` inserted after that cell, and ``edit``
    (a function of the notebook) applied last."""
    nb = released(course)
    for cell in list(nb.cells):
        gid = grade_id(cell)
        if gid == "ch0-ex2-solution" and answer is not None:
            cell.source = answer
        if gid == "ch0-ex1-answer" and derivation is not None:
            cell.source = derivation
        if gid in TESTS and tests is not None:
            cell.source = tests
        if gid in (after or {}):
            nb.cells.insert(nb.cells.index(cell) + 1, nbformat.v4.new_code_cell(after[gid]))
    if edit is not None:
        edit(nb)
    path = folder / name / "ch0_setting.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return path


def earned(answer: str) -> int:
    """The points an answer earns honestly: the parts that both its visible check and its hidden test pass (the
    hidden test run here, in this process, as the grader would judge it)."""
    namespace = {"torch": __import__("torch")}
    exec(answer, namespace)
    passed = exercises.evaluate("ch0-ex2", namespace).passed
    points = 0
    for part in passed:
        inputs = hidden.draw("ch0-ex2", part, 7)
        points += hidden.judge(inputs, hidden.answer(inputs, {"causal_softmax": namespace["causal_softmax"]})) is None
    return points


def read_rows(path: Path) -> dict[str, dict[str, str]]:
    with path.open() as f:
        return {row["student"]: row for row in csv.DictReader(f)}


# The attacks of issue 23. Each knows every path (the course, the grades, the other submissions) or finds it as a
# student could without the sandbox: walking up from its working folder, or reading the grader's command line.
CYRILLIC = "Анастасия Владимировна Петропавловская-Синеокова Юрьева"  # 55 characters, a 330-character escape
LONG = "edits tests " + "Ж" * 120                     # 252 bytes: its escape (612 characters) is over the limit
MARK = "attn-companion-abuse-marker"  # in the command line of the daemon, and in what the attacks write


# a helper of the attacks: the first file called ``name`` among the known folders and the working folder's parents
FIND = ("def _find(name, *known):\n"
        "    import pathlib\n"
        "    here = pathlib.Path.cwd()\n"
        "    for p in [*(pathlib.Path(k) / name for k in known), *(f / name for f in [here, *here.parents])]:\n"
        "        try:\n"
        "            if p.is_file():\n"
        "                return p\n"
        "        except OSError:\n"
        "            pass\n")


def attacks(course: Path, out: Path, pid_file: Path) -> dict[str, dict]:
    """name -> the keyword arguments of :func:`submission` for each attack, and what each deserves."""
    rewrite = (f"import sqlite3, csv\n"
               f"def _rewrite():\n"
               f"    rows = list(csv.DictReader(open({str(out)!r})))\n"
               f"    for r in rows:\n"
               f"        if r['student'] == 'daemon':\n"
               f"            r['score'] = '6.0'\n"
               f"    with open({str(out)!r}, 'w', newline='') as f:\n"
               f"        w = csv.DictWriter(f, fieldnames=list(rows[0]))\n"
               f"        w.writeheader()\n"
               f"        w.writerows(rows)\n"
               f"    con = sqlite3.connect({str(course / 'gradebook.db')!r})\n"
               f"    con.execute(\"UPDATE grade SET manual_score = 100 WHERE notebook_id IN (SELECT sn.id FROM \"\n"
               f"                \"submitted_notebook sn JOIN submitted_assignment sa ON sn.assignment_id = sa.id \"\n"
               f"                \"WHERE sa.student_id = 'daemon')\")\n"
               f"    con.commit()\n")
    daemon = (f"import os, time\n{rewrite}\n"
              f"try:\n    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\nexcept OSError:\n    pass\n"
              f"for _ in range(3000):\n    time.sleep(0.2)\n    try:\n        _rewrite()\n    except Exception:\n"
              f"        pass\n")
    sqlite = (FIND +
              f"db = _find('gradebook.db', {str(course)!r})\n"
              f"if db:\n"
              f"    import sqlite3\n"
              f"    con = sqlite3.connect(db)\n"
              f"    con.execute(\"UPDATE grade SET manual_score = 100 WHERE notebook_id IN (SELECT sn.id FROM \"\n"
              f"                \"submitted_notebook sn JOIN submitted_assignment sa ON sn.assignment_id = sa.id \"\n"
              f"                \"WHERE sa.student_id = 'sqlite')\")\n"
              f"    con.commit()\n")
    fork = ("import os, sys\n"
            "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', {daemon!r}, {MARK!r}])\n    os._exit(0)\n"
            "os.wait()\n")
    third = grading.student_id("José Ñ 学生")
    proc = ("import os, json\n"
            "grader = None\n"
            "for pid in os.listdir('/proc'):\n"
            "    try:\n"
            "        argv = open(f'/proc/{pid}/cmdline', 'rb').read().decode(errors='replace').split('\\0')\n"
            "    except OSError:\n"
            "        continue\n"
            "    if 'grade' in argv and '--course' in argv:\n"
            "        grader = argv\n"
            "if grader:\n"
            "    course, out = grader[grader.index('--course') + 1], grader[grader.index('--out') + 1]\n"
            f"    victim = next(p for p in grader if {CYRILLIC!r} in p)\n"
            "    stub = open(os.path.join(course, 'release', 'ch0_setting', 'ch0_setting.ipynb')).read()\n"
            "    open(victim, 'w').write(stub)\n"
            f"    open(os.path.join(os.path.dirname(out), 'feedback', {third + '.md'!r}), 'w').write({MARK!r})\n")
    source = (FIND +
              STUB +
              f"src = _find('ch0_setting.ipynb', {str(course / 'source' / 'ch0_setting')!r})\n"
              "if src and 'source' in str(src):\n"
              "    import json\n"
              "    cells = json.load(open(src))['cells']\n"
              "    exec(''.join(next(c['source'] for c in cells\n"
              "                      if c['metadata'].get('nbgrader', {}).get('grade_id') == 'ch0-ex2-solution')))\n"
              "    print(''.join(''.join(c['source']) for c in cells if 'HIDDEN TESTS' in ''.join(c['source'])))\n")
    frames = ("def causal_softmax(logits, T=1.0):\n"
              "    import sys\n"
              "    frame = sys._getframe(1)\n"
              "    while frame is not None and 'reference' not in frame.f_locals:\n"
              "        frame = frame.f_back\n"
              "    if frame is None:\n"
              "        raise NotImplementedError('no hidden test up the stack')\n"
              "    reference = frame.f_locals['reference']\n"
              "    flat = logits.reshape(-1, logits.shape[-2], logits.shape[-1])\n"
              "    return torch.tensor([reference(m.tolist(), T) for m in flat], "
              "dtype=torch.float64).reshape(logits.shape)\n"
              "\nfrom attn_utils.classroom import exercises\nexercises.check = lambda *a, **k: None\n")
    patch = (NAN + "\nimport builtins\nfrom attn_utils.classroom import exercises\n"
                   "exercises.check = lambda *a, **k: None\n"
                   "builtins.abs = lambda x: 0\nbuiltins.all = lambda it: True\n")

    def forge(nb):
        """A scratch cell, a graded cell of its own (100 points), and the solution moved after the tests."""
        solution = next(c for c in nb.cells if grade_id(c) == "ch0-ex2-solution")
        nb.cells.remove(solution)
        forged = nbformat.v4.new_code_cell("bonus = 1", metadata={"nbgrader": {
            "grade": True, "grade_id": "bonus", "locked": False, "points": 100, "schema_version": 3,
            "solution": False, "task": False}})
        nb.cells += [forged, solution, nbformat.v4.new_code_cell("scratch = causal_softmax(torch.zeros(1, 3, 3))")]

    return {
        "sqlite": {"after": {"ch0-ex2-solution": sqlite}, "deserves": 0},
        "daemon": {"after": {"ch0-ex2-solution": fork}, "deserves": 0},
        "proc": {"after": {"ch0-ex2-solution": proc}, "deserves": 0},
        "reads source": {"answer": source, "deserves": 0},
        CYRILLIC: {"answer": SOLVED, "deserves": 6},  # the victim of "proc", graded after it
        "frames": {"answer": frames, "deserves": 0},
        "builtins": {"answer": patch, "deserves": 0},
        "forged": {"answer": SOLVED, "edit": forge, "deserves": 6},
    }


def snapshot(*roots: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part in skip for part in p.relative_to(root).parts)}


def gradebook_rows(course: Path) -> dict[str, list[tuple]]:
    import sqlite3

    with sqlite3.connect(course / "gradebook.db") as con:
        tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}"))) for t in tables}


def marked_processes() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if MARK in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def write_class(course: Path, folder: Path) -> SimpleNamespace:
    """A class of honest and dishonest submissions, the seven attacks of issue 23 among them, in ``folder``: the
    cases (with what each deserves), the files to grade (a stray file and two that are no notebooks among them),
    the grades CSV to write, and the file the daemon would write."""
    subs, out, pid_file = folder / "submissions", folder / "out" / "grades.csv", folder / "daemon.pid"
    stubborn = (f"import subprocess, sys, time\n"
                f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {MARK!r}])\n"
                "while True:\n    try:\n        time.sleep(1)\n    except KeyboardInterrupt:\n        pass")
    patched = WRONG.replace('-> torch.Tensor:\n', '-> torch.Tensor:\n    import sys\n    sys.displayhook(1.0)\n', 1) + (
        "\nfrom attn_utils.classroom import exercises\n"
        "exercises.check = lambda *a, **k: None\n"
        "for ex in exercises.EXERCISES.values():\n    ex.parts.clear()\n"
        "abs = lambda x: 0\nsum = lambda x: 1.0\n")
    fake = WRONG + ("\nimport json, os\n"
                    "open('results.json', 'w').write("
                    "json.dumps({'ch0-ex2': {'score': 1.0, 'feedback': 'all passed'}}))\n"
                    "os._exit(0)")
    honest = {
        "José Ñ 学生": {"deserves": 0},                                                  # unchanged copy
        "Josà": {"answer": SOLVED, "derivation": "1. The factor cancels ...", "deserves": 6},
        "Ann O'Neil \"loops\"": {"answer": SOLVED + "\nraise ValueError('my own test')",  # raises, prints, loops
                                 "after": {"ch0-ex2-solution": "print('x' * 10_000_000)\nwhile True:\n    pass"},
                                 "deserves": 6},
        "stuck midway": {"answer": SOLVED, "after": {TESTS[2]: stubborn}, "deserves": 3},
        LONG: {"answer": WRONG, "tests": "pass", "deserves": earned(WRONG)},
        "patches": {"answer": patched, "deserves": earned(WRONG)},
        "fakes": {"answer": fake, "deserves": 0},
    }
    cases = {**honest, **attacks(course, out, pid_file)}
    files = [submission(subs, name, course, **{k: v for k, v in case.items() if k != "deserves"})
             for name, case in cases.items()]
    (subs / CYRILLIC / "notes.txt").write_text("my notes")  # a stray file beside a submission
    (subs / "not json.ipynb").write_text("{ this is not JSON")
    (subs / "empty.ipynb").write_text("")
    files += [subs / CYRILLIC / "notes.txt", subs / "not json.ipynb", subs / "empty.ipynb"]
    return SimpleNamespace(cases=cases, files=files, subs=subs, out=out, pid_file=pid_file)


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory, small_course, jail):
    """The class of :func:`write_class` graded in one ``attn-companion grade`` process (its command line is what
    the attack "proc" reads); what was on disk before and after."""
    tmp = tmp_path_factory.mktemp("class")
    c = write_class(small_course, tmp)
    course_before = snapshot(small_course, skip=("gradebook.db", "submitted", "autograded", "feedback"))
    gradebook_before = gradebook_rows(small_course)
    subs_before = snapshot(c.subs)
    argv = ["grade", "--course", str(small_course), *map(str, c.files), "--out", str(c.out)]
    done = subprocess.run([sys.executable, "-m", "attn_utils.cli", *argv], cwd=tmp, capture_output=True, text=True,
                          timeout=900)
    left = marked_processes()  # the daemon of "daemon", if it outlived the grader
    yield SimpleNamespace(**vars(c), course=small_course, argv=argv, done=done, left=[p.pid for p in left],
                          table=read_rows(c.out) if c.out.is_file() else {}, course_before=course_before,
                          gradebook_before=gradebook_before, subs_before=subs_before)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()


@pytest.mark.slow
def test_a_class_of_abuse_cases_scores_what_each_deserves(graded_class):
    c = graded_class
    assert c.done.returncode == 0, c.done.stderr[-3000:]
    table = c.table
    assert sorted(table) == sorted([*c.cases, "not json", "empty"])  # notes.txt is no student
    score = {name: float(row["score"]) for name, row in table.items()}
    assert earned(SOLVED) == 6 and 0 < earned(WRONG) < 6 and earned(NAN) == 0
    assert score == {**{name: case["deserves"] for name, case in c.cases.items()}, "not json": 0, "empty": 0}
    assert {name for name, row in table.items() if row["status"] == "graded"} == set(c.cases)
    assert all(row["max_score"] == "6.0" and row["manual_points"] == "3.0"
               for name, row in table.items() if row["status"] == "graded")
    assert "NotImplementedError" in table["José Ñ 学生"]["feedback"]
    assert table["Josà"]["feedback"] == "every autograded test passed"
    assert "normalize over the keys" in table[LONG]["feedback"]  # the visible tests were put back
    assert "hidden test of part 'rows sum to one'" in table["patches"]["feedback"]
    assert "6 tests failed" in table["fakes"]["feedback"]
    assert "NotRun: the kernel died in an earlier cell" in table["fakes"]["feedback"]
    assert "NotRun: the kernel was killed at the time limit" in table["stuck midway"]["feedback"]
    assert "not a notebook" in table["not json"]["feedback"] and "not a notebook" in table["empty"]["feedback"]
    assert table["not json"]["status"] == "rejected"
    frames = table["frames"]["feedback"]
    assert "HiddenTestFailed" in frames or "no hidden test up the stack" in frames
    assert "hidden test of part" in table["builtins"]["feedback"]
    assert "'bonus' (graded metadata, 100 points)" in table["forged"]["feedback"]
    assert "not graded: " in c.done.stdout and "notes.txt" in c.done.stdout


@pytest.mark.slow
def test_the_attacks_change_nothing_outside_their_sandbox(graded_class):
    c = graded_class
    assert c.left == [], "a process of a submission outlived the grader"
    assert not c.pid_file.exists()  # the daemon could not write outside its folder
    assert snapshot(c.subs) == c.subs_before  # the victim's submission among them
    assert snapshot(c.course, skip=("gradebook.db", "submitted", "autograded", "feedback")) == c.course_before
    after = gradebook_rows(c.course)
    written = {"student", "submitted_assignment", "submitted_notebook", "grade", "comment"}  # the grader's rows
    assert set(after) == set(c.gradebook_before) and len(set(after) - written) >= 8
    for table in set(after) - written:  # the course: its assignment, notebooks, cells
        assert after[table] == c.gradebook_before[table], table
    with gradebook(c.course) as gb:  # the rows the grader wrote: no manual score, the auto scores of the CSV
        for name, row in c.table.items():
            if row["status"] == "graded":
                grades = gb.find_submission_notebook("ch0_setting", "ch0_setting", row["student_id"]).grades
                assert all(g.manual_score is None for g in grades), name
                assert sum(g.auto_score or 0 for g in grades if g.cell.cell_type == "code") == float(row["score"])
                assert gb.find_student(row["student_id"]).last_name == name
    for name, row in c.table.items():
        page = (c.out.parent / row["feedback_file"]).read_text()
        assert page.startswith(f"# Feedback for {name}\n") and MARK not in page
    assert MARK not in c.out.read_text()
    sid = c.table["reads source"]["student_id"]
    graded = nbformat.read(c.course / "autograded" / sid / "ch0_setting" / "ch0_setting.ipynb", 4)
    printed = "".join(out.get("text", "") for cell in graded.cells for out in cell.get("outputs", []))
    assert "_hidden.respond" not in printed and "BEGIN SOLUTION" not in printed  # it read nothing of the course


@pytest.mark.slow
def test_a_class_is_graded_with_its_feedback_and_gradebook(graded_class, capsys):
    c = graded_class
    table = c.table
    # the stuck kernel and the process it started are gone; the 10 MB were cut, and the loop was interrupted
    loops = table["Ann O'Neil \"loops\""]
    graded = c.course / "autograded" / loops["student_id"] / "ch0_setting" / "ch0_setting.ipynb"
    assert graded.stat().st_size < 2_000_000
    text = graded.read_text()
    assert "output cut by the grader" in text and "CellTimeoutError" in text and "my own test" in text
    # one feedback file per student, never shared, under ids that fit in a file name and give the names back
    feedback = {row["feedback_file"] for row in table.values()}
    assert len(feedback) == len(table)
    for name, row in table.items():
        assert len(row["student_id"]) <= grading.MAX_ID
        assert grading.student_name(row["student_id"], c.course) == name
        if row["status"] == "graded":
            assert (c.out.parent / "feedback" / row["student_id"] / "ch0_setting.html").is_file()
    assert grading.student_id(CYRILLIC) != grading.student_id(LONG) and "~" in grading.student_id(CYRILLIC)
    assert "hidden test of part" in (c.out.parent / table["patches"]["feedback_file"]).read_text()
    assert "Ignored the nbgrader metadata of 1 cell(s)" in (c.out.parent / table["forged"]["feedback_file"]).read_text()
    assert (c.out.parent / "gradebook.csv").is_file()  # nbgrader export
    # the derivation is waiting in the gradebook for the teacher; an unchanged answer scores 0 at once
    with gradebook(c.course) as gb:
        answered = {g.name: g for g in gb.find_submission_notebook("ch0_setting", "ch0_setting",
                                                                   table["Josà"]["student_id"]).grades}
        blank = {g.name: g for g in gb.find_submission_notebook("ch0_setting", "ch0_setting",
                                                                table["José Ñ 学生"]["student_id"]).grades}
        assert answered["ch0-ex1-answer"].needs_manual_grade and answered["ch0-ex1-answer"].auto_score is None
        assert not blank["ch0-ex1-answer"].needs_manual_grade and blank["ch0-ex1-answer"].auto_score == 0
        assert gb.find_grade_cell("ch0-ex1-answer", "ch0_setting", "ch0_setting").cell_type == "markdown"
    # the same command again grades nothing
    capsys.readouterr()
    assert cli.main(c.argv) == 0
    assert capsys.readouterr().out.count("already graded, skipped") == len(c.files) - 1  # not notes.txt
    assert read_rows(c.out) == table


def test_grade_checks_everything_before_grading(tmp_path, small_course, capsys):
    sub = submission(tmp_path / "subs", "alice", small_course)
    other = submission(tmp_path / "more", "alice", small_course)
    upper, lower = (submission(tmp_path / "case", name, small_course) for name in ("Ann", "ann"))
    for argv, message in [
        (["--out", "/dev/null/g.csv", str(sub)], "/dev/null is not a folder"),
        (["--out", str(tmp_path), str(sub)], "is a folder, not a CSV file"),
        (["--out", str(tmp_path / "g.csv"), str(tmp_path / "missing.ipynb")], "is not a file"),
        (["--out", str(tmp_path / "g.csv"), str(sub), str(other)], "are both 'alice''s ch0_setting"),
        (["--out", str(tmp_path / "g.csv"), str(upper), str(lower)], "differ only in letter case"),
        (["--out", str(tmp_path / "g.csv"), "--time-limit", "0", str(sub)], "time_limit must be a number"),
    ]:
        assert cli.main(["grade", "--course", str(small_course), *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert cli.main(["grade", "--course", str(tmp_path), str(sub)]) == 2
    assert "not a course written by attn-companion" in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists() and not (small_course / "submitted" / "alice").exists()


def test_an_interrupted_batch_keeps_what_finished(tmp_path, small_course, monkeypatch):
    files = []
    for name in ("a", "b", "c"):
        files.append(tmp_path / f"{name}.ipynb")
        files[-1].write_text("not a notebook")  # rejected without a kernel: the bookkeeping is what is tested
    out = tmp_path / "grades.csv"
    real, calls = grading._grade_one, []

    def interrupted(course, api, s, out_dir):
        calls.append(s.student)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(course, api, s, out_dir)

    monkeypatch.setattr(grading, "_grade_one", interrupted)
    with pytest.raises(KeyboardInterrupt):
        grading.grade(small_course, files, out, sandboxed=False)  # no kernel runs: the bookkeeping is tested
    assert list(read_rows(out)) == ["a"] and (tmp_path / "feedback" / "a.md").is_file()
    monkeypatch.setattr(grading, "_grade_one", real)
    rows = grading.grade(small_course, files, out, sandboxed=False)
    assert [r.student for r in rows] == ["a", "b", "c"] and list(read_rows(out)) == ["a", "b", "c"]
    files[0].write_text("changed, still not a notebook")  # a changed file is graded again, in its old row
    calls.clear()
    monkeypatch.setattr(grading, "_grade_one", interrupted)
    grading.grade(small_course, files[:1], out, sandboxed=False)
    assert calls == ["a"] and list(read_rows(out)) == ["a", "b", "c"]


def test_cli_student_refuses_bad_input(tmp_path, capsys):
    assert cli.main(["student", "--out", str(tmp_path / "c"), "ch5_reproducibility"]) == 2
    assert "has no coding exercise" in capsys.readouterr().err
    assert cli.main(["student", "--out", str(tmp_path / "c"), "-p", "bogus", "1"]) == 2
    assert "'bogus'" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_course_route_grades_what_nbgrader_collected(tmp_path, small_course):
    """Inside an nbgrader course, `grade` with no file takes submitted/<student>/<chapter>/ as collect leaves it."""
    course = tmp_path / "course"
    shutil.copytree(small_course, course, ignore=shutil.ignore_patterns("submitted", "autograded", "feedback"))
    with pytest.raises(ValueError, match="nothing in submitted"):
        grading.grade(course, None, tmp_path / "g.csv", sandboxed=False)
    folder = course / "submitted" / "bob" / "ch0_setting"
    folder.mkdir(parents=True)
    (folder / "ch0_setting.ipynb").write_text("{")  # nothing runs: the file is not a notebook
    (row,) = grading.grade(course, None, tmp_path / "g.csv", sandboxed=False)
    assert (row.student, row.student_id, row.status) == ("bob", "bob", "rejected")


# --- bad values, a full disk, Ctrl-C ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "0", "-3", "1e400", "86401", str(10 ** 9)])
def test_a_bad_time_limit_is_refused_before_any_work(tmp_path, small_course, capsys, value):
    sub = submission(tmp_path / "subs", "alice", small_course)
    assert cli.main(["student", "--out", str(tmp_path / "c"), "ch0_setting", f"--time-limit={value}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "time_limit must be a number of seconds in (0, 86400]" in err, err
    assert not (tmp_path / "c").exists()
    assert cli.main(["grade", "--course", str(small_course), str(sub), "--out", str(tmp_path / "g.csv"),
                     f"--time-limit={value}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "time_limit must be a number of seconds in (0, 86400]" in err, err
    assert not (tmp_path / "g.csv").exists() and not (small_course / "submitted" / "alice").exists()


def test_student_leaves_no_folder_when_it_fails(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("nbgrader generate_assignment ch0_setting failed: simulated")

    monkeypatch.setattr(nbgrader_support, "course_api", broken)
    assert cli.main(["student", "--out", str(tmp_path / "c"), "ch0_setting", "--exercises-only"]) == 1
    assert not (tmp_path / "c").exists()


def test_a_full_disk_during_grade_is_one_line(tmp_path, small_course, capsys, monkeypatch):
    (tmp_path / "a.ipynb").write_text("not a notebook")  # rejected without a kernel: the bookkeeping is tested

    def full(rows, out_csv):
        raise OSError(errno.ENOSPC, "No space left on device", str(out_csv))

    monkeypatch.setattr(grading, "_write_rows", full)
    assert cli.main(["grade", "--course", str(small_course), str(tmp_path / "a.ipynb"), "--no-sandbox",
                     "--out", str(tmp_path / "g.csv")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no space left on the device" in err and "Traceback" not in err, err


def kernel_of(pid: int) -> list[psutil.Process]:
    """The kernel processes started by process ``pid`` (not their sandbox's launcher)."""
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            argv = p.cmdline()
            if "ipykernel_launcher" in argv and "attn_utils.classroom.sandbox" not in argv:
                found.append(p)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["kernel starting", "cell running"])
def test_ctrl_c_of_grade_ends_with_130_and_one_line_with_the_cores_busy(tmp_path, small_course, jail, moment):
    """SIGINT (Ctrl-C: the terminal's process group) to `grade` while its kernel starts, or while a cell loops with a
    process of its own running: exit 130, one line, no process of the submission left. Every core is busy from the
    start of the submission (the kernel's start included) to the end."""
    loop = (f"import subprocess, sys, time\n"
            f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {MARK!r}])\n"
            "while True:\n    time.sleep(0.01)")
    sub = submission(tmp_path / "subs", "loops", small_course, after={"ch0-ex2-solution": loop})
    grader = subprocess.Popen([sys.executable, "-m", "attn_utils.cli", "grade", "--course", str(small_course), str(sub),
                               "--out", str(tmp_path / "g.csv"), "--time-limit", "600"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in grader.stdout:
            if "grading" in line:
                break
        with busy_cores():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not (kernel_of(grader.pid) if moment == "kernel starting"
                                                       else marked_processes()):
                time.sleep(0.05)
            os.killpg(grader.pid, signal.SIGINT)
            _, err = grader.communicate(timeout=120)
    finally:
        grader.kill()
    assert grader.returncode == 130, err
    assert err.strip().splitlines() == ["attn-companion grade: interrupted"], err
    assert marked_processes() == []


# --- the submitted cells, put back into the released notebook (no kernel) -------------------------------------


def test_forged_moved_and_extra_cells_never_break_grading(small_course):
    course = released(small_course).cells
    ids = [grade_id(c) or c.get("id") for c in course]
    cells = [copy.deepcopy(c) for c in course]
    solution = next(c for c in cells if grade_id(c) == "ch0-ex2-solution")
    solution.source = SOLVED
    test = next(c for c in cells if grade_id(c) == TESTS[0])
    test.metadata["nbgrader"]["points"] = 100                                  # forged points on a real cell
    forged = nbformat.v4.new_code_cell("pass", metadata={"nbgrader": {"grade": True, "grade_id": "bonus",
                                                                      "points": 100, "locked": False,
                                                                      "solution": False, "schema_version": 3}})
    twin = copy.deepcopy(test)                                                  # a second copy of a test's id
    scratch = nbformat.v4.new_code_cell("scratch = 1")
    cells.remove(solution)
    answer = next(c for c in cells if grade_id(c) == "ch0-ex1-answer")
    cells.remove(answer)
    cells = [forged, *cells, twin, solution, scratch]                          # moved, and the derivation deleted
    restored, ignored = nbgrader_support.restore_cells(cells, course)
    mine = [c for c in restored if (grade_id(c) or c.get("id")) in ids]
    assert [grade_id(c) or c.get("id") for c in mine] == ids                  # the released order, every cell
    assert next(c for c in mine if grade_id(c) == "ch0-ex2-solution").source == SOLVED
    assert next(c for c in mine if grade_id(c) == TESTS[0]).metadata["nbgrader"]["points"] == 1
    assert next(c for c in mine if grade_id(c) == "ch0-ex1-answer").source == answer.source  # back as released
    extra = [c for c in restored if not any(c is m for m in mine)]
    assert [c.source for c in extra] == ["pass", "scratch = 1", twin.source]  # each after the cell it followed
    assert all("nbgrader" not in c.metadata for c in extra)
    assert restored.index(extra[1]) == restored.index(next(c for c in mine if grade_id(c) == "ch0-ex2-solution")) + 1
    assert len(ignored) == 3 and "'bonus' (graded metadata, 100 points)" in ignored[0]
    assert len({c.id for c in restored}) == len(restored)
    assert nbgrader_support.restore_cells(course, course) == (course, [])


# --- student ids ---------------------------------------------------------------------------------------------------


def test_long_names_get_ids_that_fit_a_file_name():
    for name in (CYRILLIC, LONG, "x" * 101, "Ж" * 10_000):
        sid = grading.student_id(name)
        assert len(sid) <= grading.MAX_ID and re.fullmatch(r"[A-Za-z0-9_=][A-Za-z0-9_.=~-]*", sid), sid
    assert grading.student_id("x" * 100) == "x" * 100 and grading.student_name("x" * 100) == "x" * 100
    assert len({grading.student_id(n) for n in (CYRILLIC, CYRILLIC + "a", "x" * 101, "x" * 102)}) == 4
    assert grading.student_id(CYRILLIC).startswith(grading.student_id(CYRILLIC[:15]))
    with pytest.raises(ValueError, match="was shortened: its name is in the course's gradebook"):
        grading.student_name(grading.student_id(LONG))
