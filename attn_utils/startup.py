"""What every process of the companion does when it first imports :mod:`attn_utils`: nothing a user can see,
only one deferred import.

jsonschema 4.26 (imported by nbformat, so by papermill, nbgrader, myst-nb's ``glue`` in every chapter's kernel and
Sphinx) imports ``rfc3987_syntax`` when it starts, and that package compiles about 35 Earley parsers of the IRI
grammar at import: 0.8 s of CPU in each such process (jsonschema issue 1428), for the ``iri`` and
``iri-reference`` formats, which no notebook schema uses. :func:`defer_iri_grammars` puts a stand-in under that name
whose ``is_valid_syntax`` imports the real grammars on its first call, so the formats still check exactly as before.
jsonschema's next release reads ``rfc3987_syntax2`` instead (its commit 8b08766); the stand-in then stays unused.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types

__all__ = ["defer_iri_grammars"]

IRI_PACKAGE = "rfc3987_syntax"


def _grammars() -> types.ModuleType:
    return importlib.import_module(f"{IRI_PACKAGE}.syntax_helpers")


def _is_valid_syntax(*args, **kwargs):
    return _grammars().is_valid_syntax(*args, **kwargs)


def _name_of_the_grammars(name: str):
    """A name of the package, read from its grammars (compiling them); a dunder name is not: ``inspect.getmodule``
    reads ``__file__`` of every module in ``sys.modules`` (torch does on import), and that must compile nothing."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_grammars(), name)


def defer_iri_grammars() -> None:
    """Install the stand-in of ``rfc3987_syntax`` (where it is installed and not yet imported): the real package's
    folder and file, ``is_valid_syntax`` and every other name read from its grammars at first use."""
    if IRI_PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(IRI_PACKAGE)
    if spec is None or spec.submodule_search_locations is None:
        return
    stand_in = types.ModuleType(IRI_PACKAGE, "rfc3987_syntax, its grammars compiled at the first check")
    stand_in.__path__, stand_in.__file__ = list(spec.submodule_search_locations), spec.origin
    stand_in.__spec__ = spec
    stand_in.is_valid_syntax = _is_valid_syntax
    stand_in.__getattr__ = _name_of_the_grammars
    sys.modules[IRI_PACKAGE] = stand_in
