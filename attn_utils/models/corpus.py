"""Texts to feed the models: War and Peace (Project Gutenberg #2600) or any UTF-8 file, cut into token windows.

War and Peace ships with the project: ``attn_utils/models/data/pg2600.txt.xz`` is the exact file that Project Gutenberg
serves as ``pg2600.txt`` (its licence header and footer kept, as Gutenberg's terms ask of a verbatim copy),
compressed. Its sha256 is pinned in :data:`WAR_AND_PEACE_SHA256` and checked every time it is read, so the novel
never needs the network and a damaged or edited copy is refused. :func:`refresh_war_and_peace` downloads the file
again and rewrites the shipped copy, only when the download has the pinned hash.

When the text is read, the Gutenberg header and licence are stripped. A text with ``CHAPTER`` headings is reduced
to its chapters: front matter and the table of contents are dropped, and so are the BOOK / EPILOGUE / CHAPTER
heading lines themselves, so that token windows contain only prose.
"""
from __future__ import annotations

import hashlib
import lzma
import os
import re
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attn_utils.mathematics.validation import check_int

WAR_AND_PEACE = "War and Peace (Project Gutenberg #2600)"
WAR_AND_PEACE_DATA = Path(__file__).resolve().parent / "data" / "pg2600.txt.xz"
WAR_AND_PEACE_SHA256 = "3bb73e3f3bdc6b5e46f8ad49f750cc84883d96701d1057e2446b1d27cf8d974c"  # of pg2600.txt itself
WAR_AND_PEACE_URL = "https://www.gutenberg.org/cache/epub/2600/pg2600.txt"
DOWNLOAD_TIMEOUT_S = 20

_START = re.compile(r"^\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_END = re.compile(r"^\s*(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG|END OF (THE )?PROJECT GUTENBERG)", re.M | re.I)
_CHAPTER = re.compile(r"^[ \t]*CHAPTER[ \t]+([IVXLCDM]+|\d+)\.?[ \t]*$", re.M)
_PART = re.compile(r"^[ \t]*((BOOK|PART|VOLUME)[ \t]+[A-Z0-9]+\b[^\n]{0,40}|[A-Z ]*EPILOGUE\b[^\na-z]{0,40})$", re.M)


class CorpusDamaged(ValueError):
    """The shipped War and Peace does not have its pinned sha256."""


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _repair_hint() -> str:
    return (f"restore the shipped copy (`git checkout -- attn_utils/models/data/{WAR_AND_PEACE_DATA.name}` "
            "in a clone, or reinstall the package), or download it again with `attn-companion corpus --refresh`")


def war_and_peace_bytes(path: Path | None = None) -> bytes:
    """The bytes of ``pg2600.txt`` from the shipped, xz-compressed copy (``path``, default
    :data:`WAR_AND_PEACE_DATA`); refused unless their sha256 is the pinned one."""
    path = path or WAR_AND_PEACE_DATA
    if not path.is_file():
        raise FileNotFoundError(f"the shipped War and Peace {path} is missing; {_repair_hint()}")
    try:
        raw = lzma.decompress(path.read_bytes())
    except lzma.LZMAError as err:
        raise CorpusDamaged(f"{path} is not a valid xz file ({err}); {_repair_hint()}") from None
    found = hashlib.sha256(raw).hexdigest()
    if found != WAR_AND_PEACE_SHA256:
        raise CorpusDamaged(f"{path} holds a text with sha256 {found}, but War and Peace (Project Gutenberg #2600) "
                            f"has sha256 {WAR_AND_PEACE_SHA256}: the copy is damaged or edited; {_repair_hint()}")
    return raw


def refresh_war_and_peace(url: str = WAR_AND_PEACE_URL, dest: Path | None = None,
                          timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Download ``pg2600.txt`` (``timeout`` seconds) and rewrite the shipped copy ``dest`` (default
    :data:`WAR_AND_PEACE_DATA`), only if the download has the pinned sha256; otherwise raise ``ValueError`` and
    leave ``dest`` as it was."""
    dest = dest or WAR_AND_PEACE_DATA
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            raw = response.read()
    except Exception as err:  # network errors come in many types; all mean the same here
        raise ValueError(f"download of {url} failed: {type(err).__name__}: {err}") from None
    found = hashlib.sha256(raw).hexdigest()
    if found != WAR_AND_PEACE_SHA256:
        raise ValueError(f"{url} served a file with sha256 {found}, not the pinned {WAR_AND_PEACE_SHA256}; the shipped "
                         "copy is kept. If Project Gutenberg has published a new edition, pinning it is a deliberate "
                         "change (WAR_AND_PEACE_SHA256 in attn_utils/models/corpus.py): "
                         "every number of the book may move.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return dest


@dataclass(frozen=True)
class Corpus:
    """A text ready for tokenization, with what is needed to cite it.

    ``sha256`` is the hash of the raw file (before any stripping); ``chapters`` is the selected inclusive range
    ``(first, last)`` (1-based) or ``None`` for the whole text; ``chapter_titles`` names the selected chapters.
    """

    name: str
    source: str
    sha256: str
    text: str
    chapters: tuple[int, int] | None = None
    chapter_titles: tuple[str, ...] = ()
    n_chapters: int = 0


def strip_gutenberg(text: str) -> str:
    """The body between Project Gutenberg's START and END markers (the whole text if there are none)."""
    start = _START.search(text)
    if start:
        text = text[start.end():]
    end = _END.search(text)
    return text[:end.start()] if end else text


def split_chapters(text: str) -> list[tuple[str, str]]:
    """``(title, body)`` of every chapter in reading order; contents entries (headings without prose) are skipped.

    A chapter starts at a ``CHAPTER <roman or arabic>`` line. Its body runs to the next chapter heading, with BOOK /
    PART / EPILOGUE heading lines removed. Titles read e.g. ``"BOOK ONE: 1805, CHAPTER I"``.
    """
    headings = list(_CHAPTER.finditer(text))
    chapters, part = [], ""
    for i, match in enumerate(headings):
        before = text[headings[i - 1].end() if i else 0:match.start()]
        parts = _PART.findall(before)
        if parts:
            part = parts[-1][0].strip()
        end = headings[i + 1].start() if i + 1 < len(headings) else len(text)
        body = _PART.sub("", text[match.end():end]).strip()
        if body:
            chapters.append((f"{part}, CHAPTER {match.group(1)}" if part else f"CHAPTER {match.group(1)}", body))
    return chapters


HEAD_BYTES = 2**20  # the start of a text file checked for NUL bytes before the whole file is read


def _decode(raw: bytes, path: Path) -> str:
    """Text of a file's bytes, BOM removed and newlines normalised."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err}); convert it, e.g. `iconv -t UTF-8`") from None
    if "\x00" in text:
        raise ValueError(f"{path} holds NUL bytes, so it is not a text file; pass a UTF-8 text file")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def load_text(path: str | os.PathLike | None = None, chapters: tuple[int, int] | None = None) -> Corpus:
    """Load the shipped War and Peace (``path=None``, hash-checked) or any UTF-8 text file as a :class:`Corpus`.

    ``chapters=(first, last)`` keeps consecutive chapters ``first..last`` (1-based, inclusive), counted in reading
    order across all books and both epilogues (War and Peace has 365): ``(1, 10)`` is BOOK ONE, chapters I-X.
    ``None`` keeps every chapter (the novel proper), or the whole stripped text of a file without chapters.
    A user's file is named by its file name and recorded with its own sha256, never as War and Peace.
    """
    if path is None:
        source, raw = WAR_AND_PEACE_DATA, war_and_peace_bytes(WAR_AND_PEACE_DATA)
    else:
        source = Path(path).expanduser()
        if not source.is_file():
            raise FileNotFoundError(f"text file {source} does not exist")
        with source.open("rb") as f:  # a binary file (a sparse one of 2 GB) is refused before it is read whole
            if b"\x00" in f.read(HEAD_BYTES):
                raise ValueError(f"{source} holds NUL bytes, so it is not a text file; pass a UTF-8 text file")
        raw = source.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    body = strip_gutenberg(_decode(raw, source))
    if not body.strip():
        raise ValueError(f"{source} holds no text")
    found = split_chapters(body)
    if chapters is not None:
        if not found:
            raise ValueError(f"{source} has no 'CHAPTER <number>' headings, so chapters={chapters!r} cannot be "
                             "selected; use chapters=None for the whole text")
        if not (isinstance(chapters, (tuple, list)) and len(chapters) == 2):
            raise ValueError(f"chapters must be a pair (first, last), got {chapters!r}")
        first = check_int("chapters[0]", chapters[0], 1, len(found))
        last = check_int("chapters[1]", chapters[1], first, len(found))
        selected, chapters = found[first - 1:last], (first, last)
    else:
        selected = found
    text = "\n\n".join(b for _, b in selected) if selected else body.strip()
    name = WAR_AND_PEACE if path is None else source.name
    return Corpus(name=name, source=str(source), sha256=sha, text=text, chapters=chapters,
                  chapter_titles=tuple(t for t, _ in selected), n_chapters=len(found))


def count_tokens(text: str, tokenizer, needed: int) -> int:
    """The tokens of ``text`` (without special tokens), counted on a prefix long enough to hold ``needed`` of them
    (see :func:`prefix_ids`): ``needed`` or more when the text has them, else all of its tokens."""
    return len(prefix_ids(text, tokenizer, needed))


def prefix_ids(text: str, tokenizer, needed: int) -> list[int]:
    """The token ids of the shortest prefix of ``text`` found to hold ``needed`` tokens and a margin of 64 (so that
    cutting it inside a word cannot change the first ``needed``), or of the whole text when it has fewer; tokenized
    without special tokens. The prefix starts at 6 characters a token and doubles."""
    margin = 64
    chars = 6 * (needed + margin)
    while True:
        ids = tokenizer(text[:chars], add_special_tokens=False, verbose=False)["input_ids"]
        if chars >= len(text) or len(ids) >= needed + margin:
            return ids
        chars *= 2


def token_windows(text: str | Corpus, tokenizer, L: int, offset: int = 0, n_windows: int = 1) -> torch.Tensor:
    """``n_windows`` consecutive, non-overlapping windows of ``L`` tokens starting at token ``offset``.

    Returns a LongTensor of shape ``(n_windows, L)``; window ``i`` holds tokens ``offset + i*L`` to
    ``offset + (i+1)*L - 1`` of the text, tokenized without special tokens (no BOS/EOS). Only a prefix long
    enough for the windows is tokenized (:func:`prefix_ids`). The values are the caller's to check
    (``attn_utils.book.params``); a text too short for the windows cannot give that shape (``ValueError``).
    """
    if isinstance(text, Corpus):
        text = text.text
    needed = offset + n_windows * L
    ids = prefix_ids(text, tokenizer, needed)
    if len(ids) < needed:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than the offset + n_windows * L = {needed} that "
                         f"{n_windows} window(s) of shape ({n_windows}, {L}) need")
    return torch.tensor(ids[offset:needed], dtype=torch.long).view(n_windows, L)


@dataclass(frozen=True)
class WindowFormat:
    """How a model's window of L tokens is formed: the special tokens ``prefix`` (ids, and ``prefix_text`` their
    text), then ``L - len(prefix) - len(suffix)`` consecutive tokens of the text, then ``suffix``. GPT-2 and SmolLM2
    read plain text (no special tokens), Gemma 3 needs its ``<bos>`` first, a BERT encoder reads ``[CLS]`` + text +
    ``[SEP]``."""

    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    prefix_text: tuple[str, ...] = field(default=(), compare=False)
    suffix_text: tuple[str, ...] = field(default=(), compare=False)

    @property
    def specials(self) -> int:
        """The special tokens of a window."""
        return len(self.prefix) + len(self.suffix)

    def text_tokens(self, L: int) -> int:
        """The text tokens of a window of ``L`` tokens in all."""
        return L - self.specials

    def describe(self) -> str:
        """The rule in words, e.g. ``"<bos> + L-1 text tokens"``."""
        text = f"L-{self.specials} text tokens" if self.specials else "L text tokens (no special tokens)"
        return " + ".join([*self.prefix_text, text, *self.suffix_text])


def model_windows(text: str | Corpus, tokenizer, L: int, window: WindowFormat | None = None, *, offset: int = 0,
                  n_windows: int = 1) -> torch.Tensor:
    """``n_windows`` windows of ``L`` tokens each as the model reads them (``window``: its :class:`WindowFormat`,
    from ``loading.window_format``; ``None`` is plain text): window ``i`` is ``prefix`` + text tokens
    ``offset + i*n`` to ``offset + (i+1)*n - 1`` + ``suffix``, with ``n = L - len(prefix) - len(suffix)`` (see
    :func:`token_windows`, which cuts the text tokens). ``offset`` counts text tokens. Returns ``(n_windows, L)``.

    A longer window of a causal format (no suffix) starts with the shorter one: its first L tokens are the L-token
    window at the same offset."""
    window = window or WindowFormat()
    L = check_int("L", L, window.specials + 1)
    ids = token_windows(text, tokenizer, window.text_tokens(L), offset=offset, n_windows=n_windows)
    parts = [torch.tensor(window.prefix, dtype=torch.long).expand(ids.shape[0], -1), ids,
             torch.tensor(window.suffix, dtype=torch.long).expand(ids.shape[0], -1)]
    return torch.cat(parts, dim=1)
