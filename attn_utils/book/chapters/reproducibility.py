"""The reproducibility chapter: the claims ledger of a build, its provenance records, and its run times beside
the paper's Table 1. Everything here reads the run records that the other chapters wrote
(:mod:`attn_utils.book.runlog`); nothing is measured."""
from __future__ import annotations

import base64
import html
import json
from collections import Counter

import matplotlib.pyplot as plt
import pandas as pd

from attn_utils.book import claims, figures, runlog, sources
from attn_utils.book.compare import badge
from attn_utils.book.formatting import fmt, tex

PAPER_MODEL = "gpt2"
# The paper's Table 1 (Appendix B): minutes on an Apple M1 Pro, and whether the run was parallel. Our distance
# chapter computes Figure 2a and 2b from shared per-row values, so Algorithms 1 and 2 are one row.
PAPER_TABLE_1 = {"Algorithms 1-2": (24 + 37, "no"), "Algorithm 3": (17 * 60 + 4, "yes"),
                 "Algorithm 4": (7, "no"), "Algorithm 5": (1, "no")}
# the provenance records, split into two tables that fit the text column: what was measured, and how
PROVENANCE_WHAT = ["notebook", "model", "weights sha256", "corpus", "corpus sha256"]
PROVENANCE_HOW = ["notebook", "requested", "L", "offsets", "seed", "device"]
# the page of this chapter, where the ledger's rows are (the first page links to them)
LEDGER_PAGE = "ch5_reproducibility.html"


def ledger() -> pd.DataFrame:
    """The build's claims; a ``RuntimeError`` if no chapter recorded any (this chapter runs after the others)."""
    rows = claims.load()
    if rows.empty:
        raise RuntimeError("no claims were recorded: execute the chapters before this one "
                           "(attn-companion book does it in order)")
    return rows


def models(rows: pd.DataFrame | None = None) -> tuple[str, ...]:
    """The models of this build, first the one the chapters' pages show (the build's record; else those of ``rows``)."""
    found = runlog.read("build")
    if found:
        return tuple(found[0]["models"])
    return tuple(sorted(set(rows.model) - {claims.SYNTHETIC})) if rows is not None else ()


def depends(rows: pd.DataFrame, measured: tuple[str, ...]) -> list[str]:
    """The claims measured on a model whose verdict is not the same on every model of ``measured``
    (:func:`attn_utils.book.claims.depend_on_model`)."""
    model_rows = rows[rows.model != claims.SYNTHETIC]
    verdicts = {key: dict(zip(group.model, group.verdict)) for key, group in model_rows.groupby("key", sort=False)}
    return claims.depend_on_model(verdicts, measured)


def summary(rows: pd.DataFrame) -> dict:
    """Counts per verdict (``n_<verdict>``) over the rows (one per claim and model), the number of claims and of rows,
    the pretrained models measured and how many model claims depend on the model."""
    counts = rows.verdict.value_counts()
    measured = models(rows)
    keys = rows[rows.model != claims.SYNTHETIC].key.unique()
    changed = depends(rows, measured)
    paper = ("one of them is the paper's GPT-2 small" if PAPER_MODEL in measured else
             "none of them is the paper's GPT-2 small, so every empirical verdict is about other pretrained models")
    return {"n_claims": len(rows), "n_keys": rows.key.nunique(), "n_model_keys": len(keys),
            **{f"n_{v.replace(' ', '_')}": int(counts.get(v, 0)) for v in claims.VERDICTS},
            "n_models": len(measured), "n_depend": len(changed), "n_same": len(keys) - len(changed),
            "ledger_models": ", ".join(measured) if measured else "no pretrained model",
            "ledger_model_is_paper": paper}


def wide(rows: pd.DataFrame, across: dict | None = None) -> pd.DataFrame:
    """The ledger, one row per claim (indexed by key, in chapter order): chapter, its short name (``glance``), the
    claim, what the paper says; per model (``synthetic`` for the statements checked on synthetic data) the verdict
    and what was measured, ``"verdict: ours"`` ("" where it was not measured); with ``across`` (:func:`windows`),
    the column of :func:`stability` of the first model; the rule that decided it."""
    measured = models(rows)
    columns = [claims.SYNTHETIC, *measured]
    first = rows.drop_duplicates("key").set_index("key")
    table = pd.DataFrame({"chapter": first.chapter, "statement": first.glance, "claim": first.claim,
                          "paper": first.paper})
    for m in columns:
        own = rows[rows.model == m].set_index("key")
        table[m] = [f"{own.verdict[k]}: {own.ours[k]}" if k in own.index else "" for k in table.index]
    table = table.loc[:, [c for c in table.columns if c not in columns or (table[c] != "").any()]]
    if across is not None and measured:
        lead = rows[rows.model.isin([measured[0], claims.SYNTHETIC])].drop_duplicates("key").set_index("key")
        table[stability_column(across)] = stability(lead.reset_index(), across).set_axis(lead.index) \
            .reindex(table.index).fillna("")
    table["rule"] = first.rule
    return table


def section_href(key: str, chapter: str, link_prefix: str = "") -> str:
    """The address of the section that measures claim ``key`` of ``chapter``: its page, at the label of
    ``ClaimSpec.section`` (the page alone for a record of a claim no ledger file states)."""
    spec = claims.specs().get(key)
    return f"{link_prefix}{chapter}.html" + (f"#{spec.section}" if spec and spec.section else "")


def row_id(key: str) -> str:
    """The anchor of claim ``key``'s row in the ledger (the first page's badges link to it)."""
    return f"claim-{key}"


def ledger_html(rows: pd.DataFrame, across: dict | None = None, link_prefix: str = "") -> str:
    """The ledger for reading: one table, grouped by chapter (a heading row that links to it), one row per claim
    (anchor :func:`row_id`) with, in its first cell, its statement (math typeset, linking to the section that
    measures it) over the claim, what the paper says and the rule; per model the badge and what was measured (one
    cell across the models for a statement checked on synthetic data), and the windows' column with ``across``. Four
    columns for three models: the table fits the text column at 1280 px."""
    table = wide(rows, across)
    measured = [m for m in models(rows) if m in table.columns]
    rest = [c for c in table.columns if c not in ("chapter", "statement", "claim", "paper", "rule",
                                                  claims.SYNTHETIC, *measured)]
    head = ["statement: the claim, the paper, our rule", *(measured or [claims.SYNTHETIC]), *rest]

    def said(value: str) -> str:
        verdict, _, ours = value.partition(": ")
        return f"{badge(verdict)}<br><small>{tex(ours)}</small>" if value else ""

    body = []
    for chapter, group in table.groupby("chapter", sort=False):
        body.append(f'<tr class="chapter"><th colspan="{len(head)}"><a href="{link_prefix}{chapter}.html">'
                    f'{html.escape(sources.chapter_title(chapter))}</a></th></tr>')
        for key, r in group.iterrows():
            cells = [f'<td><a href="{section_href(key, chapter, link_prefix)}"><strong>{tex(r.statement)}</strong></a>'
                     f"<br><small>{tex(r.claim)}</small><br><small><em>the paper:</em> {tex(r.paper)}</small>"
                     f"<br><small><em>rule:</em> {html.escape(r.rule)}</small></td>"]
            if r.get(claims.SYNTHETIC):
                cells.append(f'<td colspan="{max(len(measured), 1)}">{said(r[claims.SYNTHETIC])} '
                             f"<small>(synthetic data)</small></td>")
            else:
                cells += [f"<td>{said(r[m])}</td>" for m in measured]
            cells += [f"<td>{html.escape(r[c])}</td>" for c in rest]
            body.append(f'<tr id="{row_id(key)}">' + "".join(cells) + "</tr>")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f'<table class="ledger"><thead><tr>{header}</tr></thead><tbody>{"".join(body)}</tbody></table>'


RECORD_FIELDS = ["key", "chapter", "model", "verdict", "claim", "paper", "ours", "rule", "note", "values"]


def downloads(rows: pd.DataFrame) -> str:
    """Two links that download the ledger's records (one per claim and model, fields :data:`RECORD_FIELDS`) as CSV
    and as JSON; the files are inside the page (data: URLs), so they work offline and match the page."""
    records = rows[RECORD_FIELDS].to_dict("records")
    as_csv = rows[RECORD_FIELDS].assign(values=[json.dumps(v, sort_keys=True) for v in rows["values"]]) \
        .to_csv(index=False)
    as_json = json.dumps(records, indent=1, default=str)
    links = [(f"data:text/csv;charset=utf-8;base64,{base64.b64encode(as_csv.encode()).decode()}", "claims.csv", "CSV"),
             (f"data:application/json;base64,{base64.b64encode(as_json.encode()).decode()}", "claims.json", "JSON")]
    return "Download the records: " + " · ".join(
        f'<a class="download" download="{name}" href="{url}">{name}</a> ({kind})' for url, name, kind in links)


def windows() -> dict | None:
    """The result of ``attn-companion windows`` that this build was given (``attn-companion book --windows FILE``
    leaves it in the run records), or None: the default build measures one window."""
    found = runlog.read("windows")
    return found[0] if found else None


def stability_column(across: dict) -> str:
    return f"stable across {across['K']} windows"


def stability(rows: pd.DataFrame, across: dict) -> pd.Series:
    """Per ledger row, for a claim measured on a model: ``yes`` when its verdict was the same in all K windows,
    else ``no`` with the verdicts seen and how often (``not recorded`` for a window whose run failed), then the
    median [min, max] across windows of its headline number (the first value its rule names); ``not measured``
    for a model claim the windows lack; empty for synthetic rows, which do not depend on the window."""
    by_key = {(c["key"], c["model"]): c for c in across["claims"]}

    def text(key: str, model: str) -> str:
        if model == claims.SYNTHETIC:
            return ""
        c = by_key.get((key, model))
        if c is None:
            return "not measured"
        counts = Counter(v or "not recorded" for v in c["verdicts"])
        said = "yes" if c["stable"] else "no: " + ", ".join(f"{v} x{n}" for v, n in counts.items())
        if c["headline"] in c["values"]:
            s = c["values"][c["headline"]]
            said += f"; {c['headline']} {fmt(s['median'])} [{fmt(s['min'])}, {fmt(s['max'])}]"
        return said

    return pd.Series([text(k, m) for k, m in zip(rows.key, rows.model)], index=rows.index, dtype=object)


def windows_summary(rows: pd.DataFrame, across: dict | None) -> dict:
    """``windows_note``, the sentence that says how many windows this build's model claims were measured on and,
    with ``across``, how many of them are stable."""
    if across is None:
        return {"windows_note": "This build measured each claim on one window of the novel (its provenance is "
                                "below); the result of attn-companion windows, passed to the build, adds a column "
                                "that says whether each verdict holds across windows spread over the novel"}
    column = stability(rows, across)
    model = column[rows.model != "synthetic"]
    measured = model[model != "not measured"]
    absent = sorted(set(rows.chapter[model.index[model == "not measured"]]))
    starts = ", ".join(str(w["chapter"]) for w in across["windows"])
    note = (f"The claims measured on a model were also measured on {across['K']} windows spread over the novel "
            f"(starting at chapters {starts} of {across['n_chapters']}): the column '{stability_column(across)}' "
            f"says yes when a verdict was the same in every window, else which verdicts were seen, and the median "
            f"[min, max] across windows of the number its rule decides on; {int(measured.str.startswith('yes').sum())} "
            f"of the {len(measured)} model claims measured there are stable")
    if absent:
        note += (f"; {len(model) - len(measured)} model claims of {', '.join(absent)} were not measured there "
                 f"(attn-companion windows --notebooks adds a chapter)")
    return {"windows_note": note}


def verdict_figure(rows: pd.DataFrame) -> plt.Figure:
    """Stacked bars: how many rows of each chapter got each verdict, the count written on each segment; one
    colour per verdict (:data:`figures.VERDICT_COLOURS`), the legend beside the bars."""
    order = [v for v in claims.VERDICTS if v in set(rows.verdict)]
    counts = rows.groupby(["chapter", "verdict"]).size().unstack(fill_value=0).reindex(columns=order)
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(counts) + 1.6))
    counts.plot.barh(stacked=True, ax=ax, width=0.75, edgecolor="black", linewidth=0.5,
                     color=[figures.VERDICT_COLOURS[v] for v in order])
    for bars in ax.containers:
        ax.bar_label(bars, labels=[f"{int(b.get_width())}" if b.get_width() else "" for b in bars],
                     label_type="center", fontsize="small")
    ax.invert_yaxis()
    ax.set(xlabel="rows of the ledger", ylabel="", xlim=(0, 1.02 * counts.sum(axis=1).max()))
    ax.grid(False, axis="y")
    ax.legend(title="verdict", loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    figures.model_title(fig, "Verdicts per chapter, every model of the build", ", ".join(models(rows)) or
                        "synthetic only")
    return fig


def provenance() -> pd.DataFrame:
    """One row per chapter that measured a model: model and weights hash, corpus and its hash, window, seed, device
    (columns :data:`PROVENANCE_WHAT` and :data:`PROVENANCE_HOW`)."""
    return pd.DataFrame([{
        "notebook": r["notebook"], "model": r["model"], "requested": r["requested"],
        "weights sha256": r["weights_sha256"][:16], "corpus": r["corpus"], "corpus sha256": r["corpus_sha256"][:16],
        "L": r["L"], "offsets": ", ".join(map(str, r["window_offsets"])), "seed": r["seed"], "device": r["device"],
    } for r in runlog.read("provenance")], columns=list(dict.fromkeys(PROVENANCE_WHAT + PROVENANCE_HOW)))


def environment() -> dict:
    """The package versions and the lock file of the build, from its first provenance record."""
    records = runlog.read("provenance")
    if not records:
        return {"versions": "not recorded", "lock": "not recorded"}
    first = records[0]
    lock = first.get("lock") or {}
    return {"versions": ", ".join(f"{k} {v}" for k, v in first["versions"].items()),
            "lock": (f"{lock['file']} (sha256 {lock['sha256'][:16]}...), "
                     + ("every pin installed" if not lock["differ"] else f"{len(lock['differ'])} pins differ"))
            if lock.get("sha256") else "no lock file"}


def table1() -> pd.DataFrame:
    """The paper's Table 1 beside the wall time this build spent in each algorithm (checks included), and the ratio
    paper time / our time (NaN where the algorithm did not run in this build)."""
    lead = (models() or ("",))[0]
    timings = pd.DataFrame(runlog.read("timings"), columns=["algorithm", "notebook", "model", "seconds"])
    timings = timings[timings.model.astype(object).fillna("").isin(["", lead])]  # the chapters' pages: the first model
    timings["algorithm"] = timings.algorithm.replace({"Algorithm 1": "Algorithms 1-2", "Algorithm 2": "Algorithms 1-2"})
    ours = timings.groupby("algorithm").seconds.sum()
    return pd.DataFrame([{
        "algorithm": name, "paper (min)": minutes, "paper parallel": parallel,
        "ours (s)": float(ours[name]) if name in ours else "not run",
        "paper / ours": minutes * 60 / float(ours[name]) if ours.get(name, 0) > 0 else float("nan"),
    } for name, (minutes, parallel) in PAPER_TABLE_1.items()])


def totals(table_1: pd.DataFrame) -> dict:
    """The paper's total hours and ours in seconds, for the prose."""
    ours = pd.to_numeric(table_1["ours (s)"], errors="coerce").sum()
    return {"paper_total_h": sum(m for m, _ in PAPER_TABLE_1.values()) / 60, "ours_total_s": round(float(ours))}


def glance(rows: pd.DataFrame, link_prefix: str = "../notebooks/") -> str:
    """The book's first page: an HTML table with one row per headline claim of the paper and per claim that fails,
    in chapter order: its short name (math typeset) linking to the section that measures it; per model of the build
    the verdict's badge, a link to its row of the ledger, over the deciding number (``brief``), or one cell across
    the models for a statement checked on synthetic data; whether the verdict is the same on every model (with
    several)."""
    shown_keys = [key for key, spec in claims.specs().items() if spec.headline
                  or (rows[rows.key == key].verdict == "fails").any()]
    measured = models(rows)
    changed = set(depends(rows, measured))
    first = rows[rows.key.isin(shown_keys)].drop_duplicates("key").sort_values(["chapter", "key"])
    several = len(measured) > 1  # with one model, "the same on every model" says nothing
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ("claim of the paper", *measured,
                                                            *(["same on every model?"] if several else [])))
    ledger_page = f"{link_prefix}{LEDGER_PAGE}"
    body = []
    for r in first.itertuples():
        cells = [f'<td><a href="{section_href(r.key, r.chapter, link_prefix)}">{tex(r.glance)}</a></td>']
        own = rows[rows.key == r.key].set_index("model")

        def cell(m: str) -> str:
            v = own.loc[m]
            return f"{badge(v.verdict, f'{ledger_page}#{row_id(r.key)}')}<br><small>{tex(v.brief)}</small>"

        if claims.SYNTHETIC in own.index:
            cells.append(f'<td colspan="{max(len(measured), 1)}">{cell(claims.SYNTHETIC)} '
                         f'<small>(synthetic data)</small></td>' + ("<td></td>" if several else ""))
        else:
            cells += [f"<td>{cell(m) if m in own.index else 'not measured'}</td>" for m in measured]
            cells += [f"<td>{'no' if r.key in changed else 'yes'}</td>"] if several else []
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table class="glance"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def verdict_counts(rows: pd.DataFrame) -> str:
    """The first page's count of verdicts: each verdict's badge with how many rows of the ledger got it."""
    counts = rows.verdict.value_counts()
    return '<p class="verdict-counts">' + " ".join(f"{badge(v)} {int(counts[v])}" for v in claims.VERDICTS
                                                   if v in counts) + "</p>"


def depend_list(rows: pd.DataFrame, link_prefix: str = "../notebooks/") -> str:
    """The claims whose verdict depends on the model, as an HTML list: each short name linking to its ledger row,
    with its verdict on every model."""
    keys = depends(rows, models(rows))
    if not keys:
        return "<p>none</p>"
    items = []
    for key in keys:
        own = rows[rows.key == key].set_index("model")
        said = ", ".join(f"{m}: {badge(own.verdict[m]) if m in own.index else 'not measured'}" for m in models(rows))
        items.append(f'<li><a href="{link_prefix}{LEDGER_PAGE}#{row_id(key)}">{tex(own.glance.iloc[0])}</a> '
                     f"({said})</li>")
    return f'<ul class="depend-list">{"".join(items)}</ul>'


def chosen() -> str:
    """How the build's models were chosen, as plain sentences for the first page (the build's record)."""
    found = runlog.read("build")
    if not found:
        return "This run was not part of a book build."
    given = found[0].get("given", {})
    if "model" in given:
        return f"The build was asked for one model (model='{given['model']}')."
    if given.get("models", "auto") != "auto":
        return f"They were requested explicitly (models={given['models']})."
    if found[0]["models"][0] == "gpt2":  # model 'auto' puts GPT-2 first when it can be loaded
        return "GPT-2 small, the paper's own model, could be loaded, so model 'auto' put it first."
    return ("GPT-2, the paper's model, could not be loaded on the machine that built this book (the technical reason "
            "is in each chapter's provenance table), so the build measured the models that ship inside Python wheels.")


def described() -> str:
    """The models of the build for the first page, as an HTML list: each name and what it is (its provenance)."""
    seen: dict[str, str] = {}
    for r in runlog.read("provenance"):
        seen.setdefault(r["model"], r.get("description", ""))
    return '<ul class="model-list">' + "".join(
        f"<li><strong>{html.escape(m)}</strong>: {html.escape(seen.get(m) or 'not measured in this build')}</li>"
        for m in models()) + "</ul>"
