"""What every model experiment of the book starts from: a model, a window of the corpus, a provenance record.

``Session.open(p)`` (``p``: the checked parameters of a notebook) loads the model (``attn_utils.models.loading``),
cuts the window (``attn_utils.models.corpus``), starts the provenance clock, and then captures attention layer by
layer (``attn_utils.models.capture``) in the form the paper's algorithms take: ``(layers, heads, L, L)`` weights
and logits, ``(layers, heads, L, d)`` vectors.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from collections.abc import Iterable

import torch

from attn_utils.book import runlog
from attn_utils.models.capture import AttentionCapture, LayerCapture, capture_all
from attn_utils.models.corpus import Corpus, load_text, model_windows
from attn_utils.models.loading import load_model, visible_keys
from attn_utils.book.params import Parameters, resolve
from attn_utils.models.provenance import Provenance

VECTOR_FIELD = {"value": "v", "key": "k", "query": "q"}
#: what :meth:`Session.open` assumes for the values it is not given
OPEN_DEFAULTS = {"model": "auto", "corpus": "war-and-peace", "chapters": None, "offset": 0, "L": 1024, "seed": 0,
                 "device": "auto"}


@dataclass
class Session:
    """A loaded model and one token window of a corpus, with the provenance of everything measured on it."""

    model: torch.nn.Module
    tokenizer: object
    provenance: Provenance
    corpus: Corpus
    input_ids: torch.Tensor  # (L,)

    @classmethod
    def open(cls, p: Parameters | None = None, /, **values) -> Session:
        """Open the model and window of the checked parameters ``p`` (``model``, ``corpus``, ``chapters``, ``offset``,
        ``L``, ``seed``, ``device``; from a notebook's :func:`~attn_utils.book.params.checked` or the build's
        preflight), taken as they are. Without ``p``, ``values`` over :data:`OPEN_DEFAULTS` are checked here
        (:func:`~attn_utils.book.params.resolve`).

        ``model`` is loaded on ``device`` (``"auto"``: the GPU when there is one, else the CPU) and the window of ``L``
        tokens of ``corpus`` starting at token ``offset`` is cut. The forward passes run on that device, and the
        captured tensors stay there: the analysis (``attn_utils.mathematics``, which makes every tensor on the
        device of its inputs) runs there too, in float64 where a bound is checked; tables and figures read them
        through ``.cpu()``."""
        if p is None:
            p = resolve({**OPEN_DEFAULTS, **values})
        elif values:
            raise TypeError("Session.open takes checked Parameters or keyword values, not both")
        choice = p.facts.get("model_choice")
        net, tokenizer, prov = load_model(p.model, device=p.device, seed=p.seed,
                                          chosen=tuple(choice) if choice else None)
        prov.start()
        prov.seed = p.seed
        text = load_text(None if p.corpus == "war-and-peace" else p.corpus,
                         chapters=tuple(p.chapters) if p.chapters else None)
        ids = model_windows(text, tokenizer, p.L, prov.window, offset=p.offset)[0].to(prov.device)
        prov.add_corpus(text, L=p.L, offset=p.offset)
        return cls(net, tokenizer, prov, text, ids)

    @property
    def name(self) -> str:
        """The model actually measured (``auto`` resolved)."""
        return self.provenance.model

    @property
    def description(self) -> str:
        """One line: class, layers, heads, head dimension, context, and whether the weights are pretrained."""
        a = self.provenance.architecture
        kv = f" ({a['n_kv_heads']} key/value heads)" if a["n_kv_heads"] != a["n_heads"] else ""
        kind = "pretrained weights" if self.provenance.pretrained else "random weights, not a pretrained model"
        return (f"{self.provenance.model_class} with {a['n_layers']} layers of {a['n_heads']} heads{kv}, "
                f"head dimension {a['head_dim']}, context {a['context_length']} tokens, {kind}")

    @property
    def choice(self) -> str:
        """How the model was chosen, as plain sentences for the book (the technical reason stays in the provenance)."""
        if self.provenance.requested != "auto":
            return f"It was requested explicitly (model='{self.provenance.requested}')."
        if self.name == "gpt2":
            return "It was chosen by model='auto': GPT-2 small, the paper's own model."
        return ("GPT-2, the paper's model, could not be loaded on the machine that built this book (the Hugging Face "
                "hub was unreachable), so model='auto' took SmolLM2-135M-Instruct, an instruction-tuned model whose "
                "Q4_1-quantised weights are dequantised to float32. The technical reason is in each chapter's "
                "provenance table.")

    @property
    def causal(self) -> bool:
        """Whether a query row sees only the keys up to it (a decoder); False for an encoder, whose rows see all L."""
        return bool(self.provenance.architecture["causal"])

    @property
    def layers(self) -> list[int]:
        """The layers measured, by the book's rule for a fair comparison: those in which every query row sees all the
        keys of its causal prefix in this window (every layer of GPT-2 and SmolLM2; on Gemma 3 a sliding-window layer
        only while L is within its window, so at L = 1024 its 3 global layers), or, on an encoder, all L keys (every
        layer). :meth:`capture` takes these unless told otherwise."""
        a, L = self.provenance.architecture, self.L
        return [layer for layer in range(a["n_layers"]) if layer not in a["sliding_layers"]
                or a["sliding_window"] >= L]

    def visible(self, layer: int | None = None) -> torch.Tensor:
        """``(L, L)`` booleans on the capture's device: the keys each query row of ``layer`` (default: the first of
        :attr:`layers`) sees: the causal prefix, or every key on an encoder (``loading.visible_keys``)."""
        layer = self.layers[0] if layer is None else layer
        return visible_keys(self.provenance.architecture, layer, self.L).to(self.input_ids.device)

    @property
    def layers_note(self) -> str:
        """One sentence for the prose: which layers are measured and why (empty when they are all of them)."""
        a = self.provenance.architecture
        if len(self.layers) == a["n_layers"]:
            return ""
        return (f"On {self.name} only the {len(self.layers)} layers {', '.join(map(str, self.layers))} are measured: "
                f"in its other {a['n_layers'] - len(self.layers)} layers a row sees at most the last "
                f"{a['sliding_window']} keys (a sliding window), so at L = {self.L} a row would not see its whole "
                "prefix, which every claim here assumes.")

    @property
    def n_layers(self) -> int:
        """The number of layers measured (:attr:`layers`)."""
        return len(self.layers)

    @property
    def L(self) -> int:
        return int(self.input_ids.shape[-1])

    def summary(self) -> dict:
        """The facts of the model and the window, for a small table."""
        a = self.provenance.architecture
        measured = a["n_layers"] if len(self.layers) == a["n_layers"] else \
            f"{a['n_layers']} ({len(self.layers)} measured: {', '.join(map(str, self.layers))})"
        return {"model": self.name, "what it is": self.provenance.description.split(";")[0],
                "class": self.provenance.model_class, "layers": measured,
                "heads": a["n_heads"], "key/value heads": a["n_kv_heads"], "head dim": a["head_dim"],
                "context": a["context_length"], "pretrained": self.provenance.pretrained,
                "attention": "causal" if a["causal"] else "bidirectional (an encoder)",
                "window": f"tokens {self.provenance.window_offsets[0]}.."
                          f"{self.provenance.window_offsets[0] + self.L - 1} of {self.corpus.name}"}

    def capture(self, *, layers: int | Iterable[int] | None = None, what: Iterable[str] = ("weights",),
                dtype: torch.dtype = torch.float32, logit_scale: str = "raw") -> AttentionCapture:
        """Capture ``what`` (fields of :data:`attn_utils.models.capture.FIELDS`) for ``layers`` (default
        :attr:`layers`, the layers measured), stacked.

        ``logit_scale`` is the scale of the logits: ``"raw"`` keeps ``q.k``, on which the model's temperature
        (``captured.temperature``) is ``1 / scaling``; ``"model"`` returns ``q.k * scaling``, what the model's
        softmax sees, with ``scaling`` set to 1, so that the model's temperature on that scale is 1. On both scales
        ``softmax(logits * scaling + mask)`` gives the model's weights."""
        layers = self.layers if layers is None else layers
        captured = capture_all(self.model, self.input_ids, layers=layers, dtype=dtype, what=what)
        if logit_scale == "raw":
            return captured
        if logit_scale != "model":
            raise ValueError(f"logit_scale is 'raw' or 'model', got {logit_scale!r}")
        logits = captured.logits
        if logits is not None:
            logits = logits * captured.scaling.to(logits).view(-1, 1, 1, 1)  # on the logits' device and dtype
        return replace(captured, logits=logits, scaling=torch.ones_like(captured.scaling))

    def capture_layer(self, layer: int, *, what: Iterable[str] = ("weights",),
                      dtype: torch.dtype = torch.float64) -> LayerCapture:
        """One layer's capture as ``(1, heads, L, ...)`` tensors."""
        stacked = self.capture(layers=[layer], what=what, dtype=dtype)
        # stacked tensors are (layers, ...); LayerCapture holds (batch, ...) and its mask is (batch, 1, L, L)
        fields = {f: getattr(stacked, f)[:1, None] if f == "mask" else getattr(stacked, f)[:1] for f in what}
        return LayerCapture(layer=layer, scaling=float(stacked.scaling[0]), **fields)

    def vectors(self, captured: AttentionCapture, which: str = "value") -> torch.Tensor:
        """The per-head vectors playing the role of the paper's x_i: values (default), keys or queries."""
        if which not in VECTOR_FIELD:
            raise ValueError(f"which is one of {list(VECTOR_FIELD)}, got {which!r}")
        return getattr(captured, VECTOR_FIELD[which])

    @property
    def context(self) -> int:
        """The longest window the model accepts (its context length, in tokens)."""
        return int(self.provenance.architecture["context_length"])

    def longer(self, length: int) -> Session:
        """The same model reading a longer window: ``length`` tokens of the same corpus from the same offset.

        Causal attention makes the rows t <= L of the longer window exactly those of this session's window, so one
        forward pass gives the measurements of every window length up to ``length`` (a checked value: one of
        ``p.long_lengths``, within the model's context). The first L tokens of the new window must be this session's
        window (``RuntimeError`` otherwise; an encoder reads a new window per length: :meth:`window`). The model and
        the provenance are shared; the provenance records the longer window. ``length == L`` returns this session."""
        if length == self.L:
            return self
        longer = self.window(length)
        if not self.causal or not torch.equal(longer.input_ids[:self.L], self.input_ids):
            raise RuntimeError(f"the first {self.L} tokens of the {length}-token window are not the {self.L}-token "
                               "window: " + ("an encoder's rows depend on the whole window" if not self.causal else
                                             "the tokenization of the corpus is not stable"))
        return longer

    def window(self, length: int) -> Session:
        """The same model reading a window of ``length`` tokens (as the model reads one: its special tokens
        included) from the same offset: on an encoder, whose rows depend on the whole window, one forward pass per
        length. The model and the provenance are shared; the provenance records the window."""
        offset = self.provenance.window_offsets[0]
        ids = model_windows(self.corpus, self.tokenizer, length, self.provenance.window, offset=offset)[0]
        self.provenance.add_corpus(self.corpus, L=length, offset=offset)
        return replace(self, input_ids=ids.to(self.input_ids.device))

    def provenance_table(self):
        """Stop the clock and return the provenance as Markdown, for the end of an experiment."""
        from IPython.display import Markdown

        self.provenance.finish()
        runlog.write("provenance", f"{runlog.notebook()}--{self.name}".replace("/", "_"),
                     {**self.provenance.to_dict(), "notebook": runlog.notebook()})
        return Markdown(self.provenance.to_markdown())
