"""The one table helper: numeric columns marked for the stylesheet and written with aligned decimals."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from hypothesis import given, strategies as st

from attn_utils.book.formatting import LONG_MATH, NUMERIC_CLASS, TABLE_CLASS, column_format, math_pieces, table, tex


def cells(html: str) -> list[tuple[str, str]]:
    """(class, text) of every data cell of a rendered Styler."""
    return re.findall(r'<td id="[^"]+" class="([^"]+)" >([^<]*)</td>', html)


def test_numeric_columns_are_marked_and_text_columns_are_not():
    frame = pd.DataFrame({"L": [256, 1024], "N": [255, 5], "ratio": [0.999846, 0.554], "name": ["a", "b"]})
    html = table(frame).to_html()
    assert f'class="{TABLE_CLASS}"' in html
    by_column = {}
    for classes, text in cells(html):
        column = int(re.search(r"col(\d+)", classes).group(1))
        by_column.setdefault(column, []).append((NUMERIC_CLASS in classes.split(), text))
    assert by_column[0] == [(True, "256"), (True, "1024")]
    assert by_column[2] == [(True, "1.000"), (True, "0.554")]  # one number of decimals per column
    assert by_column[3] == [(False, "a"), (False, "b")]
    assert html.count("text-align: right") == 3  # the three numeric headers


def test_small_values_keep_a_significant_digit_and_line_up():
    write = column_format([0.001, 0.0706])
    assert [write(v) for v in (0.001, 0.0706)] == ["0.0010", "0.0706"]
    write = column_format([865.3, 0.5])
    assert [write(v) for v in (865.3, 0.5)] == ["865.3", "0.5"]


def test_columns_that_are_not_all_numbers_are_left_to_fmt():
    assert column_format(["1", 2.0]) is None and column_format([True, False]) is None


def test_wide_ranges_fall_back_to_one_value_at_a_time():
    write = column_format([1e-6, 2.5])
    assert write(1e-6) == "1 × 10⁻⁶" and write(2.5) == "2.5"


@given(st.lists(st.floats(min_value=1e-3, max_value=9e4).map(lambda x: round(x, 6)), min_size=1, max_size=8))
def test_every_value_reads_back_within_its_last_decimal(values):
    write = column_format(values)
    texts = [write(v) for v in values]
    reals = [v for v in values if not float(v).is_integer()]
    magnitudes = [math.floor(math.log10(v)) for v in reals]
    if magnitudes and max(magnitudes) - min(magnitudes) <= 3 and min(magnitudes) >= -3:
        assert len({len(t.split(".")[1]) if "." in t else 0 for t, v in zip(texts, values) if v != 0}) == 1, texts
    for v, t in zip(values, texts):
        if "×" in t:
            continue
        decimals = len(t.split(".")[1]) if "." in t else 0
        back = float(t.replace(",", ""))
        assert abs(back - v) <= 0.5 * 10.0 ** -decimals + 1e-9 or abs(back - v) <= 5e-3 * v, (v, t, texts)


def test_a_series_and_an_index_render():
    html = table(pd.Series([1.5, np.nan], index=["x", "y"], name="v"), index=True).to_html()
    assert ">1.50<" in html and ">n/a<" in html


def test_the_parameter_table_lists_every_given_parameter_with_its_value_and_meaning():
    from attn_utils.book.formatting import parameter_table
    from attn_utils.book.params import SPECS, validate

    p = validate(model="gpt2-random", L=64, Ns=[1, 2, 4], chapters=None)
    html = parameter_table(p).to_html()
    assert ">gpt2-random<" in html and ">64<" in html and ">1, 2, 4<" in html and ">None<" in html
    assert SPECS["L"].doc in html and html.count("<tr>") == 1 + 4


THEOREM_1 = r"\tilde d \le (1 - \bar\alpha_N) d_1 + \max_j \|x_j\| (\bar\alpha_N (L - N) - (1 - \bar\alpha_N))"


def _depth_before(formula: str, i: int) -> int:
    """The bracket depth at position i (a loop: the reference for :func:`math_pieces`)."""
    depth, j = 0, 0
    while j < i:
        if formula[j] == "\\" and formula[j + 1:j + 2] in "{}()[]|":
            j += 2
            continue
        depth += (formula[j] in "{([") - (formula[j] in "})]")
        j += 1
    return depth


def test_a_long_formula_breaks_before_its_top_level_relations_and_sums():
    assert math_pieces(THEOREM_1) == [r"\tilde d", r"{}\le (1 - \bar\alpha_N) d_1", r"{}+ \max_j \|x_j\|",
                                      r"(\bar\alpha_N (L - N) - (1 - \bar\alpha_N))"]
    # a quotient after a bracket, not N_s/N; a factor's bracket, not right after an operator
    assert math_pieces(r"(\max_k |F'_k| + \|\alpha\|_2 \|F'\|_2)/(L \min_j F_j)") == [
        r"(\max_k |F'_k| + \|\alpha\|_2 \|F'\|_2)", r"{}/(L \min_j F_j)"]
    assert math_pieces(r"N_s/N \le \frac{1}{N} \sum_i \exp(-(\xi_i - r)_+^2)")[0] == "N_s/N"
    # after the comma of a set's items (TeX's \{ \} are no group), not inside a bracket
    assert math_pieces(r"\min\{1/(2T), \sqrt{2}/\varepsilon\}") == [r"\min\{1/(2T),", r"\sqrt{2}/\varepsilon\}"]
    interval = r"\alpha_i \in [e^{-2\Delta/T}, e^{2\Delta/T}]/L"
    assert math_pieces(interval) == [interval]
    # \left ... \right is a bracket whatever its delimiters (a cut inside would be TeX that MathJax refuses)
    assert math_pieces(r"\left\{a + b, c\right\} \leftarrow d + e") == [r"\left\{a + b, c\right\} \leftarrow d",
                                                                       "{}+ e"]
    assert math_pieces(r"e^{-2 \Delta/T}/L \le \alpha_i \le e^{2 \Delta/T}/L")[1:] == [r"{}\le \alpha_i",
                                                                                      r"{}\le e^{2 \Delta/T}/L"]
    short = r"N_s/N \le 1 + x"
    assert len(short) < LONG_MATH and math_pieces(short) == [short]
    # never inside a bracket, a command name (\leq, \text{...}) or right after a sub- or superscript
    assert math_pieces(r"\exp(-(\xi_i - r)_+^2 / (2 M^2)) \text{ with } a = b + c_{+} + d^+ + e") == [
        r"\exp(-(\xi_i - r)_+^2 / (2 M^2)) \text{ with } a", "{}= b", r"{}+ c_{+}", r"{}+ d^+", "{}+ e"]
    html = tex(f"bound: ${THEOREM_1}$.")
    assert html.startswith("bound: <span class=\"math") and html.count("<wbr>") == 3 and html.endswith("</span>.")


@given(st.lists(st.sampled_from(["a", "x_i", r"\le", "=", "+", "-", "(", ")", "{", "}", r"\|", "^", "_", " ",
                                 r"\alpha", r"\frac{1}{2}"]), min_size=0, max_size=40))
def test_the_pieces_are_the_formula_cut_at_top_level_operators(tokens):
    formula = " ".join(tokens)
    pieces = math_pieces(formula)
    assert "".join(p.removeprefix("{}") if n else p for n, p in enumerate(pieces)).replace(" ", "") == \
        formula.replace(" ", "")
    position = 0
    for n, piece in enumerate(pieces):
        body = piece.removeprefix("{}") if n else piece
        position = formula.index(body, position)
        if n:  # each cut is at a top-level operator of BREAK_BEFORE, or after a top-level ", "
            assert _depth_before(formula, position) == 0
            assert body.startswith(("\\le", "\\ge", "=", "+", "-", "/", "(", "\\sum")) or \
                formula[:position].rstrip().endswith(",")
        position += len(body)
