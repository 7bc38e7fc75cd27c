"""The declared layers of attn_utils (pyproject.toml, [tool.importlinter]) hold, and their checker can fail."""
import shutil
import sys
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert lint_imports(no_cache=True) == 0


@pytest.mark.parametrize("module, line", [
    ("attn_utils/mathematics/metrics.py", "import os"),                       # I/O in the mathematics
    ("attn_utils/models/capture.py", "from attn_utils.book import runlog"),   # an upward import
])
def test_a_broken_contract_is_caught(tmp_path, monkeypatch, module, line):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "attn_utils", copy / "attn_utils", ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    with open(copy / module, "a") as f:
        f.write(f"\n{line}\n")
    monkeypatch.chdir(copy)
    monkeypatch.syspath_prepend(str(copy))
    for name in [m for m in sys.modules if m == "attn_utils" or m.startswith("attn_utils.")]:
        monkeypatch.delitem(sys.modules, name)  # the checker must find the copy, not the package already imported
    assert lint_imports(no_cache=True) == 1
