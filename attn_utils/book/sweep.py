"""Re-running notebooks with other parameters: one run, or a parallel sweep with an index of figures."""
from __future__ import annotations

import base64
import hashlib
import html
import itertools
import json
import re
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import nbformat

from attn_utils.book.build import NotebookFailed, execute_notebook, preflight


def run_slug(parameters: dict[str, Any]) -> str:
    """A readable, unique folder name for a parameter combination (``L=512_N=5-1a2b3c``)."""
    text = "_".join(f"{k}={v}" for k, v in sorted(parameters.items())) or "defaults"
    safe = re.sub(r"[^A-Za-z0-9=._-]+", "", text.replace(" ", ""))[:80]
    digest = hashlib.sha256(json.dumps(parameters, sort_keys=True, default=str).encode()).hexdigest()[:6]
    return f"{safe}-{digest}"


def extract_figures(notebook: Path, folder: Path) -> list[Path]:
    """Write every PNG output of an executed notebook to ``folder``; return the files in order."""
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(notebook, as_version=4)
    files = []
    for c, cell in enumerate(nb.cells):
        for o, output in enumerate(cell.get("outputs", [])):
            png = output.get("data", {}).get("image/png")
            if png:
                path = folder / f"cell{c:02d}_out{o}.png"
                path.write_bytes(base64.b64decode(png))
                files.append(path)
    return files


def run_one(src: Path, parameters: dict[str, Any], out_root: Path, *, progress: bool = True) -> Path:
    """Execute ``src`` with ``parameters`` into ``out_root/<notebook>/<slug>/``; return the executed notebook.

    Parameters that fail :func:`~attn_utils.book.build.preflight` are refused before anything is written.
    The folder's ``status.json`` says ``running``, then ``ok`` (with the seconds) or ``failed`` (with the
    error); a failed run keeps its executed notebook, traceback included. A re-run replaces the folder.
    """
    preflight([(src, parameters)])
    return _run(src, parameters, out_root, progress=progress)


def _run(src: Path, parameters: dict[str, Any], out_root: Path, *, progress: bool) -> Path:
    """:func:`run_one` without the preflight (done once for a whole sweep)."""
    folder = run_folder(src, parameters, out_root)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "params.json").write_text(json.dumps(parameters, indent=1, default=str))
    _write_status(folder, status="running")
    out = folder / f"{src.stem}.ipynb"
    try:
        seconds = execute_notebook(src, out, parameters, run_dir=folder, progress=progress)
        extract_figures(out, folder / "figures")
    except BaseException as exc:
        _write_status(folder, status="failed", error=str(exc) or type(exc).__name__)
        raise
    _write_status(folder, status="ok", seconds=seconds)
    return out


def run_folder(src: Path, parameters: dict[str, Any], out_root: Path) -> Path:
    """The folder of one run: ``out_root/<notebook>/<slug>/``."""
    return Path(out_root) / src.stem / run_slug(parameters)


def _write_status(folder: Path, **status: Any) -> None:
    (folder / "status.json").write_text(json.dumps(status, indent=1))


def _run_safely(args) -> dict[str, Any]:
    src, params, out_root = args
    out = run_folder(src, params, out_root) / f"{src.stem}.ipynb"
    try:
        _run(src, params, out_root, progress=False)
        return {"parameters": params, "status": "ok", "notebook": str(out), "error": None}
    except (NotebookFailed, ValueError) as exc:
        return {"parameters": params, "status": "failed", "notebook": str(out) if out.exists() else None,
                "error": str(exc)}


def sweep(src: Path, grid: dict[str, list[Any]], out_root: Path, *, jobs: int = 1) -> Path:
    """Execute ``src`` for every combination of ``grid`` values, ``jobs`` at a time; write an HTML index.

    Every combination passes :func:`~attn_utils.book.build.preflight` before anything runs. A failing
    combination is listed in the index with its error and does not stop the others; the function raises
    at the end if any failed.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs}")
    names = sorted(grid)
    combos = [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]
    preflight([(src, params) for params in combos])
    out_root = Path(out_root)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(_run_safely, [(src, p, out_root) for p in combos]))
    index = write_index(src.stem, results, out_root / src.stem)
    failed = [r for r in results if r["error"]]
    if failed:
        raise NotebookFailed(f"{len(failed)} of {len(results)} runs failed; see {index}")
    return index


def write_index(name: str, results: list[dict[str, Any]], folder: Path) -> Path:
    """An HTML page (and ``index.json``) with one section per run: its parameters, its status and its figures."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = [f"<!doctype html><meta charset='utf-8'><title>Sweep of {html.escape(name)}</title>",
             f"<h1>Sweep of {html.escape(name)}</h1>"]
    for r in results:
        label = ", ".join(f"{k} = {v!r}" for k, v in r["parameters"].items())
        parts.append(f"<h2>{html.escape(label)}</h2>")
        error = f": {html.escape(r['error'])}" if r["error"] else ""
        parts.append(f"<p>status: <b>{r['status']}</b>{error}</p>")
        if r["notebook"]:
            nb = Path(r["notebook"])
            parts.append(f"<p><a href='{nb.relative_to(folder)}'>executed notebook</a></p>")
            for fig in sorted((nb.parent / "figures").glob("*.png")):
                parts.append(f"<img src='{fig.relative_to(folder)}' style='max-width:45%'>")
    index = folder / "index.html"
    index.write_text("\n".join(parts))
    (folder / "index.json").write_text(json.dumps(results, indent=1, default=str))
    return index
