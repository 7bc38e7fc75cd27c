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
# # Geometric separability: Assumptions 1–2 and Theorem 2
#
# {doc}`ch2_distance` measured how far the tokens a query selects lie from the rest *on average*.
# This chapter asks a sharper question with the paper's geometric picture
# {cite}`mudarisov2025limitations`: after each vector has been shrunk by its attention weight, how
# many of the $N$ selected tokens still sit closer to their own context vector $s$ than every
# non-selected token? The paper calls the count $N_s$, bounds the fraction $N_s/N$ from both sides
# (its Theorem 2), and reports that on GPT-2 the fraction falls until $N\approx 16$ and then levels
# off at 70–85 %. We define the objects, draw the paper's Figure 1 from our own random data, prove
# what can be proved, show where the reconstructed statement breaks, check everything on synthetic
# spheres, and measure the fraction on every head of a pretrained model (the paper's Figure 3).
#
# **What you will learn**
#
# * what it means for a selected token to be *geometrically distinguishable*, and how to count them ($N_s$);
# * which half of the paper's Theorem 2 can be proved (the lower bound, through a spread lemma) and why the
#   other half, the exponential "upper bound", is false in general (a counterexample, and violations on
#   random spheres and on a pretrained model);
# * how the separability fraction $N_s/N$ of a pretrained model's heads behaves as $N$ grows (the paper's
#   Figure 3), and what the Discussion's multi-head arithmetic assumes.
#
# **What it assumes**
#
# * the top-$N$ set $I_N$ and the context vector $s$ of {doc}`ch0_setting`, and the distances of {doc}`ch2_distance`;
# * Euclidean geometry (the polarization identity $\langle x,y\rangle=\tfrac12(\|x\|^2+\|y\|^2-\|x-y\|^2)$);
# * Markov's and Hoeffding's inequalities, for the discussion of the proof sketch;
# * reading PyTorch and pandas code.

# %% tags=["parameters", "remove-cell"]
# Parameters (papermill). Every one is checked in the next cell.
model = "auto"            # model measured: "auto" (GPT-2 if it can be had, else SmolLM2-135M), "gpt2", "smollm2-135m", ...
corpus = "war-and-peace"  # "war-and-peace" or the path of a UTF-8 text file
chapters = None           # None (whole novel) or [first, last]: consecutive chapters, 1-based
offset = 0                # first token of the window
L = 1024                  # window length (tokens) fed to the model, and length of the synthetic rows
seed = 0                  # seed of every synthetic draw (Figure 1, the synthetic spheres, the exercise)
device = "auto"           # "auto" (a GPU if there is one, else the CPU), "cpu" or "cuda": runs the model and the analysis
Ns = [1, 2, 4, 8, 16, 32, 64, 100]  # top-N sizes; values not below L are dropped
M = 1.0                   # radius of the sphere of Assumption 1 (vectors are projected onto it)
vectors = "value"         # per-head vectors playing the role of the x_i: "value", "key" or "query"
sigmas = [0.5, 1.0, 2.0]  # standard deviations of the N(0, sigma^2) logits of the synthetic rows
n_trials = 100            # synthetic instances (embeddings + 4 query rows) per sigma

# %% tags=["remove-input"]
from attn_utils.book.formatting import parameter_table
from attn_utils.book.params import checked

p = checked(model=model, corpus=corpus, chapters=chapters, offset=offset, L=L, device=device, seed=seed, Ns=Ns, M=M,
            vectors=vectors, sigmas=sigmas, n_trials=n_trials)
Ns = list(p.Ns)  # values of Ns not below L are dropped
parameter_table(p)

# %% tags=["hide-input"]
import torch

from attn_utils.book import claims, figures, runlog
from attn_utils.book.chapters import separability
from attn_utils.book.formatting import glue_values, table
from attn_utils.book.session import VECTOR_FIELD, Session
from attn_utils.mathematics import algorithms, metrics, theory

figures.set_style()
F64 = torch.float64

# %% [markdown]
# ## Selected tokens, the context vector and the selective ball
#
# Fix one query row with weights $\alpha_1,\dots,\alpha_L$ over vectors $x_1,\dots,x_L\in\R^d$. As in
# {doc}`ch0_setting`, $I_N$ holds the indices of the $N$ largest weights and
# $s=\sum_{i\in I_N}\alpha_i x_i$ is the context vector of the selected tokens. The paper's geometric
# picture does not compare the $x_i$ themselves but their **weight-rescaled** versions $\alpha_i x_i$:
# this is what the row actually adds up, and a token with a small weight contributes a point near the
# origin whatever its direction.
#
# ```{prf:definition} Selective ball and distinguishable tokens
# :label: ch3-def-distinguishable
# :nonumber:
#
# For a radius $r>0$ the **selective ball** is $B_r(s)=\{y\in\R^d:\ \|y-s\|_2\le r\}$. A selected token
# $i\in I_N$ is **geometrically distinguishable** if its rescaled point $\alpha_i x_i$ lies in $B_r(s)$
# while no rescaled non-selected point does ($\alpha_j x_j\notin B_r(s)$ for every $j\notin I_N$).
# Their number is
#
# $$
# N_s \;=\; \sum_{i\in I_N}\mathbf 1\{\alpha_i x_i\in B_r(s)\}\cdot
# \mathbf 1\{\alpha_j x_j\notin B_r(s)\ \ \forall j\notin I_N\},
# $$
#
# and $N_s/N\in[0,1]$ is the **separability fraction**.
# ```
#
# The wording of the definition is the paper's; its display formula was lost in every copy we could
# read, so the indicator form above is **our reconstruction** from that wording ({ref}`sources-theorem2`). One
# identity is used throughout: for $i\in I_N$ the distance of $\alpha_i x_i$ from the centre is the
# length of what the *other* selected tokens contribute,
#
# $$
# X_i \;:=\; \|s-\alpha_i x_i\|_2 \;=\; \Big\|\sum_{j\in I_N\setminus\{i\}}\alpha_j x_j\Big\|_2 .
# $$
#
# **The radius.** The paper's Algorithm 4 takes the largest radius that keeps every non-selected
# point out, $r=\min_{j\notin I_N}\|s-\alpha_j x_j\|_2$. With this $r$ the nearest non-selected point
# lies *on* the sphere $\partial B_r(s)$, so read literally with the closed ball the second indicator
# would always be $0$. The library (`attn_utils.mathematics.metrics.separability`) therefore uses the open ball:
#
# ```{prf:remark} Boundary convention (ours)
# :label: ch3-rem-boundary
# :nonumber:
#
# With $r=\min_{j\notin I_N}\|s-\alpha_j x_j\|_2$ we count
# $N_s=\#\{i\in I_N:\ X_i<r\}$: a selected token is distinguishable when it is **strictly** closer to
# $s$ than every non-selected token. For $N=1$, $X_i=0$ and $N_s/N=1$ whenever $r>0$. A row that sees
# no more than $N$ keys (in a causal model, the first $N$ query positions) has no non-selected token
# and is skipped.
# ```

# %% [markdown]
# ### Figure 1 of the paper, from our own random data
#
# The paper illustrates the definition in two dimensions. We redraw it from a seeded random instance:
# {glue:text}`fig1_L` tokens at uniformly random angles on the circle of radius $M$ (Assumption 1 in
# $d=2$), softmax weights of logits drawn from $N(0,$ {glue:text}`fig1_sigma`$^2)$, and the top
# {glue:text}`fig1_N` tokens selected.

# %% tags=["hide-input"]
fig1 = separability.figure1_instance(seed, L=12, N=4, sigma=1.5, M=M)  # tokens, top-N size, logit scale
figures.glue_figure("fig_ch3_figure1_rescaling", separability.draw_figure1_rescaling(fig1))
figures.glue_figure("fig_ch3_figure1_ball", separability.draw_figure1_ball(fig1))

# %% tags=["remove-cell"]
glue_values({"fig1_L": fig1.L, "fig1_N": fig1.N, "fig1_sigma": fig1.sigma, "fig1_Ns": int(fig1.inside.sum()),
             "fig1_ratio": fig1.ratio, "fig1_r": fig1.r, "fig1_top_weight": fig1.weights.max()})

# %% [markdown]
# ```{glue:figure} fig_ch3_figure1_rescaling
# ---
# name: fig-ch3-figure1-rescaling
# alt: >-
#   Two square panels of points in the plane. Left, twelve points on a circle, four of them drawn as magenta
#   stars and the rest as black dots. Right, the same points shrunk toward the origin, with grey arrows from each
#   point to its rescaled position.
# ---
# **The paper's Figure 1, left and middle panels, redrawn from our own random instance** (synthetic data, no
# model). (a) The {glue:text}`fig1_L` tokens on the circle of radius $M$; magenta stars mark the top
# {glue:text}`fig1_N` by weight. (b) Each point multiplied by its weight (the largest weight is
# {glue:text}`fig1_top_weight`): look at how every point slides toward the origin, the low-weight ones almost all
# the way, so that even the selected points end up close together. The paper draws the same two steps for its
# own example, with the same symbols: tokens on a circle, then attended (magenta stars) and non-attended (black
# dots) points pulled toward the origin by the scaling.
# ```
#
# ```{glue:figure} fig_ch3_figure1_ball
# ---
# name: fig-ch3-figure1-ball
# alt: >-
#   One square panel zoomed on the rescaled points near the origin, with a shaded disc centred on a blue cross,
#   a green segment from the cross to the nearest black dot, magenta stars inside the disc circled in green and
#   hollow magenta stars outside it.
# ---
# **The paper's Figure 1, right panel, redrawn** (synthetic data, no model). (c) The ball around the context vector
# $s$ (blue cross) whose radius $r=$ {glue:text}`fig1_r` reaches the nearest non-selected point (green segment).
# Look at which stars are circled: {glue:text}`fig1_Ns` of the {glue:text}`fig1_N` selected points lie strictly
# inside, so $N_s/N=$ {glue:text}`fig1_ratio`; a hollow star is a selected point that the *other* selected tokens
# pulled $s$ away from ($X_i$ large). The paper's right panel shades the same ball and calls the selected points
# inside it distinguishable; change `seed` to draw another instance.
# ```
#
# {numref}`fig-ch3-figure1-rescaling` and {numref}`fig-ch3-figure1-ball` follow the three panels of the paper's
# illustration, split in two so that each stays readable.

# %% [markdown]
# ## Assumptions 1–2
#
# The paper's bounds are stated for idealized embeddings.
#
# ```{prf:assumption} Assumption 1 (embeddings on a sphere)
# :label: ch3-ass1
# :nonumber:
#
# Every embedding lies on the sphere of radius $M$ in $\R^d$, $\|x_i\|_2=M$; the paper adds that they
# are distributed uniformly on it.
# ```
#
# ```{prf:assumption} Assumption 2 (minimum separation)
# :label: ch3-ass2
# :nonumber:
#
# Distinct embeddings are at least $\delta>0$ apart: $\|x_i-x_j\|_2\ge\delta$ for all $i\ne j$.
# ```
#
# In the experiments the paper enforces Assumption 1 by projecting, $x_i\mapsto M x_i/\|x_i\|$, and
# makes Assumption 2 true by definition, setting $\delta$ to the empirical minimum pairwise distance
# ({ref}`sources-theorem2`). We do the same, per head. Note that $\delta\le 2M$ always, and that **uniformity plays no
# role** in the statements proved below: they use only $\|x_i\|=M$ and the separation $\delta$.

# %% [markdown]
# (ch3-theorem2)=
# ## Theorem 2: what can be proved and what cannot
#
# The paper's Theorem 2 sandwiches $\mathbb E[N_s]/N$ between a lower bound with a penalty proportional
# to a "cumulative spread" $\sum_i\xi_i$ and an exponential upper bound. The prose, the proof sketch
# (Hoeffding, Markov, Cauchy–Schwarz, and $\|x_i-x_j\|^2\ge\delta^2$) and the fact that $\xi_i$
# measures how widely the other $N-1$ selected, rescaled embeddings spread around $x_i$ survive; **the
# formulas of $\xi_i$ and of both bounds do not**. Everything in this section is **our reconstruction**
# ({ref}`sources-theorem2`), implemented in `attn_utils.mathematics.theory.theorem2_xi` and `theorem2_bounds`.
#
# ```{prf:lemma} The spread $\xi_i$ bounds $X_i$ (our reconstruction)
# :label: ch3-lem-xi
# :nonumber:
#
# Under Assumptions 1–2, for every selected $i\in I_N$ let $S_1=\sum_{j\in I_N\setminus\{i\}}\alpha_j$,
# $S_2=\sum_{j\in I_N\setminus\{i\}}\alpha_j^2$ and
#
# $$
# \begin{aligned}
# \xi_i^2 &= M^2\!\!\sum_{j\in I_N\setminus\{i\}}\!\!\alpha_j^2
# +\Big(M^2-\frac{\delta^2}{2}\Big)\!\!\sum_{\substack{j\ne k\\ j,k\in I_N\setminus\{i\}}}\!\!\alpha_j\alpha_k\\
# &= M^2S_1^2-\frac{\delta^2}{2}\big(S_1^2-S_2\big).
# \end{aligned}
# $$
#
# Then, deterministically, $X_i=\|s-\alpha_i x_i\|_2\le\xi_i$, and more precisely
#
# $$
# X_i^2 \;=\; \xi_i^2-\frac12\!\!\sum_{\substack{j\ne k\\ j,k\in I_N\setminus\{i\}}}\!\!
# \alpha_j\alpha_k\big(\|x_j-x_k\|^2-\delta^2\big).
# $$
# ```
#
# ```{prf:proof}
# Expand the square of $X_i=\|\sum_{j\in I_N\setminus\{i\}}\alpha_j x_j\|$:
# $X_i^2=\sum_{j}\alpha_j^2\|x_j\|^2+\sum_{j\ne k}\alpha_j\alpha_k\langle x_j,x_k\rangle$, both sums over
# $I_N\setminus\{i\}$. By Assumption 1, $\|x_j\|^2=M^2$, and the polarization identity gives
# $\langle x_j,x_k\rangle=\tfrac12(\|x_j\|^2+\|x_k\|^2-\|x_j-x_k\|^2)=M^2-\tfrac12\|x_j-x_k\|^2$.
# Substituting, $X_i^2=M^2S_2+\sum_{j\ne k}\alpha_j\alpha_k(M^2-\tfrac12\|x_j-x_k\|^2)$, which is the
# identity above once $\tfrac12\delta^2$ is added and subtracted in each cross term. By Assumption 2
# every $\|x_j-x_k\|^2-\delta^2\ge0$, and every $\alpha_j\alpha_k\ge0$, so the subtracted sum is
# non-negative and $X_i^2\le\xi_i^2$. The second form of $\xi_i^2$ uses
# $\sum_{j\ne k}\alpha_j\alpha_k=S_1^2-S_2$.
# ```
#
# ````{admonition} How it is computed: the spread $\xi_i$ and the bounds of Theorem 2
# :class: dropdown
# The library's kernels behind `attn_utils.mathematics.theory.theorem2_xi` and `theorem2_bounds`:
# $\xi_i^2=M^2S_1^2-\tfrac{\delta^2}{2}(S_1^2-S_2)$ from leave-one-out sums, then the lower bound
# $1-\sum_i\xi_i/(Nr)$ and the exponential "upper bound".
#
# ```{literalinclude} ../attn_utils/mathematics/kernels.py
# :language: python
# :pyobject: xi_values
# ```
#
# ```{literalinclude} ../attn_utils/mathematics/kernels.py
# :language: python
# :pyobject: theorem2_selected
# ```
# ````
#
# The identity shows exactly how loose $\xi_i$ is: it replaces every pairwise distance among the
# selected tokens by the *smallest* pairwise distance of all $L$ tokens. In $d=64$, random points on the
# sphere are about $\sqrt2\,M$ apart while $\delta$ is their minimum; on a real model, where a few value
# vectors nearly coincide, $\delta$ is close to $0$ and $\xi_i$ is close to the trivial $M S_1$.
#
# ```{prf:theorem} Theorem 2, lower bound (our reconstruction; proven)
# :label: ch3-thm2-lower
# :nonumber:
#
# Under Assumptions 1–2, for every row with $r>0$,
#
# $$
# \frac{N_s}{N}\;\ge\;1-\frac{1}{N\,r}\sum_{i\in I_N}\xi_i .
# $$
#
# In particular the same bound holds for $\mathbb E[N_s]/N$ under any random model of the rows.
# ```
#
# ```{prf:proof}
# With the count of {prf:ref}`the boundary convention <ch3-rem-boundary>`, $N-N_s=\sum_{i\in I_N}\mathbf 1\{X_i\ge r\}$. For a
# non-negative number $X$ and $r>0$, $\mathbf 1\{X\ge r\}\le X/r$ (if $X\ge r$ the right side is at
# least $1$, otherwise the left side is $0$). Hence, by {prf:ref}`the spread lemma <ch3-lem-xi>`,
# $N-N_s\le\frac1r\sum_i X_i\le\frac1r\sum_i\xi_i$; divide by $N$. Taking expectations preserves the
# inequality. The paper's sketch reaches the same bound in expectation through Markov's inequality,
# $\Pr(X_i\ge r)\le\mathbb E X_i/r$, and Cauchy–Schwarz, $\mathbb E X_i\le(\mathbb E X_i^2)^{1/2}\le\xi_i$; the
# pointwise argument above is the same idea without the probability. The closed-ball count
# ($X_i\le r$) satisfies it too, since it is at least the open-ball count.
# ```
#
# The upper bound is a different matter.
#
# ```{prf:conjecture} Theorem 2, exponential "upper bound" (our reconstruction; false in general)
# :label: ch3-thm2-upper
# :nonumber:
#
# The paper states that, under Assumptions 1–2,
#
# $$
# \frac{\mathbb E[N_s]}{N}\;\le\;\frac1N\sum_{i\in I_N}\exp\!\Big(-\frac{(\xi_i-r)_+^2}{2M^2}\Big),
# $$
#
# where the constant $2M^2$ is our reconstruction of Hoeffding's inequality for one variable with range
# $[0,2M]$ {cite}`hoeffding1963probability` and $(\cdot)_+=\max(\cdot,0)$.
# ```
#
# **Why the Hoeffding step does not go through.** Hoeffding's inequality for a variable $X_i\in[0,2M]$
# bounds the chance of falling *below its mean*: for $r\le\mathbb E X_i$,
# $\Pr(X_i\le r)\le\exp(-(\mathbb E X_i-r)^2/(2M^2))$. To obtain the display one must replace the unknown
# mean $\mathbb E X_i$ by $\xi_i$. But {prf:ref}`the spread lemma <ch3-lem-xi>` says $\xi_i\ge X_i$, hence $\xi_i\ge\mathbb E X_i$:
# substituting a larger number for the mean makes the deviation $\xi_i-r$ larger and the right-hand side
# *smaller*, so the inequality is pushed in the wrong direction. A valid version would need a *lower*
# bound on $\mathbb E X_i$, which Assumptions 1–2 do not supply (and the radius $r$ is itself random,
# since it depends on the non-selected tokens). For a single fixed row nothing is random at all:
# $\mathbf 1\{X_i<r\}$ is $0$ or $1$, and $\xi_i>r$ says nothing about whether $X_i<r$. The next cell
# makes this concrete with the counterexample constructed in `theory.theorem2_upper_counterexample`.

# %%
cx = separability.counterexample()
table(separability.counterexample_table(cx), digits=4, caption="The counterexample to the 'upper bound'")

# %% tags=["remove-cell"]
glue_values({f"cx_{k}": cx[k] for k in separability.COUNTEREXAMPLE_ROWS})
glue_values({"cx_compare": "below the measured value" if cx["fails"] else "not below the measured value"})
claims.record("ch3-thm2-upper-counterexample", model="synthetic", **{k: cx[k] for k in (
    "N", "d", "M", "ratio", "upper", "r", "max_X", "min_xi")})

# %% [markdown]
# In this instance ({glue:text}`cx_N` selected keys on a ring in $d=$ {glue:text}`cx_d`, one
# non-selected key opposite them; $L=$ {glue:text}`cx_L`, $M=1$) every selected point is within
# $X_i\le$ {glue:text}`cx_max_X` of $s$ while the radius is $r=$ {glue:text}`cx_r`, so all of them
# count and $N_s/N=$ {glue:text}`cx_ratio`. The minimum distance of the ring is only
# $\delta=$ {glue:text}`cx_delta`, so $\xi_i\ge$ {glue:text}`cx_min_xi`, far above $r$, and the
# "upper bound" evaluates to {glue:text}`cx_upper`, {glue:text}`cx_compare`. The lower bound,
# {glue:text}`cx_lower`, holds, as it must.

# %% [markdown]
# (ch3-synthetic)=
# ## Synthetic verification
#
# For each $\sigma$ in `sigmas` we draw `n_trials` instances: $L$ embeddings uniform on the sphere of
# radius $M$ in $d=64$ (Assumptions 1–2 with $\delta$ the instance's minimum pairwise distance) and four
# query rows of softmax weights of $N(0,\sigma^2)$ logits, all in float64. For every $N$ of the grid and
# every row we measure $N_s/N$ (`metrics.separability`), both reconstructed bounds, and the largest gap
# $X_i-\xi_i$ over the selected keys. The pairwise distances of points on the sphere come from the
# Gram matrix, $\|x_i-x_j\|^2=2M^2-2\langle x_i,x_j\rangle$ (the tests check it against
# `metrics.min_pairwise_distance`). The pipeline is `separability.synthetic_rows`, one table row per
# $(\sigma,\text{instance},N,\text{query row})$.

# %%
syn = separability.synthetic_rows(L, Ns, sigmas, n_trials, M=M, seed=seed)
table(separability.synthetic_table(syn), caption="Theorem 2 on random spheres, per σ and N (means over rows)")

# %% tags=["hide-input"]
figures.glue_figure("fig_ch3_synthetic", separability.draw_synthetic(syn, L))

# %% tags=["remove-cell"]
syn_s = separability.synthetic_summary(syn)
glue_values({**{f"syn_{k}": v for k, v in syn_s.items() if k != "falls"}, "syn_instances": n_trials * len(sigmas),
             "syn_upper_pct": 100 * syn_s["upper_share"], "syn_vacuous_pct": 100 * syn_s["vacuous"]})
glue_values({"syn_falls": "keeps falling at every step of the grid" if syn_s["falls"]
             else "does not fall monotonically over the grid",
             "syn_plateau_note": "So a plateau, where a model shows one, comes from trained attention, not from the "
             "geometry of Assumptions 1–2." if syn_s["falls"] else "Whether it levels off here depends on the grid; "
             "see the table."})
setup = dict(rows=syn_s["rows"], sigmas=sigmas, trials=n_trials, L=L, Ns=Ns)
claims.record("ch3-thm2-xi-synthetic", model="synthetic", violations=syn_s["xi_violations"],
              max_gap=syn_s["max_xi_gap"], **setup)
claims.record("ch3-thm2-lower-synthetic", model="synthetic", violations=syn_s["lower_violations"],
              rows=syn_s["rows"], vacuous=syn_s["vacuous"])
claims.record("ch3-thm2-upper-synthetic", model="synthetic", violations=syn_s["upper_violations"],
              rows=syn_s["rows"], share=syn_s["upper_share"], excess=syn_s["upper_excess"])

# %% [markdown]
# ```{glue:figure} fig_ch3_synthetic
# ---
# name: fig-ch3-synthetic
# alt: >-
#   Two line plots against the top-N size N on a base-2 logarithmic axis, one colour per logit scale sigma.
#   Left, the measured separability fraction (solid) and the exponential upper bound (dashed); right, the proven
#   lower bound (dotted) with a horizontal line at zero.
# ---
# **Theorem 2 on random spheres** (synthetic data, no model): means over rows of the measured $N_s/N$ and of both
# reconstructed bounds, one colour per $\sigma$. Look at (a): wherever a dashed curve runs below the solid curve
# of the same colour, the "upper bound" fails on average; and at (b): below the zero line the lower bound says
# nothing.
# ```
#
# **Synthetic results** ({glue:text}`syn_rows` rows from {glue:text}`syn_instances` instances;
# {numref}`fig-ch3-synthetic` shows means over rows, the table above the per-$(\sigma,N)$ counts). The deterministic fact
# $X_i\le\xi_i$ of {prf:ref}`the spread lemma <ch3-lem-xi>` is violated in
# {glue:text}`syn_xi_violations` rows (largest $X_i-\xi_i$ = {glue:text}`syn_max_xi_gap`, rounding),
# and the proven lower bound in {glue:text}`syn_lower_violations` rows. The lower bound is, however,
# negative and therefore says nothing in {glue:text}`syn_vacuous_pct` % of the rows with $N>1$: the
# minimum distances $\delta$ of these instances (from {glue:text}`syn_delta_min` to
# {glue:text}`syn_delta_max`) are well below the typical distance $\sqrt2 M$ that the selected points
# actually keep. The exponential "upper bound" is violated in {glue:text}`syn_upper_violations` rows
# ({glue:text}`syn_upper_pct` %), by at most {glue:text}`syn_upper_excess`; the worst case, at
# $N=$ {glue:text}`syn_worst_N` and $\sigma=$ {glue:text}`syn_worst_sigma`, measures
# $N_s/N=$ {glue:text}`syn_worst_ratio` against a "bound" of {glue:text}`syn_worst_upper`. The excesses
# are small here, but they occur on the paper's own idealized model, not only on a constructed row.
#
# On random spheres the fraction itself, averaged over $\sigma$ and rows, {glue:text}`syn_falls`, from
# {glue:text}`syn_ratio_first` at $N=$ {glue:text}`syn_N_first` to {glue:text}`syn_ratio_last` at
# $N=$ {glue:text}`syn_N_last` (the same trend appears in any synthetic check of this kind: the plateau
# is a claim about the pretrained model, not about random spheres).
# {glue:text}`syn_plateau_note`

# %% [markdown]
# ## The experiment: separability on a pretrained model (the paper's Figure 3)
#
# We run the paper's Algorithm 4 (`algorithms.separability_vs_n`) on every layer and head: the
# per-head `vectors` of the window (value vectors by default; the paper does not say which vectors it
# used) are projected onto the sphere of radius $M$, $\delta$ is their minimum pairwise distance per
# head, and for every query row and every $N$ of the grid the row's $r$, $N_s/N$ and both bounds are
# computed and averaged over the rows of the head. A row's keys are the keys the model lets it see
# (`Session.visible`): on a causal model row $t$ sees $t$ keys, on an encoder every row sees all $L$;
# rows that see no more than $N$ keys are skipped.

# %%
session = Session.open(p)
captured = session.capture(what=("weights", VECTOR_FIELD[vectors]))
x_model = session.vectors(captured, vectors)                 # (layers, heads, L, d_head)
visible = session.visible()  # (L, L): the keys each row sees, the same in every layer measured
with runlog.timing("Algorithm 4"):  # the reproducibility chapter sets this time beside the paper's Table 1
    sep = algorithms.separability_vs_n(captured.weights, x_model, Ns=Ns, M=M, mask=visible, progress=False)
table(separability.per_n_table(sep), caption=f"Per-head mean Nₛ/N over the heads of {session.name}, per N")

# %% tags=["remove-cell"]
recorded = {r["algorithm"]: r["seconds"] for r in runlog.read("timings") if r["notebook"] == runlog.notebook()}
glue_values({"alg4_seconds": recorded["Algorithm 4"],
             "measured_text": separability.measured_text(session.name, session.causal, session.L, session.layers_note)})

# %% [markdown]
# **How this model is measured.** {glue:text}`measured_text` Algorithm 4, the row-by-row check below and
# {numref}`fig-ch3-figure3` all use these keys, so no claim of this section reads a row's length inside one causal
# window: they are comparable on an encoder too.
#
# Each row of the table summarizes the heads at one $N$: the per-head means of $N_s/N$ (smallest, median,
# largest) and the means over heads of both bounds. Algorithm 4 took {glue:text}`alg4_seconds` s in this run
# (every head, every $N$ of the grid; the time recorded for the run, which {doc}`ch5_reproducibility` sets beside
# the paper's Table 1).
#
# (ch3-model-rows)=
# ### Row by row: do the bounds hold on the model?
#
# Algorithm 4 returns per-head means. The lower bound is a statement about every single row, so we also
# check it row by row on every {glue:text}`row_stride`-th query row of every head, with the same
# per-head $\delta$. The float32 weights of a row are renormalized in float64 (a change below
# $10^{-6}$) and a violation must exceed $10^{-9}$.

# %%
rowwise = separability.model_rowwise(captured.weights, x_model, separability.head_deltas(sep), Ns, M=M,
                                     stride=separability.ROW_STRIDE, mask=visible)
table(separability.rowwise_table(rowwise), caption="Theorem 2 row by row on the model")

# %% [markdown]
# (ch3-figure3)=
# ### The paper's Figure 3
#
# Per $N$, the distribution over heads of the per-head mean fraction, with the means over heads of both
# bounds and the largest head ({numref}`fig-ch3-figure3`).

# %% tags=["hide-input"]
figures.glue_figure("fig_ch3_figure3", separability.draw_figure3(sep, session.name, vectors, M))

# %% tags=["remove-cell"]
fig3, rows_s = separability.figure3_summary(sep), separability.rowwise_summary(rowwise)
n_layers, n_heads, L_win = captured.weights.shape[0], captured.weights.shape[1], captured.weights.shape[-1]
first = min(1, len(fig3["grid"]) - 1)
glue_values({"model_name": session.name, "n_layers": n_layers, "n_heads": n_heads, "L_win": L_win,
             "n_heads_total": n_layers * n_heads, "vectors_used": vectors, "M_used": M,
             "row_stride": separability.ROW_STRIDE, "plateau_tol": separability.PLATEAU_TOL,
             **{f"model_{k}": v for k, v in rows_s.items()}, "model_upper_pct": 100 * rows_s["upper_share"],
             "model_vacuous_pct": 100 * rows_s["vacuous"], **separability.figure3_prose(fig3),
             "model_N_first": fig3["grid"][first], "model_med_first": fig3["medians"][first],
             "model_N_last": fig3["grid"][-1], "model_med_last": fig3["medians"][-1],
             **{k: fig3[k] for k in ("plateau_median", "track_gap", "upper_min", "late_N", "late_max",
                                     "delta_median")}, "late_pct": 100 * fig3["late_share"]}, digits=2)

# %% tags=["remove-cell"]
verdicts = {
    "decline": claims.record("ch3-fig3-decline", model=session.name,
                             **{k: fig3[k] for k in ("grid", "medians", "stop", "drop")}),
    "plateau": claims.record("ch3-fig3-plateau", model=session.name,
                             **{k: fig3[k] for k in ("stop", "plateau_from", "plateau_median")}),
    "track": claims.record("ch3-fig3-upper-tracks-max", model=session.name, gap=fig3["track_gap"]),
    "cap": claims.record("ch3-four-fifths-cap", model=session.name,
                         **{k: fig3[k] for k in ("late_N", "late_max", "late_share")}),
    "model_lower": claims.record("ch3-thm2-lower-model", model=session.name, violations=rows_s["lower_violations"],
                                 rows=rows_s["rows"], stride=separability.ROW_STRIDE, Ns=Ns),
    "model_upper": claims.record("ch3-thm2-upper-model", model=session.name, violations=rows_s["upper_violations"],
                                 rows=rows_s["rows"], share=rows_s["upper_share"]),
}
glue_values({f"{name}_verdict": claim.verdict for name, claim in verdicts.items()})

# %% [markdown]
# ```{glue:figure} fig_ch3_figure3
# ---
# name: fig-ch3-figure3
# alt: >-
#   Box plots of the per-head separability fraction against the top-N size N, one green box per N, with a
#   red line for the mean exponential upper bound, a blue line for the mean lower bound, black triangles for the
#   largest head and a grey horizontal band between 0.70 and 0.85.
# ---
# **The paper's Figure 3, measured on {glue:text}`model_name`.** Green boxes: for each $N$, the distribution over
# the {glue:text}`n_heads_total` heads ({glue:text}`n_layers` layers × {glue:text}`n_heads` heads) of the mean
# fraction $N_s/N$ over the rows of the head; window of {glue:text}`L_win` tokens, $x_i$ = per-head
# {glue:text}`vectors_used` vectors projected onto the sphere of radius $M=$ {glue:text}`M_used`, $\delta$ = the
# minimum pairwise distance per head, weights as the model computes them. Red: mean over heads of the exponential
# "upper bound"; blue: mean of the proven lower bound; black triangles: the largest head. Look at where the boxes
# settle against the grey band, the range the paper reports for GPT-2. The paper draws the same kind of figure:
# green boxes of $N_s/N$ over its 144 heads against $N$, compared with both bounds, the boxes levelling off
# inside that band after a decline up to $N\approx16$.
# ```
#
# **Comparison with the paper** (its Figure 3 and the numbers of its text).
#
# * *Decline, then saturation at $N\approx16$.* The medians over heads are {glue:text}`medians_text`.
#   Our rule for "the decline stops": the smallest $N>1$ of the grid after which the median moves by at
#   most {glue:text}`plateau_tol`. Here {glue:text}`stop_text`. Verdict: **{glue:text}`decline_verdict`**.
# * *Plateau between 0.70 and 0.85.* The median over heads at the plateau is
#   {glue:text}`plateau_median`. Verdict: **{glue:text}`plateau_verdict`**.
# * *The upper bound tracks the maxima.* The mean "upper bound" and the largest head differ by at most
#   {glue:text}`track_gap` (over $N>1$). Verdict: **{glue:text}`track_verdict`**. Agreement here is weak
#   evidence for the formula, which is not a bound: its mean never drops below {glue:text}`upper_min`,
#   so it can only "track" heads whose fraction is close to 1.
# * *No more than about four-fifths.* For $N\ge$ {glue:text}`late_N` the best head still separates
#   {glue:text}`late_max` on average, and {glue:text}`late_pct` % of the (layer, head, $N$) values exceed
#   0.85. Verdict: **{glue:text}`cap_verdict`**.
# * *The bounds row by row.* On {glue:text}`model_rows` rows, the proven lower bound is violated
#   {glue:text}`model_lower_violations` times, and it is negative (vacuous) on {glue:text}`model_vacuous_pct` %
#   of the rows with $N>1$. The exponential "upper bound" is violated on {glue:text}`model_upper_violations`
#   rows ({glue:text}`model_upper_pct` %), as the counterexample predicts is possible.
#
# Assumption 2 is nearly empty on real vectors: the median over heads of $\delta$ is
# {glue:text}`delta_median` times $M$ (random points of a 64-dimensional sphere are about $1.4\,M$
# apart), and {glue:text}`zero_text`. In a model with rotary position embeddings this happens in the
# first layer whenever a token occurs twice in the window: the rotation acts on queries and keys only,
# so the two occurrences have the same value vector. With $\delta=0$ the lemma and the lower bound remain
# true but reduce to the triangle inequality, $X_i\le M S_1$.

# %% [markdown]
# (ch3-heads)=
# ## Several heads: the coverage arithmetic of the Discussion
#
# The paper's Discussion turns a per-head fraction into a multi-head one: if each of $H$ heads separates
# a fraction $p$ of the selected tokens **and the heads fail independently**, a token is missed by all of
# them with probability $(1-p)^H$, so the heads together cover $1-(1-p)^H$. This is arithmetic, not a
# theorem about attention: independence is an assumption, and a later chapter tests it.

# %%
coverage, H = theory.multihead_coverage(0.8, 3), theory.heads_for_coverage(0.8, 0.99)
p_ours = min(max(fig3["plateau_median"], 1e-6), 1.0)  # our plateau median as the per-head fraction
H_ours = theory.heads_for_coverage(p_ours, 0.99)
table(separability.coverage_table({"p = 0.8": 0.8, f"p = {p_ours:.2f} (ours)": p_ours}, H_max=6), digits=4,
      caption="Coverage 1 − (1 − p)^H of H independent heads")

# %% tags=["remove-cell"]
glue_values({"cov_3": coverage, "cov_H": H, "cov_ours_p": p_ours, "cov_ours_H": H_ours})
claims.record("ch3-multihead-coverage", model="synthetic", coverage=coverage, H=H, p_ours=p_ours,
              measured_on=session.name, H_ours=H_ours)

# %% [markdown]
# With $p=0.8$, three heads cover $1-0.2^3=$ {glue:text}`cov_3`, and $H=$ {glue:text}`cov_H` is the
# smallest number reaching 99 %, as the paper says. With the plateau median measured above,
# $p=$ {glue:text}`cov_ours_p`, the same arithmetic asks for $H=$ {glue:text}`cov_ours_H` heads — if
# they were independent.
#
# ## The same claims on every model
#
# Does a verdict of this chapter belong to the paper or to the model it was measured on? The build executes
# the chapter on each of its models, which differ in ways that could matter (training, quantisation,
# positions, key/value sharing, sliding windows, an encoder's bidirectional attention: see
# {doc}`ch0_setting`). Each reads the same passage; a model whose context is shorter than the window reads
# as much of it as fits.
#
# ```{include} ../_models/ch3_separability.md
# ```
#
# ## Key takeaways
#
# * **The definition is easy to compute.** A selected token is distinguishable when its weight-rescaled
#   vector $\alpha_i x_i$ is strictly closer to the context vector $s$ than every non-selected one; in the
#   2-D example {glue:text}`fig1_Ns` of {glue:text}`fig1_N` are.
# * **Half of Theorem 2 is a theorem.** The spread lemma $X_i\le\xi_i$ and the lower bound held on all
#   {glue:text}`syn_rows` synthetic rows ({glue:text}`syn_xi_violations` and {glue:text}`syn_lower_violations`
#   violations) and on all {glue:text}`model_rows` model rows ({glue:text}`model_lower_violations` violations);
#   but the bound is weak: negative, hence empty, in {glue:text}`syn_vacuous_pct` % of the synthetic and
#   {glue:text}`model_vacuous_pct` % of the model rows with $N>1$, because the minimum separation $\delta$
#   is small.
# * **The exponential "upper bound" is not a bound.** A constructed row measures $N_s/N=$ {glue:text}`cx_ratio`
#   against a "bound" of {glue:text}`cx_upper`, and the formula is violated in {glue:text}`syn_upper_pct` % of
#   the random-sphere rows and {glue:text}`model_upper_pct` % of the model rows we checked.
# * **The measurement.** On {glue:text}`model_name` the median fraction over heads goes from
#   {glue:text}`model_med_first` at $N=$ {glue:text}`model_N_first` to {glue:text}`model_med_last` at
#   $N=$ {glue:text}`model_N_last`, so a head separates only part of what it selects, as the paper says. The
#   paper's "decline until $N\approx16$" is **{glue:text}`decline_verdict`** here, its "plateau at 70–85 %"
#   **{glue:text}`plateau_verdict`**, its "no more than four-fifths" **{glue:text}`cap_verdict`**. On random
#   spheres the mean fraction {glue:text}`syn_falls`.
# * **Several heads.** With $p=0.8$ per head, $H=$ {glue:text}`cov_H` heads cover 99 % of the selected tokens;
#   with our measured $p=$ {glue:text}`cov_ours_p`, $H=$ {glue:text}`cov_ours_H` — if the heads failed
#   independently, which is an assumption, not a result.
#
# ## Provenance

# %%
session.provenance_table()

# %% [markdown]
# ## Exercises
#
# ```{exercise} ch3-ex1: When is the spread exact?
# :label: ch3-ex1
# :nonumber:
#
# Let $\|x_j\|=M$ for all $j$ and $\|x_j-x_k\|\ge\delta$ for $j\ne k$, and let $i\in I_N$.
#
# 1. Without looking at the proof of {prf:ref}`the spread lemma <ch3-lem-xi>`, show that
#    $\|s-\alpha_i x_i\|_2\le\xi_i$.
# 2. Show that $\xi_i\le M\sum_{j\in I_N\setminus\{i\}}\alpha_j$, with equality when $\delta=0$ or $N\le2$.
# 3. Show that $\|s-\alpha_i x_i\|=\xi_i$ if and only if every pair $j\ne k$ of $I_N\setminus\{i\}$ with
#    positive weights is at distance exactly $\delta$. Why does this make the lower bound of
#    {prf:ref}`the lower bound of Theorem 2 <ch3-thm2-lower>` weak for random points in high dimension?
# ```
#
# ```{solution-start} ch3-ex1
# :class: dropdown
# ```
#
# 1. Write $X_i^2=\|\sum_{j\ne i}\alpha_jx_j\|^2=\sum_j\alpha_j^2M^2+\sum_{j\ne k}\alpha_j\alpha_k\langle x_j,x_k\rangle$
#    (all indices in $I_N\setminus\{i\}$). Since $\|x_j-x_k\|^2=2M^2-2\langle x_j,x_k\rangle\ge\delta^2$, each
#    inner product is at most $M^2-\delta^2/2$, and the coefficients $\alpha_j\alpha_k$ are non-negative,
#    so $X_i^2\le M^2\sum_j\alpha_j^2+(M^2-\delta^2/2)\sum_{j\ne k}\alpha_j\alpha_k=\xi_i^2$.
# 2. $\xi_i^2=M^2S_1^2-\frac{\delta^2}{2}(S_1^2-S_2)$ and $S_1^2-S_2=\sum_{j\ne k}\alpha_j\alpha_k\ge0$, so
#    $\xi_i\le MS_1$. Equality needs $\delta=0$ or $S_1^2=S_2$; the latter holds when
#    $I_N\setminus\{i\}$ has at most one element, i.e. $N\le2$ (then also $X_i=\alpha_jM=\xi_i$).
# 3. From the identity of {prf:ref}`the spread lemma <ch3-lem-xi>`,
#    $\xi_i^2-X_i^2=\frac12\sum_{j\ne k}\alpha_j\alpha_k(\|x_j-x_k\|^2-\delta^2)$, a sum of non-negative
#    terms; it vanishes iff each term does, i.e. iff every pair with $\alpha_j\alpha_k>0$ is at distance
#    $\delta$. Random points on a high-dimensional sphere are almost all about $\sqrt2M$ apart, while
#    $\delta$ is the *minimum* over all $\binom L2$ pairs, so most terms are large and $\xi_i$ exceeds $X_i$
#    by a wide margin; the penalty $\sum_i\xi_i/(Nr)$ then exceeds 1 and the bound becomes negative.
#
# ```{solution-end}
# ```
#
# ```{exercise} ch3-ex2: Count $N_s$ by hand
# :label: ch3-ex2
# :nonumber:
#
# Write a function `separability_by_loop(weights_row, x, n_top)` that projects the vectors $x_i$ of
# one row onto the unit sphere and then, with explicit Python loops over the keys, computes the top-$N$
# set (ties to the earlier key), $s$, the radius $r=\min_{j\notin I_N}\|s-\alpha_jx_j\|$ and
# $N_s=\#\{i\in I_N:\|s-\alpha_ix_i\|<r\}$, and returns $(N_s, r)$. Try it on one row of softmax
# weights (logits from $N(0,1)$) over $L=50$ random vectors in $\R^{16}$ with $N=8$: compare $N_s/N$
# and $r$ with `attn_utils.mathematics.metrics.separability`, and check the lower bound of
# {prf:ref}`the lower bound of Theorem 2 <ch3-thm2-lower>` with `attn_utils.mathematics.theory.theorem2_bounds`.
# ```
#
# ```{solution-start} ch3-ex2
# :class: dropdown
# ```

# %% tags=["solution"]
def separability_by_loop(weights_row, x, n_top):
    """(N_s, r) of one row, the x_i projected onto the unit sphere, with plain Python loops."""
    L = len(weights_row)
    points = [weights_row[i] * x[i] / x[i].norm() for i in range(L)]   # alpha_i x_i on the sphere
    top = sorted(range(L), key=lambda i: (-float(weights_row[i]), i))[:n_top]  # ties: lower index first
    s = sum(points[i] for i in top)
    r = min(float((s - points[j]).norm()) for j in range(L) if j not in top)
    n_s = sum(1 for i in top if float((s - points[i]).norm()) < r)
    return n_s, r


g = torch.Generator().manual_seed(seed)
x_ex = torch.randn(50, 16, generator=g, dtype=F64)
w_ex = torch.softmax(torch.randn(50, generator=g, dtype=F64), dim=-1)
N_ex = 8
Ns_ex, r_ex = separability_by_loop(w_ex, x_ex, N_ex)
ratio_lib, r_lib = metrics.separability(w_ex[None], x_ex, N_ex)
assert Ns_ex / N_ex == float(ratio_lib[0]) and abs(r_ex - float(r_lib[0])) < 1e-12
sel_ex, _ = metrics.top_n_mask(w_ex[None], N_ex)
delta_ex = float(metrics.min_pairwise_distance(metrics.project_to_sphere(x_ex)))
lower_ex = float(theory.theorem2_bounds(w_ex[None], sel_ex, r_lib, 1.0, delta_ex).lower[0])
assert Ns_ex / N_ex >= lower_ex
print(f"N_s = {Ns_ex} of N = {N_ex}, r = {r_ex:.4f}; library: {float(ratio_lib[0]):.3f}; lower bound {lower_ex:.3f}")

# %% [markdown]
# ```{solution-end}
# ```

# %% tags=["exercise-check"]
from attn_utils.classroom import exercises

exercises.check("ch3-ex2", separability_by_loop)
