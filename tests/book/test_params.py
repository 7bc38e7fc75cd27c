"""Parameters that fit together: the rules between them, ``attn-companion params``, and the preflight that refuses
a bad model, a window beyond the model's context or a corpus too short for it in seconds, before any notebook runs
(or, for ``attn-companion student``, before the course is written)."""
from __future__ import annotations

import re
import textwrap
import time

import papermill
import pytest

from attn_utils import cli
from attn_utils.book import build, params

# a chapter-like notebook: the parameters of a model chapter, ch2's grids
NOTEBOOK = textwrap.dedent('''\
    # %% tags=["parameters"]
    model = "gpt2-random"
    corpus = "war-and-peace"
    chapters = None
    offset = 0
    L = 64
    N = 5
    lengths = [16, 32, 64, 128]
    Ns = [1, 5, 10, 100]
    long_lengths = None

    # %%
    print("a notebook ran")
    ''')


@pytest.fixture
def notebook(tmp_path):
    src = tmp_path / "chapter.py"
    src.write_text(NOTEBOOK)
    return src


@pytest.fixture
def no_notebook_runs(monkeypatch):
    """Fail the test if papermill is asked to execute anything."""
    def refuse(*args, **kwargs):
        raise AssertionError("a notebook was executed")

    monkeypatch.setattr(papermill, "execute_notebook", refuse)


# --- the rules ------------------------------------------------------------------------------------------------

def test_rules_derive_the_values_the_notebook_uses():
    used = params.validate(L=64, N=5, lengths=[4, 16, 64, 128], Ns=[1, 5, 64, 100])
    assert used.lengths == (16, 64)  # above L and not above N dropped
    assert used.Ns == (1, 5) and used.N == 5 and used.L == 64
    assert params.validate(Ns=[1, 500]).Ns == (1, 500)  # a rule applies only when all its parameters are given
    assert params.validate(L=256, long_lengths=None, facts={"context": 1024}).long_lengths == (512, 1024)
    assert params.validate(L=1024, long_lengths=None, facts={"context": 1024}).long_lengths == ()
    assert params.validate(L=5000).L == 5000  # the context is a fact: without it, no limit


@pytest.mark.parametrize("values, facts, names, message", [
    (dict(N=64, L=64), None, ("N", "L"), "parameter N must be below L = 64, got 64"),
    (dict(lengths=[128, 256], L=64), None, ("lengths", "L"),
     "parameter lengths keeps no value <= L = 64: got [128, 256]; give at least one value <= 64"),
    (dict(Ns=[64, 100], L=64), None, ("Ns", "L"), "parameter Ns keeps no value < L = 64"),
    (dict(lengths=[4], N=5), None, ("lengths", "N"), "parameter lengths keeps no value > N = 5"),
    (dict(L=2048), {"context": 1024}, ("L", "context"),
     "parameter L must be at most the model's context of 1024 tokens, got 2048"),
    (dict(L=256, long_lengths=[300, 2048]), {"context": 1024}, ("long_lengths", "L", "context"),
     "parameter long_lengths must be lengths in [257, 1024]"),
    (dict(offset=10, L=64), {"corpus_tokens": 50}, ("offset", "L", "corpus_tokens"),
     "parameters offset + L = 10 + 64 = 74 exceed the 50 tokens of the corpus"),
    (dict(L=1), None, ("L",), "parameter L must be an integer >= 2, got 1"),
    (dict(device="cuda"), {"cuda_devices": 0}, ("device", "cuda_devices"),
     "parameter device = 'cuda' needs a CUDA GPU, but torch sees no CUDA GPU here"),
    (dict(device="cuda:1"), {"cuda_devices": 1}, ("device", "cuda_devices"),
     "parameter device = 'cuda:1' needs a CUDA GPU, but torch sees only 1 CUDA GPU(s) here"),
    (dict(device="gpu"), None, ("device",), "parameter device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
])
def test_rule_errors_name_the_parameter_and_the_allowed_range(values, facts, names, message):
    with pytest.raises(params.ParameterError) as err:
        params.validate(facts=facts, **values)
    assert str(err.value).startswith(message) and err.value.names == names


@pytest.mark.parametrize("device, cuda_devices", [("auto", 0), ("auto", 2), ("cpu", 0), ("cuda", 1), ("cuda:1", 2)])
def test_device_that_is_there_passes(device, cuda_devices):
    assert params.validate(facts={"cuda_devices": cuda_devices}, device=device).device == device


def test_device_auto_is_the_cpu_without_a_gpu():
    import torch

    from attn_utils.models.loading import resolve_device

    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)  # the rule that it is there is the preflight's


def test_every_rule_is_on_known_parameters_and_facts():
    for rule in params.RULES:
        assert rule.names[0] in params.SPECS and set(rule.names) <= set(params.SPECS) | set(params.FACTS)
        assert rule.states
    for sources, _ in params.FACTS.values():
        assert set(sources) <= set(params.SPECS)


def test_defaults_take_part_in_the_rules(notebook):
    """Rules apply to the notebook's defaults too, and the message says which values were defaults."""
    assert build.check_parameters(notebook, {}).Ns == (1, 5, 10)
    assert build.check_parameters(notebook, {"L": 16}).lengths == (16,)
    with pytest.raises(params.ParameterError) as err:
        build.check_parameters(notebook, {"L": 8})
    assert str(err.value) == ("chapter: parameter lengths keeps no value <= L = 8: got [16, 32, 64, 128]; give at "
                              "least one value <= 8 (the default of chapter: lengths = [16, 32, 64, 128])")
    with pytest.raises(params.ParameterError) as err:
        build.check_parameters(notebook, {"L": 8, "lengths": [4]})
    assert str(err.value) == ("chapter: parameter lengths keeps no value > N = 5: got [4]; give at least one value "
                              "> 5 (the default of chapter: N = 5)")
    with pytest.raises(params.ParameterError, match=r"^chapter: parameter N must be below L = 8, got 9$"):
        build.check_parameters(notebook, {"L": 8, "N": 9, "lengths": [8, 10]})


# --- attn-companion params ------------------------------------------------------------------------------------

def test_params_command_states_values_defaults_and_rules(notebook, capsys):
    assert cli.main(["params", str(notebook)]) == 0
    out = capsys.readouterr().out
    blocks = {b.split()[0]: b for b in re.split(r"\n  (?=\S)", out)[1:]}
    assert blocks["L"].startswith("L = 64\n") and "allowed: an integer >= 2" in blocks["L"]
    assert "window length in tokens" in blocks["L"]
    for name in ("N", "L"):
        assert "rule: N must be below L" in blocks[name]
    for name in ("model", "L"):
        assert "rule: L must be at most the model's context" in blocks[name]
    assert "rule: offset + L must not exceed the tokens of the corpus" in blocks["corpus"]
    assert blocks["Ns"].startswith("Ns = [1, 5, 10, 100] (used: [1, 5, 10])")
    assert blocks["lengths"].startswith("lengths = [16, 32, 64, 128] (used: [16, 32, 64])")
    assert "rule: long_lengths None means 2L and 4L" in blocks["long_lengths"]
    assert out.startswith("chapter:\n")


def test_params_command_lists_every_notebook(capsys):
    assert cli.main(["params"]) == 0
    out = capsys.readouterr().out
    for src in build.NOTEBOOK_DIR.glob("*.py"):
        assert f"\n{src.stem}:" in f"\n{out}"


# --- the preflight --------------------------------------------------------------------------------------------

def _fails_fast(argv, capsys, fragment, limit=20.0):
    start = time.perf_counter()
    assert cli.main(argv) == 2
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") <= 12, err
    assert seconds < limit, f"the preflight took {seconds:.1f} s"
    return err


@pytest.mark.parametrize("parameters, fragment", [
    (["-p", "model", "gtp2"], "unknown model 'gtp2'; use one of"),
    (["-p", "L", "2048"], "chapter with model 'gpt2-random' (1024 tokens of context): parameter L must be at most "
                          "the model's context of 1024 tokens, got 2048"),
    (["-p", "L", "256", "-p", "long_lengths", "[2048]"], "parameter long_lengths must be lengths in [257, 1024]"),
    (["-p", "model", "/no/such/folder"], "unknown model '/no/such/folder'"),
])
def test_bad_model_or_window_stops_before_any_notebook(notebook, tmp_path, capsys, no_notebook_runs, parameters,
                                                       fragment):
    runs = tmp_path / "runs"
    err = _fails_fast(["run", str(notebook), "--out", str(runs), *parameters], capsys, fragment)
    assert err.startswith("attn-companion run: error: ")
    assert not runs.exists()


@pytest.mark.parametrize("content, fragment", [
    (b"", "holds no text"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "holds NUL bytes"),  # a binary file: NUL bytes in its head
    (b"caf\xe9 au lait, not UTF-8", "is not UTF-8 text"),
    (b"text\x00with a NUL byte", "holds NUL bytes"),
    (b"Only a few words of text.",
     "chapter with model 'gpt2-random': parameters offset + L = 0 + 64 = 64 exceed the 7 tokens of the corpus"),
])
def test_bad_corpus_stops_before_any_notebook(notebook, tmp_path, capsys, no_notebook_runs, content, fragment):
    text = tmp_path / "corpus.txt"
    text.write_bytes(content)
    runs = tmp_path / "runs"
    err = _fails_fast(["run", str(notebook), "--out", str(runs), "-p", "corpus", str(text)], capsys, fragment)
    assert err.startswith("attn-companion run: error: chapter") and (str(text) in err or "tokens of the corpus" in err)
    assert not runs.exists()


def test_sweep_checks_every_combination_first(notebook, tmp_path, capsys, no_notebook_runs):
    runs = tmp_path / "runs"
    _fails_fast(["sweep", str(notebook), "--out", str(runs), "-p", "L", "64,4096"], capsys,
                "parameter L must be at most the model's context of 1024 tokens, got 4096")
    assert not runs.exists()


def test_book_preflight_leaves_no_trace(notebook, tmp_path, no_notebook_runs):
    root = tmp_path / "proj"
    (root / "notebooks").mkdir(parents=True)
    (root / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: notebooks/chapter\n")
    (root / "notebooks" / "chapter.py").write_text(notebook.read_text())
    out = tmp_path / "site" / "html"
    with pytest.raises(ValueError, match="unknown model 'gtp2'"):
        build.build_book({"model": "gtp2"}, root=root, out=out)
    assert not (tmp_path / "site").exists()


def test_student_checks_before_writing(tmp_path, capsys, no_notebook_runs):
    course = tmp_path / "course"
    _fails_fast(["student", "--out", str(course), "-p", "model", "gpt2-random", "-p", "L", "100000"], capsys,
                "parameter L must be at most the model's context of 1024 tokens, got 100000")
    _fails_fast(["student", "--out", str(course), "ch1_vanishing", "-p", "model", "gtp2"], capsys,
                "unknown model 'gtp2'")
    assert not course.exists()


def test_preflight_returns_the_values_each_run_uses(notebook, capsys):
    used = build.preflight([(notebook, {}), (notebook, {"L": 32, "offset": 100})])
    assert [u.Ns for u in used] == [(1, 5, 10), (1, 5, 10)] and used[1].lengths == (16, 32)
    assert used[0].long_lengths == (128, 256)  # None: 2L and 4L within the context
    assert capsys.readouterr().out == ""  # only model='auto' says something
