"""The whole book, built with small parameters: every notebook executes, and every page renders in a browser.

The build runs once per session (``built_book``); the browser checks use headless Chromium through
selenium and skip with a message when Chromium is not installed (CI installs it).
"""
from __future__ import annotations

import html
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from attn_utils.book import build, claims
from helpers import SMALL

ROOT = Path(__file__).resolve().parents[2]

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,2000"]


@pytest.fixture(scope="session")
def built_book(tmp_path_factory):
    """Build the book with :data:`SMALL` parameters (those some notebook declares) on two models: gpt2-random, which
    the pages show, and the MiniLM encoder beside it (every model chapter executed on both)."""
    out = tmp_path_factory.mktemp("book") / "html"
    declared = set().union(*(build.notebook_parameters(build.ROOT / f"{f}.py")
                              for f in build.toc_files() if f.startswith("notebooks/")))
    given = {k: v for k, v in SMALL.items() if k in declared and k != "model"}
    return build.build_book({**given, "models": [SMALL["model"], SECOND_MODEL]}, out=out, progress=False)


SECOND_MODEL = "minilm-l6"


def chapters() -> list[str]:
    return [Path(f).name for f in build.toc_files() if f.startswith("notebooks/")]


@pytest.mark.slow
def test_every_notebook_executes_and_renders(built_book):
    result = built_book
    model_chapters = [c for c in chapters() if "model" in build.notebook_parameters(build.NOTEBOOK_DIR / f"{c}.py")]
    assert set(result.executions) == set(chapters()) | {f"{c} on {SECOND_MODEL}" for c in model_chapters}
    for name in chapters():
        page = (result.html / "notebooks" / f"{name}.html").read_text()
        assert "Traceback" not in page, f"{name} shows a traceback"
        assert "Pending glue" not in page and "KeyError" not in page, f"{name} has an unresolved glue reference"


@pytest.mark.slow
def test_reproducibility_chapter_says_how_each_notebook_was_computed(built_book):
    """The status table that the build writes after the notebooks ran: one row per chapter, executed or cached."""
    page = (built_book.html / "notebooks" / "ch5_reproducibility.html").read_text()
    for name in chapters():
        row = re.search(rf">{name}</(?:p></)?td>\s*<td[^>]*>(?:<p>)?(executed in this build|from the cache)<", page)
        assert row, f"{name} has no row in the execution status"
    assert "this build executed" in page


@pytest.mark.slow
def test_first_page_names_the_model(built_book):
    result = built_book
    intro = (result.html / "book" / "intro.html").read_text()
    assert "gpt2-random" in intro, "the first page must say which model produced the book"
    assert "intro.html" in (result.html / "index.html").read_text()  # index.html leads to the first page


@pytest.mark.slow
def test_first_page_has_the_results_at_a_glance(built_book):
    """The first page lists the models, counts the verdicts, and gives every headline claim and every claim that
    fails at a glance, each badge a link to its row of the ledger, which offers its records as CSV and JSON."""
    intro = (built_book.html / "book" / "intro.html").read_text()
    ledger = (built_book.html / "notebooks" / "ch5_reproducibility.html").read_text()
    assert '<table class="glance">' in intro and 'class="verdict verdict-' in intro
    assert "ch5_reproducibility.html" in intro and "sources.html" in intro  # the ledger and the sources page
    assert intro.count('<li><strong>') >= 2 and 'class="model-list"' in intro  # one entry per model
    assert 'make book PARAMS="model=gpt2"' in html.unescape(re.sub(r"<[^>]+>", "", intro))
    rows = claims.load(built_book.records)
    shown = {k for k, spec in claims.specs().items() if spec.headline} | set(rows.key[rows.verdict == "fails"])
    glance = intro[intro.index('<table class="glance">'):]
    glance = glance[:glance.index("</table>")]
    linked = set(re.findall(r'ch5_reproducibility\.html#claim-([\w-]+)"', glance))
    assert linked == shown & set(rows.key), f"at a glance, missing: {shown & set(rows.key) - linked}"
    assert all(f'<tr id="claim-{key}">' in ledger for key in linked)  # each badge's link lands on its row
    for kind in ("csv", "json"):
        assert f'download="claims.{kind}"' in ledger


@pytest.mark.slow
def test_every_internal_link_lands_on_a_page_and_an_anchor(built_book):
    """Every link of the pages to another page of the book finds that page, and its ``#fragment`` an element with
    that id there (the ledger's and the first page's links to the sections that measure each claim among them)."""
    root, ids, broken, checked = built_book.html.resolve(), {}, [], 0
    for page in [root / "index.html", *_pages(built_book.html)]:
        for href in re.findall(r'href="([^"#:]*)(?:#([^"]*))?"', page.read_text()):
            path, fragment = href
            target = (page.parent / path).resolve() if path else page
            if target.suffix != ".html" or root not in target.parents:
                continue
            checked += 1
            if not target.is_file():
                broken.append(f"{page.relative_to(root)}: {path} (no such page)")
            elif fragment:
                if target not in ids:
                    ids[target] = set(re.findall(r'\bid="([^"]+)"', target.read_text()))
                if html.unescape(fragment) not in ids[target]:
                    broken.append(f"{page.relative_to(root)}: {path}#{fragment} (no such anchor)")
    assert checked > 500 and not broken, "\n".join(broken[:20])


@pytest.mark.slow
def test_claims_ledger_is_filled(built_book):
    ledger = claims.load(built_book.records)
    assert len(ledger) >= 10
    assert set(ledger.verdict) <= set(claims.VERDICTS)
    assert set(ledger.chapter.str[:3]) >= {"ch1", "ch2", "ch3", "ch4"} or len(set(ledger.notebook)) >= 4
    # every model claim on both models, every synthetic claim once
    model_keys = set(ledger.key[ledger.model != claims.SYNTHETIC])
    for model in (SMALL["model"], SECOND_MODEL):
        assert set(ledger.key[ledger.model == model]) == model_keys, f"{model} lacks model claims"
    assert not ledger[ledger.model == claims.SYNTHETIC].key.duplicated().any()


@pytest.mark.slow
def test_every_model_is_shown_in_the_chapters_and_the_ledger(built_book):
    """Each model chapter's last section gives its claims on both models, with the second model's figures; the
    ledger has a column per model; the first page counts the verdicts that depend on the model."""
    for name in chapters():
        if name == "ch5_reproducibility":
            continue
        page = (built_book.html / "notebooks" / f"{name}.html").read_text()
        assert "The same claims on every model" in page
        assert f"2 models: {SMALL['model']}, {SECOND_MODEL}" in page, f"{name}: no section on every model"
        assert ('class="models-table"' in page) == (name != "ch0_setting"), f"{name}: claims x models table"
    ch2 = (built_book.html / "notebooks" / "ch2_distance.html").read_text()
    assert re.search(rf'<img[^>]+src="[^"]*{SECOND_MODEL}--fig_ch2_figure2ab', ch2), "no small multiple of MiniLM"
    ledger = (built_book.html / "notebooks" / "ch5_reproducibility.html").read_text()
    assert f">{SMALL['model']}</th>" in ledger and f">{SECOND_MODEL}</th>" in ledger
    intro = (built_book.html / "book" / "intro.html").read_text()
    assert "same on every model?" in intro and "all-MiniLM-L6-v2" in intro
    assert f"requested explicitly (models=['{SMALL['model']}', '{SECOND_MODEL}'])" in html.unescape(intro)


def _browser():
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("headless Chromium not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = shutil.which("chromium")
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp()}")
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


# True once MathJax has typeset the page. Its deferred script may run after the load that driver.get waits for when
# both cores are busy, so this polls for MathJax for up to 20 s (the script timeout is 30 s); on failure it says what
# the page had: its ready state, whether it has MathJax's script element (a page without one is not waited for once
# the document is parsed: while it is still loading, the element may not be parsed yet, as a run under load showed,
# readyState 'loading' and no script) and MathJax's configuration.
WAIT_FOR_MATHJAX = """
const done = arguments[arguments.length - 1];
const deadline = Date.now() + 20000;
(function wait() {
  const script = Array.from(document.scripts).some(s => /mathjax/i.test(s.src));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    MathJax.startup.promise.then(() => done(true)).catch(e => done('MathJax failed: ' + e));
  } else if ((!script && document.readyState !== 'loading') || Date.now() > deadline) {
    done({readyState: document.readyState, script: script, config: !!window.MathJax});
  } else { setTimeout(wait, 50); }
})();
"""


def _pages(html: Path) -> list[Path]:
    return sorted(p for p in html.rglob("*.html")
                  if p.parent.name in ("notebooks", "book") and not p.name.startswith("_"))


ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/(?:tmp|work|home|root|Users|usr|var)/\S+")
IMAGE_PATH = re.compile(r"\.(?:png|svg|jpe?g|gif)\b|^[_./]|\b(?:notebooks|_images|_build|image)/|\bcell\d", re.I)

# What the tests below check of a page, read in one pass once MathJax has typeset it: the count of typeset math and
# its errors, the text, the images that did not load, the glued values, every image of the text (its numbered caption,
# its alt text, whether it stays sharp when zoomed, whether a click opens it full size), the table cells that pandas
# truncated, tables wider than their container without a scroll box of their own; the layout defects (cells of
# tables with under 4 px of horizontal padding, display equations wider than their column, statement boxes whose
# title carries a number of the book, which would name another result than the paper's, numeric cells not
# right-aligned, the results at a glance and the ledger wider than the column); and how far the page scrolls sideways.
SEEN = """
const article = document.querySelector('article') || document.body;
const all = (selector, root) => Array.from((root || document).querySelectorAll(selector));
const images = all('article img').map(i => {
  const figure = i.closest('figure'), caption = figure ? figure.querySelector('figcaption') : null;
  return {src: i.getAttribute('src'), alt: i.getAttribute('alt') || '',
          caption: caption ? caption.innerText.trim() : '', in_figure: !!i.closest('article figure'),
          linked: !!(i.closest('a') && i.closest('a').href),
          sharp: /\\.svg$/i.test(i.src) || i.naturalWidth >= 1.5 * i.getBoundingClientRect().width};
});
const unboxed = all('article table').filter(t => {
  const box = t.parentElement.getBoundingClientRect();
  if (t.scrollWidth <= box.width + 1) return false;
  for (let e = t; e && e !== document.body; e = e.parentElement) {
    if (['auto', 'scroll'].includes(getComputedStyle(e).overflowX)) return false;
  }
  return true;
}).map(t => t.className || t.innerText.slice(0, 40));
const tight = all('table td, table th', article).filter(c => {
  const s = getComputedStyle(c);
  return c.innerText.trim() && (parseFloat(s.paddingLeft) < 4 || parseFloat(s.paddingRight) < 4);
}).map(c => c.innerText.slice(0, 20));
const cut = all('mjx-container[display="true"]', article).filter(m => {
  const math = m.querySelector('mjx-math');
  return math && math.getBoundingClientRect().width > m.getBoundingClientRect().width + 1;
}).map(m => {
  const items = window.MathJax && MathJax.startup.document.getMathItemsWithin ? MathJax.startup.document
    .getMathItemsWithin(m) : [];
  return (items.length ? items[0].math : m.innerText).slice(0, 80);
});
const numbered = all('div.proof > p.admonition-title', article).map(t => t.innerText.trim())
  .filter(t => /^(Definition|Theorem|Lemma|Corollary|Proposition|Remark|Assumption|Conjecture|Example)\\s+\\d/.test(t));
return JSON.stringify({
  n_math: all('mjx-container').length, text: document.body.innerText,
  math_errors: all('mjx-merror').map(e => e.getAttribute('data-mjx-error') || e.innerText).slice(0, 5),
  broken: Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
  glued: all('.pasted-text, .pasted-inline').map(e => e.innerText), images: images,
  truncated: all('td, th').filter(c => ['...', '\u2026'].includes(c.innerText.trim())).length, unboxed: unboxed,
  tight: tight.slice(0, 5), cut: cut, numbered: numbered,
  left: all('table.output-table td.num', article).filter(c => getComputedStyle(c).textAlign !== 'right').length,
  sideways: document.documentElement.scrollWidth - window.innerWidth,
  unscrolled_wider: all('table.glance, table.ledger', article).map(t => t.scrollWidth - t.clientWidth)});
"""


SIDEWAYS = """
const done = arguments[arguments.length - 1];
const sideways = () => document.documentElement.scrollWidth - window.innerWidth;
requestAnimationFrame(() => requestAnimationFrame(() => done(sideways())));
"""


def _seen(html: Path) -> tuple[dict[Path, dict], dict[Path, dict]]:
    """:data:`SEEN` of every page of the book at 1280 x 2000 px, and, the same page resized to a phone's 400 x 900 px,
    how far it scrolls sideways: one load of each page in one browser. (The resize reads what a load at 400 px would:
    the theme's layout is CSS, and MathJax 3's CHTML output does not depend on the width, having no line breaking.)"""
    driver = _browser()
    driver.set_script_timeout(30)
    at_1280, at_400 = {}, {}
    try:
        for page in _pages(html):
            driver.set_window_size(1280, 2000)
            driver.get(page.as_uri())
            typeset = driver.execute_async_script(WAIT_FOR_MATHJAX)
            at_1280[page] = {**json.loads(driver.execute_script(SEEN)), "typeset": typeset}
            driver.set_window_size(400, 900)
            at_400[page] = {"sideways": driver.execute_async_script(SIDEWAYS)}
    finally:
        driver.quit()
    return at_1280, at_400


@pytest.fixture(scope="module")
def seen(built_book) -> tuple[dict[Path, dict], dict[Path, dict]]:
    return _seen(built_book.html)


@pytest.fixture(scope="module")
def at_1280(seen) -> dict[Path, dict]:
    return seen[0]


@pytest.fixture(scope="module")
def at_400(seen) -> dict[Path, dict]:
    return seen[1]


@pytest.mark.slow
def test_pages_render_in_a_browser(at_1280):
    assert len(at_1280) >= len(chapters()) + 3
    for page, seen in at_1280.items():
        if 'class="math' in page.read_text():
            assert seen["typeset"] is True, f"{page.name}: MathJax did not load: {seen['typeset']}"
            assert seen["n_math"] > 0, f"{page.name}: no typeset math"
        assert not seen["math_errors"], f"{page.name}: TeX that MathJax cannot typeset: {seen['math_errors']}"
        text, glued = seen["text"], seen["glued"]
        for raw in ("\\(", "\\)", "\\[", "$$"):
            assert raw not in text, f"{page.name}: raw TeX {raw!r} left in the page"
        assert not seen["broken"], f"{page.name}: images that did not load: {seen['broken']}"
        if "notebooks" in page.parts or page.name == "intro.html":
            assert glued, f"{page.name}: no glued numbers in the prose"
        assert all(g.strip() for g in glued), f"{page.name}: an empty glued value"
        assert not [g for g in glued if any(w in g for w in ("Error", "Exception", "Traceback"))], \
            f"{page.name}: a raw exception in the prose"
        for outside in ("NOTES", "[INFERRED]", "paper/NOTES.md", "/".join(("..", "shared"))):
            assert outside not in text, f"{page.name}: points to material the reader does not have: {outside!r}"
        local = ABSOLUTE_PATH.findall(text)
        assert not local, f"{page.name}: a path of the machine that built the book: {local[:3]}"
        for image in seen["images"]:
            assert image["caption"].startswith("Figure "), f"{page.name}: an image without a numbered caption: {image}"
            alt = image["alt"]
            assert len(alt.split()) >= 6 and not IMAGE_PATH.search(alt), \
                f"{page.name}: the alt text of {image['src']} does not describe the figure: {alt!r}"
            assert image["sharp"], f"{page.name}: {image['src']} is neither SVG nor a 2x image"
        assert not seen["truncated"], f"{page.name}: a table truncated by pandas"
        assert not seen["unboxed"], \
            f"{page.name}: tables wider than the text column without a scroll box: {seen['unboxed']}"


NETWORK_SCRIPT = re.compile(r"<script[^>]+src=[\"'](?:https?:)?//", re.I)


@pytest.mark.slow
def test_pages_load_no_script_from_the_network(built_book):
    """The book works offline: no script from a CDN (require.js, the ipywidgets manager, MathJax), no widget state."""
    for page in _pages(built_book.html):
        source = page.read_text()
        assert not NETWORK_SCRIPT.findall(source), f"{page.name} loads a script from the network"
        assert "application/vnd.jupyter.widget" not in source, f"{page.name} embeds ipywidgets state"


@pytest.mark.slow
def test_tables_equations_and_boxes_read_at_1280_px(at_1280):
    """At 1280 px: table cells padded, numbers right-aligned, every display equation within its column, and no
    statement box numbered by the book (its number would collide with the paper's: "Theorem 2 (Theorem 1 ...)")."""
    problems = []
    for page, found in at_1280.items():
        for kind, what in (("table cells with under 4 px of padding", found["tight"]),
                           ("display equations wider than the column", found["cut"]),
                           ("statement boxes numbered by the book", found["numbered"])):
            if what:
                problems.append(f"{page.name}: {kind}: {what}")
        if found["left"]:
            problems.append(f"{page.name}: {found['left']} numeric cells not right-aligned")
        if any(w > 1 for w in found["unscrolled_wider"]):  # the results at a glance and the ledger, without scrolling
            problems.append(f"{page.name}: the results at a glance or the ledger scroll sideways by "
                            f"{found['unscrolled_wider']} px")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_no_page_scrolls_sideways_on_a_phone(at_400):
    """At 400 px no page of the book is wider than the screen (tables, code and equations scroll in their boxes)."""
    wide = {page.name: seen["sideways"] for page, seen in at_400.items() if seen["sideways"] > 1}
    assert len(at_400) >= len(chapters()) + 3
    assert not wide, f"pages that scroll sideways at 400 px (by px): {wide}"


@pytest.mark.slow
def test_figures_open_full_size(at_1280):
    """Every figure of a chapter is a link to its image (figures.js), so a click opens it at full size."""
    for page, seen in at_1280.items():
        unlinked = [i["src"] for i in seen["images"] if i["in_figure"] and not i["linked"]]
        assert not unlinked, f"{page.name}: figures that do not open full size: {unlinked}"


def test_image_titles_do_not_number_figures():
    """An image title that says "Figure 2" next to the book's caption "Figure 11" names two numbers for one figure:
    a title that names one of the paper's figures says so ("the paper's Figure 2 ... redrawn")."""
    sources = [*ROOT.glob("notebooks/*.py"), *ROOT.glob("attn_utils/book/chapters/**/*.py")]
    bare = [f"{src.name}: {line.strip()[:80]}" for src in sources for line in src.read_text().splitlines()
            if re.search(r"(title|model_title)\b.*[\"']Figure \d", line)]
    assert not bare, f"image titles that number a figure: {bare}"
