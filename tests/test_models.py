import os
import shutil
import socket
import time

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from attn_utils.models import loading
from attn_utils.models.corpus import sha256_file
from attn_utils.models.loading import KNOWN_MODELS, ModelUnavailable, context_length, load_model, resolve_device


@pytest.fixture(scope="module")
def gpt2_random():
    return load_model("gpt2-random")


@pytest.fixture
def empty_hub(monkeypatch, tmp_path):
    """An empty local Hugging Face cache."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def _tiny_gpt2_folder(folder):
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64)
    GPT2LMHeadModel._from_config(config).save_pretrained(folder)
    loading.gpt2_tokenizer().save_pretrained(folder)
    return folder


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown model 'gtp2'") as err:
        load_model("gtp2")
    for name in KNOWN_MODELS:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="unknown model None"):
        load_model(None)


def test_device_names_map_to_torch_devices():
    """'auto' is resolved here; whether a GPU is there is the preflight's rule (tests/test_params.py)."""
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(RuntimeError):  # torch's own message for a string that is no device
        resolve_device("gpu")


@pytest.mark.slow
def test_gpt2_random_is_gpt2_with_the_real_tokenizer(gpt2_random):
    model, tok, prov = gpt2_random
    assert type(model).__name__ == "GPT2LMHeadModel" and not model.training
    assert model.config._attn_implementation == "eager"
    assert tok("Hello world")["input_ids"] == [15496, 995] and len(tok) == 50257
    assert context_length(model) == tok.model_max_length == 1024
    assert prov.model == "gpt2-random" and prov.pretrained is False and prov.seed == 0
    assert prov.architecture == {"n_layers": 12, "n_heads": 12, "n_kv_heads": 12, "head_dim": 64,
                                 "context_length": 1024}
    assert prov.device == "cpu" and prov.dtype == "float32" and len(prov.weights_sha256) == 64
    assert "not a pretrained model" in prov.to_markdown()


@pytest.mark.slow
def test_gpt2_random_is_deterministic_for_a_seed(gpt2_random):
    model, _, prov = gpt2_random
    state = torch.get_rng_state()
    again, _, prov_again = load_model("gpt2-random", seed=0)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left alone
    assert prov_again.weights_sha256 == prov.weights_sha256
    assert torch.equal(again.transformer.h[3].attn.c_attn.weight, model.transformer.h[3].attn.c_attn.weight)
    other, _, prov_other = load_model("gpt2-random", seed=1)
    assert prov_other.weights_sha256 != prov.weights_sha256 and prov_other.seed == 1
    assert not torch.equal(other.transformer.h[3].attn.c_attn.weight, model.transformer.h[3].attn.c_attn.weight)


def test_local_folder_with_safetensors_loads(tmp_path):
    folder = _tiny_gpt2_folder(tmp_path / "tiny")
    model, tok, prov = load_model(str(folder))
    assert model.config._attn_implementation == "eager" and not model.training
    assert prov.model_source == str(folder.resolve()) and prov.pretrained is True
    assert prov.weights_sha256 == sha256_file(folder / "model.safetensors")
    assert context_length(model) == tok.model_max_length == 64


def test_pickled_weights_are_refused(tmp_path):
    folder = _tiny_gpt2_folder(tmp_path / "pickled")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"a pickle that must never be opened")
    with pytest.raises(ValueError, match="pytorch_model.bin; pickled weights are refused"):
        load_model(str(folder))
    with pytest.raises(ValueError, match="pytorch_model.bin; pickled weights are refused"):
        loading.model_context(str(folder))


def test_context_and_tokenizer_come_without_the_weights(tmp_path):
    folder = _tiny_gpt2_folder(tmp_path / "tiny")
    start = time.perf_counter()
    assert loading.model_context("gpt2-random") == 1024
    assert loading.model_context("smollm2-135m") == 8192  # from the GGUF metadata
    assert loading.model_context(str(folder)) == 64
    assert loading.load_tokenizer(str(folder))("Hello world")["input_ids"] == [15496, 995]
    assert loading.load_tokenizer("gpt2-random")("Hello world")["input_ids"] == [15496, 995]
    assert len(loading.load_tokenizer("smollm2-135m")) == 49152
    assert time.perf_counter() - start < 20  # a model load (the conversion of SmolLM2) takes longer
    for bad in ("gtp2", None):
        with pytest.raises(ValueError, match=f"unknown model {bad!r}"):
            loading.model_context(bad)


def test_local_hub_cache_comes_first_and_auto_takes_gpt2_from_it(monkeypatch, tmp_path):
    from huggingface_hub import constants

    commit = "0" * 40
    repo = tmp_path / "hf-cache" / "models--openai-community--gpt2"
    _tiny_gpt2_folder(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, _, prov = load_model("gpt2")
    assert (prov.model, prov.architecture["n_layers"]) == ("gpt2", 2)
    assert prov.model_source == prov.tokenizer == f"openai-community/gpt2@{commit}"
    assert loading.model_context("gpt2") == loading.model_context("auto") == 64
    _, _, prov = load_model("auto")
    assert prov.model == "gpt2" and prov.notes == ["auto: took gpt2 because GPT-2 is in the local Hugging Face cache"]
    assert loading.choose_auto() == ("gpt2", "GPT-2 is in the local Hugging Face cache")


def test_hub_id_offline_fails_at_once(monkeypatch, empty_hub):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelUnavailable, match="HF_HUB_OFFLINE is set"):
        load_model("gpt2")
    with pytest.raises(ModelUnavailable, match="HF_HUB_OFFLINE is set"):
        loading.model_context("gpt2")
    assert time.perf_counter() - start < 2


@pytest.mark.parametrize("offline", [True, False])
def test_auto_says_why_it_takes_smollm2_without_loading_anything(monkeypatch, empty_hub, offline):
    """Offline by flag, or with the network closed (as in every test), the choice is made at once and explained."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    start = time.perf_counter()
    name, why = loading.choose_auto()
    assert name == "smollm2-135m" and why.startswith("GPT-2 could not be loaded here (openai-community/gpt2 is not")
    assert ("HF_HUB_OFFLINE is set" in why) == offline and ("could not be reached" in why) != offline
    assert time.perf_counter() - start < 5


def test_silent_hub_costs_seconds_not_minutes(monkeypatch, empty_hub):
    """A hub that accepts connections but never answers: the timeout, not a hang."""
    from huggingface_hub import constants

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setattr(loading, "HUB_TIMEOUT_S", 1)
    start = time.perf_counter()
    try:
        with pytest.raises(ModelUnavailable, match="could not be reached within 1 s"):
            load_model("someone/some-model")
    finally:
        server.close()
    assert time.perf_counter() - start < 10


@pytest.mark.slow
def test_smollm2_is_the_embedded_pretrained_model():
    model, tok, prov = load_model("smollm2-135m")
    assert type(model).__name__ == "LlamaForCausalLM" and model.config._attn_implementation == "eager"
    assert prov.architecture == {"n_layers": 30, "n_heads": 9, "n_kv_heads": 3, "head_dim": 64,
                                 "context_length": 8192}
    assert prov.weights_sha256 == sha256_file(loading.smollm2_gguf()) and prov.pretrained is True
    assert len(tok) == 49152 and tok.model_max_length == 8192
    assert loading.model_context("smollm2-135m") == 8192
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    assert loading.load_tokenizer("smollm2-135m")("The capital of France is")["input_ids"] == ids[0].tolist()
    with torch.inference_mode():
        assert tok.decode(model(ids).logits[0, -1].argmax()) == " Paris"


@pytest.mark.slow
def test_auto_falls_back_to_smollm2_offline(monkeypatch, empty_hub):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    _, _, prov = load_model("auto")
    assert prov.model == "smollm2-135m" and prov.requested == "auto"
    assert any("took smollm2-135m because GPT-2 could not be loaded here" in n for n in prov.notes)
    assert "requested: auto" in prov.to_markdown()
    assert time.perf_counter() - start < 30  # the cached conversion, not a fresh one


@pytest.mark.slow
def test_damaged_smollm2_cache_is_rebuilt(monkeypatch, tmp_path):
    load_model("smollm2-135m")  # make sure a good converted copy exists
    good = next(p for p in loading.models_dir().glob("smollm2-135m-*") if loading._complete(p))
    damaged = tmp_path / good.name
    shutil.copytree(good, damaged, copy_function=os.link)
    (damaged / "model.safetensors").unlink()
    (damaged / "model.safetensors").write_bytes(b"truncated")
    assert not loading._complete(damaged)
    rebuilt = []

    def fake_convert(gguf, sha, folder):
        rebuilt.append(folder)
        shutil.rmtree(folder)
        shutil.copytree(good, folder, copy_function=os.link)

    monkeypatch.setenv("ATTN_COMPANION_MODELS", str(tmp_path))
    monkeypatch.setattr(loading, "_convert_gguf", fake_convert)
    model, _, _ = load_model("smollm2-135m")
    assert rebuilt == [damaged] and loading._complete(damaged)
