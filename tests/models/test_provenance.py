import json
import time

import pytest

from attn_utils.models.corpus import Corpus, WindowFormat
from attn_utils.models.provenance import Provenance, package_versions

CORPUS = Corpus(name="War and Peace (Project Gutenberg #2600)", source="pg2600.txt", sha256="ab" * 32, text="...",
                chapters=(1, 10), n_chapters=365)


def _record(**kwargs):
    fields = dict(model="gpt2-random", requested="gpt2-random", model_source="GPT2Config()",
                  model_class="GPT2LMHeadModel", pretrained=False, weights_sha256="cd" * 32, tokenizer="GPT-2 BPE",
                  architecture={"n_layers": 12, "n_heads": 12, "n_kv_heads": 12, "head_dim": 64,
                                "context_length": 1024},
                  dtype="float32", device="cpu", seed=0)
    return Provenance(**{**fields, **kwargs})


def test_package_versions_name_the_stack():
    versions = package_versions()
    assert {"python", "torch", "transformers", "numpy", "attn_utils"} <= set(versions)
    assert versions["attn_utils"] != "not installed"


def test_corpus_and_window_offsets_are_recorded():
    prov = _record().add_corpus(CORPUS, L=1024, offset=100, n_windows=3)
    assert (prov.corpus, prov.corpus_sha256, prov.chapters) == (CORPUS.name, CORPUS.sha256, (1, 10))
    assert prov.L == 1024 and prov.window_offsets == (100, 1124, 2148)


def test_wall_time_is_measured():
    prov = _record()
    with prov.timed():
        time.sleep(0.05)
    assert 0.04 <= prov.wall_time_s < 5 and prov.started_at.endswith("+00:00")
    with pytest.raises(RuntimeError, match="before start"):
        _record().finish()


def test_to_dict_is_json_ready_and_complete():
    prov = _record().add_corpus(CORPUS, L=8, n_windows=2)
    prov.start().finish()
    data = json.loads(json.dumps(prov.to_dict()))
    for key in ("model", "weights_sha256", "tokenizer", "corpus", "corpus_sha256", "window_offsets", "versions",
                "seed", "device", "wall_time_s"):
        assert key in data
    assert data["window_offsets"] == [0, 8] and data["chapters"] == [1, 10] and "_t0" not in data


def test_markdown_table_shows_what_produced_the_result():
    prov = _record(notes=["a note"]).add_corpus(CORPUS, L=1024, n_windows=10)
    prov.start().finish()
    table = prov.to_markdown()
    lines = table.splitlines()
    assert lines[:2] == ["| provenance | |", "|---|---|"] and all(line.count("|") == 3 for line in lines)
    for text in ("gpt2-random", "12 layers x 12 heads", "random weights, not a pretrained model", "cdcdcdcdcdcdcdcd",
                 "chapters 1-10", "abababababababab", "L = 1024, offsets 0, 1024, ..., 9216 (10 windows)",
                 "| seed | 0 |", "cpu, float32", "torch ", "| run | started ", "| note | a note |"):
        assert text in table
    gqa = _record(model="smollm2-135m", requested="auto", pretrained=True,
                  architecture={"n_layers": 30, "n_heads": 9, "n_kv_heads": 3, "head_dim": 64,
                                "context_length": 8192}).to_markdown()
    assert "smollm2-135m (requested: auto)" in gqa and "9 heads (3 kv: 3 query heads share each)" in gqa
    assert "not a pretrained" not in gqa


GEMMA = {"n_layers": 18, "n_heads": 4, "n_kv_heads": 1, "kv_head": [0, 0, 0, 0], "head_dim": 256,
         "global_layers": [5, 11, 17], "sliding_layers": [i for i in range(18) if i not in (5, 11, 17)],
         "sliding_window": 512, "causal": True, "positions": "rotary (RoPE)", "qk_norm": True, "scaling": [1 / 16] * 18,
         "context_length": 32768}


def test_what_the_model_is_and_how_it_reads_a_window_are_stated():
    bos = WindowFormat(prefix=(2,), prefix_text=("<bos>",))
    prov = _record(model="gemma3-270m", description="Gemma-3-270M base (pretrained, not instruction-tuned)",
                   architecture=GEMMA, window=bos, pretrained=True, weights_sha256="ef" * 32,
                   source_sha256="a5" * 32).add_corpus(CORPUS, L=1024, offset=10, n_windows=3)
    assert prov.window_offsets == (10, 1033, 2056)  # each window holds 1023 text tokens after its <bos>
    table = prov.to_markdown()
    for text in ("| what it is | Gemma-3-270M base (pretrained, not instruction-tuned) |",
                 "4 heads (1 kv: 4 query heads share each), head dim 256, global layers 5, 11, 17, the other 15 a "
                 "sliding window of 512 keys, causal, QK-norm, rotary (RoPE) positions, context 32768",
                 "| window | <bos> + L-1 text tokens = L tokens |", "sha256 efefefefefefefef..., converted from sha256 "
                 "a5a5a5a5a5a5a5a5...", "requirements-models.txt sha256"):
        assert text in table
    data = json.loads(json.dumps(prov.to_dict()))
    assert data["window"] == {"prefix": [2], "suffix": [], "prefix_text": ["<bos>"], "suffix_text": [],
                              "rule": "<bos> + L-1 text tokens"}
    assert data["models_lock"]["file"] == "requirements-models.txt" and data["models_lock"]["pins"] == 7
    encoder = _record(architecture={**GEMMA, "causal": False, "sliding_layers": [], "global_layers": list(range(18))},
                      window=WindowFormat(prefix=(101,), suffix=(102,), prefix_text=("[CLS]",),
                                          suffix_text=("[SEP]",))).to_markdown()
    assert "bidirectional (every row sees all L keys)" in encoder and "sliding" not in encoder
    assert "| window | [CLS] + L-2 text tokens + [SEP] = L tokens |" in encoder


def test_the_lock_file_is_recorded_with_its_hash_and_what_differs(tmp_path):
    import hashlib
    import importlib.metadata

    from attn_utils.models.provenance import LOCK_FILE, lock_status

    shipped = lock_status()
    assert shipped["file"] == "requirements.txt" and shipped["pins"] > 100
    assert shipped["sha256"] == hashlib.sha256(LOCK_FILE.read_text().encode()).hexdigest()
    torch_version = importlib.metadata.version("torch")
    lock = tmp_path / "requirements.txt"
    lock.write_text(f"numpy==0.0.1\n    # via x\ntorch=={torch_version.split('+')[0]}\nno-such-package==1.0\n")
    status = lock_status(lock)
    assert status["pins"] == 3
    assert status["differ"] == [f"numpy: 0.0.1 != {importlib.metadata.version('numpy')}",
                                "no-such-package: 1.0 != not installed"]
    table = Provenance(lock=status).to_markdown()
    assert "| environment | requirements.txt sha256" in table and "2 of 3 pins differ: numpy" in table
    assert "no lock file" in Provenance(lock=lock_status(tmp_path / "missing.txt")).to_markdown()
