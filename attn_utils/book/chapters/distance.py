"""Chapter 2, the distance bound (Theorem 1, Corollary 2, Figure 2): the machinery behind ``notebooks/ch2_distance``.

The objects (paper, Section 3, Eqs. (7)-(8), Algorithms 1-3). One query row has weights alpha_1..alpha_L and
vectors x_1..x_L; I_N is its top-N set, abar_N = sum_{j in I_N} alpha_j, s = sum_{j in I_N} alpha_j x_j, and the
cumulative distance of Eq. (7) is, in our reading, d~ = sum_{i not in I_N} ||alpha_i x_i - s|| (sum of norms; the
norm of the sum is the alternative). Theorem 1 (fixed set, our completion of a truncated formula) bounds it by
(1 - abar_N) d_1 + max_{j in I} ||x_j|| (abar_N (L - N) - (1 - abar_N)); Theorem 1 (random set, Eq. (8), our
reconstruction) writes E_I[d~] = E + eps with the main sum
E = ((L - N)/L) sum_i ||alpha_i x_i - (N/(L - 1)) sum_{j != i} alpha_j x_j|| and a Jensen residual eps >= 0;
Corollary 2 bounds E in the two regimes N << L and N -> L. The formulas live in ``attn_utils.mathematics``
(``theory``, ``metrics``, ``algorithms``); this module draws the chapter's synthetic instances, runs the checks
and the paper's Algorithms 1-3 on a captured model, summarises them, and draws the figures.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.ticker import NullLocator
import numpy as np
import pandas as pd
import seaborn as sns
import torch

from attn_utils.book import figures, runlog
from attn_utils.book.formatting import fmt
from attn_utils.book.session import VECTOR_FIELD
from attn_utils.mathematics import algorithms, metrics, theory
from attn_utils.mathematics.fitting import loglog_slope

F64 = torch.float64
FAMILIES = ("generic", "tied weights", "one dominant weight", "L = N + 1", "equal vectors", "antipodal (extremal)")
SYNTHETIC_LENGTHS = (2, 3, 5, 8, 16, 33, 64, 128)  # row lengths of the fixed-set check
DIM = 8                  # dimension of the synthetic vectors
LOGIT_SCALE = 5.0        # generic logits: sigma * z, z standard normal, sigma uniform on [0, LOGIT_SCALE]
HOT = 30.0               # the logit boost of the dominant key
TOL = 1e-9               # relative slack allowed to rounding when an inequality is checked
EXACT_LENGTHS = (4, 7, 10)                 # rows short enough to enumerate every N-subset
EXACT_FAMILIES = ("generic", "tied weights", "one dominant weight")
CLOSED_LENGTHS = MC_LENGTHS = (64, 256)    # closed forms (N = 1, L - 1) and Monte Carlo
REPS = 8                 # independent Monte-Carlo batches, for a standard error
Z_MAX = 4                # a main sum more than Z_MAX standard errors above the estimate counts as a violation
COR_LENGTHS = (8, 64, 512, 4096, 32768)    # Corollary 2 (i): N = COR_N and growing L
COR_ROWS, COR_L2, COR_N = 32, 64, 5        # rows per length; Corollary 2 (ii) at L = COR_L2, N = 1..L-1
# the grid of panel (c) besides floor(0.06 L) and L - 1, as fractions of L
CRITICAL_FRACTIONS = (1 / 64, 1 / 32, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8, 11 / 16, 3 / 4, 13 / 16, 7 / 8, 15 / 16)
QUANTITIES = {"distance": "true distance", "expectation": "main sum E", "bound": "bound"}
# the paper's Figure 2 draws the true distance green, its expectation blue and the bound red: the same hues here
QUANTITY_COLOURS = dict(zip(QUANTITIES.values(), (sns.color_palette(figures.PALETTE)[i] for i in (2, 0, 3))))
TIMED = ("Algorithms 1-2", "Algorithm 3")   # the run-record names under which figure2 times the paper's algorithms
QUICK_ROWS_PER_OCTAVE = 32  # the row sample that sampling_checks measures when the run itself evaluates every row


def one_thread(fn):
    """Run ``fn`` with one torch thread: the checks are many small tensor operations, and on a shared machine
    extra threads spin against each other and slow them down several-fold."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)
    return wrapper


# --- synthetic instances ---------------------------------------------------------------------------------


def _randn(generator: torch.Generator, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=F64)


def top_sizes(family: str, length: int) -> list[int]:
    """The N tested for a row length: 1, L/4, L/2 and L - 1 (only L - 1 in the family "L = N + 1")."""
    if family == "L = N + 1":
        return [length - 1]
    return sorted({n for n in (1, length // 4, length // 2, length - 1) if 1 <= n <= length - 1})


def make_batch(family: str, length: int, n_top: int, batch: int, generator: torch.Generator,
               logit_scale: float = LOGIT_SCALE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of synthetic rows of one family: weights (batch, 1, L), vectors (batch, L, DIM), top-N mask
    (batch, 1, L).

    generic: logits sigma z (z standard normal, sigma uniform on [0, logit_scale]), vectors Gaussian with a random
    scale and a random common offset; tied weights: all weights equal; one dominant weight: one logit raised by
    HOT; equal vectors: all x_i equal (d_1 = 0); antipodal: after the top-N set is chosen, its vectors are a unit
    vector e and all others -e (the bound of Theorem 1 is attained). All draws come from ``generator``.
    """
    logits = _randn(generator, batch, 1, length) * logit_scale * torch.rand(batch, 1, 1, generator=generator, dtype=F64)
    if family == "tied weights":
        logits = torch.zeros(batch, 1, length, dtype=F64)
    if family == "one dominant weight":
        hot = torch.randint(length, (batch,), generator=generator)
        logits[torch.arange(batch), 0, hot] += HOT
    w = torch.softmax(logits, -1)
    x = _randn(generator, batch, length, DIM) * torch.exp(_randn(generator, batch, 1, 1)) \
        + 2 * _randn(generator, batch, 1, DIM) * torch.rand(batch, 1, 1, generator=generator, dtype=F64)
    if family == "equal vectors":
        x = _randn(generator, batch, 1, DIM).expand(batch, length, DIM).clone()
    selected = metrics.top_n_mask(w, n_top)[0]
    if family == "antipodal (extremal)":
        e = torch.zeros(DIM, dtype=F64)
        e[0] = 1.0
        x = torch.where(selected[:, 0, :, None], e, -e)
    return w, x, selected


# --- Theorem 1, fixed top-N set --------------------------------------------------------------------------


@one_thread
def fixed_set_instances(n_trials: int, generator: torch.Generator) -> pd.DataFrame:
    """One row per synthetic instance (about ``n_trials``, spread over families, lengths and N): the bound of
    Theorem 1 (fixed set), the same with a square root over its last factor, d~ in both readings, whether each
    exceeds the bound by more than a relative TOL, and the ratios d~ / bound."""
    configs = [(f, n, k) for f in FAMILIES for n in SYNTHETIC_LENGTHS for k in top_sizes(f, n)]
    per_config = math.ceil(n_trials / len(configs))
    frames = []
    for family, length, n_top in configs:
        w, x, sel = make_batch(family, length, n_top, per_config, generator)
        bound = theory.theorem1_fixed_bound(w, x, sel)[:, 0]
        abar = (w * sel).sum(-1)[:, 0]
        factor = abar * (length - n_top) - (1 - abar)
        largest = torch.where(sel[:, 0], x.norm(dim=-1), 0.0).amax(-1)
        frames.append(pd.DataFrame({
            "family": family, "L": length, "N": n_top, "bound": bound.cpu().numpy(),
            "sqrt_bound": (bound - largest * factor + largest * factor.clamp_min(0).sqrt()).cpu().numpy(),
            "sum_of_norms": metrics.cumulative_distance(w, x, sel)[:, 0].cpu().numpy(),
            "norm_of_sum": metrics.cumulative_distance(w, x, sel, reading="norm_of_sum")[:, 0].cpu().numpy()}))
    fixed = pd.concat(frames, ignore_index=True)
    slack = TOL * (1 + fixed["bound"].abs())
    positive = fixed["bound"].where(fixed["bound"] > 0, 1.0)
    for reading in ("sum_of_norms", "norm_of_sum"):
        fixed[f"violates ({reading})"] = fixed[reading] > fixed["bound"] + slack
        fixed[f"ratio ({reading})"] = np.where(fixed["bound"] > 0, fixed[reading] / positive, 0.0)
    fixed["violates sqrt form"] = fixed["sum_of_norms"] > fixed["sqrt_bound"] + slack
    return fixed


def fixed_set_summary(fixed: pd.DataFrame) -> pd.DataFrame:
    """Per family: instances, violations of the bound in each reading, the largest and median ratio d~ / bound,
    and the violations of the square-root form."""
    return fixed.groupby("family", sort=False).agg(
        instances=("bound", "size"),
        **{"violations, sum of norms": ("violates (sum_of_norms)", "sum"),
           "violations, norm of sum": ("violates (norm_of_sum)", "sum"),
           "largest ratio d~/bound": ("ratio (sum_of_norms)", "max"),
           "median ratio d~/bound": ("ratio (sum_of_norms)", "median"),
           "violations of the sqrt form": ("violates sqrt form", "sum")})


def hypothesis_counterexample() -> dict:
    """The hypothesis abar_N >= alpha_i cannot be dropped: L = 2, N = 1, alpha = (0.1, 0.9), I = {first key},
    x_1 = x_2 = e. Returns d~, the formula's value and whether ``theory.theorem1_fixed_bound`` refuses the set."""
    w = torch.tensor([[0.1, 0.9]], dtype=F64)
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=F64)
    selected = torch.tensor([[True, False]])
    abar, d1, largest = 0.1, 0.0, 1.0
    try:
        theory.theorem1_fixed_bound(w, x, selected)
        refused = False
    except ValueError:
        refused = True
    return {"distance": float(metrics.cumulative_distance(w, x, selected)[0]),
            "formula": (1 - abar) * d1 + largest * (abar * 1 - (1 - abar)), "refused": refused}


def fixed_set_facts(fixed: pd.DataFrame) -> dict:
    """The numbers the chapter states about the fixed-set check (``s_...`` names for the prose)."""
    extremal = fixed["family"] == "antipodal (extremal)"
    bad = hypothesis_counterexample()
    return {
        "s_fixed_n": len(fixed),
        "s_fixed_viol_son": int(fixed["violates (sum_of_norms)"].sum()),
        "s_fixed_viol_nos": int(fixed["violates (norm_of_sum)"].sum()),
        "s_fixed_tight_generic": 1 - float(fixed.loc[fixed["family"] == "generic", "ratio (sum_of_norms)"].max()),
        "s_fixed_tight_extremal": float((fixed.loc[extremal, "ratio (sum_of_norms)"] - 1).abs().max()),
        "s_fixed_tight_equal": float((fixed.loc[fixed["family"] == "equal vectors", "ratio (sum_of_norms)"] - 1)
                                     .abs().median()),
        "s_fixed_sqrt_viol": int(fixed["violates sqrt form"].sum()),
        "s_fixed_sqrt_viol_extremal": int(fixed.loc[extremal, "violates sqrt form"].sum()),
        "s_fixed_sqrt_extremal_n": int(extremal.sum()),
        "s_bad_d": bad["distance"], "s_bad_bound": bad["formula"], "s_bad_refused": bad["refused"],
        "s_tol": TOL, "s_len_min": min(SYNTHETIC_LENGTHS), "s_len_max": max(SYNTHETIC_LENGTHS), "s_dim": DIM,
        "s_logit_scale": LOGIT_SCALE, "s_hot": HOT,
    }


def fixed_ratio_figure(fixed: pd.DataFrame) -> plt.Figure:
    """Box plots of d~ / bound per family, for both readings; the dashed line is the bound."""
    long = fixed.melt(id_vars=["family"], value_vars=["ratio (sum_of_norms)", "ratio (norm_of_sum)"],
                      var_name="reading", value_name="ratio")
    long["reading"] = long["reading"].str.extract(r"\((.*)\)")[0].str.replace("_", " ")
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    sns.boxplot(data=long, y="family", x="ratio", hue="reading", ax=ax, palette=figures.PALETTE, fliersize=1.5,
                order=list(FAMILIES))
    ax.axvline(1.0, color="black", ls="--", lw=1)
    ax.set(xlabel=r"$\tilde d\,/\,$bound of Theorem 1 (fixed set)", ylabel="")
    sns.move_legend(ax, "lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False, fontsize="small")
    figures.model_title(fig, f"Theorem 1 (fixed top-N set) on {len(fixed):,} random instances",
                        "synthetic data, no model")
    return fig


# --- Theorem 1, random N-set, and Corollary 2 -----------------------------------------------------------


def closed_form_expectations(w: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact E_I[d~] for N = 1 and N = L - 1 of rows w (B, 1, L), x (B, L, d): with a_i = alpha_i x_i and
    m = sum_i a_i, (1/L) sum_k sum_{i != k} ||a_i - a_k|| and (1/L) sum_k ||2 a_k - m||."""
    a = w[:, 0, :, None] * x
    m = a.sum(1, keepdim=True)
    return torch.cdist(a, a).sum(-1).mean(-1), (2 * a - m).norm(dim=-1).mean(-1)


@one_thread
def random_set_checks(n_trials: int, n_samples: int, generator: torch.Generator
                      ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The main sum E of Theorem 1 (random set) against the exact expectation, three ways.

    ``exact``: every N of short rows (EXACT_LENGTHS), E[d~] by enumerating all C(L, N) subsets
    (``theory.theorem1_random_expectation_exact``), with the residual eps = E[d~] - E; ``closed``: N = 1 and
    L - 1 at CLOSED_LENGTHS by :func:`closed_form_expectations`; ``mc``: the Monte-Carlo estimate
    ``metrics.expected_distance_mc`` in REPS batches (``n_samples`` draws in all), with its standard error and
    z = (E - estimate) / s.e. (moderately concentrated weights: standard normal logits)."""
    per_family = max(4, n_trials // 250)
    rows = []
    for length in EXACT_LENGTHS:
        for family in EXACT_FAMILIES:
            w, x, _ = make_batch(family, length, 1, per_family, generator)
            for n_top in range(1, length):
                main = theory.theorem1_random_main_sum(w, x, n_top)[:, 0]
                rows += [{"family": family, "L": length, "N": n_top, "instance": b, "main sum": float(main[b]),
                          "exact": float(theory.theorem1_random_expectation_exact(w[b, 0], x[b], n_top))}
                         for b in range(per_family)]
    exact = pd.DataFrame(rows)
    exact["residual"] = exact["exact"] - exact["main sum"]
    exact["relative residual"] = exact["residual"] / exact["exact"].where(exact["exact"] > 0)
    exact["N / L"] = exact["N"] / exact["L"]
    frames = []
    for length in CLOSED_LENGTHS:
        for family in EXACT_FAMILIES:
            w, x, _ = make_batch(family, length, 1, 16, generator)
            for n_top, value in zip((1, length - 1), closed_form_expectations(w, x)):
                main = theory.theorem1_random_main_sum(w, x, n_top)[:, 0]
                frames.append(pd.DataFrame({"family": family, "L": length, "N": n_top, "exact": value.cpu().numpy(),
                                            "main sum": main.cpu().numpy()}))
    closed = pd.concat(frames, ignore_index=True)
    frames = []
    for length in MC_LENGTHS:
        w, x, _ = make_batch("generic", length, 1, 16, generator, logit_scale=1.0)
        for n_top in sorted({1, 5, length // 4, length - 1}):
            main = theory.theorem1_random_main_sum(w, x, n_top)[:, 0]
            reps = torch.stack([metrics.expected_distance_mc(w, x, n_top, n_samples=max(1, n_samples // REPS),
                                                              generator=generator)[:, 0] for _ in range(REPS)])
            frames.append(pd.DataFrame({"L": length, "N": n_top, "main sum": main.cpu().numpy(),
                                        "Monte Carlo": reps.mean(0).cpu().numpy(),
                                        "standard error": (reps.std(0) / math.sqrt(REPS)).cpu().numpy()}))
    mc = pd.concat(frames, ignore_index=True)
    mc["z"] = (mc["main sum"] - mc["Monte Carlo"]) / mc["standard error"].where(mc["standard error"] > 0)
    return exact, closed, mc


def monte_carlo_summary(mc: pd.DataFrame) -> pd.DataFrame:
    """Per (L, N): mean main sum, mean Monte-Carlo estimate and the largest z."""
    return mc.groupby(["L", "N"]).agg(**{"main sum (mean)": ("main sum", "mean"),
                                         "Monte Carlo (mean)": ("Monte Carlo", "mean"), "largest z": ("z", "max")})


def random_set_facts(exact: pd.DataFrame, closed: pd.DataFrame, mc: pd.DataFrame) -> dict:
    """Violations of E <= E[d~] in each check, and how the Jensen residual behaves in N and in concentration."""
    per_instance = exact.sort_values("N").groupby(["family", "L", "instance"])["residual"]
    monotone = per_instance.apply(lambda r: bool((np.diff(r.to_numpy()) <= TOL).all()))
    peak_at = exact.loc[per_instance.idxmax(), "N"].to_numpy()
    relative = exact[exact["N"] < exact["L"] - 1].groupby("family")["relative residual"].mean()
    concentration_helps = relative["one dominant weight"] < relative["tied weights"]
    return {
        "s_exact_n": len(exact), "s_exact_lengths": list(EXACT_LENGTHS),
        "s_exact_viol": int((exact["main sum"] > exact["exact"] + TOL * (1 + exact["exact"])).sum()),
        "s_closed_n": len(closed), "s_closed_lengths": " and ".join(map(str, CLOSED_LENGTHS)),
        "s_closed_viol": int((closed["main sum"] > closed["exact"] + TOL * (1 + closed["exact"])).sum()),
        "s_mc_n": len(mc), "s_mc_viol": int((mc["z"] > Z_MAX).sum()), "s_mc_zmax": float(mc["z"].max()),
        "s_reps": REPS, "s_zmax_rule": Z_MAX,
        "s_jensen_last": float(exact.loc[exact["N"] == exact["L"] - 1, "residual"].abs().max()),
        "s_jensen_monotone": 100 * float(monotone.mean()),
        "s_jensen_peak_not_1": 100 * float((peak_at > 1).mean()),
        "s_jensen_max_rel": float(exact["relative residual"].max()),
        "s_jensen_rel_generic": float(relative["generic"]), "s_jensen_rel_tied": float(relative["tied weights"]),
        "s_jensen_rel_dominant": float(relative["one dominant weight"]),
        "s_jensen_reading": "the opposite of what the remark suggests" if concentration_helps
        else "in line with the remark",
    }


@one_thread
def corollary2_checks(generator: torch.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Corollary 2 on synthetic rows (softmax of standard normal logits, d = DIM).

    (i) N = COR_N and L in COR_LENGTHS, for centred vectors and for vectors with a common offset 3 e_1: the
    ratio E / A, A = sum_i ||alpha_i x_i||, and whether |E - A| is within the certificate
    ``theory.corollary2_bounds(...).small_n_gap``; (ii) L = COR_L2 (logits twice as spread, offset e_1) and
    N = 1..L-1: E and its cap ``large_n_cap``, and whether E <= cap."""
    rows = []
    for length in COR_LENGTHS:
        w = torch.softmax(_randn(generator, COR_ROWS, 1, length), -1)
        for kind, offset in (("centred vectors", 0.0), ("vectors with a common offset", 3.0)):
            x = _randn(generator, COR_ROWS, length, DIM) + offset * torch.eye(DIM, dtype=F64)[0]
            n_top = min(COR_N, length - 1)
            main = theory.theorem1_random_main_sum(w, x, n_top)[:, 0]
            A = theory.corollary2_small_n_limit(w, x)[:, 0]
            gap = theory.corollary2_bounds(w, x, n_top).small_n_gap[:, 0]
            rows.append(pd.DataFrame({"L": length, "vectors": kind, "E / A": (main / A).cpu().numpy(),
                                      "gap holds": ((main - A).abs() <= gap * (1 + TOL) + TOL).cpu().numpy()}))
    small_n = pd.concat(rows, ignore_index=True)
    w = torch.softmax(2 * _randn(generator, COR_ROWS, 1, COR_L2), -1)
    x = _randn(generator, COR_ROWS, COR_L2, DIM) + 1.0 * torch.eye(DIM, dtype=F64)[0]
    rows = []
    for n_top in range(1, COR_L2):
        main = theory.theorem1_random_main_sum(w, x, n_top)[:, 0]
        cap = theory.corollary2_bounds(w, x, n_top).large_n_cap[:, 0]
        rows.append(pd.DataFrame({"N": n_top, "main sum": main.cpu().numpy(), "cap": cap.cpu().numpy(),
                                  "cap holds": (main <= cap * (1 + TOL) + TOL).cpu().numpy()}))
    return small_n, pd.concat(rows, ignore_index=True)


def corollary2_facts(small_n: pd.DataFrame, large_n: pd.DataFrame) -> dict:
    """Failures of the certificates, E / A at the first and last length, and E against N at L = COR_L2."""
    ratio = small_n.groupby(["vectors", "L"])["E / A"].mean()
    e_by_n = large_n.groupby("N")["main sum"].mean()
    return {
        "s_cor_n": len(small_n) + len(large_n),
        "s_cor_fail": int((~small_n["gap holds"]).sum() + (~large_n["cap holds"]).sum()),
        "s_cor_centred_first": float(ratio[("centred vectors", COR_LENGTHS[0])]),
        "s_cor_centred_last": float(ratio[("centred vectors", COR_LENGTHS[-1])]),
        "s_cor_offset_last": float(ratio[("vectors with a common offset", COR_LENGTHS[-1])]),
        "s_cor_L_first": COR_LENGTHS[0], "s_cor_L_last": COR_LENGTHS[-1], "s_cor_N": COR_N,
        "s_cor_rows": COR_ROWS, "s_cor_L2": COR_L2,
        "s_cor_e_last": float(e_by_n[COR_L2 - 1]), "s_cor_e_peak": float(e_by_n.max()),
        "s_cor_e_peak_N": int(e_by_n.idxmax()),
    }


def jensen_figure(exact: pd.DataFrame) -> plt.Figure:
    """The relative Jensen residual eps / E[d~] of the enumerated rows against N / L, one colour per length and one
    marker per family (mean over instances)."""
    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    rel = exact.dropna(subset=["relative residual"]).copy()
    rel["L"] = rel["L"].astype(str)
    sns.lineplot(data=rel, x="N / L", y="relative residual", hue="L", style="family", markers=True, errorbar=None,
                 ax=ax, palette=figures.PALETTE)
    ax.set(xlabel="$N/L$", ylabel=r"$\varepsilon\,/\,\mathbb{E}[\tilde d]$ (mean over instances)")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize="small")
    figures.model_title(fig, "Jensen residual of Theorem 1 (random set), exact expectation", "synthetic data, no model")
    return fig


def corollary2_figure(small_n: pd.DataFrame, large_n: pd.DataFrame) -> plt.Figure:
    """Left: E / A at N = COR_N against L (Corollary 2 (i); band: 10-90 % of rows); right: E and its cap against N
    at L = COR_L2 (Corollary 2 (ii); mean over rows)."""
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 4.0))
    colours = sns.color_palette(figures.PALETTE)
    sns.lineplot(data=small_n, x="L", y="E / A", hue="vectors", marker="o", ax=axes[0], palette=colours[1::3][:2],
                 errorbar=("pi", 80))
    axes[0].axhline(1.0, color="black", ls="--", lw=1)
    axes[0].set(xscale="log", yscale="log", title=rf"(i) $N={COR_N}$, growing $L$", xlabel="$L$",
                ylabel=r"$\mathcal{E}\,/\,A$")
    sns.move_legend(axes[0], "upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, fontsize="small", title=None)
    tidy = large_n.melt(id_vars="N", value_vars=["main sum", "cap"], var_name="quantity")
    tidy["quantity"] = tidy["quantity"].map({"main sum": r"main sum $\mathcal{E}$", "cap": "cap of (ii)"})
    sns.lineplot(data=tidy, x="N", y="value", hue="quantity", ax=axes[1], errorbar=None,
                 palette=[QUANTITY_COLOURS[QUANTITIES["expectation"]], "black"])
    axes[1].set(yscale="log", title=rf"(ii) $L={COR_L2}$, growing $N$", xlabel="$N$", ylabel="mean over rows")
    sns.move_legend(axes[1], "upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, fontsize="small", title=None)
    figures.model_title(fig, "Corollary 2 on random rows", "synthetic data, no model")
    return fig


# --- Figure 2 on a captured model ----------------------------------------------------------------------------


def capture(session, vectors: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Every layer's weights (layers, heads, L, L) and per-head ``vectors`` (layers, heads, L, d), in float32, and
    the facts of the capture (``m_...`` names): heads, L, and how far a captured row's sum is from one."""
    captured = session.capture(what=("weights", VECTOR_FIELD[vectors]))
    weights, x = captured.weights, session.vectors(captured, vectors)
    n_layers, n_heads, L = weights.shape[:3]
    deviation = max(float((weights[layer].to(F64).sum(-1) - 1).abs().max()) for layer in range(n_layers))
    attention = "causal" if session.causal else "an encoder (bidirectional attention)"
    return weights, x, {"ch2_model": session.name, "m_L": L, "m_rowsum_dev": deviation, "m_attention": attention,
                        "m_heads": f"{n_layers} layers x {n_heads} heads = {n_layers * n_heads} heads",
                        "m_vectors": f"{vectors} vectors"}


def critical_grid(length: int) -> list[int]:
    """The sizes of panel (c) at one length: floor(0.06 L) (the paper's value), the CRITICAL_FRACTIONS of L
    (rounded) and L - 1, each between 1 and L - 1."""
    grid = {max(1, math.floor(0.06 * length)), length - 1} | {max(1, round(f * length)) for f in CRITICAL_FRACTIONS}
    return sorted(n for n in grid if 1 <= n <= length - 1)


@dataclass
class Figure2:
    """The three panels: per-head means at fixed N for growing L (``by_length``, Algorithm 1) and at the full
    length for growing N (``by_n``, Algorithm 2); the KS tests and the critical N per length (Algorithm 3),
    ``tests`` keeping, per length, the sizes up to its critical N (those an upward scan runs); ``rows``: the
    sampled query rows per head at the full length."""

    by_length: pd.DataFrame
    by_n: pd.DataFrame
    tests: pd.DataFrame
    critical: pd.DataFrame
    rows: int


def encoder_windows(session, vectors: str):
    """On an encoder, whose every row depends on the whole window: a function of a length n that captures a window of
    n tokens (one forward pass, :meth:`Session.window`) and returns its weights and per-head ``vectors``; the
    session's own window serves its length without a new pass."""
    def window(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = session if n == session.L else session.window(n)
        captured = s.capture(what=("weights", VECTOR_FIELD[vectors]))
        return captured.weights, s.vectors(captured, vectors)
    return window


def _renormalised(weights: torch.Tensor) -> torch.Tensor:
    return (weights.to(F64) / weights.to(F64).sum(-1, keepdim=True)).to(weights.dtype)


def _all_keys(weights: torch.Tensor) -> torch.Tensor:
    L = weights.shape[-1]
    return torch.ones(L, L, dtype=torch.bool, device=weights.device)


def figure2(weights, x, *, N: int, lengths, Ns, alpha: float, reading: str, rows_per_octave,
            windows=None) -> Figure2:
    """Algorithms 1-3 (``attn_utils.mathematics.algorithms``) on the captured attention, with the query rows
    sampled ``rows_per_octave`` per octave of positions (None: every row); the critical N uses the grid of
    :func:`critical_grid` at each length and level ``alpha``. On a causal model the leading L' x L' block of the
    window is the attention of its first L' tokens, so one capture serves every length; on an encoder
    (``windows``, :func:`encoder_windows`) Algorithms 1 and 3 read one window per length, every row seeing all its
    keys. Their wall times go to the run record under the names of :data:`TIMED` (see :func:`run_seconds`)."""
    L = weights.shape[-1]
    options = dict(reading=reading, rows_per_octave=rows_per_octave, progress=False)
    per_length = [(weights, x, list(lengths))] if windows is None else ((*windows(n), [n]) for n in lengths)
    by_length, results = [], []
    for w, xs, ns in per_length:
        mask = None if windows is None else _all_keys(w)
        with runlog.timing(TIMED[0]):
            by_length.append(algorithms.distance_vs_length(w, xs, N=N, lengths=ns, mask=mask, **options))
        with runlog.timing(TIMED[1]):
            results.append(algorithms.critical_n(w, xs, ns, critical_grid, alpha=alpha, mask=mask, **options))
        del w, xs
    with runlog.timing(TIMED[0]):
        by_n = algorithms.distance_vs_n(weights, x, Ns=Ns, mask=None if windows is None else _all_keys(weights),
                                        **options)
    summary = pd.concat([r.summary for r in results], ignore_index=True)
    critical = summary.rename(columns={"critical_n": "critical N", "critical_fraction": "critical N / L"})
    tests = pd.concat([r.tests for r in results], ignore_index=True).merge(critical[["L", "critical N"]], on="L")
    scanned = (tests["critical N"] < 0) | (tests["N"] <= tests["critical N"])
    tests = tests[scanned].drop(columns="critical N").reset_index(drop=True)
    tests.insert(2, "N / L", tests["N"] / tests["L"])
    return Figure2(pd.concat(by_length, ignore_index=True), by_n, tests, critical,
                   len(algorithms.sample_rows(L, rows_per_octave)[0]))


def run_seconds() -> float:
    """The wall time that this notebook's run record holds for the paper's Algorithms 1-3 (:data:`TIMED`, written by
    :func:`figure2`): the chapter's one run time, the same number the ledger chapter reports."""
    return sum(r["seconds"] for r in runlog.read("timings")
               if r["notebook"] == runlog.notebook() and r["algorithm"] in TIMED)


def row_bound_check(weights, x, Ns, *, reading: str, rows_per_octave, causal: bool = True) -> dict:
    """Theorem 1 (fixed set) row by row (:func:`attn_utils.mathematics.algorithms.theorem1_row_check`): for every N
    of ``Ns`` and every sampled query row of every head at the full length that sees more than N keys (rows
    renormalised in float64; the causal mask, or on an encoder (``causal=False``) every key), whether d~ exceeds the
    bound by more than a relative TOL. Returns the rows checked, the violations and the largest d~ / bound."""
    return algorithms.theorem1_row_check(weights, x, Ns, tol=TOL, reading=reading, rows_per_octave=rows_per_octave,
                                         mask=None if causal else _all_keys(weights), progress=False)


def sampling_checks(weights, x, *, N: int, lengths, alpha: float, reading: str, rows_per_octave,
                    causal: bool = True) -> tuple[dict, pd.DataFrame]:
    """How a sample of K query rows per octave compares with every row, K = ``rows_per_octave`` (the run's own
    sample) or, when the run evaluates every row (None), :data:`QUICK_ROWS_PER_OCTAVE` (the sample a quicker run
    would take). On the lengths (<= 64) where the sample holds every row, the sampled Algorithms 1 and 3 must agree
    with the full ones (largest relative difference, and critical N equal); at the full length, the relative error
    of the sampled head means of Algorithm 2 at N on the first and last layers (median and largest over heads, and
    the error of the mean over those heads); the causal mask, or on an encoder (``causal=False``) every key. Returns
    these facts (``m_...`` names) and a table of the median and largest relative error per quantity."""
    k = rows_per_octave or QUICK_ROWS_PER_OCTAVE
    last, L = weights.shape[0] - 1, weights.shape[-1]
    full = [n for n in lengths if n <= min(64, 2 * k)]
    rows = len(algorithms.sample_rows(L, k)[0])
    facts = {"m_check_lengths": full or "none of the lengths (all are sampled)", "m_last_layer": last,
             "m_check_agreement": "not applicable", "m_crit_check": "0 of 0", "m_sample_k": k,
             "m_sample_rows": rows, "m_sample_share": 100 * rows / L}
    if full:
        if causal:  # the leading block of a causal window holds every shorter length
            blocks = [(full, weights[:, :, : full[-1], : full[-1]], x[:, :, : full[-1]], None)]
        else:  # on an encoder each length's leading block, its rows renormalised (a row-stochastic matrix to sample)
            blocks = [([n], _renormalised(weights[:, :, :n, :n]), x[:, :, :n], _all_keys(weights[:, :, :n, :n]))
                      for n in full]
        agreement, same = 0.0, 0
        for ns, w, xs, mask in blocks:
            options = dict(reading=reading, progress=False, mask=mask)
            sampled, every = (algorithms.distance_vs_length(w, xs, N=N, lengths=ns, rows_per_octave=r, **options)
                              for r in (k, None))
            agreement = max(agreement, *(float(((sampled[c] - every[c]) / every[c]).abs().max()) for c in QUANTITIES))
            crit = [algorithms.critical_n(w, xs, ns, critical_grid, alpha=alpha, rows_per_octave=r, **options)
                    .summary["critical_n"].tolist() for r in (k, None)]
            same += sum(a == b for a, b in zip(*crit))
        facts["m_check_agreement"], facts["m_crit_check"] = agreement, f"{same} of {len(full)}"
    two = (weights[[0, last]], x[[0, last]])
    sampled, every = (algorithms.distance_vs_n(*two, Ns=[N], reading=reading, progress=False, rows_per_octave=r,
                                                mask=None if causal else _all_keys(weights))
                      for r in (k, None))
    error = pd.DataFrame({c: ((sampled[c] - every[c]) / every[c]).abs() for c in QUANTITIES})
    facts.update({"m_sample_med": 100 * float(error.median().max()), "m_sample_max": 100 * float(error.max().max()),
                  "m_sample_mean_err": 100 * abs(float(sampled["distance"].mean() / every["distance"].mean()) - 1)})
    table = error.describe().loc[["50%", "max"]].rename(index={"50%": "median relative error",
                                                               "max": "largest relative error"})
    return facts, table


def rows_text(rows: int, L: int) -> str:
    """How many query rows per head the head means average: every one, or a sample (with its share)."""
    if rows >= L:
        return f"every query row ({rows} per head)"
    return f"{rows} sampled query rows per head ({fmt(100 * rows / L)} % of the rows)"


def _percent(value: float, missing: str) -> str:
    return missing if math.isnan(value) else f"{fmt(100 * value)} %"


def critical_text(tests: pd.DataFrame, row) -> str:
    """One length's critical N with the resolution of its grid: the first accepted size ``c`` of the grid and the
    rejected size ``b`` below it, so that the first accepted N lies in ``b + 1 .. c``; ``none`` where every size
    is rejected."""
    L, c = int(row["L"]), int(row["critical N"])
    if c <= 0:
        return f"L={L}: none (every size rejected)"
    below = tests.loc[(tests["L"] == L) & (tests["N"] < c), "N"]
    if below.empty:
        return f"L={L}: N={c} ({row['critical N / L']:.2f} L, the smallest size tested)"
    b = int(below.max())
    return f"L={L}: N={c} ({row['critical N / L']:.2f} L; between {b + 1} and {c}, as the grid steps from {b} to {c})"


def figure2_facts(fig2: Figure2, *, N: int, alpha: float, reading: str) -> dict:
    """The panels' numbers (``m_...`` names for the prose; the claims read them too): slopes of the mean over
    heads against L, how often and by how much the bound lies above the distance, the plateau and the ratios
    at N = 20 and 100, the gaps 1 - E / d~ at N = 5 and 100, the critical N and the p-values at floor(0.06 L)."""
    by_length = fig2.by_length.groupby("L")[list(QUANTITIES)].mean()
    by_n = fig2.by_n.groupby("N")[list(QUANTITIES)].mean()
    both = pd.concat([fig2.by_length, fig2.by_n])
    at = lambda n, c: float(by_n.loc[n, c]) if n in by_n.index else float("nan")  # noqa: E731
    crit = fig2.critical
    found = crit["critical N"] > 0
    p_006 = fig2.tests[np.isclose(fig2.tests["N"], np.maximum(1, np.floor(0.06 * fig2.tests["L"])))]
    plateau, gap_5, gap_100 = abs(at(100, "distance") / at(20, "distance") - 1), \
        1 - at(5, "expectation") / at(5, "distance"), 1 - at(100, "expectation") / at(100, "distance")
    safe = float((both["distance"] <= both["bound"]).mean())
    return {
        "m_N": N, "m_ks_alpha": alpha, "m_reading": reading.replace("_", " "), "m_rows": fig2.rows,
        "m_rows_text": rows_text(fig2.rows, int(fig2.by_n["L"].iloc[0])),
        "m_L_first": int(by_length.index[0]), "m_L_last": int(by_length.index[-1]),
        "m_d_first": float(by_length["distance"].iloc[0]), "m_d_last": float(by_length["distance"].iloc[-1]),
        "m_e_first": float(by_length["expectation"].iloc[0]), "m_e_last": float(by_length["expectation"].iloc[-1]),
        **{f"m_slope_{c[0]}": loglog_slope(by_length.index, by_length[c]) for c in QUANTITIES},
        "m_safe_fraction": safe, "m_safe_percent": _percent(safe, "n/a"),
        "m_conservative": float((both["bound"] / both["distance"]).median()),
        "m_has_20_100": {20, 100} <= set(by_n.index), "m_has_5_100": {5, 100} <= set(by_n.index),
        "m_plateau": plateau, "m_plateau_text": _percent(plateau, "not measured (Ns lacks 20 or 100)"),
        "m_ratio_20": at(20, "bound") / at(20, "distance"), "m_ratio_100": at(100, "bound") / at(100, "distance"),
        "m_gap_5": gap_5, "m_gap_100": gap_100, "m_gap_5_text": _percent(gap_5, "not measured"),
        "m_gap_100_text": _percent(gap_100, "not measured"),
        "m_d_peak_N": int(by_n["distance"].idxmax()),
        "m_crit_table": ", ".join(critical_text(fig2.tests, r) for _, r in crit.iterrows()),
        "m_crit_ledger": "; ".join(f"L={int(r['L'])}: {int(r['critical N'])}" for _, r in crit.iterrows()),
        "m_crit_fractions": crit["critical N / L"].tolist(),
        "m_crit_within": [bool(f <= 0.06) for f in crit["critical N / L"]],
        "m_crit_min_frac": float(crit["critical N / L"].min()) if found.any() else "none",
        "m_crit_max_frac": float(crit["critical N / L"].max()) if found.any() else "none",
        "m_p_006_reject_all": bool(len(p_006) and p_006["reject"].all()),
        "m_p_006_max": float(p_006["pvalue"].max()) if len(p_006) else "not tested",
        "m_p_006_accepted": ", ".join(str(int(n)) for n in p_006.loc[~p_006["reject"], "L"]),
        "m_p_006_tested": len(p_006),
    }


def figure2_readings(facts: dict, recorded: dict) -> dict:
    """The sentences of the prose that depend on the measurements, chosen by the verdicts of the ``recorded``
    claims (key -> ``claims.Claim``), and the rules that decided them."""
    v = {key.removeprefix("ch2-"): claim.verdict for key, claim in recorded.items()}
    if facts["m_p_006_reject_all"]:
        read_006 = f"At N = ⌊0.06 L⌋ every test rejects equality (largest p-value {fmt(facts['m_p_006_max'], 2)})"
    elif facts["m_p_006_tested"]:
        read_006 = f"At N = ⌊0.06 L⌋ the test accepts for L = {facts['m_p_006_accepted']}"
    else:
        read_006 = "No test was run at N = ⌊0.06 L⌋ (an earlier size was accepted for every length)"
    return {
        "m_read_d": "linear growth, as the paper reports" if v["fig2a-distance-linear"] == "reproduced"
        else "not the linear growth the paper reports",
        "m_read_e": "The main sum grows linearly as well" if v["fig2a-expectation-linear"] == "reproduced"
        else "The main sum does not follow",
        "m_read_plateau": {"reproduced": "the plateau the paper reports", "not reproduced": "no plateau by our rule",
                           "not comparable": "not comparable with the paper"}[v["fig2b-plateau"]],
        "m_read_tighten": {"reproduced": "tightens, as the paper says",
                           "not reproduced": "does not tighten, because its second term grows with ᾱ_N (L − N)",
                           "not comparable": "is not compared (Ns lacks 20 or 100)"}[v["fig2b-bound-tightens"]],
        "m_read_tighten_short": {"reproduced": "tightens", "not reproduced": "does not tighten",
                                 "not comparable": "was not compared (Ns lacks 20 or 100)"}[v["fig2b-bound-tightens"]],
        "m_read_converge": {
            "reproduced": "The distance and the main sum meet, as the paper says",
            "partly reproduced": "The distance and the main sum approach each other, as the paper says, but slowly",
            "not reproduced": "The distance and the main sum do not approach each other",
            "not comparable": "The convergence is not compared (Ns lacks 5 or 100)"}[v["fig2b-converge"]],
        "m_read_006": read_006,
        "m_crit_verdict": v["fig2c-critical-n"],
        **{f"m_rule_{name}": recorded[f"ch2-{key}"].rule for name, key in (
            ("slope", "fig2a-distance-linear"), ("safe", "fig2a-bound-safe"), ("plateau", "fig2b-plateau"),
            ("converge", "fig2b-converge"), ("critical", "fig2c-critical-n"))},
    }


def _grid_ticks(ax, values) -> None:
    """Label a log-scaled x axis at the grid ``values`` themselves, without minor labels."""
    ax.set_xticks(sorted(set(values)), labels=[fmt(v) for v in sorted(set(values))])
    ax.xaxis.set_minor_locator(NullLocator())


def figure2_ab_figure(fig2: Figure2, *, N: int, title: str, model: str) -> plt.Figure:
    """Panels (a) and (b) of Figure 2: the mean over heads of the three quantities (band: 10-90 % of heads),
    log-log, against L at fixed N (a) and against N at the full length (b); one legend below both."""
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 4.1), sharey=True)
    L = int(fig2.by_n["L"].iloc[0])
    for ax, table, column, name in ((axes[0], fig2.by_length, "L", f"(a) N = {N}, growing L"),
                                    (axes[1], fig2.by_n, "N", f"(b) L = {L}, growing N")):
        tidy = table.melt(id_vars=["layer", "head", column], value_vars=list(QUANTITIES), var_name="quantity")
        tidy["quantity"] = tidy["quantity"].map(QUANTITIES)
        sns.lineplot(data=tidy, x=column, y="value", hue="quantity", marker="o", estimator="mean",
                     errorbar=("pi", 80), ax=ax, palette=QUANTITY_COLOURS, legend=ax is axes[0])
        ax.set(xscale="log", yscale="log", title=name, ylabel="mean over heads" if ax is axes[0] else "")
        _grid_ticks(ax, table[column])
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].get_legend().remove()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, frameon=False, fontsize="small")
    figures.model_title(fig, title, model)
    return fig


def figure2_c_figure(fig2: Figure2, *, alpha: float, model: str) -> plt.Figure:
    """Panel (c) of Figure 2: the critical N per length, log-log, against the paper's 0.06 L and the largest size
    tested, L - 1; each found critical N is labelled with its fraction of L."""
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    crit = fig2.critical
    grid = crit["L"].to_numpy(dtype=float)
    ax.plot(grid, 0.06 * grid, "--", color="black", label="paper: 0.06 L")
    ax.plot(grid, grid - 1, ":", color="grey", label="L - 1 (largest N tested)")
    ok = crit[crit["critical N"] > 0]
    ax.plot(ok["L"], ok["critical N"], "o-", color=sns.color_palette(figures.PALETTE)[4], label="critical N (ours)")
    for _, r in ok.iterrows():
        ax.annotate(f"{r['critical N / L']:.2f} L", (r["L"], r["critical N"]), textcoords="offset points",
                    xytext=(4, -12), fontsize="small")
    ax.set(xscale="log", yscale="log", xlabel="L", ylabel="N")
    _grid_ticks(ax, crit["L"])
    fig.legend(loc="outside lower center", ncols=3, frameon=False, fontsize="small")
    figures.model_title(fig, f"The paper's Figure 2 (c) redrawn: critical N, KS test at alpha = {alpha:g}", model)
    return fig
