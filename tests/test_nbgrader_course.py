"""The nbgrader course of the exercises (attn-companion student) and its grading (attn-companion grade).

One test grades a whole class of honest and dishonest submissions of chapter 0 (its exercises only, so
each kernel imports torch and nothing heavier) in one `grade` command; the rest runs no kernel.
"""
from __future__ import annotations

import ast
import builtins
import csv
import re
import shutil
import types
from pathlib import Path

import nbformat
import psutil
import pytest
from nbgrader.api import Gradebook

from attn_utils import cli
from attn_utils.book import build
from attn_utils.classroom import exercises, grading, hidden, nbgrader_support, student
from test_classroom import master, solution_cells, solution_prose

SMALL = {"model": "gpt2-random", "L": 64}
TESTS = [f"ch0-ex2-test-{student._slug(p)}" for p in exercises.EXERCISES["ch0-ex2"].parts]


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
                test = cells[f"{key}-test-{student._slug(part)}"]
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
        assert any(module == m or module.startswith(m + ".") for m in (*student.LIGHT_MODULES, "attn_utils.classroom")), \
            module
    assert not any("Session" in c.source for c in nb.cells)
    assert sum(1 for c in nb.cells if "-test-" in (grade_id(c) or "")) == \
        sum(len(exercises.EXERCISES[k].parts) for k in exercises.exercises_of(stem))


@pytest.mark.parametrize("kwargs, message", [
    ({"parameters": {"bogus": 1}}, "has a parameter 'bogus'"),
    ({"parameters": {"L": 0}}, "parameter L must be"),
    ({"notebooks": ["ch5_reproducibility"]}, "'ch5_reproducibility' has no coding exercise"),
    ({"notebooks": ["ch9_missing"]}, "notebook 'ch9_missing' not found"),
    ({"time_limit": 0}, "time_limit must be a number of seconds > 0"),
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


def submission(folder: Path, name: str, course: Path, *, answer: str | None = None, derivation: str | None = None,
               tests: str | None = None, after: dict[str, str] | None = None) -> Path:
    """The released notebook with the exercise cell replaced by ``answer``, the derivation by ``derivation``, every
    test cell's source by ``tests``, and a new cell with ``after[grade id]`` inserted after that cell."""
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
    path = folder / name / "ch0_setting.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return path


def earned(answer: str) -> int:
    """The points an answer earns honestly: the parts that both its visible check and its hidden test pass."""
    namespace = {"torch": __import__("torch")}
    exec(answer, namespace)
    passed = exercises.evaluate("ch0-ex2", namespace).passed
    fresh = types.FunctionType(hidden.HIDDEN["ch0-ex2"].__code__, {"__builtins__": builtins})
    points = 0
    for part in passed:
        try:
            fresh(part, namespace["causal_softmax"])
            points += 1
        except AssertionError:
            pass
    return points


def read_rows(path: Path) -> dict[str, dict[str, str]]:
    with path.open() as f:
        return {row["student"]: row for row in csv.DictReader(f)}


@pytest.mark.slow
def test_a_class_of_abuse_cases_is_graded_in_one_command(tmp_path, small_course, capsys):
    subs = tmp_path / "submissions"
    pid_file = tmp_path / "child.pid"
    stubborn = (f"import subprocess, time\nchild = subprocess.Popen(['sleep', '600'])\n"
                f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
                "while True:\n    try:\n        time.sleep(1)\n    except KeyboardInterrupt:\n        pass")
    patched = WRONG.replace('-> torch.Tensor:\n', '-> torch.Tensor:\n    import sys\n    sys.displayhook(1.0)\n', 1) + (
        "\nfrom attn_utils.classroom import exercises\n"
        "exercises.check = lambda *a, **k: None\n"
        "for ex in exercises.EXERCISES.values():\n    ex.parts.clear()\n"
        "abs = lambda x: 0\nsum = lambda x: 1.0\n")
    fake = WRONG + ("\nimport json, os\n"
                    "open('results.json', 'w').write(json.dumps({'ch0-ex2': {'score': 1.0, 'feedback': 'all passed'}}))\n"
                    "os._exit(0)")
    files = [
        submission(subs, "José Ñ 学生", small_course),                                   # unchanged copy
        submission(subs, "Josà", small_course, answer=SOLVED, derivation="1. The factor cancels ..."),
        submission(subs, "Ann O'Neil \"loops\"", small_course,                              # raises, prints, loops
                   answer=SOLVED + "\nraise ValueError('my own test')",
                   after={"ch0-ex2-solution": "print('x' * 10_000_000)\nwhile True:\n    pass"}),
        submission(subs, "stuck midway", small_course, answer=SOLVED, after={TESTS[2]: stubborn}),
        submission(subs, "edits tests", small_course, answer=WRONG, tests="pass"),
        submission(subs, "patches", small_course, answer=patched),
        submission(subs, "fakes", small_course, answer=fake),                             # results file, exits
    ]
    (subs / "not json.ipynb").write_text("{ this is not JSON")
    (subs / "empty.ipynb").write_text("")
    files += [subs / "not json.ipynb", subs / "empty.ipynb"]
    out = tmp_path / "out" / "grades.csv"
    assert cli.main(["grade", "--course", str(small_course), *map(str, files), "--out", str(out)]) == 0

    table = read_rows(out)
    assert len(table) == len(files) and sorted(table) == sorted(
        ["José Ñ 学生", "Josà", "Ann O'Neil \"loops\"", "stuck midway", "edits tests", "patches", "fakes", "not json",
         "empty"])
    score = {name: float(row["score"]) for name, row in table.items()}
    wrong = earned(WRONG)
    assert earned(SOLVED) == 6 and 0 < wrong < 6
    assert score == {"José Ñ 学生": 0, "Josà": 6, "Ann O'Neil \"loops\"": 6, "stuck midway": 3, "edits tests": wrong,
                     "patches": wrong, "fakes": 0, "not json": 0, "empty": 0}
    assert {name for name, row in table.items() if row["status"] == "graded"} == set(score) - {"not json", "empty"}
    assert all(row["max_score"] == "6.0" and row["manual_points"] == "3.0"
               for name, row in table.items() if row["status"] == "graded")
    assert "NotImplementedError" in table["José Ñ 学生"]["feedback"]
    assert table["Josà"]["feedback"] == "every autograded test passed"
    assert "normalize over the keys" in table["edits tests"]["feedback"]  # the visible tests were put back
    assert "hidden test of part 'rows sum to one'" in table["patches"]["feedback"]
    assert "6 tests failed" in table["fakes"]["feedback"]
    assert "NotRun: the kernel died in an earlier cell" in table["fakes"]["feedback"]
    assert "NotRun: the kernel was killed at the time limit" in table["stuck midway"]["feedback"]
    assert "not a notebook" in table["not json"]["feedback"] and "not a notebook" in table["empty"]["feedback"]
    assert table["not json"]["status"] == "rejected"

    # the stuck kernel and the process it started are gone
    child = int(pid_file.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE

    # the 10 MB were cut, and the loop was interrupted
    loops = table["Ann O'Neil \"loops\""]
    graded = small_course / "autograded" / loops["student_id"] / "ch0_setting" / "ch0_setting.ipynb"
    assert graded.stat().st_size < 2_000_000
    text = graded.read_text()
    assert "output cut by the grader" in text and "CellTimeoutError" in text and "my own test" in text

    # one feedback file per student, never shared: the names that a naive sanitising mapped to Jos_.md
    feedback = {row["feedback_file"] for row in table.values()}
    assert len(feedback) == len(table)
    for name, row in table.items():
        page = (out.parent / row["feedback_file"]).read_text()
        assert page.startswith(f"# Feedback for {name}\n")
        assert grading.student_name(row["student_id"]) == name
        if row["status"] == "graded":
            assert (out.parent / "feedback" / row["student_id"] / "ch0_setting.html").is_file()
    assert "hidden test of part" in (out.parent / table["patches"]["feedback_file"]).read_text()
    assert (out.parent / "gradebook.csv").is_file()  # nbgrader export

    # the derivation is waiting in the gradebook for the teacher; an unchanged answer scores 0 at once
    with gradebook(small_course) as gb:
        answered = {g.name: g for g in gb.find_submission_notebook("ch0_setting", "ch0_setting",
                                                                   table["Josà"]["student_id"]).grades}
        blank = {g.name: g for g in gb.find_submission_notebook("ch0_setting", "ch0_setting",
                                                                table["José Ñ 学生"]["student_id"]).grades}
        assert answered["ch0-ex1-answer"].needs_manual_grade and answered["ch0-ex1-answer"].auto_score is None
        assert not blank["ch0-ex1-answer"].needs_manual_grade and blank["ch0-ex1-answer"].auto_score == 0
        assert gb.find_grade_cell("ch0-ex1-answer", "ch0_setting", "ch0_setting").cell_type == "markdown"

    # the same command again grades nothing
    capsys.readouterr()
    assert cli.main(["grade", "--course", str(small_course), *map(str, files), "--out", str(out)]) == 0
    assert capsys.readouterr().out.count("already graded, skipped") == len(files)
    assert read_rows(out) == table


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
        grading.grade(small_course, files, out)
    assert list(read_rows(out)) == ["a"] and (tmp_path / "feedback" / "a.md").is_file()
    monkeypatch.setattr(grading, "_grade_one", real)
    rows = grading.grade(small_course, files, out)
    assert [r.student for r in rows] == ["a", "b", "c"] and list(read_rows(out)) == ["a", "b", "c"]
    files[0].write_text("changed, still not a notebook")  # a changed file is graded again, in its old row
    calls.clear()
    monkeypatch.setattr(grading, "_grade_one", interrupted)
    grading.grade(small_course, files[:1], out)
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
        grading.grade(course, None, tmp_path / "g.csv")
    folder = course / "submitted" / "bob" / "ch0_setting"
    folder.mkdir(parents=True)
    (folder / "ch0_setting.ipynb").write_text("{")  # nothing runs: the file is not a notebook
    (row,) = grading.grade(course, None, tmp_path / "g.csv")
    assert (row.student, row.student_id, row.status) == ("bob", "bob", "rejected")
