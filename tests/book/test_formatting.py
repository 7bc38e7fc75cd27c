"""The one table helper: numeric columns marked for the stylesheet and written with aligned decimals."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from hypothesis import given, strategies as st

from attn_utils.book.formatting import NUMERIC_CLASS, TABLE_CLASS, column_format, table


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
