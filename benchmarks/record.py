"""Where the benchmarks write their results: ``benchmarks/results/``, the results of record, or the folder that
``$ATTN_COMPANION_BENCH_RESULTS`` names (the tests run every script of ``make benchmark`` at small sizes into a
temporary one, so that the results of record are left alone)."""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
from pathlib import Path

RESULTS_ENV = "ATTN_COMPANION_BENCH_RESULTS"


def results_folder() -> Path:
    """``$ATTN_COMPANION_BENCH_RESULTS`` when it is set, ``benchmarks/results/`` otherwise (made if missing)."""
    folder = Path(os.environ.get(RESULTS_ENV) or Path(__file__).resolve().parent / "results")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def measured_on() -> dict:
    """The machine a result was measured on: platform, cores, load average now, Python and torch versions (torch's
    as installed, also for the scripts that import it only in the processes they time). The one place a result says
    this: the scripts record only what is their own (threads, other packages' versions, load before a run)."""
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
            "python": platform.python_version(), "torch": importlib.metadata.version("torch")}


def write(name: str, result: dict, indent: int = 1) -> Path:
    """Write ``result`` as JSON, with :func:`measured_on` as its ``measured_on``, to ``name`` in
    :func:`results_folder`; say where, and return the path."""
    path = results_folder() / name
    path.write_text(json.dumps({**result, "measured_on": measured_on()}, indent=indent) + "\n")
    print(f"wrote {path}", flush=True)
    return path
