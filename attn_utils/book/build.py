"""Executing the book's notebooks with papermill and building the HTML with Jupyter Book 1.x.

The ``py:percent`` files in ``notebooks/`` are the sources. :func:`execute_notebook` turns one into
an executed ``.ipynb`` (jupytext, then papermill); :func:`build_book` executes every notebook of
``_toc.yml`` into a fresh staging folder, builds the HTML there with ``-W`` and only then swaps it
into ``_build/html``, so a failed or interrupted build never replaces the last good book. Tracked
files are never modified.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jupytext
import nbformat
import papermill
import yaml
from traitlets.config import Config

from attn_utils.book.params import validate
from attn_utils.book import runlog

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
# CurveZMQ-encrypted kernel connections, as the kernel's "running over TCP without encryption" warning advises
KERNEL_CONFIG = Config({"KernelManager": {"transport_encryption": "auto"}})


class NotebookFailed(RuntimeError):
    """A notebook raised; the message names the notebook and the error."""


def parse_value(text: str) -> Any:
    """Read a command-line value as a Python literal (``5``, ``1e-3``, ``[32, 64]``, ``None``), else a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
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


def notebook_parameters(src: Path) -> dict[str, Any]:
    """The parameters (name -> default) declared in the cell tagged ``parameters``."""
    nb = jupytext.read(src)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse(cell.source)
            return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
    return {}


def check_parameters(src: Path, parameters: dict[str, Any]) -> None:
    """Refuse parameters the notebook does not declare, and invalid values, before executing anything."""
    declared = notebook_parameters(src)
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise ValueError(f"{src.stem} has no parameter {unknown[0]!r}; its parameters are {sorted(declared)}")
    validate(**parameters)


def execute_notebook(src: Path, out: Path, parameters: dict[str, Any] | None = None, *,
                     run_dir: Path | None = None, progress: bool = True, timeout: int | None = None) -> float:
    """Execute ``src`` (py:percent) with papermill into ``out`` (.ipynb); return the wall time in seconds.

    ``run_dir`` is exported as ``ATTN_COMPANION_RUN_DIR`` so notebooks can leave artefacts
    (claims, timings) for later notebooks. Raises :class:`NotebookFailed` naming the notebook. The
    kernel is killed when execution ends, also on KeyboardInterrupt.
    """
    parameters = dict(parameters or {})
    check_parameters(src, parameters)
    out.parent.mkdir(parents=True, exist_ok=True)
    nb = jupytext.read(src)
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    env = {runlog.NOTEBOOK_ENV: src.stem, **({runlog.RUN_DIR_ENV: str(run_dir)} if run_dir is not None else {})}
    with tempfile.TemporaryDirectory() as tmp, _environment(env):
        nb_in = Path(tmp) / f"{src.stem}.ipynb"
        nbformat.write(nb, nb_in)
        start = time.perf_counter()
        try:  # "immediate": an interrupted kernel is killed at once, not asked to shut down mid-cell
            papermill.execute_notebook(str(nb_in), str(out), parameters=parameters, cwd=str(src.parent),
                                       kernel_name="python3", progress_bar=progress, execution_timeout=timeout,
                                       config=KERNEL_CONFIG, shutdown_kernel="immediate")
        except papermill.PapermillExecutionError as exc:
            raise NotebookFailed(f"notebook {src.name} failed: {exc.ename}: {exc.evalue}") from None
    return time.perf_counter() - start


@contextmanager
def _environment(values: dict[str, str]):
    """Set environment variables (inherited by the kernel) for the duration of a block."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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


def _remove_stale_staging(folder: Path) -> None:
    """Remove the ``.staging-<pid>-*`` folders of builds that are no longer running (killed ones)."""
    for staging in folder.glob(".staging-*"):
        pid = staging.name.split("-")[1]
        if not (pid.isdigit() and _alive(int(pid))):
            shutil.rmtree(staging, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists and belongs to another user
        pass
    return True


def book_notebooks(root: Path = ROOT) -> list[Path]:
    """The notebook sources of the book, in reading order."""
    return [root / f"{f}.py" for f in toc_files(root) if f.startswith("notebooks/")]


@dataclass
class BookResult:
    html: Path              # the built book
    records: Path           # the build's claims, provenance and timing records (attn_utils.book.runlog)
    timings: dict[str, float]


def build_book(parameters: dict[str, Any] | None = None, *, root: Path = ROOT, out: Path | None = None,
               progress: bool = True) -> BookResult:
    """Execute every notebook of the book and build the HTML into ``out`` (default ``_build/html``).

    A parameter is passed to every notebook that declares it; one that no notebook declares is an
    error. On any failure the previous ``out`` is left untouched.
    """
    parameters = dict(parameters or {})
    out = (out or root / "_build" / "html").resolve()
    notebooks = book_notebooks(root)
    declared = {nb: notebook_parameters(nb) for nb in notebooks}
    unknown = sorted(set(parameters) - set().union(*declared.values()))
    if unknown:
        raise ValueError(f"no notebook has a parameter {unknown[0]!r}; "
                         f"known parameters: {sorted(set().union(*declared.values()))}")
    validate(**parameters)

    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(out.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{os.getpid()}-", dir=out.parent))
    try:
        for name in ("_config.yml", "_toc.yml", "book"):
            src = root / name
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, staging / name)
        run_dir = staging / "_run"
        run_dir.mkdir()
        timings: dict[str, float] = {}
        for i, nb in enumerate(notebooks, 1):
            own = {k: v for k, v in parameters.items() if k in declared[nb]}
            print(f"[{i}/{len(notebooks)}] executing {nb.name} {own or ''}", flush=True)
            timings[nb.stem] = execute_notebook(nb, staging / "notebooks" / f"{nb.stem}.ipynb", own,
                                                run_dir=run_dir, progress=progress)
            runlog.write("notebooks", f"{i:02d}-{nb.stem}", {"notebook": nb.stem, "seconds": timings[nb.stem],
                                                              "parameters": own}, folder=run_dir)
            print(f"[{i}/{len(notebooks)}] {nb.name} done in {timings[nb.stem]:.1f} s", flush=True)
        print("building the HTML with Jupyter Book", flush=True)
        build = subprocess.run([sys.executable, "-c", "from jupyter_book.cli.main import main; main()", "build", str(staging), "-W", "--keep-going",
                                "--path-output", str(staging)], capture_output=True, text=True)
        if build.returncode != 0:
            tail = (build.stdout + build.stderr)[-4000:]
            raise RuntimeError(f"jupyter-book build failed (the previous book is kept):\n{tail}")
        records = out.with_name(out.name + "-records")
        for new, final in ((staging / "_build" / "html", out), (run_dir, records)):
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            if final.exists():
                final.rename(old)
            new.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        return BookResult(out, records, timings)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
