import math
import os
import shutil
import socket
import time

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from attn_utils.models import embedded, loading
from attn_utils.models.corpus import load_text, model_windows, sha256_file
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
    """'auto' is resolved here; whether a GPU is there is the preflight's rule (tests/book/test_params.py)."""
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
    assert prov.architecture == {
        "n_layers": 12, "n_heads": 12, "n_kv_heads": 12, "kv_head": list(range(12)), "head_dim": 64,
        "global_layers": list(range(12)), "sliding_layers": [], "sliding_window": None, "causal": True,
        "positions": "learned absolute", "qk_norm": False, "scaling": [0.125] * 12, "context_length": 1024}
    assert prov.window.describe() == "L text tokens (no special tokens)"
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


@pytest.mark.slow
def test_gpt2_random_weights_are_drawn_once_by_gpt2s_initialisation(gpt2_random):
    """Every weight comes from GPT-2's init_weights (the modules' own initialisation is skipped, so a weight it did
    not draw would be uninitialised memory): N(0, 0.02) for the embeddings and projections, N(0, 0.02 / sqrt(24))
    for the residual projections c_proj, LayerNorms exactly 1 and 0, biases exactly 0, the head tied to wte; and
    the same draw as GPT-2's recipe repeated here: the modules built without init, then ``init_weights`` after
    ``torch.manual_seed(0)``."""
    from transformers.initialization import no_init_weights

    model, _, _ = gpt2_random
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    for name, p in model.named_parameters():
        p = p.detach().double()
        if ".ln_" in name or name.startswith("transformer.ln_f"):
            assert torch.all(p == (1.0 if name.endswith("weight") else 0.0)), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        else:
            std = 0.02 / math.sqrt(24) if name.endswith("c_proj.weight") else 0.02
            assert abs(p.std().item() / std - 1) < 0.01 and abs(p.mean().item()) < 5 * std / math.sqrt(p.numel()), name
    with torch.random.fork_rng(devices=[]):
        with no_init_weights():
            oracle = GPT2LMHeadModel._from_config(GPT2Config(), attn_implementation="eager")
        torch.manual_seed(0)
        oracle.init_weights()
    assert torch.equal(oracle.transformer.h[11].mlp.c_proj.weight, model.transformer.h[11].mlp.c_proj.weight)


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
    assert loading.model_context("gpt2-random") == 1024
    assert loading.model_context("smollm2-135m") == 8192  # from the GGUF metadata
    assert loading.model_context("gemma3-270m") == 32768  # from the metadata at the head of the first chunk
    assert loading.model_context("minilm-l6") == 512  # from config.json
    assert loading.model_context(str(folder)) == 64
    assert loading.load_tokenizer(str(folder))("Hello world")["input_ids"] == [15496, 995]
    assert loading.load_tokenizer("gpt2-random")("Hello world")["input_ids"] == [15496, 995]
    assert loading.load_tokenizer("minilm-l6")("Hello world")["input_ids"] == [101, 7592, 2088, 102]
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
    a = prov.architecture
    assert (a["n_layers"], a["n_heads"], a["n_kv_heads"], a["head_dim"], a["context_length"]) == (30, 9, 3, 64, 8192)
    assert a["kv_head"] == [0, 0, 0, 1, 1, 1, 2, 2, 2] and a["causal"] and a["sliding_layers"] == []
    assert a["positions"] == "rotary (RoPE, base 100,000)" and not a["qk_norm"] and a["scaling"] == [0.125] * 30
    folder = embedded.cache_folder(embedded.SMOLLM2)
    assert prov.weights_sha256 == sha256_file(folder / "model.safetensors") and prov.pretrained is True
    assert prov.source_sha256 == embedded.SMOLLM2.sha256 == sha256_file(embedded.source_files(embedded.SMOLLM2)[0])
    assert "instruction-tuned" in prov.description and "instruction-tuned" in prov.to_markdown()
    assert len(tok) == 49152 and tok.model_max_length == 8192
    assert loading.model_context("smollm2-135m") == 8192
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        assert tok.decode(model(ids).logits[0, -1].argmax()) == " Paris"


@pytest.mark.slow
def test_gemma3_is_the_base_model_with_its_sliding_windows_and_bos():
    model, tok, prov = load_model("gemma3-270m")
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config._attn_implementation == "eager"
    assert sum(p.numel() for p in model.parameters()) == 268_098_176
    a = prov.architecture
    assert (a["n_layers"], a["n_heads"], a["n_kv_heads"], a["head_dim"], a["context_length"]) == (18, 4, 1, 256, 32768)
    assert a["global_layers"] == [5, 11, 17] and a["sliding_window"] == 512 and len(a["sliding_layers"]) == 15
    assert a["kv_head"] == [0, 0, 0, 0] and a["qk_norm"] and a["causal"] and a["scaling"] == [1 / 16] * 18
    assert model.config.attn_logit_softcapping is None and model.config.query_pre_attn_scalar == 256
    assert a["positions"] == "rotary (RoPE; base 10,000 on sliding layers, 1,000,000 on global layers)"
    assert prov.window.describe() == "<bos> + L-1 text tokens" and prov.window.prefix == (tok.bos_token_id,) == (2,)
    assert prov.source_sha256 == embedded.GEMMA3.sha256 and len(tok) == 262_144
    assert "base (pretrained, not instruction-tuned)" in prov.to_markdown()
    text = load_text().text[:400]  # the novel's first sentences, 106 tokens
    plain = model_windows(text, tok, 96)  # 96 text tokens
    with_bos = model_windows(text, tok, 97, prov.window)
    assert torch.equal(with_bos[0, 1:], plain[0]) and with_bos[0, 0] == 2

    def perplexity(ids, skip):  # of the 95 text tokens that follow the first text token
        with torch.inference_mode():
            logits = model(input_ids=ids, logits_to_keep=ids.shape[1]).logits[0, skip:-1]
        return float(torch.nn.functional.cross_entropy(logits, ids[0, skip + 1:]).exp())

    with_, without = perplexity(with_bos, 1), perplexity(plain, 0)
    assert with_ < 60 and without > 4 * with_  # measured: 37 and 290


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_a_gguf_models_tokenizer_is_read_without_a_conversion_and_is_the_caches(name, monkeypatch, tmp_path):
    """A preflight counts the corpus's tokens with ``load_tokenizer``: for a GGUF model it is read from the GGUF file,
    nothing is converted, and it is the tokenizer that the converted copy holds (the same serialised tokenizer, the
    same special tokens, the same ids for the novel's first 5,000 characters, with and without special tokens)."""
    from transformers import AutoTokenizer

    cached = AutoTokenizer.from_pretrained(embedded.converted(embedded.EMBEDDED[name])[0], local_files_only=True)
    monkeypatch.setenv("ATTN_COMPANION_MODELS", str(tmp_path / "empty"))
    start = time.perf_counter()
    tok = loading.load_tokenizer(name)
    assert not (tmp_path / "empty").exists(), "load_tokenizer converted the model"
    assert time.perf_counter() - start < 60  # measured 0.8 s (SmolLM2) and 4.2 s (Gemma-3); a conversion 10-19 s
    assert tok.backend_tokenizer.to_str() == cached.backend_tokenizer.to_str()
    assert tok.special_tokens_map == cached.special_tokens_map and len(tok) == len(cached)
    text = load_text().text[:5_000]
    for special in (True, False):
        ids = tok(text, add_special_tokens=special)["input_ids"]
        assert ids == cached(text, add_special_tokens=special)["input_ids"]
        assert (ids[0] == tok.bos_token_id) == (special and name == "gemma3-270m")  # only Gemma adds its <bos>


@pytest.mark.slow
def test_minilm_is_the_sentence_embedding_encoder():
    model, tok, prov = load_model("minilm-l6")
    assert type(model).__name__ == "BertModel" and model.config._attn_implementation == "eager"
    a = prov.architecture
    assert (a["n_layers"], a["n_heads"], a["n_kv_heads"], a["head_dim"], a["context_length"]) == (6, 12, 12, 32, 512)
    assert not a["causal"] and a["positions"] == "learned absolute" and a["kv_head"] == list(range(12))
    assert prov.weights_sha256 == embedded.MINILM.sha256 and model.dtype == torch.float32
    assert prov.window.describe() == "[CLS] + L-2 text tokens + [SEP]" and prov.window.prefix == (101,)
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome."]
    batch = tok(sentences, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None]
    pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    # the sentence-transformers model's own similarities (mean pooling): 0.755 and -0.046
    assert abs(float(pooled[0] @ pooled[1]) - 0.755) < 0.005 and abs(float(pooled[0] @ pooled[2]) + 0.046) < 0.005


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
def test_a_damaged_cache_of_a_real_model_is_converted_again(monkeypatch, tmp_path):
    """A same-size edit of rope_theta in a copy of SmolLM2's converted config.json: detected, converted again (the
    conversion itself, tested on a tiny GGUF in test_embedded.py, is replaced by a copy of the good folder here)."""
    load_model("smollm2-135m")  # make sure a good converted copy exists
    good = embedded.cache_folder(embedded.SMOLLM2)
    monkeypatch.setenv("ATTN_COMPANION_MODELS", str(tmp_path))
    copy = embedded.cache_folder(embedded.SMOLLM2)
    shutil.copytree(good, copy, copy_function=os.link)  # hard links, except the file edited below
    converted = []

    def convert(model, folder):
        converted.append(model.name)
        shutil.rmtree(folder)
        shutil.copytree(good, folder, copy_function=os.link)

    monkeypatch.setattr(embedded, "_convert", convert)
    config = (copy / "config.json").read_text()
    (copy / "config.json").unlink()
    (copy / "config.json").write_text(config.replace('"rope_theta": 100000.0', '"rope_theta": 900000.0'))
    assert (copy / "config.json").read_text() != config and len((copy / "config.json").read_text()) == len(config)
    _, _, prov = load_model("smollm2-135m")
    assert any("because the converted copy failed its check (config.json does not have the sha256" in n
               for n in prov.notes)
    assert converted == ["smollm2-135m"]
    assert (copy / "config.json").read_text() == config and prov.weights_sha256 == sha256_file(
        good / "model.safetensors")


def test_loading_shows_no_progress_bar(monkeypatch, gpt2_random):
    """A progress bar in a notebook is an ipywidget whose state would make the page load scripts from CDNs."""
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    enable_progress_bars()
    transformers_logging.enable_progress_bar()
    load_model("gpt2-random")
    assert are_progress_bars_disabled() and not transformers_logging.is_progress_bar_enabled()
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
