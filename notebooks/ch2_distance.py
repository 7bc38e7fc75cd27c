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
# # The distance bound: Theorem 1 and Corollary 2
#
# A head that selects its $N$ heaviest tokens summarises them in a context vector $s$. How far do
# the *other* tokens stay from that summary? The paper {cite}`mudarisov2025limitations` measures this
# with a cumulative distance $\tilde d$, bounds it from above for a fixed top-$N$ set (Theorem 1),
# computes its mean over a uniformly random $N$-set up to a Jensen residual, and reads off two limits
# (Corollary 2). Its Figure 2 then compares the three quantities on GPT-2 and extracts a "critical
# $N$" with a Kolmogorov–Smirnov test {cite}`massey1951kolmogorov`. This chapter does the same:
# definitions, statements and our proofs, a synthetic check of every inequality, and the experiment
# on the pretrained model of {doc}`ch0_setting`. Most display formulas of this part of the paper are
# lost in the copies available to us, so several statements below are **our reconstructions**; each
# says what is recovered and what is ours.

# %% tags=["parameters"]
# Parameters (papermill). Every one is checked in the next cell.
model = "auto"                         # model measured: "auto" (GPT-2 if it can be had, else SmolLM2-135M), "gpt2", "smollm2-135m", ...
corpus = "war-and-peace"               # "war-and-peace" or the path of a UTF-8 text file
chapters = None                        # None (whole novel) or [first, last]: consecutive chapters, 1-based
offset = 0                             # first token of the window
L = 1024                               # window length in tokens; panel (b) of Figure 2 uses rows of this length
seed = 0                               # seed of every random draw (synthetic instances, Monte Carlo)
N = 5                                  # top-N size of panel (a) (distance against the length)
lengths = [32, 64, 128, 256, 512, 1024]  # lengths of panels (a) and (c); each at most L
Ns = [1, 5, 10, 20, 100]               # top-N sizes of panel (b); each below L
ks_alpha = 0.01                        # level of the KS test of the critical N (paper's text: 0.01; its pseudocode: 0.05)
n_trials = 3000                        # number of random synthetic instances for the fixed-set bound
n_samples = 256                        # Monte-Carlo draws of the random N-set per synthetic row
vectors = "value"                      # per-head vectors used as the x_i: "value", "key" or "query"
distance_reading = "sum_of_norms"      # reading of d~ measured on the model: "sum_of_norms" (ours) or "norm_of_sum"
rows_per_octave = 32                   # query rows sampled per octave of positions, i.e. per doubling of t; None for every row

# %%
from attn_utils.book.params import validate

validate(model=model, corpus=corpus, chapters=chapters, offset=offset, L=L, seed=seed, N=N, lengths=lengths,
         Ns=Ns, ks_alpha=ks_alpha, n_trials=n_trials, n_samples=n_samples, vectors=vectors,
         distance_reading=distance_reading, rows_per_octave=rows_per_octave)
if max(lengths) > L:
    raise ValueError(f"parameter lengths must not exceed L = {L}, got {lengths}")
if max(Ns) >= L:
    raise ValueError(f"parameter Ns must hold sizes below L = {L}, got {Ns}")
if N >= min(lengths):
    raise ValueError(f"parameter N must be below the shortest length {min(lengths)}, got {N}")

# %% tags=["hide-input"]
import math
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from myst_nb import glue
from scipy.stats import ks_2samp

from attn_utils.mathematics import algorithms, metrics, theory

from attn_utils.book import figures, runlog
from attn_utils.book.claims import Claim, record
from attn_utils.mathematics.normalizers import causal_mask
from attn_utils.book.session import VECTOR_FIELD, Session

figures.set_style()
CHAPTER = "ch2_distance"
F64 = torch.float64
gen = torch.Generator().manual_seed(seed)
# The measurements below are many small tensor operations; on a shared two-core machine extra threads
# spin against each other and slow them down several-fold, so we use one thread except for the model.
THREADS = torch.get_num_threads()
torch.set_num_threads(1)

# %% [markdown]
# ## Definitions
#
# Fix one query. Its weights $\alpha_1,\dots,\alpha_L$ are non-negative and sum to one, and each key
# $i$ carries a vector $x_i\in\mathbb R^d$ (on the model, by default, the head's value vector; see
# {doc}`ch0_setting`).
#
# ```{prf:definition} Top-$N$ set, its weight and its context vector
# :label: ch2-def-topn
#
# For $1\le N\le L-1$ the **top-$N$ set** $I_N\subset\{1,\dots,L\}$ holds the indices of the $N$
# largest weights (ties go to the earlier key); $U_N=\{1,\dots,L\}\setminus I_N$ is the set of the
# $L-N$ non-selected keys. The **weight of the top-$N$ set** and the **context vector** are
#
# $$
# \bar\alpha_N=\sum_{j\in I_N}\alpha_j, \qquad s=\sum_{j\in I_N}\alpha_j x_j ,
# $$
#
# so that $1-\bar\alpha_N$ is the weight left to the other $L-N$ tokens. We also write
# $d_1=\max_{i\in U_N,\,j\in I_N}\|x_i-x_j\|_2$ for the largest distance between a non-selected and
# a selected vector.
# ```
#
# The paper's cumulative distance (its Eq. (7)) compares $s$ with the non-selected tokens, each
# rescaled by its weight. Its display is lost; the prose says "the cumulative distance between this
# context vector and all non-selected embeddings". Three readings are on the table.
#
# ```{prf:definition} Cumulative distance $\tilde d$ (our reading of Eq. (7))
# :label: ch2-def-distance
#
# $$
# \tilde d \;=\; \sum_{i\in U_N}\big\|\alpha_i x_i - s\big\|_2
# \qquad\text{(sum of norms; our default).}
# $$
#
# The alternative reading measured by `distance_reading="norm_of_sum"` is
# $\tilde d_{\Sigma}=\big\|\sum_{i\in U_N}(\alpha_i x_i - s)\big\|_2\le\tilde d$.
# ```
#
# A third form, $\big\|\sum_{i\in U_N}\alpha_i x_i - s\big\|_2$, is how an AI-written review of the
# paper renders the formula (NOTES §2). We do not use it, for two reasons that come from the paper
# itself. Corollary 2 (ii) says the distance vanishes as $N\to L$ "since the number of outer elements
# goes to zero": with $U_N=\varnothing$ both of our readings are empty sums, but the third form equals
# $\|s\|=\|\sum_i\alpha_i x_i\|$, the head's output, which is not zero. And Figure 2 (a) shows the
# distance growing linearly in $L$, whereas the third form never exceeds
# $\sum_{i\in U_N}\alpha_i\|x_i\|+\sum_{j\in I_N}\alpha_j\|x_j\|\le\max_i\|x_i\|$ for any $L$.
# Between our two readings, the sum of norms is the one that fits Corollary 2 (i) ("dominated by the
# individual contributions $\|\alpha_i x_i\|$") and the $j\neq i$ of Theorem 1's random part, so it is
# our default; every synthetic check below is run for both, and the model experiment can be re-run
# with either.

# %% [markdown]
# ## Theorem 1 for a fixed top-$N$ set
#
# The first term of the bound, $(1-\bar\alpha_N)\,d_1$, and the beginning of the second,
# $\max_{j\in I_N}\|x_j\|_2\,\sqrt{\bar\alpha_N(L-N)-(1-\bar\alpha\ldots}$, survive in a secondary
# source (NOTES §2, Theorem 1 (1)); the rest of the formula is cut off. The statement below completes
# it with the same factor $\bar\alpha_N(L-N)-(1-\bar\alpha_N)$ **without a square root**; the
# completion, the hypothesis that makes it true, and the proof are ours.
#
# ```{prf:theorem} Theorem 1, fixed top-$N$ set (our completion of a truncated formula)
# :label: ch2-thm1-fixed
#
# Let $\alpha_1,\dots,\alpha_L\ge0$ with $\sum_i\alpha_i=1$, let $I\subset\{1,\dots,L\}$ have $N$
# elements, $1\le N\le L-1$, $U$ its complement, and suppose $\bar\alpha_N=\sum_{j\in I}\alpha_j\ge\alpha_i$
# for every $i\in U$ (true for the top-$N$ set). Then both readings of the cumulative distance satisfy
#
# $$
# \tilde d_\Sigma\;\le\;\tilde d\;\le\;(1-\bar\alpha_N)\,d_1\;+\;\max_{j\in I}\|x_j\|_2\,
# \big(\bar\alpha_N(L-N)-(1-\bar\alpha_N)\big),
# $$
#
# and the last factor equals $\sum_{i\in U}(\bar\alpha_N-\alpha_i)\ge0$.
# ```
#
# ```{prf:proof}
# For the top-$N$ set the hypothesis holds because $\bar\alpha_N$ is at least the largest selected
# weight, which is at least every non-selected one. In particular $\bar\alpha_N>0$, so
# $\tilde x=s/\bar\alpha_N=\sum_{j\in I}(\alpha_j/\bar\alpha_N)\,x_j$ is a convex combination of the
# selected vectors. For $i\in U$ split the difference as
#
# $$
# \alpha_i x_i - s \;=\; \alpha_i\,(x_i-\tilde x)\;-\;(\bar\alpha_N-\alpha_i)\,\tilde x .
# $$
#
# The norm is convex, so $\|x_i-\tilde x\|\le\sum_{j\in I}(\alpha_j/\bar\alpha_N)\|x_i-x_j\|\le d_1$
# and $\|\tilde x\|\le\max_{j\in I}\|x_j\|$. With the triangle inequality and $\bar\alpha_N-\alpha_i\ge0$,
#
# $$
# \|\alpha_i x_i - s\|\;\le\;\alpha_i\,d_1+(\bar\alpha_N-\alpha_i)\max_{j\in I}\|x_j\| .
# $$
#
# Summing over the $L-N$ indices of $U$, where $\sum_{i\in U}\alpha_i=1-\bar\alpha_N$ and
# $\sum_{i\in U}(\bar\alpha_N-\alpha_i)=\bar\alpha_N(L-N)-(1-\bar\alpha_N)$, gives the bound for
# $\tilde d$. The triangle inequality gives $\tilde d_\Sigma\le\tilde d$.
# ```
#
# Two remarks delimit the statement. The hypothesis $\bar\alpha_N\ge\alpha_i$ cannot be dropped, and
# the bound cannot be improved in general: it is attained (so a square root over the last factor, which
# the truncated source might suggest, would make it false). Both are checked numerically below; the
# second is {ref}`ch2-ex1`.

# %% [markdown]
# ## Theorem 1 for a random $N$-set
#
# In the second setting the selected set is not the top $N$ but a uniformly random $N$-subset
# $I\sim\mathcal U$, and the target is $\mathbb E_I[\tilde d]$ (the paper's Eq. (8)). The paper's
# prose says that each token is excluded with probability $(L-N)/L$, that replacing the random
# indicators by their expectations gives a "main sum", and that a residual $\varepsilon$ collects the
# Jensen gap; its display (which contains a $j\neq i$) is lost. The formula below, its constants and
# the proof are our reconstruction (NOTES §2, Theorem 1 (2)).
#
# ```{prf:theorem} Theorem 1, uniformly random $N$-set (our reconstruction)
# :label: ch2-thm1-random
#
# Let $\alpha_i\ge0$, $x_i\in\mathbb R^d$, $1\le N\le L-1$, let $I$ be uniform over the $N$-subsets of
# $\{1,\dots,L\}$, $s_I=\sum_{j\in I}\alpha_j x_j$ and $\tilde d(I)=\sum_{i\notin I}\|\alpha_i x_i-s_I\|$.
# Then
#
# $$
# \mathbb E_I\big[\tilde d(I)\big]\;=\;\mathcal E+\varepsilon,\qquad
# \mathcal E=\frac{L-N}{L}\sum_{i=1}^{L}\Big\|\alpha_i x_i-\frac{N}{L-1}\sum_{j\neq i}\alpha_j x_j\Big\|_2,
# \qquad \varepsilon\ge0,
# $$
#
# and $\varepsilon=0$ when $N=L-1$.
# ```
#
# ```{prf:proof}
# Write the distance with indicators, $\tilde d(I)=\sum_{i=1}^{L}\mathbf 1\{i\notin I\}\,\|\alpha_i x_i-s_I\|$,
# and take expectations term by term:
# $\mathbb E[\tilde d(I)]=\sum_i\Pr(i\notin I)\,\mathbb E\big[\|\alpha_i x_i-s_I\|\,\big|\,i\notin I\big]$.
# A fixed key is left out by $\binom{L-1}{N}$ of the $\binom{L}{N}$ subsets, so
# $\Pr(i\notin I)=(L-N)/L$. Conditionally on $i\notin I$, the set $I$ is uniform over the $N$-subsets
# of the other $L-1$ keys, each of which belongs to it with probability $N/(L-1)$; hence
# $\mathbb E[s_I\mid i\notin I]=\frac{N}{L-1}\sum_{j\neq i}\alpha_j x_j$. The norm is convex, so Jensen's
# inequality gives
# $\mathbb E[\|\alpha_i x_i-s_I\|\mid i\notin I]\ge\|\alpha_i x_i-\mathbb E[s_I\mid i\notin I]\|$.
# Summing over $i$ gives $\mathbb E[\tilde d(I)]\ge\mathcal E$, i.e. $\varepsilon\ge0$. When
# $N=L-1$, the condition $i\notin I$ determines $I$, the conditional law is a point mass and Jensen's
# inequality is an equality for every $i$.
# ```
#
# The paper adds that $\varepsilon$ "is small whenever the individual weights are not too
# concentrated", and the algorithms of its Figure 2 plot $\mathcal E$ as "the expectation". Nothing in
# the proof needs the weights to sum to one, and for the norm-of-sum reading $\mathcal E$ is not a
# lower bound. How large $\varepsilon$ is, and whether it shrinks steadily as $N\to L$, is measured
# below.
#
# ## Corollary 2: the two regimes
#
# The paper states two limits in words: for fixed $N\ll L$ the expected distance "is dominated by the
# individual contributions $\|\alpha_i x_i\|_2$", and for $N\to L$ it tends to zero "since the number
# of outer elements goes to zero" (NOTES §2). We make both quantitative for the main sum.
#
# ```{prf:corollary} Corollary 2, quantitative form (our reconstruction)
# :label: ch2-cor2
#
# In the setting of {prf:ref}`Theorem 1 (random set) <ch2-thm1-random>` let $A=\sum_i\|\alpha_i x_i\|$, $m=\sum_i\alpha_i x_i$
# and $c=N/(L-1)$. Then
#
# 1. (few selected tokens) $\displaystyle|\mathcal E-A|\;\le\;\frac NL\,A+\frac{L-N}{L}\,c\sum_i\|m-\alpha_i x_i\|
#    \;\le\;\frac{N}{L-1}\,\big(2A+L\|m\|\big)$;
# 2. (almost all selected) $\displaystyle\mathcal E\;\le\;\frac{L-N}{L}\big((1+c)A+cL\|m\|\big)\;\le\;(L-N)\Big(\frac{2A}{L}+\|m\|\Big)$.
#
# In particular $\mathcal E\le 2A+N\|m\|\le(2+N)\max_i\|x_i\|$ for every $L$.
# ```
#
# ```{prf:proof}
# Put $a_i=\alpha_i x_i$. Since $\sum_{j\ne i}a_j=m-a_i$, the $i$-th term of $\mathcal E$ is
# $t_i=\|a_i-c(m-a_i)\|$, and the triangle inequality gives $|t_i-\|a_i\||\le c\|m-a_i\|$ and
# $t_i\le(1+c)\|a_i\|+c\|m\|$. For (1), $\mathcal E-A=\frac{L-N}{L}\sum_i(t_i-\|a_i\|)-\frac NL A$;
# bound the two parts, then use $\sum_i\|m-a_i\|\le L\|m\|+A$, $N/L\le c$ and $(L-N)/L\le1$.
# For (2), sum the second inequality and multiply by $(L-N)/L$; then $(1+c)\le2$ and
# $\frac{L-N}{L}cL=\frac{(L-N)N}{L-1}\le\min\{N,\,L-N\}$ give both forms and the final remark, with
# $A\le\max_i\|x_i\|$ and $\|m\|\le\max_i\|x_i\|$.
# ```
#
# So the first limit, $\mathcal E\to A$, needs $N\|m\|\to0$ as well as $N/L\to0$: with uniform weights
# and all $x_i$ equal to one unit vector, $\mathcal E=0$ for $N=1$ at every $L$ while $A=1$. The
# second limit is a linear decay in the number $L-N$ of non-selected keys, reached at $N=L$; at
# $N=L-1$ the main sum need not be small. The last line of the corollary matters for Figure 2: at
# fixed $N$ **the main sum is bounded independently of $L$**, so it cannot grow linearly with the
# context.

# %% [markdown]
# ## Synthetic verification
#
# All synthetic checks run in float64 from the seeded generator. Instances come in six families, for
# lengths $L$ from {glue:text}`s_len_min` to {glue:text}`s_len_max` and several $N$ per length (including
# $N=1$ and $N=L-1$), in dimension $d=${glue:text}`s_dim`:
#
# * **generic**: logits $\sigma z$ with $z$ standard normal and $\sigma$ uniform on $[0,\sigma_{\max}]$,
#   $\sigma_{\max}=${glue:text}`s_logit_scale`; vectors
#   Gaussian with a random scale and a random common offset;
# * **tied weights**: all weights equal (the top-$N$ set is decided by the tie rule);
# * **one dominant weight**: one logit raised by {glue:text}`s_hot`, so that one weight is practically 1;
# * **L = N + 1**: a single non-selected key;
# * **equal vectors**: all $x_i$ equal, so $d_1=0$;
# * **antipodal (extremal)**: after the top-$N$ set is chosen, its vectors are set to a unit vector $e$
#   and all others to $-e$.

# %%
FAMILIES = ("generic", "tied weights", "one dominant weight", "L = N + 1", "equal vectors",
            "antipodal (extremal)")
LENGTHS_SYN = (2, 3, 5, 8, 16, 33, 64, 128)
D_SYN = 8
LOGIT_SCALE = 5.0  # generic logits: sigma * z with sigma uniform on [0, LOGIT_SCALE]
HOT = 30.0  # the logit boost of the dominant key
glue("s_len_min", min(LENGTHS_SYN), display=False)
glue("s_len_max", max(LENGTHS_SYN), display=False)
glue("s_dim", D_SYN, display=False)
glue("s_logit_scale", f"{LOGIT_SCALE:g}", display=False)
glue("s_hot", f"{HOT:g}", display=False)


def rand(*shape):
    return torch.randn(*shape, generator=gen, dtype=F64)


def top_sizes(family, length):
    if family == "L = N + 1":
        return [length - 1]
    return sorted({n for n in (1, length // 4, length // 2, length - 1) if 1 <= n <= length - 1})


def make_batch(family, length, n_top, batch, logit_scale=LOGIT_SCALE):
    """A batch of rows: weights (batch, 1, L), vectors (batch, L, d) and the top-N mask (batch, 1, L)."""
    logits = rand(batch, 1, length) * logit_scale * torch.rand(batch, 1, 1, generator=gen, dtype=F64)
    if family == "tied weights":
        logits = torch.zeros(batch, 1, length, dtype=F64)
    if family == "one dominant weight":
        hot = torch.randint(length, (batch,), generator=gen)
        logits[torch.arange(batch), 0, hot] += HOT
    w = torch.softmax(logits, -1)
    x = rand(batch, length, D_SYN) * torch.exp(rand(batch, 1, 1)) + 2 * rand(batch, 1, D_SYN) * torch.rand(
        batch, 1, 1, generator=gen, dtype=F64)
    if family == "equal vectors":
        x = rand(batch, 1, D_SYN).expand(batch, length, D_SYN).clone()
    selected = metrics.top_n_mask(w, n_top)[0]
    if family == "antipodal (extremal)":
        e = torch.zeros(D_SYN, dtype=F64)
        e[0] = 1.0
        x = torch.where(selected[:, 0, :, None], e, -e)
    return w, x, selected


configs = [(f, n, k) for f in FAMILIES for n in LENGTHS_SYN for k in top_sizes(f, n)]
per_config = math.ceil(n_trials / len(configs))
frames = []
for family, length, n_top in configs:
    w, x, sel = make_batch(family, length, n_top, per_config)
    bound = theory.theorem1_fixed_bound(w, x, sel)[:, 0]
    abar = (w * sel).sum(-1)[:, 0]
    factor = abar * (length - n_top) - (1 - abar)
    largest = torch.where(sel[:, 0], x.norm(dim=-1), 0.0).amax(-1)
    frames.append(pd.DataFrame({
        "family": family, "L": length, "N": n_top, "bound": bound.numpy(),
        "sqrt_bound": (bound - largest * factor + largest * factor.clamp_min(0).sqrt()).numpy(),
        "sum_of_norms": metrics.cumulative_distance(w, x, sel)[:, 0].numpy(),
        "norm_of_sum": metrics.cumulative_distance(w, x, sel, reading="norm_of_sum")[:, 0].numpy()}))
fixed = pd.concat(frames, ignore_index=True)
TOL = 1e-9
slack = TOL * (1 + fixed["bound"].abs())
for reading in ("sum_of_norms", "norm_of_sum"):
    fixed[f"violates ({reading})"] = fixed[reading] > fixed["bound"] + slack
    fixed[f"ratio ({reading})"] = np.where(fixed["bound"] > 0, fixed[reading] / fixed["bound"].where(fixed["bound"] > 0, 1.0), 0.0)
fixed["violates sqrt form"] = fixed["sum_of_norms"] > fixed["sqrt_bound"] + slack
fixed_summary = fixed.groupby("family", sort=False).agg(
    instances=("bound", "size"),
    **{"violations, sum of norms": ("violates (sum_of_norms)", "sum"),
       "violations, norm of sum": ("violates (norm_of_sum)", "sum"),
       "largest ratio d~/bound": ("ratio (sum_of_norms)", "max"),
       "median ratio d~/bound": ("ratio (sum_of_norms)", "median"),
       "violations of the sqrt form": ("violates sqrt form", "sum")})
fixed_summary

# %%
n_fixed = len(fixed)
viol_son = int(fixed["violates (sum_of_norms)"].sum())
viol_nos = int(fixed["violates (norm_of_sum)"].sum())
not_extremal = fixed["family"] != "antipodal (extremal)"
tight_generic = float(fixed.loc[fixed["family"] == "generic", "ratio (sum_of_norms)"].max())
tight_extremal = float(fixed.loc[~not_extremal, "ratio (sum_of_norms)"].min())
tight_equal = float(fixed.loc[fixed["family"] == "equal vectors", "ratio (sum_of_norms)"].median())
sqrt_viol = int(fixed["violates sqrt form"].sum())
sqrt_viol_extremal = int(fixed.loc[~not_extremal, "violates sqrt form"].sum())
glue("s_fixed_n", f"{n_fixed:,}", display=False)
glue("s_fixed_viol_son", viol_son, display=False)
glue("s_fixed_viol_nos", viol_nos, display=False)
glue("s_fixed_tight_generic", f"{tight_generic:.4f}", display=False)
glue("s_fixed_tight_extremal", f"{tight_extremal:.12f}", display=False)
glue("s_fixed_tight_equal", f"{tight_equal:.12f}", display=False)
glue("s_fixed_sqrt_viol", f"{sqrt_viol:,}", display=False)
glue("s_fixed_sqrt_viol_extremal", f"{sqrt_viol_extremal:,}", display=False)
glue("s_fixed_sqrt_extremal_n", f"{int((~not_extremal).sum()):,}", display=False)
glue("s_tol", f"{TOL:g}", display=False)

# The hypothesis abar >= alpha_i cannot be dropped: L = 2, N = 1, alpha = (0.1, 0.9), I = {0}, x_0 = x_1 = e.
w_bad = torch.tensor([[0.1, 0.9]], dtype=F64)
x_bad = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=F64)
sel_bad = torch.tensor([[True, False]])
d_bad = float(metrics.cumulative_distance(w_bad, x_bad, sel_bad)[0])
abar_bad = 0.1
formula_bad = (1 - abar_bad) * 0.0 + 1.0 * (abar_bad * 1 - (1 - abar_bad))
try:
    theory.theorem1_fixed_bound(w_bad, x_bad, sel_bad)
    refused = False
except ValueError:
    refused = True
assert refused and d_bad > formula_bad
glue("s_bad_d", f"{d_bad:.1f}", display=False)
glue("s_bad_bound", f"{formula_bad:.1f}", display=False)

# %% tags=["hide-input"]
long = fixed.melt(id_vars=["family"], value_vars=["ratio (sum_of_norms)", "ratio (norm_of_sum)"],
                  var_name="reading", value_name="ratio")
long["reading"] = long["reading"].str.extract(r"\((.*)\)")[0].str.replace("_", " ")
fig, ax = plt.subplots(figsize=(8.5, 3.6))
sns.boxplot(data=long, y="family", x="ratio", hue="reading", ax=ax, palette=figures.PALETTE, fliersize=1.5,
            order=list(FAMILIES))
ax.axvline(1.0, color="black", ls="--", lw=1)
ax.set(xlabel=r"$\tilde d\,/\,$bound of Theorem 1 (fixed set)", ylabel="")
figures.model_title(fig, f"Theorem 1 (fixed top-N set) on {n_fixed:,} random instances", "synthetic data, no model")
plt.show()

# %% [markdown]
# Over {glue:text}`s_fixed_n` instances the bound of {prf:ref}`Theorem 1 (fixed set) <ch2-thm1-fixed>` is violated
# {glue:text}`s_fixed_viol_son` times for the sum of norms and {glue:text}`s_fixed_viol_nos` times for
# the norm of sum (a violation means exceeding the bound by more than a relative
# {glue:text}`s_tol`). It is far from slack: in the generic family the largest ratio
# $\tilde d/\text{bound}$ is {glue:text}`s_fixed_tight_generic`, and in the antipodal family every
# instance attains the bound, with a smallest ratio of {glue:text}`s_fixed_tight_extremal`
# ({ref}`ch2-ex1` proves the equality). So does the family of equal vectors (median ratio
# {glue:text}`s_fixed_tight_equal`), for a simpler reason: there $d_1=0$ and
# $\|\alpha_i x_i-s\|=(\bar\alpha_N-\alpha_i)\|x_i\|$ for every non-selected $i$. For the same reason a square root over the last factor fails:
# the form $(1-\bar\alpha_N)d_1+\max_j\|x_j\|\sqrt{\bar\alpha_N(L-N)-(1-\bar\alpha_N)}$ is violated in
# {glue:text}`s_fixed_sqrt_viol` instances, {glue:text}`s_fixed_sqrt_viol_extremal` of them among the
# {glue:text}`s_fixed_sqrt_extremal_n` antipodal ones. Whatever the paper's second term is, it is not
# this completion with a root. Finally, the hypothesis matters: with $L=2$, weights $(0.1,0.9)$, the
# *lighter* key declared selected and $x_1=x_2$, the distance is {glue:text}`s_bad_d` while the
# formula gives {glue:text}`s_bad_bound` (and `theory.theorem1_fixed_bound` refuses such a set).

# %% [markdown]
# ### The random-set expectation and its Jensen residual
#
# For short rows the expectation over all $\binom LN$ subsets is computed exactly by enumeration
# (`theory.theorem1_random_expectation_exact`, which forms every difference directly and so is an
# independent reference); for $N=1$ and $N=L-1$ it has closed forms at any length,
# $\mathbb E[\tilde d]=\frac1L\sum_k\sum_{i\ne k}\|a_i-a_k\|$ and $\frac1L\sum_k\|2a_k-m\|$ with
# $a_i=\alpha_i x_i$. For longer rows and intermediate $N$ we use the Monte-Carlo estimate
# `metrics.expected_distance_mc` in {glue:text}`s_reps` independent batches, which also gives a
# standard error.

# %%
EXACT_LENGTHS = (4, 7, 10)
EXACT_FAMILIES = ("generic", "tied weights", "one dominant weight")
per_family = max(4, n_trials // 250)
exact_rows = []
for length in EXACT_LENGTHS:
    for family in EXACT_FAMILIES:
        w, x, _ = make_batch(family, length, 1, per_family)
        for n_top in range(1, length):
            main = theory.theorem1_random_main_sum(w, x, n_top)[:, 0]
            for b in range(per_family):
                exact = float(theory.theorem1_random_expectation_exact(w[b, 0], x[b], n_top))
                exact_rows.append({"family": family, "L": length, "N": n_top, "instance": b,
                                   "main sum": float(main[b]), "exact": exact})
exact = pd.DataFrame(exact_rows)
exact["residual"] = exact["exact"] - exact["main sum"]
exact["relative residual"] = exact["residual"] / exact["exact"].where(exact["exact"] > 0)
exact["N / L"] = exact["N"] / exact["L"]


def closed_form_expectations(w, x):
    """Exact E[d~] for N = 1 and N = L - 1 (rows of w: (B, 1, L), x: (B, L, d))."""
    a = w[:, 0, :, None] * x
    m = a.sum(1, keepdim=True)
    n1 = torch.cdist(a, a).sum(-1).mean(-1)
    last = (2 * a - m).norm(dim=-1).mean(-1)
    return n1, last


CLOSED_LENGTHS = MC_LENGTHS = (64, 256)
closed_rows = []
for length in CLOSED_LENGTHS:
    for family in EXACT_FAMILIES:
        w, x, _ = make_batch(family, length, 1, 16)
        n1, last = closed_form_expectations(w, x)
        for n_top, ref in ((1, n1), (length - 1, last)):
            main = theory.theorem1_random_main_sum(w, x, n_top)[:, 0]
            closed_rows.append(pd.DataFrame({"family": family, "L": length, "N": n_top,
                                             "main sum": main.numpy(), "exact": ref.numpy()}))
closed = pd.concat(closed_rows, ignore_index=True)

REPS = 8  # independent Monte-Carlo batches, for a standard error
Z_MAX = 4  # a main sum more than Z_MAX standard errors above the estimate counts as a violation
mc_rows = []
for length in MC_LENGTHS:
    w, x, _ = make_batch("generic", length, 1, 16, logit_scale=1.0)
    for n_top in sorted({1, 5, length // 4, length - 1}):
        main = theory.theorem1_random_main_sum(w, x, n_top)[:, 0]
        reps = torch.stack([metrics.expected_distance_mc(w, x, n_top, n_samples=max(1, n_samples // REPS),
                                                          generator=gen)[:, 0] for _ in range(REPS)])
        mc_rows.append(pd.DataFrame({"L": length, "N": n_top, "main sum": main.numpy(),
                                     "Monte Carlo": reps.mean(0).numpy(),
                                     "standard error": (reps.std(0) / math.sqrt(REPS)).numpy()}))
mc = pd.concat(mc_rows, ignore_index=True)
mc["z"] = (mc["main sum"] - mc["Monte Carlo"]) / mc["standard error"].where(mc["standard error"] > 0)
mc.groupby(["L", "N"]).agg(**{"main sum (mean)": ("main sum", "mean"), "Monte Carlo (mean)": ("Monte Carlo", "mean"),
                              "largest z": ("z", "max")})

# %%
exact_viol = int((exact["main sum"] > exact["exact"] + TOL * (1 + exact["exact"])).sum())
closed_viol = int((closed["main sum"] > closed["exact"] + TOL * (1 + closed["exact"])).sum())
mc_viol = int((mc["z"] > Z_MAX).sum())
last_N = exact[exact["N"] == exact["L"] - 1]
per_instance = exact.sort_values("N").groupby(["family", "L", "instance"])["residual"]
monotone = per_instance.apply(lambda r: bool((np.diff(r.to_numpy()) <= TOL).all()))
peak_at = exact.loc[per_instance.idxmax(), "N"].to_numpy()
rel_by_family = exact[exact["N"] < exact["L"] - 1].groupby("family")["relative residual"].mean()
glue("s_exact_n", f"{len(exact):,}", display=False)
glue("s_exact_lengths", ", ".join(map(str, EXACT_LENGTHS)), display=False)
glue("s_closed_lengths", " and ".join(map(str, CLOSED_LENGTHS)), display=False)
glue("s_reps", REPS, display=False)
glue("s_zmax_rule", Z_MAX, display=False)
glue("s_exact_viol", exact_viol, display=False)
glue("s_closed_n", f"{len(closed):,}", display=False)
glue("s_closed_viol", closed_viol, display=False)
glue("s_mc_n", f"{len(mc):,}", display=False)
glue("s_mc_viol", mc_viol, display=False)
glue("s_mc_zmax", f"{float(mc['z'].max()):.1f}", display=False)
glue("s_jensen_last", f"{float(last_N['residual'].abs().max()):.1e}", display=False)
glue("s_jensen_monotone", f"{100 * monotone.mean():.0f} %", display=False)
glue("s_jensen_peak_not_1", f"{100 * float((peak_at > 1).mean()):.0f} %", display=False)
glue("s_jensen_max_rel", f"{float(exact['relative residual'].max()):.2f}", display=False)
for family, key in zip(EXACT_FAMILIES, ("generic", "tied", "dominant")):
    glue(f"s_jensen_rel_{key}", f"{rel_by_family[family]:.3f}", display=False)
concentration_helps = rel_by_family["one dominant weight"] < rel_by_family["tied weights"]
glue("s_jensen_reading", "the opposite of what the remark suggests" if concentration_helps
     else "in line with the remark", display=False)

# %% [markdown]
# The main sum never exceeds the exact expectation: {glue:text}`s_exact_viol` violations in
# {glue:text}`s_exact_n` enumerated cases (lengths {glue:text}`s_exact_lengths`, every $N$) and
# {glue:text}`s_closed_viol` in {glue:text}`s_closed_n` closed-form cases at lengths
# {glue:text}`s_closed_lengths`. Against the Monte-Carlo estimate, the main sum lies more than
# {glue:text}`s_zmax_rule` standard errors above it in {glue:text}`s_mc_viol` of {glue:text}`s_mc_n`
# rows (the largest $z=(\mathcal E-\text{estimate})/\text{s.e.}$ is {glue:text}`s_mc_zmax`; at
# $N=L-1$, where $\varepsilon=0$, $z$ is pure sampling noise). We use moderately concentrated
# weights (standard normal logits) for the Monte-Carlo check on purpose: with one dominant weight the
# expectation is driven by the rare draws that pick the dominant key, and a moderate number of draws
# misses them, which the exact closed forms above handle instead.
#
# What happens to the residual as $N\to L$? At $N=L-1$ it vanishes (largest $|\varepsilon|$:
# {glue:text}`s_jensen_last`, rounding). On the way it does **not** shrink steadily in every
# instance: it is non-increasing in $N$ for only {glue:text}`s_jensen_monotone` of the enumerated
# instances, and its maximum sits at some $N>1$ in {glue:text}`s_jensen_peak_not_1` of them. Relative to
# the expectation it reaches {glue:text}`s_jensen_max_rel`. The paper remarks that $\varepsilon$ is
# small when the weights are not too concentrated. The mean relative residual (over $N<L-1$) is
# {glue:text}`s_jensen_rel_tied` for tied weights, {glue:text}`s_jensen_rel_generic` for generic ones
# and {glue:text}`s_jensen_rel_dominant` with one dominant weight: {glue:text}`s_jensen_reading`.
# There is a simple reason why concentration makes Jensen's inequality tight: with one weight near 1,
# the random context vector $s_I$ is close either to $0$ or to that key's $x_h$, two points on one ray
# from the origin, and the norm is linear along a ray.

# %%
# Corollary 2 on synthetic rows: (i) N = 5 and growing L, for centred vectors and for vectors with a
# common offset; (ii) L = 64 and N = 1..63.
cor_rows = []
COR_LENGTHS = (8, 64, 512, 4096, 32768)
COR_ROWS, COR_L2, COR_N = 32, 64, 5
glue("s_cor_N", COR_N, display=False)
for length in COR_LENGTHS:
    w = torch.softmax(rand(COR_ROWS, 1, length), -1)
    for kind, offset_scale in (("centred vectors", 0.0), ("vectors with a common offset", 3.0)):
        x = rand(COR_ROWS, length, D_SYN) + offset_scale * torch.eye(D_SYN, dtype=F64)[0]
        n_top = min(COR_N, length - 1)
        main = theory.theorem1_random_main_sum(w, x, n_top)[:, 0]
        A = theory.corollary2_small_n_limit(w, x)[:, 0]
        cert = theory.corollary2_bounds(w, x, n_top)
        cor_rows.append(pd.DataFrame({"L": length, "vectors": kind, "E / A": (main / A).numpy(),
                                      "gap holds": ((main - A).abs() <= cert.small_n_gap[:, 0] * (1 + TOL) + TOL).numpy()}))
cor_i = pd.concat(cor_rows, ignore_index=True)
w64 = torch.softmax(2 * rand(COR_ROWS, 1, COR_L2), -1)
x64 = rand(COR_ROWS, COR_L2, D_SYN) + 1.0 * torch.eye(D_SYN, dtype=F64)[0]
cor_ii = []
for n_top in range(1, COR_L2):
    main = theory.theorem1_random_main_sum(w64, x64, n_top)[:, 0]
    cap = theory.corollary2_bounds(w64, x64, n_top).large_n_cap[:, 0]
    cor_ii.append(pd.DataFrame({"N": n_top, "main sum": main.numpy(), "cap": cap.numpy(),
                                "cap holds": (main <= cap * (1 + TOL) + TOL).numpy()}))
cor_ii = pd.concat(cor_ii, ignore_index=True)
cor_ok = bool(cor_i["gap holds"].all() and cor_ii["cap holds"].all())
ratio_i = cor_i.groupby(["vectors", "L"])["E / A"].mean()
glue("s_cor_n", f"{len(cor_i) + len(cor_ii):,}", display=False)
glue("s_cor_fail", int((~cor_i["gap holds"]).sum() + (~cor_ii["cap holds"]).sum()), display=False)
glue("s_cor_centred_first", f"{ratio_i[('centred vectors', 8)]:.2f}", display=False)
glue("s_cor_centred_last", f"{ratio_i[('centred vectors', COR_LENGTHS[-1])]:.3f}", display=False)
glue("s_cor_offset_last", f"{ratio_i[('vectors with a common offset', COR_LENGTHS[-1])]:.2f}", display=False)
glue("s_cor_L_first", COR_LENGTHS[0], display=False)
glue("s_cor_L_last", f"{COR_LENGTHS[-1]:,}", display=False)
e_by_n = cor_ii.groupby("N")["main sum"].mean()
glue("s_cor_e_last", f"{e_by_n[COR_L2 - 1]:.3f}", display=False)
glue("s_cor_rows", COR_ROWS, display=False)
glue("s_cor_L2", COR_L2, display=False)
glue("s_cor_e_peak", f"{e_by_n.max():.2f}", display=False)
glue("s_cor_e_peak_N", int(e_by_n.idxmax()), display=False)

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
rel = exact.dropna(subset=["relative residual"]).copy()
rel["L"] = rel["L"].astype(str)
sns.lineplot(data=rel, x="N / L", y="relative residual", hue="L", style="family", markers=True, errorbar=None,
             ax=axes[0], palette=figures.PALETTE)
axes[0].set(title=r"Jensen residual $\varepsilon\,/\,\mathbb{E}[\tilde d]$ (exact)", xlabel="$N/L$")
axes[0].legend(fontsize="x-small")
sns.lineplot(data=cor_i, x="L", y="E / A", hue="vectors", marker="o", ax=axes[1], palette=figures.PALETTE,
             errorbar=("pi", 80))
axes[1].axhline(1.0, color="black", ls="--", lw=1)
axes[1].set(xscale="log", yscale="log", title=rf"Cor. 2 (i): $\mathcal{{E}}/A$ at $N={COR_N}$", xlabel="$L$")
axes[1].legend(fontsize="x-small")
cii = cor_ii.melt(id_vars="N", value_vars=["main sum", "cap"], var_name="quantity")
sns.lineplot(data=cii, x="N", y="value", hue="quantity", ax=axes[2], palette=figures.PALETTE, errorbar=None)
axes[2].set(yscale="log", title=rf"Cor. 2 (ii): $\mathcal{{E}}$ and its cap, $L={COR_L2}$", xlabel="$N$", ylabel="mean over rows")
figures.model_title(fig, "Theorem 1 (random set) and Corollary 2 on random rows", "synthetic data, no model")
plt.show()

# %% [markdown]
# Left: the relative Jensen residual, mean over instances, against $N/L$ for each exact length and
# family. Middle: the ratio of the main sum to $A=\sum_i\|\alpha_i x_i\|$ at $N=${glue:text}`s_cor_N` (line: mean; band:
# 10–90 % of {glue:text}`s_cor_rows` rows; weights are the softmax of standard normal logits). Right:
# the main sum and the certificate of Corollary 2 (ii) at $L=${glue:text}`s_cor_L2` (mean over rows;
# logits twice as spread, vectors with a common offset).
#
# The certificates of {prf:ref}`Corollary 2 <ch2-cor2>` hold in all {glue:text}`s_cor_n` cases
# ({glue:text}`s_cor_fail` failures). The first limit behaves as the corollary says and not as the
# words "dominated by the individual contributions" suggest in general: for centred vectors
# $\mathcal E/A$ goes from {glue:text}`s_cor_centred_first` at $L=${glue:text}`s_cor_L_first` to
# {glue:text}`s_cor_centred_last` at $L=${glue:text}`s_cor_L_last`, slowly, because $\|m\|$ shrinks
# only like $1/\sqrt L$; when the vectors share an offset, so that $\|m\|$ does not vanish, it stays
# at {glue:text}`s_cor_offset_last`. In the second regime the main
# sum first grows with $N$ (to {glue:text}`s_cor_e_peak` at $N=${glue:text}`s_cor_e_peak_N`) and
# then falls, and at $N=L-1$ it is still {glue:text}`s_cor_e_last`, not zero.

# %%
_ = record(Claim(key="ch2-thm1-fixed-synthetic", chapter=CHAPTER,
             claim="Theorem 1 (fixed top-N set): d~ <= (1 - abar_N) d_1 + max_j ||x_j|| (abar_N (L - N) - (1 - abar_N))",
             paper="first term (1 - abar_N) d_1 recovered; second term truncated (our completion, no square root)",
             ours=f"{viol_son} violations (sum of norms), {viol_nos} (norm of sum) in {n_fixed} instances; "
                  f"attained in the antipodal family; the square-root completion fails in {sqrt_viol} instances",
             verdict="holds" if viol_son == 0 and viol_nos == 0 else "fails", model="synthetic"))
_ = record(Claim(key="ch2-thm1-random-synthetic", chapter=CHAPTER,
             claim="Theorem 1 (random N-set): E[d~] = main sum + eps with eps >= 0",
             paper="main sum with constants lost; eps = Jensen gap (our reconstruction)",
             ours=f"main sum > exact expectation in {exact_viol} of {len(exact)} enumerated and {closed_viol} of "
                  f"{len(closed)} closed-form cases; > Monte Carlo + {Z_MAX} SE in {mc_viol} of {len(mc)} rows; "
                  f"eps non-increasing in N for {100 * monotone.mean():.0f} % of instances",
             verdict="holds" if exact_viol == 0 and closed_viol == 0 and mc_viol == 0 else "fails", model="synthetic"))
_ = record(Claim(key="ch2-cor2-synthetic", chapter=CHAPTER,
             claim="Corollary 2: E -> sum ||alpha_i x_i|| for N << L; E -> 0 as N -> L (quantitative form, ours)",
             paper="two limits stated in words",
             ours=f"certificates hold in all {len(cor_i) + len(cor_ii)} cases; at L = {COR_LENGTHS[-1]}, N = {COR_N}: E/A = "
                  f"{ratio_i[('centred vectors', COR_LENGTHS[-1])]:.3f} for centred vectors but "
                  f"{ratio_i[('vectors with a common offset', COR_LENGTHS[-1])]:.2f} with a common offset",
             verdict="holds" if cor_ok else "fails", model="synthetic"))

# %% [markdown]
# ## The experiment on the pretrained model (Figure 2)
#
# The paper's Figure 2 has three panels, all averaged over the query positions of each head and then
# summarised over heads: (a) the true distance $\tilde d$ of the top-$N$ set, the main sum
# $\mathcal E$ (the paper's "expectation") and the bound of {prf:ref}`Theorem 1 (fixed set) <ch2-thm1-fixed>` for $N=5$ and
# growing $L$; (b) the same for $L=1024$ and growing $N$; (c) the **critical $N$** of each $L$: the
# smallest $N$ of a grid for which a two-sample KS test no longer distinguishes the per-head means
# $\bar d$ from $\bar{\mathcal E}$ (Algorithms 1–3, NOTES §3.2).
#
# We feed one window of `L` tokens to the model and capture every layer's weights and the chosen
# per-head vectors. The model is causal, so the first $L'$ rows of the $L\times L$ attention matrix
# are exactly the attention of the first $L'$ tokens: one capture serves every length, and row $t$
# (counting from 0) sees $t+1$ keys. Rows that see at most $N$ keys have no non-selected token and are
# skipped (NOTES §3.1). The model computes in float32, so a captured row sums to one only up to
# {glue:text}`m_rowsum_dev` here; we renormalize every row in float64 before measuring (a relative
# change of that order).

# %%
session = Session.open(model=model, corpus=corpus, chapters=chapters, offset=offset, L=L, seed=seed)
glue("ch2_model", session.name, display=False)
torch.set_num_threads(THREADS)
captured = session.capture(what=("weights", VECTOR_FIELD[vectors]))
torch.set_num_threads(1)
x_all = session.vectors(captured, vectors)
n_layers, n_heads, L_win = captured.weights.shape[:3]
glue("m_heads", f"{n_layers} layers x {n_heads} heads = {n_layers * n_heads} heads", display=False)
glue("m_vectors", {"value": "value vectors", "key": "key vectors", "query": "query vectors"}[vectors], display=False)
glue("m_reading", distance_reading.replace("_", " "), display=False)
glue("m_L", L_win, display=False)
glue("m_rowsum_dev", f"{max(float((captured.weights[l].to(F64).sum(-1) - 1).abs().max()) for l in range(n_layers)):.1e}",
     display=False)
pd.Series(session.summary(), name="value").to_frame()

# %% [markdown]
# ### How the rows are evaluated
#
# The paper's loops average each statistic over all query rows $t$. The library's Algorithms 1–3
# (`algorithms.distance_vs_length`, `distance_vs_n`, `critical_n`) do exactly that, with one full
# pass over all rows of all heads per length (the top-$N$ sizes of a length share its partial sorts
# and Gram products). Panels (b) and (c) need dozens of sizes at the full length; with every row
# that takes longer than this book's time budget (a few minutes for all chapters on two cores). We
# therefore evaluate the same per-row quantities with the same library
# functions (`metrics.top_n_mask`, `metrics.cumulative_distance`, `theory.theorem1_random_main_sum`,
# `theory.theorem1_fixed_bound`) on a **sample of query rows**: every row of the octaves
# $[2^k,2^{k+1})$ of positions that hold at most `rows_per_octave` rows, and `rows_per_octave`
# equally spaced rows of the larger octaves, each standing for the rows of its octave it represents.
# The head means of every length $L'$ are then weighted means over the sampled rows $t<L'$, so one
# pass per $N$ serves all lengths. Two checks below tie this to the library's algorithms: on the
# lengths where every row is sampled, the results must coincide with `algorithms.distance_vs_length`
# and `algorithms.critical_n`; at the largest length, the sampled head means are compared with the
# exact ones of `algorithms.distance_vs_n` on two layers. `rows_per_octave=None` evaluates every row.

# %%
rows, row_weight = algorithms.sample_rows(L_win, rows_per_octave)
octave_of = np.array([int(t).bit_length() for t in rows])
W_rows = captured.weights[:, :, torch.as_tensor(rows), :]  # (layers, heads, R, L), float32
glue("m_rows", len(rows), display=False)
glue("m_rows_share", f"{100 * len(rows) / L_win:.0f} %", display=False)


def row_values(n_top, row_limit, with_bound):
    """d~, the main sum and (optionally) the fixed-set bound per (layer, head, sampled row); NaN on rows
    t >= row_limit and on rows that see at most n_top keys."""
    names = ("distance", "expectation", "bound") if with_bound else ("distance", "expectation")
    out = {k: torch.full((n_layers, n_heads, len(rows)), torch.nan, dtype=F64) for k in names}
    for octave in np.unique(octave_of):
        idx = torch.as_tensor(np.nonzero((octave_of == octave) & (rows < row_limit))[0])
        if len(idx) == 0:
            continue
        t = torch.as_tensor(rows[idx])
        k = int(t.max()) + 1  # keys beyond the last row of the octave are masked for all its rows
        if k <= n_top:
            continue
        mask = causal_mask(k)[t]
        for layer in range(n_layers):
            w = W_rows[layer][:, idx, :k].to(F64)
            w = w / w.sum(-1, keepdim=True)
            xs = x_all[layer][:, :k].to(F64)
            sel, valid = metrics.top_n_mask(w, n_top, mask)
            res = {"distance": metrics.cumulative_distance(w, xs, sel, mask, reading=distance_reading),
                   "expectation": theory.theorem1_random_main_sum(w, xs, n_top, mask)}
            if with_bound:
                res["bound"] = theory.theorem1_fixed_bound(w, xs, sel, mask)
            for name, value in res.items():
                out[name][layer][:, idx] = torch.where(valid, value, torch.nan)
    return out


def head_means(values, length):
    """Per-(layer, head) weighted mean over the sampled valid rows t < length."""
    use = torch.as_tensor(rows < length)
    wt = torch.as_tensor(row_weight, dtype=F64) * use
    ok = ~torch.isnan(values) & use
    return torch.where(ok, values, 0.0).mul(wt).sum(-1) / (ok * wt).sum(-1)


CACHE = {}


def values_for(n_top, row_limit, with_bound=False):
    """Row values of one N, computed once for the longest range of rows asked so far."""
    have = CACHE.get(n_top)
    if have is None or have[0] < row_limit or (with_bound and "bound" not in have[1]):
        CACHE[n_top] = (row_limit, row_values(n_top, row_limit, with_bound))
    return CACHE[n_top][1]


def frame(values, length, n_top):
    means = {k: head_means(v, length).flatten().numpy() for k, v in values.items()}
    return pd.DataFrame({"layer": np.repeat(np.arange(n_layers), n_heads), "head": np.tile(np.arange(n_heads), n_layers),
                         "L": length, "N": n_top, **means})


# %%
t0 = time.perf_counter()
panel_Ns = sorted({N, *Ns})
for n_top in panel_Ns:
    values_for(n_top, L_win, with_bound=True)
by_length = pd.concat([frame(values_for(N, L_win, True), length, N) for length in lengths], ignore_index=True)
by_n = pd.concat([frame(values_for(n_top, L_win, True), L_win, n_top) for n_top in Ns], ignore_index=True)

# Row-wise check of the bound on every sampled valid row of every panel size.
checked = violations = 0
largest_ratio = 0.0
for n_top in panel_Ns:
    v = CACHE[n_top][1]
    ok = ~torch.isnan(v["distance"])
    checked += int(ok.sum())
    violations += int((v["distance"][ok] > v["bound"][ok] * (1 + TOL) + TOL).sum())
    positive = ok & (v["bound"] > 0)
    largest_ratio = max(largest_ratio, float((v["distance"][positive] / v["bound"][positive]).max()))
glue("m_rows_checked", f"{checked:,}", display=False)
glue("m_row_violations", violations, display=False)
glue("m_row_ratio", f"{largest_ratio:.4f}", display=False)
glue("m_panel_seconds", f"{time.perf_counter() - t0:.0f}", display=False)
runlog.record_time("Algorithms 1-2", time.perf_counter() - t0)

# %% [markdown]
# The two checks against the library's algorithms:

# %%
full_lengths = [l for l in lengths if l <= 64 and (rows_per_octave is None or l <= 2 * rows_per_octave)]
if full_lengths:
    Lc = max(full_lengths)
    block = captured.weights[:, :, :Lc, :Lc].to(F64)
    block = block / block.sum(-1, keepdim=True)
    reference = algorithms.distance_vs_length(block, x_all[:, :, :Lc], N=N, lengths=full_lengths,
                                               reading=distance_reading, progress=False)
    ours = by_length[by_length["L"].isin(full_lengths)].sort_values(["L", "layer", "head"])
    reference = reference.sort_values(["L", "layer", "head"])
    agreement = max(float(np.max(np.abs(ours[k].to_numpy() - reference[k].to_numpy()) / np.abs(reference[k].to_numpy())))
                    for k in ("distance", "expectation", "bound"))
    assert agreement < 1e-9, agreement
    glue("m_check_lengths", ", ".join(map(str, full_lengths)), display=False)
    glue("m_check_agreement", f"{agreement:.1e}", display=False)
else:
    glue("m_check_lengths", "none of the lengths (all are sampled)", display=False)
    glue("m_check_agreement", "not applicable", display=False)

two = [0, n_layers - 1]
block = captured.weights[two].to(F64)
block = block / block.sum(-1, keepdim=True)
exact_two = algorithms.distance_vs_n(block, x_all[two], Ns=[N], L=L_win, reading=distance_reading, progress=False)
sampled_two = frame(values_for(N, L_win, True), L_win, N)
sampled_two = sampled_two[sampled_two["layer"].isin(two)].sort_values(["layer", "head"])
exact_two = exact_two.assign(layer=exact_two["layer"].map(dict(enumerate(two)))).sort_values(["layer", "head"])
sampling_error = pd.DataFrame({k: np.abs(sampled_two[k].to_numpy() - exact_two[k].to_numpy()) / np.abs(exact_two[k].to_numpy())
                               for k in ("distance", "expectation", "bound")})
glue("m_last_layer", n_layers - 1, display=False)
glue("m_sample_med", f"{100 * float(sampling_error.median().max()):.1f} %", display=False)
glue("m_sample_max", f"{100 * float(sampling_error.max().max()):.0f} %", display=False)
glue("m_sample_mean_err", f"{100 * float(abs(sampled_two['distance'].mean() / exact_two['distance'].mean() - 1)):.1f} %",
     display=False)
del block
sampling_error.describe().loc[["50%", "max"]].rename(index={"50%": "median relative error", "max": "largest relative error"})

# %% [markdown]
# On the lengths where every row is sampled ({glue:text}`m_check_lengths`) our head means agree with
# `algorithms.distance_vs_length` to a relative {glue:text}`m_check_agreement`. At the full length the
# {glue:text}`m_rows` sampled rows ({glue:text}`m_rows_share` of the rows) reproduce the exact head
# means of `algorithms.distance_vs_n` on layers 0 and {glue:text}`m_last_layer` with a median relative
# error of at most {glue:text}`m_sample_med` per quantity; single heads are off by up to
# {glue:text}`m_sample_max`, and the mean over these heads by {glue:text}`m_sample_mean_err`. Panel
# summaries over all heads are therefore reliable to a few per cent; single heads are not.

# %% [markdown]
# ### The critical $N$ (panel (c))
#
# For each length $L'$ the grid holds the sizes $\lfloor0.06L'\rfloor$ (the paper's value), $L'/64$,
# $L'/32$, $L'/8$, $L'/4$, $3L'/8$, $L'/2$, $5L'/8$, then steps of $L'/16$ up to $15L'/16$ (rounded),
# and $L'-1$. Algorithm 3 returns the first size
# of the grid, in increasing order, whose KS test does not reject equality at level `ks_alpha`
# ($p>\alpha$), and $-1$ if every test rejects; we scan the grid upward and stop there, which returns
# the same $N$. The samples of each test are the per-head means $\bar d$ and $\bar{\mathcal E}$ of all
# heads. On the fully sampled lengths the result is compared with `algorithms.critical_n`.

# %%
FRACTIONS = (1 / 64, 1 / 32, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8, 11 / 16, 3 / 4, 13 / 16, 7 / 8, 15 / 16)


def critical_grid(length):
    grid = {max(1, math.floor(0.06 * length)), length - 1} | {max(1, round(f * length)) for f in FRACTIONS}
    return sorted(n for n in grid if 1 <= n <= length - 1)


t0 = time.perf_counter()
tests, summary = [], []
for length in sorted(lengths, reverse=True):
    critical = -1
    for n_top in critical_grid(length):
        v = values_for(n_top, length)
        d_bar = head_means(v["distance"], length).flatten().numpy()
        e_bar = head_means(v["expectation"], length).flatten().numpy()
        result = ks_2samp(d_bar, e_bar)
        tests.append({"L": length, "N": n_top, "N / L": n_top / length, "statistic": result.statistic,
                      "pvalue": result.pvalue, "reject": bool(result.pvalue <= ks_alpha)})
        if result.pvalue > ks_alpha:
            critical = n_top
            break
    summary.append({"L": length, "critical N": critical, "critical N / L": critical / length if critical > 0 else np.nan})
tests = pd.DataFrame(tests).sort_values(["L", "N"], ignore_index=True)
crit = pd.DataFrame(summary).sort_values("L", ignore_index=True)
glue("m_critical_seconds", f"{time.perf_counter() - t0:.0f}", display=False)
runlog.record_time("Algorithm 3", time.perf_counter() - t0)

crit_check = []
for length in full_lengths:
    blk = captured.weights[:, :, :length, :length].to(F64)
    blk = blk / blk.sum(-1, keepdim=True)
    ref = algorithms.critical_n(blk, x_all[:, :, :length], lengths=[length], Ns=critical_grid(length),
                                 alpha=ks_alpha, reading=distance_reading, progress=False).summary
    crit_check.append(int(ref["critical_n"].iloc[0]) == int(crit.loc[crit["L"] == length, "critical N"].iloc[0]))
assert all(crit_check), crit_check
glue("m_crit_check", f"{sum(crit_check)} of {len(crit_check)}", display=False)
crit

# %%
del captured, W_rows  # the per-row values are all we need from here on
fractions = crit["critical N / L"]
found = crit["critical N"] > 0
glue("m_crit_table", ", ".join(f"L={int(r['L'])}: N={int(r['critical N'])}" + (f" ({r['critical N / L']:.2f} L)" if r["critical N"] > 0 else " (none)")
                               for _, r in crit.iterrows()), display=False)
glue("m_crit_min_frac", f"{np.nanmin(fractions.to_numpy()):.2f}" if found.any() else "none", display=False)
glue("m_crit_max_frac", f"{np.nanmax(fractions.to_numpy()):.2f}" if found.any() else "none", display=False)
glue("m_ks_alpha", f"{ks_alpha:g}", display=False)
p_006 = tests[np.isclose(tests["N"], np.maximum(1, np.floor(0.06 * tests["L"])))]
glue("m_p_006_max", f"{p_006['pvalue'].max():.1e}" if len(p_006) else "not tested", display=False)

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
colors = dict(zip(["true distance", "main sum E", "bound"], sns.color_palette(figures.PALETTE, 3)))
names = {"distance": "true distance", "expectation": "main sum E", "bound": "bound"}
for ax, table, xcol, title in ((axes[0], by_length, "L", f"(a) N = {N}, growing L"),
                               (axes[1], by_n, "N", f"(b) L = {L_win}, growing N")):
    tidy = table.melt(id_vars=["layer", "head", xcol], value_vars=list(names), var_name="quantity")
    tidy["quantity"] = tidy["quantity"].map(names)
    sns.lineplot(data=tidy, x=xcol, y="value", hue="quantity", marker="o", estimator="mean", errorbar=("pi", 80),
                 ax=ax, palette=colors)
    ax.set(xscale="log", yscale="log", title=title, ylabel="mean over heads (band: 10-90 % of heads)")
    ax.legend(fontsize="small")
ax = axes[2]
grid_L = np.array(sorted(lengths), dtype=float)
ax.plot(grid_L, 0.06 * grid_L, "--", color="black", label="paper: 0.06 L")
ax.plot(grid_L, grid_L - 1, ":", color="grey", label="L - 1 (largest N tested)")
ok = crit[crit["critical N"] > 0]
ax.plot(ok["L"], ok["critical N"], "o-", color=sns.color_palette(figures.PALETTE)[3], label="critical N (ours)")
for _, r in ok.iterrows():
    ax.annotate(f"{r['critical N / L']:.2f} L", (r["L"], r["critical N"]), textcoords="offset points", xytext=(4, -12),
                fontsize="x-small")
ax.set(xscale="log", yscale="log", xlabel="L", ylabel="N", title=f"(c) critical N, KS test at alpha = {ks_alpha:g}")
ax.legend(fontsize="small")
figures.model_title(fig, f"Distance statistics of Theorem 1 on War and Peace ({vectors} vectors, "
                          f"{distance_reading.replace('_', ' ')})", session.name)
plt.show()

# %% [markdown]
# **Figure 2, reproduced on {glue:text}`ch2_model`** ({glue:text}`m_heads`; the $x_i$ are the heads'
# {glue:text}`m_vectors`; $\tilde d$ in the {glue:text}`m_reading` reading; the weights are the model's
# own, i.e. softmax of $q^\top k$ times the model's scaling; {glue:text}`m_rows` sampled query rows per
# head). (a) $N=${glue:text}`m_N`: the true distance $\tilde d$ of the top-$N$ set, the main sum
# $\mathcal E$ of {prf:ref}`Theorem 1 (random set) <ch2-thm1-random>` and the bound of {prf:ref}`Theorem 1 (fixed set) <ch2-thm1-fixed>`, averaged over
# query rows and then over heads (band: 10–90 % of heads). (b) The same at $L=${glue:text}`m_L` for
# growing $N$. (c) The critical $N$ of the KS test at level {glue:text}`m_ks_alpha` (the paper's
# pseudocode uses 0.05, its text 0.01), with the paper's $0.06L$ line.

# %%
glue("m_N", N, display=False)
mean_by_length = by_length.groupby("L")[list(names)].mean()
slopes = {k: float(np.polyfit(np.log(mean_by_length.index.to_numpy(float)), np.log(mean_by_length[k].to_numpy()), 1)[0])
          for k in names}
safe = pd.concat([by_length, by_n])
safe_fraction = float((safe["distance"] <= safe["bound"]).mean())
conservative = float((safe["bound"] / safe["distance"]).median())
mean_by_n = by_n.groupby("N")[list(names)].mean()
glue("m_slope_d", f"{slopes['distance']:.2f}", display=False)
glue("m_slope_e", f"{slopes['expectation']:.2f}", display=False)
glue("m_slope_b", f"{slopes['bound']:.2f}", display=False)
glue("m_d_first", f"{mean_by_length['distance'].iloc[0]:.3g}", display=False)
glue("m_d_last", f"{mean_by_length['distance'].iloc[-1]:.3g}", display=False)
glue("m_e_first", f"{mean_by_length['expectation'].iloc[0]:.3g}", display=False)
glue("m_e_last", f"{mean_by_length['expectation'].iloc[-1]:.3g}", display=False)
glue("m_L_first", int(mean_by_length.index[0]), display=False)
glue("m_L_last", int(mean_by_length.index[-1]), display=False)
glue("m_safe_fraction", f"{100 * safe_fraction:.0f} %", display=False)
glue("m_conservative", f"{conservative:.1f}", display=False)

SLOPE_RANGE = (0.8, 1.2)
PLATEAU_TOL = 0.10
CONVERGED_TOL = 0.10
glue("m_slope_range", f"[{SLOPE_RANGE[0]}, {SLOPE_RANGE[1]}]", display=False)
glue("m_plateau_tol", f"{100 * PLATEAU_TOL:.0f} %", display=False)
glue("m_converged_tol", f"{100 * CONVERGED_TOL:.0f} %", display=False)
has_20_100 = {20, 100} <= set(Ns)
has_5_100 = {5, 100} <= set(Ns)
if has_20_100:
    plateau = abs(mean_by_n.loc[100, "distance"] / mean_by_n.loc[20, "distance"] - 1)
    ratio_20 = mean_by_n.loc[20, "bound"] / mean_by_n.loc[20, "distance"]
    ratio_100 = mean_by_n.loc[100, "bound"] / mean_by_n.loc[100, "distance"]
    glue("m_plateau", f"{100 * plateau:.1f} %", display=False)
    glue("m_ratio_20", f"{ratio_20:.2f}", display=False)
    glue("m_ratio_100", f"{ratio_100:.2f}", display=False)
else:
    plateau = ratio_20 = ratio_100 = np.nan
    for key in ("m_plateau", "m_ratio_20", "m_ratio_100"):
        glue(key, "not measured (Ns lacks 20 or 100)", display=False)
if has_5_100:
    gap_5 = 1 - mean_by_n.loc[5, "expectation"] / mean_by_n.loc[5, "distance"]
    gap_100 = 1 - mean_by_n.loc[100, "expectation"] / mean_by_n.loc[100, "distance"]
    glue("m_gap_5", f"{100 * gap_5:.0f} %", display=False)
    glue("m_gap_100", f"{100 * gap_100:.0f} %", display=False)
else:
    gap_5 = gap_100 = np.nan
    for key in ("m_gap_5", "m_gap_100"):
        glue(key, "not measured (Ns lacks 5 or 100)", display=False)
glue("m_d_peak_N", int(mean_by_n["distance"].idxmax()), display=False)

linear_d = SLOPE_RANGE[0] <= slopes["distance"] <= SLOPE_RANGE[1]
linear_e = SLOPE_RANGE[0] <= slopes["expectation"] <= SLOPE_RANGE[1]
glue("m_read_d", "linear growth, as the paper reports" if linear_d
     else f"outside {list(SLOPE_RANGE)}, so not the linear growth the paper reports", display=False)
glue("m_read_e", "The main sum grows linearly as well" if linear_e else "The main sum does not follow", display=False)
glue("m_read_plateau",
     "the plateau the paper reports" if has_20_100 and plateau <= PLATEAU_TOL
     else "no plateau by our rule (a change of at most " + f"{100 * PLATEAU_TOL:.0f} %)" if has_20_100
     else "not comparable with the paper", display=False)
glue("m_read_tighten",
     "tightens, as the paper says" if has_20_100 and ratio_100 < ratio_20
     else "does not tighten, because its second term grows with ᾱ_N (L − N)" if has_20_100
     else "is not compared (Ns lacks 20 or 100)", display=False)
glue("m_read_converge",
     "The distance and the main sum meet, as the paper says" if has_5_100 and gap_100 <= CONVERGED_TOL
     else "The distance and the main sum approach each other, as the paper says, but slowly" if has_5_100 and gap_100 < gap_5
     else "The distance and the main sum do not approach each other" if has_5_100
     else "The convergence is not compared (Ns lacks 5 or 100)", display=False)
if len(p_006) and bool(p_006["reject"].all()):
    sentence = f"At N = ⌊0.06 L⌋ every test rejects equality (largest p-value {p_006['pvalue'].max():.1e})"
elif len(p_006):
    sentence = ("At N = ⌊0.06 L⌋ the test accepts for L = "
                + ", ".join(str(int(l)) for l in p_006.loc[~p_006["reject"], "L"]))
else:
    sentence = "No test was run at N = ⌊0.06 L⌋ (an earlier size was accepted for every length)"
glue("m_read_006", sentence, display=False)

# %% [markdown]
# **Panel (a).** Between $L=${glue:text}`m_L_first` and $L=${glue:text}`m_L_last` the mean true
# distance goes from {glue:text}`m_d_first` to {glue:text}`m_d_last`: the slope of $\log\tilde d$
# against $\log L$ is {glue:text}`m_slope_d`, {glue:text}`m_read_d` (our rule: a slope in
# {glue:text}`m_slope_range`). {glue:text}`m_read_e`: it goes from {glue:text}`m_e_first` to
# {glue:text}`m_e_last` (slope {glue:text}`m_slope_e`). By {prf:ref}`Corollary 2 <ch2-cor2>` the main sum is at
# most $2A+N\|m\|\le(2+N)\max_i\|x_i\|$ at every $L$, so at fixed $N$ it cannot grow without bound,
# whereas for the top-$N$ set the context vector $s$ carries most of the weight and each of the $L-N$
# non-selected terms contributes about $\|s\|$ to $\tilde d$. The paper shows its "expectation"
# growing linearly too; under our reconstruction of $\mathcal E$ that cannot last, so either its
# expectation is a different quantity or our reconstruction misses a factor. The bound grows with
# slope {glue:text}`m_slope_b`; it lies above the mean distance for {glue:text}`m_safe_fraction` of the
# (head, length) and (head, $N$) pairs of panels (a) and (b), with a median ratio bound/distance of
# {glue:text}`m_conservative` (the paper: "safe but conservative"). Row by row, on
# {glue:text}`m_rows_checked` sampled rows, it is violated {glue:text}`m_row_violations` times, and
# the largest ratio $\tilde d/\text{bound}$ is {glue:text}`m_row_ratio`.
#
# **Panel (b).** The mean distance is largest at $N=${glue:text}`m_d_peak_N` and changes by
# {glue:text}`m_plateau` from $N=20$ to $N=100$: {glue:text}`m_read_plateau`. The bound
# {glue:text}`m_read_tighten`: its ratio to the distance is {glue:text}`m_ratio_20` at $N=20$ and
# {glue:text}`m_ratio_100` at $N=100$. {glue:text}`m_read_converge`: the main sum falls short of the
# distance by {glue:text}`m_gap_5` at $N=5$ and by {glue:text}`m_gap_100` at $N=100$.
#
# **Panel (c).** The critical $N$ is {glue:text}`m_crit_table`; where a size is accepted it is between
# {glue:text}`m_crit_min_frac` and {glue:text}`m_crit_max_frac` of the length, against the paper's
# "fewer than 6 %". {glue:text}`m_read_006`. Panel (a) explains why: at small $N$ the top-$N$ distance
# grows with $L$ while the main sum stays bounded, so over all heads the two samples are far apart,
# and they meet only once a large part of the row is selected. The upward scan agrees with
# `algorithms.critical_n` on {glue:text}`m_crit_check` fully sampled lengths. (Time on this run:
# {glue:text}`m_panel_seconds` s for panels (a) and (b), {glue:text}`m_critical_seconds` s for the
# scan.)

# %%
crit_ok = found.all() and bool((fractions <= 0.06).all())
crit_some = bool((fractions <= 0.06).any())
crit_verdict = "reproduced" if crit_ok else "partly reproduced" if crit_some else "not reproduced"
glue("m_crit_verdict", crit_verdict, display=False)
glue("m_read_tighten_short", ("tightens" if ratio_100 < ratio_20 else "does not tighten") if has_20_100
     else "was not compared (Ns lacks 20 or 100)", display=False)
_ = record(Claim(key="ch2-thm1-fixed-model", chapter=CHAPTER,
             claim="Theorem 1 (fixed set, our completion) holds row by row on the model",
             paper="the bound is an upper bound on d~ (Fig. 2a, 2b: 'safe')",
             ours=f"{violations} violations on {checked} sampled rows (N in {panel_Ns}); largest ratio {largest_ratio:.4f}",
             verdict="holds" if violations == 0 else "fails", model=session.name))
_ = record(Claim(key="ch2-fig2a-distance-linear", chapter=CHAPTER,
             claim=f"At N = {N} the true distance grows roughly linearly in L",
             paper="grows roughly linearly in L (Fig. 2a)",
             ours=f"slope of log d~ vs log L = {slopes['distance']:.2f} (rule: reproduced if in {list(SLOPE_RANGE)})",
             verdict="reproduced" if SLOPE_RANGE[0] <= slopes["distance"] <= SLOPE_RANGE[1] else "not reproduced",
             model=session.name))
_ = record(Claim(key="ch2-fig2a-expectation-linear", chapter=CHAPTER,
             claim=f"At N = {N} the expectation term of Theorem 1 grows roughly linearly in L",
             paper="grows roughly linearly in L (Fig. 2a)",
             ours=f"slope of log E vs log L = {slopes['expectation']:.2f} (rule: reproduced if in {list(SLOPE_RANGE)}); "
                  "our main sum is bounded in L by Corollary 2",
             verdict="reproduced" if SLOPE_RANGE[0] <= slopes["expectation"] <= SLOPE_RANGE[1] else "not reproduced",
             model=session.name))
_ = record(Claim(key="ch2-fig2a-bound-safe", chapter=CHAPTER,
             claim="The upper bound of Theorem 1 is safe but conservative",
             paper="safe but conservative (Fig. 2a)",
             ours=f"mean d~ <= mean bound for {100 * safe_fraction:.0f} % of (head, L/N) pairs; median bound/d~ = "
                  f"{conservative:.1f}; row violations {violations} (rule: reproduced if 100 % and no row violation)",
             verdict="reproduced" if safe_fraction == 1.0 and violations == 0 else "not reproduced", model=session.name))
_ = record(Claim(key="ch2-fig2b-plateau", chapter=CHAPTER,
             claim=f"At L = {L_win} the distance plateaus beyond N = 20",
             paper="plateau beyond N ~ 20 at L = 1024 (Fig. 2b)",
             ours=(f"relative change of mean d~ from N = 20 to N = 100: {100 * plateau:.1f} % (rule: reproduced if "
                   f"<= {100 * PLATEAU_TOL:.0f} %)") if has_20_100 else "not measured: Ns lacks 20 or 100",
             verdict=("reproduced" if plateau <= PLATEAU_TOL else "not reproduced") if has_20_100 else "not comparable",
             model=session.name))
_ = record(Claim(key="ch2-fig2b-bound-tightens", chapter=CHAPTER,
             claim=f"At L = {L_win} the bound tightens as N grows beyond 20",
             paper="the bound tightens (Fig. 2b)",
             ours=(f"mean bound / mean d~ = {ratio_20:.2f} at N = 20 and {ratio_100:.2f} at N = 100 (rule: reproduced "
                   "if the ratio decreases)") if has_20_100 else "not measured: Ns lacks 20 or 100",
             verdict=("reproduced" if ratio_100 < ratio_20 else "not reproduced") if has_20_100 else "not comparable",
             model=session.name))
_ = record(Claim(key="ch2-fig2b-converge", chapter=CHAPTER,
             claim=f"At L = {L_win} the true and expected distances converge as N approaches 100",
             paper="true and expected distances converge as N -> 100 (Fig. 2b)",
             ours=(f"relative gap 1 - E/d~ = {100 * gap_5:.0f} % at N = 5, {100 * gap_100:.0f} % at N = 100 (rule: "
                   f"reproduced if <= {100 * CONVERGED_TOL:.0f} % at N = 100, partly if it decreases)")
                  if has_5_100 else "not measured: Ns lacks 5 or 100",
             verdict=(("reproduced" if gap_100 <= CONVERGED_TOL else "partly reproduced" if gap_100 < gap_5
                       else "not reproduced") if has_5_100 else "not comparable"),
             model=session.name))
_ = record(Claim(key="ch2-fig2c-critical-n", chapter=CHAPTER,
             claim="The critical top-N of the KS test is about 0.06 L (fewer than 6 % of the tokens)",
             paper="critical N ~ 0.06 L, alpha = 0.01 (Fig. 2c)",
             ours="; ".join(f"L={int(r['L'])}: {int(r['critical N'])}" for _, r in crit.iterrows())
                  + f" (alpha = {ks_alpha:g}; rule: reproduced if critical N <= 0.06 L for every L, partly if for some)",
             verdict=crit_verdict,
             model=session.name))

# %% [markdown]
# ```{admonition} What this means
# The fixed-set bound of Theorem 1, in our completion, is a theorem: it held on every synthetic
# instance and on every measured row of the model ({glue:text}`m_row_violations` violations), and it
# is attained, so it cannot be sharpened in general (in particular not by a square root). On the
# model it sits a few times above the true distance (median ratio {glue:text}`m_conservative`) and
# {glue:text}`m_read_tighten_short` as $N$ grows. The true distance of the top-$N$ set grows with
# slope {glue:text}`m_slope_d` in $\log L$ and changes by {glue:text}`m_plateau` between $N=20$ and
# $N=100$. The "expectation" is a different story in our reconstruction: the main sum of the
# random-set expectation is bounded in $L$ (Corollary 2), so the distance of the tokens a head
# actually selects and that of a random selection part ways as the context grows, and a KS test
# tells them apart until most of the row is selected. The paper's critical $N\approx0.06L$ is
# {glue:text}`m_crit_verdict` here (critical $N/L$ between {glue:text}`m_crit_min_frac` and
# {glue:text}`m_crit_max_frac`). Our reading of the definitions, more than the model, is the first
# suspect for such a gap; the parameters `distance_reading` and `vectors` let a reader try others.
# ```
#
# ## Provenance

# %%
session.provenance_table()

# %% [markdown]
# ## Exercises
#
# ```{exercise} The fixed-set bound is attained
# :label: ch2-ex1
#
# Let $I$ be the top-$N$ set of a row of weights, $e$ a unit vector, $x_j=e$ for $j\in I$ and
# $x_i=-e$ for $i\notin I$. Compute $\tilde d$ (both readings) and the right-hand side of
# {prf:ref}`Theorem 1 (fixed set) <ch2-thm1-fixed>`, and show that they are equal. Deduce that no bound of the form
# $(1-\bar\alpha_N)\,d_1+\max_{j\in I}\|x_j\|\sqrt{\bar\alpha_N(L-N)-(1-\bar\alpha_N)}$ can hold for all
# rows. Which inequalities of the proof are equalities here?
# ```
#
# ```{solution-start} ch2-ex1
# :class: dropdown
# ```
#
# Here $s=\bar\alpha_N e$, so for $i\notin I$ we get $\alpha_i x_i-s=-(\alpha_i+\bar\alpha_N)e$ with
# norm $\alpha_i+\bar\alpha_N$. Summing over the $L-N$ non-selected keys,
# $\tilde d=(1-\bar\alpha_N)+\bar\alpha_N(L-N)$; all the differences point along $-e$, so the norm of
# their sum is the same number and $\tilde d_\Sigma=\tilde d$. On the right-hand side $d_1=\|-e-e\|=2$
# and $\max_j\|x_j\|=1$, so the bound is $2(1-\bar\alpha_N)+\bar\alpha_N(L-N)-(1-\bar\alpha_N)$, the
# same value. In the proof, $\tilde x=e$; $\|x_i-\tilde x\|=2=d_1$ and $\|\tilde x\|=\max_j\|x_j\|$ are
# equalities, and the triangle inequality is one too because $\alpha_i(x_i-\tilde x)=-2\alpha_i e$ and
# $-(\bar\alpha_N-\alpha_i)\tilde x$ point the same way.
#
# For the square-root form keep this configuration with $N=1$, $L\ge3$, and let the selected weight
# tend to one ($\alpha_1=1-(L-1)\eta$, the others $\eta\to0$). Then $\bar\alpha_N\to1$ and
# $\tilde d\to L-1$, whereas the root form tends to $2\cdot0+\sqrt{L-1}<L-1$: it is violated. The
# synthetic check above finds such violations in the antipodal family.
#
# ```{solution-end}
# ```
#
# ```{exercise} The context vector and the distance with a loop
# :label: ch2-ex2
#
# Take one row of weights and its vectors (a synthetic row, or the last row of one head of a captured
# attention matrix). Without vectorised library calls, write a function
# `distance_by_loop(weights_row, x, n_top)` that finds the top-$N$ set (ties to the earlier key),
# builds the context vector $s$, adds up $\tilde d=\sum_{i\notin I_N}\|\alpha_i x_i-s\|$ and returns
# the three (the set of indices, $s$ and $\tilde d$). Compare with `attn_utils.mathematics.metrics.top_n_mask` and
# `attn_utils.mathematics.metrics.cumulative_distance`, and check the bound of
# `attn_utils.mathematics.theory.theorem1_fixed_bound` on the same row.
# ```
#
# ```{solution-start} ch2-ex2
# :class: dropdown
# ```

# %% tags=["solution"]
def distance_by_loop(weights_row, x, n_top):
    """Top-N set, context vector s and sum-of-norms distance of one row, with plain Python loops."""
    order = sorted(range(len(weights_row)), key=lambda i: (-float(weights_row[i]), i))
    top = set(order[:n_top])
    s = [0.0] * x.shape[1]
    for j in top:
        for c in range(x.shape[1]):
            s[c] += float(weights_row[j]) * float(x[j, c])
    total = 0.0
    for i in range(len(weights_row)):
        if i not in top:
            total += math.sqrt(sum((float(weights_row[i]) * float(x[i, c]) - s[c]) ** 2 for c in range(x.shape[1])))
    return top, s, total


ex_w = torch.softmax(torch.randn(200, generator=torch.Generator().manual_seed(seed), dtype=F64) * 3, -1)
ex_x = torch.randn(200, 16, generator=torch.Generator().manual_seed(seed + 1), dtype=F64)
top, s_loop, d_loop = distance_by_loop(ex_w, ex_x, 5)
selected, _ = metrics.top_n_mask(ex_w[None], 5)
d_lib = float(metrics.cumulative_distance(ex_w[None], ex_x, selected)[0])
assert set(torch.nonzero(selected[0]).flatten().tolist()) == top
assert torch.allclose(torch.tensor(s_loop, dtype=F64), metrics.context_vector(ex_w[None], ex_x, selected)[0])
assert abs(d_loop - d_lib) <= 1e-10 * d_lib
assert d_lib <= float(theory.theorem1_fixed_bound(ex_w[None], ex_x, selected)[0])
print(f"loop: {d_loop:.10f}, library: {d_lib:.10f}")

# %% [markdown]
# ```{solution-end}
# ```

# %% tags=["exercise-check"]
from attn_utils.classroom import exercises

exercises.check("ch2-ex2", distance_by_loop)

# %% [markdown]
# ```{exercise} When the Jensen residual vanishes
# :label: ch2-ex3
#
# Show that the residual $\varepsilon$ of {prf:ref}`Theorem 1 (random set) <ch2-thm1-random>` is $0$ for $N=L-1$, and write
# $\mathbb E[\tilde d]$ in that case in terms of $a_i=\alpha_i x_i$ and $m=\sum_i a_i$. Then find
# weights and vectors with $L=3$, $N=1$ for which $\varepsilon>0$.
# ```
#
# ```{solution-start} ch2-ex3
# :class: dropdown
# ```
#
# For $N=L-1$ the random set leaves out exactly one key $k$, uniform over $\{1,\dots,L\}$; then
# $s_I=m-a_k$ and $\tilde d=\|a_k-(m-a_k)\|=\|2a_k-m\|$, so $\mathbb E[\tilde d]=\frac1L\sum_k\|2a_k-m\|$.
# The main sum has $(L-N)/L=1/L$ and $N/(L-1)=1$, so its $k$-th term is $\|a_k-(m-a_k)\|$: the two
# agree term by term and $\varepsilon=0$. (In the proof, given $k\notin I$ the set $I$ is determined, so
# Jensen's inequality is applied to a point mass.)
#
# For $L=3$, $N=1$ take $a_1=0$ and $a_2=e$, $a_3=-e$ (e.g. $\alpha=(\tfrac13,\tfrac13,\tfrac13)$, $x_1=0$,
# $x_2=3e$, $x_3=-3e$). Given $1\notin I$, $s_I$ is $e$ or $-e$ with probability $\tfrac12$ each, so
# $\mathbb E\|a_1-s_I\|=1$ while $\|a_1-\mathbb E s_I\|=0$: the first key alone contributes
# $\tfrac23\cdot1$ to $\varepsilon$, and the other terms contribute non-negative amounts.
#
# ```{solution-end}
# ```
