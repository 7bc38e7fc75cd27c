"""What produced a result: what the model is, its weights hash, tokenizer, how it reads a window, corpus and its hash,
windows, versions, the lock files, seed, device, time. ``load_model`` fills in the model part; experiments add the
corpus, windows and seed and time themselves."""
from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import re
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

LOCK_FILE = Path(__file__).resolve().parents[2] / "requirements.txt"
MODELS_LOCK_FILE = LOCK_FILE.with_name("requirements-models.txt")  # the hash-pinned wheels of the embedded models
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", re.M)


def package_versions() -> dict[str, str]:
    """Versions of python, torch, transformers, numpy and this package (``attn-companion``)."""
    versions = {"python": platform.python_version()}
    for label, dist in (("torch", "torch"), ("transformers", "transformers"), ("numpy", "numpy"),
                        ("attn_utils", "attn-companion")):
        try:
            versions[label] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[label] = "not installed"
    return versions


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_status(lock: Path = LOCK_FILE) -> dict:
    """A lock file of the environment (pip-compile's ``requirements.txt``, or ``requirements-models.txt``): its
    sha256, how many exact pins it holds, and the pins that the running environment does not match
    (``name: locked != installed``)."""
    if not lock.is_file():
        return {"file": str(lock), "sha256": "", "pins": 0, "differ": ["no lock file beside the package"]}
    text = lock.read_text()
    differ = []
    pins = _PIN.findall(text)
    for name, locked in pins:
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = "not installed"
        if installed.split("+")[0] != locked.split("+")[0]:
            differ.append(f"{_canonical(name)}: {locked} != {installed}")
    return {"file": lock.name, "sha256": hashlib.sha256(text.encode()).hexdigest(), "pins": len(pins),
            "differ": differ}


@dataclass
class Provenance:
    """A record of what produced a result; ``to_markdown()`` is the table the book prints under each experiment."""

    model: str = ""                 # the model actually used, e.g. "smollm2-135m"
    requested: str = ""             # the name asked for, e.g. "auto"
    description: str = ""           # what the model is (training, quantisation, positions, attention)
    model_source: str = ""          # hub id, folder or GGUF file the weights came from
    model_class: str = ""
    pretrained: bool | None = None
    weights_sha256: str = ""        # of the weights file actually loaded (checked at load)
    source_sha256: str = ""         # of the file they were converted from (the GGUF), where they were converted
    tokenizer: str = ""
    architecture: dict = field(default_factory=dict)  # loading.architecture: layers, heads, sharing, masks, context
    window: Any = None              # corpus.WindowFormat: how the model reads a window of L tokens
    dtype: str = ""
    device: str = ""
    corpus: str = ""
    corpus_sha256: str = ""
    chapters: tuple[int, int] | None = None
    L: int | None = None
    window_offsets: tuple[int, ...] = ()
    seed: int | None = None
    versions: dict = field(default_factory=package_versions)
    lock: dict = field(default_factory=lock_status)
    models_lock: dict = field(default_factory=lambda: lock_status(MODELS_LOCK_FILE))
    started_at: str = ""            # ISO 8601, UTC
    wall_time_s: float | None = None
    notes: list[str] = field(default_factory=list)
    _t0: float | None = field(default=None, repr=False, compare=False)

    def add_corpus(self, corpus, *, L: int | None = None, offset: int = 0, n_windows: int = 1) -> Provenance:
        """Record a :class:`attn_utils.models.corpus.Corpus` and, if ``L`` is given, the offsets of its token windows:
        the first text token of each (windows of ``L`` tokens hold ``window.text_tokens(L)`` text tokens)."""
        self.corpus, self.corpus_sha256, self.chapters = corpus.name, corpus.sha256, corpus.chapters
        if L is not None:
            self.L = L
            step = self.window.text_tokens(L) if self.window is not None else L
            self.window_offsets = tuple(offset + i * step for i in range(n_windows))
        return self

    def start(self) -> Provenance:
        """Start the wall clock."""
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._t0 = time.perf_counter()
        return self

    def finish(self) -> Provenance:
        """Stop the wall clock (started by :meth:`start`)."""
        if self._t0 is None:
            raise RuntimeError("Provenance.finish() called before start()")
        self.wall_time_s = time.perf_counter() - self._t0
        return self

    @contextmanager
    def timed(self):
        """``with prov.timed(): ...`` records the start time and the wall time of the block."""
        self.start()
        try:
            yield self
        finally:
            self.finish()

    def to_dict(self) -> dict:
        """All fields as plain JSON-ready values."""
        out = asdict(self)
        out.pop("_t0")
        if self.window is not None:
            out["window"] = {**out["window"], "rule": self.window.describe()}
        out["chapters"] = list(self.chapters) if self.chapters else None
        out["window_offsets"] = list(self.window_offsets)
        return out

    def to_markdown(self) -> str:
        """A compact two-column Markdown table."""
        model = self.model + (f" (requested: {self.requested})" if self.requested and self.requested != self.model
                              else "")
        if self.architecture:
            model += f"; {self.model_class}, {_attention(self.architecture)}"
        if self.pretrained is False:
            model += "; random weights, not a pretrained model"
        source = f", converted from sha256 {_short(self.source_sha256)}" if self.source_sha256 and \
            self.source_sha256 != self.weights_sha256 else ""
        rows = [("model", model)] + ([("what it is", self.description)] if self.description else []) + [
            ("weights", f"sha256 {_short(self.weights_sha256)}{source}, from {self.model_source}"),
            ("tokenizer", self.tokenizer)]
        if self.window is not None:
            rows.append(("window", self.window.describe() + (" = L tokens" if self.window.specials else "")))
        if self.corpus:
            chapters = f", chapters {self.chapters[0]}-{self.chapters[1]}" if self.chapters else ""
            rows.append(("corpus", f"{self.corpus}{chapters}, sha256 {_short(self.corpus_sha256)}"))
        if self.L is not None:
            rows.append(("windows", f"L = {self.L}, offsets {_offsets(self.window_offsets)}"))
        rows += [("seed", str(self.seed)), ("device", f"{self.device}, {self.dtype}"),
                 ("versions", ", ".join(f"{k} {v}" for k, v in self.versions.items())),
                 ("environment", f"{_lock_line(self.lock)}; {_lock_line(self.models_lock)}")]
        if self.started_at:  # the run time is stated once per chapter, from the run record; here only the moment
            rows.append(("run", f"started {self.started_at}"))
        rows += [("note", n) for n in self.notes]
        lines = ["| provenance | |", "|---|---|"]
        lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows]
        return "\n".join(lines)


def _attention(a: dict) -> str:
    """The architecture in words: layers, heads and their sharing, head dimension, masks, positions, context."""
    heads = f"{a.get('n_heads')} heads"
    if a.get("n_kv_heads") not in (None, a.get("n_heads")):
        heads += f" ({a['n_kv_heads']} kv: {a['n_heads'] // a['n_kv_heads']} query heads share each)"
    text = f"{a.get('n_layers')} layers x {heads}, head dim {a.get('head_dim')}"
    if a.get("sliding_layers"):
        text += (f", global layers {', '.join(map(str, a['global_layers']))}, the other {len(a['sliding_layers'])} a "
                 f"sliding window of {a['sliding_window']} keys")
    if "causal" in a:
        text += ", causal" if a["causal"] else ", bidirectional (every row sees all L keys)"
    if a.get("qk_norm"):
        text += ", QK-norm"
    if a.get("positions"):
        text += f", {a['positions']} positions"
    return text + f", context {a.get('context_length')}"


def _lock_line(lock: dict) -> str:
    if not lock.get("sha256"):
        return "; ".join(lock.get("differ", [])) or "no lock file"
    differ = lock["differ"]
    match = (f"all {lock['pins']} pins installed" if not differ else
             f"{len(differ)} of {lock['pins']} pins differ: "
             f"{', '.join(differ[:5])}{', ...' if len(differ) > 5 else ''}")
    return f"{lock['file']} sha256 {_short(lock['sha256'])} ({match})"


def _short(sha: str) -> str:
    return f"{sha[:16]}..." if len(sha) > 16 else (sha or "n/a")


def _offsets(offsets: tuple[int, ...]) -> str:
    if len(offsets) <= 4:
        return ", ".join(map(str, offsets))
    return f"{offsets[0]}, {offsets[1]}, ..., {offsets[-1]} ({len(offsets)} windows)"
