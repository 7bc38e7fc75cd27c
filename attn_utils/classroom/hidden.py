"""The hidden tests of the coding exercises, judged outside the student's kernel.

Each part of a coding exercise (:data:`attn_utils.classroom.exercises.EXERCISES`) has a hidden test in
three steps, split between the grader and the kernel that runs the student's notebook:

1. :func:`draw` (grader): fresh random inputs for the part, from a seed the grader draws at every
   grading (the seed is in the failure message): the calls to make, with their arguments as data;
2. :func:`respond` (kernel, in the ``### BEGIN HIDDEN TESTS`` block of the part's test cell, which
   nbgrader restores from its gradebook): reads the inputs from the file the grader wrote into the
   kernel's folder, calls the student's functions on them (:func:`answer`) and displays what they
   returned as data of the type :data:`MIME`;
3. :func:`judge` (grader): reads that data and compares it with references computed here, in plain
   Python floats (``math``), from the inputs the grader kept.

The grader's executor (:class:`attn_utils.classroom.nbgrader_support.GuardedExecute`) takes the data
out of the cell's outputs and, when :func:`judge` finds a fault (or no answer came), appends an error
to the cell, which then scores zero. Nothing in the kernel can reach the references or change the
verdict: patching ``builtins``, ``math``, ``torch`` or this module, or walking up the frames, only
changes what the student's own functions return. A notebook executed anywhere else (no inputs file)
fails every hidden test.
"""
from __future__ import annotations

import base64
import json
import math
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["HIDDEN", "INPUTS_ENV", "MIME", "answer", "draw", "hidden_block", "judge", "respond", "test_id"]

MIME = "application/vnd.attn-companion.hidden+json"  # the data a test cell returns to the grader
INPUTS_ENV = "ATTN_COMPANION_HIDDEN_INPUTS"           # the kernel's environment: the grader's inputs file


def test_id(key: str, part: str) -> str:
    """nbgrader's grade id of the test cell of ``part`` of exercise ``key``."""
    return f"{key}-test-{re.sub(r'[^a-z0-9]+', '-', part.lower()).strip('-')}"


class Wrong(Exception):
    """What the student's functions returned fails the part (the message says how)."""


# --- inputs (grader) and arguments (kernel) ---------------------------------------------------------------------

# the F of ch1-ex2, by label: the torch function the student's code gets, the same F in plain Python, and
# the ratio max F / min F on [-a, a] (the bound times L)
def _softplus(v: float) -> float:
    return max(v, 0.0) + math.log1p(math.exp(-abs(v)))


NORMALIZERS: dict[str, tuple[Callable[[float], float], Callable[[float], float]]] = {
    "exp(l / 0.5)": (lambda v: math.exp(v / 0.5), lambda a: math.exp(4 * a)),
    "softplus": (_softplus, lambda a: _softplus(a) / _softplus(-a)),
    "2 + cos(3 l)": (lambda v: 2 + math.cos(3 * v), lambda a: 3.0),
}


def _torch_normalizer(label: str):
    import torch

    return {"exp(l / 0.5)": lambda l: torch.exp(l / 0.5), "softplus": torch.nn.functional.softplus,
            "2 + cos(3 l)": lambda l: 2 + torch.cos(3 * l)}[label]


def _argument(spec: dict):
    """An argument of a call, built in the kernel from its description."""
    import torch

    kind, value = next(iter(spec.items()))
    if kind == "tensor":
        return torch.tensor(value, dtype=torch.float64)
    if kind == "generator":
        return torch.Generator().manual_seed(value)
    if kind == "F":
        return _torch_normalizer(value)
    return value  # "number"


def _call(function: str, args: list[dict], read: str, after: tuple[int, ...] = ()) -> dict:
    return {"function": function, "args": args, "read": read, "after": list(after)}


def _gauss(rng: random.Random, shape: tuple[int, ...], scale: float) -> list:
    if len(shape) == 1:
        return [rng.gauss(0.0, 1.0) * scale for _ in range(shape[0])]
    return [_gauss(rng, shape[1:], scale) for _ in range(shape[0])]


def _weights(rng: random.Random, L: int, spread: float) -> list[float]:
    z = [rng.gauss(0.0, spread) for _ in range(L)]
    top = max(z)
    e = [math.exp(v - top) for v in z]
    return [v / sum(e) for v in e]


# --- what the kernel returns: data, read back by the grader ------------------------------------------------------


def _array(value) -> dict:
    import numpy as np
    import torch

    t = torch.as_tensor(value, dtype=torch.float64).detach().cpu()
    data = np.ascontiguousarray(t.numpy(), "<f8").tobytes()
    return {"shape": list(t.shape), "float64": base64.b64encode(data).decode()}


def _indices(value, length: int) -> list[int]:
    import torch

    if isinstance(value, (set, frozenset)):
        value = list(value)
    t = torch.as_tensor(value)
    if t.dtype == torch.bool and tuple(t.shape) == (length,):
        t = t.nonzero().flatten()
    return sorted({int(i) for i in t.flatten().tolist()})


def _read(kind: str, value, args: list) -> Any:
    """What a student's function returned, as data: ``kind`` says what it should be."""
    if kind == "tensor":
        return _array(value)
    if kind == "number":
        return float(value)
    if kind == "top, s, distance":
        if not (isinstance(value, (tuple, list)) and len(value) == 3):
            raise TypeError("distance_by_loop must return three things (top-N set, s, distance)")
        import torch

        return [_indices(value[0], len(args[0])), _array(torch.as_tensor(value[1], dtype=torch.float64).flatten()),
                float(value[2])]
    if kind == "N_s, r":
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise TypeError("separability_by_loop must return (N_s, r)")
        return [float(value[0]), float(value[1])]
    raise ValueError(f"unknown kind {kind!r}")


def answer(inputs: dict, functions: dict[str, Callable]) -> list[dict]:
    """The student's ``functions`` called on the calls of ``inputs`` (kernel side): for each call, what it
    returned (``value``) or what it raised (``error``), and the arguments listed in ``after`` as they are after
    the call."""
    out = []
    for call in inputs["calls"]:
        args = [_argument(a) for a in call["args"]]
        try:
            result = {"value": _read(call["read"], functions[call["function"]](*args), args)}
        except (Exception, SystemExit) as exc:  # a student's function may raise anything
            result = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        if call["after"]:
            result["after"] = [_array(args[i]) for i in call["after"]]
        out.append(result)
    return out


def respond(key: str, part: str, **functions: Callable) -> None:
    """The hidden block of a test cell (kernel side): display the functions' answers on the grader's inputs."""
    path = os.environ.get(INPUTS_ENV)
    if not path or not os.path.isfile(path):
        raise AssertionError("the hidden tests run only when the classroom's grader executes the notebook")
    with open(path) as f:
        inputs = json.load(f)[f"{key}/{part}"]
    from IPython.display import display

    display({MIME: answer(inputs, functions)}, raw=True)


def hidden_block(key: str, part: str, names: tuple[str, ...]) -> str:
    """The ``### BEGIN HIDDEN TESTS`` block of the test cell of ``part`` of exercise ``key``."""
    if key not in HIDDEN:
        raise ValueError(f"exercise {key!r} has no hidden test; hidden tests: {sorted(HIDDEN)}")
    return "\n".join([
        "### BEGIN HIDDEN TESTS",
        "# Hidden from the students: the grader draws new inputs for this part, this cell returns what your",
        "# functions give on them, and the grader compares that with its own reference, outside this kernel.",
        "from attn_utils.classroom import hidden as _hidden",
        f"_hidden.respond({key!r}, {part!r}, {', '.join(f'{n}={n}' for n in names)})",
        "del _hidden",
        "### END HIDDEN TESTS",
    ])


# --- judging (grader) -------------------------------------------------------------------------------------------


def _decode(data, shape: tuple[int, ...] | None = None) -> list:
    """A float64 array the kernel returned, as nested lists (of ``shape``, if given)."""
    import numpy as np

    if not (isinstance(data, dict) and isinstance(data.get("shape"), list) and isinstance(data.get("float64"), str)
            and all(isinstance(n, int) and n >= 0 for n in data["shape"])):
        raise Wrong("returned something that is not an array of numbers")
    raw = base64.b64decode(data["float64"], validate=True)
    if len(raw) != 8 * math.prod(data["shape"]):
        raise Wrong("returned an array whose data does not match its shape")
    got = tuple(data["shape"])
    if shape is not None and got != shape:
        raise Wrong(f"returned shape {got} for an expected shape {shape}")
    values = np.frombuffer(raw, "<f8").reshape(got)
    if np.isnan(values).any():
        raise Wrong("returned NaN")
    return values.tolist()


def _value(out, name: str):
    if not isinstance(out, dict) or ("value" not in out and "error" not in out):
        raise Wrong(f"no answer of {name} came back")
    if "error" in out:
        raise Wrong(f"{name} raised {str(out['error'])[:300]}")
    return out["value"]


def _close(a: float, b: float, rtol: float = 1e-9, atol: float = 1e-12) -> bool:
    return isinstance(a, float) and abs(a - b) <= atol + rtol * abs(b)


@dataclass(frozen=True)
class Hidden:
    """The hidden tests of one exercise: ``draw(part, rng)`` gives the calls, ``check(part, calls, outputs)``
    raises :class:`Wrong`."""

    draw: Callable[[str, random.Random], list[dict]]
    check: Callable[[str, list[dict], list], None]
    parts: tuple[str, ...]


# ch0-ex2: causal_softmax(logits, T) ----------------------------------------------------------------------------

_CH0 = {"shape": ((2, 3, 5, 5), 1.0, (1.0,)), "rows sum to one": ((4, 6, 6), 2.0, (1.0,)),
        "causal mask": ((3, 7, 7), 2.0, (1.0,)), "temperature": ((3, 6, 6), 2.0, (0.25, 4.0)),
        "large logits": ((2, 6, 6), 1000.0, (1.0,)), "values": ((2, 9, 9), 3.0, (0.7,))}


def _ch0_draw(part: str, rng: random.Random) -> list[dict]:
    shape, scale, temperatures = _CH0[part]
    data = _gauss(rng, shape, scale)
    return [_call("causal_softmax", [{"tensor": data}, {"number": T}], "tensor") for T in temperatures]


def _matrices(nested: list, depth: int) -> list:
    return [nested] if depth == 0 else [m for item in nested for m in _matrices(item, depth - 1)]


def _causal_reference(matrix: list[list[float]], T: float) -> list[list[float]]:
    out = []
    for t, row in enumerate(matrix):
        z = [v / T for v in row[:t + 1]]
        top = max(z)
        e = [math.exp(v - top) for v in z]
        total = sum(e)
        out.append([v / total for v in e] + [0.0] * (len(row) - t - 1))
    return out


def _ch0_check(part: str, calls: list[dict], outputs: list) -> None:
    shape = _CH0[part][0]
    for call, out in zip(calls, outputs):
        data, T = call["args"][0]["tensor"], call["args"][1]["number"]
        got = _matrices(_decode(_value(out, "causal_softmax"), shape), len(shape) - 2)
        if part == "rows sum to one":
            bad = next((sum(row) for m in got for row in m if abs(sum(row) - 1.0) > 1e-9), None)
            if bad is not None:
                raise Wrong(f"a row of weights sums to {bad!r}")
        elif part == "causal mask":
            if any(v != 0.0 for m in got for t, row in enumerate(m) for v in row[t + 1:]):
                raise Wrong("a query gives weight to a later key")
        elif part != "shape":
            for m_in, m_out in zip(_matrices(data, len(shape) - 2), got):
                for row, expected in zip(m_out, _causal_reference(m_in, T)):
                    for a, b in zip(row, expected):
                        if not _close(a, b):
                            raise Wrong(f"a weight is {a!r} where softmax(l / T) over the visible keys gives {b!r} "
                                        f"(T={T})")


# ch1-ex2: max_weight_bound(F, a, L), extreme_row(F, a, L) -------------------------------------------------------

_EXTREME_L = 100_000


def _ch1_draw(part: str, rng: random.Random) -> list[dict]:
    def bound(label: str, a: float, L: int) -> dict:
        return _call("max_weight_bound", [{"F": label}, {"number": a}, {"number": L}], "number")

    if part == "softmax":
        return [bound("exp(l / 0.5)", rng.uniform(1.0, 2.5), rng.randint(5, 50))]
    if part == "several lengths":
        a = rng.uniform(1.0, 2.0)
        return [bound("softplus", a, L) for L in (2, rng.randint(5, 50), rng.randint(500, 2000))]
    if part == "non-monotone F":
        return [bound("2 + cos(3 l)", rng.uniform(1.2, 2.5), rng.randint(5, 50))]
    # with exp, the extreme row reaches 0.9 of the bound only while e^(4a) is small beside L: a <= 2
    return [_call("extreme_row", [{"F": label}, {"number": a}, {"number": _EXTREME_L}], "tensor")
            for label, a in (("exp(l / 0.5)", rng.uniform(1.2, 2.0)), ("2 + cos(3 l)", rng.uniform(1.2, 2.5)))]


def _ch1_check(part: str, calls: list[dict], outputs: list) -> None:
    for call, out in zip(calls, outputs):
        label, a, L = call["args"][0]["F"], call["args"][1]["number"], call["args"][2]["number"]
        f, ratio = NORMALIZERS[label]
        if part != "extreme row":
            got, expected = _value(out, "max_weight_bound"), ratio(a) / L
            if not _close(got, expected, 1e-3 if part == "non-monotone F" else 1e-6, 0.0):
                raise Wrong(f"max_weight_bound(F, a={a:.4g}, L={L}) with F(l) = {label} is {got!r}, "
                            f"expected {expected!r}")
            continue
        row = _decode(_value(out, "extreme_row"), (L,))
        if not all(abs(v) <= a * (1 + 1e-12) for v in row):
            raise Wrong("the logits must lie in [-a, a]")
        values = [f(v) for v in row]
        top, upper = max(values) / sum(values), ratio(a) / L
        if top < 0.9 * upper:
            raise Wrong(f"the largest weight of extreme_row with F(l) = {label} is {top:.4g}, below 0.9 x {upper:.4g}")


# ch2-ex2: distance_by_loop(weights_row, x, n_top) -> (top-N set, s, distance) ---------------------------------


def _ch2_draw(part: str, rng: random.Random) -> list[dict]:
    if part == "ties":
        w, n = [0.3] + [0.2] * 4 + [0.1] * 3, 3
        rng.shuffle(w)
        x = _gauss(rng, (len(w), 3), 1.0)
    else:
        w, x, n = _weights(rng, 40, 3.0), _gauss(rng, (40, 8), 1.0), 5
    return [_call("distance_by_loop", [{"tensor": w}, {"tensor": x}, {"number": n}], "top, s, distance")]


def _ch2_check(part: str, calls: list[dict], outputs: list) -> None:
    (call,), (out,) = calls, outputs
    w, x, n = (a[k] for a, k in zip(call["args"], ("tensor", "tensor", "number")))
    value = _value(out, "distance_by_loop")
    if not (isinstance(value, list) and len(value) == 3 and isinstance(value[0], list)
            and all(isinstance(i, int) for i in value[0])):
        raise Wrong("distance_by_loop must return three things (top-N set, s, distance)")
    top = sorted(range(len(w)), key=lambda i: (-w[i], i))[:n]
    if part in ("top-N set", "ties"):
        if set(value[0]) != set(top):
            raise Wrong(f"the top-{n} set is {value[0]}, not the {n} largest weights"
                        + (f"; with weights {w}, the earlier key must win a tie" if part == "ties" else ""))
        return
    s = [sum(w[i] * x[i][c] for i in top) for c in range(len(x[0]))]
    if part == "context vector":
        if not all(_close(a, b) for a, b in zip(_decode(value[1], (len(s),)), s)):
            raise Wrong("s differs from the sum of alpha_i x_i over the top-N set")
        return
    total = sum(math.sqrt(sum((w[i] * x[i][c] - s[c]) ** 2 for c in range(len(s))))
                for i in range(len(w)) if i not in top)
    if not _close(value[2], total):
        raise Wrong(f"the distance is {value[2]!r}, expected {total!r}")


# ch3-ex2: separability_by_loop(weights_row, x, n_top) -> (N_s, r) ----------------------------------------------

_CH3 = {"radius": [(50, 16, 8)], "count": [(50, 16, 8)], "other rows": [(20, 3, 3), (30, 2, 12)]}


def _ch3_draw(part: str, rng: random.Random) -> list[dict]:
    return [_call("separability_by_loop", [{"tensor": _weights(rng, L, 1.5)}, {"tensor": _gauss(rng, (L, d), 3.0)},
                                           {"number": n}], "N_s, r") for L, d, n in _CH3[part]]


def _ch3_check(part: str, calls: list[dict], outputs: list) -> None:
    for call, out in zip(calls, outputs):
        w, x, n = (a[k] for a, k in zip(call["args"], ("tensor", "tensor", "number")))
        n_s, r = _value(out, "separability_by_loop")
        points = [[wi * c / math.sqrt(sum(v * v for v in xi)) for c in xi] for wi, xi in zip(w, x)]
        top = sorted(range(len(w)), key=lambda i: (-w[i], i))[:n]
        s = [sum(points[i][c] for i in top) for c in range(len(x[0]))]

        def gap(i: int) -> float:
            return math.sqrt(sum((a - b) ** 2 for a, b in zip(s, points[i])))

        radius = min(gap(j) for j in range(len(w)) if j not in top)
        count = sum(1 for i in top if gap(i) < radius)
        if part == "radius" and not _close(r, radius):
            raise Wrong(f"r is {r!r}, expected {radius!r}")
        if part != "radius" and n_s != count:
            raise Wrong(f"N_s is {n_s:g} for L={len(w)}, d={len(x[0])}, N={n}, expected {count}")


# ch4-ex2: g_row(row, T, eps, generator) --------------------------------------------------------------------------

_CH4 = {"one row": [(1.0, 1e-3)], "temperatures": [(0.1, 0.5), (10.0, 1e-2)],
        "bound": [(T, eps) for T in (0.01, 0.1, 1.0, 10.0) for eps in (1e-3, 1.0, 100.0)],
        "input unchanged": [(1.0, 0.1)]}


def _ch4_draw(part: str, rng: random.Random) -> list[dict]:
    row = [rng.gauss(0.0, 4.0 if part == "bound" else 1.0 if part == "input unchanged" else 2.0) for _ in range(30)]
    return [_call("g_row", [{"tensor": row}, {"number": T}, {"number": eps}, {"generator": rng.randrange(2 ** 31)}],
                  "number", after=(0,) if part == "input unchanged" else ())
            for T, eps in _CH4[part]]


def _softmax(z: list[float]) -> list[float]:
    top = max(z)
    e = [math.exp(v - top) for v in z]
    return [v / sum(e) for v in e]


def _ch4_check(part: str, calls: list[dict], outputs: list) -> None:
    import torch

    for call, out in zip(calls, outputs):
        row, T, eps, draw = (next(iter(a.values())) for a in call["args"])
        got = _value(out, "g_row")
        if part == "input unchanged":
            if _decode(out["after"][0], (len(row),)) != row:
                raise Wrong("g_row changed its input row")
            continue
        if part == "bound":
            limit = min(1 / (2 * T), math.sqrt(2) / eps)
            if not (isinstance(got, float) and got <= limit * (1 + 1e-9)):
                raise Wrong(f"g_row(row, T={T:g}, eps={eps:g}) = {got:.4g} > {limit:.4g}")
            continue
        v = torch.randn(len(row), generator=torch.Generator().manual_seed(draw), dtype=torch.float64).tolist()
        norm = math.sqrt(sum(c * c for c in v))
        moved, base = _softmax([(l + eps * c / norm) / T for l, c in zip(row, v)]), _softmax([l / T for l in row])
        expected = math.sqrt(sum((a - b) ** 2 for a, b in zip(moved, base))) / eps
        if not _close(got, expected, 1e-7):
            raise Wrong(f"g_row(row, T={T:g}, eps={eps:g}) is {got!r}, expected {expected!r}")


# ch6-ex2: sparsemax_jacobian(row, T) ------------------------------------------------------------------------------


def _ch6_draw(part: str, rng: random.Random) -> list[dict]:
    def call(row: list[float], T: float) -> dict:
        return _call("sparsemax_jacobian", [{"tensor": row}, {"number": T}], "tensor",
                     after=(0,) if part == "input unchanged" else ())

    if part == "values":
        return [call([rng.gauss(0.0, 2.0) for _ in range(12)], 1.0) for _ in range(4)]
    if part == "temperatures":
        return [call([rng.gauss(0.0, 2.0) for _ in range(12)], T) for T in (0.1, 5.0)]
    if part == "one-key support":
        row = [rng.gauss(0.0, 1.0) for _ in range(9)]
        row[rng.randrange(9)] = 40.0
        return [call(row, 1.0)]
    return [call([rng.gauss(0.0, 1.0) for _ in range(12)], 0.5)]


def _sparsemax_jacobian(row: list[float], T: float) -> list[list[float]]:
    z = [v / T for v in row]
    cumulative, k_max, total_k = 0.0, 0, 0.0
    for k, v in enumerate(sorted(z, reverse=True), 1):
        cumulative += v
        if 1 + k * v > cumulative:
            k_max, total_k = k, cumulative
    tau = (total_k - 1) / k_max
    on = [v > tau for v in z]
    size = sum(on)
    return [[((1.0 if i == j and on[i] else 0.0) - (1.0 / size if on[i] and on[j] else 0.0)) / T
             for j in range(len(z))] for i in range(len(z))]


def _ch6_check(part: str, calls: list[dict], outputs: list) -> None:
    for call, out in zip(calls, outputs):
        row, T = call["args"][0]["tensor"], call["args"][1]["number"]
        value = _value(out, "sparsemax_jacobian")
        if part == "input unchanged":
            if _decode(out["after"][0], (len(row),)) != row:
                raise Wrong("sparsemax_jacobian changed its input row")
            continue
        got = _decode(value, (len(row), len(row)))
        for a_row, b_row in zip(got, _sparsemax_jacobian(row, T)):
            for a, b in zip(a_row, b_row):
                if not _close(a, b):
                    raise Wrong(f"an entry is {a!r}, expected {b!r} (T={T:g})")


HIDDEN: dict[str, Hidden] = {
    "ch0-ex2": Hidden(_ch0_draw, _ch0_check, tuple(_CH0)),
    "ch1-ex2": Hidden(_ch1_draw, _ch1_check, ("softmax", "several lengths", "non-monotone F", "extreme row")),
    "ch2-ex2": Hidden(_ch2_draw, _ch2_check, ("top-N set", "ties", "context vector", "distance")),
    "ch3-ex2": Hidden(_ch3_draw, _ch3_check, tuple(_CH3)),
    "ch4-ex2": Hidden(_ch4_draw, _ch4_check, tuple(_CH4)),
    "ch6-ex2": Hidden(_ch6_draw, _ch6_check, ("values", "temperatures", "one-key support", "input unchanged")),
}


def draw(key: str, part: str, seed: int) -> dict:
    """The inputs of the hidden test of ``part`` of ``key`` for one grading (grader side), drawn from ``seed``."""
    if part not in HIDDEN[key].parts:
        raise ValueError(f"exercise {key} has no hidden test of part {part!r}")
    return {"key": key, "part": part, "seed": seed, "calls": HIDDEN[key].draw(part, random.Random(seed))}


def judge(inputs: dict, outputs: Any) -> str | None:
    """None when what the kernel returned (``outputs``, untrusted data) passes the hidden test of ``inputs``, else
    why not (grader side)."""
    where = f"hidden test of part {inputs['part']!r} (seed {inputs['seed']})"
    if outputs is None:
        return f"{where}: no answer came back from the notebook (the test cell did not run to its end)"
    if not isinstance(outputs, list) or len(outputs) != len(inputs["calls"]):
        return f"{where}: the notebook returned {type(outputs).__name__} instead of one answer per call"
    try:
        HIDDEN[inputs["key"]].check(inputs["part"], inputs["calls"], outputs)
    except Wrong as exc:
        return f"{where}: {exc}"
    except Exception as exc:  # anything the kernel sent that is not what it should be
        return f"{where}: what the notebook returned cannot be read ({type(exc).__name__})"
    return None
