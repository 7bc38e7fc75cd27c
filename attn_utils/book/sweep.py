"""Re-running notebooks with other parameters: one run here, or a sweep of every combination on a Dask cluster.

:func:`run_one` executes one notebook in this process's machine. :func:`sweep` submits one task per parameter
combination to ``dask.distributed``: a ``LocalCluster`` of worker processes (one thread each) by default, or the
running scheduler at ``scheduler``. A task (:func:`execute_task`) executes the notebook with papermill in a
temporary folder of its worker and returns the executed notebook and its run records as data, so the workers need
no filesystem in common with the client, which writes each result into its run folder as it arrives. The sweep
folder then gets a tidy table of every (combination, ledger claim) (:func:`results_table`, Parquet and CSV) and an
HTML index that compares the runs (:func:`write_index`).
"""
from __future__ import annotations

import base64
import hashlib
import html
import importlib.util
import io
import json
import logging
import math
import numbers
import os
import re
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import nbformat
import pandas as pd
import psutil

from attn_utils.book import runlog
from attn_utils.book.build import NotebookFailed, environment, execute_notebook, hold_lock, preflight, run_notebook
from attn_utils.book.cache import Cache, merge, now
from attn_utils.book.cache import key as cache_key
from attn_utils.book.formatting import fmt, is_number
from attn_utils.book.params import Parameters
from attn_utils.book.sources import combinations  # noqa: F401 (sweep's name since before it moved)

RETRIES = 1  # a task that raises outside its notebook is retried once (a lost worker's task is retried by Dask)
FIGURES = {"image/png": ("png", base64.b64decode), "image/svg+xml": ("svg", str.encode)}
GLUED = "application/papermill.record/"  # the prefix of a figure that a chapter glues (myst_nb.glue)


def run_slug(parameters: dict[str, Any]) -> str:
    """A readable, unique folder name for a parameter combination (``L=512_N=5-1a2b3c``)."""
    text = "_".join(f"{k}={v}" for k, v in sorted(parameters.items())) or "defaults"
    safe = re.sub(r"[^A-Za-z0-9=._-]+", "", text.replace(" ", ""))[:80]
    digest = hashlib.sha256(json.dumps(parameters, sort_keys=True, default=str).encode()).hexdigest()[:6]
    return f"{safe}-{digest}"


def extract_figures(notebook: Path, folder: Path) -> list[Path]:
    """Write every PNG and SVG output of an executed notebook, shown or glued, to ``folder``; return the files in
    order."""
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(notebook, as_version=4)
    files = []
    for c, cell in enumerate(nb.cells):
        for o, output in enumerate(cell.get("outputs", [])):
            for mime, (suffix, decode) in FIGURES.items():
                data = output.get("data", {}).get(mime) or output.get("data", {}).get(GLUED + mime)
                if data:
                    path = folder / f"cell{c:02d}_out{o}.{suffix}"
                    path.write_bytes(decode(data if isinstance(data, str) else "".join(data)))
                    files.append(path)
    return files


def run_one(src: Path, parameters: dict[str, Any], out_root: Path, *, progress: bool = True, reuse: bool = True,
            cache: Cache | None = None) -> Path:
    """Execute ``src`` with ``parameters`` into ``out_root/<notebook>/<slug>/``; return the executed notebook.

    Parameters that fail :func:`~attn_utils.book.build.preflight` are refused before anything is written, and so
    is a run whose folder another process is writing (:func:`~attn_utils.book.build.hold_lock`).
    The folder's ``status.json`` says ``running`` (with this process's pid and host: a reader finds ``interrupted``
    once that process is gone, :func:`read_status`), then ``interrupted`` on Ctrl-C, ``ok`` (with the seconds, and
    whether the outputs came from
    the execution cache: :func:`~attn_utils.book.build.run_notebook`, unless ``reuse`` is False) or ``failed``
    (with the error); a failed run keeps its executed notebook, traceback included. A re-run replaces the folder.
    """
    (checked,) = preflight([(src, parameters)])
    folder = run_folder(src, parameters, out_root)
    with hold_lock(folder, "run"):
        before = read_status(folder)
        if before["status"] == "interrupted":
            print(f"{folder}: the previous run was interrupted ({before.get('error', 'its process is gone')}); "
                  "running it again", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        (folder / "params.json").write_text(json.dumps(parameters, indent=1, default=str))
        _write_status(folder, status="running", pid=os.getpid(), host=socket.gethostname())
        out = folder / f"{src.stem}.ipynb"
        try:
            execution = run_notebook(src, out, checked, run_dir=folder, cache=cache or Cache(), reuse=reuse,
                                     progress=progress)
            extract_figures(out, folder / "figures")
        except KeyboardInterrupt:
            _write_status(folder, status="interrupted", error="interrupted (Ctrl-C or SIGTERM)")
            raise
        except BaseException as exc:
            _write_status(folder, status="failed", error=str(exc) or type(exc).__name__)
            raise
        print(f"{src.name} {execution}", flush=True)
        _write_status(folder, status="ok", **asdict(execution))
    return out


def run_folder(src: Path, parameters: dict[str, Any], out_root: Path) -> Path:
    """The folder of one run: ``out_root/<notebook>/<slug>/``."""
    return Path(out_root) / src.stem / run_slug(parameters)


def _write_status(folder: Path, **status: Any) -> None:
    (folder / "status.json").write_text(json.dumps(status, indent=1))


def read_status(folder: Path) -> dict[str, Any]:
    """The ``status.json`` of a run folder (``not run`` without one); a run that says ``running`` but whose process
    is gone from this host (killed: kill -9, a crash, a reboot) is ``interrupted``."""
    path = folder / "status.json"
    try:
        status = json.loads(path.read_text()) if path.is_file() else {"status": "not run"}
    except (OSError, ValueError):
        return {"status": "failed", "error": f"{path} cannot be read"}
    if not isinstance(status, dict):
        return {"status": "failed", "error": f"{path} holds no status"}
    if status.get("status") == "running" and status.get("host") == socket.gethostname() \
            and isinstance(status.get("pid"), int) and not psutil.pid_exists(status["pid"]):
        return {**status, "status": "interrupted", "error": f"its process {status['pid']} is gone"}
    return status



# --- the task, on a worker --------------------------------------------------------------------------------------

# execute_notebook hands the run folder to the kernel through os.environ: one notebook at a time per worker process
_ONE_NOTEBOOK = threading.Lock()
# Dask's nanny starts its workers with MALLOC_TRIM_THRESHOLD_ set (distributed.nanny.pre-spawn-environ), for their
# own memory hygiene. Inherited by a kernel, it turns off glibc's dynamic mmap threshold (mallopt(3)), so every
# large temporary of the algorithms is mapped and unmapped afresh: half of a ch2_distance kernel's time went to the
# system (95 s user, 87 s system). The kernels start without it.
_WORKER_ONLY_ENV = "MALLOC_TRIM_THRESHOLD_"


def execute_task(name: str, source: str, parameters: Parameters) -> dict[str, Any]:
    """The Dask task of one combination: execute the notebook ``source`` (the text of the ``py:percent`` file
    ``name``) with the checked ``parameters`` (of the client's preflight) in a temporary folder of this worker, and
    return its run folder as data:
    ``{"files": {relative path: bytes}, "status": {"status": "ok" | "failed", "seconds", "error", "worker"}}``.
    The files are the executed notebook and the run records the kernel wrote (``claims/``, ``timings/``,
    ``provenance/``); a notebook that raises is a ``failed`` status, not an exception."""
    os.environ.pop(_WORKER_ONLY_ENV, None)  # this worker's own allocator read it when the worker started
    with _ONE_NOTEBOOK, tempfile.TemporaryDirectory(prefix="attn-companion-sweep-") as tmp:
        src, run = Path(tmp) / name, Path(tmp) / "run"
        src.write_text(source)
        start, executed_at = time.perf_counter(), now()
        try:
            seconds = execute_notebook(src, run / f"{src.stem}.ipynb", parameters, run_dir=run, progress=False)
            status = {"status": "ok", "seconds": seconds, "executed_at": executed_at, "cached": False}
        except NotebookFailed as exc:
            status = {"status": "failed", "seconds": time.perf_counter() - start, "error": str(exc)}
        files = {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    return {"files": files, "status": {**status, "worker": _worker_name()}}


def _worker_name() -> str:
    """The address of the Dask worker running this task, and its host."""
    from distributed import get_worker

    return f"{get_worker().address} ({socket.gethostname()})"


# --- the sweep, on the client -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cluster:
    """Where a sweep's tasks run: a new ``LocalCluster`` of ``workers`` processes on 127.0.0.1 (one thread each;
    default min(2, cores)), or the running Dask scheduler at ``scheduler``; not both."""

    workers: int | None = None
    scheduler: str | None = None

    def __post_init__(self):
        if self.workers is not None and self.scheduler is not None:
            raise ValueError(f"--workers sizes the local cluster; the cluster of --scheduler {self.scheduler} has its "
                             "own workers")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 1):
            raise ValueError(f"--workers must be an integer >= 1, got {self.workers!r}")


def sweep(src: Path, grid: dict[str, list[Any]], out_root: Path, *, cluster: Cluster = Cluster(),
          force: bool = False, progress: bool = True, reuse: bool = True, cache: Cache | None = None) -> Path:
    """Execute ``src`` for every combination of ``grid`` values on a Dask ``cluster``; return the sweep's
    ``index.html``.

    Every combination passes :func:`~attn_utils.book.build.preflight` before anything is submitted, and
    :func:`sweep_checked` runs them. A combination whose run folder says ``ok`` is skipped unless ``force``."""
    combos = combinations(grid)
    return sweep_checked(src, sorted(grid), list(zip(combos, preflight([(src, c) for c in combos]))), out_root,
                         cluster=cluster, force=force, progress=progress, reuse=reuse, cache=cache)


def sweep_checked(src: Path, grid_names: list[str], runs: list[tuple[dict[str, Any], Parameters]], out_root: Path,
                  *, cluster: Cluster = Cluster(), force: bool = False, progress: bool = True, reuse: bool = True,
                  cache: Cache | None = None) -> Path:
    """:func:`sweep` of ``runs``, pairs of a combination of the grid ``grid_names`` and its checked parameters. A
    combination whose execution the cache holds (and ``reuse``) is restored from it, not submitted; what the
    cluster executes is stored in the cache. Each result is written to ``out_root/<notebook>/<slug>/`` as it
    arrives; a failing combination is recorded there (``status.json``: failed and the error) and does not stop the
    others. ``out_root/<notebook>/`` then gets ``results.parquet``, ``results.csv`` (:func:`results_table`),
    ``index.html`` and ``index.json``, also when the sweep is interrupted. Raises
    :class:`~attn_utils.book.build.NotebookFailed` at the end if a combination failed.
    """
    combos = [combo for combo, _ in runs]
    folder = Path(out_root) / src.stem
    todo = [(c, p) for c, p in runs if force or read_status(run_folder(src, c, out_root))["status"] != "ok"]
    if len(todo) < len(combos):
        print(f"{len(combos) - len(todo)} of {len(combos)} combinations already finished (status ok): skipped "
              f"(--force runs them again)", flush=True)
    cache = cache or Cache()
    keyed = [(c, p, cache_key(src, p)) for c, p in todo]
    missing = []
    for combo, p, key in keyed:
        entry = cache.get(key) if reuse else None
        if entry is None:
            missing.append((combo, p, key))
            continue
        notebook = nbformat.writes(merge(src, entry.notebook)).encode()
        _store(src, run_folder(src, combo, out_root), combo, {
            "files": {f"{src.stem}.ipynb": notebook, **entry.records},
            "status": {"status": "ok", "seconds": entry.seconds, "executed_at": entry.executed_at, "cached": True,
                       "worker": "the execution cache"}})
    if len(missing) < len(todo):
        print(f"{len(todo) - len(missing)} of {len(todo)} combinations to run came from the execution cache",
              flush=True)
    with _client(cluster) if missing else nullcontext() as client:
        try:
            if missing:
                _submit_and_store(client, src, missing, out_root, cache, progress=progress)
        finally:  # also after an interruption: the table and the index of what finished
            table = results_table(src, grid_names, combos, out_root)
            folder.mkdir(parents=True, exist_ok=True)
            table.to_parquet(folder / "results.parquet", index=False)
            table.to_csv(folder / "results.csv", index=False)
            index = write_index(src.stem, grid_names, [(p, run_folder(src, p, out_root)) for p in combos], table,
                                folder)
    failed = [p for p in combos if read_status(run_folder(src, p, out_root))["status"] != "ok"]
    if failed:
        raise NotebookFailed(f"{len(failed)} of {len(combos)} runs failed; see {index}")
    return index


@contextmanager
def _client(cluster: Cluster) -> Iterator[Any]:
    """A Dask client of the cluster's scheduler, or of a new LocalCluster (closed on exit); prints where the
    dashboard is."""
    from distributed import Client, LocalCluster  # imported when a sweep runs, not by workers unpickling a task

    scheduler = cluster.scheduler
    if scheduler is not None:
        try:
            client = Client(scheduler)  # waits distributed.comm.timeouts.connect (Dask's configuration: 30 s)
        except OSError as err:
            raise ValueError(f"--scheduler {scheduler}: cannot reach the Dask scheduler: {err}") from None
        with client:
            _say_dashboard(client)
            yield client
        return
    n = cluster.workers or min(2, _cores())
    # the cluster's own logs only if critical: the sweep reports every task's result and failure itself, and on
    # Ctrl-C a worker still beating while the scheduler closes logs "Failed to communicate with scheduler during
    # heartbeat" with a traceback (seen with both cores busy), after the sweep's one line
    with _scratch() as scratch, _reaped(), \
            LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL,
                         local_directory=str(scratch / "dask")) as cluster, \
            Client(cluster) as client:
        print(f"local Dask cluster: {n} worker process{'es' * (n > 1)}, one thread each, "
              f"scheduler {cluster.scheduler_address}", flush=True)
        _say_dashboard(client)
        yield client


#: prctl(2)'s PR_SET_CHILD_SUBREAPER (Linux): orphaned descendants are reparented to this process, not to init
_PR_SET_CHILD_SUBREAPER = 36


@contextmanager
def _reaped() -> Iterator[None]:
    """Every process that this one started, and their descendants, ended on exit: on Ctrl-C the workers die first,
    and the kernels they started would live on (writing "Parent appears to have exited" after the sweep's last line).
    On Linux this process becomes their subreaper, so that orphaned kernels stay its descendants and are found."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        left = psutil.Process().children(recursive=True)
        for process in left:
            try:
                process.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=10)


@contextmanager
def _scratch() -> Iterator[Path]:
    """A temporary folder for everything a local cluster leaves on disk: the workers' folders (``dask/``), their
    temporary files (``$TMPDIR``) and their kernels' connection files (``$JUPYTER_RUNTIME_DIR``), inherited by the
    worker processes; removed when the sweep ends, also when it is interrupted."""
    scratch = Path(tempfile.mkdtemp(prefix="attn-companion-sweep-"))
    env = {"TMPDIR": str(scratch / "tmp"), "JUPYTER_RUNTIME_DIR": str(scratch / "jupyter")}
    try:
        for folder in env.values():
            Path(folder).mkdir()
        with environment(env):
            yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _say_dashboard(client) -> None:
    """Print the dashboard's address: the scheduler's web server serves it when bokeh is installed there."""
    served = "dashboard" in client.scheduler_info().get("services", {})
    if served and client.run_on_scheduler(lambda: importlib.util.find_spec("bokeh") is not None):
        print(f"Dask dashboard: {client.dashboard_link}", flush=True)
    else:
        print("Dask dashboard: off (the scheduler has no bokeh package, which the dashboard needs)", flush=True)


def _submit_and_store(client, src: Path, todo: list[tuple[dict[str, Any], Parameters, str]], out_root: Path,
                      cache: Cache, *, progress: bool) -> None:
    """Submit one :func:`execute_task` per (combination, checked parameters, cache key) of ``todo``; write each
    result as it completes, and store it in ``cache`` when it is ok."""
    from distributed import as_completed
    from tqdm.auto import tqdm

    source, token = src.read_text(), secrets.token_hex(4)
    futures = {client.submit(execute_task, src.name, source, checked, key=f"{src.stem}-{run_slug(params)}-{token}",
                             pure=False, retries=RETRIES): (params, key) for params, checked, key in todo}
    bar = tqdm(total=len(futures), desc=f"sweep {src.stem}", unit="run", disable=not progress)
    try:
        for future in as_completed(futures):
            params, key = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # raised outside the notebook after its retries, or a worker lost too often
                result = {"files": {}, "status": {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}}
            _store(src, run_folder(src, params, out_root), params, result)
            if result["status"]["status"] == "ok":
                records = dict(result["files"])
                notebook = records.pop(f"{src.stem}.ipynb")
                cache.put(key, notebook, records, result["status"]["seconds"], result["status"]["executed_at"])
            bar.update()
            if result["status"]["status"] != "ok":
                bar.write(f"failed: {_label(params)}: {result['status']['error']}", file=sys.stderr)
    except BaseException:
        client.cancel(list(futures))
        raise
    finally:
        bar.close()


def _store(src: Path, folder: Path, parameters: dict[str, Any], result: dict[str, Any]) -> None:
    """Write a task's result into its run folder, ``status.json`` last (a folder that says ok is complete)."""
    files = {(folder / relative).resolve(): data for relative, data in result["files"].items()}
    outside = [str(path) for path in files if not path.is_relative_to(folder.resolve())]
    if outside:
        raise ValueError(f"a task returned files outside its run folder {folder}: {outside}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "params.json").write_text(json.dumps(parameters, indent=1, default=str))
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    notebook = folder / f"{src.stem}.ipynb"
    if notebook.is_file():
        extract_figures(notebook, folder / "figures")
    _write_status(folder, **result["status"])


def _label(parameters: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in parameters.items()) or "defaults"


# --- comparing the runs -----------------------------------------------------------------------------------------

def results_table(src: Path, names: list[str], combos: list[dict[str, Any]], out_root: Path) -> pd.DataFrame:
    """The tidy table of a sweep: one row per (combination, recorded ledger claim), and one row with no claim for a
    combination that recorded none. Columns: the swept parameters ``names`` (a list value as its JSON text),
    ``run`` (the run folder), ``claim``, ``chapter``, ``verdict``, ``value_<name>`` for every numeric value the
    claim recorded, ``measured_on`` (the claim's model, or ``synthetic``), then the run's provenance: ``model_used``
    (the model it loaded, ``auto`` resolved), ``status``, ``seconds``, ``worker`` and ``error``."""
    rows = []
    for params in combos:
        folder = run_folder(src, params, out_root)
        status = read_status(folder)
        provenance = next(iter(runlog.read("provenance", folder)), {})
        run = {**{n: _cell(params[n]) for n in names}, "run": folder.name}
        about = {"model_used": provenance.get("model"), "status": status["status"],
                 "seconds": status.get("seconds"), "worker": status.get("worker"), "error": status.get("error")}
        recorded = runlog.read("claims", folder)
        for claim in recorded:
            values = {f"value_{k}": float(v) for k, v in claim["values"].items() if is_number(v)}
            rows.append({**run, "claim": claim["key"], "chapter": claim["chapter"], "verdict": claim["verdict"],
                         **values, "measured_on": claim["model"], **about})
        if not recorded:
            rows.append({**run, "claim": None, "chapter": None, "verdict": None, "measured_on": None, **about})
    table = pd.DataFrame(rows)
    values = sorted(c for c in table.columns if c.startswith("value_"))
    columns = [*names, "run", "claim", "chapter", "verdict", *values, "measured_on", "model_used", "status", "seconds",
               "worker", "error"]
    table = table.reindex(columns=columns)
    for name in names:  # one type per column (Parquet): text where the values mix numbers and text
        kinds = {type(v) for v in table[name].dropna()}
        if len(kinds) > 1 and not all(issubclass(k, numbers.Real) and k is not bool for k in kinds):
            table[name] = table[name].map(lambda v: None if v is None else str(v))
    return table


def _cell(value: Any) -> Any:
    """A parameter value as a table cell: scalars as they are, lists and dicts as their JSON text."""
    return value if value is None or isinstance(value, (str, bool, numbers.Real)) else json.dumps(value)


def write_index(name: str, names: list[str], runs: list[tuple[dict[str, Any], Path]], table: pd.DataFrame,
                folder: Path) -> Path:
    """``folder/index.html``, one self-contained page (its plots inline): the grid of verdicts (claims x
    combinations), for each swept numeric parameter the claims' headline numbers against it (a table when it has
    one value), and every run with its status, error and links to its executed notebook and figures; plus
    ``index.json``, the runs' parameters and statuses."""
    from attn_utils.book.figures import VERDICT_COLOURS  # matplotlib and seaborn: only when an index is written

    folder.mkdir(parents=True, exist_ok=True)
    statuses = [read_status(run) for _, run in runs]
    ok = sum(s["status"] == "ok" for s in statuses)
    parts = [f"<!doctype html><meta charset='utf-8'><title>Sweep of {html.escape(name)}</title>", STYLE,
             f"<h1>Sweep of {html.escape(name)}</h1>",
             f"<p>{len(runs)} combinations of {', '.join(map(html.escape, names)) or 'no parameter'}: {ok} ok, "
             f"{len(runs) - ok} not. The tidy table of every (combination, claim): <a href='results.csv'>"
             f"results.csv</a>, <a href='results.parquet'>results.parquet</a>.</p>",
             "<h2>Verdicts</h2>", _verdict_grid(runs, statuses, table, VERDICT_COLOURS),
             "<p>" + " ".join(f"<span class='v' style='background:{c}'>{html.escape(v)}</span>"
                              for v, c in VERDICT_COLOURS.items()) + "</p>",
             "<h2>Headline numbers</h2>", _headline_numbers(names, table, VERDICT_COLOURS),
             "<h2>Runs</h2>", _run_list(runs, statuses, folder)]
    index = folder / "index.html"
    index.write_text("\n".join(parts))
    listing = [{"parameters": params, "run": run.name, **status} for (params, run), status in zip(runs, statuses)]
    (folder / "index.json").write_text(json.dumps(listing, indent=1, default=str))
    return index


STYLE = """<style>
body{font-family:system-ui,sans-serif;max-width:75rem;margin:auto;padding:1rem}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.2rem .4rem;font-size:.85rem}
th{background:#f4f4f4}.v{padding:.1rem .4rem;border-radius:.2rem;font-size:.85rem}.failed{background:#f6c6c6}
img.plot{max-width:100%}</style>"""


def _verdict_grid(runs, statuses, table: pd.DataFrame, colours: dict[str, str]) -> str:
    """Claims (rows) x combinations (columns, named by the parameters that vary), each cell the verdict on its
    colour; a failed run's column says so."""
    claims = table.dropna(subset=["claim"]).sort_values(["chapter", "claim"])["claim"].unique()
    shown = [n for n in runs[0][0] if len({json.dumps(p[n], default=str) for p, _ in runs}) > 1] or list(runs[0][0])
    head = "".join(f"<th class='{'failed' * (s['status'] != 'ok')}' title='{html.escape(s.get('error') or '')}'>"
                   f"{html.escape(_label({n: p[n] for n in shown}))}<br>{s['status']}</th>"
                   for (p, _), s in zip(runs, statuses))
    verdicts = table.dropna(subset=["claim"]).set_index(["run", "claim"])["verdict"]
    body = []
    for claim in claims:
        cells = []
        for _, run in runs:
            verdict = verdicts.get((run.name, claim))
            cells.append(f"<td style='background:{colours[verdict]}'>{html.escape(verdict)}</td>" if verdict
                         else "<td>—</td>")
        body.append(f"<tr><th>{html.escape(claim)}</th>{''.join(cells)}</tr>")
    if not body:
        return "<p>No run recorded a claim.</p>"
    return f"<table><tr><th>claim</th>{head}</tr>{''.join(body)}</table>"


def _headline_numbers(names: list[str], table: pd.DataFrame, colours: dict[str, str]) -> str:
    """For each swept numeric parameter with several values, one figure per claim: each headline number that
    varies (other than the parameter itself) against the parameter (a line per value of the other swept parameters,
    points in their verdict's colour);
    a table of the headline numbers per claim and run where no swept parameter is numeric with several values."""
    claimed = table.dropna(subset=["claim"])
    numeric = [n for n in names if claimed[n].map(is_number).all() and claimed[n].nunique() > 1]
    if claimed.empty:
        return "<p>No run recorded a claim.</p>"
    if not numeric:
        return _headline_table(names, claimed)
    parts = []
    for parameter in numeric:
        parts.append(f"<h3>Against {html.escape(parameter)}</h3>")
        for claim, rows in claimed.groupby("claim", sort=True):
            varying = [c for c in rows.columns if c.startswith("value_") and rows[c].nunique() > 1
                       and not rows[c].equals(rows[parameter].astype(float))]  # not the parameter itself
            if varying:
                svg = _plot(rows, parameter, [n for n in names if n != parameter], varying, colours)
                parts.append(f"<h4>{html.escape(claim)}</h4><img class='plot' alt='headline numbers of "
                             f"{html.escape(claim)} against {html.escape(parameter)}' "
                             f"src='data:image/svg+xml;base64,{base64.b64encode(svg).decode()}'>")
    return "\n".join(parts)


def _headline_table(names: list[str], claimed: pd.DataFrame) -> str:
    values = [c for c in claimed.columns if c.startswith("value_") and claimed[c].notna().any()]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in [*names, "claim", "verdict", *values])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(row[c]) if is_number(row[c]) else str(row[c]))}</td>"
                                    for c in [*names, "claim", "verdict", *values]) + "</tr>"
                   for _, row in claimed.iterrows())
    return f"<table><tr>{head}</tr>{body}</table>"


def _plot(rows: pd.DataFrame, parameter: str, others: list[str], values: list[str], colours: dict[str, str]) -> bytes:
    """Small SVG plots of ``values`` (columns of ``rows``) against ``parameter``, one line per value of ``others``."""
    from matplotlib.figure import Figure

    ncols = min(len(values), 4)
    nrows = math.ceil(len(values) / ncols)
    fig = Figure(figsize=(2.6 * ncols, 2.1 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    groups = rows.groupby(others, dropna=False, sort=True) if others else [((), rows)]
    for ax, column in zip(axes, values):
        for key, group in groups:
            group = group.sort_values(parameter)
            label = _label(dict(zip(others, key if isinstance(key, tuple) else (key,))))
            ax.plot(group[parameter], group[column], color="0.55", lw=1, zorder=1, label=label if others else None)
            ax.scatter(group[parameter], group[column], c=[colours.get(v, "#000000") for v in group["verdict"]],
                       edgecolors="0.2", linewidths=0.5, s=28, zorder=2)
        ax.set_xlabel(parameter)
        ax.set_title(column.removeprefix("value_"), fontsize=9)
        ax.tick_params(labelsize=7)
        if rows[parameter].min() > 0 and rows[parameter].max() / rows[parameter].min() >= 8:
            ax.set_xscale("log", base=2)
    for ax in axes[len(values):]:
        ax.set_visible(False)
    if others and len(groups) > 1:
        axes[0].legend(fontsize=6)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg")
    return buffer.getvalue()


def _run_list(runs, statuses, folder: Path) -> str:
    """One row per run: parameters, status, seconds, worker, error, links to its notebook and figures."""
    rows = []
    for (params, run), status in zip(runs, statuses):
        notebook = next(run.glob("*.ipynb"), None)
        links = [f"<a href='{notebook.relative_to(folder).as_posix()}'>notebook</a>"] if notebook else []
        links += [f"<a href='{f.relative_to(folder).as_posix()}'>{f.stem}</a>"
                  for f in sorted((run / "figures").glob("*")) if f.suffix in (".png", ".svg")]
        seconds = status.get("seconds")
        rows.append(f"<tr class='{'failed' * (status['status'] != 'ok')}'><td>{html.escape(_label(params))}</td>"
                    f"<td>{status['status']}</td><td>{fmt(seconds) if seconds is not None else ''}</td>"
                    f"<td>{html.escape(status.get('worker') or '')}</td>"
                    f"<td>{html.escape(status.get('error') or '')}</td><td>{' '.join(links)}</td></tr>")
    return ("<table><tr><th>combination</th><th>status</th><th>seconds</th><th>worker</th><th>error</th>"
            f"<th>files</th></tr>{''.join(rows)}</table>")
