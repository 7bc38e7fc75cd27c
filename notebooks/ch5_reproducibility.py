# ---
# jupyter:
#   attn_companion:
#     reads_run_records: true
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Reproducibility: the claims ledger
#
# This chapter collects what the previous chapters measured, in the build you are reading: every
# claim of the paper {cite}`mudarisov2025limitations` and every statement we checked, the paper's
# value beside ours, the model that produced ours, and a verdict computed by an explicit rule in the
# chapter that made the measurement. It also lists the provenance of each run and how long each
# notebook and each of the paper's algorithms took, beside the paper's own Table 1.
#
# **What you will learn**
#
# - which of the paper's claims this build reproduces, which it does not, and on which model;
# - what each verdict means and which explicit rule decided it;
# - how to compare two builds (the hashes of the weights and of the corpus) and what the paper's
#   algorithms cost here beside its Table 1.
#
# **What it assumes**: the chapters before this one, whose measurements it collects; nothing is measured
# here.
#
# The verdicts mean:
#
# - **holds** / **fails**: a mathematical statement checked on many random instances (and, where it
#   applies, on every row of the model's attention); *fails* comes with a counterexample in its chapter.
# - **reproduced** / **partly reproduced** / **not reproduced**: an empirical claim about a pretrained
#   model, measured at the paper's settings on the model named in the row.
# - **not comparable**: our measurement cannot be compared with the paper's (for instance, the quantity
#   is defined differently).
#
# The rows of chapter `ch6_beyond` ({doc}`ch6_beyond`) go beyond the paper: they test statements it makes
# without measuring them (its remedies, its multi-head remark, its curves past 1024 tokens) on the
# pretrained model's logits re-normalized without retraining, and our own propositions about the
# remedies; each row states its rule.

# %% tags=["parameters"]
# This chapter has no parameters of its own: it reads the records that the other chapters of the same
# build wrote (attn_utils.book.runlog). Re-run the whole book to change what it reports.

# %% tags=["hide-input"]
from IPython.display import HTML
from myst_nb import glue

from attn_utils.book import figures
from attn_utils.book.chapters import reproducibility as repro
from attn_utils.book.formatting import glue_values, table

figures.set_style()
ledger, across = repro.ledger(), repro.windows()  # across: None unless the build was given a windows result

# %% tags=["remove-cell"]
glue_values({**repro.summary(ledger), **repro.windows_summary(ledger, across)})
glue("depend_here", HTML(repro.depend_list(ledger, link_prefix="")), display=False)
# the first page's models, how they were chosen, the count of verdicts, the claims that depend on the model and
# the "results at a glance"
glue("models_list", HTML(repro.described()), display=False)
glue("models_chosen", repro.chosen(), display=False)
glue("verdict_counts", HTML(repro.verdict_counts(ledger)), display=False)
glue("depend_list", HTML(repro.depend_list(ledger)), display=False)
glue("glance", HTML(repro.glance(ledger)), display=False)

# %% [markdown]
# ## The claims ledger
#
# The ledger holds {glue:text}`n_keys` claims, {glue:text}`n_model_keys` of them measured on each of the
# {glue:text}`n_models` pretrained models of this build ({glue:text}`ledger_models`), so
# {glue:text}`n_claims` verdicts in all: {glue:text}`n_holds` statements hold and {glue:text}`n_fails`
# fail as written; of the empirical verdicts, {glue:text}`n_reproduced` are reproduced,
# {glue:text}`n_partly_reproduced` partly, {glue:text}`n_not_reproduced` are not, and
# {glue:text}`n_not_comparable` are not comparable. Of the model claims, {glue:text}`n_same` have the same
# verdict on every model and {glue:text}`n_depend` depend on the model:
#
# ```{glue:any} depend_here
# ```
#
# Where a verdict depends on the model, it says as much about the model as about the paper. Of the models,
# {glue:text}`ledger_model_is_paper`. Rows measured on synthetic data do not depend on the model (column
# *synthetic*).
#
# Each row states the rule that decided its verdict, written as a condition on the values that its
# chapter measured. The rules are data (one file per chapter in `attn_utils/book/ledger/`), so a
# verdict can never drift away from its stated rule.

# %% tags=["hide-input"]
figures.glue_figure("fig_ch5_verdicts", repro.verdict_figure(ledger))

# %% [markdown]
# ```{glue:figure} fig_ch5_verdicts
# ---
# name: fig-ch5-verdicts
# alt: >-
#   Horizontal stacked bar chart, one bar per chapter, split into coloured segments that count the ledger
#   rows with each verdict (reproduced, partly reproduced, not reproduced, not comparable, holds, fails), the
#   count written on each segment and the legend beside the bars.
# ---
#
# **Verdicts per chapter in this build** (models measured: {glue:text}`ledger_models`). Each segment counts
# the verdicts of one chapter (one per claim and model) with one verdict, in the colour its badge has everywhere in the book. Look
# at the share of *holds* against *fails* for the mathematical statements, and of *reproduced* against
# *not reproduced* for the measurements.
# ```
#
# The table lists every row ({numref}`fig-ch5-verdicts` counts them), chapter by chapter: the statement,
# named and written as in its chapter (e.g. $\tilde d$ for the distance of Theorem 1, $N_s/N$ for the
# separability fraction of Theorem 2), over the claim; what the paper says, over the rule that decides the
# verdict; and the verdict on each model with what was measured. It scrolls sideways where the column is too
# narrow. The records themselves, with every value measured, download as CSV or JSON above the table.
#
# :::{div} plain-glue
# One window of text is one sample of the novel: a verdict that depends on the passage read is weaker
# evidence than one that holds wherever the model reads. {glue:text}`windows_note`.
# :::

# %% tags=["hide-input"]
HTML(repro.downloads(ledger) + repro.ledger_html(ledger, across))

# %% [markdown]
# ## Provenance of each run
#
# Every chapter that measured a model left its provenance record. The weights and the corpus are
# identified by their SHA-256 (the first 16 hexadecimal digits here), so two builds can be compared. The
# first table says what was measured, the second which model was requested, with which window and seed.

# %% tags=["hide-input"]
provenance = repro.provenance()
table(provenance[repro.PROVENANCE_WHAT])

# %% tags=["hide-input"]
table(provenance[repro.PROVENANCE_HOW])

# %% tags=["remove-cell"]
table_1 = repro.table1()
glue_values({**repro.environment(), **repro.totals(table_1)})

# %% [markdown]
# Package versions of this build: {glue:text}`versions`. The exact versions of every package come from
# the lock file {glue:text}`lock`.
#
# ## Run times beside the paper's Table 1
#
# The paper reports the wall time of each of its five algorithms on an Apple M1 Pro laptop (10 CPU
# cores), for GPT-2 small (144 heads). Our times are for the model named above, on the machine that
# built this book, and include everything the chapters computed with that algorithm. The paper's
# Algorithms 1 and 2 (24 and 37 minutes) are one row here, because our distance chapter computes both
# panels from the same per-row values. The last column is the paper's time divided by ours (above 1: faster
# here; n/a: the algorithm did not run in this build).

# %% tags=["hide-input"]
table(table_1)

# %% [markdown]
# The paper's five algorithms took {glue:text}`paper_total_h` hours in total on its laptop; here they
# took {glue:text}`ours_total_s` seconds, vectorised over layers, heads and query rows.
#
# ## How each chapter's outputs were computed
#
# The build executes a notebook only when something its outputs depend on has changed; otherwise it
# takes them from its execution cache, where they were stored when they were last computed. The table,
# written by the build after every notebook had run, says for each chapter which it was, when its outputs
# were computed and how long that took.
#
# ```{include} ../_status.md
# ```
#
# ```{admonition} What this means
# A row marked *reproduced* says that the measured behaviour matches the paper's description by the
# rule stated in its row, **on the model of its column**. Where that model is not GPT-2 small, the
# verdict is evidence about softmax attention in another pretrained transformer, not a replication of the
# paper's exact numbers; a verdict that changes from model to model belongs to the model at least as much as to
# the paper. Building the book where GPT-2 can be loaded takes it first (`make book PARAMS="models=[gpt2]"` for
# it alone), under the same rules.
# ```
#
# ## Key takeaways
#
# - This build's ledger has {glue:text}`n_claims` verdicts ({glue:text}`n_keys` claims, the model claims on
#   each of {glue:text}`ledger_models`): {glue:text}`n_holds` statements hold and {glue:text}`n_fails` fail as
#   written; {glue:text}`n_reproduced` empirical verdicts are reproduced, {glue:text}`n_partly_reproduced`
#   partly and {glue:text}`n_not_reproduced` not.
# - {glue:text}`n_same` model claims have the same verdict on every model, {glue:text}`n_depend` depend on it;
#   of the models, {glue:text}`ledger_model_is_paper`.
# - Every verdict comes from a rule stated beside it, and every model run is identified by the hashes of its
#   weights and corpus; the paper's algorithms took {glue:text}`ours_total_s` s here, against
#   {glue:text}`paper_total_h` hours on the paper's laptop.
