# ---
# jupyter:
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
# # Vanishing attention: Lemma 1 and Corollary 1
#
# The first limitation the paper {cite}`mudarisov2025limitations` proves is the simplest one. If the
# rule that turns logits into weights does not know how many keys there are, and if the logits stay in
# a bounded interval, then **every** weight of a row of length $L$ is of order $1/L$: no key can keep
# a fixed share of the attention as the context grows. The idea of such "vanishing" weights goes back
# to {cite}`velickovic2024softmax`. This chapter states the result, proves it, checks it on many
# synthetic rows, shows which normalizers escape it, and then measures how it looks on every head of a
# pretrained language model.
#
# **What you will learn**
#
# * the statement and the short proof of Lemma 1 (any length-blind positive normalizer) and of its
#   softmax form, Corollary 1, and why their $1/L$ rate cannot be improved;
# * how to test an inequality on synthetic rows built to come close to it, and what "tightness" means;
# * which normalizers escape the lemma (scalable softmax, sparsemax) and which hypothesis each breaks;
# * how far the bound is from a trained model, and how to read the decay of its weights with the row
#   length, head by head, in spite of the first-token "attention sink".
#
# **What it assumes**
#
# * the general normalization of Eq. (3) and the causal softmax of a decoder, as set up in
#   {doc}`ch0_setting`;
# * compactness and continuity (a continuous function attains its extrema on a closed interval) and the
#   Cauchy–Schwarz inequality;
# * reading log-log plots: a quantity that decays like $1/L$ is a line of slope $-1$.
#
# The machinery (synthetic instances, the per-row checks on the model, the fits and the figures) lives in
# `attn_utils.book.chapters.vanishing`; the cells below call it.

# %% tags=["parameters", "remove-cell"]
# Parameters (papermill). Every one is checked in the next cell.
model = "auto"            # model measured: "auto" (GPT-2 if it can be had, else SmolLM2-135M), "gpt2", "smollm2-135m", ...
corpus = "war-and-peace"  # "war-and-peace" or the path of a UTF-8 text file
chapters = None           # None (whole novel) or [first, last]: consecutive chapters, 1-based
offset = 0                # first token of the window
L = 1024                  # window length (tokens) fed to the model; row t of a head sees t keys
seed = 0                  # seed of every synthetic draw
device = "auto"           # "auto" (a GPU if there is one, else the CPU), "cpu" or "cuda": runs the model and the analysis
synthetic_lengths = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]  # row lengths of the synthetic checks
Ts = [0.25, 1.0, 4.0]     # softmax temperatures of the synthetic checks
n_trials = 200            # synthetic rows per (normalizer or temperature, length)

# %% tags=["remove-input"]
from attn_utils.book.formatting import parameter_table
from attn_utils.book.params import checked

p = checked(model=model, corpus=corpus, chapters=chapters, offset=offset, L=L, device=device, seed=seed,
            synthetic_lengths=synthetic_lengths, Ts=Ts, n_trials=n_trials)
parameter_table(p)

# %% tags=["hide-input"]
import numpy as np
import pandas as pd
import torch

from attn_utils.book import claims, figures
from attn_utils.book.chapters import vanishing
from attn_utils.book.formatting import fmt, glue_values, table
from attn_utils.book.session import Session
from attn_utils.mathematics import normalizers, theory

figures.set_style()
gen = torch.Generator().manual_seed(p.seed)  # one stream for every synthetic draw of the chapter, in order

# %% [markdown]
# ## The statement
#
# Recall the general normalization of Eq. (3) ({prf:ref}`its definition <def-general-normalization>` in
# {doc}`ch0_setting`): a row of logits $l_1,\dots,l_L$ becomes the weights
# $\alpha_i = F(l_i,\theta)/\sum_j F(l_j,\theta)$ for a positive function $F$ with parameters
# $\theta$.
#
# ```{prf:lemma} Vanishing attention: the paper's Lemma 1 (formula recovered)
# :label: ch1-lemma1
# :nonumber:
#
# Let $F(\cdot,\theta)$ be continuous and strictly positive, with parameters $\theta$ that do not
# involve the number of keys $L$. Suppose every logit lies in $[-a,a]$. Put
# $m_F=\min_{[-a,a]}F$ and $M_F=\max_{[-a,a]}F$. Then for every $L\ge 1$ and every $i$,
#
# $$
# \frac{C_1}{L}\;\le\;\alpha_i\;\le\;\frac{C_2}{L},\qquad C_1=\frac{m_F}{M_F},\quad C_2=\frac{M_F}{m_F}.
# $$
# ```
#
# The available copies of the paper lost their display formulas; the two-sided bound with constants
# independent of $L$ is recovered from a review that reproduced the paper's LaTeX, and the values of
# $C_1, C_2$ and the argument below are ours (the paper's appendix proves it in one line, "by
# compactness"; see {ref}`sources-lemma1`).
#
# ```{prf:proof}
# $F$ is continuous on the compact interval $[-a,a]$, so it attains its minimum $m_F$ and maximum
# $M_F$ there, and $m_F>0$ because $F$ is positive. Each of the $L$ terms of the denominator
# $S=\sum_j F(l_j,\theta)$ therefore lies in $[m_F, M_F]$, so $L\,m_F\le S\le L\,M_F$. The numerator
# $F(l_i,\theta)$ lies in the same interval, hence
#
# $$
# \alpha_i=\frac{F(l_i,\theta)}{S}\le\frac{M_F}{L\,m_F}=\frac{C_2}{L},\qquad
# \alpha_i\ge\frac{m_F}{L\,M_F}=\frac{C_1}{L}.
# $$
#
# Neither constant depends on $L$ because $F$, and hence $m_F$ and $M_F$, do not.
# ```
#
# ````{admonition} How it is computed: Lemma 1's constants
# :class: dropdown
# The library's function that every check of this chapter calls (`attn_utils.mathematics.theory`): the extrema of
# $F$ on $[-a,a]$ give $C_1=m_F/M_F$ and $C_2=M_F/m_F$, then the bounds $C_1/L$ and $C_2/L$.
#
# ```{literalinclude} ../attn_utils/mathematics/theory/lemma1.py
# :language: python
# :pyobject: lemma1_constants
# ```
#
# ```{literalinclude} ../attn_utils/mathematics/theory/lemma1.py
# :language: python
# :pyobject: lemma1_bounds
# ```
# ````
#
# The bound cannot be improved in its dependence on $L$: with one logit at the maximizer of $F$ and
# the other $L-1$ at its minimizer, that key gets $\alpha = M_F/(M_F+(L-1)m_F)$, and
# $L\alpha\to M_F/m_F=C_2$ as $L\to\infty$. The same configuration with the roles swapped approaches
# the lower bound. So $1/L$ is the exact rate, and the constants are the best possible ones that do
# not depend on $L$ ({ref}`exercise ch1-ex1 <ch1-ex1>` asks for the proof).
#
# For softmax, $F(l,T)=e^{l/T}$, and the logit $l_i=q^\top k_i$ is controlled by the norms of the
# query and the keys.
#
# ```{prf:corollary} Softmax: the paper's Corollary 1 (recovered formula; our reading of $\|k\|$)
# :label: ch1-cor1
# :nonumber:
#
# Let $\alpha=\operatorname{softmax}(l/T)$ with $l_i=q^\top k_i$, $i=1,\dots,L$, and put
# $\Delta=\|q\|_2\,\max_j\|k_j\|_2$. Then
#
# $$
# \frac{e^{-2\Delta/T}}{L}\;\le\;\alpha_i\;\le\;\frac{e^{2\Delta/T}}{L}.
# $$
# ```
#
# The paper writes $\Delta=\|q\|_2\|k\|_2$ without saying which key $k$ is meant. Reading it as the
# **largest** key norm is our interpretation ({ref}`sources-lemma1`): it is the reading under which the statement
# is true for every row, and below we show that a "typical key" reading (the mean key norm) fails.
#
# ```{prf:proof}
# By Cauchy–Schwarz, $|l_i|=|q^\top k_i|\le\|q\|\,\|k_i\|\le\Delta$, so every logit lies in
# $[-\Delta,\Delta]$. Apply {prf:ref}`Lemma 1 <ch1-lemma1>` with $a=\Delta$ and the increasing function
# $F(l)=e^{l/T}$: $m_F=e^{-\Delta/T}$, $M_F=e^{\Delta/T}$, and $C_2=1/C_1=e^{2\Delta/T}$.
# ```
#
# The corollary makes the trade-off visible: the weights can escape the $1/L$ scale only by a factor
# $e^{2\Delta/T}$, so large query and key norms compared with the temperature soften the problem,
# but for any fixed norms it comes back once $L\gg e^{2\Delta/T}$.

# %% [markdown]
# (ch1-check-lemma1)=
# ## Synthetic check of Lemma 1
#
# We draw rows of logits for several positive functions $F$: the softmax at each temperature of
# `Ts`, and two functions that are not exponentials, $F(l)=\log(1+e^l)$ (softplus) and
# $F(l)=1+\sigma(l)$ (one plus the logistic sigmoid). For each $F$ and each length in `synthetic_lengths`,
# `n_trials` rows cycle through the logit bounds $a$ = {glue:text}`a_grid` and five patterns: uniform on
# $[-a,a]$, a random choice of $\pm a$ per key, a Gaussian clipped to $[-a,a]$, and the two extreme
# rows "one key at $+a$, all others at $-a$" and "one key at $-a$, all others at $+a$", where the
# bounds are nearly attained. The weights come from `normalizers.general` (Eq. (3)) in float64; the
# bounds from `theory.lemma1_bounds`. For each row we record the **tightness**
# $\max\big(\max_i\alpha_i/(C_2/L),\ (C_1/L)/\min_i\alpha_i\big)$, which is at most 1 exactly when
# the row satisfies both bounds; a row counts as a violation when its tightness exceeds $1+10^{-9}$
# (float64 rounding where a bound is attained). The table gives, per function, the rows checked, the
# violations, and the largest (to six digits) and median tightness. A pair $(F, a)$ on which $F$ is not a
# positive float64 is left out (in this run: {glue:text}`lemma1_skipped`): Lemma 1 assumes $m_F>0$, and
# $F=e^{l/T}$ is 0 or $\infty$ in float64 at $\pm a$ once $a/T$ exceeds about 709.

# %%
family = vanishing.positive_functions(p.Ts)
lemma1 = vanishing.lemma1_table(family, p.synthetic_lengths, p.n_trials, gen)  # one row per synthetic row
table(vanishing.lemma1_summary(lemma1).reset_index()).format(lambda v: fmt(v, 6), subset=["tightest"])

# %% tags=["remove-cell"]
f1 = vanishing.lemma1_facts(lemma1, p.Ts, vanishing.lemma1_skipped(family))
lemma1_claim = claims.record("ch1-lemma1-synthetic", model="synthetic", violations=f1["lemma1_violations"],
                             rows=f1["lemma1_cases"], functions=f1["lemma1_n_F"], L_min=f1["lemma1_Lmin"],
                             L_max=f1["lemma1_Lmax"], tightest=f1["lemma1_tightest"])
_ = glue_values({**f1, "lemma1_tightest": fmt(f1["lemma1_tightest"], 6), "lemma1_verdict": lemma1_claim.verdict})

# %% tags=["hide-input"]
figures.glue_figure("fig_ch1_lemma1", vanishing.plot_lemma1(lemma1, a=f1["a_fig"]))

# %% [markdown]
# ```{glue:figure} fig_ch1_lemma1
# ---
# name: fig-ch1-lemma1
# alt: >-
#   Log-log plots in two columns, one panel per positive function F (softmax at each temperature, softplus,
#   one plus sigmoid), of attention weights against the row length L: the largest weight of any row, the
#   median largest weight of the uniform rows and the smallest weight of any row, between two dashed lines
#   C2/L and C1/L of slope minus one.
# ---
#
# **Lemma 1 on synthetic rows** (no model; logits in $[-a,a]$ with $a=${glue:text}`a_fig`). Each panel
# is one function $F$; the dashed lines are the envelope $C_2/L$ (top) and $C_1/L$ (bottom) of
# {prf:ref}`Lemma 1 <ch1-lemma1>`, and the thin grey line is weight 1. Look for any marker outside its envelope,
# and at how close the largest and smallest weights come to the dashed lines as $L$ grows.
# ```
#
# Over {glue:text}`lemma1_cases` synthetic rows ({glue:text}`lemma1_n_F` functions $F$,
# {glue:text}`lemma1_n_L` lengths up to {glue:text}`lemma1_Lmax`, logit bounds $a$ = {glue:text}`a_grid`),
# the number of rows outside the bounds of {prf:ref}`Lemma 1 <ch1-lemma1>` is **{glue:text}`lemma1_violations`** (verdict:
# {glue:text}`lemma1_verdict`). The tightest row reaches {glue:text}`lemma1_tightest` of its bound:
# the extreme rows approach the bound as $L$ grows, as the remark after the proof predicts. A typical
# row with uniform logits is much further from it (median tightness {glue:text}`lemma1_uniform_median`).
# {numref}`fig-ch1-lemma1` shows the rows with $a=${glue:text}`a_fig`: in log-log coordinates the envelope $C_1/L$,
# $C_2/L$ consists of two lines of slope $-1$, and every weight falls between them. Where the
# constants are moderate, the largest weight follows the slope $-1$. At the smallest temperature,
# $T=${glue:text}`T_small`, the constant $C_2=e^{2a/T}$ is about {glue:text}`c2_small`, so the
# upper line stays above 1 over the whole range of $L$ and says nothing yet: we will meet this
# situation again on the trained model.

# %% [markdown]
# (ch1-check-corollary1)=
# ## Synthetic check of Corollary 1
#
# Now the logits come from a query and keys, $l_i=q^\top k_i$ in dimension {glue:text}`d_syn`, and the bounds from
# `theory.corollary1_bounds`, which uses $\Delta=\|q\|\max_j\|k_j\|$. The `n_trials` rows of each
# (temperature, length) cycle through three constructions: Gaussian $q$ and keys with random scales;
# "aligned" keys $k_1 = c\,\hat q$, $k_j=-c\,\hat q$ for $j\ge 2$ (all logits at $\pm\Delta$, where the
# bound is nearly attained); and "one long key", a key $k_1=\lambda\hat q$ much longer than the others.
# The last one is there to test the alternative reading of $\|k\|$ as the *mean* key norm: the table
# counts, per construction, the rows that violate the bound read that way.

# %%
cor1 = vanishing.corollary1_table(p.Ts, p.synthetic_lengths, p.n_trials, gen)  # one row per (q, keys) row
table(vanishing.corollary1_summary(cor1).reset_index()).format(lambda v: fmt(v, 6), subset=["tightest"])

# %% tags=["remove-cell"]
f2 = vanishing.corollary1_facts(cor1)
cor1_claim = claims.record("ch1-corollary1-synthetic", model="synthetic", violations=f2["cor1_violations"],
                           rows=f2["cor1_cases"], tightest=f2["cor1_tightest"],
                           mean_reading_violations=f2["cor1_mean_violations"])
_ = glue_values({**f2, "cor1_tightest": fmt(f2["cor1_tightest"], 6), "cor1_verdict": cor1_claim.verdict,
                 "d_syn": vanishing.D_SYN})

# %% [markdown]
# Corollary 1 with $\Delta=\|q\|\max_j\|k_j\|$ has **{glue:text}`cor1_violations`** violations in
# {glue:text}`cor1_cases` rows (verdict: {glue:text}`cor1_verdict`); the aligned rows come within
# {glue:text}`cor1_tightest` of the bound. Reading $\|k\|$ as the mean key norm instead gives
# {glue:text}`cor1_mean_violations` violated rows; among the {glue:text}`cor1_long_rows` "one long key" rows,
# {glue:text}`cor1_mean_violations_long` violate it: a single long key aligned with the query takes
# almost all the weight, far more than a bound built from the average key allows. The maximum over the keys is needed.

# %% [markdown]
# ## Who escapes Lemma 1, and how
#
# The lemma has two hypotheses besides bounded logits, and the remedies the paper discusses each
# break one of them.
#
# ```{prf:remark} Length-aware and sparse normalizers
# :label: ch1-escape
# :nonumber:
#
# * **Scalable softmax** {cite}`nakanishi2025scalable` multiplies the logits by $s\log n$, where $n$
#   is the number of keys the row sees. It is Eq. (3) with $F(l,\theta)=\exp(s\log(n)\,l/T)=n^{sl/T}$,
#   so $n$ is part of $\theta$, which the lemma forbids. Running the proof anyway gives
#   $M_F/m_F=n^{2sa/T}$ and only $\alpha_i\le n^{2sa/T-1}$, which does not decay once
#   $2sa/T\ge1$. Concretely, a key whose logit exceeds all others by a gap $g$ gets at least
#   $n^{sg/T}/(n^{sg/T}+n-1)$, which tends to 1 when $sg/T>1$ (our computation).
# * **Sparsemax** {cite}`martins2016sparsemax` sets $\alpha_i=\max(z_i-\tau(z),0)$ with a threshold
#   $\tau$ that depends on the whole row. Its weights are not a positive function of the key's own
#   logit divided by a sum, and they can be exactly zero, so the lower bound $C_1/L>0$ is impossible.
#   If one scaled logit exceeds every other by at least 1, that key gets weight exactly 1, whatever $L$.
# ```
#
# A quick illustration: each row has one "important" key whose logit exceeds the others by a fixed
# gap, the other logits being small Gaussian noise; we follow the weight of the largest key as $L$
# grows, at $T=1$ and $s=1$.
# The table gives the mean largest weight for each normalizer (columns) and length (rows).

# %%
escape = vanishing.escape_table(p.synthetic_lengths, p.n_trials, gen)  # one row per (row, normalizer)
escape_mean = escape.groupby(["normalizer", "L"])["max weight"].mean().unstack(0)
table(escape_mean.reset_index())

# %% tags=["remove-cell"]
_ = glue_values({"esc_gap": vanishing.GAP, "esc_L": max(p.synthetic_lengths),
                 **{f"esc_{name}": fmt(escape_mean[name].iloc[-1], 4) for name in vanishing.ESCAPE_NORMALIZERS}})

# %% tags=["hide-input"]
figures.glue_figure("fig_ch1_escape", vanishing.plot_escape(escape))

# %% [markdown]
# ```{glue:figure} fig_ch1_escape
# ---
# name: fig-ch1-escape
# alt: >-
#   Log-log plot of the mean largest weight of a row against the row length L, one line per normalizer
#   (softmax, scalable softmax, sparsemax), with a dotted line 1/L for comparison.
# ---
#
# **Who keeps a planted key** (synthetic rows, no model; one key's logit exceeds the others by
# {glue:text}`esc_gap`, $T=1$). Look at which lines stay flat as $L$ grows and which one bends down
# towards the slope of the dotted $1/L$ line.
# ```
#
# With a planted logit gap of {glue:text}`esc_gap`, at $L=${glue:text}`esc_L` the softmax gives the
# planted key a mean weight of {glue:text}`esc_softmax` (it follows the slope $-1$ of the lemma;
# {numref}`fig-ch1-escape`),
# scalable softmax {glue:text}`esc_ssmax` and sparsemax {glue:text}`esc_sparsemax`. How much these
# remedies cost elsewhere (gradients, separability) is the subject of later chapters.

# %% [markdown]
# (ch1-model)=
# ## On a pretrained model
#
# The lemma is about one row and a fixed normalizer; in a causal language model row $t$ (counting
# from 1) sees the first $t$ keys of the window, so its "$L$" is $t$ (our convention, {ref}`sources-protocol`; the
# paper does not say how it handles the causal mask). In an encoder every row sees the whole window, so its "$L$"
# is the window's length: there we also read windows of 4, 8, ..., 256 tokens (below `L`, one forward pass each),
# and $t$ below is the number of keys a row sees. {glue:text}`model_name` is {glue:text}`m_attention`. We feed a
# window of `L` tokens to the model and
# capture, for every layer and head, the weights, the queries and the keys (after rotary position
# embeddings, exactly what enters the dot products) and the model's scaling: it computes
# $\operatorname{softmax}(q^\top k\cdot\text{scaling})$, so its temperature is $T=1/\text{scaling}$.
# The paper's qualitative claim is about GPT-2 small; the model measured here is named under every
# figure and in the table below (see {doc}`ch0_setting` for how it is chosen).

# %%
session = Session.open(p)
table(pd.Series(session.summary()).rename_axis("model and window").reset_index(name="value"))

# %% [markdown]
# For each layer we apply `theory.corollary1_bounds` to every row with the keys it sees (the causal mask, or
# every key of an encoder's window), so that $\Delta_t=\|q_t\|\max_j\|k_j\|$ over those keys (on a causal
# model $j\le t$) and the row length is $t$, and compare every captured weight
# with its row's bounds. The weights were computed by the model in its own precision (float32 here),
# so a weight counts as a violation only if it exceeds the upper bound by more than a relative
# {glue:text}`model_rtol` or falls below the lower bound by more than that plus the smallest normal float32 number
# (a weight that underflowed to 0 cannot be held against a bound of $10^{-50}$). As a sanity check
# we also recompute every row as $\operatorname{softmax}(q^\top k/T)$ from the captured $q$ and $k$.
# The result is a tidy table with one row per (layer, head, row $t$): the row's largest and smallest
# weight, its largest weight without the first token, the mean of its five largest weights, the weight
# on the first token, its two bounds, and $\log_{10}e^{2\Delta_t/T}$. Below, these quantities for the
# last row of the first five heads, one column per head.

# %%
# Corollary 1 on every weight; tidy per-row table in check.rows; the window's weights, q and k in captured
check, captured = vanishing.session_rows(session)
table(vanishing.last_rows(check.rows).reset_index())

# %% tags=["remove-cell"]
f3 = vanishing.model_facts(check, captured)
model_claim = claims.record("ch1-corollary1-model", model=session.name, causal=session.causal, violations=f3["m_violations"],
                            weights=f3["m_weights"], layers=captured.weights.shape[0],
                            heads=captured.weights.shape[1], L=f3["m_L"], tight_upper=f3["m_tight_up"],
                            tight_lower=f3["m_tight_lo"])
_ = glue_values({**f3, "model_name": session.name, "model_rtol": vanishing.MODEL_RTOL,
                 "m_attention": "causal" if session.causal else "an encoder (bidirectional attention)",
                 "m_verdict": model_claim.verdict})

# %% [markdown]
# All {glue:text}`m_weights` weights of {glue:text}`model_name` ({glue:text}`m_heads`, a window of
# {glue:text}`m_L` tokens, $T=${glue:text}`m_T`) were checked: **{glue:text}`m_violations`** lie
# outside their row's Corollary 1 bounds (verdict: {glue:text}`m_verdict`). The recomputed softmax
# differs from the captured weights by at most {glue:text}`m_recon_err`, so $T=1/\text{scaling}$ is indeed the
# temperature the model uses. But the bounds are very far from the data: over the rows with $t\ge2$
# (row 1 has a single weight, equal to 1) the largest ratio of a row's largest weight to its upper
# bound is {glue:text}`m_tight_up`, and the largest ratio of a lower bound to the row's smallest
# weight is {glue:text}`m_tight_lo`. {numref}`fig-ch1-spread` shows why.

# %% tags=["hide-input"]
figures.glue_figure("fig_ch1_spread", vanishing.plot_spread(check.rows, session.name))

# %% [markdown]
# ```{glue:figure} fig_ch1_spread
# ---
# name: fig-ch1-spread
# alt: >-
#   Two stacked panels. Top, box plots per layer of the base-10 logarithm of the factor by which
#   Corollary 1 lets a weight exceed 1 over t, with a dashed horizontal line at log10 of the window length.
#   Bottom, two histograms on one axis: that allowed factor and the factor actually used, both as log10 of
#   t times a weight.
# ---
#
# **How much room Corollary 1 leaves, measured on {glue:text}`model_name`** (window of {glue:text}`m_L`
# tokens, the model's own logit scale $q^\top k/T$ with $T=${glue:text}`m_T`, all heads and rows
# $t\ge2$). Top: per layer, the distribution of $\log_{10}e^{2\Delta_t/T}$, the factor by which the
# corollary lets a weight exceed $1/t$; above the dashed line the upper bound exceeds 1 on every row.
# Bottom: that factor for all rows pooled, against the factor actually used,
# $\log_{10}(t\max_j\alpha_{t,j})$. Look at the gap between the two histograms: it is the margin by
# which the bound holds.
# ```
#
# The median row is allowed a factor $10^{m}$ with
# $m=${glue:text}`m_spread_median` (the smallest $m$ over all rows is {glue:text}`m_spread_min`), so the upper bound exceeds 1, and says
# nothing, on {glue:text}`m_vacuous` % of the rows. The observed factor has median
# {glue:text}`m_obs_median` and maximum {glue:text}`m_obs_max` in $\log_{10}$: the bound holds with
# an enormous margin. Query and key norms in a trained model are large compared with $T$, which is
# exactly the escape route the corollary leaves open.

# %% [markdown]
# (ch1-model-vanishing)=
# ## Do the model's weights vanish like $1/t$?
#
# The bound is vacuous, so whether the weights of a real model shrink with the context is an empirical
# question. For every row we take its largest weight, the mean of its five largest weights, and its
# largest weight **excluding the first token**: many heads of pretrained models park a large share of
# their weight on the first token of the sequence (an "attention sink" {cite}`xiao2024sinks`), which keeps the plain maximum
# of order one whatever the row length, while saying nothing about the ability to pick out a content
# token. We average each of them over all heads at every row length $t$, and, since single rows are
# noisy, average these curves again over about 40 log-spaced bins of $t$ before fitting a line in
# log-log coordinates; the table shows a few of the bins (n/a: a row with fewer than five keys has no
# mean of five largest weights).

# %%
by_t, binned = vanishing.decay_curves(check.rows)  # per t, and per log-spaced bin of t
table(binned.iloc[np.unique(np.geomspace(1, len(binned), 8).astype(int)) - 1].rename(columns=vanishing.DECAY_LABELS)
      .reset_index())

# %% tags=["remove-cell"]
f4 = vanishing.decay_facts(check.rows, binned)
vanish_claim = claims.record("ch1-vanishing-model", model=session.name, causal=session.causal, slope=f4["m_slope_nosink"],
                             slope_with_token0=f4["m_slope_max"], heads=f3["m_n_heads"], t_min=f4["m_tmin"],
                             L=f3["m_L"])
_ = glue_values({**f4, "m_vanish_verdict": vanish_claim.verdict, "m_vanish_reading": vanishing.READING[vanish_claim.verdict],
                 "m_rule": str(claims.specs()["ch1-vanishing-model"].rule)})

# %% tags=["hide-input"]
figures.glue_figure("fig_ch1_decay", vanishing.plot_decay(by_t, binned, f4["m_slope_nosink"], session.name))

# %% [markdown]
# ```{glue:figure} fig_ch1_decay
# ---
# name: fig-ch1-decay
# alt: >-
#   Log-log plot of attention weights against the row length t, averaged over all heads: the mean and
#   median largest weight with and without the first token, the mean of the five largest weights and the
#   weight on the first token, each as a thin per-row line and a thick binned line, with a fitted line and
#   the uniform weight 1 over t.
# ---
#
# **Do the largest weights fade with the row length? Measured on {glue:text}`model_name`** (averages over
# all {glue:text}`m_heads`, same window of {glue:text}`m_L` tokens, the model's own temperature). Thin
# lines are single row lengths $t$, thick lines their averages over log-spaced bins of $t$; the wide grey
# line is the least-squares fit of the binned median (token 0 excluded) over $t\ge${glue:text}`m_tmin`
# (grey vertical line). The dash-dotted line is the uniform weight $1/t$, the level Lemma 1 pins every
# weight to when its constants are moderate. Compare the slope of the grey fit with that of the
# dash-dotted line, and watch whether the weight on token 0 stays flat.
# ```
#
# The fitted log-log slope of the **median largest weight excluding the first token** is
# **{glue:text}`m_slope_nosink`** over $t\ge${glue:text}`m_tmin`; with the first token included the
# slope is {glue:text}`m_slope_max`, and for the mean of the five largest weights
# {glue:text}`m_slope_top5`. Over the second half of the window the first token alone receives on
# average {glue:text}`m_sink_share` of a row's weight. Our rule for the paper's qualitative claim "weights vanish
# as $\Theta(1/L)$" is: {glue:text}`m_rule`. Verdict: **{glue:text}`m_vanish_verdict`**:
# {glue:text}`m_vanish_reading`. This does not contradict Lemma 1: the lemma's $1/L$ regime
# starts only when $L$ is large compared with the constant $C_2=e^{2\Delta/T}$, and on this model that
# constant is astronomically large ({numref}`fig-ch1-spread`), so nothing in the theory forces the decay at
# $t\le${glue:text}`m_L`. One window
# mixes the effect of length with the effect of position and content (row $t$ is also the $t$-th token
# of the text), so this is a description of the model at work, not a controlled experiment.
#
# The averages hide very different heads. For each head we take the median over log-spaced bins of
# $t$ of its largest weight and fit the slope of its own curve; we call a head "decaying roughly like
# $1/t$" when its slope is at most {glue:text}`head_decay` and "$O(1)$" when it is at least
# {glue:text}`head_flat`.


# %%
slopes = vanishing.head_slopes(check.rows)  # one row per (layer, head)
classes = vanishing.head_classes(slopes)
table(classes.reset_index())

# %% tags=["remove-cell"]
_ = glue_values({"head_decay": vanishing.HEAD_DECAY, "head_flat": vanishing.HEAD_FLAT,
                 **{f"m_frac_{kind}_{tag}": round(classes.loc[label, col])
                    for kind, label in (("decay", "decays ~1/t"), ("flat", "O(1)"))
                    for col, tag in (("token 0 included", "sink"), ("token 0 excluded", "nosink"))}})

# %% tags=["hide-input"]
figures.glue_figure("fig_ch1_head_slopes", vanishing.plot_head_slopes(slopes, f4["m_tmin"], session.name))

# %% [markdown]
# ```{glue:figure} fig_ch1_head_slopes
# ---
# name: fig-ch1-head-slopes
# alt: >-
#   Histograms of the per-head log-log slope of the largest weight against the row length, one with and
#   one without the first token, with a solid vertical line at slope minus one and two dashed lines at the
#   class limits.
# ---
#
# **Per-head decay, measured on {glue:text}`model_name`** (same window and logit scale as above). The solid
# line is the slope $-1$ of Lemma 1, the dashed lines the class limits {glue:text}`head_decay` and
# {glue:text}`head_flat`. Look at how many heads lie left of the first dashed line (decaying roughly like
# $1/t$) and how many right of the second ($O(1)$ largest weight).
# ```
#
# Counting the first token, {glue:text}`m_frac_decay_sink` % of the heads decay roughly like $1/t$ and
# {glue:text}`m_frac_flat_sink` % keep an $O(1)$ largest weight ({numref}`fig-ch1-head-slopes`); without
# it, the shares are {glue:text}`m_frac_decay_nosink` % and {glue:text}`m_frac_flat_nosink` %.
#
# ```{admonition} What this means
# Lemma 1 and Corollary 1 are true and simple, and our checks agree: {glue:text}`lemma1_violations` and
# {glue:text}`cor1_violations` violations on synthetic rows, {glue:text}`m_violations` on the rows of the
# model. Their force depends on the constants: on synthetic rows with moderate
# logits the $1/L$ envelope is nearly attained, whereas on the trained model the factor
# $e^{2\Delta/T}$ is so large that the corollary allows any weight. Whether the model's weights
# actually fade with the context is then a property of the trained model, read off the slopes above:
# in this run {glue:text}`m_vanish_reading`. The first-token sink is one way a head keeps $O(1)$
# weight without violating anything: it gives one key a logit that stands out by a large margin. To
# keep an important key visible at *every* length, a normalizer has to break a hypothesis of the
# lemma: put $L$ into its rule (scalable softmax), give up positive weights (sparsemax), or let the
# logit range grow with the context. Later chapters, in particular {doc}`ch4_gradient`, weigh these
# escapes against their effect on gradients.
# ```
#
# ## The same claims on every model
#
# Does a verdict of this chapter belong to the paper or to the model it was measured on? The build executes
# the chapter on each of its models, which differ in ways that could matter (training, quantisation,
# positions, key/value sharing, sliding windows, an encoder's bidirectional attention: see
# {doc}`ch0_setting`). Each reads the same passage; a model whose context is shorter than the window reads
# as much of it as fits.
#
# ```{include} ../_models/ch1_vanishing.md
# ```
#
# ## Key takeaways
#
# * **Lemma 1 is a theorem with a sharp rate.** Any positive normalizer that does not know $L$, on logits
#   in $[-a,a]$, keeps every weight between $C_1/L$ and $C_2/L$; the extreme rows reach
#   {glue:text}`lemma1_tightest` of the bound, and {glue:text}`lemma1_violations` of the
#   {glue:text}`lemma1_cases` synthetic rows leave it.
# * **Corollary 1 needs the largest key norm.** With $\Delta=\|q\|\max_j\|k_j\|$ the bound had
#   {glue:text}`cor1_violations` violations in {glue:text}`cor1_cases` rows; with the mean key norm,
#   {glue:text}`cor1_mean_violations`.
# * **Breaking a hypothesis is the way out.** With a planted logit gap of {glue:text}`esc_gap` at
#   $L=${glue:text}`esc_L`, the planted key keeps a mean weight of {glue:text}`esc_softmax` under softmax,
#   {glue:text}`esc_ssmax` under scalable softmax and {glue:text}`esc_sparsemax` under sparsemax.
# * **On a trained model the bound says nothing.** {glue:text}`m_violations` of the {glue:text}`m_weights`
#   weights of {glue:text}`model_name` leave their bounds, but the upper bound exceeds 1 on
#   {glue:text}`m_vacuous` % of the rows (median allowed factor $10^{m}$, $m=${glue:text}`m_spread_median`).
# * **The decay is an empirical fact of the model.** The median largest weight without the first token
#   has log-log slope {glue:text}`m_slope_nosink` against $t$ (verdict: {glue:text}`m_vanish_verdict`);
#   per head, {glue:text}`m_frac_decay_nosink` % decay roughly like $1/t$ and
#   {glue:text}`m_frac_flat_nosink` % keep an $O(1)$ largest weight.
#
# ## Provenance

# %%
session.provenance_table()

# %% [markdown]
# ## Exercises
#
# ```{exercise} ch1-ex1: The best constants of Lemma 1 for softmax
# :label: ch1-ex1
# :nonumber:
#
# Let $F(l)=e^{l/T}$ on $[-a,a]$, so that Lemma 1 gives $C_1=e^{-2a/T}$. Show that $C_1$ is the
# best constant that does not depend on $L$: if $C>C_1$, there are a length $L$ and logits in
# $[-a,a]$ with $\min_i\alpha_i<C/L$. State and prove the analogous fact for $C_2$.
# ```
#
# ```{solution-start} ch1-ex1
# :class: dropdown
# ```
#
# *Validity.* Lemma 1 already shows $\alpha_i\ge C_1/L$ for every $L$ and every row.
#
# *Optimality.* Take one logit at $-a$ and the other $L-1$ at $+a$. The weight of the first key is
#
# $$
# \begin{aligned}
# \alpha_1&=\frac{e^{-a/T}}{e^{-a/T}+(L-1)e^{a/T}},\\
# L\alpha_1&=\frac{L}{1+(L-1)e^{2a/T}}=\frac{1}{e^{2a/T}+(1-e^{2a/T})/L}.
# \end{aligned}
# $$
#
# Since $1-e^{2a/T}<0$, $L\alpha_1$ decreases in $L$ and tends to $e^{-2a/T}=C_1$. So for any
# $C>C_1$ there is an $L$ with $L\alpha_1<C$, i.e. $\min_i\alpha_i<C/L$. (For a fixed $L$ the best
# constant is the larger value $L/(1+(L-1)e^{2a/T})$; only the requirement "independent of $L$"
# forces $C_1$.)
#
# *Upper constant.* With one logit at $+a$ and the others at $-a$,
# $L\alpha_1 = L/(1+(L-1)e^{-2a/T})$, which increases to $e^{2a/T}=C_2$; for any $C<C_2$ some $L$
# gives $\max_i\alpha_i>C/L$. Both arguments only use that $F$ attains $m_F$ and $M_F$, so for any
# admissible $F$ the constants $m_F/M_F$ and $M_F/m_F$ of Lemma 1 are optimal in the same sense.
#
# ```{solution-end}
# ```
#
# ```{exercise} ch1-ex2: The largest weight a normalizer allows
# :label: ch1-ex2
# :nonumber:
#
# Write a function `max_weight_bound(F, a, L)` that returns the upper bound $C_2/L$ of Lemma 1 for a
# positive function `F` (acting on float64 tensors) and logits in $[-a,a]$, by evaluating $F$ on a
# fine grid of $[-a,a]$. Check it against `attn_utils.mathematics.theory.lemma1_bounds` for the softmax at
# $T=0.5$, for softplus, and for the non-monotone $F(l)=2+\cos 3l$, at $a=2$ and several $L$. Then
# build the row that comes closest to the bound (one logit where $F$ is largest, the others where it
# is smallest) with a function `extreme_row(F, a, L)`, normalize it with
# `attn_utils.mathematics.normalizers.general`, and check that its largest weight stays below your bound while
# exceeding $0.9$ times it for large $L$.
# ```
#
# ```{solution-start} ch1-ex2
# :class: dropdown
# ```

# %% tags=["solution"]
def max_weight_bound(F, a, L, n_grid=200_001):
    """C2 / L = max F / (L min F) over a grid of [-a, a]."""
    grid = torch.linspace(-a, a, n_grid, dtype=torch.float64)
    values = F(grid)
    return float(values.max() / values.min()) / L


def extreme_row(F, a, L, n_grid=200_001):
    """One logit at the grid maximizer of F, the others at its minimizer."""
    grid = torch.linspace(-a, a, n_grid, dtype=torch.float64)
    values = F(grid)
    row = torch.full((L,), float(grid[values.argmin()]), dtype=torch.float64)
    row[0] = grid[values.argmax()]
    return row


functions = {"softmax, T=0.5": lambda l: torch.exp(l / 0.5), "softplus": torch.nn.functional.softplus,
             "2 + cos(3l)": lambda l: 2 + torch.cos(3 * l)}
for name, F in functions.items():
    for length in (2, 10, 1000, 100_000):
        ours = max_weight_bound(F, 2.0, length)
        reference = theory.lemma1_bounds(F, 2.0, length).upper
        assert abs(ours - reference) <= 1e-6 * reference, (name, length, ours, reference)
        attained = float(normalizers.general(extreme_row(F, 2.0, length), F=F).max())
        assert attained <= ours * (1 + 1e-12), (name, length)
        if length == 100_000:
            assert attained >= 0.9 * ours, (name, attained, ours)
print("max_weight_bound agrees with theory.lemma1_bounds; the extreme rows approach it")

# %% [markdown]
# ```{solution-end}
# ```

# %% tags=["exercise-check"]
from attn_utils.classroom import exercises

exercises.check("ch1-ex2", max_weight_bound, extreme_row)
