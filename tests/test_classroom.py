"""Classroom: the exercise checks and their hints, the student copies, and the grader."""
from __future__ import annotations

import ast
import csv
import math
import re
from pathlib import Path

import jupytext
import nbformat
import psutil
import pytest
import torch

from attn_utils import cli

from attn_utils.classroom import exercises, grading, student

from attn_utils.book import build

from attn_utils.mathematics import normalizers

F64 = torch.float64
SMALL = {"model": "gpt2-random", "L": 64}


# --- the master notebooks --------------------------------------------------------------------------------


def master(stem: str) -> nbformat.NotebookNode:
    return jupytext.read(build.NOTEBOOK_DIR / f"{stem}.py")


def solution_cells(stem: str) -> dict[str, str]:
    """exercise key -> source of its cell tagged ``solution`` in the master notebook."""
    cells, key = {}, None
    for cell in master(stem).cells:
        if cell.cell_type == "markdown":
            key = next(iter(re.findall(r"```\{solution-start\} (\S+)", cell.source)[-1:]), key)
        elif "solution" in cell.metadata.get("tags", []):
            cells[key] = cell.source
    return cells


def solution_prose(stem: str) -> list[str]:
    """The markdown lines between solution-start and solution-end (directives excluded)."""
    text = "\n".join(c.source for c in master(stem).cells if c.cell_type == "markdown")
    blocks = re.findall(r"```\{solution-start\}.*?\n```\n(.*?)```\{solution-end\}", text, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if len(line.strip()) > 20]


def functions_of(source: str) -> dict:
    """Execute only the function definitions of a cell, in a namespace with what they use."""
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    namespace = {"torch": torch, "math": math, "F64": F64, "normalizers": normalizers}
    exec(compile(tree, "<solution>", "exec"), namespace)
    return namespace


def solution(key: str) -> dict:
    return functions_of(solution_cells(exercises.EXERCISES[key].notebook)[key])


def test_every_exercise_chapter_has_a_derivation_and_a_checked_coding_exercise():
    for stem in exercises.exercise_notebooks():
        text = "\n".join(c.source for c in master(stem).cells)
        labels = re.findall(r"```\{exercise\}.*\n:label: (\S+)", text)
        assert len(labels) >= 2, f"{stem} has fewer than two exercises"
        assert set(solution_cells(stem)) == set(exercises.exercises_of(stem)), f"{stem}: solution cells vs registry"
        for key in exercises.exercises_of(stem):
            assert key in labels
            checks = [c for c in master(stem).cells if "exercise-check" in c.metadata.get("tags", [])]
            assert any(f'exercises.check("{key}"' in c.source for c in checks), f"no check cell for {key}"


def test_teachers_page_links_every_exercise():
    page = (build.ROOT / "book" / "teachers.md").read_text()
    for stem in exercises.exercise_notebooks():
        labels = re.findall(r"```\{exercise\}.*\n:label: (\S+)", "\n".join(c.source for c in master(stem).cells))
        assert all(f"<{label}>`" in page for label in labels), f"book/teachers.md misses an exercise of {stem}"


@pytest.mark.parametrize("key", sorted(exercises.EXERCISES))
def test_solutions_pass_every_check(key):
    result = exercises.check(key, *(solution(key)[name] for name in exercises.EXERCISES[key].names))
    assert result.score == 1 and not result.failed and repr(result).endswith("checks passed")


# --- typical mistakes get hints --------------------------------------------------------------------------


def causal_softmax_with(*, axis=-1, after=False, T_times=False, nan_mask=False, shift=True):
    """A causal softmax with one of the usual slips."""
    def causal_softmax(logits, T=1.0):
        L = logits.shape[-1]
        visible = torch.ones(L, L, dtype=torch.bool).tril()
        z = logits * T if T_times else logits / T
        if after:
            return torch.softmax(z, -1) * visible
        z = z * visible + (-torch.inf) * ~visible if nan_mask else z.masked_fill(~visible, -torch.inf)
        e = (z - z.amax(axis, keepdim=True) if shift else z).exp()
        return e / e.sum(axis, keepdim=True)
    return {"causal_softmax": causal_softmax}


def bound_with(formula):
    def max_weight_bound(F, a, L):
        values = F(torch.linspace(-a, a, 100_001, dtype=F64))
        return formula(values, F, a, L)
    return {"max_weight_bound": max_weight_bound, "extreme_row": solution("ch1-ex2")["extreme_row"]}


def extreme_row_with(row):
    return {"max_weight_bound": solution("ch1-ex2")["max_weight_bound"], "extreme_row": row}


def distance_with(*, extra=0, order=lambda w, i: (-float(w[i]), i), s_over_all=False, unweighted=False,
                  norm_of_sum=False):
    def distance_by_loop(w, x, n_top):
        top = sorted(range(len(w)), key=lambda i: order(w, i))[:n_top + extra]
        s = sum(w[i] * x[i] for i in (range(len(w)) if s_over_all else top))
        terms = [(x[i] if unweighted else w[i] * x[i]) - s for i in range(len(w)) if i not in top]
        total = float(sum(terms).norm()) if norm_of_sum else sum(float(t.norm()) for t in terms)
        return set(top), s, total
    return {"distance_by_loop": distance_by_loop}


def separability_with(*, project=True, ratio=False, unweighted_r=False):
    def separability_by_loop(w, x, n_top):
        unit = [x[i] / x[i].norm() if project else x[i] for i in range(len(w))]
        top = sorted(range(len(w)), key=lambda i: (-float(w[i]), i))[:n_top]
        s = sum(w[i] * unit[i] for i in top)
        r = min(float((s - (1 if unweighted_r else w[j]) * unit[j]).norm()) for j in range(len(w)) if j not in top)
        n_s = sum(1 for i in top if float((s - w[i] * unit[i]).norm()) < r)
        return (n_s / n_top if ratio else n_s), r
    return {"separability_by_loop": separability_by_loop}


def g_row_with(*, T_times=False, no_eps=False, unit=True, dtype=F64, in_place=False):
    def g_row(row, T, eps, generator):
        v = torch.randn(row.shape, generator=generator, dtype=dtype).to(F64)
        v = v / v.norm() if unit else v
        scale = (lambda l: l * T) if T_times else (lambda l: l / T)
        base = torch.softmax(scale(row), -1)
        if in_place:
            row += eps * v
            moved = torch.softmax(scale(row), -1)
        else:
            moved = torch.softmax(scale(row + eps * v), -1)
        return float((moved - base).norm() / (1 if no_eps else eps))
    return {"g_row": g_row}


def sparsemax_jacobian_with(*, scale=None, support="weights", centred=True, in_place=False):
    def sparsemax_jacobian(row, T):
        if in_place:
            row /= T
        weights = normalizers.sparsemax(row.unsqueeze(0), T=1.0 if in_place else T)[0]
        on = {"weights": weights > 0, "logits": row > 0, "all": torch.ones_like(row, dtype=torch.bool)}[support]
        on = on.to(F64)
        J = torch.diag(on) - (torch.outer(on, on) / on.sum() if centred else 0)
        return J * (1 / T if scale is None else scale)
    return {"sparsemax_jacobian": sparsemax_jacobian}


MISTAKES = [
    ("ch0-ex2", causal_softmax_with(axis=-2), "rows sum to one", "normalize over the keys (the last axis)"),
    ("ch0-ex2", causal_softmax_with(after=True), "rows sum to one", "mask the logits (with -inf) before"),
    ("ch0-ex2", causal_softmax_with(T_times=True), "temperature", "the temperature divides the logits"),
    ("ch0-ex2", causal_softmax_with(nan_mask=True), "values", "NaN in the output"),
    ("ch0-ex2", causal_softmax_with(shift=False), "large logits", "subtract each row's largest visible logit"),
    ("ch0-ex2", {"causal_softmax": lambda logits, T=1.0: torch.softmax(logits / T, -1)}, "causal mask",
     "apply the causal mask"),
    ("ch0-ex2", {"causal_softmax": lambda logits, T=1.0: torch.softmax(logits / T, -1)[..., 0, :]}, "shape",
     "shape (2, 3, 5) but expected (2, 3, 5, 5)"),
    ("ch1-ex2", bound_with(lambda v, F, a, L: float(v.max() / v.min())), "softmax", "you forgot to divide by L"),
    ("ch1-ex2", bound_with(lambda v, F, a, L: float(v.min() / v.max()) / L), "softmax", "that is the lower bound"),
    ("ch1-ex2", bound_with(lambda v, F, a, L: float(F(torch.tensor(a, dtype=F64)) / F(torch.tensor(-a, dtype=F64)))
                           / L),
     "non-monotone F", "F is not monotone"),
    ("ch1-ex2", bound_with(lambda v, F, a, L: 0.31), "softmax", "expected 298.096: it should be C2/L"),
    ("ch1-ex2", extreme_row_with(lambda F, a, L: torch.zeros(L, dtype=F64)), "extreme row", "put one logit where F"),
    ("ch1-ex2", extreme_row_with(lambda F, a, L: torch.full((L,), 10.0 * a, dtype=F64)), "extreme row",
     "must lie in [-a, a]"),
    ("ch1-ex2", extreme_row_with(lambda F, a, L: torch.zeros(L - 1, dtype=F64)), "extreme row",
     "shape (99999,) but expected (100000,)"),
    ("ch2-ex2", distance_with(extra=1), "top-N set", "off by one"),
    ("ch2-ex2", distance_with(order=lambda w, i: (-float(w[i]), -i)), "ties", "the earlier key enters"),
    ("ch2-ex2", distance_with(s_over_all=True), "context vector", "over the top-N set only"),
    ("ch2-ex2", distance_with(unweighted=True), "distance", "weight each x_i by alpha_i"),
    ("ch2-ex2", distance_with(norm_of_sum=True), "distance", "you computed the norm of the sum"),
    ("ch3-ex2", separability_with(project=False), "radius", "project the x_i onto the unit sphere"),
    ("ch3-ex2", separability_with(ratio=True), "count", "return the count N_s, not the ratio"),
    ("ch3-ex2", separability_with(unweighted_r=True), "radius", "the radius uses alpha_j x_j"),
    ("ch4-ex2", g_row_with(T_times=True), "temperatures", "the temperature divides the logits"),
    ("ch4-ex2", g_row_with(no_eps=True), "one row", "divide the change of the weights by eps"),
    ("ch4-ex2", g_row_with(unit=False), "one row", "normalize the direction v to unit length"),
    ("ch4-ex2", g_row_with(dtype=torch.float32), "one row", "draw v in float64"),
    ("ch4-ex2", g_row_with(in_place=True), "input unchanged", "changed its input row in place"),
    ("ch6-ex2", sparsemax_jacobian_with(scale=1.0), "temperatures", "divide by T, not by 1"),
    ("ch6-ex2", sparsemax_jacobian_with(support="all"), "values", "S is the support of the weights"),
    ("ch6-ex2", sparsemax_jacobian_with(support="logits"), "values", "where the *weights* are positive"),
    ("ch6-ex2", sparsemax_jacobian_with(centred=False), "values", "subtract 1_S 1_S^T / |S|"),
    ("ch6-ex2", {"sparsemax_jacobian": lambda row, T: torch.zeros(len(row) - 1, len(row), dtype=F64)}, "values",
     "shape (11, 12) but expected (12, 12)"),
    ("ch6-ex2", sparsemax_jacobian_with(in_place=True), "input unchanged", "changed its input row in place"),
]


@pytest.mark.parametrize("key, functions, part, hint", MISTAKES, ids=[f"{m[0]}-{m[3][:30]}" for m in MISTAKES])
def test_typical_mistake_gets_its_hint(key, functions, part, hint):
    result = exercises.evaluate(key, functions)
    failed = dict(result.failed)
    assert part in failed, f"part {part!r} passed; failures: {failed}"
    assert hint in failed[part], failed[part]
    assert result.score < 1


def test_check_raises_the_hint_and_evaluate_survives_anything():
    with pytest.raises(exercises.CheckFailed, match="your weights do not sum to one along the last axis"):
        exercises.check("ch0-ex2", causal_softmax_with(axis=-2)["causal_softmax"])
    with pytest.raises(TypeError, match="max_weight_bound, extreme_row"):
        exercises.check("ch1-ex2", solution("ch1-ex2")["max_weight_bound"])
    with pytest.raises(ValueError, match="unknown exercise 'ch9-ex1'"):
        exercises.evaluate("ch9-ex1", {})
    crashing = exercises.evaluate("ch4-ex2", {"g_row": lambda *a: 1 / 0})
    assert crashing.score == 0 and "ZeroDivisionError" in crashing.feedback
    assert "g_row is not defined" in exercises.evaluate("ch4-ex2", {}).feedback


# --- student copies --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("students")
    student.student_copies(out, parameters=SMALL)
    return out


def read_copy(copies: Path, stem: str) -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    return nbformat.read(copies / f"{stem}.ipynb", as_version=4), jupytext.read(copies / f"{stem}.py")


@pytest.mark.parametrize("stem", exercises.exercise_notebooks())
def test_student_copy_holds_no_solution(copies, stem):
    nb, _ = read_copy(copies, stem)
    texts = {"py": (copies / f"{stem}.py").read_text(), "ipynb": "\n".join(c.source for c in nb.cells)}
    elsewhere = {line.strip() for c in master(stem).cells if "solution" not in c.metadata.get("tags", [])
                 for line in c.source.splitlines()}
    for key, source in solution_cells(stem).items():
        tree = ast.parse(source)
        kept = {i for node in tree.body if isinstance(node, ast.FunctionDef)
                for i in range(node.lineno, (node.body[0].end_lineno if ast.get_docstring(node) else node.lineno) + 1)}
        secret = [line.strip() for i, line in enumerate(source.splitlines(), 1)
                  if i not in kept and len(line.strip()) > 8 and line.strip() not in elsewhere]
        assert secret, f"{key}: nothing to look for"
        for kind, text in texts.items():
            leaked = [line for line in secret if line in text]
            assert not leaked, f"{kind} copy of {stem} holds solution code of {key}: {leaked[:3]}"
    for kind, text in texts.items():
        assert not re.search(r"\{solution", text), f"{kind} copy of {stem} keeps a solution directive"
        prose = [line for line in solution_prose(stem) if line in text]
        assert not prose, f"{kind} copy of {stem} keeps solution prose: {prose[:2]}"
    assert not any("solution" in c.metadata.get("tags", []) for c in nb.cells)


@pytest.mark.parametrize("key", sorted(exercises.EXERCISES))
def test_student_stub_raises_not_implemented(copies, key):
    nb, _ = read_copy(copies, exercises.EXERCISES[key].notebook)
    stub = next(c for c in nb.cells if c.metadata.get("exercise") == key and "exercise" in c.metadata.get("tags", []))
    namespace = {"torch": torch}
    exec(stub.source, namespace)
    with pytest.raises(NotImplementedError, match=f"Exercise {key}: "):
        exercises.check(key, *(namespace[name] for name in exercises.EXERCISES[key].names))
    result = exercises.evaluate(key, namespace)
    assert result.score == 0
    assert result.feedback.startswith("not implemented yet") and result.feedback.count(f"Exercise {key}:") == 1


@pytest.mark.parametrize("stem", exercises.exercise_notebooks())
def test_student_py_and_ipynb_are_paired(copies, stem):
    nb, py = read_copy(copies, stem)
    assert [(c.cell_type, c.source, dict(c.metadata)) for c in nb.cells] == \
        [(c.cell_type, c.source, dict(c.metadata)) for c in py.cells]
    assert py.metadata[student.METADATA_KEY] == nb.metadata[student.METADATA_KEY]
    assert not any(c.get("outputs") for c in nb.cells)


def test_student_copy_is_marked_for_the_grader_and_takes_defaults(copies):
    nb, _ = read_copy(copies, "ch1_vanishing")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert nb.metadata[student.METADATA_KEY] == {"notebook": "ch1_vanishing", "code_cells": len(code),
                                                   "exercises": ["ch1-ex2"]}
    assert [c.metadata[student.CELL_KEY] for c in code] == list(range(len(code)))
    assert [c.metadata.get("exercise") for c in code if c.metadata.get("tags")] [-2:] == ["ch1-ex2", "ch1-ex2"]
    params = next(c.source for c in code if "parameters" in c.metadata.get("tags", []))
    assert re.search(r'^model = "gpt2-random" +#', params, re.M) and re.search(r"^L = 64 +#", params, re.M)
    text = "\n".join(c.source for c in nb.cells)
    assert "**Exercise ch1-ex1: The best constants of Lemma 1 for softmax**" in text and "{exercise}" not in text
    assert (copies / "README.md").is_file()


@pytest.mark.parametrize("kwargs, message", [
    ({"parameters": {"bogus": 1}}, "has a parameter 'bogus'"),
    ({"parameters": {"L": 0}}, "parameter L must be"),
    ({"notebooks": ["ch5_reproducibility"]}, "'ch5_reproducibility' has no coding exercise"),
    ({"notebooks": ["ch9_missing"]}, "notebook 'ch9_missing' not found"),
])
def test_student_copies_reject_bad_input(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        student.student_copies(tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


# --- grading ---------------------------------------------------------------------------------------------


def synthetic(path: Path, *sources: str, exercise: int = 0, chapter: str = "ch0_setting") -> Path:
    """A tiny notebook that passes for a student copy of ``chapter``: cell ``exercise`` is its exercise cell,
    a cell calling ``exercises.check`` its check cell."""
    key = exercises.exercises_of(chapter)[0]
    cells = [nbformat.v4.new_code_cell(s, metadata={student.CELL_KEY: i}) for i, s in enumerate(sources)]
    cells[exercise].metadata.update(tags=["exercise"], exercise=key)
    for cell in cells:
        if "exercises.check(" in cell.source:
            cell.metadata.update(tags=["exercise-check"], exercise=key)
    nb = nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "jupytext": {"notebook_metadata_filter": student.METADATA_KEY},
        student.METADATA_KEY: {"notebook": chapter, "code_cells": len(cells), "exercises": [key]}})
    if path.suffix == ".py":
        jupytext.write(nb, path, fmt="py:percent")
    else:
        nbformat.write(nb, path)
    return path


def rows(out_csv: Path) -> dict[str, dict[str, str]]:
    with out_csv.open() as f:
        return {row["student"]: row for row in csv.DictReader(f)}


SOLVED = "import torch\n" + solution_cells("ch0_setting")["ch0-ex2"].split("\n\n\ndemo")[0]
STUB_CHECK = 'from attn_utils.classroom import exercises\nexercises.check("ch0-ex2", causal_softmax)'


def test_grader_rejects_unreadable_and_mutilated_files_without_running_them(tmp_path, copies):
    (tmp_path / "text.ipynb").write_text("this is not JSON")
    (tmp_path / "essay.txt").write_text("hello")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), tmp_path / "plain.ipynb")
    nb = nbformat.read(copies / "ch0_setting.ipynb", as_version=4)
    without_exercise = [c for c in nb.cells if "exercise" not in c.metadata.get("tags", [])]
    nbformat.write(nbformat.v4.new_notebook(cells=without_exercise, metadata=nb.metadata), tmp_path / "noex.ipynb")
    without_cell = [c for c in nb.cells if c.metadata.get(student.CELL_KEY) != 3]
    nbformat.write(nbformat.v4.new_notebook(cells=without_cell, metadata=nb.metadata), tmp_path / "nocell.ipynb")
    names = ["text.ipynb", "essay.txt", "plain.ipynb", "noex.ipynb", "nocell.ipynb"]
    grades = grading.grade([tmp_path / n for n in names], tmp_path / "grades.csv", time_limit=1)
    table = rows(tmp_path / "grades.csv")
    assert len(grades) == len(table) == 5 and all(g.score == 0 for g in grades)
    assert "not a notebook: text.ipynb cannot be read" in table["text"]["feedback"]
    assert "neither an .ipynb nor a .py" in table["essay"]["feedback"]
    assert "cannot tell which chapter" in table["plain"]["feedback"] and table["plain"]["max"] == ""
    assert "the exercise cell of ch0-ex2 was deleted" in table["noex"]["feedback"]
    assert "cell(s) 3 (" in table["nocell"]["feedback"] and table["nocell"]["max"] == "1.0"
    assert (tmp_path / "feedback" / "nocell.md").read_text().startswith("# Feedback for nocell")


@pytest.mark.slow
def test_grader_scores_exercises_and_survives_crashes(tmp_path):
    wrong = SOLVED.replace("e / e.sum(dim=-1", "e / e.sum(dim=-2")
    assert wrong != SOLVED
    subs = [synthetic(tmp_path / "solved.ipynb", SOLVED, STUB_CHECK),
            synthetic(tmp_path / "wrong.ipynb", wrong, STUB_CHECK, "print('later cells still run')"),
            synthetic(tmp_path / "raising.py", SOLVED + "\nraise ValueError('my own test')"),  # read by jupytext
            synthetic(tmp_path / "crash.ipynb", SOLVED, "1 / 0"),
            synthetic(tmp_path / "exits.ipynb", SOLVED, "import os\nos._exit(3)")]
    grading.grade(subs, tmp_path / "grades.csv", time_limit=120)
    table = rows(tmp_path / "grades.csv")
    assert float(table["solved"]["score"]) == 1 and table["solved"]["feedback"] == "all 6 checks passed"
    assert 0 < float(table["wrong"]["score"]) < 1 and "normalize over the keys" in table["wrong"]["feedback"]
    assert float(table["raising"]["score"]) == 1
    assert "your exercise cell raised ValueError: my own test" in table["raising"]["feedback"]
    assert float(table["crash"]["score"]) == 0
    assert table["crash"]["feedback"] == "crashed in cell 1 ('1 / 0'): ZeroDivisionError: division by zero"
    assert float(table["exits"]["score"]) == 0 and "stopped before it could be graded" in table["exits"]["feedback"]


@pytest.mark.slow
def test_grader_stops_a_looping_submission_and_its_kernel(tmp_path, monkeypatch):
    stopped = []

    def spy(proc):  # note papermill's children (the kernel) before they are killed
        stopped.extend((p, " ".join(p.cmdline())) for p in psutil.Process(proc.pid).children(recursive=True))
        kill_tree(proc)

    kill_tree = grading._kill_tree
    monkeypatch.setattr(grading, "_kill_tree", spy)
    sub = synthetic(tmp_path / "loop.ipynb", "while True:\n    pass", SOLVED, exercise=1)
    (grade_row,) = grading.grade([sub], tmp_path / "grades.csv", time_limit=8)
    assert grade_row.score == 0 and grade_row.feedback.startswith("did not finish within 8 s")
    assert any("ipykernel" in cmdline for _, cmdline in stopped), "the kernel had not started: raise the limit"
    survivors = [p for p, _ in stopped if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not survivors, f"processes of the graded notebook survive: {survivors}"


@pytest.mark.slow
def test_grader_on_real_student_copies(tmp_path, copies):
    """An unchanged copy scores zero with NotImplementedError; the copy with the solution gets full marks."""
    nb = nbformat.read(copies / "ch0_setting.ipynb", as_version=4)
    (tmp_path / "ann").mkdir()
    nbformat.write(nb, tmp_path / "ann" / "ch0_setting.ipynb")
    for cell in nb.cells:
        if "exercise" in cell.metadata.get("tags", []):
            cell.source = solution_cells("ch0_setting")["ch0-ex2"]
    (tmp_path / "bob").mkdir()
    nbformat.write(nb, tmp_path / "bob" / "ch0_setting.ipynb")
    grading.grade([tmp_path / "ann" / "ch0_setting.ipynb", tmp_path / "bob" / "ch0_setting.ipynb"],
                  tmp_path / "grades.csv", time_limit=300, parameters=SMALL)
    table = rows(tmp_path / "grades.csv")
    assert table["ann"]["exercise"] == "ch0-ex2" and float(table["ann"]["score"]) == 0
    assert table["ann"]["feedback"].count("NotImplementedError: Exercise ch0-ex2") == 1
    assert float(table["bob"]["score"]) == 1, table["bob"]["feedback"]


@pytest.mark.parametrize("kwargs, message", [
    ({"submissions": ["missing.ipynb"]}, "submission 'missing.ipynb' is not a file"),
    ({"submissions": []}, "no submissions given"),
    ({"parameters": {"bogus": 1}}, "has a parameter 'bogus'"),
    ({"parameters": {"L": 0}}, "parameter L must be"),
    ({"time_limit": 0}, "time_limit must be a number of seconds > 0"),
])
def test_grade_rejects_bad_input_before_any_work(tmp_path, kwargs, message):
    sub = synthetic(tmp_path / "s.ipynb", SOLVED)
    with pytest.raises(ValueError, match=re.escape(message)):
        grading.grade(**{"submissions": [sub], "out_csv": tmp_path / "g.csv", **kwargs})
    assert not (tmp_path / "g.csv").exists()


# --- command line ------------------------------------------------------------------------------------------


def test_cli_student_and_grade(tmp_path, capsys):
    assert cli.main(["student", "--out", str(tmp_path / "copies"), "ch0_setting", "-p", "L", "64"]) == 0
    assert {p.name for p in (tmp_path / "copies").iterdir()} == {"ch0_setting.ipynb", "ch0_setting.py", "README.md"}
    (tmp_path / "bad.ipynb").write_text("{")
    assert cli.main(["grade", str(tmp_path / "bad.ipynb"), "--out", str(tmp_path / "g.csv")]) == 0
    assert "not a notebook" in rows(tmp_path / "g.csv")["bad"]["feedback"]
    assert cli.main(["grade", str(tmp_path / "nope.ipynb")]) == 2
    assert "nope.ipynb" in capsys.readouterr().err
    assert cli.main(["grade", str(tmp_path / "bad.ipynb"), "-p", "bogus", "1"]) == 2
    assert "'bogus'" in capsys.readouterr().err

