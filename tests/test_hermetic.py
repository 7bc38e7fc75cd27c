"""The test session itself is hermetic: no network, empty caches, nothing read from outside the repository."""
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from attn_utils.models.loading import models_dir

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.filterwarnings("ignore:A test tried to use socket")
def test_connections_beyond_loopback_are_refused_in_the_test_process():
    with pytest.raises(Exception, match="socket.socket.connect"):
        socket.create_connection(("93.184.215.14", 80), timeout=2)


def test_child_processes_reach_no_network_and_fail_fast():
    code = "import urllib.request; urllib.request.urlopen('http://93.184.215.14/', timeout=30)"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Connection refused" in done.stderr
    assert time.perf_counter() - start < 10


def test_caches_are_empty_temporary_folders():
    root = Path(os.environ["ATTN_COMPANION_TEST_ROOT"])
    assert root.name.startswith("attn-companion-tests-") and root.parent == Path(tempfile.gettempdir())
    assert models_dir().is_relative_to(root)
    assert Path(os.environ["HF_HOME"]).is_relative_to(root) and Path(os.environ["XDG_CACHE_HOME"]).is_relative_to(root)


def test_nothing_in_the_repository_reads_a_folder_beside_it():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in tracked:
        path = ROOT / name
        if path.suffix in {".py", ".md", ".yml", ".toml", ".cfg", ".txt", ".ipynb"} or name in {"Makefile", ".ci/run"}:
            text = path.read_text(errors="replace")
            if name != "tests/test_hermetic.py" and ("../shared" in text or "shared/data" in text):
                offenders.append(name)
    assert offenders == []


@pytest.mark.parametrize("case", ["first", "second"])
def test_torch_global_generator_is_seeded_from_the_test_id(request, case):
    import zlib

    import torch

    first = torch.randn(3)  # the test's first draw from the global generator, whatever the test before drew
    seed = zlib.crc32(request.node.nodeid.encode())
    assert torch.equal(first, torch.randn(3, generator=torch.Generator().manual_seed(seed)))
