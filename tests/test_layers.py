"""The declared layers of attn_utils (pyproject.toml, [tool.importlinter]) hold, and their checker can fail."""
import shutil
import subprocess
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


def _private_uses(path: Path) -> list[str]:
    """Uses of another attn_utils module's underscore names in one source file: ``from attn_utils.x import _y`` and
    ``module._y`` where ``module`` was imported from attn_utils (dunder names are not private)."""
    import ast

    tree = ast.parse(path.read_text())
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attn_utils"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {alias.name}")
                else:
                    modules.add(alias.asname or alias.name)  # a module or a public name; only modules have attributes
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name.startswith("attn_utils"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    uses = [u for path in sorted((ROOT / "attn_utils").rglob("*.py")) for u in _private_uses(path)]
    assert uses == []


def test_the_private_name_check_can_fail(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from attn_utils.mathematics import metrics\nfrom attn_utils.book.formatting import _x\n"
                      "metrics._visible(None, None)\nmetrics.__name__\n")
    assert _private_uses(module) == ["m.py:2 from attn_utils.book.formatting import _x", "m.py:3 metrics._visible"]


def test_the_mathematics_api_is_documented_and_complete():
    """``attn_utils.mathematics.__all__`` is the public API: every name is there, documented, defined in a module of
    the mathematics other than the unchecked kernels, and every public function of the modules it groups is in it."""
    import importlib
    import inspect

    import attn_utils.mathematics as api

    assert len(set(api.__all__)) == len(api.__all__) and api.__doc__
    for name in api.__all__:
        value = getattr(api, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert value.__doc__, name
            assert value.__module__.startswith("attn_utils.mathematics."), name
            assert value.__module__ not in ("attn_utils.mathematics.kernels", "attn_utils.mathematics.validation")
    for name in ("normalizers", "metrics", "algorithms", "beyond", "fitting", "theory"):
        module = importlib.import_module(f"attn_utils.mathematics.{name}")
        callables = {n for n in module.__all__ if callable(getattr(module, n))}  # functions and classes, not constants
        assert callables <= set(api.__all__), (name, callables - set(api.__all__))


def test_a_grading_kernel_imports_no_scipy_or_pandas():
    """The package's names load with their module on first use: what an exercise notebook imports (the normalizers
    and the checks) brings in neither scipy nor pandas (0.9 s per kernel, 15 kernels in a graded class)."""
    code = ("import sys\nfrom attn_utils.mathematics import normalizers\nfrom attn_utils.classroom import exercises\n"
            "import attn_utils.mathematics as api\nassert api.softmax is normalizers.softmax\n"
            "print(sorted(m for m in ('scipy', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
