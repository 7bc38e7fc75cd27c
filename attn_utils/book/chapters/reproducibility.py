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


def summary(rows: pd.DataFrame) -> dict:
    """Counts per verdict (``n_<verdict>``), the number of rows, and the pretrained models measured."""
    counts = rows.verdict.value_counts()
    models = sorted(set(rows.model) - {"synthetic"})
    return {"n_claims": len(rows), **{f"n_{v.replace(' ', '_')}": int(counts.get(v, 0)) for v in claims.VERDICTS},
            "ledger_models": ", ".join(models) if models else "no pretrained model",
            "ledger_model_is_paper": "the same model as the paper" if models == [PAPER_MODEL] else
            "not the paper's GPT-2 small, so every empirical verdict is about a different pretrained model"}


def table(rows: pd.DataFrame, across: dict | None = None):
    """The ledger for reading (:func:`attn_utils.book.formatting.table`): one coloured verdict per row, the rule
    that decided it beside the values; with ``across`` (:func:`windows`), the column of :func:`stability` after the
    verdict."""
    columns = ["verdict", "chapter", "claim", "paper", "ours", "rule", "model"]
    shown = rows[columns].map(html.escape)  # "N << L"
    if across is not None:
        shown.insert(1, stability_column(across), stability(rows, across).map(html.escape))
    return formatted(shown).map(lambda v: f"background-color: {figures.VERDICT_COLOURS.get(v, '')}",
                                subset=["verdict"])


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
    by_key = {c["key"]: c for c in across["claims"]}

    def text(key: str, model: str) -> str:
        if model == "synthetic":
            return ""
        c = by_key.get(key)
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
    models = sorted(set(rows.model) - {"synthetic"})
    figures.model_title(fig, "Verdicts per chapter", ", ".join(models) or "synthetic only")
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
    timings = pd.DataFrame(runlog.read("timings"), columns=["algorithm", "notebook", "seconds"])
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
    """The book's first page: an HTML table with one row per headline claim of the paper (what the paper says,
    what this build measured, the verdict as a coloured badge, a link to the chapter), in chapter order."""
    headline = [key for key, spec in claims.specs().items() if spec.headline]
    shown = rows[rows.key.isin(headline)].sort_values(["chapter", "key"])
    head = "".join(f"<th>{h}</th>" for h in ("claim of the paper", "the paper", "this build", "verdict", "chapter"))
    body = []
    for r in shown.itertuples():
        badge = f'<span class="verdict verdict-{r.verdict.replace(" ", "-")}">{html.escape(r.verdict)}</span>'
        link = f'<a href="{link_prefix}{r.chapter}.html">{html.escape(r.chapter.split("_", 1)[1])}</a>'
        cells = [html.escape(r.claim), html.escape(r.paper), html.escape(r.ours), badge, link]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (f'<table class="glance"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')
