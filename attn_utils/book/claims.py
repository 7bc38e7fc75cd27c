"""The claims ledger: every claim the book tests, the rule that decides it, and what a build measured.

A claim is data. ``attn_utils/book/ledger/<chapter>.yml`` states, per key: the claim, its short name for the
tables (``glance``, with ``$...$`` math), a short template of the number that decides it (``brief``, whose fields
are expressions of the measured values, e.g. ``{min(slopes):.2f}``), what the paper says, a template of what we
measured (``ours``, whose ``{name}`` fields are filled with :func:`formatting.fmt`), the rule that turns the
measured values into a verdict, and the label of the section of the chapter that measures it (``section``, a MyST
target ``(label)=`` of the notebook, where the ledger links), e.g.::

    ch4-fig4-collapse:
      section: ch4-figure4
      claim: For T >= 1 the curves of the three eps collapse
      glance: "Fig. 4: the curves collapse for $T \\ge 1$"
      brief: "spread {spread:.2f}"
      paper: all curves collapse once T >= 1
      ours: "largest ratio max_eps g / min_eps g over T >= 1: {spread}"
      rule: [reproduced if spread <= 1.25, otherwise not reproduced]

A chapter measures and calls ``record("ch4-fig4-collapse", model=name, spread=spread)``: the rule computes the
verdict and states itself in the ledger, so a verdict can never drift from its stated rule. The reproducibility
chapter collects a build's records with :func:`load` (they live in the build's run folder, see
:mod:`attn_utils.book.runlog`).
"""
from __future__ import annotations

import ast
import functools
import math
import operator
import string
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from attn_utils.book import runlog
from attn_utils.book.formatting import fmt, scalar

SYNTHETIC = "synthetic"  # the model of a row measured on synthetic data
VERDICTS = ("reproduced", "partly reproduced", "not reproduced", "not comparable", "holds", "fails")
LEDGER_DIR = Path(__file__).resolve().parent / "ledger"

_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.Pow: operator.pow}


def _span(values: Sequence[float], spec: str) -> str:
    """``"a to b"``: the least and the largest of ``values`` written with the format ``spec``; one number where both
    read the same (``"0.81"``, not ``"0.81 to 0.81"``)."""
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low} to {high}"


_FUNCTIONS = {"abs": abs, "min": min, "max": max, "all": all, "any": any, "len": len, "isnan": math.isnan,
              "isfinite": math.isfinite, "span": _span}


def evaluate(expression: str, values: Mapping[str, Any]) -> Any:
    """Value of a rule's condition (or of a field of a brief): comparisons (chained too), ``and``/``or``/``not``,
    ``x if c else y``, arithmetic, numbers, strings, lists, the named values and ``abs min max all any len isnan
    isfinite`` and ``span(values, format)`` (a brief's range, :func:`_span`); nothing else can run."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in values:
                raise ValueError(f"rule {expression!r} needs the value {node.id!r}; given: {sorted(values)}")
            return scalar(values[node.id])
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BoolOp):
            results = (ev(v) for v in node.values)
            return all(results) if isinstance(node.op, ast.And) else any(results)
        if isinstance(node, ast.IfExp):
            return ev(node.body) if ev(node.test) else ev(node.orelse)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            return (not ev(node.operand)) if isinstance(node.op, ast.Not) else -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, comparator in zip(node.ops, node.comparators):
                right = ev(comparator)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS \
                and not node.keywords:
            return _FUNCTIONS[node.func.id](*(ev(a) for a in node.args))
        raise ValueError(f"rule {expression!r}: {ast.dump(node)[:60]} is not allowed in a rule")

    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as err:
        raise ValueError(f"rule {expression!r} is not an expression: {err.msg}") from None
    return ev(tree)


@dataclass(frozen=True)
class Rule:
    """Ordered cases ``VERDICT if CONDITION``; the first whose condition holds decides, else ``otherwise``."""

    cases: tuple[tuple[str, str], ...]
    otherwise: str

    @classmethod
    def parse(cls, lines: Sequence[str]) -> Rule:
        """From ``["reproduced if x <= 1", "partly reproduced if x <= 2", "otherwise not reproduced"]``."""
        if isinstance(lines, str):
            lines = [lines]
        *case_lines, last = [" ".join(str(line).split()) for line in lines]
        if not last.startswith("otherwise "):
            raise ValueError(f"a rule ends with 'otherwise VERDICT', got {last!r}")
        cases = []
        for line in case_lines:
            verdict, sep, condition = line.partition(" if ")
            if not sep:
                raise ValueError(f"a rule case reads 'VERDICT if CONDITION', got {line!r}")
            cases.append((verdict, condition))
        rule = cls(tuple(cases), last.removeprefix("otherwise "))
        for verdict in [*(v for v, _ in rule.cases), rule.otherwise]:
            if verdict not in VERDICTS:
                raise ValueError(f"unknown verdict {verdict!r} in a rule; verdicts: {list(VERDICTS)}")
        for _, condition in rule.cases:
            try:
                ast.parse(condition, mode="eval")
            except SyntaxError as err:
                raise ValueError(f"rule condition {condition!r} is not an expression: {err.msg}") from None
        return rule

    def verdict(self, values: Mapping[str, Any]) -> str:
        """The verdict of the first case whose condition holds on ``values``, else ``otherwise``."""
        for verdict, condition in self.cases:
            if evaluate(condition, values):
                return verdict
        return self.otherwise

    def __str__(self) -> str:
        return "; ".join([*(f"{v} if {c}" for v, c in self.cases), f"otherwise {self.otherwise}"])


@dataclass(frozen=True)
class ClaimSpec:
    """What the ledger file states of one claim (see the module docstring)."""

    key: str
    chapter: str
    claim: str
    paper: str
    ours: str
    rule: Rule
    note: str = ""
    headline: bool = False    # one of the paper's headline claims, shown on the book's first page
    glance: str = ""          # its short name ("" in a spec made in code: the claim)
    brief: str = ""           # the short template of its deciding number ("": ours)
    section: str = ""         # the label of the section of its chapter that measures it ("": the chapter)


REQUIRED = ("claim", "glance", "brief", "paper", "ours", "rule")


@functools.cache
def specs(folder: Path = LEDGER_DIR) -> dict[str, ClaimSpec]:
    """Every claim stated in ``folder/*.yml`` (one file per chapter, named after it), by key."""
    found: dict[str, ClaimSpec] = {}
    for path in sorted(folder.glob("*.yml")):
        for key, entry in (yaml.safe_load(path.read_text()) or {}).items():
            if key in found:
                raise ValueError(f"claim {key!r} is stated twice ({path.name} and {found[key].chapter}.yml)")
            unknown = set(entry) - {*REQUIRED, "note", "headline", "section"}
            if unknown or not set(REQUIRED) <= set(entry):
                raise ValueError(f"{path.name}: claim {key!r} needs {', '.join(REQUIRED)} (and may have note, "
                                 f"headline, section); got {sorted(entry)}")
            found[key] = ClaimSpec(key=key, chapter=path.stem, claim=entry["claim"], paper=entry["paper"],
                                   ours=entry["ours"], rule=Rule.parse(entry["rule"]), note=entry.get("note", ""),
                                   headline=bool(entry.get("headline", False)), glance=entry["glance"],
                                   brief=entry["brief"], section=entry.get("section", ""))
    return found


class _Template(string.Formatter):
    def format_field(self, value, format_spec):
        return format(scalar(value), format_spec) if format_spec else fmt(value)


class _Brief(_Template):
    """A ``brief`` template: each field is an expression of :func:`evaluate` over the values (``{min(slopes)}``).
    A value it names must exist; an expression that has no value on these values (``min`` of an empty list, a
    division by zero) is written ``n/a``: the brief only repeats what ``ours`` and the rule say."""

    def get_field(self, field_name, args, kwargs):
        names = {n.id for n in ast.walk(ast.parse(field_name, mode="eval")) if isinstance(n, ast.Name)}
        missing = sorted(names - set(kwargs) - set(_FUNCTIONS))
        if missing:
            raise ValueError(f"it needs the value {missing[0]!r}; given: {sorted(kwargs)}")
        try:
            return evaluate(field_name, kwargs), field_name
        except (ValueError, TypeError, ZeroDivisionError):
            return float("nan"), field_name

    def format_field(self, value, format_spec):
        value = scalar(value)
        if (isinstance(value, float) and math.isnan(value)) or (isinstance(value, (list, tuple)) and not value):
            return "n/a"
        try:
            return super().format_field(value, format_spec)
        except (TypeError, ValueError):  # a spec that does not fit the value (".2f" of a list)
            return fmt(value)


@dataclass(frozen=True)
class Claim:
    """One row of the ledger: the claim, what the paper says, what this run measured, and the verdict of its rule
    (``holds``/``fails`` for statements checked on synthetic data, the others for claims about a pretrained
    model). ``model`` names the model that produced it, ``synthetic`` for synthetic data."""

    key: str
    chapter: str
    claim: str
    paper: str
    ours: str
    verdict: str
    model: str
    rule: str
    note: str = ""
    values: dict = field(default_factory=dict)
    glance: str = ""  # the claim's short name, with $...$ math (ClaimSpec.glance)
    brief: str = ""   # the deciding number in a few words (ClaimSpec.brief filled in)


def judge(key: str, *, model: str, **values: Any) -> Claim:
    """The ledger row of claim ``key`` for the measured ``values`` (its rule gives the verdict)."""
    known = specs()
    if key not in known:
        raise ValueError(f"unknown claim {key!r}; claims are stated in {LEDGER_DIR}/<chapter>.yml")
    spec = known[key]
    try:
        ours = _Template().format(spec.ours, **values)
    except KeyError as err:
        raise ValueError(f"claim {key!r}: its 'ours' text needs the value {err.args[0]!r}") from None
    plain = {name: _plain(v) for name, v in values.items()}
    try:
        brief = _Brief().format(spec.brief, **plain) if spec.brief else ours
    except (ValueError, TypeError) as err:
        raise ValueError(f"claim {key!r}: its brief {spec.brief!r} cannot be filled in: {err}") from None
    return Claim(key=key, chapter=spec.chapter, claim=spec.claim, paper=spec.paper, ours=ours,
                 verdict=spec.rule.verdict(plain), model=model, rule=str(spec.rule), note=spec.note, values=plain,
                 glance=spec.glance or spec.claim, brief=brief)


def _plain(value: Any) -> Any:
    """A JSON-ready copy of a measured value (numpy and torch scalars and arrays become numbers and lists)."""
    value = scalar(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def record(key: str, *, model: str, **values: Any) -> Claim:
    """Judge claim ``key`` on ``values`` and write its row to the run folder, one per claim and model (re-running
    replaces it). A synthetic claim of a build's run on another model is not written: its page's run records it, at
    the sizes the page shows."""
    claim = judge(key, model=model, **values)
    if model == SYNTHETIC and runlog.variant():
        return claim
    runlog.write("claims", f"{claim.key}--{model}".replace("/", "_"), {**asdict(claim), "notebook": runlog.notebook()})
    return claim


def load(folder: Path | None = None) -> pd.DataFrame:
    """Every recorded claim, one row per claim and model, ordered by chapter then key (a record without a short name
    or brief, written by hand or by an older version, shows its claim and ours there)."""
    columns = [*Claim.__dataclass_fields__, "notebook"]
    rows = pd.DataFrame(runlog.read("claims", folder), columns=columns)
    rows["glance"] = rows.glance.where(rows.glance.astype(object).fillna("") != "", rows.claim)
    rows["brief"] = rows.brief.where(rows.brief.astype(object).fillna("") != "", rows.ours)
    return rows.sort_values(["chapter", "key"], ignore_index=True)


def depend_on_model(verdicts: Mapping[str, Mapping[str, str]], models: Sequence[str]) -> list[str]:
    """The claims of ``verdicts`` (key -> model -> verdict) whose verdict is not the same on every model of
    ``models``; a model on which a claim was not recorded counts as another verdict. One model: none."""
    return [key for key, per in verdicts.items() if len({per.get(m) for m in models}) > 1]
