"""Executing the book's notebooks with papermill and building the HTML with Jupyter Book 1.x.

The ``py:percent`` files in ``notebooks/`` are the sources. :func:`execute_notebook` turns one into
an executed ``.ipynb`` (jupytext, then papermill); :func:`build_book` executes every notebook of
``_toc.yml`` into a fresh staging folder, builds the HTML there with ``-W`` and only then swaps it
into ``_build/html``, so a failed or interrupted build never replaces the last good book. Tracked
files are never modified.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterable

import jupytext
import nbformat
import papermill
import yaml
from traitlets.config import Config

from attn_utils.book import runlog
from attn_utils.book.cache import Cache, merge, now, restore, snapshot, written
from attn_utils.book.cache import key as cache_key
from attn_utils.book import compare
from attn_utils.book.params import PARAMETERS_ENV, Parameters, book_models, thawed
from attn_utils.book.sources import (  # noqa: F401 (build's names since before they moved)
    NOTEBOOK_DIR, ROOT, book_notebooks, check_parameters, notebook_parameters, parse_value, resolve_notebook,
    split_values, toc_files)

# CurveZMQ-encrypted kernel connections, as the kernel's "running over TCP without encryption" warning advises
KERNEL_CONFIG = Config({"KernelManager": {"transport_encryption": "auto"}})


class NotebookFailed(RuntimeError):
    """A notebook raised; the message names the notebook and the error."""


def preflight(runs: Iterable[tuple[Path, dict[str, Any]]], *, cache: dict | None = None) -> list[Parameters]:
    """Check every ``(notebook, parameters)`` run before any notebook executes, in seconds; return the
    :class:`~attn_utils.book.params.Parameters` each will use (:func:`check_parameters`), which
    :func:`execute_notebook` hands to the notebook.

    For a notebook that declares a model, the model is resolved (``auto`` says which it takes, once) and its
    context is read from its configuration, without its weights; with a corpus, the text is read and tokenized as
    far as the window needs. The rules on these facts (``L`` and ``long_lengths`` within the context, ``offset + L``
    within the corpus) then apply. Models, tokenizers and texts are read once for all the runs (``cache``).
    """
    cache = {} if cache is None else cache
    return [check_parameters(src, parameters, cache=cache) for src, parameters in runs]


def overrides(src: Path, p: Parameters) -> dict[str, Any]:
    """The values of ``p`` that differ from the notebook's defaults, as papermill injects them (tuples as lists)."""
    declared = notebook_parameters(src)
    return {k: thawed(v) for k, v in p.given.items() if thawed(v) != declared.get(k)}


def execute_notebook(src: Path, out: Path, p: Parameters, *, run_dir: Path | None = None, progress: bool = True,
                     timeout: int | None = None) -> float:
    """Execute ``src`` (py:percent) with papermill into ``out`` (.ipynb), with the checked parameters ``p`` (from
    :func:`preflight`); return the wall time in seconds.

    The values that differ from the notebook's defaults are injected after its parameters cell, and ``p`` itself
    reaches the notebook's :func:`~attn_utils.book.params.checked` through ``$ATTN_COMPANION_PARAMETERS``, so the
    notebook does not check them again. ``run_dir`` is exported as ``ATTN_COMPANION_RUN_DIR`` so notebooks can
    leave artefacts (claims, timings) for later notebooks. Raises :class:`NotebookFailed` naming the notebook. The
    kernel is killed when execution ends, also on KeyboardInterrupt.
    """
    if not isinstance(p, Parameters):
        raise TypeError(f"execute_notebook takes the Parameters of preflight(), got {type(p).__name__}")
    out.parent.mkdir(parents=True, exist_ok=True)
    nb = jupytext.read(src)
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    with tempfile.TemporaryDirectory() as tmp:
        checked = Path(tmp) / "parameters.json"
        checked.write_text(p.to_json())
        env = {runlog.NOTEBOOK_ENV: src.stem, PARAMETERS_ENV: str(checked),
               runlog.MODEL_ENV: p.model_name if "model" in p else "",
               runlog.VARIANT_ENV: "1" if p.facts.get("variant") else "",
               **({runlog.RUN_DIR_ENV: str(Path(run_dir).resolve())} if run_dir is not None else {})}
        nb_in = Path(tmp) / f"{src.stem}.ipynb"
        nbformat.write(nb, nb_in)
        start = time.perf_counter()
        try:  # "immediate": an interrupted kernel is killed at once, not asked to shut down mid-cell
            with environment(env):
                papermill.execute_notebook(str(nb_in), str(out), parameters=overrides(src, p), cwd=str(src.parent),
                                           kernel_name="python3", progress_bar=progress, execution_timeout=timeout,
                                           config=KERNEL_CONFIG, shutdown_kernel="immediate")
        except papermill.PapermillExecutionError as exc:
            if exc.ename == "KeyboardInterrupt":  # Ctrl-C reached the kernel's cell before this process
                raise KeyboardInterrupt from None
            raise NotebookFailed(f"notebook {src.name} failed: {exc.ename}: {exc.evalue}") from None
    return time.perf_counter() - start


@contextmanager
def environment(values: dict[str, str]):
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


def _remove_stale_staging(folder: Path) -> None:
    """Remove the ``.staging-<pid>-*`` folders of builds that are no longer running (killed ones)."""
    for staging in folder.glob(".staging-*"):
        pid = staging.name.split("-")[1]
        if not (pid.isdigit() and _alive(int(pid))):
            shutil.rmtree(staging, ignore_errors=True)


class FolderBusy(ValueError):
    """Another process is writing the same output folder."""


def hold_lock(folder: Path, what: str = "build"):
    """Take the lock of the output ``folder`` (``fcntl.flock`` on ``.<name>.lock`` beside it) and return its open
    file: the lock is held until the file is closed or the process ends (a killed build leaves no stale lock).
    :class:`FolderBusy` names the folder and the process holding it when another one does."""
    import fcntl

    folder = Path(folder).resolve()
    folder.parent.mkdir(parents=True, exist_ok=True)
    path = folder.parent / f".{folder.name}.lock"
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise FolderBusy(f"{folder} is being written by another {what} (process {holder}, lock {path}); wait for "
                         "it to finish or write elsewhere (--out)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists and belongs to another user
        pass
    return True


@dataclass(frozen=True)
class Execution:
    """How a notebook's outputs were had: executed now, or restored from the cache (``cached``), with the time and
    date of the execution that produced them."""

    seconds: float
    executed_at: str
    cached: bool

    def __str__(self) -> str:
        if self.cached:
            return f"from cache (executed {self.executed_at.replace('T', ' ')[:16]} in {self.seconds:.1f} s)"
        return f"executed in {self.seconds:.1f} s"


def run_notebook(src: Path, out: Path, p: Parameters, *, run_dir: Path, cache: Cache, reuse: bool = True,
                 progress: bool = True, reads_records: bool = False) -> Execution:
    """Execute ``src`` into ``out`` with the checked ``p``, its records into ``run_dir`` (:func:`execute_notebook`),
    or, when ``reuse`` and the cache holds an execution under the same key (:func:`attn_utils.book.cache.key`;
    with ``reads_records``, the records already in ``run_dir`` belong to the key), restore that execution under the
    notebook's current prose and its records into ``run_dir``. A fresh execution is stored in the cache."""
    key = cache_key(src, p, records=run_dir if reads_records else None)
    entry = cache.get(key) if reuse else None
    if entry is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(merge(src, entry.notebook), out)
        restore(entry.records, run_dir)
        return Execution(entry.seconds, entry.executed_at, True)
    before, executed_at = snapshot(run_dir), now()
    seconds = execute_notebook(src, out, p, run_dir=run_dir, progress=progress)
    records = {rel: data for rel, data in written(before, run_dir).items()
               if (run_dir / rel).resolve() != out.resolve()}
    cache.put(key, out.read_bytes(), records, seconds, executed_at)
    return Execution(seconds, executed_at, False)


def status_markdown(executions: dict[str, Execution]) -> str:
    """The build's execution status, for the reproducibility chapter: per notebook, whether it was executed in this
    build or restored from the cache, when its outputs were computed and in how many seconds."""
    rows = [f"| {nb} | {'from the cache' if e.cached else 'executed in this build'} | "
            f"{e.executed_at.replace('T', ' ')[:16]} | {e.seconds:.1f} |" for nb, e in executions.items()]
    executed = [e for e in executions.values() if not e.cached]
    total = sum(e.seconds for e in executions.values()) / 60
    return "\n".join([
        "| notebook | outputs | computed at | seconds |", "|:--|:--|:--|--:|", *rows, "",
        f"Computing every notebook's outputs took {total:.1f} minutes; this build executed {len(executed)} of the "
        f"{len(executions)} notebooks ({sum(e.seconds for e in executed) / 60:.1f} minutes) and took the others "
        "from its execution cache, which keys each notebook on its code, parameters, the library's source, the "
        "installed versions, the model's weights, the corpus, the device and the seed.", ""])


@dataclass
class BookResult:
    html: Path              # the built book
    records: Path           # the build's claims, provenance and timing records (attn_utils.book.runlog)
    executions: dict[str, Execution]


def reads_run_records(src: Path) -> bool:
    """Whether a notebook reads what the other notebooks of the build recorded (its jupytext header says
    ``attn_companion: {reads_run_records: true}``); such notebooks execute after all the others."""
    return bool(jupytext.read(src).metadata.get("attn_companion", {}).get("reads_run_records"))


def _configure(config: Path, repository: str | None) -> None:
    """Point the staged ``_config.yml`` at the public repository and turn on the buttons that need one."""
    if not repository:
        return
    settings = yaml.safe_load(config.read_text())
    settings["repository"]["url"] = repository
    settings["html"].update(use_repository_button=True, use_issues_button=True)
    settings["launch_buttons"].update(binderhub_url="https://mybinder.org", colab_url="https://colab.research.google.com")
    config.write_text(yaml.safe_dump(settings, sort_keys=False))


def check_repository(repository: str | None) -> str | None:
    """``None`` or a GitHub repository address ``https://github.com/OWNER/NAME`` (ValueError otherwise)."""
    if repository and not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repository):
        raise ValueError(f"repository must look like https://github.com/OWNER/NAME, got {repository!r}")
    return repository or None


def build_book(parameters: dict[str, Any] | None = None, *, root: Path = ROOT, out: Path | None = None,
               progress: bool = True, repository: str | None = None, windows: dict[str, Any] | None = None,
               reuse: bool = True, cache: Cache | None = None) -> BookResult:
    """Execute every notebook of the book and build the HTML into ``out`` (default ``_build/html``).

    A parameter is passed to every notebook that declares it; one that no notebook declares is an
    error, and so is any failure of :func:`preflight`, before anything executes. Notebooks run in the
    order of ``_toc.yml``, except those that read the build's run records (the claims ledger), which run
    last. ``repository`` (default ``$ATTN_COMPANION_REPOSITORY``) turns on the repository, Binder and
    Colab buttons. ``windows``, a result of ``attn-companion windows`` (:func:`attn_utils.book.windows.load`), is
    left in the build's run records (``windows/windows.json``), where the ledger chapter reads it. On any failure
    the previous ``out`` is left untouched.

    A notebook whose execution the cache (``cache``, default :class:`~attn_utils.book.cache.Cache` of the project's
    ``_build/cache``) holds under the same key is not executed again unless ``reuse`` is False (``--no-cache``);
    its outputs go under its current prose (:func:`run_notebook`). The reproducibility chapter shows what was
    executed and what came from the cache (``_status.md``, written after the notebooks ran).
    """
    parameters = dict(parameters or {})
    repository = check_repository(repository or os.environ.get("ATTN_COMPANION_REPOSITORY"))
    out = (out or root / "_build" / "html").resolve()
    notebooks = book_notebooks(root)
    declared = {nb: notebook_parameters(nb) for nb in notebooks}
    known = set().union(*declared.values()) | {"models"}
    unknown = sorted(set(parameters) - known)
    if unknown:
        raise ValueError(f"no notebook has a parameter {unknown[0]!r}; known parameters: {sorted(known)}")
    facts: dict[tuple, Any] = {}  # models, tokenizers and texts read once for the whole preflight
    given = {k: parameters.pop(k) for k in ("models", "model") if k in parameters}
    models = book_models(given.get("models", "auto"), model=given.get("model"), cache=facts)
    own = {nb: {k: v for k, v in parameters.items() if k in declared[nb]} for nb in notebooks}
    for nb in notebooks:
        if "model" in declared[nb] and models[0] != declared[nb]["model"]:
            own[nb]["model"] = models[0]
    checked = dict(zip(notebooks, preflight(own.items(), cache=facts)))
    # every model chapter is executed again on each other model of the build (its last section and the ledger)
    variants = {nb: {m: check_parameters(nb, own[nb], cache=facts, on=m, variant=True) for m in models[1:]}
                for nb in notebooks if "model" in declared[nb]}

    out.parent.mkdir(parents=True, exist_ok=True)
    lock = hold_lock(out)  # one build per output folder at a time
    _remove_stale_staging(out.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{os.getpid()}-", dir=out.parent))
    try:
        # attn_utils: the chapters' "How it is computed" blocks include the library's functions (literalinclude)
        for name in ("_config.yml", "_toc.yml", "book", "_static", "attn_utils"):
            src = root / name
            if src.exists():
                (shutil.copytree if src.is_dir() else shutil.copy2)(src, staging / name)
        _configure(staging / "_config.yml", repository)
        run_dir = staging / "_run"
        run_dir.mkdir()
        runlog.write("build", "models", {"models": list(models), "given": given or {"models": "auto"}}, folder=run_dir)
        if windows is not None:
            runlog.write("windows", "windows", windows, folder=run_dir)
        cache = cache or Cache()
        executions: dict[str, Execution] = {}
        runs = [(nb, None, staging / "notebooks" / f"{nb.stem}.ipynb", checked[nb]) for nb in notebooks]
        runs += [(nb, m, staging / "_variants" / f"{nb.stem}--{m}.ipynb".replace("/", "_"), q)
                 for nb in notebooks for m, q in variants.get(nb, {}).items()]
        runs.sort(key=lambda run: reads_run_records(run[0]))  # the ledger last; each list keeps its order
        for i, (nb, m, target, q) in enumerate(runs, 1):
            label = nb.stem if m is None else f"{nb.stem} on {m}"
            print(f"[{i}/{len(runs)}] {label} {dict(q.given) if m else own[nb] or ''}", flush=True)
            executions[label] = run_notebook(nb, target, q, run_dir=run_dir, cache=cache, reuse=reuse,
                                             progress=progress, reads_records=reads_run_records(nb))
            print(f"[{i}/{len(runs)}] {label} {executions[label]}", flush=True)
        for nb in variants:
            compare.write_section(nb.stem, models, staging, run_dir)
        (staging / "_status.md").write_text(status_markdown(executions))
        runlog.write("status", "executions", {nb: asdict(e) for nb, e in executions.items()}, folder=run_dir)
        print("building the HTML with Jupyter Book", flush=True)
        # attn_utils first: its import defers jsonschema's IRI grammars (attn_utils.startup), 0.8 s of Sphinx's start
        sphinx = "import attn_utils; from jupyter_book.cli.main import main; main()"
        build = subprocess.run([sys.executable, "-c", sphinx, "build", str(staging), "-W", "--keep-going",
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
        return BookResult(out, records, executions)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        lock.close()
