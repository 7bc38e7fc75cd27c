"""The reproducibility chapter: the claims ledger of a build, its provenance records, and its run times beside
the paper's Table 1. Everything here reads the run records that the other chapters wrote
(:mod:`attn_utils.book.runlog`); nothing is measured."""
from __future__ import annotations

import html
from collections import Counter

import matplotlib.pyplot as plt
import pandas as pd

from attn_utils.book import claims, figures, runlog
from attn_utils.book.formatting import fmt, table as formatted

PAPER_MODEL = "gpt2"
# The paper's Table 1 (Appendix B): minutes on an Apple M1 Pro, and whether the run was parallel. Our distance
# chapter computes Figure 2a and 2b from shared per-row values, so Algorithms 1 and 2 are one row.
PAPER_TABLE_1 = {"Algorithms 1-2": (24 + 37, "no"), "Algorithm 3": (17 * 60 + 4, "yes"),
                 "Algorithm 4": (7, "no"), "Algorithm 5": (1, "no")}
# the provenance records, split into two tables that fit the text column: what was measured, and how
PROVENANCE_WHAT = ["notebook", "model", "weights sha256", "corpus", "corpus sha256"]
PROVENANCE_HOW = ["notebook", "requested", "L", "offsets", "seed", "device"]


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


def table(rows: pd.DataFrame, across: dict | None = None):
    """The ledger for reading (:func:`attn_utils.book.formatting.table`): one row per claim, a coloured verdict per
    model (``synthetic`` for the statements checked on synthetic data) with what was measured, the rule that
    decided it; with ``across`` (:func:`windows`), the column of :func:`stability` of the first model."""
    measured = models(rows)
    columns = [claims.SYNTHETIC, *measured]
    first = rows.drop_duplicates("key").set_index("key")
    wide = pd.DataFrame({"chapter": first.chapter, "claim": first.claim, "paper": first.paper})
    for m in columns:
        own = rows[rows.model == m].set_index("key")
        wide[m] = [f"{own.verdict[k]}: {own.ours[k]}" if k in own.index else "" for k in wide.index]
    wide = wide.loc[:, [c for c in wide.columns if c not in columns or (wide[c] != "").any()]]
    if across is not None and measured:
        lead = rows[rows.model.isin([measured[0], claims.SYNTHETIC])].drop_duplicates("key").set_index("key")
        wide[stability_column(across)] = stability(lead.reset_index(), across).set_axis(lead.index) \
            .reindex(wide.index).fillna("")
    wide["rule"] = first.rule
    shown = wide.reset_index(drop=True).map(html.escape)  # "N << L"

    def colour(v: str) -> str:
        return f"background-color: {figures.VERDICT_COLOURS.get(v.split(':', 1)[0], '')}"

    return formatted(shown).map(colour, subset=[c for c in columns if c in shown.columns])


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
    timings = timings[timings.model.fillna("").isin(["", lead])]  # the chapters' pages: the first model
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
    """The book's first page: an HTML table with one row per headline claim of the paper and per claim that fails
    (what the paper says, the verdict on each model of the build as a coloured badge with the number measured,
    whether the verdict is the same on every model, a link to the chapter), in chapter order."""
    shown_keys = [key for key, spec in claims.specs().items() if spec.headline
                  or (rows[rows.key == key].verdict == "fails").any()]
    measured = models(rows)
    changed = set(depends(rows, measured))
    first = rows[rows.key.isin(shown_keys)].drop_duplicates("key").sort_values(["chapter", "key"])
    synthetic = any(rows[rows.key.isin(shown_keys)].model == claims.SYNTHETIC)
    columns = [*([claims.SYNTHETIC] if synthetic else []), *measured]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ("claim of the paper", "the paper", *columns,
                                                            "same on every model?", "chapter"))
    body = []
    for r in first.itertuples():
        cells = [html.escape(r.claim), html.escape(r.paper)]
        for m in columns:
            own = rows[(rows.key == r.key) & (rows.model == m)]
            if own.empty:
                cells.append("")
                continue
            v = own.iloc[0]
            cells.append(f'<span class="verdict verdict-{v.verdict.replace(" ", "-")}">{html.escape(v.verdict)}'
                         f'</span><br><small>{html.escape(v.ours)}</small>')
        model_rows = rows[(rows.key == r.key) & (rows.model != claims.SYNTHETIC)]
        cells.append("" if model_rows.empty else "no: it depends on the model" if r.key in changed else "yes")
        cells.append(f'<a href="{link_prefix}{r.chapter}.html">{html.escape(r.chapter.split("_", 1)[1])}</a>')
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (f'<div class="wide-table"><table class="glance"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


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
    """The models of the build for the first page, one sentence: each name and what it is (its provenance)."""
    seen: dict[str, str] = {}
    for r in runlog.read("provenance"):
        seen.setdefault(r["model"], r.get("description", ""))
    return "; ".join(f"{m} ({seen.get(m) or 'not measured in this build'})" for m in models())
