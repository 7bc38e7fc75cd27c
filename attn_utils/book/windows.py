"""Verdicts with error bars: the model chapters measured on K windows spread across the novel.

Window ``k`` (``k = 0 .. K-1``) of a corpus of ``n`` chapters starts at the first token of chapter

    c_k = 1 + floor(k * n / K),

that is, the novel cut into K equal runs of chapters (War and Peace: n = 365, K = 8 gives chapters 1, 46, 92,
137, 183, 229, 274, 320, from BOOK ONE to BOOK FIFTEEN). The run of window k has ``chapters = [c_k, n]`` and
``offset = 0``. As ``n / K >= 1``, the K starts are distinct for every K <= n.

:func:`run_windows` executes each model chapter (:data:`MODEL_CHAPTERS`; ``ch6_beyond`` on request) as a Dask
sweep over the K values of ``chapters`` (:func:`attn_utils.book.sweep.sweep`: the same skipping of finished
runs and the same failure handling). The synthetic parts of the chapters do not depend on the window, so by
default they run at the smaller sizes of :data:`SHORT_SYNTHETIC` (recorded in the result; ``-p`` overrides).
:func:`aggregate` then gives, per ledger claim, its verdict in each window, whether it is the same in all K
(``stable``), and for each numeric recorded value the median, min and max across windows; ``windows.json`` and
``windows.csv`` hold it. The claim's headline number is the first value its ledger rule names (the number the
verdict is decided on).
"""
from __future__ import annotations

import ast
import json
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from attn_utils.book import build, claims, runlog, sweep
from attn_utils.book.formatting import is_number
from attn_utils.book.params import SHORT_SYNTHETIC
from attn_utils.book.sources import DEFAULT_K, MODEL_CHAPTERS, OPTIONAL_CHAPTERS  # noqa: F401 (windows' own)
SET_HERE = ("chapters", "offset")  # each window's own values, never given with -p
RESULT = "windows.json"


def choose_windows(k: int, n_chapters: int) -> list[int]:
    """The first chapter c_j = 1 + floor(j * n / k) of each window j = 0 .. k-1 (distinct, increasing, in [1, n])."""
    if isinstance(n_chapters, bool) or not isinstance(n_chapters, int) or n_chapters < 1:
        raise ValueError(f"the corpus has no chapters to spread windows over (got {n_chapters!r}); use a text "
                         "with 'CHAPTER <number>' headings")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_chapters:
        raise ValueError(f"--windows must be an integer between 1 and {n_chapters} (the chapters of the corpus: one "
                         f"window starts at each of K distinct chapters), got {k!r}")
    return [1 + j * n_chapters // k for j in range(k)]


def window_runs(notebooks: list[str], parameters: dict[str, Any], starts: list[int], n_chapters: int
                ) -> dict[str, dict[str, Any]]:
    """Per notebook, the parameters common to its K runs: :data:`SHORT_SYNTHETIC` then those of ``parameters`` it
    declares. ``parameters`` that no notebook declares, or that set ``chapters`` or ``offset``, are an error."""
    unknown = [n for n in notebooks if n not in MODEL_CHAPTERS + OPTIONAL_CHAPTERS]
    if unknown:
        raise ValueError(f"--notebooks: {unknown[0]!r} is not a model chapter; choose among "
                         f"{list(MODEL_CHAPTERS + OPTIONAL_CHAPTERS)}")
    fixed = sorted(set(parameters) & set(SET_HERE))
    if fixed:
        raise ValueError(f"-p {fixed[0]}: windows sets chapters = [c_k, {n_chapters}] and offset = 0 for each window "
                         f"itself (starts {starts})")
    declared = {nb: build.notebook_parameters(build.resolve_notebook(nb)) for nb in notebooks}
    stray = sorted(set(parameters) - set().union(*declared.values()))
    if stray:
        raise ValueError(f"-p {stray[0]}: none of {notebooks} has this parameter; their parameters are "
                         f"{sorted(set().union(*declared.values()))}")
    return {nb: {**{k: v for k, v in SHORT_SYNTHETIC.get(nb, {}).items() if k in declared[nb]},
                 **{k: v for k, v in parameters.items() if k in declared[nb]}} for nb in notebooks}


def plan(k: int, notebooks: list[str], parameters: dict[str, Any]):
    """What :func:`run_windows` will run, checked (nothing is executed; the preflight is not run here): the corpus,
    the windows' first chapters, each notebook's common parameters (:func:`window_runs`) and its sweep grid (those,
    ``chapters = [c_k, n]`` for each window and ``offset = 0``; with ``models`` (a list, or ``'auto'``:
    :func:`~attn_utils.book.params.book_models`), ``model`` takes each of them: claims x models x windows)."""
    from attn_utils.book.params import book_models
    from attn_utils.models.corpus import load_text

    parameters = dict(parameters)
    models = book_models(parameters.pop("models")) if "models" in parameters else None
    corpus = parameters.get("corpus", "war-and-peace")
    text = load_text(None if corpus == "war-and-peace" else corpus)
    starts = choose_windows(k, text.n_chapters)
    common = window_runs(notebooks, parameters, starts, text.n_chapters)
    grids = {nb: {**{name: [v] for name, v in common[nb].items()}, **({"model": list(models)} if models else {}),
                  "chapters": [[c, text.n_chapters] for c in starts], "offset": [0]} for nb in notebooks}
    return text, starts, common, grids


def headline(key: str, values: dict[str, Any]) -> str | None:
    """The first value that the ledger rule of claim ``key`` names and that was recorded as a number; None if none."""
    spec = claims.specs().get(key)
    if spec is None:
        return None
    names: list[str] = []
    for _, condition in spec.rule.cases:
        nodes = [n for n in ast.walk(ast.parse(condition, mode="eval")) if isinstance(n, ast.Name)]
        names += [n.id for n in sorted(nodes, key=lambda n: n.col_offset)]
    return next((n for n in names if is_number(values.get(n))), None)


def aggregate(records: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per claim key and model (in chapter, key order), from ``records[w]`` = the claim records of window ``w``:
    ``verdicts`` (one per window, None where the window recorded none), ``stable`` (recorded in every window, with
    one verdict), ``seen`` (the distinct verdicts, first-seen order), ``headline`` (:func:`headline`), and
    ``values``: for each value recorded as a number in every window that has the claim, its ``median``, ``min``,
    ``max`` and ``per_window`` (None where missing)."""
    by_key: dict[tuple[str, str], list[dict[str, Any] | None]] = {}
    for w, window in enumerate(records):
        for record in window:
            by_key.setdefault((record["key"], record["model"]), [None] * len(records))[w] = record
    out = []
    for (key, _), per_window in by_key.items():
        present = [r for r in per_window if r is not None]
        verdicts = [r["verdict"] if r else None for r in per_window]
        seen = list(dict.fromkeys(v for v in verdicts if v is not None))
        numeric = [n for n in present[0]["values"] if all(is_number(r["values"].get(n)) for r in present)]
        values = {}
        for name in numeric:
            xs = [float(r["values"][name]) for r in present]
            values[name] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
                            "per_window": [float(r["values"][name]) if r else None for r in per_window]}
        out.append({"key": key, "chapter": present[0]["chapter"], "model": present[0]["model"],
                    "verdicts": verdicts, "stable": None not in verdicts and len(seen) == 1, "seen": seen,
                    "headline": headline(key, present[0]["values"]), "values": values})
    return sorted(out, key=lambda c: (c["chapter"], c["key"], c["model"]))


def table(result: dict[str, Any]) -> pd.DataFrame:
    """``windows.csv``: one row per claim: key, chapter, measured_on, stable, the verdict of each window
    (``verdict_ch<c>``), headline and ``<value>_median`` / ``_min`` / ``_max`` for each numeric value."""
    rows = []
    for c in result["claims"]:
        row = {"claim": c["key"], "chapter": c["chapter"], "measured_on": c["model"], "stable": c["stable"],
               **{f"verdict_ch{w['chapter']}": v for w, v in zip(result["windows"], c["verdicts"])},
               "headline": c["headline"]}
        for name, s in c["values"].items():
            row.update({f"{name}_median": s["median"], f"{name}_min": s["min"], f"{name}_max": s["max"]})
        rows.append(row)
    return pd.DataFrame(rows)


def run_windows(k: int = DEFAULT_K, out: Path = Path("runs/windows"), *, notebooks: list[str] | None = None,
                parameters: dict[str, Any] | None = None, cluster: sweep.Cluster = sweep.Cluster(),
                force: bool = False, progress: bool = True, reuse: bool = True) -> Path:
    """Execute ``notebooks`` (default :data:`MODEL_CHAPTERS`) on the ``k`` windows of :func:`choose_windows`, one
    :func:`~attn_utils.book.sweep.sweep` per notebook into ``out/<notebook>/``; write ``out/windows.json`` and
    ``out/windows.csv`` and return the JSON's path. Every run passes the preflight before any executes. A failed
    run leaves its window out of its claims (``stable`` is then false) and raises
    :class:`~attn_utils.book.build.NotebookFailed` after the result is written. A run whose execution the cache
    holds is restored from it unless ``reuse`` is False (the first window is the default book's)."""
    notebooks = list(notebooks or MODEL_CHAPTERS)
    text, starts, common, grids = plan(k, notebooks, dict(parameters or {}))
    sources = {nb: build.resolve_notebook(nb) for nb in notebooks}
    combos = {nb: sweep.combinations(grids[nb]) for nb in notebooks}
    several = "models" in (parameters or {})  # each model reads as much of the window as its context holds
    facts: dict = {}
    checked = iter(build.check_parameters(sources[nb], combo, cache=facts, on=combo["model"] if several else None)
                   for nb in notebooks for combo in combos[nb])
    todo = {nb: [(combo, next(checked)) for combo in combos[nb]] for nb in notebooks}
    failures = []
    for i, nb in enumerate(notebooks, 1):
        print(f"[{i}/{len(notebooks)}] {nb} on {k} window{'s' * (k > 1)}", flush=True)
        try:
            sweep.sweep_checked(sources[nb], sorted(grids[nb]), todo[nb], out, cluster=cluster, force=force,
                                progress=progress, reuse=reuse)
        except build.NotebookFailed as exc:
            failures.append(f"{nb}: {exc}")
    records, runs = [[] for _ in starts], {}
    window_of = {tuple(c): w for w, c in enumerate([c, text.n_chapters] for c in starts)}
    for nb in notebooks:
        runs[nb] = []
        for combo in combos[nb]:
            w = window_of[tuple(combo["chapters"])]
            folder = sweep.run_folder(sources[nb], combo, out)
            status = json.loads((folder / "status.json").read_text()) if (folder / "status.json").is_file() else {}
            runs[nb].append({"chapter": starts[w], "model": combo.get("model"),
                             "run": folder.relative_to(out).as_posix(),
                             "status": status.get("status", "not run"), "seconds": status.get("seconds")})
            if status.get("status") == "ok":
                records[w] += runlog.read("claims", folder)
    result = {"K": k, "n_chapters": text.n_chapters, "corpus": text.name,
              "choice": f"window k starts at chapter c_k = 1 + floor(k * {text.n_chapters} / {k}), k = 0..{k - 1}; "
                        f"chapters = [c_k, {text.n_chapters}], offset = 0",
              "windows": [{"chapter": c, "title": text.chapter_titles[c - 1], "chapters": [c, text.n_chapters],
                           "offset": 0} for c in starts],
              "parameters": common, "reduced_synthetic": {nb: SHORT_SYNTHETIC.get(nb, {}) for nb in notebooks},
              "runs": runs, "claims": aggregate(records)}
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULT
    path.write_text(json.dumps(result, indent=1, default=str))
    table(result).to_csv(out / "windows.csv", index=False)
    if failures:
        raise build.NotebookFailed(f"{len(failures)} notebook(s) had failed windows (left out of {path}): "
                                   + "; ".join(failures))
    return path


def load(path: str | Path) -> dict[str, Any]:
    """The result of :func:`run_windows` in ``path`` (``windows.json``), checked; ValueError naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--windows {path}: no such file; `attn-companion windows` writes runs/windows/{RESULT}")
    try:
        result = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"--windows {path}: not a JSON file ({err})") from None
    need = {"K", "windows", "claims"}
    if not isinstance(result, dict) or not need <= set(result):
        raise ValueError(f"--windows {path}: not a result of `attn-companion windows` (it needs {sorted(need)})")
    k, found = result["K"], result["claims"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or not isinstance(found, list) \
            or not isinstance(result["windows"], list):
        raise ValueError(f"--windows {path}: not a result of `attn-companion windows` (K must be an integer >= 1, "
                         f"windows and claims lists; got K = {k!r}, {type(result['windows']).__name__} windows and "
                         f"{type(found).__name__} claims)")
    for c in found:
        if not isinstance(c, dict) or not {"key", "verdicts", "stable", "seen", "headline", "values"} <= set(c) \
                or not isinstance(c["verdicts"], list) or len(c["verdicts"]) != k:
            c = c if isinstance(c, dict) else {}
            raise ValueError(f"--windows {path}: claim {c.get('key')!r} lacks its verdicts in {result['K']} windows, "
                             "stable, seen, headline or values")
    return result
