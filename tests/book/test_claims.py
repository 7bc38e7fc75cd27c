"""The ledger's rules as data, the formatting of numbers, and the claim files of every chapter."""
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from attn_utils.book import claims
from attn_utils.book.claims import Rule, evaluate
from attn_utils.book.formatting import fmt


@pytest.mark.parametrize("value, text", [
    (1.0, "1"), (32.0, "32"), (1000.0, "1000"), (-0.0, "0"), (0.0, "0"), (2.2e-16, "2.2 × 10⁻¹⁶"),
    (1e200, "1 × 10²⁰⁰"), (0.123456, "0.123"), (float("nan"), "n/a"), (0.0042, "0.0042"), (True, "yes"),
    (12000, "12,000"), ([1, 2.5], "1, 2.5"), (np.float64(3.14159), "3.14"), (torch.tensor(7), "7"),
    (0.00099, "9.9 × 10⁻⁴"), (float("inf"), "∞"), (-5.5e7, "-5.5 × 10⁷"), ("text", "text"),
])
def test_numbers_read_as_numbers(value, text):
    assert fmt(value) == text


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300))
def test_formatted_reals_keep_their_value_to_the_digits_shown(x):
    text = fmt(x, digits=3).replace(",", "").replace("−", "-")
    if "×" in text:
        mantissa, power = text.split(" × 10")
        power = power.translate(str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789"))
        back = float(mantissa) * 10.0 ** int(power)
    else:
        back = float(text)
    assert "e" not in text and text not in ("-0",)
    assert math.isclose(back, x, rel_tol=5e-3, abs_tol=0) or (abs(x) < 1e-300 and back == 0) or \
        (abs(x) >= 100 and abs(back - x) <= 0.5)


@pytest.mark.parametrize("expression, values, expected", [
    ("x <= 1.25", {"x": 1.2}, True), ("-1.2 <= slope <= -0.8", {"slope": -1.0}, True),
    ("-1.2 <= slope <= -0.8", {"slope": -0.5}, False),
    ("violations == 0 and err < 1e-10", {"violations": 0, "err": 0.0}, True),
    ("min(ratios) >= 10 ** 1.5", {"ratios": [40.0, 50.0]}, True), ("not ok or n > 2", {"ok": True, "n": 3}, True),
    ("all(flags)", {"flags": [True, False]}, False), ("abs(a - b) < 0.1", {"a": np.float64(1.0), "b": 1.05}, True),
    ("isnan(slope)", {"slope": float("nan")}, True), ("name in ['a', 'b']", {"name": "a"}, True),
])
def test_rule_conditions(expression, values, expected):
    assert evaluate(expression, values) is expected


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('true')", "not allowed"), ("x.real > 0", "not allowed"), ("open('f')", "not allowed"),
    ("y > 0", "needs the value 'y'"), ("x >", "not an expression"),
])
def test_rules_run_nothing_but_arithmetic(expression, message):
    with pytest.raises(ValueError, match=message):
        evaluate(expression, {"x": 1})


def test_a_rule_decides_in_order_and_states_itself():
    rule = Rule.parse(["reproduced if min(r) >= 10 ** 1.5 and max(r) <= 10 ** 2.5", "partly reproduced if min(r) >= 10",
                       "otherwise not reproduced"])
    assert rule.verdict({"r": [50, 100]}) == "reproduced"
    assert rule.verdict({"r": [12, 100]}) == "partly reproduced"
    assert rule.verdict({"r": [5, 100]}) == "not reproduced"
    assert str(rule) == ("reproduced if min(r) >= 10 ** 1.5 and max(r) <= 10 ** 2.5; partly reproduced if "
                         "min(r) >= 10; otherwise not reproduced")


@pytest.mark.parametrize("lines, message", [
    (["holds if x == 0"], "ends with 'otherwise"), (["holds x == 0", "otherwise fails"], "VERDICT if CONDITION"),
    (["great if x == 0", "otherwise fails"], "unknown verdict 'great'"),
    (["holds if x ==", "otherwise fails"], "not an expression"),
])
def test_malformed_rules_are_refused(lines, message):
    with pytest.raises(ValueError, match=message):
        Rule.parse(lines)


# math written in ASCII: comparisons, norms, arrows, a symbol's subscript (not a value's name: slope_misfit) and
# powers, the paper's symbols spelled out
ASCII_MATH = re.compile(r"<=|>=|\|\||->|\b(?:[A-Za-z]|alpha|abar|xi|eps|delta|theta|sum|max|min)_[\w{]|\w\^|\babar\b"
                        r"|\balpha\b|\bd~|\bTheta\(|\bDelta\b")


def test_every_stated_claim_has_a_valid_rule_and_template():
    stated = claims.specs()
    assert stated, "no claim files in attn_utils/book/ledger"
    for key, spec in stated.items():
        assert key.startswith(spec.chapter.split("_")[0] + "-"), f"{key} is stated in {spec.chapter}.yml"
        assert spec.claim and spec.paper and spec.ours and spec.rule.cases and spec.glance and spec.brief
        for short in (spec.glance, spec.brief):  # its math is closed, so the tables typeset it
            assert short.count("$") % 2 == 0, f"{key}: an unclosed $ in {short!r}"
        assert len(spec.glance) <= 100, f"{key}: the short name is not short: {spec.glance!r}"
        for text in (spec.claim, spec.glance, spec.paper, spec.note):  # a reader sees names, not the book's labels
            assert not re.search(r"\bch\d-prop-", text), f"{key}: an internal label in {text!r}"
        for text in (spec.claim, spec.paper, spec.ours, spec.note):  # the tables typeset math: none is ASCII
            assert text.count("$") % 2 == 0, f"{key}: an unclosed $ in {text!r}"
            prose = re.sub(r"\{[^{}]*\}", "", " ".join(text.split("$")[::2]))  # without the template's {fields}
            assert not ASCII_MATH.search(prose), f"{key}: ASCII math {ASCII_MATH.search(prose)[0]!r} in {text!r}"


def test_every_claim_names_a_section_of_its_chapter():
    """``section`` is a MyST target ``(label)=`` of the claim's notebook (the ledger and the first page link there;
    the built book's link check finds each anchor)."""
    from attn_utils.book import build

    for key, spec in claims.specs().items():
        source = (build.NOTEBOOK_DIR / f"{spec.chapter}.py").read_text()
        target = source.find(f"\n# ({spec.section})=\n")
        assert spec.section and target >= 0, f"{key}: no target ({spec.section})= in notebooks/{spec.chapter}.py"


def test_judge_fills_the_template_and_records_the_rule(tmp_path, monkeypatch):
    (tmp_path / "ch9_test.yml").write_text(
        "ch9-collapse:\n  section: ch9-model\n  claim: curves collapse\n  glance: 'collapse for $T \\ge 1$'\n"
        "  brief: 'spread {spread:.2f}, {max(spread, 2 * n)} at most{\" (one)\" if n == 1 else \"\"}'\n"
        "  paper: collapse once T >= 1\n"
        "  ours: 'largest ratio {spread} over {n} temperatures, exact {spread:.6f}'\n"
        "  rule: [reproduced if spread <= 1.25, otherwise not reproduced]\n  note: a note\n"
        "ch9-short:\n  claim: c\n  glance: g\n  brief: 'from {min(x):.2f} to {max(x)}; {y}'\n  paper: p\n"
        "  ours: '{x}'\n  rule: [otherwise holds]\n")
    original = claims.specs
    monkeypatch.setattr(claims, "specs", lambda: original(tmp_path))
    row = claims.judge("ch9-collapse", model="smollm2-135m", spread=np.float64(1.2), n=12)
    assert row.verdict == "reproduced" and row.chapter == "ch9_test" and row.note == "a note"
    assert row.ours == "largest ratio 1.2 over 12 temperatures, exact 1.200000"
    assert row.rule == "reproduced if spread <= 1.25; otherwise not reproduced"
    assert row.values == {"spread": 1.2, "n": 12}
    assert row.glance == "collapse for $T \\ge 1$" and row.brief == "spread 1.20, 24 at most"
    assert claims.judge("ch9-collapse", model="m", spread=1.0, n=1).brief == "spread 1.00, 2 at most (one)"
    assert claims.judge("ch9-short", model="m", x=[], y=1).brief == "from n/a to n/a; 1"  # nothing to take min of
    assert claims.judge("ch9-short", model="m", x=[0.5, 2], y=1).brief == "from 0.50 to 2; 1"
    with pytest.raises(ValueError, match="its brief .* needs the value 'y'"):
        claims.judge("ch9-short", model="m", x=[1])
    assert claims.judge("ch9-collapse", model="m", spread=float("nan"), n=1).brief.startswith("spread n/a, ")
    assert claims.judge("ch9-collapse", model="m", spread=2, n=1).verdict == "not reproduced"
    with pytest.raises(ValueError, match="unknown claim 'ch9-nope'"):
        claims.judge("ch9-nope", model="m")
    with pytest.raises(ValueError, match="needs the value 'n'"):
        claims.judge("ch9-collapse", model="m", spread=1)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "ch9_test.yml").write_text((tmp_path / "ch9_test.yml").read_text().replace("glance:", "title:"))
    with pytest.raises(ValueError, match="claim 'ch9-collapse' needs claim, glance, brief, paper, ours, rule"):
        original(broken)
    monkeypatch.setenv("ATTN_COMPANION_RUN_DIR", str(tmp_path / "run"))
    claims.record("ch9-collapse", model="m", spread=torch.tensor(1.0), n=3)
    ledger = claims.load()
    assert ledger.loc[0, "verdict"] == "reproduced" and ledger.loc[0, "values"] == {"spread": 1.0, "n": 3}


def test_a_brief_writes_a_range_once_when_both_ends_read_the_same():
    brief = claims.specs()["ch2-fig2c-critical-n"].brief
    assert claims._Brief().format(brief, fractions=[0.8125, 0.8149]) == "$N/L$ = 0.81"
    assert claims._Brief().format(brief, fractions=[0.5, 0.62, 0.55]) == "$N/L$ = 0.50 to 0.62"
    assert evaluate("span(x, '.0%')", {"x": [0.1, 0.25]}) == "10% to 25%"
