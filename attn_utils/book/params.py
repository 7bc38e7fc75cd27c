"""Notebook parameters: one specification, one check per run, one frozen result that travels down.

:data:`SPECS` says what each parameter accepts, :data:`RULES` how parameters bound one another and the :data:`FACTS`
of the model, the corpus and the machine that some rules read. Every rule lives here and nowhere else: below the
book layer only shapes and types are checked.

A run is checked once, before anything executes: ``attn-companion`` (``attn_utils.book.build.preflight``) calls
:func:`resolve` on each notebook's values (its defaults with what was passed over them), which reads the facts
(``model='auto'`` is resolved there, once) and returns a frozen :class:`Parameters`. The executed notebook receives
that result through :func:`checked` in the cell after its parameters, and ``Session.open(p)`` takes it as it is.
Run by hand, the notebook's :func:`checked` does the same check itself.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any
from collections.abc import Callable, Mapping

from attn_utils.normalizer_names import COMPARED as NORMALIZER_NAMES


@dataclass(frozen=True)
class Spec:
    """What one parameter accepts: ``check(value)`` returns True when ``value`` is allowed."""

    allowed: str
    check: Callable[[Any], bool]
    doc: str


def _is_int(v, lo=None, hi=None) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)
            and (lo is None or v >= lo) and (hi is None or v <= hi))


def _is_real(v, lo=None, hi=None, open_lo=False) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return False
    if lo is not None and (v <= lo if open_lo else v < lo):
        return False
    return hi is None or v <= hi


def _int_list(lo, increasing=False):
    def check(v):
        if not isinstance(v, (list, tuple)) or not v or not all(_is_int(x, lo) for x in v):
            return False
        return not increasing or all(a < b for a, b in zip(v, v[1:]))
    return check


def _in_list(lo: float, hi: float) -> Callable[[Any], bool]:
    def check(v) -> bool:
        return isinstance(v, (list, tuple)) and bool(v) and all(_is_real(x, lo) and x <= hi for x in v)
    return check


#: the range of temperatures, perturbation sizes and standard deviations: every one divides or multiplies logits of
#: size 1e-3..1e3, and l / T, T * l, l + eps then stay within about 1e-9..1e9, where float64 softmax weights and
#: their finite differences neither overflow nor underflow (T = 1e-300 gives l / T = inf).
SCALE_RANGE = (1e-6, 1e6)
#: the range of the radius M: M^2 and the squared distances of points on the sphere (up to 4 M^2) stay normal
#: float64 numbers (about 1e-200..4e200; M = 1e-300 gives a selective ball of radius 0).
RADIUS_RANGE = (1e-100, 1e100)
#: the largest seed: torch's generators take a signed 64-bit seed
MAX_SEED = 2**63 - 1
#: the largest corpus file read (War and Peace is 3.3 MB)
MAX_CORPUS_BYTES = 256 * 2**20


def _corpus(v) -> bool:
    if v == "war-and-peace":
        return True
    try:
        path = Path(v).expanduser()
        return path.is_file() and path.stat().st_size <= MAX_CORPUS_BYTES
    except (TypeError, ValueError, OSError):  # not a string, a NUL in the name, a name too long
        return False


def _chapters(v) -> bool:
    return v is None or (isinstance(v, (list, tuple)) and len(v) == 2 and _is_int(v[0], 1) and _is_int(v[1], 1)
                         and v[0] <= v[1])


SPECS: dict[str, Spec] = {
    "model": Spec("'auto', 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl', 'distilgpt2', 'smollm2-135m', "
                  "'gpt2-random', a Hugging Face id or a local folder",
                  lambda v: isinstance(v, str) and bool(v.strip()),
                  "the model whose attention is measured; 'auto' takes GPT-2 when it can be had, SmolLM2 otherwise"),
    "corpus": Spec(f"'war-and-peace' or the path of a UTF-8 text file of at most {MAX_CORPUS_BYTES // 2**20} MiB",
                   _corpus,
                   "the text fed to the model"),
    "chapters": Spec("None or [first, last] with 1 <= first <= last", _chapters,
                     "consecutive chapters of the novel (1-based, counted across its books); None = whole novel"),
    "offset": Spec("an integer >= 0", lambda v: _is_int(v, 0), "first token of the window in the tokenized text"),
    "L": Spec("an integer >= 2", lambda v: _is_int(v, 2),
              "window length in tokens"),
    "lengths": Spec("a non-empty increasing list of integers >= 2", _int_list(2, increasing=True),
                    "the grid of window lengths measured on the model"),
    "synthetic_lengths": Spec("a non-empty increasing list of integers >= 2", _int_list(2, increasing=True),
                              "the grid of row lengths of the synthetic checks (independent of L)"),
    "N": Spec("an integer >= 1", lambda v: _is_int(v, 1), "size of the top-N set"),
    "Ns": Spec("a non-empty increasing list of integers >= 1", _int_list(1, increasing=True),
               "the grid of top-N sizes"),
    "Ts": Spec(f"a non-empty list of numbers in [{SCALE_RANGE[0]:g}, {SCALE_RANGE[1]:g}]", _in_list(*SCALE_RANGE),
               "the grid of temperatures"),
    "epsilons": Spec(f"a non-empty list of numbers in [{SCALE_RANGE[0]:g}, {SCALE_RANGE[1]:g}]",
                     _in_list(*SCALE_RANGE), "logit perturbation sizes of g(T, eps)"),
    "ks_alpha": Spec("a number in (0, 1)", lambda v: _is_real(v, 0, 1, open_lo=True) and v < 1,
                     "significance level of the Kolmogorov-Smirnov test of Algorithm 3"),
    "seed": Spec("an integer in [0, 2**63 - 1]", lambda v: _is_int(v, 0, MAX_SEED), "seed of every random draw"),
    "n_samples": Spec("an integer >= 1", lambda v: _is_int(v, 1), "Monte-Carlo samples"),
    "n_trials": Spec("an integer >= 1", lambda v: _is_int(v, 1), "random synthetic instances"),
    "sigmas": Spec(f"a non-empty list of numbers in [{SCALE_RANGE[0]:g}, {SCALE_RANGE[1]:g}]", _in_list(*SCALE_RANGE),
                   "standard deviations of the N(0, sigma^2) logits of synthetic rows"),
    "M": Spec(f"a number in [{RADIUS_RANGE[0]:g}, {RADIUS_RANGE[1]:g}]", lambda v: _is_real(v, *RADIUS_RANGE),
              "radius of the sphere of Assumption 1"),
    "vectors": Spec("'value', 'key' or 'query'", lambda v: v in ("value", "key", "query"),
                    "which per-head vectors play the role of the x_i"),
    "logit_scale": Spec("'raw' (q.k) or 'model' (q.k times the model's scaling)", lambda v: v in ("raw", "model"),
                        "the scale of the logits l on which temperatures act"),
    "distance_reading": Spec("'sum_of_norms' or 'norm_of_sum'", lambda v: v in ("sum_of_norms", "norm_of_sum"),
                             "which reading of the cumulative distance (Eq. 7) is measured"),
    "normalizers": Spec(f"a non-empty list drawn from {list(NORMALIZER_NAMES)}",
                        lambda v: isinstance(v, (list, tuple)) and bool(v) and all(x in NORMALIZER_NAMES for x in v),
                        "the normalizers compared"),
    "rows_per_octave": Spec("None (every query row) or an integer >= 1", lambda v: v is None or _is_int(v, 1),
                            "query rows sampled per octave of positions [2^k, 2^(k+1)) in the distance experiments"),
    "device": Spec("'auto', 'cpu', 'cuda' or 'cuda:N'", lambda v: isinstance(v, str)
                   and re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", v) is not None,
                   "where the model and the analysis run; 'auto' takes the first CUDA GPU when there is one, else "
                   "the CPU"),
    "models": Spec("'auto' or a non-empty list of distinct model names (each as model accepts)",
                   lambda v: v == "auto" or (isinstance(v, (list, tuple)) and bool(v) and len(set(v)) == len(v)
                                             and all(isinstance(m, str) and m.strip() and m != "auto" for m in v)),
                   "the models of a book build: every model chapter is executed on each (its page shows the first, "
                   "the others in its last section and in the ledger); 'auto' is gpt2 when it can be had, then the "
                   "embedded smollm2-135m, gemma3-270m and minilm-l6"),
    "long_lengths": Spec("None or a non-empty increasing list of integers >= 3",
                         lambda v: v is None or _int_list(3, increasing=True)(v),
                         "windows longer than L for the long-context measurements (chapter ch6_beyond)"),
}


# fact -> (the parameters it is read from, what it is); attn-companion reads them before any notebook runs
FACTS = {
    "model_choice": (("model",), "the model that model='auto' stands for, and why (read once, by the preflight)"),
    "context": (("model",), "the model's context length in tokens, from its configuration"),
    "corpus_tokens": (("model", "corpus"), "the tokens of the corpus (its chapters) under the model's tokenizer"),
    "cuda_devices": (("device",), "the number of CUDA GPUs that torch sees on this machine"),
    "memory": ((), "the memory available on this machine, in bytes (MemAvailable of /proc/meminfo, within the "
                   "cgroup's limit)"),
}
#: facts the rules read that are not recorded in :class:`Parameters` (they change from moment to moment, and no
#: result depends on them: recorded, they would change every cache key)
UNRECORDED = frozenset({"memory"})


#: the embedded pretrained models, in the order of a build's models after gpt2 (attn_utils.models.embedded)
EMBEDDED_MODELS = ("smollm2-135m", "gemma3-270m", "minilm-l6")


def book_models(models: Any = "auto", *, model: str | None = None, cache: dict | None = None) -> tuple[str, ...]:
    """The models a build measures, first the one its pages show: ``models`` checked against its spec, with
    ``'auto'`` resolved once (``gpt2`` first when it can be had, then :data:`EMBEDDED_MODELS`; ``cache`` is the
    preflight's, so the hub is asked once per build). A ``model`` given to the build (``PARAMS="model=X"``) alone means
    ``(X,)``; with ``models`` too it is an error."""
    if model is not None:
        if models != "auto":
            raise ParameterError(("models", "model"), "give the build models (several) or model (one), not both")
        return (model,)
    if not SPECS["models"].check(models):
        raise ParameterError(("models",), f"parameter models must be {SPECS['models'].allowed}, got {models!r}")
    if models != "auto":
        for name in models:
            if not SPECS["model"].check(name):
                raise ParameterError(("models",), f"parameter models: {name!r} is not a model name")
        return tuple(models)
    first = _FactReader({} if cache is None else cache).once(("auto",), _FactReader._auto)[0]
    return tuple(dict.fromkeys((first, *EMBEDDED_MODELS)) if first == "gpt2" else EMBEDDED_MODELS)


class ParameterError(ValueError):
    """An invalid parameter value; ``names`` are the parameters (and facts) that the failed check involves, ``facts``
    the facts read until then."""

    def __init__(self, names: tuple[str, ...], message: str, facts: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.names = names
        self.facts = dict(facts or {})


@dataclass(frozen=True)
class Rule:
    """A rule between parameters (and :data:`FACTS`): ``derive`` maps their values to the value of ``names[0]``
    that the notebook uses, raising ``ValueError`` when there is none; ``states`` says it in words."""

    names: tuple[str, ...]
    derive: Callable[..., Any]
    states: str


def _kept(name: str, limit: str, keep: Callable[[Any, Any], bool], relation: str) -> Callable[..., list]:
    def derive(values, bound):
        kept = [v for v in values if keep(v, bound)]
        if not kept:
            raise ValueError(f"parameter {name} keeps no value {relation} {limit} = {bound}: got {list(values)}; "
                             f"give at least one value {relation} {bound}")
        return kept
    return derive


def _n_below_l(N, L):
    if N >= L:
        raise ValueError(f"parameter N must be below L = {L}, got {N}")
    return N


def _l_in_context(L, context):
    if L > context:
        raise ValueError(f"parameter L must be at most the model's context of {context} tokens, got {L}")
    return L


def _long_lengths(long_lengths, L, context):
    if long_lengths is None:
        return [m * L for m in (2, 4) if m * L <= context]
    if not all(L < v <= context for v in long_lengths):
        within = (f"lengths in [{L + 1}, {context}] (above L = {L}, within the model's context of {context} tokens)"
                  if context > L else f"None: the model's context of {context} tokens leaves no length above L = {L}")
        raise ValueError(f"parameter long_lengths must be {within}, got {long_lengths!r}")
    return list(long_lengths)


def _device_present(device, cuda_devices):
    index = int(device.partition(":")[2] or 0)
    if device.startswith("cuda") and index >= cuda_devices:
        have = f"only {cuda_devices} CUDA GPU(s)" if cuda_devices else "no CUDA GPU"
        raise ValueError(f"parameter device = {device!r} needs a CUDA GPU, but torch sees {have} here; use "
                         "device='auto' (the GPU when there is one, else the CPU) or 'cpu'")
    return device


def available_memory() -> int | None:
    """The bytes of memory this process may still take: ``MemAvailable`` of ``/proc/meminfo``, at most what the
    cgroup (v2 ``memory.max`` less ``memory.current``) leaves; ``None`` where neither can be read."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _bytes(n: float) -> str:
    """``n`` bytes in words: 8e+12 B -> '8 TB'."""
    k = min(max(int(math.log10(n) // 3), 0), 5) if n >= 1 else 0
    return f"{n / 1000 ** k:.3g} {('B', 'kB', 'MB', 'GB', 'TB', 'PB')[k]}"


def _fits(name: str, per_item: int, what: str) -> Callable[[int, int], int]:
    """The rule that ``value`` items of at least ``per_item`` bytes each (``what``) fit in the available memory."""
    def derive(value, memory):
        need = value * per_item
        if need > memory:
            raise ValueError(f"parameter {name} = {value} needs at least {_bytes(need)} of memory ({what}), but "
                             f"{_bytes(memory)} are available here; lower {name}")
        return value
    return derive


def _window_in_corpus(offset, L, tokens):
    if offset + L > tokens:
        raise ValueError(f"parameters offset + L = {offset} + {L} = {offset + L} exceed the {tokens} tokens of the "
                         "corpus; lower offset or L, or use a longer text (more chapters)")
    return offset


RULES: tuple[Rule, ...] = (  # in this order: a rule may use a value that an earlier one derived
    Rule(("N", "L"), _n_below_l, "N must be below L"),
    Rule(("lengths", "L"), _kept("lengths", "L", lambda v, b: v <= b, "<="),
         "values of lengths above L are dropped; at least one must remain"),
    Rule(("lengths", "N"), _kept("lengths", "N", lambda v, b: v > b, ">"),
         "values of lengths not above N are dropped (a top-N set needs more than N keys); at least one must remain"),
    Rule(("Ns", "L"), _kept("Ns", "L", lambda v, b: v < b, "<"),
         "values of Ns not below L are dropped (a causal row needs more than N keys); at least one must remain"),
    Rule(("L", "context"), _l_in_context, "L must be at most the model's context (read from its configuration)"),
    Rule(("long_lengths", "L", "context"), _long_lengths,
         "long_lengths None means 2L and 4L, those within the model's context; a list must hold increasing lengths "
         "in [L + 1, context]"),
    Rule(("device", "cuda_devices"), _device_present,
         "device 'cuda' or 'cuda:N' needs that GPU here; 'auto' takes the GPU when there is one, else the CPU"),
    Rule(("n_trials", "memory"), _fits("n_trials", 8, "every synthetic instance keeps at least one float64 result"),
         "n_trials x 8 bytes (at least one float64 result kept per instance) must fit in the available memory"),
    Rule(("n_samples", "memory"), _fits("n_samples", 8, "every Monte-Carlo sample keeps at least one float64"),
         "n_samples x 8 bytes (at least one float64 kept per sample) must fit in the available memory"),
    Rule(("offset", "L", "corpus_tokens"), _window_in_corpus,
         "offset + L must not exceed the tokens of the corpus (its chapters) under the model's tokenizer"),
)


def _frozen(value: Any) -> Any:
    """``value`` with every list made a tuple (JSON gives lists back; :class:`Parameters` holds tuples)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def thawed(value: Any) -> Any:
    """``value`` with every tuple made a list again: a value as a notebook's parameters cell writes it."""
    return [thawed(v) for v in value] if isinstance(value, tuple) else value


class Parameters(Mapping):
    """The checked parameters of one run, frozen: the values the notebook uses (with the values that :data:`RULES`
    derived; lists as tuples), read as ``p.L`` or ``p["L"]``. ``given`` holds the values the run was given (the
    notebook's defaults with what was passed over them) and ``facts`` the :data:`FACTS` that were read for the
    rules, and ``model_choice``: the model that ``model='auto'`` stands for, and why.

    Made by :func:`validate` (facts given) or :func:`resolve` (facts read), once per run: the build's preflight
    hands it to the executed notebook (:func:`checked`), and ``Session.open(p)`` takes it as it is."""

    def __init__(self, values: Mapping[str, Any], given: Mapping[str, Any] | None = None,
                 facts: Mapping[str, Any] | None = None):
        object.__setattr__(self, "_values", {k: _frozen(v) for k, v in values.items()})
        object.__setattr__(self, "given", MappingProxyType({k: _frozen(v) for k, v in (given or values).items()}))
        object.__setattr__(self, "facts", MappingProxyType({k: _frozen(v) for k, v in (facts or {}).items()}))

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no parameter {name!r}; the parameters are {sorted(self._values)}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Parameters are frozen: validate new values instead")

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Parameters({self._values!r})"

    def __eq__(self, other) -> bool:
        if isinstance(other, Parameters):
            return (self._values, dict(self.given), dict(self.facts)) == (other._values, dict(other.given),
                                                                             dict(other.facts))
        return NotImplemented

    __hash__ = None

    @property
    def model_name(self) -> str:
        """The model measured: ``model`` with ``auto`` resolved (from the facts, when they were read)."""
        return self.facts["model_choice"][0] if "model_choice" in self.facts else self._values["model"]

    def __reduce__(self):
        return Parameters.from_json, (self.to_json(),)

    def to_json(self) -> str:
        return json.dumps({"values": self._values, "given": dict(self.given), "facts": dict(self.facts)})

    @classmethod
    def from_json(cls, text: str) -> Parameters:
        data = json.loads(text)
        return cls(data["values"], data["given"], data["facts"])


def validate(*, facts: Mapping[str, Any] | None = None, **values: Any) -> Parameters:
    """Check every given parameter against :data:`SPECS`, then every rule of :data:`RULES` whose parameters are given
    (rules on :data:`FACTS` apply when ``facts`` has them); raise :class:`ParameterError` naming the first bad one.
    Returns the values the notebook uses (``Ns`` not below ``L`` dropped...)."""
    return _check(values, lambda name, known: (facts or {}).get(name))


def resolve(values: Mapping[str, Any], *, cache: dict | None = None) -> Parameters:
    """:func:`validate` with the :data:`FACTS` read as the rules need them: the model ``auto`` stands for (said on
    the terminal), its context from its configuration (no weights are loaded), the corpus tokenized as far as the
    window needs, the CUDA GPUs. ``cache`` keeps models, tokenizers and texts between the runs of one preflight."""
    return _check(dict(values), _FactReader({} if cache is None else cache).read)


#: the sizes of the synthetic checks in runs whose synthetic parts are not shown (the windows of attn-companion windows,
#: a build's executions on its other models): a tenth of the defaults; the model parts do not read them
SHORT_SYNTHETIC = {
    "ch1_vanishing": {"n_trials": 20},
    "ch2_distance": {"n_trials": 300, "n_samples": 64},
    "ch3_separability": {"n_trials": 10},
    "ch4_gradient": {"n_trials": 300},
    "ch6_beyond": {"n_trials": 20},
}


def resolve_on(model: str, values: Mapping[str, Any], *, cache: dict | None = None,
               notebook: str | None = None) -> Parameters:
    """:func:`resolve` of a notebook's ``values`` on another model of the build (not the first): its ``L`` is lowered
    to that model's context where it exceeds it (an encoder of 512 positions reads 512 tokens where the book's pages
    read 1024), and the rules derive the rest from that (the lengths above L dropped...). The first model keeps the
    given L, which must fit its context. With ``notebook``, a run of the build on another model: its synthetic checks
    run at most at :data:`SHORT_SYNTHETIC` (they are shown, and recorded, by the page's run) and the fact ``variant``
    says so (the notebook then records no synthetic claim)."""
    values = {**values, "model": model}
    for name, short in SHORT_SYNTHETIC.get(notebook or "", {}).items():
        if name in values and _is_int(values[name]):
            values[name] = min(values[name], short)
    if "L" in values and _is_int(values["L"], 2):
        cache = {} if cache is None else cache
        context = _FactReader(cache).read("context", values)
        if context is not None and values["L"] > context:
            values["L"] = context
    q = resolve(values, cache=cache)
    return q if notebook is None else Parameters(q._values, q.given, {**q.facts, "variant": True})


def _check(values: dict[str, Any], fact: Callable[[str, dict], Any]) -> Parameters:
    """The one check: specs, then rules in order; a fact a rule needs is asked of ``fact(name, values so far)``
    (``None``: not known, and the rules on it do not apply)."""
    for name, value in values.items():
        spec = SPECS.get(name)
        if spec is None:
            raise ParameterError((name,), f"unknown parameter {name!r}; known parameters: {sorted(SPECS)}")
        if not spec.check(value):
            raise ParameterError((name,), f"parameter {name} must be {spec.allowed}, got {value!r}")
    known, facts = dict(values), {}

    def read(name: str) -> None:
        if name in FACTS and name not in facts:
            found = fact(name, known)
            if found is not None:
                facts[name] = found

    if known.get("model") == "auto":
        read("model_choice")
    for rule in RULES:
        for name in rule.names:
            read(name)
        if all(n in known or n in facts for n in rule.names):
            try:
                known[rule.names[0]] = rule.derive(*(known[n] if n in known else facts[n] for n in rule.names))
            except ValueError as err:
                raise ParameterError(rule.names, str(err), facts) from None
    return Parameters(known, values, {k: v for k, v in facts.items() if k not in UNRECORDED})


class _FactReader:
    """Reads the :data:`FACTS` of a run's values; torch and transformers are imported only when a fact is read."""

    def __init__(self, cache: dict):
        self.cache = cache

    def once(self, key: tuple, read: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = read()
        return self.cache[key]

    def read(self, name: str, known: dict[str, Any]) -> Any:
        if not all(s in known for s in FACTS[name][0]):
            return None
        if name == "memory":
            return available_memory()
        if name == "cuda_devices":
            import torch

            return self.once(("cuda",), torch.cuda.device_count)
        if name == "model_choice":
            return self.once(("auto",), self._auto)
        from attn_utils.models.loading import load_tokenizer, model_context

        model = self.once(("auto",), self._auto)[0] if known["model"] == "auto" else known["model"]
        if name == "context":
            return self.once(("context", model), lambda: self._of_model(model, model_context))
        if name == "corpus_tokens":
            from attn_utils.models.corpus import count_tokens, load_text

            corpus, chapters = known["corpus"], known.get("chapters")
            tokenizer = self.once(("tokenizer", model), lambda: self._of_model(model, load_tokenizer))
            try:
                text = self.once(("text", corpus, str(chapters)), lambda: load_text(
                    None if corpus == "war-and-peace" else corpus, chapters=tuple(chapters) if chapters else None).text)
            except (OSError, ValueError) as err:
                within = f", chapters = {list(chapters)}" if chapters else ""
                raise ParameterError(("corpus",), f"corpus = {corpus!r}{within}: {err}") from None
            needed = known.get("offset", 0) + known["L"]
            return self.once(("tokens", model, corpus, str(chapters), needed),
                             lambda: count_tokens(text, tokenizer, needed))
        return None

    @staticmethod
    def _auto() -> tuple[str, str]:
        from attn_utils.models.loading import choose_auto

        name, why = choose_auto()
        print(f"model 'auto' -> {name}: {why}", flush=True)
        return name, why

    @staticmethod
    def _of_model(model: str, read: Callable[[str], Any]) -> Any:
        try:
            return read(model)
        except OSError as err:  # a folder without its configuration or tokenizer files
            raise ParameterError(("model",), f"model {model!r}: {err}") from None


#: the environment variable by which a build, run or sweep hands a notebook the Parameters its preflight checked
PARAMETERS_ENV = "ATTN_COMPANION_PARAMETERS"


def checked(**values: Any) -> Parameters:
    """The parameters of the running notebook (every one it declares), checked once.

    In a build, run or sweep, the preflight has checked them already and left its :class:`Parameters` in the file
    named by ``$ATTN_COMPANION_PARAMETERS``: they are returned as they are, once it is sure that they are the values
    this notebook holds (a ``RuntimeError`` otherwise). Run by hand (Jupyter, papermill), the values are checked
    here, facts included (:func:`resolve`)."""
    path = os.environ.get(PARAMETERS_ENV)
    if not path:
        return resolve(values)
    p = Parameters.from_json(Path(path).read_text())
    if dict(p.given) != {k: _frozen(v) for k, v in values.items()}:
        raise RuntimeError(f"the parameters this notebook holds, {values}, are not those its preflight checked, "
                           f"{dict(p.given)} (${PARAMETERS_ENV} = {path})")
    return p


def describe(defaults: dict[str, Any]) -> str:
    """What a notebook's parameters (name -> default) accept: for each, its meaning, allowed values, default (and the
    value its rules derive from the defaults) and the rules that involve it, as text for ``attn-companion params``."""
    try:
        derived = validate(**defaults)
    except ValueError:
        derived = defaults
    available = set(defaults) | {fact for fact, (sources, _) in FACTS.items() if set(sources) <= set(defaults)}
    lines = []
    for name, default in defaults.items():
        spec = SPECS.get(name, Spec("? (not in attn_utils.book.params.SPECS)", bool, "?"))
        used = f" (used: {thawed(derived[name])!r})" if thawed(derived[name]) != default else ""
        lines += [f"  {name} = {default!r}{used}", f"      {spec.doc}", f"      allowed: {spec.allowed}"]
        lines += [f"      rule: {rule.states}" for rule in RULES if set(rule.names) <= available
                  and (name in rule.names or any(name in FACTS[f][0] for f in rule.names if f in FACTS))]
    return "\n".join(lines)
