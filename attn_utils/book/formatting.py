"""Numbers for the prose and the tables: one formatting rule for the whole book, and glue for many values at once.

:func:`fmt` writes a number with ``digits`` significant digits, an integer (or a float equal to one) as an
integer, a very small or very large number as ``2.2 × 10⁻¹⁶``, NaN as ``n/a``, and never ``-0``.
:func:`glue_values` glues a dict of values into the notebook (myst-nb) as formatted text, so that a chapter
does the bookkeeping of all its numbers in one hidden cell.
"""
from __future__ import annotations

import html
import math
import numbers
from collections.abc import Mapping
from typing import Any

SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
SCIENTIFIC_BELOW, SCIENTIFIC_FROM = 1e-3, 1e6


def scalar(value: Any) -> Any:
    """A Python scalar from a numpy or torch scalar (0-d array or tensor); other values unchanged."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        return item()
    return value


def is_number(value: Any) -> bool:
    """Whether ``value`` is a real number (an integer, a float, a numpy scalar), not a boolean."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def fmt(value: Any, digits: int = 3) -> str:
    """``value`` for reading: integers whole, reals to ``digits`` significant digits, scientific notation only
    below 10⁻³ or from 10⁶, ``n/a`` for NaN, ``yes``/``no`` for booleans; a list is formatted element-wise."""
    value = scalar(value)
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v, digits) for v in value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}" if abs(int(value)) >= 10_000 else str(int(value))
    if not isinstance(value, numbers.Real):
        return str(value)
    x = float(value)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if x == 0:
        return "0"
    if x.is_integer() and abs(x) < SCIENTIFIC_FROM:
        return fmt(int(x))
    if abs(x) < SCIENTIFIC_BELOW or abs(x) >= SCIENTIFIC_FROM:
        mantissa, exponent = f"{x:.{max(digits - 1, 0)}e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
        return f"{mantissa} × 10{str(int(exponent)).translate(SUPERSCRIPT)}"
    text = f"{x:.{digits}g}"
    if "e" in text:  # %g chose an exponent for a moderate number, e.g. 1.23e+03 at 3 digits
        text = f"{x:,.0f}"
    return "0" if text in ("-0", "0") else text


TABLE_CLASS = "output-table"  # styled by _static/tables.css: padding, header rules, numbers right-aligned
NUMERIC_CLASS = "num"
MAX_DECIMALS = 6


def column_format(values, digits: int = 3):
    """How to write a numeric column so that it reads down: a function value -> text, or ``None`` when
    ``values`` are not all numbers (NaN allowed).

    Integers stay whole. Reals share one number of decimals, so that the decimal points line up: ``digits``
    significant digits for the largest value, at least one for the smallest (``0.0010`` above ``0.0706``); a column
    whose values span more than three orders of magnitude, or that needs scientific notation, is written value
    by value with :func:`fmt`."""
    values = [scalar(v) for v in values]
    if not values or not all(is_number(v) for v in values):
        return None
    finite = [float(v) for v in values if math.isfinite(float(v))]
    magnitudes = [math.floor(math.log10(abs(x))) for x in finite if not x.is_integer()]
    if not magnitudes or min(magnitudes) < -3 or max(abs(x) for x in finite) >= SCIENTIFIC_FROM \
            or max(magnitudes) - min(magnitudes) > 3:
        return lambda v: fmt(v, digits)
    decimals = min(max(digits - 1 - max(magnitudes), -min(magnitudes), 0), MAX_DECIMALS)

    grouping = "," if max(abs(x) for x in finite) >= 10_000 else ""

    def write(v) -> str:
        x = float(scalar(v))
        if not math.isfinite(x) or x == 0:
            return fmt(x)
        text = f"{x:{grouping}.{decimals}f}"
        return "0" if float(text.replace(",", "")) == 0 else text

    return write


def table(frame, digits: int = 3, caption: str | None = None, index: bool = False):
    """``frame`` (a pandas DataFrame or Series) for reading: a pandas ``Styler`` that renders as an HTML table of
    class ``output-table``. Numeric columns are written by :func:`column_format` (aligned decimals) and their
    cells and headers carry the class ``num`` (right-aligned by ``_static/tables.css``); other cells and the
    labels go through :func:`fmt`; no truncation; the index hidden unless ``index``."""
    frame = frame.to_frame() if hasattr(frame, "to_frame") and frame.ndim == 1 else frame
    styler = frame.style.format(lambda v: fmt(v, digits)).format_index(lambda v: fmt(v, digits))
    styler = styler.format_index(lambda v: fmt(v, digits), axis=1)
    classes = type(frame)("", index=frame.index, columns=frame.columns)
    unique = frame.index.is_unique and frame.columns.is_unique  # Styler addresses cells by label
    for j, column in enumerate(frame.columns):
        write = column_format(list(frame.iloc[:, j]), digits) if unique else None
        if write is not None:
            styler = styler.format(write, subset=[column])
            classes.iloc[:, j] = NUMERIC_CLASS
            styler = styler.set_table_styles({column: [{"selector": "th.col_heading", "props": "text-align: right"}]},
                                             overwrite=False)
    styler = (styler.set_td_classes(classes) if unique else styler).set_table_attributes(f'class="{TABLE_CLASS}"')
    styler = styler if index else styler.hide(axis="index")
    return styler.set_caption(caption) if caption else styler


def glue_values(values: Mapping[str, Any], digits: int = 3) -> dict[str, str]:
    """Glue every ``name: value`` as formatted text (``{glue:text}`name``` in the prose); return what was glued."""
    from myst_nb import glue

    texts = {name: fmt(value, digits) for name, value in values.items()}
    for name, text in texts.items():
        glue(name, text, display=False)
    return texts


def parameter_table(p, caption: str = "The parameters of this run"):
    """The checked parameters ``p`` (:class:`attn_utils.book.params.Parameters`) as a compact table: each parameter
    the notebook declares, the value it runs with (``model = auto`` resolved) and its meaning from
    :data:`attn_utils.book.params.SPECS`; the rendered page shows this instead of the parameters cell."""
    import pandas as pd

    from attn_utils.book.params import SPECS

    rows = [(name, fmt(p.model_name if name == "model" else p[name]) if p[name] is not None else "None",
             SPECS[name].doc if name in SPECS else "") for name in p.given]
    frame = pd.DataFrame(rows, columns=["parameter", "value", "meaning"])
    return table(frame, caption=caption)


# a long formula of a table cell may break before these, where they stand outside every bracket: an operator
# (a relation, a sum, a binary minus, a quotient; the piece it starts keeps its binary spacing) or a factor (a
# bracket, a sum); and after ", " (the items of a set)
OPERATORS = ("\\leq", "\\geq", "\\le", "\\ge", "\\approx", "\\to", "=", "<", ">", "+", " - ", " / ", "/")
FACTORS = (" (", "\\sum")
BREAK_BEFORE = OPERATORS + FACTORS
_OPERATOR_STARTS = tuple(dict.fromkeys(o.strip() for o in OPERATORS))
LONG_MATH = 16  # characters of TeX: a shorter formula is never broken


def _may_break(formula: str, start: int, i: int, op: str) -> bool:
    """Whether a piece may end before ``op`` at ``i``: not after ``_``, ``^`` or ``{``; a quotient written without
    spaces only after a bracket (``(a + b)/c``, not ``N_s/N``); a factor (a bracket, a sum) not right after an
    operator (``\\le (a)``, ``= \\sum_i``)."""
    before = formula[:i].rstrip()[-1:]
    if before in ("_", "^", "{"):
        return False
    if op == "/":
        return before == ")"
    if op in FACTORS:
        return formula[start:i].strip().lstrip("{}") not in _OPERATOR_STARTS
    return True


def math_pieces(formula: str) -> list[str]:
    """``formula`` (TeX) cut before each of :data:`BREAK_BEFORE` that stands outside every bracket (not after ``_``
    or ``^``) and after each such ", " (the items of ``\\{a, b\\}``: TeX's escaped braces are no group), a piece
    that starts with an operator prefixed with ``{}`` so that MathJax keeps its binary spacing; a
    formula of under :data:`LONG_MATH` characters stays whole. Inline math does not wrap, so a long formula in a
    table cell would otherwise set the width of its column."""
    if len(formula) < LONG_MATH:
        return [formula]
    pieces, depth, start, i = [], 0, 0, 0
    while i < len(formula):
        c = formula[i]
        sized = next((w for w in ("\\left", "\\right") if formula.startswith(w, i)
                      and not formula[i + len(w):i + len(w) + 1].isalpha()), None)  # not \leftarrow
        if sized:  # \left and \right pair their delimiters, whatever they are: a bracket of their own
            depth += 1 if sized == "\\left" else -1
            i += len(sized) + (2 if formula[i + len(sized):i + len(sized) + 1] == "\\" else 1)
            continue
        if c == "\\" and formula[i + 1:i + 2] in "{}()[]|":  # an escaped bracket or a norm bar
            i += 2
            continue
        op = next((o for o in BREAK_BEFORE if formula.startswith(o, i)
                   and not (o[0] == "\\" and formula[i + len(o):i + len(o) + 1].isalpha())), None)
        if op and depth == 0 and i > start and _may_break(formula, start, i, op):
            pieces.append(formula[start:i].strip())
            start = i
        elif c == "," and depth == 0 and formula[i + 1:i + 2] == " ":  # an item of a set \{a, b\}
            pieces.append(formula[start:i + 1].strip())
            start = i + 1
        depth += (c in "{([") - (c in "})]")
        i += len(op) if op in OPERATORS else 1  # a factor's own text is scanned for brackets
    pieces = [p for p in [*pieces, formula[start:].strip()] if p]
    return [("{}" + p if n and p.startswith(_OPERATOR_STARTS) else p) for n, p in enumerate(pieces)]


def tex(text: str) -> str:
    """``text`` as HTML, each ``$...$`` of it as inline math that MathJax typesets (as Sphinx writes it), a long
    formula in pieces that a line may break between (:func:`math_pieces`): the ledger's texts and short names in
    the tables of the book."""
    parts = text.split("$")
    return "".join(html.escape(part) if i % 2 == 0 else "<wbr>".join(
        f'<span class="math notranslate nohighlight">\\({html.escape(piece)}\\)</span>' for piece in math_pieces(part))
        for i, part in enumerate(parts))
