import hashlib
import lzma
import socket

import pytest
import torch

from attn_utils.models import corpus
from attn_utils.models.corpus import (Corpus, CorpusDamaged, count_tokens, load_text, prefix_ids, split_chapters,
                                      strip_gutenberg, token_windows)
from attn_utils.models.loading import gpt2_tokenizer

OPENING = "“Well, Prince, so Genoa and Lucca are now just family estates of the"


@pytest.fixture(scope="module")
def tokenizer():
    tok = gpt2_tokenizer()
    tok.model_max_length = 1024
    return tok


@pytest.fixture
def raw_novel():
    """The bytes of pg2600.txt, decompressed from the shipped copy (no hash check)."""
    return lzma.decompress(corpus.WAR_AND_PEACE_DATA.read_bytes())


@pytest.fixture
def shipped_copy(tmp_path, monkeypatch):
    """A copy of the shipped file that the corpus reads instead of the real one, for tests that damage it."""
    copy = tmp_path / "data" / corpus.WAR_AND_PEACE_DATA.name
    copy.parent.mkdir()
    copy.write_bytes(corpus.WAR_AND_PEACE_DATA.read_bytes())
    monkeypatch.setattr(corpus, "WAR_AND_PEACE_DATA", copy)
    return copy


def test_the_novel_ships_with_the_package_and_has_the_pinned_hash(raw_novel):
    assert corpus.WAR_AND_PEACE_DATA.is_file() and corpus.WAR_AND_PEACE_DATA.stat().st_size < 1_000_000
    assert hashlib.sha256(raw_novel).hexdigest() == corpus.WAR_AND_PEACE_SHA256
    assert raw_novel.startswith("\ufeff".encode()) and b"The Project Gutenberg EBook of War and Peace" in raw_novel
    assert b"END OF THIS PROJECT GUTENBERG EBOOK WAR AND PEACE" in raw_novel  # licence kept: a verbatim copy


def test_the_novel_is_read_without_network_or_cache(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("reading the shipped novel must not touch the network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(corpus.urllib.request, "urlopen", no_network)
    c = load_text(chapters=(1, 1))
    assert c.name == corpus.WAR_AND_PEACE and c.source == str(corpus.WAR_AND_PEACE_DATA)
    assert c.sha256 == corpus.WAR_AND_PEACE_SHA256


def test_an_edited_copy_is_refused_with_both_hashes_and_the_repair(shipped_copy, raw_novel):
    edited = raw_novel.replace(b"Genoa and Lucca", b"Genoa and Lucky", 1)
    shipped_copy.write_bytes(lzma.compress(edited))
    with pytest.raises(CorpusDamaged) as err:
        load_text()
    message = str(err.value)
    assert str(shipped_copy) in message and corpus.WAR_AND_PEACE_SHA256 in message
    assert hashlib.sha256(edited).hexdigest() in message
    assert "git checkout" in message and "attn-companion corpus --refresh" in message


def test_a_truncated_copy_is_refused(shipped_copy, raw_novel):
    shipped_copy.write_bytes(lzma.compress(raw_novel[: len(raw_novel) // 2]))
    with pytest.raises(CorpusDamaged, match="damaged or edited"):
        load_text(chapters=(1, 2))
    shipped_copy.write_bytes(shipped_copy.read_bytes()[:1000])  # a cut xz stream
    with pytest.raises(CorpusDamaged, match="not a valid xz file"):
        load_text()
    shipped_copy.unlink()
    with pytest.raises(FileNotFoundError, match="is missing"):
        load_text()


def test_refresh_rewrites_the_copy_only_with_the_pinned_hash(shipped_copy, raw_novel, tmp_path):
    download = tmp_path / "pg2600.txt"
    download.write_bytes(raw_novel)
    shipped_copy.write_bytes(b"damaged")
    assert corpus.refresh_war_and_peace(download.as_uri(), shipped_copy) == shipped_copy  # file:// reads like http
    assert corpus.war_and_peace_bytes(shipped_copy) == raw_novel
    assert sorted(p.name for p in shipped_copy.parent.iterdir()) == [shipped_copy.name]  # no partial file left
    download.write_bytes(raw_novel + b"new edition")
    before = shipped_copy.read_bytes()
    with pytest.raises(ValueError, match="not the pinned") as err:
        corpus.refresh_war_and_peace(download.as_uri(), shipped_copy)
    assert hashlib.sha256(raw_novel + b"new edition").hexdigest() in str(err.value)
    assert shipped_copy.read_bytes() == before


def test_refresh_without_network_fails_fast_with_the_reason(shipped_copy):
    before = shipped_copy.read_bytes()
    with pytest.raises(ValueError, match="download of .* failed"):
        corpus.refresh_war_and_peace(timeout=5)  # sockets are closed in the tests
    assert shipped_copy.read_bytes() == before


def test_a_users_copy_of_the_novel_is_never_called_war_and_peace(tmp_path, raw_novel):
    mine = tmp_path / "my-novel.txt"
    mine.write_bytes(raw_novel)
    c = load_text(mine, chapters=(1, 1))
    assert c.name == "my-novel.txt" and c.source == str(mine)
    assert c.sha256 == hashlib.sha256(raw_novel).hexdigest()


def test_novel_proper_without_header_licence_or_contents():
    c = load_text()
    assert c.name == corpus.WAR_AND_PEACE
    assert c.text.startswith(OPENING)
    for absent in ("Project Gutenberg", "PROJECT GUTENBERG", "*** START", "CONTENTS", "\nCHAPTER II\n", "BOOK TWO"):
        assert absent not in c.text
    assert c.text.endswith("a dependence of which we are not\nconscious.")
    assert c.n_chapters == 365 and len(c.chapter_titles) == 365 and c.chapters is None


def test_sha256_of_the_raw_file_is_recorded(raw_novel):
    assert load_text().sha256 == hashlib.sha256(raw_novel).hexdigest()


def test_consecutive_chapters_are_counted_across_books():
    first = load_text(chapters=(1, 2))
    assert first.chapters == (1, 2)
    assert first.chapter_titles == ("BOOK ONE: 1805, CHAPTER I", "BOOK ONE: 1805, CHAPTER II")
    assert first.text.startswith(OPENING)
    assert "Anna Pávlovna’s drawing room was gradually filling" in first.text
    assert "CHAPTER" not in first.text
    book_two = load_text(chapters=(28, 29))
    assert book_two.chapter_titles == ("BOOK ONE: 1805, CHAPTER XXVIII", "BOOK TWO: 1805, CHAPTER I")
    assert book_two.text.startswith("Prince Andrew was to leave next evening.")
    assert "In October, 1805, a Russian army was occupying" in book_two.text
    assert load_text(chapters=(365, 365)).chapter_titles == ("SECOND EPILOGUE, CHAPTER XII",)
    assert load_text().text.startswith(first.text)


@pytest.mark.parametrize("chapters", [(0, 3), (5, 2), (1, 366), (1,), "1-3"])
def test_bad_chapter_ranges_are_refused(chapters):
    with pytest.raises(ValueError, match="chapters"):
        load_text(chapters=chapters)


def test_gutenberg_markers_and_contents_are_stripped_generically(tmp_path):
    book = ("Header\n*** START OF THE PROJECT GUTENBERG EBOOK TEST ***\nCONTENTS\n\n    CHAPTER I\n    CHAPTER II\n\n"
            "PART ONE\n\nCHAPTER I\n\nIt was a dark night.\n\nCHAPTER II\n\nThe end came.\n\n"
            "End of the Project Gutenberg EBook of Test\n*** END OF THE PROJECT GUTENBERG EBOOK TEST ***\nLicence")
    path = tmp_path / "book.txt"
    path.write_text(book, encoding="utf-8")
    c = load_text(path)
    assert c.name == "book.txt" and c.n_chapters == 2
    assert c.text == "It was a dark night.\n\nThe end came."
    assert c.chapter_titles == ("PART ONE, CHAPTER I", "PART ONE, CHAPTER II")
    assert strip_gutenberg(book).strip().startswith("CONTENTS")
    assert [t for t, _ in split_chapters(strip_gutenberg(book))] == list(c.chapter_titles)


def test_any_utf8_text_file_can_be_used(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes("\ufeffLine one,\r\nline two.\r\n".encode())
    c = load_text(path)
    assert c.text == "Line one,\nline two." and c.chapters is None and c.n_chapters == 0
    assert c.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="no 'CHAPTER"):
        load_text(path, chapters=(1, 1))


def test_bad_files_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_text(tmp_path / "missing.txt")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8"):
        load_text(latin)
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x00\x01\x02abc")
    with pytest.raises(ValueError, match="NUL bytes"):
        load_text(binary)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match="holds no text"):
        load_text(empty)


def test_windows_are_consecutive_slices_of_the_tokenized_text(tokenizer):
    c = load_text(chapters=(1, 3))
    ids = tokenizer(c.text, add_special_tokens=False, verbose=False)["input_ids"]
    windows = token_windows(c, tokenizer, L=16, offset=5, n_windows=3)
    assert windows.shape == (3, 16) and windows.dtype == torch.long
    assert windows.flatten().tolist() == ids[5:53]
    far = token_windows(c.text, tokenizer, L=100, offset=3000, n_windows=2)  # prefix tokenization stays exact
    assert far.flatten().tolist() == ids[3000:3200]
    assert tokenizer.decode(token_windows(c, tokenizer, L=8)[0]).startswith("“Well, Prince")


def test_too_short_text_cannot_give_the_windows(tokenizer):
    """The rule offset + L <= tokens is the preflight's (tests/book/test_params.py); here the shape cannot be made."""
    with pytest.raises(ValueError, match=r"the text has 3 tokens, fewer than the offset \+ n_windows \* L = 5"):
        token_windows("Hello big world", tokenizer, L=2, offset=1, n_windows=2)


@pytest.mark.parametrize("needed", [1, 50, 400, 5000])
def test_count_tokens_is_the_count_of_the_whole_text_up_to_the_prefix(tokenizer, needed):
    """The one prefix loop: the count on a prefix is the count of the whole text when the text has fewer tokens,
    and at least ``needed`` otherwise, with the first ``needed`` ids those of the whole text."""
    c = load_text(chapters=(1, 2))
    ids = tokenizer(c.text, add_special_tokens=False, verbose=False)["input_ids"]
    prefix = prefix_ids(c.text, tokenizer, needed)
    assert prefix[:needed] == ids[:needed]
    assert count_tokens(c.text, tokenizer, needed) == (len(ids) if len(ids) < needed else len(prefix)) \
        >= min(needed, len(ids))


def test_corpus_record_is_immutable():
    c = Corpus(name="x", source="x", sha256="0" * 64, text="abc")
    with pytest.raises(AttributeError):
        c.text = "changed"
