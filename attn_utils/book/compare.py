"""Every model of a build, side by side: the last section of each model chapter.

A book build executes each model chapter once per model (:func:`attn_utils.book.build.build_book`): its page shows
the first model, and the executions on the others leave their claims in the build's run records and their figures
in their executed notebooks. :func:`write_section` turns these into the Markdown that the chapter's last section
includes (``_models/<chapter>.md`` in the staged book): the claims of the chapter with a verdict and a number per
model, the sentence that says which verdicts depend on the model, and the chapter's main figures as small
multiples, one per model. Nothing is measured here.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

import nbformat

from attn_utils.book import claims, runlog
from attn_utils.book.formatting import tex

#: the figures of each chapter shown once per model (glued names; the first model's is the one in the chapter), each
#: with what it draws: the caption's title and the alt text's description (the model's name is added to both)
FIGURES = {
    "ch0_setting": {"fig_ch0_heatmaps": (
        "Attention weights of four heads of the first layer",
        "Four heat maps of attention weights, query position against key position, one per head of the first layer")},
    "ch1_vanishing": {"fig_ch1_decay": (
        "Largest attention weights against the row length",
        "Log-log plot of the largest attention weights of a row against the number of keys the row sees")},
    "ch2_distance": {
        "fig_ch2_figure2ab": (
            "The paper's Figure 2 (a, b): distance, main sum and bound against L and N",
            "Two log-log panels of the true distance, the main sum and the bound, against the length and against N"),
        "fig_ch2_figure2c": (
            "The paper's Figure 2 (c): the critical N of the KS test against the length",
            "Log-log plot of the critical N of the Kolmogorov-Smirnov test against the window length")},
    "ch3_separability": {"fig_ch3_figure3": (
        "The paper's Figure 3: the separability fraction against N",
        "Box plots of the per-head separability fraction against the top-N size with the two bounds")},
    "ch4_gradient": {"fig_ch4_figure4": (
        "The paper's Figure 4: the gradient norm against the temperature",
        "Log-log plot of the measured gradient norm against the temperature, one line per perturbation size")},
    "ch6_beyond": {
        "fig_ch6_long_context": (
            "Distance and separability in longer windows",
            "Two panels: the cumulative distance against the window length and the separability fraction against N"),
        "fig_ch6_coverage": (
            "Coverage of the heads' selections and their pairwise correlation",
            "Two panels against N: the observed and predicted coverage of the heads, and box plots of phi")},
}
_MIMES = {"image/svg+xml": "svg", "image/png": "png"}


def glued_figures(notebook: Path, names: list[str]) -> dict[str, tuple[str, bytes]]:
    """The figures glued under ``names`` in an executed notebook: name -> (file suffix, bytes)."""
    found: dict[str, tuple[str, bytes]] = {}
    if not notebook.is_file():
        return found
    for cell in nbformat.read(notebook, as_version=4).cells:
        for output in cell.get("outputs", []):
            meta = output.get("metadata", {}).get("scrapbook", {})
            if meta.get("name") not in names:
                continue
            prefix = meta.get("mime_prefix", "")
            for mime, suffix in _MIMES.items():
                data = output.get("data", {}).get(prefix + mime)
                if data is not None:
                    raw = data.encode() if suffix == "svg" else base64.b64decode(data)
                    found[meta["name"]] = (suffix, raw)
                    break
    return found


def by_model(records: list[dict[str, Any]], chapter: str, models: tuple[str, ...]) -> dict[str, dict[str, dict]]:
    """The chapter's model claims: key -> model -> record (synthetic rows left out), keys in ledger order."""
    order = [k for k, spec in claims.specs().items() if spec.chapter == chapter]
    rows: dict[str, dict[str, dict]] = {}
    for r in records:
        if r["chapter"] == chapter and r["model"] in models:
            rows.setdefault(r["key"], {})[r["model"]] = r
    return {k: rows[k] for k in order if k in rows}


def badge(verdict: str, href: str | None = None) -> str:
    """A verdict in the colour of its figures (``_static/verdicts.css``), a link to ``href`` if given."""
    css = f'verdict verdict-{verdict.replace(" ", "-")}'
    return (f'<a class="{css}" href="{href}">{html.escape(verdict)}</a>' if href else
            f'<span class="{css}">{html.escape(verdict)}</span>')


def claims_table(rows: dict[str, dict[str, dict]], models: tuple[str, ...]) -> str:
    """An HTML table: one row per claim, per model its verdict and what was measured."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ("claim", *models))
    body = []
    for per in rows.values():
        claim = next(iter(per.values()))["claim"]
        cells = [f"<td>{tex(claim)}</td>"]
        for m in models:
            r = per.get(m)
            cells.append("<td>not recorded</td>" if r is None else
                         f"<td>{badge(r['verdict'])}<br><small>{tex(r['ours'])}</small></td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="wide-table"><table class="models-table"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def section(chapter: str, models: tuple[str, ...], records: list[dict[str, Any]],
            figures: dict[str, dict[str, str]]) -> str:
    """The Markdown of the chapter's last section; ``figures``: model -> figure name -> path relative to the
    chapter's page."""
    if len(models) == 1:
        return (f"This build measured one model, {models[0]}. Built with several "
                "(`make book PARAMS=\"models=[smollm2-135m,gemma3-270m,minilm-l6]\"`, the default), this section "
                "shows each claim of the chapter on every model.\n")
    rows = by_model(records, chapter, models)
    changed = claims.depend_on_model({k: {m: r["verdict"] for m, r in per.items()} for k, per in rows.items()},
                                     models)
    said = (f"Of the chapter's {len(rows)} claims measured on a model, "
            + ("every one has the same verdict on every model." if not changed else
               f"{len(rows) - len(changed)} have the same verdict on every model and {len(changed)} depend on it: "
               + "; ".join(next(iter(rows[k].values()))["claim"] for k in changed) + "."))
    if not rows:
        parts = [f"This build executed the chapter on {len(models)} models: {', '.join(models)}. The chapter above "
                 f"shows {models[0]}; it records no claim, and its figures on every model follow.\n"]
    else:
        parts = [f"This build executed the chapter on {len(models)} models: {', '.join(models)}. The chapter above "
                 f"shows {models[0]}; the table gives each claim's verdict on each, by the same rule, with the "
                 f"number the rule decided on. {said}\n", "```{raw} html", claims_table(rows, models), "```", ""]
    # a model on which no claim of the chapter is comparable shows no figure: it would draw what was not measured
    idle = [m for m in models if any(m in per for per in rows.values())
            and all(per[m]["verdict"] == "not comparable" for per in rows.values() if m in per)]
    if idle:
        parts += [f"No figure is shown for {', '.join(idle)}: no claim of this chapter is comparable there.", ""]
    for name, (title, alt) in FIGURES.get(chapter, {}).items():
        shown = [(m, figures[m][name]) for m in models if name in figures.get(m, {}) and m not in idle]
        if not shown:
            continue
        parts += [":::::{grid} 1 1 2 2", ""]
        for m, path in shown:
            parts += ["::::{grid-item}", f":::{{figure}} {path}", f":alt: {alt}, measured on {m}", "",
                      f"{title}, measured on {m}.", ":::", "::::", ""]
        parts += [":::::", ""]
    return "\n".join(parts)


def write_section(chapter: str, models: tuple[str, ...], staging: Path, run_dir: Path) -> Path:
    """Write ``staging/_models/<chapter>.md`` (:func:`section`) and the figures it shows, from the executed
    notebooks of the chapter on every model (the page's and the other models' under ``staging/_variants``)."""
    folder = staging / "_models" / chapter
    folder.mkdir(parents=True, exist_ok=True)
    figures: dict[str, dict[str, str]] = {}
    for i, m in enumerate(models):
        safe = m.replace("/", "_")
        notebook = (staging / "notebooks" / f"{chapter}.ipynb" if i == 0
                    else staging / "_variants" / f"{chapter}--{safe}.ipynb")
        for name, (suffix, data) in glued_figures(notebook, list(FIGURES.get(chapter, {}))).items():
            (folder / f"{safe}--{name}.{suffix}").write_bytes(data)
            figures.setdefault(m, {})[name] = f"../_models/{chapter}/{safe}--{name}.{suffix}"
    path = staging / "_models" / f"{chapter}.md"
    path.write_text(section(chapter, models, runlog.read("claims", run_dir), figures))
    return path
