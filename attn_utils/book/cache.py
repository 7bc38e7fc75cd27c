"""The execution cache: an executed notebook and its run records, kept under a key of everything that can change them.

A notebook's outputs and the records it leaves (claims, provenance, timings; :mod:`attn_utils.book.runlog`) are a
function of its code cells, its checked parameters (with the facts they were checked against: the model ``auto``
stands for, its context, the corpus's length, the GPUs), the source of ``attn_utils`` (every file of the package,
the shipped corpus and the ledger's rules included), the lock files and the installed versions, the model's weights,
the corpus, the device and the seed. :func:`key` hashes exactly that; markdown cells are not part of it, so a prose
edit executes nothing: :func:`merge` puts the cached outputs under the current prose. A notebook that reads the
other notebooks' records (the ledger chapter) also keys on those records.

jupyter-cache, which Jupyter Book uses, keys a notebook on its code cells alone and keeps artefacts beside the
notebook; the library's source, the environment and records written to a shared run folder cannot enter its key
without editing the notebook, so the same idea is built here on a plain content-addressed folder:
``<root>/<key>/`` holds ``notebook.ipynb``, ``records/<kind>/<name>.json`` and ``entry.json`` (when and how long it
was executed, the sha256 of every file). An entry is written aside and renamed into place, so two builds at once
never see half an entry; an entry whose files do not match their hashes is not used (and is replaced).
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jupytext
import nbformat

from attn_utils.book.params import Parameters

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(__file__).resolve().parents[1]  # attn_utils
CACHE_ENV = "ATTN_COMPANION_CACHE"
LOCKS = ("requirements.txt", "requirements-models.txt")
ENTRY = "entry.json"


def default_root() -> Path:
    """``$ATTN_COMPANION_CACHE``, else ``_build/cache`` of the project (removed by ``make clean``)."""
    return Path(os.environ.get(CACHE_ENV) or ROOT / "_build" / "cache").expanduser()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree_digest(folder: Path, exclude: tuple[str, ...] = ("__pycache__",)) -> str:
    """sha256 over the relative path and sha256 of every file under ``folder`` (sorted; ``exclude`` names skipped)."""
    lines = [f"{p.relative_to(folder).as_posix()} {_sha256(p.read_bytes())}" for p in sorted(folder.rglob("*"))
             if p.is_file() and not set(p.relative_to(folder).parts) & set(exclude)]
    return _sha256("\n".join(lines).encode())


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, str]:
    """What the environment contributes to every key: Python, the platform, the lock files' sha256 and every
    installed distribution's version (read once per process)."""
    versions = sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                       if d.metadata["Name"]})
    locks = {name: _sha256((ROOT / name).read_bytes()) if (ROOT / name).is_file() else "absent" for name in LOCKS}
    return {"python": sys.version, "platform": f"{platform.system()} {platform.machine()}", **locks,
            "installed": _sha256("\n".join(versions).encode())}


def _weights(p: Parameters) -> str:
    """What identifies the weights of the run's model: a local folder's safetensors by content; a hub model by the
    commit of its snapshot in the local Hugging Face cache; an embedded or seeded model by its name (its files are
    those of the installed, hash-pinned package, or drawn from the seed)."""
    if "model" not in p:
        return "no model"
    name = p.model_name
    folder = Path(name).expanduser()
    if folder.is_dir():
        return tree_digest(folder)
    from attn_utils.models.loading import HUB_MODELS, hub_snapshot

    if name in HUB_MODELS or "/" in name:
        snapshot = hub_snapshot(HUB_MODELS.get(name, name))
        return f"{name}@{snapshot.name if snapshot else 'not cached'}"
    return name


def _corpus(p: Parameters) -> str:
    """The sha256 of a user's corpus file (the shipped War and Peace is part of the package's digest)."""
    corpus = p.get("corpus")
    if corpus in (None, "war-and-peace"):
        return str(corpus)
    return _sha256(Path(corpus).expanduser().read_bytes())


def _device(p: Parameters) -> str:
    """The device the run takes, with the GPU's name ('auto' resolved as the run will resolve it)."""
    device = p.get("device")
    if device is None:
        return "none"
    import torch

    gpus = p.facts.get("cuda_devices", 0)
    if device == "cpu" or (device == "auto" and not gpus):
        return "cpu"
    index = int(device.partition(":")[2] or 0)
    return f"cuda:{index} {torch.cuda.get_device_name(index)}"


def code_cells(src: Path) -> list[str]:
    """The sources of the notebook's code cells, in order: the part of the notebook that executes."""
    return [c.source for c in jupytext.read(src).cells if c.cell_type == "code"]


def key(src: Path, p: Parameters, *, records: Path | None = None) -> str:
    """The cache key of executing ``src`` with ``p`` (see the module's docstring); ``records``: the run folder whose
    records the notebook reads (they then belong to the key)."""
    parts = {"code": code_cells(src), "parameters": json.loads(p.to_json()), "library": package_digest(),
             "environment": environment(), "weights": _weights(p), "corpus": _corpus(p), "device": _device(p),
             "records": tree_digest(records) if records is not None and records.is_dir() else None}
    return _sha256(json.dumps(parts, sort_keys=True, default=str).encode())


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
    """:func:`tree_digest` of the ``attn_utils`` package (read once per process: a build does not edit its code)."""
    return tree_digest(PACKAGE)


@dataclass(frozen=True)
class Entry:
    """One cached execution: the executed notebook, the records it wrote (relative path -> bytes), when it was
    executed and how long it took."""

    notebook: nbformat.NotebookNode
    records: dict[str, bytes]
    executed_at: str
    seconds: float


class Cache:
    """The content-addressed folder of executions (:func:`default_root` unless ``root``)."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else default_root()

    def get(self, key: str) -> Entry | None:
        """The entry of ``key``, or None when there is none or it is damaged (a file missing, truncated or changed,
        an unreadable notebook); a damaged entry is removed."""
        folder = self.root / key
        try:
            entry = json.loads((folder / ENTRY).read_text())
            files = {rel: (folder / rel).read_bytes() for rel in entry["files"]}
            if entry["key"] != key or any(_sha256(data) != entry["files"][rel] for rel, data in files.items()):
                raise ValueError("a file does not match its sha256")
            notebook = nbformat.reads(files.pop("notebook.ipynb").decode(), as_version=4)
            return Entry(notebook, {rel.removeprefix("records/"): data for rel, data in files.items()},
                         entry["executed_at"], float(entry["seconds"]))
        except FileNotFoundError:
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)
            return None
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, nbformat.reader.NotJSONError):
            shutil.rmtree(folder, ignore_errors=True)
            return None

    def put(self, key: str, notebook: bytes, records: dict[str, bytes], seconds: float, executed_at: str) -> None:
        """Store an execution (the executed notebook's bytes, the records it wrote, how long it took and when it
        started): written into a folder aside, then renamed into place (an entry another build stored meanwhile is
        kept)."""
        self.root.mkdir(parents=True, exist_ok=True)
        files = {"notebook.ipynb": notebook, **{f"records/{rel}": data for rel, data in records.items()}}
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".tmp-"))
        try:
            for rel, data in files.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_bytes(data)
            (tmp / ENTRY).write_text(json.dumps({
                "key": key, "executed_at": executed_at, "seconds": seconds,
                "files": {rel: _sha256(data) for rel, data in files.items()}}, indent=1))
            shutil.rmtree(self.root / key, ignore_errors=True)  # a damaged entry of the same key
            try:
                os.rename(tmp, self.root / key)
            except OSError:  # another build stored this key meanwhile: keep its entry
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def now() -> str:
    """The local time, to the second, as the cache and the status table record it."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} \
        if folder.is_dir() else {}


def written(before: dict[str, bytes], folder: Path) -> dict[str, bytes]:
    """The files of ``folder`` that are new or changed since ``before`` (:func:`snapshot`): what a notebook wrote."""
    return {rel: data for rel, data in snapshot(folder).items() if before.get(rel) != data}


def restore(records: dict[str, bytes], folder: Path) -> None:
    """Write cached records into the run folder ``folder``."""
    for rel, data in records.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


def merge(src: Path, executed: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook ``src`` as it is now (its prose) with the outputs of ``executed``, an execution of the same code
    cells: each code cell takes its executed twin (outputs, execution metadata), the cell papermill injected after the
    parameters is kept, markdown cells come from ``src``."""
    current = jupytext.read(src)
    code = [c for c in executed.cells if c.cell_type == "code"]
    merged, i = [], 0
    for cell in current.cells:
        if cell.cell_type != "code":
            merged.append(cell)
            continue
        if code[i].source != cell.source:
            raise ValueError(f"{src.name}: the cached execution is of other code (cell {i})")
        merged.append(code[i])
        i += 1
        while i < len(code) and "injected-parameters" in code[i].metadata.get("tags", []):
            merged.append(code[i])
            i += 1
    out = nbformat.from_dict({**executed, "cells": merged})
    out.metadata = {**current.metadata, **executed.metadata}
    return out
