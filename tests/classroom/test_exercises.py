"""Classroom: the exercise checks and their hints, and the hidden tests (no kernel runs here).

The nbgrader course and its grading are tested in tests/classroom/test_nbgrader_course.py."""
from __future__ import annotations

import ast
import json
import math
import os
import re

import pytest
import torch

from attn_utils.book import build
from attn_utils.classroom import exercises, hidden
from attn_utils.mathematics import normalizers
from helpers import master, solution_cells

F64 = torch.float64


# --- the master notebooks --------------------------------------------------------------------------------


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
    assert result.score == 1 and not result.failed and repr(result).endswith("pass for the function defined above.")
    parts = ", ".join(exercises.EXERCISES[key].parts)
    assert f"checks `{exercises.EXERCISES[key].names[0]}`" in repr(result) and f"on: {parts}." in repr(result)


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



def test_check_takes_one_part():
    wrong = causal_softmax_with(axis=-2)["causal_softmax"]
    assert exercises.check("ch0-ex2", wrong, part="causal mask").passed == ["causal mask"]
    with pytest.raises(exercises.CheckFailed, match="rows sum to one: your weights do not sum to one"):
        exercises.check("ch0-ex2", wrong, part="rows sum to one")
    with pytest.raises(ValueError, match="exercise ch0-ex2 has no part 'bogus'"):
        exercises.check("ch0-ex2", wrong, part="bogus")


# --- the hidden tests ------------------------------------------------------------------------------------------


def run_hidden(key: str, part: str, functions: dict, seed: int | None = None) -> str | None:
    """The hidden test of ``part`` as the grader runs it: inputs drawn here, the functions' answers as the kernel
    gives them (through JSON), the verdict decided here. None if it passes, else its message."""
    inputs = hidden.draw(key, part, int.from_bytes(os.urandom(4), "big") if seed is None else seed)
    answers = hidden.answer(json.loads(json.dumps(inputs)), functions)
    return hidden.judge(inputs, json.loads(json.dumps(answers)))


def test_every_part_has_a_hidden_test():
    assert set(hidden.HIDDEN) == set(exercises.EXERCISES)
    assert all(hidden.HIDDEN[key].parts == tuple(ex.parts) for key, ex in exercises.EXERCISES.items())
    with pytest.raises(ValueError, match="has no hidden test"):
        hidden.hidden_block("ch9-ex1", "values", ("f",))
    with pytest.raises(ValueError, match="has no hidden test of part 'bogus'"):
        hidden.draw("ch0-ex2", "bogus", 1)


@pytest.mark.parametrize("key", sorted(exercises.EXERCISES))
def test_solutions_pass_every_hidden_test(key):
    for _ in range(3):  # fresh random inputs each time
        for part in exercises.EXERCISES[key].parts:
            assert run_hidden(key, part, solution(key)) is None, (key, part)


@pytest.mark.parametrize("key, functions, part, hint", MISTAKES, ids=[f"{m[0]}-{m[3][:30]}" for m in MISTAKES])
def test_hidden_tests_catch_the_typical_mistakes(key, functions, part, hint):
    message = run_hidden(key, part, functions)
    assert message and message.startswith(f"hidden test of part {part!r} (seed ")


def test_the_kernel_gets_no_reference_and_cannot_change_a_verdict():
    """The test cell's hidden block only calls respond(); the verdict comes from what the functions returned, so
    a notebook's patches (builtins, the module, the frames) only change its own answers."""
    for key, ex in exercises.EXERCISES.items():
        for part in ex.parts:
            block = hidden.hidden_block(key, part, ex.names)
            assert block.startswith("### BEGIN HIDDEN TESTS") and block.endswith("### END HIDDEN TESTS")
            code = "\n".join(line for line in block.splitlines() if not line.startswith("#"))
            assert code.count("\n") == 2 and "_hidden.respond(" in code and "reference" not in code
    inputs = hidden.draw("ch0-ex2", "values", 3)
    honest = hidden.answer(inputs, solution("ch0-ex2"))
    assert hidden.judge(inputs, honest) is None
    zeros = hidden.answer(inputs, {"causal_softmax": lambda logits, T=1.0: torch.zeros_like(logits)})
    nans = hidden.answer(inputs, {"causal_softmax": lambda logits, T=1.0: torch.full_like(logits, float("nan"))})
    forged = [{"value": {**honest[0]["value"], "shape": [2, 9, 8]}}]
    for bad, why in [(None, "no answer came back"), ("all passed", "instead of one answer per call"),
                     ([{"value": 1.0}], "not an array of numbers"), (forged, "does not match its shape"),
                     ([{"error": "NotImplementedError: no"}], "causal_softmax raised NotImplementedError"),
                     ([{"value": {"shape": [2, 9, 9], "float64": "%%%"}}], "cannot be read"),
                     ([{}], "no answer of causal_softmax came back"), (zeros, "a weight is 0.0"),
                     (nans, "returned NaN"), ([honest[0], honest[0]], "one answer per call")]:
        message = hidden.judge(inputs, bad)
        assert message and message.startswith("hidden test of part 'values' (seed 3): ") and why in message, \
            (why, message)
    assert "no hidden test" not in (hidden.judge(hidden.draw("ch0-ex2", "shape", 3), zeros) or "")


def test_respond_needs_the_graders_inputs(tmp_path, monkeypatch):
    monkeypatch.delenv(hidden.INPUTS_ENV, raising=False)
    with pytest.raises(AssertionError, match="run only when the classroom's grader executes the notebook"):
        hidden.respond("ch0-ex2", "shape", causal_softmax=solution("ch0-ex2")["causal_softmax"])
    inputs = hidden.draw("ch0-ex2", "shape", 5)
    (tmp_path / "inputs.json").write_text(json.dumps({"ch0-ex2/shape": inputs}))
    monkeypatch.setenv(hidden.INPUTS_ENV, str(tmp_path / "inputs.json"))
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda data, raw: shown.append(data))
    hidden.respond("ch0-ex2", "shape", causal_softmax=solution("ch0-ex2")["causal_softmax"])
    assert hidden.judge(inputs, shown[0][hidden.MIME]) is None


def test_hidden_tests_draw_new_inputs_each_time():
    messages = {run_hidden("ch0-ex2", "values", causal_softmax_with(T_times=True)) for _ in range(3)}
    assert len(messages) == 3  # a new seed (and new values) each time
    assert run_hidden("ch0-ex2", "values", causal_softmax_with(T_times=True), seed=9) == \
        run_hidden("ch0-ex2", "values", causal_softmax_with(T_times=True), seed=9)  # a seed gives its inputs back


def test_course_exercise_title_states_its_check_id_once():
    from attn_utils.classroom import student

    label, title, body = student._plain_exercise("```{exercise} ch3-ex1: the radius r", iter(
        [":label: ch3-ex1", ":nonumber:", "", "Write the function.", "```"]))
    assert (label, title) == ("ch3-ex1", "the radius r") and "Write the function." in "".join(body)
