"""The bibliography's labels are the author-year form the text cites, decoded from LaTeX."""
from __future__ import annotations

from pathlib import Path

from pybtex.database import parse_string, parse_file

from attn_utils.book.bibstyle import AuthorYearLabels, author_year

ROOT = Path(__file__).resolve().parents[2]


def test_the_book_s_references_get_author_year_labels():
    entries = parse_file(ROOT / "book" / "references.bib").entries
    assert author_year(entries["velickovic2024softmax"]) == "Veličković et al. 2024"
    assert author_year(entries["martins2016sparsemax"]) == "Martins and Astudillo 2016"
    assert author_year(entries["nakanishi2025scalable"]) == "Nakanishi 2025"
    labels = [author_year(e) for e in entries.values()]
    assert not any(c in label for label in labels for c in "{}\\")


def test_two_entries_with_one_label_get_letters():
    bib = parse_string("@misc{a, author={Doe, J.}, year={2020}, title={A}}\n"
                       "@misc{b, author={Doe, J.}, year={2020}, title={B}}\n"
                       "@misc{c, author={Roe, R.}, year={2020}, title={C}}\n", "bibtex")
    assert list(AuthorYearLabels().format_labels(bib.entries.values())) == ["Doe 2020a", "Doe 2020b", "Roe 2020"]
