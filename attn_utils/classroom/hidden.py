"""The hidden tests of the coding exercises: the autograder's own check of every part, independent of the rest.

Each function below tests one coding exercise, part by part (the parts of
:data:`attn_utils.classroom.exercises.EXERCISES`), and raises ``AssertionError`` when a student's function
fails. :func:`hidden_block` copies a function's source into the ``### BEGIN HIDDEN TESTS`` block of a
test cell of the nbgrader course (:mod:`attn_utils.classroom.student`); nbgrader removes that block from
the students' notebooks and restores it from its gradebook when it grades, so it runs after whatever the
student's notebook did. The functions are therefore written to stand alone:

- they import nothing from ``attn_utils`` (a student's notebook can patch it) and compute every expected
  value themselves, in plain Python floats (``math``, ``random``); torch only builds the inputs and
  reads the outputs (``torch.randn`` gives the direction of ch4-ex2, which the student must draw the
  same way);
- they run with fresh globals that hold only the real ``builtins`` module, so a name the notebook
  rebinds (``abs = lambda x: 0``) does not reach them;
- they draw fresh random inputs at every grading (the seed is in the failure message), so an answer
  cannot be fitted to them; only the tie-breaking and one-key cases are built by hand.

What they cannot withstand is a notebook that patches the modules themselves (``math``, ``torch``,
``builtins``) or the kernel: ``book/teachers.md`` states that limit. The source is public, like the
book's solutions: the protection is that the inputs change and the reference is not reachable from the
notebook, not secrecy.
"""
from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable

__all__ = ["HIDDEN", "hidden_block"]


def ch0_ex2(part, causal_softmax):
    import math
    import os
    import random

    import torch

    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    where = f"hidden test of part {part!r} (seed {seed})"

    def draw(shape, scale):
        if len(shape) == 1:
            return [rng.gauss(0.0, 1.0) * scale for _ in range(shape[0])]
        return [draw(shape[1:], scale) for _ in range(shape[0])]

    def matrices(nested, depth):
        return [nested] if depth == 0 else [m for item in nested for m in matrices(item, depth - 1)]

    def reference(matrix, T):
        out = []
        for t, row in enumerate(matrix):
            z = [v / T for v in row[:t + 1]]
            top = max(z)
            e = [math.exp(v - top) for v in z]
            total = sum(e)
            out.append([v / total for v in e] + [0.0] * (len(row) - t - 1))
        return out

    def run(shape, scale, T):
        data = draw(shape, scale)
        try:
            got = torch.as_tensor(causal_softmax(torch.tensor(data, dtype=torch.float64), T), dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise AssertionError(f"{where}: causal_softmax did not return a tensor ({exc})") from None
        assert tuple(got.shape) == tuple(shape), \
            f"{where}: causal_softmax returned shape {tuple(got.shape)} for logits of shape {tuple(shape)}"
        mine = matrices(got.tolist(), len(shape) - 2)
        assert all(v == v for m in mine for row in m for v in row), f"{where}: NaN in the weights"
        return matrices(data, len(shape) - 2), mine

    def same(matrices_in, mine, T):
        for m_in, m_out in zip(matrices_in, mine):
            for row, expected in zip(m_out, reference(m_in, T)):
                for a, b in zip(row, expected):
                    assert abs(a - b) <= 1e-12 + 1e-9 * abs(b), \
                        f"{where}: a weight is {a!r} where softmax(l / T) over the visible keys gives {b!r} (T={T})"

    if part == "shape":
        run((2, 3, 5, 5), 1.0, 1.0)
    elif part == "rows sum to one":
        _, mine = run((4, 6, 6), 2.0, 1.0)
        for m in mine:
            for row in m:
                assert abs(sum(row) - 1.0) <= 1e-9, f"{where}: a row of weights sums to {sum(row)!r}"
    elif part == "causal mask":
        _, mine = run((3, 7, 7), 2.0, 1.0)
        for m in mine:
            for t, row in enumerate(m):
                assert all(v == 0.0 for v in row[t + 1:]), f"{where}: query {t} gives weight to a later key"
    elif part == "temperature":
        for T in (0.25, 4.0):
            data, mine = run((3, 6, 6), 2.0, T)
            same(data, mine, T)
    elif part == "large logits":
        data, mine = run((2, 6, 6), 1000.0, 1.0)
        same(data, mine, 1.0)
    elif part == "values":
        data, mine = run((2, 9, 9), 3.0, 0.7)
        same(data, mine, 0.7)
    else:
        raise AssertionError(f"no hidden test for part {part!r}")


def ch1_ex2(part, max_weight_bound, extreme_row):
    import math
    import os
    import random

    import torch

    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    where = f"hidden test of part {part!r} (seed {seed})"

    def softplus(v):
        return max(v, 0.0) + math.log1p(math.exp(-abs(v)))

    # F for the student's functions (torch), the same F in plain Python, and the ratio max F / min F on [-a, a]
    functions = {
        "exp(l / 0.5)": (lambda l: torch.exp(l / 0.5), lambda v: math.exp(v / 0.5), lambda a: math.exp(4 * a)),
        "softplus": (torch.nn.functional.softplus, softplus, lambda a: softplus(a) / softplus(-a)),
        "2 + cos(3 l)": (lambda l: 2 + torch.cos(3 * l), lambda v: 2 + math.cos(3 * v), lambda a: 3.0),
    }

    def bound(label, a, L, rtol):
        F, _, ratio = functions[label]
        try:
            got = float(max_weight_bound(F, a, L))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise AssertionError(f"{where}: max_weight_bound did not return a number ({exc})") from None
        expected = ratio(a) / L
        assert abs(got - expected) <= rtol * abs(expected), \
            f"{where}: max_weight_bound(F, a={a:.4g}, L={L}) with F(l) = {label} is {got!r}, expected {expected!r}"

    if part == "softmax":
        bound("exp(l / 0.5)", rng.uniform(1.0, 2.5), rng.randint(5, 50), 1e-6)
    elif part == "several lengths":
        a = rng.uniform(1.0, 2.0)
        for L in (2, rng.randint(5, 50), rng.randint(500, 2000)):
            bound("softplus", a, L, 1e-6)
    elif part == "non-monotone F":
        bound("2 + cos(3 l)", rng.uniform(1.2, 2.5), rng.randint(5, 50), 1e-3)
    elif part == "extreme row":
        L = 100_000
        # with exp, the extreme row reaches 0.9 of the bound only while e^(4a) is small beside L: a <= 2
        for label, a in (("exp(l / 0.5)", rng.uniform(1.2, 2.0)), ("2 + cos(3 l)", rng.uniform(1.2, 2.5))):
            F, f, ratio = functions[label]
            try:
                row = torch.as_tensor(extreme_row(F, a, L), dtype=torch.float64).tolist()
            except (TypeError, ValueError, RuntimeError) as exc:
                raise AssertionError(f"{where}: extreme_row did not return a tensor ({exc})") from None
            assert isinstance(row, list) and len(row) == L and all(isinstance(v, float) for v in row), \
                f"{where}: extreme_row(F, a, L={L}) must return L logits"
            assert all(abs(v) <= a * (1 + 1e-12) for v in row), f"{where}: the logits must lie in [-a, a]"
            values = [f(v) for v in row]
            top, upper = max(values) / sum(values), ratio(a) / L
            assert top >= 0.9 * upper, \
                f"{where}: the largest weight of extreme_row with F(l) = {label} is {top:.4g}, below 0.9 x {upper:.4g}"
    else:
        raise AssertionError(f"no hidden test for part {part!r}")


def ch2_ex2(part, distance_by_loop):
    import math
    import os
    import random

    import torch

    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    where = f"hidden test of part {part!r} (seed {seed})"

    def row(L, d):
        z = [rng.gauss(0.0, 3.0) for _ in range(L)]
        top = max(z)
        e = [math.exp(v - top) for v in z]
        return [v / sum(e) for v in e], [[rng.gauss(0.0, 1.0) for _ in range(d)] for _ in range(L)]

    def expected(w, x, N):
        top = sorted(range(len(w)), key=lambda i: (-w[i], i))[:N]
        s = [sum(w[i] * x[i][c] for i in top) for c in range(len(x[0]))]
        total = sum(math.sqrt(sum((w[i] * x[i][c] - s[c]) ** 2 for c in range(len(s))))
                    for i in range(len(w)) if i not in top)
        return set(top), s, total

    def run(w, x, N):
        out = distance_by_loop(torch.tensor(w, dtype=torch.float64), torch.tensor(x, dtype=torch.float64), N)
        assert isinstance(out, (tuple, list)) and len(out) == 3, f"{where}: distance_by_loop must return three things"
        top, s, total = out
        try:
            if isinstance(top, (set, frozenset)):
                top = list(top)
            t = torch.as_tensor(top)
            if t.dtype == torch.bool and tuple(t.shape) == (len(w),):
                t = t.nonzero().flatten()
            top = {int(i) for i in t.flatten().tolist()}
            s = torch.as_tensor(s, dtype=torch.float64).flatten().tolist()
            total = float(total)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise AssertionError(f"{where}: cannot read what distance_by_loop returned ({exc})") from None
        return top, s, total

    if part == "top-N set":
        w, x = row(40, 8)
        top, _, _ = run(w, x, 5)
        assert top == expected(w, x, 5)[0], f"{where}: the top-5 set is {sorted(top)}, not the 5 largest weights"
    elif part == "ties":
        w = [0.3] + [0.2] * 4 + [0.1] * 3
        rng.shuffle(w)
        x = [[rng.gauss(0.0, 1.0) for _ in range(3)] for _ in w]
        top, _, _ = run(w, x, 3)
        assert top == expected(w, x, 3)[0], f"{where}: with weights {w}, the earlier key must win a tie"
    elif part == "context vector":
        w, x = row(40, 8)
        _, s, _ = run(w, x, 5)
        ref = expected(w, x, 5)[1]
        assert len(s) == len(ref) and all(abs(a - b) <= 1e-12 + 1e-9 * abs(b) for a, b in zip(s, ref)), \
            f"{where}: s differs from the sum of alpha_i x_i over the top-N set"
    elif part == "distance":
        w, x = row(40, 8)
        _, _, total = run(w, x, 5)
        ref = expected(w, x, 5)[2]
        assert abs(total - ref) <= 1e-12 + 1e-9 * abs(ref), f"{where}: the distance is {total!r}, expected {ref!r}"
    else:
        raise AssertionError(f"no hidden test for part {part!r}")


def ch3_ex2(part, separability_by_loop):
    import math
    import os
    import random

    import torch

    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    where = f"hidden test of part {part!r} (seed {seed})"

    def row(L, d):
        z = [rng.gauss(0.0, 1.5) for _ in range(L)]
        top = max(z)
        e = [math.exp(v - top) for v in z]
        return [v / sum(e) for v in e], [[rng.gauss(0.0, 3.0) for _ in range(d)] for _ in range(L)]

    def expected(w, x, N):
        points = []
        for wi, xi in zip(w, x):
            norm = math.sqrt(sum(c * c for c in xi))
            points.append([wi * c / norm for c in xi])
        top = sorted(range(len(w)), key=lambda i: (-w[i], i))[:N]
        s = [sum(points[i][c] for i in top) for c in range(len(x[0]))]

        def gap(i):
            return math.sqrt(sum((a - b) ** 2 for a, b in zip(s, points[i])))

        r = min(gap(j) for j in range(len(w)) if j not in top)
        return sum(1 for i in top if gap(i) < r), r

    def run(L, d, N):
        w, x = row(L, d)
        out = separability_by_loop(torch.tensor(w, dtype=torch.float64), torch.tensor(x, dtype=torch.float64), N)
        assert isinstance(out, (tuple, list)) and len(out) == 2, f"{where}: separability_by_loop must return (N_s, r)"
        try:
            n_s, r = float(out[0]), float(out[1])
        except (TypeError, ValueError, RuntimeError) as exc:
            raise AssertionError(f"{where}: N_s and r must be numbers ({exc})") from None
        return (n_s, r), expected(w, x, N)

    if part == "radius":
        (_, r), (_, ref) = run(50, 16, 8)
        assert abs(r - ref) <= 1e-12 + 1e-9 * abs(ref), f"{where}: r is {r!r}, expected {ref!r}"
    elif part in ("count", "other rows"):
        for L, d, N in ([(50, 16, 8)] if part == "count" else [(20, 3, 3), (30, 2, 12)]):
            (n_s, _), (ref, _) = run(L, d, N)
            assert n_s == ref, f"{where}: N_s is {n_s:g} for L={L}, d={d}, N={N}, expected {ref}"
    else:
        raise AssertionError(f"no hidden test for part {part!r}")


def ch4_ex2(part, g_row):
    import math
    import os
    import random

    import torch

    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    where = f"hidden test of part {part!r} (seed {seed})"

    def softmax(z):
        top = max(z)
        e = [math.exp(v - top) for v in z]
        return [v / sum(e) for v in e]

    def expected(row, T, eps, draw):
        v = torch.randn(len(row), generator=torch.Generator().manual_seed(draw), dtype=torch.float64).tolist()
        norm = math.sqrt(sum(c * c for c in v))
        moved = softmax([(l + eps * c / norm) / T for l, c in zip(row, v)])
        base = softmax([l / T for l in row])
        return math.sqrt(sum((a - b) ** 2 for a, b in zip(moved, base))) / eps

    def run(row, T, eps, draw):
        try:
            return float(g_row(torch.tensor(row, dtype=torch.float64), T, eps, torch.Generator().manual_seed(draw)))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise AssertionError(f"{where}: g_row did not return a number ({exc})") from None

    def compare(T, eps):
        row, draw = [rng.gauss(0.0, 2.0) for _ in range(30)], rng.randrange(2 ** 31)
        got, ref = run(row, T, eps, draw), expected(row, T, eps, draw)
        assert abs(got - ref) <= 1e-12 + 1e-7 * abs(ref), f"{where}: g_row(row, T={T:g}, eps={eps:g}) is {got!r}, expected {ref!r}"

    if part == "one row":
        compare(1.0, 1e-3)
    elif part == "temperatures":
        compare(0.1, 0.5)
        compare(10.0, 1e-2)
    elif part == "bound":
        row = [rng.gauss(0.0, 4.0) for _ in range(30)]
        for T in (0.01, 0.1, 1.0, 10.0):
            for eps in (1e-3, 1.0, 100.0):
                got, limit = run(row, T, eps, rng.randrange(2 ** 31)), min(1 / (2 * T), math.sqrt(2) / eps)
                assert got <= limit * (1 + 1e-9), f"{where}: g_row(row, T={T:g}, eps={eps:g}) = {got:.4g} > {limit:.4g}"
    elif part == "input unchanged":
        values = [rng.gauss(0.0, 1.0) for _ in range(30)]
        row = torch.tensor(values, dtype=torch.float64)
        g_row(row, 1.0, 0.1, torch.Generator().manual_seed(rng.randrange(2 ** 31)))
        assert row.tolist() == values, f"{where}: g_row changed its input row"
    else:
        raise AssertionError(f"no hidden test for part {part!r}")


def ch6_ex2(part, sparsemax_jacobian):
    import os
    import random

    import torch

    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    where = f"hidden test of part {part!r} (seed {seed})"

    def expected(row, T):
        z = [v / T for v in row]
        ordered, cumulative, k_max, total_k = sorted(z, reverse=True), 0.0, 0, 0.0
        for k, v in enumerate(ordered, 1):
            cumulative += v
            if 1 + k * v > cumulative:
                k_max, total_k = k, cumulative
        tau = (total_k - 1) / k_max
        on = [v > tau for v in z]
        size = sum(on)
        return [[((1.0 if i == j and on[i] else 0.0) - (1.0 / size if on[i] and on[j] else 0.0)) / T
                 for j in range(len(z))] for i in range(len(z))]

    def compare(row, T):
        try:
            got = torch.as_tensor(sparsemax_jacobian(torch.tensor(row, dtype=torch.float64), T), dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise AssertionError(f"{where}: sparsemax_jacobian did not return a tensor ({exc})") from None
        assert tuple(got.shape) == (len(row), len(row)), f"{where}: the Jacobian must be {len(row)} x {len(row)}"
        for a_row, b_row in zip(got.tolist(), expected(row, T)):
            for a, b in zip(a_row, b_row):
                assert abs(a - b) <= 1e-12 + 1e-9 * abs(b), f"{where}: an entry is {a!r}, expected {b!r} (T={T:g})"

    if part == "values":
        for _ in range(4):
            compare([rng.gauss(0.0, 2.0) for _ in range(12)], 1.0)
    elif part == "temperatures":
        compare([rng.gauss(0.0, 2.0) for _ in range(12)], 0.1)
        compare([rng.gauss(0.0, 2.0) for _ in range(12)], 5.0)
    elif part == "one-key support":
        row = [rng.gauss(0.0, 1.0) for _ in range(9)]
        row[rng.randrange(9)] = 40.0
        compare(row, 1.0)
    elif part == "input unchanged":
        values = [rng.gauss(0.0, 1.0) for _ in range(12)]
        row = torch.tensor(values, dtype=torch.float64)
        sparsemax_jacobian(row, 0.5)
        assert row.tolist() == values, f"{where}: sparsemax_jacobian changed its input row"
    else:
        raise AssertionError(f"no hidden test for part {part!r}")


HIDDEN: dict[str, Callable[..., None]] = {"ch0-ex2": ch0_ex2, "ch1-ex2": ch1_ex2, "ch2-ex2": ch2_ex2,
                                          "ch3-ex2": ch3_ex2, "ch4-ex2": ch4_ex2, "ch6-ex2": ch6_ex2}

_NAME = "_hidden_test"


def hidden_block(key: str, part: str, names: tuple[str, ...]) -> str:
    """The ``### BEGIN HIDDEN TESTS`` block of the test cell of ``part`` of exercise ``key``.

    It defines the exercise's hidden test under a private name, runs it with fresh globals (only the
    real ``builtins``) on the student's functions ``names`` and deletes it again.
    """
    if key not in HIDDEN:
        raise ValueError(f"exercise {key!r} has no hidden test; hidden tests: {sorted(HIDDEN)}")
    function = HIDDEN[key]
    source = textwrap.dedent(inspect.getsource(function)).replace(f"def {function.__name__}(", f"def {_NAME}(", 1)
    return "\n".join([
        "### BEGIN HIDDEN TESTS",
        "# Hidden from the students: an independent test of the same part, on fresh random inputs.",
        source.rstrip(),
        "",
        "",
        "import builtins as _hidden_builtins, types as _hidden_types",
        f"_hidden_types.FunctionType({_NAME}.__code__, {{'__builtins__': _hidden_builtins}})({part!r}, "
        f"{', '.join(names)})",
        f"del {_NAME}, _hidden_builtins, _hidden_types",
        "### END HIDDEN TESTS",
    ])
