"""attn_utils.startup: importing attn_utils defers jsonschema's IRI grammars, and the IRI formats check as before.

Each check runs in a fresh interpreter: the deferral acts on the first import of nbformat in a process.
"""
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from attn_utils import startup

# IRIs and IRI references, valid and not: non-ASCII letters, a space, a bare fragment, an empty string, a bad scheme
SAMPLES = ["http://example.org/a/b?c#d", "https://例え.テスト/パス", "urn:isbn:0451450523", "#fragment", "../up/one",
           "http://a b", "", "1http://bad-scheme", "mailto:José@example.org", "http://[::1]:80/", "http://%zz"]

CHECK = f"""
import json, sys
{{first}}
import nbformat, jsonschema
compiled_at_import = "rfc3987_syntax.syntax_helpers" in sys.modules
checker = jsonschema.FormatChecker()
verdicts = {{{{fmt: [checker.conforms(s, fmt) for s in {SAMPLES!r}] for fmt in ("iri", "iri-reference")}}}}
print(json.dumps({{{{"compiled_at_import": compiled_at_import, "verdicts": verdicts,
                   "compiled_after": "rfc3987_syntax.syntax_helpers" in sys.modules}}}}))
"""


def run(first: str) -> dict:
    code = CHECK.format(first=first)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_nbformat_after_attn_utils_compiles_no_grammar_and_iris_check_as_without_it():
    plain, ours = run(""), run("import attn_utils")
    assert plain["compiled_at_import"] and not ours["compiled_at_import"]
    assert ours["compiled_after"]  # the first IRI check compiled them
    assert ours["verdicts"] == plain["verdicts"]
    assert set(plain["verdicts"]["iri"]) == {True, False}  # the samples tell the formats' verdicts apart


def test_a_chapter_kernels_glue_compiles_no_grammar():
    """What a chapter's kernel runs: the book's formatting, myst-nb's glue (which imports nbformat), and torch's
    registration of an operator, which reads ``__file__`` of every module (``inspect.getmodule``: it compiled the
    grammars, and ran 4 s longer, when the stand-in had no ``__file__``)."""
    code = ("import inspect, sys\nfrom attn_utils.book.formatting import glue_values\nimport myst_nb.ext.glue\n"
            "assert inspect.getmodule(inspect.currentframe(), '/no/such/file.py') is None\n"  # reads every __file__
            "assert inspect.getmodule(sys.modules['rfc3987_syntax']) is sys.modules['rfc3987_syntax']\n"
            "print('rfc3987_syntax.syntax_helpers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr


def test_the_stand_in_keeps_every_name_of_the_package(monkeypatch):
    monkeypatch.delitem(sys.modules, startup.IRI_PACKAGE, raising=False)
    startup.defer_iri_grammars()
    stand_in = sys.modules[startup.IRI_PACKAGE]
    real = __import__(f"{startup.IRI_PACKAGE}.syntax_helpers", fromlist=["*"])
    assert stand_in.is_valid_syntax("iri", "http://a/b") is real.is_valid_syntax("iri", "http://a/b") is True
    assert stand_in.RFC3987_SYNTAX_PARSER_TYPE == real.RFC3987_SYNTAX_PARSER_TYPE  # read from the grammars
    assert stand_in.__file__ == str(Path(real.__file__).with_name("__init__.py"))
    with pytest.raises(AttributeError):
        stand_in.no_such_name  # noqa: B018


def test_nothing_changes_where_the_package_is_imported_or_missing(monkeypatch):
    imported = types.ModuleType(startup.IRI_PACKAGE)
    monkeypatch.setitem(sys.modules, startup.IRI_PACKAGE, imported)
    startup.defer_iri_grammars()
    assert sys.modules[startup.IRI_PACKAGE] is imported
    monkeypatch.delitem(sys.modules, startup.IRI_PACKAGE)
    monkeypatch.setattr(startup.importlib.util, "find_spec", lambda name: None)
    startup.defer_iri_grammars()
    assert startup.IRI_PACKAGE not in sys.modules
