"""What produced a result: model and weights hash, tokenizer, corpus and its hash, windows, versions, seed, device,
time. ``load_model`` fills in the model part; experiments add the corpus, windows and seed and time themselves."""
from __future__ import annotations

import importlib.metadata
import platform
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone


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


@dataclass
class Provenance:
    """A record of what produced a result; ``to_markdown()`` is the table the book prints under each experiment."""

    model: str = ""                 # the model actually used, e.g. "smollm2-135m"
    requested: str = ""             # the name asked for, e.g. "auto"
    model_source: str = ""          # hub id, folder or GGUF file the weights came from
    model_class: str = ""
    pretrained: bool | None = None
    weights_sha256: str = ""
    tokenizer: str = ""
    architecture: dict = field(default_factory=dict)  # n_layers, n_heads, n_kv_heads, head_dim, context_length
    dtype: str = ""
    device: str = ""
    corpus: str = ""
    corpus_sha256: str = ""
    chapters: tuple[int, int] | None = None
    L: int | None = None
    window_offsets: tuple[int, ...] = ()
    seed: int | None = None
    versions: dict = field(default_factory=package_versions)
    started_at: str = ""            # ISO 8601, UTC
    wall_time_s: float | None = None
    notes: list[str] = field(default_factory=list)
    _t0: float | None = field(default=None, repr=False, compare=False)

    def add_corpus(self, corpus, *, L: int | None = None, offset: int = 0, n_windows: int = 1) -> Provenance:
        """Record a :class:`attn_utils.corpus.Corpus` and, if ``L`` is given, the offsets of its token windows."""
        self.corpus, self.corpus_sha256, self.chapters = corpus.name, corpus.sha256, corpus.chapters
        if L is not None:
            self.L = L
            self.window_offsets = tuple(offset + i * L for i in range(n_windows))
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
        out["chapters"] = list(self.chapters) if self.chapters else None
        out["window_offsets"] = list(self.window_offsets)
        return out

    def to_markdown(self) -> str:
        """A compact two-column Markdown table."""
        a = self.architecture
        model = self.model + (f" (requested: {self.requested})" if self.requested and self.requested != self.model
                              else "")
        if a:
            heads = f"{a.get('n_heads')} heads" + (f" ({a['n_kv_heads']} kv)" if a.get("n_kv_heads") != a.get("n_heads")
                                                   else "")
            model += (f"; {self.model_class}, {a.get('n_layers')} layers x {heads}, head dim {a.get('head_dim')}, "
                      f"context {a.get('context_length')}")
        if self.pretrained is False:
            model += "; random weights, not a pretrained model"
        rows = [("model", model),
                ("weights", f"sha256 {_short(self.weights_sha256)} from {self.model_source}"),
                ("tokenizer", self.tokenizer)]
        if self.corpus:
            chapters = f", chapters {self.chapters[0]}-{self.chapters[1]}" if self.chapters else ""
            rows.append(("corpus", f"{self.corpus}{chapters}, sha256 {_short(self.corpus_sha256)}"))
        if self.L is not None:
            rows.append(("windows", f"L = {self.L}, offsets {_offsets(self.window_offsets)}"))
        rows += [("seed", str(self.seed)), ("device", f"{self.device}, {self.dtype}"),
                 ("versions", ", ".join(f"{k} {v}" for k, v in self.versions.items()))]
        if self.wall_time_s is not None:
            rows.append(("wall time", f"{self.wall_time_s:.1f} s (started {self.started_at})"))
        rows += [("note", n) for n in self.notes]
        lines = ["| provenance | |", "|---|---|"]
        lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows]
        return "\n".join(lines)


def _short(sha: str) -> str:
    return f"{sha[:16]}..." if len(sha) > 16 else (sha or "n/a")


def _offsets(offsets: tuple[int, ...]) -> str:
    if len(offsets) <= 4:
        return ", ".join(map(str, offsets))
    return f"{offsets[0]}, {offsets[1]}, ..., {offsets[-1]} ({len(offsets)} windows)"
