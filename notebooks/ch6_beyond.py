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
# # Beyond the paper: the remedies under the paper's lenses
#
# The paper {cite}`mudarisov2025limitations` ends by naming three families of remedies for the
# limitations it proves: sparse normalizers (sparsemax {cite}`martins2016sparsemax` and 1.5-entmax
# {cite}`peters2019sparse`), a length-aware softmax (scalable softmax, SSMax
# {cite}`nakanishi2025scalable`) and a gradient-controlled one (self-adjust softmax, SA-softmax
# {cite}`zheng2025selfadjust`). It measures none of them. This chapter does, with the paper's own four
# lenses — vanishing weights against the length (Lemma 1, {doc}`ch1_vanishing`), the distance
# $\tilde d$ against $N$ and $L$ (Theorem 1, {doc}`ch2_distance`), the separability $N_s/N$
# (Theorem 2, {doc}`ch3_separability`) and the sensitivity of the weights to the logits (Lemma 2 and
# Corollary 3, {doc}`ch4_gradient`) — applied to softmax, sparsemax, 1.5-entmax, scalable softmax,
# softmax-1 {cite}`miller2023offbyone` and self-adjust softmax (signed, and in its normalized form).
#
# Every lens is applied twice: to synthetic logits, and to the **real logits of a pretrained model
# reading *War and Peace***, re-normalized with each rule. The model was trained with softmax and is
# **not retrained**: what we measure is what each normalizer does to the scores this model produces,
# not how a model trained with that normalizer would behave. Two questions the paper leaves open are
# measured at the end: how its curves continue beyond its 1024-token window, and whether the heads of
# a layer separate tokens independently, as the coverage arithmetic of its Discussion assumes.
# Everything here goes beyond the paper; the statements are ours and are proved below.
#
# **What you will learn**
#
# - which hypothesis of Lemma 1 each remedy breaks, and which remedies therefore escape the $1/L$ decay;
# - why the distance $\tilde d$ is essentially a count of keys times the size of the context vector, for
#   every normalizer;
# - the closed-form Jacobians of all seven rules, and which of them keep a usable gradient at low
#   temperature;
# - how the paper's distance and separability curves continue beyond $L$ on a longer window, and whether
#   the heads of a layer separate tokens independently.
#
# **What it assumes**
#
# - the lenses of chapters 1-4: Lemma 1 and Corollary 1 ({doc}`ch1_vanishing`), the cumulative distance of
#   Eq. (7) ({doc}`ch2_distance`), the separability of Definition (10) ({doc}`ch3_separability`) and the
#   Jacobian of softmax ({doc}`ch4_gradient`);
# - a pretrained model read through `Session` ({doc}`ch0_setting`); the model is re-normalized, never
#   retrained.

# %% tags=["parameters", "remove-cell"]
# Parameters (papermill). Every one is checked in the next cell.
model = "auto"            # model measured: "auto" (GPT-2 if it can be had, else SmolLM2-135M), "gpt2", "smollm2-135m", ...
corpus = "war-and-peace"  # "war-and-peace" or the path of a UTF-8 text file
chapters = None           # None (whole novel) or [first, last]: consecutive chapters, 1-based
offset = 0                # first token of the window
L = 1024                  # window of the paper (tokens); the normalizer lenses use the query rows t up to L
long_lengths = None       # longer windows: None for 2L and 4L as far as the model context allows, or a list of lengths above L
seed = 0                  # seed of every random draw (synthetic rows, directions, permutations)
device = "auto"           # "auto" (a GPU if there is one, else the CPU), "cpu" or "cuda": runs the model and the analysis
normalizers = ["softmax", "sparsemax", "entmax15", "ssmax", "softmax1", "self_adjust", "self_adjust_normalized"]  # normalizers compared
synthetic_lengths = [4, 16, 64, 256, 1024, 4096]  # row lengths of the synthetic checks (independent of L)
Ts = [0.001, 0.01, 0.1, 1.0, 10.0]  # temperatures of the gradient lens (on the model: multiples of its own temperature)
N = 5                     # top-N size of the distance-against-length curves (the paper's Figure 2a)
Ns = [2, 4, 8, 16, 32]    # top-N sizes of the distance, separability and coverage lenses (those below L are kept)
n_trials = 200            # synthetic rows per (length, family) and for the gradient lens
n_samples = 200           # permutations of the multi-head independence test
rows_per_octave = 4       # query rows sampled per octave of positions [2^k, 2^(k+1)) of the model's window

# %% tags=["remove-input"]
from attn_utils.book.formatting import parameter_table
from attn_utils.book.params import checked

p = checked(model=model, corpus=corpus, chapters=chapters, offset=offset, L=L, device=device, long_lengths=long_lengths, seed=seed,
            normalizers=normalizers, synthetic_lengths=synthetic_lengths, Ts=Ts, N=N, Ns=Ns, n_trials=n_trials,
            n_samples=n_samples, rows_per_octave=rows_per_octave)
parameter_table(p)

# %% tags=["hide-input"]
import time

import torch
from IPython.display import display

from attn_utils.book import claims, figures
from attn_utils.book.chapters import beyond
from attn_utils.book.formatting import glue_values, table
from attn_utils.book.session import Session
from attn_utils.mathematics import jacobian, normalize

figures.set_style()
started, threads = time.time(), torch.get_num_threads()
torch.set_num_threads(1)  # many small tensor operations: one thread is faster on a shared machine (not for the model)
names = list(dict.fromkeys(p.normalizers))  # the normalizers compared, in the order given
rng = torch.Generator().manual_seed(seed)   # every synthetic draw of the chapter, in the order of the sections

# %% [markdown]
# ## The normalizers
#
# All of them map a row of logits $l_1,\dots,l_L$ (with $z=l/T$) to weights; the library
# `attn_utils.mathematics.normalizers` implements each one with masks and in float64.
#
# | normalizer | weights | rows are | $L$ in $\theta$? |
# |---|---|---|---|
# | softmax | $e^{z_i}/\sum_j e^{z_j}$ | distributions | no |
# | sparsemax | $\max(z_i-\tau,0)$, $\tau$ such that the row sums to one | distributions with exact zeros | no, but not of the form of Eq. (3) |
# | 1.5-entmax | $\max(z_i/2-\tau,0)^2$, $\tau$ such that the row sums to one | distributions with exact zeros | no, but not of the form of Eq. (3) |
# | scalable softmax | softmax of $s\log(n)\,z$, $n$ = keys the row sees | distributions | **yes** |
# | softmax-1 | $e^{z_i}/(1+\sum_j e^{z_j})$ | non-negative, sum $<1$ | no |
# | self-adjust softmax | $z_i\,\mathrm{softmax}(z)_i$ | **signed**, any sum | no |
# | self-adjust (normalized) | $\frac{z_i-\min(z_{\min},0)}{\max(z_{\max},0)-\min(z_{\min},0)}\,\mathrm{softmax}(z)_i$ | non-negative, sum $\le 1$ | no |
#
# The measured ones in this run are: {glue:text}`names_list`. Three of them do not return a
# probability distribution, and the paper's geometric lenses are defined for distributions. We handle
# them by an exact identity rather than by an approximation.
#
# ```{prf:proposition} Homogeneity of the geometric lenses (ours)
# :label: ch6-prop-homogeneity
# :nonumber:
#
# Let $\alpha\ge0$ be a row of weights with mass $m=\sum_i\alpha_i>0$ and let $c>0$. The top-$N$ set
# of $c\alpha$ is that of $\alpha$, $\tilde d(c\alpha)=c\,\tilde d(\alpha)$ (sum-of-norms reading of
# Eq. (7)), and $N_s/N$ is the same for $c\alpha$ and $\alpha$. In particular
# $\tilde d(\alpha)=m\,\tilde d(\alpha/m)$ and $N_s/N(\alpha)=N_s/N(\alpha/m)$, where $\alpha/m$ is a
# distribution. For softmax-1, $\alpha/m$ is exactly the softmax of the same logits.
# ```
#
# ```{prf:proof}
# Multiplying all weights by $c>0$ keeps their order, so the top-$N$ set (ties broken by index) is
# unchanged. The context vector $s=\sum_{i\in I_N}\alpha_ix_i$ becomes $cs$, and every point
# $\alpha_ix_i$ becomes $c\,\alpha_ix_i$, so every distance $\|\alpha_ix_i-s\|$ is multiplied by $c$.
# $\tilde d$ is a sum of such distances, hence it scales by $c$; the radius $r$ of Definition (10) is
# their minimum over the non-selected keys and scales by $c$ too, so each comparison
# $\|\alpha_ix_i-s\|<r$ keeps its outcome and $N_s$ is unchanged. For softmax-1,
# $\alpha_i=e^{z_i}/(1+S)$ with $S=\sum_je^{z_j}$, so $m=S/(1+S)$ and $\alpha_i/m=e^{z_i}/S$.
# ```
#
# So softmax-1 and normalized self-adjust softmax enter the distance and separability lenses as they
# are (the library's `mathematics.beyond.geometry` works on any non-negative row, with the metrics' own
# kernels, `attn_utils.mathematics.kernels`; `mathematics.beyond.lens_distance` takes the
# route through the distribution $\alpha/m$ and `attn_utils.mathematics.metrics`, and the tests check that both
# agree). Softmax-1 therefore separates exactly as softmax does, and its distance is softmax's times
# the mass. The signed self-adjust softmax has no top-$N$ set in the paper's sense (negative weights)
# and no rescaling makes it a distribution: it appears in the lenses of Lemma 1 (through
# $|\alpha_i|$) and of the gradient only.

# %% [markdown]
# (ch6-lens1)=
# ## Lens 1: who escapes Lemma 1, and why
#
# {prf:ref}`Lemma 1 <ch1-lemma1>` needs three things: the rule has the form of Eq. (3) with a positive
# $F$, its parameters $\theta$ do not involve the length $L$, and the logits are bounded, $|l_i|\le a$.
# Then every weight is between $C_1/L$ and $C_2/L$. The remedies break different hypotheses, and two
# of the alternatives break none that matters.
#
# ```{prf:proposition} Softmax-1 and self-adjust softmax still vanish (ours)
# :label: ch6-prop-still-vanish
# :nonumber:
#
# Let $|l_i|\le a$ for all $i$, $T>0$, $b=a/T$. For every $L\ge1$ and every key $i$:
#
# 1. softmax-1: $\dfrac{e^{-b}}{1+Le^{b}}\le\alpha_i\le\dfrac{e^{b}}{1+Le^{-b}}\le\dfrac{e^{2b}}{L}$,
#    and the row mass satisfies $m\ge\dfrac{Le^{-b}}{1+Le^{-b}}\to1$;
# 2. self-adjust softmax: $|\alpha_i|\le b\,\dfrac{e^{2b}}{L}$;
# 3. normalized self-adjust softmax: $0\le\alpha_i\le\dfrac{e^{2b}}{L}$.
#
# All three are $O(1/L)$ with constants independent of $L$: no key keeps a fixed share of the weight.
# ```
#
# ```{prf:proof}
# (1) Each $e^{z_j}$ lies in $[e^{-b},e^{b}]$, so the denominator $1+\sum_je^{z_j}$ lies in
# $[1+Le^{-b},1+Le^{b}]$ and the bounds on $\alpha_i$ follow; $e^b/(1+Le^{-b})\le e^b/(Le^{-b})$.
# The mass is $S/(1+S)$ with $S\ge Le^{-b}$, and $x\mapsto x/(1+x)$ is increasing.
# (2) $|\alpha_i|=|z_i|\,\mathrm{softmax}(z)_i\le b\cdot e^{2b}/L$ by Corollary 1
# ({prf:ref}`Corollary 1 <ch1-cor1>`) with $\Delta/T$ replaced by $b$. (3) The factor
# $(z_i-\min(z_{\min},0))/(\max(z_{\max},0)-\min(z_{\min},0))$ lies in $[0,1]$, so
# $0\le\alpha_i\le\mathrm{softmax}(z)_i\le e^{2b}/L$.
# ```
#
# The extra 1 of softmax-1 lets a head put *less than all* of its weight on the keys, but with bounded
# logits its share of "attending to nothing" vanishes as the row gets longer ($1-m\le 1/(1+Le^{-b})$),
# and each weight is squeezed exactly as in softmax. Self-adjust softmax rescales the softmax weights
# by a bounded factor; it was designed for gradients, not for length.
#
# ```{prf:proposition} Scalable softmax, sparsemax and 1.5-entmax escape (ours)
# :label: ch6-prop-escape
# :nonumber:
#
# Let one key of a row of $n$ keys have a logit that exceeds every other logit by at least $g>0$.
#
# 1. Scalable softmax with parameter $s$: the key's weight is at least
#    $\big(1+(n-1)\,n^{-sg/T}\big)^{-1}$, which tends to 1 as $n\to\infty$ when $sg/T>1$. With all
#    logits in $[-a,a]$ every weight lies between $n^{-2sa/T}/n$ and $\min\{1,n^{2sa/T}/n\}$, so the
#    $1/n$ decay is no longer forced once $2sa/T\ge1$.
# 2. Sparsemax: if $g\ge T$ the key's weight is exactly 1 and all others are exactly 0, whatever $n$.
# 3. 1.5-entmax: the same holds if $g\ge 2T$.
# ```
#
# ```{prf:proof}
# (1) SSMax is softmax of $\lambda l$ with $\lambda=s\log(n)/T$, so the key's weight is
# $1/(1+\sum_{j}e^{\lambda(l_j-l_1)})\ge1/(1+(n-1)e^{-\lambda g})$ and $e^{-\lambda g}=n^{-sg/T}$;
# then $(n-1)n^{-sg/T}\to0$ when $sg/T>1$. The envelope is Lemma 1's proof with $F=e^{\lambda l}$,
# whose extremes on $[-a,a]$ have ratio $e^{2\lambda a}=n^{2sa/T}$: the "constant" now grows with
# $n$, which is exactly what the lemma's hypothesis "$L\notin\theta$" excludes.
# (2) Sparsemax sets $\alpha_i=\max(z_i-\tau,0)$ with the unique $\tau$ making the row sum to one.
# With $z=l/T$ the gap in $z$ is at least $g/T\ge1$; $\tau=z_1-1$ gives $\alpha_1=1$ and
# $\alpha_j=\max(z_j-z_1+1,0)=0$, and the row sums to one, so this is the $\tau$.
# (3) 1.5-entmax sets $\alpha_i=\max(z_i/2-\tau,0)^2$; $\tau=z_1/2-1$ gives $\alpha_1=1$ and
# $\alpha_j=\max((z_j-z_1)/2+1,0)^2=0$ when $z_1-z_j\ge2$.
# ```
#
# The two sparse rules escape for a different reason than SSMax: they are not of the form
# $F(l_i)/\sum_jF(l_j)$ with a positive $F$ at all (the threshold $\tau$ couples the keys, and weights
# can be exactly zero), so both halves of Lemma 1 fail — a key can keep weight 1, and the lower
# bound $C_1/L>0$ is violated by every exact zero. The library gives each envelope
# (`mathematics.beyond.lemma1_envelope`) and the planted-key guarantee
# (`mathematics.beyond.planted_weight_bound`), both read off the normalizer's record in the registry.
#
# **Synthetic check.** For each length of `synthetic_lengths`, `n_trials` rows of two families at $T=1$:
# *typical* rows with logits uniform on $[-a,a]$, and *planted* rows where key 0 sits at $+a$ and the
# others are uniform on $[-a,a-g]$, so that key 0 stands out by at least $g$. Scalable softmax uses
# $s=1$ here. Every weight is compared with its envelope, and every planted key of SSMax, sparsemax
# and 1.5-entmax with its guarantee.

# %%
lemma = beyond.lemma1_synthetic(names, p.synthetic_lengths, n_trials, rng)
table(lemma.extremes(), index=True, caption="Median largest weight at the smallest and the largest length")

# %% tags=["remove-cell"]
glue_values({"names_list": beyond.listing(names), **lemma.prose()})
claims.record("ch6-envelopes", model="synthetic", **lemma.envelope_claim())
claims.record("ch6-lemma1-escape", model="synthetic", **lemma.escape_claim());

# %% tags=["hide-input"]
figures.glue_figure("fig_ch6_lemma1_synthetic", beyond.plot_lemma1_synthetic(lemma, seed))

# %% [markdown]
# ```{glue:figure} fig_ch6_lemma1_synthetic
# ---
# name: fig-ch6-lemma1-synthetic
# alt: >-
#   Two log-log line plots of the median largest weight against the row length L, one line per normalizer,
#   with a dotted 1/L reference line; left for typical rows, right for rows with one planted key.
# ---
# **Lemma 1's lens on synthetic rows** (no model; logits bounded by $a=$ {glue:text}`syn_a`, $T=1$). One line per
# normalizer, in the colours of every figure of this chapter. Look at (b): the lines that stay flat belong to the
# rules that let an outstanding key keep its weight however long the row; the lines parallel to the dotted $1/L$
# belong to the rules that Lemma 1 or {prf:ref}`the proposition on softmax-1 and self-adjust softmax <ch6-prop-still-vanish>` force to vanish.
# ```
#
# Every weight of the {glue:text}`syn_rows_lemma` synthetic rows (logits in $[-a,a]$ with
# $a=${glue:text}`syn_a`) lies in the envelope of its normalizer:
# **{glue:text}`env_violations`** violations, and {glue:text}`planted_violations` planted keys below
# their guarantee. On the typical rows the largest weight shrinks under every rule, scalable softmax
# included: with a continuum of competitors near the top, SSMax's largest weight is about
# $2sa\log(n)/(Tn)$ for large $n$ (sum $e^{\lambda l_j}$ over uniform logits, $\lambda=s\log(n)/T$),
# which is {glue:text}`ssmax_approx` at $L=${glue:text}`syn_Lhi`, against a measured median of
# {glue:text}`typical_ssmax` (softmax: {glue:text}`typical_softmax`, sparsemax:
# {glue:text}`typical_sparsemax`). The planted rows separate the rules: from $L=${glue:text}`syn_Llo` to
# $L=${glue:text}`syn_Lhi` the key with a gap of {glue:text}`syn_gap` keeps its weight under
# {glue:text}`escapers`, and loses it under {glue:text}`vanishers` (our rule: it keeps the key if its
# median weight at the largest length is at least {glue:text}`keep_ratio` of that at the smallest).
# At $L=${glue:text}`syn_Lhi` the planted key gets {glue:text}`planted_softmax` under softmax,
# {glue:text}`planted_ssmax` under SSMax and {glue:text}`planted_sparsemax` under sparsemax. The
# measured split {glue:text}`escape_match`. Escaping Lemma 1 is therefore a statement about *what a
# rule allows* (an outstanding key keeps its weight), not about typical rows.

# %% [markdown]
# (ch6-lenses23)=
# ## Lenses 2 and 3: distance and separability, synthetic
#
# One elementary fact explains most of what the distance lens shows, for every normalizer.
#
# ```{prf:proposition} The distance is a count times the context vector (ours)
# :label: ch6-prop-count
# :nonumber:
#
# Let $\alpha\ge0$ be a row over $L_r$ visible keys, $I$ its top-$N$ set, $s=\sum_{i\in I}\alpha_ix_i$
# and $R=\max_i\|x_i\|$. Then
#
# $$
# \big|\,\tilde d-(L_r-N)\,\|s\|\,\big|\;\le\;R\sum_{i\notin I}\alpha_i .
# $$
#
# If moreover every weight is at most $C/L_r$ (the regime of Lemma 1), then
# $\tilde d\le R\,(NC+C)$ for every $L_r$: the distance stays bounded as the row grows.
# ```
#
# ```{prf:proof}
# For $i\notin I$ the reverse triangle inequality gives
# $\big|\,\|\alpha_ix_i-s\|-\|s\|\,\big|\le\alpha_i\|x_i\|\le R\,\alpha_i$; summing over the $L_r-N$
# non-selected keys gives the first claim. Under $\alpha_i\le C/L_r$,
# $\|s\|\le R\sum_{i\in I}\alpha_i\le RNC/L_r$ and $\sum_{i\notin I}\alpha_i\le C$, so
# $\tilde d\le(L_r-N)RNC/L_r+RC\le R(NC+C)$.
# ```
#
# So $\tilde d$ grows linearly in $L$ exactly when the context vector $s$ keeps a size of order one,
# that is, when the top-$N$ weights do **not** vanish. The paper's observation that the distance
# grows roughly linearly with $L$ (its Figure 2a) is therefore also evidence that the model escapes
# the $1/L$ regime of Lemma 1 in practice — consistent with the attention sinks of
# {doc}`ch1_vanishing`.
#
# **Synthetic check.** The vectors $x_i$ are uniform on the unit sphere of $\R^{64}$ (four
# independent sets; each set serves a quarter of the rows), the logits are the typical rows above,
# and we measure, per normalizer, $\tilde d$ (sum-of-norms reading, {doc}`ch2_distance`) against $L$
# at $N=${glue:text}`N_used`, and $\tilde d$ and $N_s/N$ (the strict count of
# {doc}`ch3_separability`) against $N$ at the largest length, and check
# {prf:ref}`the count proposition <ch6-prop-count>` on every row. Sparse rules can give a row fewer than $N$ non-zero
# weights; the top-$N$ set is then padded with zero-weight keys (ties go to the earlier key). Such a
# key sits at $\alpha_ix_i=0$, at the same distance $\|s\|$ from $s$ as every zero-weight key outside
# the set, so it is never separated: on such rows $N_s\le$ (support size). We keep these rows (the
# paper's definition applied literally), and report how often the support is smaller than $N$ and
# the separability of the rows whose support holds at least $N$ keys.

# %%
geometry = beyond.geometry_synthetic(names, p.synthetic_lengths, N, p.Ns, n_trials, rng)
for caption, frame in geometry.at_longest().items():
    display(table(frame, index=True, caption=caption))

# %% tags=["hide-input"]
figures.glue_figure("fig_ch6_distance_synthetic", beyond.plot_distance_synthetic(geometry, seed))
figures.glue_figure("fig_ch6_separability_synthetic", beyond.plot_separability_synthetic(geometry, seed))

# %% tags=["remove-cell"]
glue_values(geometry.prose())
claims.record("ch6-distance-count", model="synthetic", **geometry.claim());

# %% [markdown]
# ```{glue:figure} fig_ch6_distance_synthetic
# ---
# name: fig-ch6-distance-synthetic
# alt: >-
#   Two line plots of the median cumulative distance, one line per normalizer, on logarithmic axes; left
#   against the row length L at a fixed top-N size, right against the top-N size N at the largest length.
# ---
# **The distance lens on synthetic rows** (no model; unit vectors in $\R^{64}$, typical rows). (a) is the
# synthetic counterpart of the paper's Figure 2a, which plots, at $N=5$ and against $L$, the measured distance
# (green), its expectation (blue) and the upper bound (red) of Theorem 1 for GPT-2's softmax and finds both
# distances growing roughly linearly. Here there is one line per normalizer instead: look at which lines rise
# with $L$ and which stay flat. (b) The same distance against $N$ at the largest length.
# ```
#
# ```{glue:figure} fig_ch6_separability_synthetic
# ---
# name: fig-ch6-separability-synthetic
# alt: >-
#   Line plot of the mean separability fraction against the top-N size N on a logarithmic axis, one line per
#   normalizer, between 0 and 1.
# ---
# **The separability lens on synthetic rows** (no model), one line per normalizer: mean $N_s/N$ against $N$ at the
# largest length. The paper's Figure 3 shows the same fraction for GPT-2's heads as green boxes against $N$,
# levelling off between 0.70 and 0.85; look here at how fast each rule's fraction falls when nothing in the
# data is trained.
# ```
#
# {prf:ref}`the count proposition <ch6-prop-count>` holds on all {glue:text}`count_rows` (row, $N$) pairs
# ({glue:text}`count_violations` violations). The log-log slope of the median distance against $L$
# (at $N=${glue:text}`N_used`, {numref}`fig-ch6-distance-synthetic`) is {glue:text}`syn_dist_slopes`: with bounded logits the distance
# grows (slope at least {glue:text}`grows_rule`) for {glue:text}`syn_grow`, and stays nearly flat for
# {glue:text}`syn_flat`. By the proposition the slope is one plus the rate at which $\|s\|$
# shrinks: for the rules bound by Lemma 1 or {prf:ref}`the proposition on softmax-1 and self-adjust softmax <ch6-prop-still-vanish>` every top weight is
# $O(1/L)$, so $\tilde d$ stays bounded; on these typical rows the top weights of the other rules
# shrink more slowly (about $\log(L)/L$ for SSMax, as computed above, and more slowly still for the
# sparse rules, whose support grows sublinearly). At $N=${glue:text}`syn_Nmax` the mean separability
# ({numref}`fig-ch6-separability-synthetic`) is {glue:text}`syn_sep_at_Nmax`; {glue:text}`syn_support_short`.

# %% [markdown]
# (ch6-lens4)=
# ## Lens 4: gradients
#
# The paper's Corollary 3 concerns softmax; {doc}`ch4_gradient` corrected it to
# $\|J\|_2\le1/(2T)$. Here are the Jacobians of all the rules, in closed form
# (`mathematics.beyond.jacobian`; `mathematics.beyond.jvp` computes $Jv$ without forming $J$).
#
# ```{prf:proposition} Jacobians of the normalizers (ours)
# :label: ch6-prop-jacobians
# :nonumber:
#
# Write $z=l/T$, $J=\partial\alpha/\partial l$, and $\mathbf 1_S$ for the indicator of the support
# $S=\{i:\alpha_i>0\}$. Then, with $p=\mathrm{softmax}(z)$ and $r=\sqrt\alpha$ entrywise,
#
# | normalizer | $T\,J$ | $\Vert J\Vert_2$ |
# |---|---|---|
# | softmax, softmax-1 | $\operatorname{diag}(\alpha)-\alpha\alpha^\top$ | $\le 1/(2T)$ |
# | scalable softmax | $s\log(n)\,(\operatorname{diag}(\alpha)-\alpha\alpha^\top)$ | $\le s\log(n)/(2T)$ |
# | sparsemax | $\operatorname{diag}(\mathbf 1_S)-\mathbf 1_S\mathbf 1_S^\top/\lvert S\rvert$ | $=1/T$ if $\lvert S\rvert\ge2$, $=0$ if $\lvert S\rvert=1$ |
# | 1.5-entmax | $\operatorname{diag}(r)-rr^\top/\sum_ir_i$ | $\le 1/T$ |
# | self-adjust | $\operatorname{diag}(p\odot(1+z))-(z\odot p)\,p^\top$ | unbounded in $z$ |
#
# Away from ties, as $T\to0$ with fixed logits: $J\to0$ for softmax, softmax-1, scalable softmax and
# normalized self-adjust softmax; $J=0$ exactly for sparsemax once $T$ is below the gap between the
# two largest logits (for 1.5-entmax, half of it); and $T\,J\to e_ke_k^\top$ for self-adjust softmax,
# $k$ the largest logit, so its Jacobian grows like $1/T$.
# ```
#
# ```{prf:proof}
# *Softmax-1.* $\partial\alpha_i/\partial z_k=\delta_{ik}\alpha_i-\alpha_i\alpha_k$ by the quotient
# rule, as for softmax. For a unit vector $v$, $v^\top(\operatorname{diag}\alpha-\alpha\alpha^\top)v
# =\sum_i\alpha_iv_i^2-(\sum_i\alpha_iv_i)^2$ is the variance of the value $v_i$ drawn with
# probability $\alpha_i$, completed by a phantom outcome $0$ of probability $1-m$. By Popoviciu's
# inequality it is at most a quarter of the squared range of $\{0,v_1,\dots,v_L\}$, which is at most
# $(|v_a|+|v_b|)^2\le2$; the matrix is symmetric and positive semi-definite, so $\|J\|_2\le1/(2T)$.
# Scalable softmax is softmax of $\lambda l$, $\lambda=s\log(n)/T$ ($n$ does not depend on $l$).
# *Sparsemax.* On a neighbourhood where the support $S$ is fixed, $\alpha_S=z_S-\tau$ with
# $\tau=(\sum_{i\in S}z_i-1)/|S|$, which gives the matrix; it is the orthogonal projection onto
# $\{v:\ v=0 \text{ off } S,\ \sum_{i\in S}v_i=0\}$, of norm 1 unless that space is $\{0\}$ ($|S|=1$).
# *1.5-entmax.* On $S$, $\alpha_i=(z_i/2-\tau)^2$, i.e. $r_i=z_i/2-\tau$; differentiating
# $\sum_ir_i^2=1$ gives $d\tau=\sum_ir_i\,dz_i/(2\sum_ir_i)$ and
# $d\alpha_i=2r_i(dz_i/2-d\tau)$. The quadratic form $\sum_ir_iv_i^2-(\sum_ir_iv_i)^2/\sum_ir_i$ is
# between $0$ and $\sum_ir_iv_i^2\le\max_ir_i\le1$.
# *Self-adjust.* $\partial(z_ip_i)/\partial z_k=\delta_{ik}p_i+z_i(\delta_{ik}p_i-p_ip_k)$.
# *Limits.* Without ties, $p\to e_k$ exponentially fast in $1/T$ while $z$ grows only like $1/T$,
# so every term with a factor $p_j$, $j\ne k$, or $\alpha_k(1-\alpha_k)$ vanishes; what remains for
# self-adjust softmax is $p_k(1+z_k)-z_kp_k^2=p_k+z_kp_k(1-p_k)\to1$. For sparsemax, a gap
# $\ge T$ makes $|S|=1$ (previous proposition). Normalized self-adjust softmax has
# $\alpha_k=p_k$ identically near such a point (its factor is 1 at the largest logit when that logit is
# positive) and the other entries carry a factor $p_j\to0$.
# ```
#
# The proof of the normalized self-adjust Jacobian (product rule through the minimum and maximum)
# is in `mathematics.beyond.jacobian`; the tests compare every closed form with automatic differentiation
# (`torch.autograd`) to $10^{-10}$ and check the norm bounds on random and tied rows. Here we check
# the closed forms once more and then measure, on `n_trials` typical rows of {glue:text}`LG` keys, the
# exact spectral norm $\|J\|_2$ at each temperature of `Ts`. "Keeps a usable gradient as $T$ falls"
# is our rule: the median of $\|J\|_2$ at the smallest $T$ is at least a tenth of its largest median
# over the grid.

# %%
gradient = beyond.gradient_synthetic(names, p.Ts, n_trials, rng)
table(gradient.norms(), index=True, caption="Median spectral norm of the Jacobian on synthetic rows")

# %% tags=["hide-input"]
figures.glue_figure("fig_ch6_gradient_synthetic", beyond.plot_gradient_synthetic(gradient, seed))

# %% tags=["remove-cell"]
glue_values(gradient.prose())
claims.record("ch6-jacobians", model="synthetic", **gradient.claim());

# %% [markdown]
# ```{glue:figure} fig_ch6_gradient_synthetic
# ---
# name: fig-ch6-gradient-synthetic
# alt: >-
#   Two line plots against the temperature T on a logarithmic axis, one line per normalizer; left the median
#   spectral norm of the Jacobian with dashed 1/(2T) and dotted 1/T reference lines, right the share of rows whose
#   Jacobian is exactly zero.
# ---
# **The gradient lens on synthetic rows** (no model; {glue:text}`LG` keys per row). (a) Median spectral norm of the
# Jacobian against $T$, under the corrected softmax bound $1/(2T)$ of {doc}`ch4_gradient` and under $1/T$.
# (b) Share of rows whose Jacobian is exactly zero. Look at the low-temperature end: which lines fall to zero and
# which keep rising.
# ```
#
# The closed forms agree with automatic differentiation to {glue:text}`ad_error` (relative), and the
# norm bounds of {prf:ref}`the proposition on the Jacobians <ch6-prop-jacobians>` have {glue:text}`bound_violations` violations. As $T$
# falls to {glue:text}`T_min`, the ratio of the median norm to its largest median is
# {glue:text}`syn_usable_ratios`. By our rule (a ratio of at least {glue:text}`usable_rule`),
# {glue:text}`syn_keep` keep a usable gradient and {glue:text}`syn_lose` lose it. Panel (b) of
# {numref}`fig-ch6-gradient-synthetic` shows *how* the sparse rules lose it: their Jacobian is exactly zero as soon as the support
# shrinks to one key, while a softmax-type Jacobian is exponentially small but vanishes exactly only
# when the exponentials underflow. At $T=${glue:text}`T_mid` the shares of rows with an exactly
# zero Jacobian are {glue:text}`zero_mid`. Only the signed
# self-adjust softmax keeps a gradient that grows as $1/T$ — but by the proposition it is a gradient
# of the winning key's weight with respect to its own logit, $e_ke_k^\top/T$: it cannot move weight
# between keys.

# %% [markdown]
# (ch6-model)=
# ## The four lenses on the pretrained model
#
# We feed one window of the corpus to the model and capture, for every layer and head, the queries,
# keys (after rotary embeddings) and values. The logits are the model's own scaled scores,
# $l=q^\top k\cdot\text{scaling}$, so $T=1$ reproduces the model's softmax and the temperatures of the
# gradient lens are multiples of the model's own. Each row sees the keys the model lets it see
# (`Session.visible`): on a causal model query row $t$ (counting from one) sees $t$ keys, on an encoder every row
# sees all $L$, and only the layers of `Session.layers` are read (on Gemma 3 beyond 512 tokens, its global
# layers). {glue:text}`m_measured`
# We evaluate `rows_per_octave` query rows per octave of positions $[2^k,2^{k+1})$ (all rows of the
# short octaves) and weight each sampled row by the number of rows it stands for, the estimator that
# {doc}`ch2_distance` offers as its quicker option. Every row, as there, is out of reach here: the lenses
# keep the float64 logits of every kept row, for every normalizer compared and over the longer windows
# of the long-context part, and every row of this window would need about {glue:text}`m_every_row_gib` GiB of memory
# (`beyond.lens_memory`; a sample that does not fit is refused before the forward pass), its time
# growing with the rows kept. The window is as long as the longest of
# $L$ and the long-context lengths (see the last part of the chapter): `Session.longer` cuts it
# from the same corpus at the same offset, checks it against the model's context, and checks that
# its first $L$ tokens are the $L$-token window; because the mask is causal, its rows $t\le L$ are
# exactly the rows of the $L$-token window. `beyond.capture_logits` runs the model once over it and
# keeps, layer by layer, the logits of the sampled rows and the value vectors. Scalable softmax
# needs its parameter $s$: we set $s=1/\log L$, so that at a row of length $L$ it *coincides* with
# the model's softmax and every difference comes from the length dependence alone.

# %%
session = Session.open(p)
logits = beyond.capture_logits(session, p.long_lengths, rows_per_octave, threads=threads)
table(logits.facts(session.summary()), index=True, caption="The model and the window it read")

# %% tags=["remove-cell"]
glue_values(logits.prose())

# %% [markdown]
# {glue:text}`model_name` ({glue:text}`m_heads`) read a window of {glue:text}`m_Lrun` tokens, whose
# first {glue:text}`m_L` tokens are the {glue:text}`m_L`-token window of the other chapters. Our softmax of the captured scaled logits differs from the model's own attention by at
# most {glue:text}`m_err`. The normalizer lenses use {glue:text}`m_rows` sampled rows $t\le L$ per head;
# the long-context part adds {glue:text}`m_rows_extra` rows beyond. SSMax uses
# $s=1/\log L=${glue:text}`m_s`.
#
# ```{note}
# **Why a number here can differ from the same number in chapters 1-3.** The softmax curves of this chapter
# measure quantities that chapters 1-3 measure too (the slope of the largest weight against $t$, the mean
# distance $\tilde d$ at $N=5$ and $L=1024$, $N_s/N$ at $N=32$), but from the sampled rows, weighted by the rows
# they stand for, where chapters 1-3 use every row. The definitions are the same; the difference is the
# sampling error of this estimator, which {doc}`ch2_distance` measures against every row for the distance.
# The ledger records the chapters' own values under their own claims.
# ```
#
# ### Lemma 1 on the model
#
# For every normalizer and sampled row: the largest weight magnitude, the same without the first key
# (many heads park weight on the first token, an attention sink {cite}`xiao2024sinks`, see
# {doc}`ch1_vanishing`), the share of exact zeros and the mass.

# %%
lemma_model = beyond.lemma1_model(logits, names)
table(lemma_model.table(), index=True, caption="Lemma 1's lens on the model (entropy n/a: rows that are not "
      "probability distributions)")

# %% tags=["hide-input"]
figures.glue_figure("fig_ch6_lemma1_model", beyond.plot_lemma1_model(lemma_model, logits, corpus))

# %% tags=["remove-cell"]
glue_values(lemma_model.prose())

# %% [markdown]
# ```{glue:figure} fig_ch6_lemma1_model
# ---
# name: fig-ch6-lemma1-model
# alt: >-
#   Two log-log line plots of the median over heads of the largest weight against the row length t, one line
#   per normalizer, with a dotted 1/t reference line; left with all keys, right with the first key left out.
# ---
# **Lemma 1's lens on {glue:text}`model_name`'s logits, re-normalized by each rule** (not retrained). Median over
# all heads, for each row length $t$; where a longer window was read, a grey vertical line marks $t=L$ and the rows
# of the longer window lie to its right. (a) All keys: the largest weight mostly measures the attention sink,
# wherever the model has one. (b) The first key left out: look at which lines run parallel to the dotted $1/t$
# and which stay flatter.
# ```
#
# In panel (b) of {numref}`fig-ch6-lemma1-model`, the fitted log-log slopes of the median over $t\ge${glue:text}`T_FIT`,
# $t\le L$, are: softmax {glue:text}`mslope_softmax`, SSMax {glue:text}`mslope_ssmax`, sparsemax
# {glue:text}`mslope_sparsemax`, 1.5-entmax {glue:text}`mslope_entmax15`, softmax-1
# {glue:text}`mslope_softmax1`, self-adjust {glue:text}`mslope_self_adjust`, normalized self-adjust
# {glue:text}`mslope_self_adjust_normalized` (a uniform row would give $-1$). {glue:text}`m_soft_flat` Sparse rules set
# {glue:text}`m_zeros_sparse` of the visible weights to exactly zero, and the median entropy of the
# rows is {glue:text}`m_entropy` (nats).
#
# ### Distance and separability on the model
#
# The vectors are the per-head value vectors (projected onto the unit sphere for the separability,
# as in {doc}`ch3_separability`). For every normalizer but the signed self-adjust softmax we compute,
# on every sampled row, $\tilde d$ and $N_s/N$ for $N$ = `N` and every $N$ of `Ns`, with
# `mathematics.beyond.geometry`, and average per head over the rows $t\le L$ (rows that see at most $N$ keys are
# skipped). Before that, the fast path is checked against the library route through
# `attn_utils.mathematics.metrics` on one layer.

# %%
geometry_model = beyond.geometry_model(logits, names, N, p.Ns)
for caption, frame in geometry_model.table().items():
    display(table(frame, index=True, caption=caption))

# %% tags=["hide-input"]
figures.glue_figure("fig_ch6_geometry_model", beyond.plot_geometry_model(geometry_model, logits, corpus))

# %% tags=["remove-cell"]
glue_values(geometry_model.prose())

# %% [markdown]
# ```{glue:figure} fig_ch6_geometry_model
# ---
# name: fig-ch6-geometry-model
# alt: >-
#   Two line plots against the top-N size N on a logarithmic axis, one line per normalizer; left the median
#   over heads of the mean cumulative distance on a logarithmic scale, right the median over heads of the mean
#   separability fraction with a grey band between 0.70 and 0.85.
# ---
# **The distance and separability lenses on {glue:text}`model_name`'s logits, re-normalized by each rule**
# (value vectors, rows $t\le L$). (a) Median over heads of the per-head mean $\tilde d$ against $N$; the paper's
# Figure 2b draws this curve for GPT-2's softmax only (measured distance, expectation and bound against $N$ at
# $L=1024$, levelling off beyond $N\approx20$). (b) Median over heads of the per-head mean $N_s/N$; the paper's
# Figure 3 shows its softmax heads as green boxes against $N$, settling inside the grey band. Look at how far the
# other rules' lines move away from softmax's.
# ```
#
# The fast path and the library route agree to {glue:text}`route_err` on the checked layer. At
# $N=${glue:text}`N_used` the median over heads of the mean distance is {glue:text}`m_dist`, and the
# count term $(L_r-N)\|s\|$ of {prf:ref}`the count proposition <ch6-prop-count>` makes up a median share of
# {glue:text}`m_count_share` of each row's distance: on the model, $\tilde d$ is essentially the
# number of non-selected keys times the size of the context vector. At $N=${glue:text}`m_Nmax` the
# median separability is {glue:text}`m_sep`. Softmax-1 coincides with softmax in separability
# ({prf:ref}`the homogeneity proposition <ch6-prop-homogeneity>`), and its distance is smaller by its mass. The sparse rules keep
# fewer than $N$ keys on {glue:text}`m_short` of the rows; the zero-weight padding of their top-$N$
# sets cannot be separated, which pulls their fraction down. On the rows whose support holds at least
# $N$ keys their separability is {glue:text}`m_sep_full`.
#
# ### Gradients on the model
#
# For every normalizer, temperature and sampled row we compute the exact directional derivative
# $\|J(l_t)\,v_t\|_2$ along a random unit direction $v_t$ of the visible keys (the same direction for
# every normalizer and temperature): the limit $\varepsilon\to0$ of the paper's finite difference
# $g(T,\varepsilon)$ of Algorithm 5. Per head we average over the rows $t\le L$; the paper's $g$ is
# the maximum over heads, and we also show the median.

# %%
gradient_model = beyond.gradient_model(logits, names, p.Ts, seed)
table(gradient_model.medians(), index=True, caption="Median over heads of the mean directional derivative")

# %% tags=["hide-input"]
figures.glue_figure("fig_ch6_gradient_model", beyond.plot_gradient_model(gradient_model, logits, seed))

# %% tags=["remove-cell"]
glue_values(gradient_model.prose())

# %% [markdown]
# ```{glue:figure} fig_ch6_gradient_model
# ---
# name: fig-ch6-gradient-model
# alt: >-
#   Two log-log line plots of the mean directional derivative of the weights against the temperature, as a
#   multiple of the model's own, one line per normalizer; left for the largest head, right for the median head.
# ---
# **The gradient lens on {glue:text}`model_name`'s logits**: the derivative of the weights along a random
# direction, averaged over the rows $t\le L$ of each head, against the temperature (1 is the model's own). (a) The
# largest head, as in the paper's $g$ of Figure 4, which plots for GPT-2's softmax the finite-difference version
# of this quantity against $T$ on log-log axes, three perturbation sizes and the dashed bound of Corollary 3;
# (b) the median head. Look at the left end: which rules still respond when $T$ is a thousandth of the model's.
# ```
#
# On the model's logits ({numref}`fig-ch6-gradient-model`) the ratio of the median derivative at $T=${glue:text}`T_min` to its largest
# value over the grid is {glue:text}`m_usable_ratios`: by the same rule as on synthetic rows,
# {glue:text}`m_keep` keep a usable gradient as $T$ falls and {glue:text}`m_lose` lose it.
#
# ## Summary: the remedies under the paper's lenses

# %% tags=["hide-input"]
summary, sentences, both = beyond.summary(names, lemma, geometry, gradient, lemma_model, geometry_model,
                                            gradient_model)
for caption, part in beyond.summary_tables(summary).items():
    display(table(part, index=True, caption=caption))

# %% [markdown]
# Read row by row (every entry is computed above; the sentences are assembled from the same numbers):
# {glue:text}`verdicts`
#
# The propositions explain the pattern. Escaping the $1/L$ decay needs the length in $\theta$ or a
# rule that is not a positive $F$ normalized by a sum. The sparse rules escape it, but they pay with
# the gradient: an exact zero has no derivative, and at low temperature a one-key support has none
# at all. On the model their support is often smaller than $N$, and then the top-$N$ set holds keys
# of weight zero (share of the rows with fewer than $N$ keys at $N=${glue:text}`m_Nmax`:
# {glue:text}`m_short`; separability on the rows whose support holds $N$ keys:
# {glue:text}`m_sep_full`). Scalable softmax escapes by sharpening with
# the length, which makes it *more* prone to the one-hot saturation of {doc}`ch4_gradient` (its
# Jacobian carries the factor $s\log n$). Softmax-1 is softmax with a leak: same separability, same
# decay, smaller mass. Self-adjust softmax keeps a gradient at low temperature, but only along the
# winning key. {glue:text}`both_text` — the paper's future-work list asks for a single normalizer
# that is length-adaptive, sparse and gradient-stable.

# %% tags=["remove-cell"]
glue_values({"verdicts": sentences, "both_text": both})
if {"ssmax", "softmax"} <= set(names):
    claims.record("ch6-ssmax-model", model=session.name, **lemma_model.ssmax_claim())
if {"sparsemax", "entmax15"} & set(names) and "softmax" in names:
    claims.record("ch6-sparse-model", model=session.name, **lemma_model.sparse_claim())
if {"self_adjust", "self_adjust_normalized"} & set(names) and "softmax" in names:
    claims.record("ch6-self-adjust-gradient", model=session.name, **gradient_model.self_adjust_claim());

# %% [markdown]
# (ch6-long)=
# ## Beyond 1024 tokens: how the paper's curves continue
#
# The paper stops at GPT-2's context of 1024 tokens. {glue:text}`long_text` On a causal model the rows
# $t\le L'$ of the long window are exactly the rows of an $L'$-token window, so one window
# gives the paper's curves at every length up to {glue:text}`m_Lrun`. The curves of
# {numref}`fig-ch6-long-context` use the model's own attention (softmax), as in the paper: the distance $\tilde d$ at $N=${glue:text}`N_used`
# against the window length (Figure 2a of the paper), and the separability $N_s/N$ against $N$ at $L$
# and at the longest window (the paper's Figure 3). The largest weight against $t$ was shown above for every
# normalizer, right of the grey line. Like every model number of this chapter, these come from the sampled rows:
# at the lengths that {doc}`ch2_distance` and {doc}`ch3_separability` measure too, they differ from those
# chapters' every-row values by the sampling error (see the note above), not by another definition.

# %%
long = beyond.long_context(logits, geometry_model)
table(long.curves, caption=f"Mean and median over heads of the per-head mean distance at N = {N}, per window length")

# %% tags=["hide-input"]
figures.glue_figure("fig_ch6_long_context", beyond.plot_long_context(long, corpus))

# %% tags=["remove-cell"]
distance_claim = claims.record("ch6-long-distance", model=session.name, **long.distance_claim())
separability_claim = claims.record("ch6-long-separability", model=session.name, **long.separability_claim())
glue_values({**long.prose(lemma_model), "dist_long_verdict": distance_claim.verdict,
             "sep_long_verdict": separability_claim.verdict})

# %% [markdown]
# ```{glue:figure} fig_ch6_long_context
# ---
# name: fig-ch6-long-context
# alt: >-
#   Two panels. Left, a log-log plot of the mean cumulative distance against the window length, mean and
#   median head, with a dotted line of slope one and a grey vertical line at L. Right, the median separability
#   fraction against the top-N size N, one line per window length, over a grey band between 0.70 and 0.85.
# ---
# **The paper's curves continued beyond $L$ on {glue:text}`model_name`** (its own softmax, value vectors). (a) The
# distance at $N=${glue:text}`N_used` against the window length $L'$; the grey vertical line marks $L$. The paper's
# Figure 2a draws this for GPT-2 up to 1024 tokens, with the measured distance (green), its
# expectation (blue) and the bound (red) all rising roughly linearly; here compare the measured curve with the
# dotted line of slope 1. (b) The median over heads of $N_s/N$ against $N$, at $L$ and on the longest window,
# over the paper's band of Figure 3 (green boxes levelling off between 0.70 and 0.85).
# ```
#
# The distance keeps growing with the window: its log-log slope is {glue:text}`slope_below` up to
# $L$ and {glue:text}`slope_above` beyond (verdict on the paper's "linear in $L$", continued:
# **{glue:text}`dist_long_verdict`**). The separability at $N=${glue:text}`N_plateau` moves from
# {glue:text}`sep_L` at $L$ to {glue:text}`sep_Lrun` on the longest window (the paper's range
# 0.70–0.85, continued: **{glue:text}`sep_long_verdict`**). For the largest weight without the
# first token, the slope beyond $L$ is {glue:text}`cont_softmax` for softmax and
# {glue:text}`cont_ssmax` for scalable softmax. These are one window of one model: longer rows are
# also later positions in the text, so length and position are confounded, as in {doc}`ch1_vanishing`.
#
# (ch6-heads)=
# ## Several heads: is the coverage arithmetic right?
#
# The paper's Discussion argues that if each of $H$ heads separates a fraction $p$ of the top-$N$
# tokens and the heads are independent, together they cover $1-(1-p)^H$ of them
# ({doc}`ch3_separability` checks the arithmetic). The real heads of a layer do not share one top-$N$
# set, so "the top-$N$ tokens" needs a definition before the formula can be tested.
#
# ```{prf:definition} Coverage of a query row by the heads of a layer (ours)
# :label: ch6-def-coverage
# :nonumber:
#
# For one layer and query row, let $I_N^h$ be the top-$N$ set of head $h$, $S^h\subseteq I_N^h$ its
# separated keys (Definition (10), strict count), and $k_h=|S^h|$. The **universe** is
# $U=\bigcup_hI_N^h$, the keys selected by at least one head, and the **coverage** is
# $|\bigcup_hS^h|/|U|$, the share of them that at least one head separates.
# ```
#
# ```{prf:proposition} Coverage under independence (ours)
# :label: ch6-prop-coverage
# :nonumber:
#
# If each $S^h$ is a uniformly random subset of size $k_h$ of $I_N^h$, independently across heads,
# then a key $i\in U$ is missed by every head with probability
# $\prod_{h:\,i\in I_N^h}(1-k_h/N)$, and the expected coverage is
# $\frac1{|U|}\sum_{i\in U}\big(1-\prod_{h:\,i\in I_N^h}(1-k_h/N)\big)$. When all heads select the
# same $N$ keys and $k_h/N=p$, this is the paper's $1-(1-p)^H$.
# ```
#
# ```{prf:proof}
# For a fixed head containing $i$, a uniform $k_h$-subset of the $N$ keys of $I_N^h$ contains $i$ with
# probability $k_h/N$; heads that do not select $i$ never separate it. Independence multiplies the
# probabilities of missing $i$, and linearity of expectation sums over $U$. If every $I_N^h=U$ with
# $|U|=N$ and $k_h=pN$, each product is $(1-p)^H$.
# ```
#
# ````{admonition} How it is computed: the paper's multi-head coverage
# :class: dropdown
# The library's functions (`attn_utils.mathematics.theory`): the paper's $1-(1-p)^H$, computed as
# $-\operatorname{expm1}(H\log(1-p))$ so that it stays accurate for tiny $p$, and the fewest heads that reach a
# coverage.
#
# ```{literalinclude} ../attn_utils/mathematics/theory/coverage.py
# :language: python
# :pyobject: multihead_coverage
# ```
#
# ```{literalinclude} ../attn_utils/mathematics/theory/coverage.py
# :language: python
# :pyobject: heads_for_coverage
# ```
# ````
#
# The test: per layer and sampled row $t\le L$ (model's own softmax, value vectors on the unit
# sphere), the observed coverage against (a) the paper's $1-(1-\bar p)^H$ with $\bar p$ the mean
# $N_s/N$ of the heads, and (b) the expectation of {prf:ref}`the coverage proposition <ch6-prop-coverage>`, which accounts for
# the different top-$N$ sets. The null hypothesis "the separated sets are independent given what
# each head selects" is tested by `n_samples` permutations that shuffle each head's separated
# indicator within its own top-$N$ set (`mathematics.beyond.coverage`), with the total number of covered keys
# over all layers and rows as the statistic; its exact null mean is (b). Query heads that share a key/value
# head (grouped-query attention) share their keys and values, so they cannot be expected to separate
# independently: the test is run between heads that share **no** key/value head (the $j$-th query head of every
# key/value head form a group, the groups' totals are pooled), on all pairs when no head shares (an encoder
# such as MiniLM), and not at all, the claim being not comparable, when every pair shares one (Gemma 3, one
# key/value head for its four query heads; heads of different layers are not the paper's "$H$ heads").
# Here: {glue:text}`cov_tested`. The coverage itself is that of all the heads of a layer. As a second look, for every
# pair of heads of a layer we take the keys both select and compute the phi coefficient of "head $h$
# separates" against "head $h'$ separates" (`mathematics.beyond.head_association`).

# %%
coverage = beyond.coverage(logits, geometry_model, p.Ns, n_samples, seed)
table(coverage.shown(), index=True, caption="Coverage by the heads of a layer, per N (z: n/a where the "
      "permutations cannot change the coverage)")

# %% tags=["hide-input"]
figures.glue_figure("fig_ch6_coverage", beyond.plot_coverage(coverage, corpus, seed))

# %% tags=["remove-cell"]
verdicts = {"cov_verdict": "n/a", "indep_verdict": "n/a"}
if coverage.N is not None:
    verdicts["cov_verdict"] = claims.record("ch6-multihead-coverage", model=session.name,
                                            **coverage.coverage_claim()).verdict
    verdicts["indep_verdict"] = claims.record("ch6-heads-independent", model=session.name,
                                              **coverage.independence_claim()).verdict
glue_values({**coverage.prose(), **verdicts})

# %% [markdown]
# ```{glue:figure} fig_ch6_coverage
# ---
# name: fig-ch6-coverage
# alt: >-
#   Two panels against the top-N size N. Left, four lines between 0 and 1: the observed coverage, the
#   prediction under independence given the selections, the paper's formula and the mean fraction p. Right, box
#   plots of the phi coefficient of the pairs of heads of a layer, with a line at zero.
# ---
# **Coverage by the heads of a layer of {glue:text}`model_name`** (its own softmax, value vectors, rows
# $t\le L$). (a) The share of the universe $U$ that at least one head separates, against the selection-aware
# prediction of {prf:ref}`the coverage proposition <ch6-prop-coverage>`, the paper's $1-(1-\bar p)^H$ and $\bar p$ itself; look at whether
# the observed line follows the selection-aware one or the paper's. (b) Per $N$, the phi coefficients of the pairs
# of heads on the keys both select: boxes centred above zero mean heads that separate the same keys.
# ```
#
# At $N=${glue:text}`cov_N` ({numref}`fig-ch6-coverage`) the heads separate on average $\bar p=${glue:text}`cov_p` of their own
# top-$N$ sets, and their sets differ: the universe holds {glue:text}`cov_U` times $N$ keys. The
# heads together separate {glue:text}`cov_obs` of the universe. The paper's formula with $\bar p$
# predicts {glue:text}`cov_paper`: it assumes one shared set of $N$ keys, and here it
# {glue:text}`cov_paper_relation` what the heads cover (verdict: **{glue:text}`cov_verdict`**). The selection-aware prediction of
# {prf:ref}`the coverage proposition <ch6-prop-coverage>` is {glue:text}`cov_ind`. The observed coverage is
# {glue:text}`cov_z` null standard deviations from it: the heads cover {glue:text}`cov_direction`.
# The permutation test gives $p$ {glue:text}`cov_pvalue` ({glue:text}`cov_nperm` permutations, so
# $p$ cannot resolve values below one over that number), and {glue:text}`cov_layers` layers reject independence on their own at
# 0.01. Verdict on the independence assumption: **{glue:text}`indep_verdict`**. For pairs of heads,
# the median phi over the keys both select is {glue:text}`phi_median` ({glue:text}`phi_share` of the
# pairs have a chi-square $p<0.01$, a test that treats the pooled keys as independent observations,
# which they are not); pairs that share a key/value head have median {glue:text}`phi_same`, others
# {glue:text}`phi_other`.
#
# ```{admonition} What this means
# The paper's remedies each fix one limitation and leave, or worsen, another. Length-aware scalable
# softmax and the sparse rules escape the $1/L$ decay that Lemma 1 forces on softmax, softmax-1 and
# self-adjust softmax; the sparse rules then pay with exact zeros in the gradient, and scalable
# softmax with the sharpening that saturates it. On a pretrained model (re-normalized, not retrained)
# the summary table shows which of these trade-offs the measurements bear out, and the section on
# longer windows how the paper's curves continue past 1024 tokens. Finally, the arithmetic
# $1-(1-p)^H$ {glue:text}`cov_formula_text`; heads select different keys, and whether their separated
# sets behave independently is a measurable property of the layer, reported in the ledger of
# {doc}`ch5_reproducibility`.
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
# ```{include} ../_models/ch6_beyond.md
# ```
#
# ## Key takeaways
#
# - **Lemma 1.** Every weight of the synthetic rows lies in its envelope ({glue:text}`env_violations`
#   violations). A key that stands out keeps its weight as the row grows under {glue:text}`escapers`,
#   and loses it under {glue:text}`vanishers`, as the propositions predict.
# - **Distance.** $\tilde d$ is the count term $(L_r-N)\|s\|$ up to the weight outside the top-$N$ set
#   ({glue:text}`count_violations` violations of {prf:ref}`the count proposition <ch6-prop-count>`); on the model that term makes
#   up a median share {glue:text}`m_count_share` of each row's distance.
# - **Gradients.** As $T$ falls, {glue:text}`syn_keep` keep a usable gradient on synthetic rows, and
#   {glue:text}`m_keep` on the model's logits.
# - **Beyond $L$.** The distance grows with log-log slope {glue:text}`slope_above` beyond $L$
#   (**{glue:text}`dist_long_verdict`**); the separability at $N=${glue:text}`N_plateau` is
#   {glue:text}`sep_Lrun` on the longest window (**{glue:text}`sep_long_verdict`**).
# - **Several heads.** They cover {glue:text}`cov_obs` of the keys they select, against
#   {glue:text}`cov_paper` by the paper's formula (**{glue:text}`cov_verdict`**); independence of the heads:
#   **{glue:text}`indep_verdict`**.
# - {glue:text}`both_text`.
#
# ## Provenance

# %% tags=["remove-cell"]
glue_values({"runtime": f"{time.time() - started:.0f} s"})

# %%
session.provenance_table()


# %% [markdown]
# This chapter ran in {glue:text}`runtime` after its imports; it times none of the paper's algorithms, so this
# is its one run time.
#
# ## Exercises
#
# ```{exercise} ch6-ex1: Softmax-1 cannot keep a key, and cannot stay silent
# :label: ch6-ex1
# :nonumber:
#
# Let $\alpha=\mathrm{softmax}_1(l/T)$ for a row of $L$ logits in $[-a,a]$.
# (a) Prove the two-sided bound of {prf:ref}`the proposition on softmax-1 and self-adjust softmax <ch6-prop-still-vanish>` and deduce that the largest weight
# is $O(1/L)$. (b) Show that the mass $m=\sum_i\alpha_i$ tends to 1 as $L\to\infty$, at rate
# $1-m\le e^{a/T}/L$. (c) What must happen to the logits for a head with softmax-1 to attend to
# (almost) nothing in a long row?
# ```
#
# ```{solution-start} ch6-ex1
# :class: dropdown
# ```
#
# (a) With $b=a/T$, every $e^{z_j}\in[e^{-b},e^{b}]$, so $S=\sum_je^{z_j}\in[Le^{-b},Le^{b}]$ and
# $\alpha_i=e^{z_i}/(1+S)\in\big[e^{-b}/(1+Le^{b}),\,e^{b}/(1+Le^{-b})\big]$. The upper end is at most
# $e^{b}/(Le^{-b})=e^{2b}/L$.
#
# (b) $1-m=1/(1+S)\le1/(1+Le^{-b})<e^{b}/L$.
#
# (c) $1-m$ is large only if $S$ is small, i.e. $\sum_je^{z_j}=O(1)$: the logits must fall like
# $-\log L$ (relative to the implicit zero logit) as the row grows. With bounded logits this is
# impossible, so softmax-1's "null attention" fades with the length, exactly like every weight.
#
# ```{solution-end}
# ```
#
# ```{exercise} ch6-ex2: The sparsemax Jacobian from its support
# :label: ch6-ex2
# :nonumber:
#
# Write a function `sparsemax_jacobian(row, T)` that takes one row of logits (a float64 tensor of
# shape `(L,)`) and returns the $L\times L$ Jacobian of `attn_utils.mathematics.normalizers.sparsemax` at $T$
# from the formula $J=(\operatorname{diag}(\mathbf 1_S)-\mathbf 1_S\mathbf 1_S^\top/|S|)/T$ of
# {prf:ref}`the proposition on the Jacobians <ch6-prop-jacobians>`, with $S$ the support of the weights. Compare it with automatic
# differentiation (`torch.autograd.functional.jacobian`) and with `attn_utils.mathematics.jacobian` on 50
# random rows of 12 logits, and check that its spectral norm is $1/T$ exactly when the support has at
# least two keys.
# ```
#
# ```{solution-start} ch6-ex2
# :class: dropdown
# ```

# %% tags=["solution"]
def sparsemax_jacobian(row: torch.Tensor, T: float) -> torch.Tensor:
    """d sparsemax(row / T) / d row from the support S: (diag(1_S) - 1_S 1_S^T / |S|) / T."""
    from attn_utils.mathematics.normalizers import sparsemax

    on = (sparsemax(row.unsqueeze(0), T=T)[0] > 0).to(torch.float64)
    return (torch.diag(on) - torch.outer(on, on) / on.sum()) / T


ex_gen = torch.Generator().manual_seed(seed)
for trial in range(50):
    row = torch.randn(12, generator=ex_gen, dtype=torch.float64) * 2
    T_ex = float(torch.empty(1).uniform_(0.1, 3.0, generator=ex_gen))
    mine = sparsemax_jacobian(row, T_ex)
    auto = torch.autograd.functional.jacobian(lambda r: normalize(r.unsqueeze(0), "sparsemax", T=T_ex)[0], row)
    assert torch.allclose(mine, auto, atol=1e-12) and torch.allclose(mine, jacobian(row.unsqueeze(0), "sparsemax", T=T_ex)[0], atol=1e-12)
    support = int((normalize(row.unsqueeze(0), "sparsemax", T=T_ex) > 0).sum())
    expected = 1 / T_ex if support >= 2 else 0.0
    assert abs(float(torch.linalg.matrix_norm(mine, ord=2)) - expected) < 1e-9
print("sparsemax_jacobian agrees with autograd and attn_utils.mathematics.jacobian on 50 rows; ||J|| = 1/T iff |S| >= 2")

# %% [markdown]
# ```{solution-end}
# ```

# %% tags=["exercise-check"]
from attn_utils.classroom import exercises

exercises.check("ch6-ex2", sparsemax_jacobian)
