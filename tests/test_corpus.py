import hashlib
import time

import pytest
import torch

from attn_utils import corpus
from attn_utils.corpus import Corpus, data_dir, load_text, split_chapters, strip_gutenberg, token_windows
from attn_utils.models import gpt2_tokenizer

OPENING = "“Well, Prince, so Genoa and Lucca are now just family estates of the"


@pytest.fixture
def seeded(data_cache):
    if not (data_cache / "pg2600.txt").is_file():
        pytest.skip("../shared/data/war-and-peace/pg2600.txt is missing, so the data cache could not be seeded")
    return data_cache / "pg2600.txt"


@pytest.fixture(scope="module")
def tokenizer():
    tok = gpt2_tokenizer()
    tok.model_max_length = 1024
    return tok


def _no_download(*args, **kwargs):
    raise OSError("network unreachable (test)")


def test_data_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTN_COMPANION_DATA", str(tmp_path))
    assert data_dir() == tmp_path
    monkeypatch.delenv("ATTN_COMPANION_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "attn-companion"


def test_war_and_peace_comes_from_the_cache_without_download(seeded, monkeypatch):
    monkeypatch.setattr(corpus, "_download", _no_download)
    assert corpus.war_and_peace_path() == seeded


def test_missing_corpus_offline_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTN_COMPANION_DATA", str(tmp_path))
    monkeypatch.setattr(corpus, "_download", _no_download)
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="ATTN_COMPANION_DATA") as err:
        load_text()
    assert time.perf_counter() - start < 5
    message = str(err.value)
    assert "pg2600.txt" in message and str(tmp_path) in message and "network unreachable" in message


def test_download_lands_in_the_cache(seeded, monkeypatch, tmp_path):
    monkeypatch.setenv("ATTN_COMPANION_DATA", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus, "WAR_AND_PEACE_URL", seeded.as_uri())  # urllib reads file:// like http://
    path = corpus.war_and_peace_path()
    assert path == tmp_path / "cache" / "pg2600.txt"
    assert path.read_bytes() == seeded.read_bytes()
    assert [p.name for p in path.parent.iterdir()] == ["pg2600.txt"]  # no partial file left behind


def test_novel_proper_without_header_licence_or_contents(seeded):
    c = load_text()
    assert c.name == corpus.WAR_AND_PEACE and c.source == str(seeded)
    assert c.text.startswith(OPENING)
    for absent in ("Project Gutenberg", "PROJECT GUTENBERG", "*** START", "CONTENTS", "\nCHAPTER II\n", "BOOK TWO"):
        assert absent not in c.text
    assert c.text.endswith("a dependence of which we are not\nconscious.")
    assert c.n_chapters == 365 and len(c.chapter_titles) == 365 and c.chapters is None


def test_sha256_of_the_raw_file_is_recorded(seeded):
    c = load_text()
    assert c.sha256 == hashlib.sha256(seeded.read_bytes()).hexdigest()


def test_consecutive_chapters_are_counted_across_books(seeded):
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
def test_bad_chapter_ranges_are_refused(seeded, chapters):
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


def test_windows_are_consecutive_slices_of_the_tokenized_text(seeded, tokenizer):
    c = load_text(chapters=(1, 3))
    ids = tokenizer(c.text, add_special_tokens=False, verbose=False)["input_ids"]
    windows = token_windows(c, tokenizer, L=16, offset=5, n_windows=3)
    assert windows.shape == (3, 16) and windows.dtype == torch.long
    assert windows.flatten().tolist() == ids[5:53]
    far = token_windows(c.text, tokenizer, L=100, offset=3000, n_windows=2)  # prefix tokenization stays exact
    assert far.flatten().tolist() == ids[3000:3200]
    assert tokenizer.decode(token_windows(c, tokenizer, L=8)[0]).startswith("“Well, Prince")


def test_too_short_text_says_what_to_change(tokenizer):
    with pytest.raises(ValueError, match=r"has 3 tokens but .* are needed; lower offset, n_windows or L"):
        token_windows("Hello big world", tokenizer, L=2, offset=1, n_windows=2)


def test_window_longer_than_context_is_refused(tokenizer):
    with pytest.raises(ValueError, match="exceeds the model's context of 1024 tokens"):
        token_windows("Hello world", tokenizer, L=1025)


@pytest.mark.parametrize("kwargs", [{"L": 0}, {"L": 4, "offset": -1}, {"L": 4, "n_windows": 0}, {"L": 2.5}])
def test_bad_window_parameters(tokenizer, kwargs):
    with pytest.raises(ValueError):
        token_windows("Hello world, this is a test.", tokenizer, **kwargs)


def test_corpus_record_is_immutable():
    c = Corpus(name="x", source="x", sha256="0" * 64, text="abc")
    with pytest.raises(AttributeError):
        c.text = "changed"
