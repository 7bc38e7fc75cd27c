"""A Sphinx extension for the book's bibliography: entries labelled by author and year, as the text cites them.

The default pybtex label style (``alpha``) labels Veličković et al. (2024) "[VelivckovicPBP24]": letters of the
LaTeX source next to the author-year citations of the text. Here the label is the one the text uses:
``Veličković et al. 2024`` (one author: ``Miller 2023``; two: ``Martins and Astudillo 2016``), with a letter
after the year where two entries would share a label, and the list is sorted by author, year and title.
Loaded by ``_config.yml`` (``sphinx.extra_extensions``), selected as ``bibtex_default_style: authoryear``.
"""
from __future__ import annotations

import codecs
import re
from collections import Counter

import latexcodec  # noqa: F401  (registers the "ulatex" codec)
from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle

NAME = "authoryear"


def plain(latex: str) -> str:
    """A LaTeX name as text: accents decoded, braces dropped (``Veli{\\v{c}}kovi{\\'c}`` -> ``Veličković``)."""
    text = codecs.decode(latex, "ulatex")
    return re.sub(r"[{}]", "", text).strip()


def surname(person) -> str:
    return plain(" ".join(person.prelast_names + person.last_names))


def author_year(entry) -> str:
    """``Surname YEAR``, ``Surname and Surname YEAR`` or ``Surname et al. YEAR``."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [surname(p) for p in people]
    who = (names[0] if len(names) == 1 else " and ".join(names) if len(names) == 2
           else f"{names[0]} et al." if names else plain(entry.fields.get("title", entry.key)))
    return f"{who} {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabels(BaseLabelStyle):
    """Author-year labels, a letter added after the year where two entries share one."""

    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        labels = [author_year(e) for e in entries]
        shared, seen = Counter(labels), Counter()
        for label in labels:
            if shared[label] > 1:
                seen[label] += 1
                yield f"{label}{chr(ord('a') + seen[label] - 1)}"
            else:
                yield label


class AuthorYearStyle(UnsrtStyle):
    """The ``unsrt`` entry format with author-year labels, sorted by author, year and title."""

    default_label_style = NAME
    default_sorting_style = "author_year_title"


def setup(app):
    register_plugin("pybtex.style.labels", NAME, AuthorYearLabels)
    register_plugin("pybtex.style.formatting", NAME, AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
