"""Artefacts one build leaves for its reproducibility chapter: claims, provenance records, algorithm timings.

``attn-companion`` exports ``ATTN_COMPANION_RUN_DIR`` (the build's run folder) and
``ATTN_COMPANION_NOTEBOOK`` (the notebook being executed) to each kernel. Records are small JSON
files, ``<run dir>/<kind>/<key>.json``; a notebook opened by hand writes to ``runs/interactive/``.
"""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RUN_DIR_ENV = "ATTN_COMPANION_RUN_DIR"
NOTEBOOK_ENV = "ATTN_COMPANION_NOTEBOOK"
MODEL_ENV = "ATTN_COMPANION_MODEL"
VARIANT_ENV = "ATTN_COMPANION_VARIANT"  # "1": a build's run of a chapter on another model than its page's


def run_dir() -> Path:
    """The folder this build's artefacts go to."""
    return Path(os.environ.get(RUN_DIR_ENV) or Path(__file__).resolve().parents[2] / "runs" / "interactive")


def notebook() -> str:
    """The notebook being executed (``interactive`` outside ``attn-companion``)."""
    return os.environ.get(NOTEBOOK_ENV, "interactive")


def model() -> str:
    """The model the notebook being executed measures (``$ATTN_COMPANION_MODEL``, set by the build; ``""`` without)."""
    return os.environ.get(MODEL_ENV, "")


def variant() -> bool:
    """Whether the notebook being executed is a build's run on another model than the page's (its synthetic checks
    ran at reduced sizes and are neither shown nor recorded)."""
    return os.environ.get(VARIANT_ENV) == "1"


def write(kind: str, key: str, payload: dict[str, Any], folder: Path | None = None) -> Path:
    """Write one record; a record with the same kind and key is replaced."""
    folder = (folder or run_dir()) / kind
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


def read(kind: str, folder: Path | None = None) -> list[dict[str, Any]]:
    """Every record of ``kind``, in key order."""
    base = (folder or run_dir()) / kind
    return [json.loads(p.read_text()) for p in sorted(base.glob("*.json"))] if base.is_dir() else []


def record_time(algorithm: str, seconds: float) -> None:
    """Add ``seconds`` to the wall time recorded for ``algorithm`` in the current notebook (``timings/``)."""
    key = "--".join(filter(None, (notebook(), model(), algorithm))).replace(" ", "_").replace("/", "_")
    previous = next((r for r in read("timings") if r["key"] == key), {"seconds": 0.0, "calls": 0})
    write("timings", key, {"key": key, "algorithm": algorithm, "notebook": notebook(), "model": model(),
                           "seconds": previous["seconds"] + seconds, "calls": previous["calls"] + 1})


@contextmanager
def timing(algorithm: str):
    """``with timing("Algorithm 4"): ...`` records the block's wall time under ``algorithm`` (see :func:`record_time`);
    the paper's algorithms themselves do no I/O, so their callers time them."""
    start = time.perf_counter()
    try:
        yield
    finally:
        record_time(algorithm, time.perf_counter() - start)
