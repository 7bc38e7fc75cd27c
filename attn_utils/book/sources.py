"""The notebook sources and their parameters, read without the notebook stack.

Everything here imports only the standard library and :mod:`attn_utils.book.params`, so that ``attn-companion``
reads its arguments, finds the notebook and checks every value against the specification in well under a
second; torch, transformers, jupytext and papermill are imported only after that (by :mod:`.build` and the
modules that execute notebooks). :mod:`.build` re-exports these names.
"""
from __future__ import annotations

import ast
import copy
import functools
import itertools
import re
from pathlib import Path
from typing import Any
from collections.abc import Callable

import yaml

from attn_utils.book.params import (FACTS, ParameterError, Parameters, available_memory, resolve, resolve_on,
                                     validate)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
# the chapters of `attn-companion windows` (attn_utils.book.windows), named here for the command line's help
DEFAULT_K = 8
MODEL_CHAPTERS = ("ch1_vanishing", "ch2_distance", "ch3_separability", "ch4_gradient")
OPTIONAL_CHAPTERS = ("ch6_beyond",)

# a py:percent cell marker whose metadata tags the cell "parameters": # %% tags=["parameters"]
_PERCENT = re.compile(r"^# %%")
_PARAMETERS_MARKER = re.compile(r"^# %%.*\btags=\[[^\]]*[\"']parameters[\"']")


def parse_value(text: str) -> Any:
    """Read a command-line value as a Python literal (``5``, ``1e-3``, ``[32, 64]``, ``None``), else a string; a
    bracketed list of bare words reads as a list of strings (``[smollm2-135m,minilm-l6]``)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        inner = text.strip()
        if inner.startswith("[") and inner.endswith("]") and inner.count("[") == 1 and inner.count("]") == 1:
            return split_values(inner[1:-1])
        return text


def split_values(text: str) -> list[Any]:
    """Split ``v1,v2,...`` at top-level commas (commas inside brackets stay), parsing each value."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "[(" and 1 or ch in "])" and -1 or 0
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [parse_value(p.strip()) for p in parts if p.strip()]


def resolve_notebook(name: str | Path) -> Path:
    """Find a notebook source by path, file name or stem (``ch2_distance``)."""
    path = Path(name)
    candidates = [path, NOTEBOOK_DIR / path, NOTEBOOK_DIR / f"{path.stem}.py"]
    for c in candidates:
        if c.suffix == ".py" and c.is_file():
            return c.resolve()
    known = sorted(p.stem for p in NOTEBOOK_DIR.glob("*.py"))
    raise ValueError(f"notebook {str(name)!r} not found; known notebooks: {known}")


def chapter_title(chapter: str) -> str:
    """The title of notebook ``chapter`` (its first Markdown heading), or ``chapter`` if it has none."""
    path = NOTEBOOK_DIR / f"{chapter}.py"
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.startswith("# # "):
            return line[4:].strip()
    return chapter


def toc_files(root: Path = ROOT) -> list[str]:
    """Every file named in ``_toc.yml``, in reading order (without suffix)."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            files.extend(node[key] for key in ("root", "file") if key in node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return files


def book_notebooks(root: Path = ROOT) -> list[Path]:
    """The notebook sources of the book, in reading order."""
    return [root / f"{f}.py" for f in toc_files(root) if f.startswith("notebooks/")]


def notebook_parameters(src: Path) -> dict[str, Any]:
    """The parameters (name -> default) declared in the cell tagged ``parameters``."""
    stat = Path(src).stat()
    return copy.deepcopy(_parameters_cell(Path(src).resolve(), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=64)
def _parameters_cell(src: Path, mtime_ns: int, size: int) -> dict[str, Any]:
    """:func:`notebook_parameters` of one version of a file. A ``py:percent`` source is read line by line: its
    parameters cell is the lines after the marker ``# %% tags=["parameters"]`` up to the next ``# %%`` (jupytext
    reads the same cell; ``tests/test_refusals.py`` checks it); any other format is read with jupytext."""
    lines = src.read_text().splitlines()
    if any(_PERCENT.match(line) for line in lines):
        start = next((i for i, line in enumerate(lines) if _PARAMETERS_MARKER.match(line)), None)
        if start is None:
            return {}
        end = next((i for i in range(start + 1, len(lines)) if _PERCENT.match(lines[i])), len(lines))
        return _assignments("\n".join(lines[start + 1:end]))
    import jupytext

    for cell in jupytext.read(src).cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return _assignments(cell.source)
    return {}


def _assignments(source: str) -> dict[str, Any]:
    tree = ast.parse(source)
    return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def check_parameters(src: Path, parameters: dict[str, Any], *, cache: dict | None = None,
                     on: str | None = None, variant: bool = False) -> Parameters:
    """The values ``src`` will use with ``parameters`` over its defaults: checked once against the specification,
    its rules and the facts they read (:func:`attn_utils.book.params.resolve`; ``cache`` keeps the models, tokenizers
    and texts read between runs; ``on``: another model, :func:`~attn_utils.book.params.resolve_on`, and with
    ``variant`` a build's run of the notebook on it, whose synthetic parts are not shown). A parameter the notebook
    does not declare, or an invalid value, is a ``ValueError`` naming the notebook and the parameter (and, where it
    is one, the default)."""
    if on is not None:
        return _named(src, parameters, lambda values: resolve_on(on, values, cache=cache,
                                                                  notebook=src.stem if variant else None), on=on)
    return _named(src, parameters, lambda values: resolve(values, cache=cache))


def check_specs(src: Path, parameters: dict[str, Any]) -> Parameters:
    """:func:`check_parameters` without the facts: the specification and the rules between parameters only, in
    milliseconds and without torch (of the facts, only the available memory is read); the command line calls it
    before it imports anything heavy."""
    return _named(src, parameters, lambda values: validate(facts={"memory": available_memory()}, **values))


def _named(src: Path, parameters: dict[str, Any], check: Callable[[dict], Parameters],
           on: str | None = None) -> Parameters:
    declared = notebook_parameters(src)
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise ValueError(f"{src.stem} has no parameter {unknown[0]!r}; its parameters are {sorted(declared)}")
    try:
        return check({**declared, **parameters})
    except ParameterError as err:
        facts = set(err.names) & set(FACTS) - {"memory"}  # the facts of the model, the corpus, the device
        if facts:
            model = on or (err.facts["model_choice"][0] if "model_choice" in err.facts
                           else {**declared, **parameters}["model"])
            of = f" ({err.facts['context']} tokens of context)" if "context" in facts else ""
            raise ParameterError(err.names, f"{src.stem} with model {model!r}{of}: {err}") from None
        defaults = [n for n in err.names if n in declared and n not in parameters]
        said = ", ".join(f"{n} = {declared[n]!r}" for n in defaults)
        hint = f" (the default{'s' * (len(defaults) > 1)} of {src.stem}: {said})" if defaults else ""
        raise ParameterError(err.names, f"{src.stem}: {err}{hint}") from None


def combinations(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the values of ``grid`` (names in sorted order, values in the order given); a name with no
    value (``-p L ''``, ``-p L ,``) is a ``ValueError`` naming it."""
    empty = sorted(n for n, values in grid.items() if not values)
    if empty:
        raise ValueError(f"-p {empty[0]}: no value given; write the values separated by commas, e.g. -p L 256,512")
    names = sorted(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]
