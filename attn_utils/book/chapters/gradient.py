"""Chapter 4, gradient sensitivity: the machinery behind the paper's Sec. 2.3 (Lemma 2, Corollary 3) and Fig. 4.

Four parts, in the chapter's order:

* the motivating example of two nearly identical logit vectors whose two largest logits swap (Eq. (12), lost;
  ``theory.two_logit_example`` is our reconstruction): exact change of the weights against the first-order term
  J (l1 - l2) of the softmax Jacobian J = (diag(alpha) - alpha alpha^T) / T;
* Lemma 2 (the Jacobian of a normalizer of the form of Eq. (3), alpha_i = F(l_i) / sum_j F(l_j)): the analytic
  Jacobian against autograd and the reconstructed bound against the spectral norm, on random instances;
* Corollary 3 (||grad_l softmax(l/T)||_2 <= min{1/(4T), sqrt 2}): its counterexample, and the entrywise bound
  1/(4T), the corrected spectral bound 1/(2T) and the finite-difference bound min{1/(2T), sqrt(2)/eps} checked on
  random instances;
* Figure 4 on a model: Algorithm 5 (``algorithms.gradient_sensitivity``) gives g(T, eps); :func:`figure4_findings`
  reads off it every quantity the paper's sentences about the figure speak of.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch

from attn_utils.book import figures
from attn_utils.book.formatting import fmt, tex
from attn_utils.mathematics import theory
from attn_utils.mathematics.fitting import loglog_fit
from attn_utils.mathematics.normalizers import causal_mask

LENGTHS = (2, 3, 5, 16, 64)                          # row lengths L of the random instances
KINDS = ("Gaussian", "two tied maxima", "one dominant")  # kinds of random logit rows
COUNTEREXAMPLE_TS = (0.01, 0.1, 1 / (2 * math.sqrt(2)), 1.0, 10.0)
TOL = 1e-12                                          # rounding allowance of the synthetic checks


def spectral_norm(J: torch.Tensor) -> np.ndarray:
    """Largest singular value of each matrix of a (..., L, L) stack (LAPACK through NumPy)."""
    return np.linalg.norm(J.detach().cpu().numpy(), ord=2, axis=(-2, -1))


def per_eps(epsilons: Sequence[float], values: Sequence[float], digits: int = 3) -> str:
    """``"ε=0.001: 12.3, ε=0.1: 4.5"``: one measured value per perturbation size, for the prose ("n/a" if none)."""
    return ", ".join(f"ε={fmt(e)}: {fmt(v, digits)}" for e, v in zip(epsilons, values)) or "n/a"


# --- the motivating example --------------------------------------------------------------------------------------


def two_logit_table(eps: float = 1e-4, c: float = 0.0, rest: Sequence[float] = (-1.0, -2.0),
                    Ts: Sequence[float] | None = None) -> pd.DataFrame:
    """One row per temperature T (default 41 values, 10^-6 to 10^4) for the two logit vectors l1, l2 of
    ``theory.two_logit_example(c, eps, rest)`` (||l1 - l2|| = sqrt(5) eps): the exact change
    ||alpha1 - alpha2||, the first-order term ||J(l2) (l1 - l2)||, the remainder of the expansion with its bound
    ||l1 - l2||^2 / (2 T^2), and the bound min{||l1 - l2|| / (2T), sqrt 2} on the change (all our proofs)."""
    ex = theory.two_logit_example(c, eps, rest)
    h = ex.l1 - ex.l2
    rows = []
    for T in (np.logspace(-6, 4, 41) if Ts is None else Ts):
        a1, a2 = torch.softmax(ex.l1 / T, -1), torch.softmax(ex.l2 / T, -1)
        first_order = theory.softmax_jacobian(a2, T) @ h
        rows.append({"T": T, "eps/T": eps / T, "change": float((a1 - a2).norm()),
                     "first order": float(first_order.norm()),
                     "remainder": float((a1 - a2 - first_order).norm()),
                     "remainder bound": float(h.norm() ** 2 / (2 * T ** 2)),
                     "change bound": min(float(h.norm()) / (2 * T), math.sqrt(2))})
    table = pd.DataFrame(rows)
    table["change / (eps/T)"] = table["change"] / table["eps/T"]
    return table


def two_logit_summary(table: pd.DataFrame, eps: float = 1e-4, c: float = 0.0,
                      rest: Sequence[float] = (-1.0, -2.0)) -> dict:
    """What the prose says of :func:`two_logit_table`: the distance ||l1 - l2|| / eps, the range of
    change / (eps/T) where eps/T <= 10^-2, its two limits ||J h|| / eps (alpha = (1/2, 1/2, 0, ...) when T is
    small against the gap to the lower logits, alpha uniform when T is large), the largest ratios of the remainder
    and of the change to their bounds, and the change at the smallest T."""
    ex = theory.two_logit_example(c, eps, rest)
    h = ex.l1 - ex.l2
    half = torch.tensor([0.5, 0.5], dtype=torch.float64)
    uniform = torch.full((len(h),), 1 / len(h), dtype=torch.float64)
    small = table[table["eps/T"] <= 1e-2]
    return {"ex_dist": float(h.norm()) / eps, "ex_eps": eps,
            "ex_ratio_lo": small["change / (eps/T)"].min(), "ex_ratio_hi": small["change / (eps/T)"].max(),
            "ex_sharp_constant": float((theory.softmax_jacobian(half, 1.0) @ h[:2]).norm() / eps),
            "ex_flat_constant": float((theory.softmax_jacobian(uniform, 1.0) @ h).norm() / eps),
            "ex_remainder_ratio": (table["remainder"] / table["remainder bound"]).max(),
            "ex_change_ratio": (table["change"] / table["change bound"]).max(),
            "ex_change_smallT": table.loc[table["T"].idxmin(), "change"], "ex_sqrt2": math.sqrt(2)}


def plot_two_logit(table: pd.DataFrame) -> plt.Figure:
    """The change and its first-order prediction against eps/T, log-log, under the bound
    min{sqrt 5 eps/(2T), sqrt 2}."""
    fig, ax = plt.subplots(figsize=(6.4, 4.8), layout="constrained")
    tidy = table.melt(id_vars="eps/T", value_vars=["change", "first order"], var_name="quantity", value_name="norm")
    sns.lineplot(data=tidy, x="eps/T", y="norm", hue="quantity", style="quantity", markers=True, ax=ax,
                 palette=figures.PALETTE)
    ax.plot(table["eps/T"], table["change bound"], "k--", lw=1,
            label=r"bound $\min\{\sqrt{5}\,\varepsilon/(2T), \sqrt{2}\}$")
    ax.set(xscale="log", yscale="log", xlabel=r"$\varepsilon/T$", ylabel=r"$\|\alpha^{(1)}-\alpha^{(2)}\|_2$",
           ylim=(table["change"].min() / 5, 5))  # the first-order term vanishes once the rows are one-hot
    handles, labels = ax.get_legend_handles_labels()
    ax.get_legend().remove()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, frameon=False, fontsize=10)
    figures.model_title(fig, "Two nearly identical logit vectors whose top two logits swap", "synthetic, no model")
    return fig


# --- random instances and Lemma 2 --------------------------------------------------------------------------------


def random_logits(n: int, L: int, kind: str, generator: torch.Generator, log_sigma=(-2.3, 2.3),
                  log_T=(-4.6, 4.6)) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` float64 rows of ``L`` logits of ``kind`` (see :data:`KINDS`) and one temperature per row, shape (n, 1).

    Logits are sigma * N(0, 1) with sigma and T log-uniform in ``exp(log_sigma)`` and ``exp(log_T)``; "two tied
    maxima" sets the first two logits to the row's maximum, "one dominant" sets the first to the maximum + 20 T."""
    sigma = torch.empty(n, 1, dtype=torch.float64).uniform_(*log_sigma, generator=generator).exp()
    T = torch.empty(n, 1, dtype=torch.float64).uniform_(*log_T, generator=generator).exp()
    l = sigma * torch.randn(n, L, dtype=torch.float64, generator=generator)
    top = l.amax(-1, keepdim=True)
    if kind == "two tied maxima":
        l[:, :2] = top
    elif kind == "one dominant":
        l[:, :1] = top + 20 * T
    return l, T


def _exp(l, th):
    return torch.exp((l - th[1]) / th[0])


# name: (F, dF), called as F(l, theta) with theta = (T, row maximum); the softmax is F = e^{(l - max)/T}
NORMALIZERS = {
    "softmax": (_exp, lambda l, th: _exp(l, th) / th[0]),
    "softplus": (lambda l, th: torch.logaddexp(torch.zeros_like(l), l / th[0]),
                 lambda l, th: torch.sigmoid(l / th[0]) / th[0]),
    # F' written as autograd computes it, sigma (1 - sigma), so that both sides round alike
    "sigmoid": (lambda l, th: torch.sigmoid(l / th[0]),
                lambda l, th: torch.sigmoid(l / th[0]) * (1 - torch.sigmoid(l / th[0])) / th[0]),
    "quadratic": (lambda l, th: 1 + (l / th[0]) ** 2, lambda l, th: 2 * l / th[0] ** 2),
}


def _per_cell(n_trials: int) -> int:
    return max(1, n_trials // (len(LENGTHS) * len(KINDS)))


def lemma2_check(n_trials: int, seed: int) -> pd.DataFrame:
    """One row per (random instance, normalizer of :data:`NORMALIZERS`): the largest error of
    ``theory.general_jacobian`` against autograd in units of max_k |F'_k| / S (the largest possible entry), the
    spectral norm of J and the bound ``theory.lemma2_bound`` (our reconstruction of Lemma 2). About ``n_trials``
    instances, spread over :data:`KINDS` x :data:`LENGTHS`, with moderate l / T so that every F stays positive."""
    generator = torch.Generator().manual_seed(seed)
    frames = []
    for kind in KINDS:
        for L in LENGTHS:
            l, T = random_logits(_per_cell(n_trials), L, kind, generator, log_sigma=(-2.3, 1.1), log_T=(-1.6, 1.6))
            theta = (T, l.amax(-1, keepdim=True))
            for name, (F, dF) in NORMALIZERS.items():
                J = theory.general_jacobian(F, dF, l, theta)
                auto = torch.autograd.functional.jacobian(
                    lambda x: (F(x, theta) / F(x, theta).sum(-1, keepdim=True)).sum(0), l).permute(1, 0, 2)
                unit = dF(l, theta).abs().amax(-1) / F(l, theta).sum(-1)
                frames.append(pd.DataFrame({"normalizer": name, "kind": kind, "L": L,
                                            "relative error": ((J - auto).abs().amax((-2, -1)) / unit).cpu().numpy(),
                                            "norm": spectral_norm(J),
                                            "bound": theory.lemma2_bound(F, dF, l, theta).cpu().numpy()}))
    check = pd.concat(frames, ignore_index=True)
    check["bound / norm"] = check["bound"] / check["norm"]
    check["violated"] = check["norm"] > check["bound"] * (1 + 1e-10)
    return check


def lemma2_table(check: pd.DataFrame) -> pd.DataFrame:
    """Per normalizer: instances, largest autograd error, violations of the bound, smallest and median bound / norm."""
    return check.groupby("normalizer").agg(**{
        "instances": ("norm", "size"), "largest error against autograd": ("relative error", "max"),
        "bound violated": ("violated", "sum"), "smallest bound / norm": ("bound / norm", "min"),
        "median bound / norm": ("bound / norm", "median")}).reset_index()


def lemma2_summary(check: pd.DataFrame) -> dict:
    """The numbers of the Lemma 2 check: instances per normalizer, violations, the largest autograd error, the
    smallest bound / norm, and the median and largest bound / norm of the softmax."""
    soft = check[check.normalizer == "softmax"]["bound / norm"]
    return {"instances": len(check) // len(NORMALIZERS), "normalizers": len(NORMALIZERS), "pairs": len(check),
            "violations": int(check["violated"].sum()), "max_error": float(check["relative error"].max()),
            "min_ratio": float(check["bound / norm"].min()), "soft_median": float(soft.median()),
            "soft_max": float(soft.max())}


# --- Corollary 3 -------------------------------------------------------------------------------------------------


def counterexample_table(Ts: Sequence[float] = COUNTEREXAMPLE_TS) -> pd.DataFrame:
    """One row per T: the spectral norm 1/(2T) of the Jacobian at two tied logits
    (``theory.corollary3_counterexample``) against Corollary 3's min{1/(4T), sqrt 2} and our 1/(2T)."""
    rows = []
    for T in Ts:
        cex = theory.corollary3_counterexample(T)
        rows.append({"T": T, "spectral norm ||J||_2": cex.spectral_norm, "1/(4T)": 1 / (4 * T),
                     "stated bound min{1/(4T), sqrt 2}": cex.stated_bound,
                     "norm / stated bound": cex.spectral_norm / cex.stated_bound,
                     "corrected bound 1/(2T)": cex.corrected_bound})
    return pd.DataFrame(rows)


def counterexample_summary(table: pd.DataFrame, T: float = 0.1) -> dict:
    """The counterexample at ``T``: ||J||_2, the stated bound and 1/(4T); and the smallest norm / stated bound over
    the temperatures of ``table`` (above 1 at every one of them: Corollary 3 fails there)."""
    cex = theory.corollary3_counterexample(T)
    return {"norm": cex.spectral_norm, "stated": cex.stated_bound, "quarter": 1 / (4 * T),
            "ratio_min": float(table["norm / stated bound"].min())}


def corollary3_check(n_trials: int, epsilons: Sequence[float], seed: int) -> pd.DataFrame:
    """One row per (random softmax instance, eps), about ``n_trials`` instances over :data:`KINDS` x :data:`LENGTHS`
    with T log-uniform in [10^-2, 10^2]: the spectral norm, largest entry and largest diagonal entry of
    J = (diag(alpha) - alpha alpha^T) / T, its error against autograd (times T), and the finite difference
    g = ||softmax((l + eps v)/T) - softmax(l/T)|| / eps for one random unit v per instance and eps. Added columns
    compare them with the stated min{1/(4T), sqrt 2}, the entrywise 1/(4T), our 1/(2T) and min{1/(2T), sqrt(2)/eps}.
    The generator is seeded with ``seed + 1`` (the Lemma 2 check uses ``seed``)."""
    generator = torch.Generator().manual_seed(seed + 1)
    frames = []
    for kind in KINDS:
        for L in LENGTHS:
            l, T = random_logits(_per_cell(n_trials), L, kind, generator)
            a = torch.softmax(l / T, -1)
            J = theory.softmax_jacobian(a, 1.0) / T.unsqueeze(-1)
            auto = torch.autograd.functional.jacobian(lambda x: torch.softmax(x / T, -1).sum(0), l).permute(1, 0, 2)
            columns = {"kind": kind, "L": L, "T": T.squeeze(-1).cpu().numpy(), "norm": spectral_norm(J),
                       "entry": J.abs().amax((-2, -1)).cpu().numpy(),
                       "diag": torch.diagonal(J, dim1=-2, dim2=-1).amax(-1).cpu().numpy(),
                       "autograd error": ((J - auto).abs().amax((-2, -1)) * T.squeeze(-1)).cpu().numpy()}
            for eps in epsilons:
                v = torch.randn(l.shape, dtype=torch.float64, generator=generator)
                v = v / v.norm(dim=-1, keepdim=True)
                g = ((torch.softmax((l + eps * v) / T, -1) - a).norm(dim=-1) / eps).cpu().numpy()
                frames.append(pd.DataFrame({**columns, "eps": eps, "g": g}))
    check = pd.concat(frames, ignore_index=True)
    check["stated"] = [theory.corollary3_bound(T) for T in check["T"]]
    check["norm * 2T"] = check["norm"] * 2 * check["T"]
    check["entry * 4T"] = check["entry"] * 4 * check["T"]
    check["g / valid bound"] = check["g"] / [theory.finite_difference_bound(T, e)
                                             for T, e in zip(check["T"], check["eps"])]
    check["norm > stated"] = check["norm"] > check["stated"]
    check["g > stated"] = check["g"] > check["stated"]
    return check


def _instances(check: pd.DataFrame) -> pd.DataFrame:
    """One row per instance (the rows of the first eps; the Jacobian columns do not depend on eps)."""
    return check[check["eps"] == check["eps"].iloc[0]]


def corollary3_table(check: pd.DataFrame) -> pd.DataFrame:
    """Per kind of instance: the largest ||J||_2 * 2T and max|J_ik| * 4T, the share of instances whose norm exceeds
    the stated bound, and over (instance, eps) the largest g / min{1/(2T), sqrt(2)/eps} and the share of g above
    the stated bound."""
    table = _instances(check).groupby("kind").agg(**{
        "instances": ("norm", "size"), "largest 2T‖J‖₂": ("norm * 2T", "max"),
        "largest 4T|Jᵢₖ|": ("entry * 4T", "max"), "share with ‖J‖₂ above the stated bound": ("norm > stated", "mean")})
    return table.join(check.groupby("kind").agg(**{
        "largest g / min{1/(2T), √2/ε}": ("g / valid bound", "max"),
        "share with g above the stated bound": ("g > stated", "mean")})).rename_axis("logits").reset_index()


def corollary3_summary(check: pd.DataFrame) -> dict:
    """The numbers of the Corollary 3 check (shares in per cent)."""
    first = _instances(check)
    return {"instances": len(first), "pairs": len(check), "norm_max": float(first["norm * 2T"].max()),
            "entry_max": float(first["entry * 4T"].max()), "fd_max": float(check["g / valid bound"].max()),
            "share_norm_pct": 100 * float(first["norm > stated"].mean()),
            "share_g_pct": 100 * float(check["g > stated"].mean()),
            "autograd_error": float(first["autograd error"].max())}


# --- Figure 4 on a model -----------------------------------------------------------------------------------------


def temperature_range(temperatures: torch.Tensor) -> str:
    """How the model's own temperature varies across layers, in words."""
    lo, hi = float(temperatures.min()), float(temperatures.max())
    return "the same in every layer" if hi - lo == 0 else f"between {fmt(lo, 4)} and {fmt(hi, 4)} across layers"


def top_two_gaps(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """l_(1) - l_(2), the gap between the two largest visible logits, for every row that sees at least two keys,
    of every layer and head of ``logits`` (layers, heads, L, L); ``mask`` (L, L) the keys each row sees
    (``Session.visible``; None: the causal prefix). Float64, flattened."""
    L = logits.shape[-1]
    visible = causal_mask(L, device=logits.device) if mask is None else mask.to(logits.device)
    rows = visible.sum(-1) >= 2
    gaps = []
    for layer in logits:
        top2 = layer.masked_fill(~visible, -torch.inf)[:, rows].topk(2, dim=-1).values
        gaps.append((top2[..., 0] - top2[..., 1]).flatten())
    return torch.cat(gaps).double()


def measured_text(model: str, causal: bool, L: int, layers_note: str) -> str:
    """How the model part reads ``model``, for the prose: which keys a row's direction and logits range over."""
    rows = (f"{model} is a causal decoder: row t's direction v_t and its two largest logits range over its t keys"
            if causal else f"{model} is an encoder: every row sees all {L} keys of the window, so v_t and the two "
            "largest logits range over all of them")
    return f"{rows}. {layers_note}".strip()


def _law_slope(Ts: Sequence[float], g: Sequence[float]) -> float:
    """The log-log slope of g against T over the whole range ``Ts`` (``fitting.loglog_fit``): NaN when the fit had
    to leave a point out (a g of exactly 0, which no power law reaches: the curve is off the law there)."""
    fit = loglog_fit(Ts, g)
    return fit.slope if fit.points == len(Ts) else float("nan")


def figure4_findings(summary: pd.DataFrame, epsilons: Sequence[float], T_model: float, logit_scale: str) -> dict:
    """Every quantity the paper's sentences about Fig. 4 speak of, read off the summary of Algorithm 5 (columns
    T, eps, g, corollary3_bound, finite_difference_bound; its temperatures are the run's grid):

    * ``slopes``: log-log slope of g against T over the temperatures <= 0.1 (``low``), per eps (empty with fewer
      than two), and ``slope_misfit`` = |slope + 1|, its distance from a 1/T law (inf where undefined);
      ``slopes_high`` the same over T >= 10 x the model's own temperature;
    * ``order_hits``: per T <= 0.1, whether g is non-increasing in eps;
    * ``spread``: the largest max_eps g / min_eps g over T >= 1 (``n_hot`` temperatures; NaN if none);
    * ``drops``: g(T_lo) / g(T_hi) per eps, T_lo and T_hi the grid's nearest to 0.1 and 10 on a log scale,
      ``grid_decades`` how far they are from 0.1 and 10 (decades); ``drops_alt`` the same from ~1 to ~100;
    * ``ratio_max``: the largest g / min{1/(4T), sqrt 2} (the paper's dashed curve), ``close`` the largest over
      T <= 0.1, ``valid_ok`` whether g <= min{1/(2T), sqrt(2)/eps} everywhere;
    * g at the model's own temperature and at the smallest one, per eps; and the ``logit_scale`` the
      temperatures act on.
    """
    Ts = sorted(set(summary["T"]))
    g = summary.set_index(["T", "eps"])["g"]
    nearest = lambda target: min(Ts, key=lambda T: abs(math.log(T / target)))  # noqa: E731
    low = [T for T in Ts if T <= 0.1 * (1 + 1e-9)]
    high = [T for T in Ts if T >= 10 * T_model * (1 - 1e-9)]
    hot = [T for T in Ts if T >= 1]
    slopes = [_law_slope(low, [g[(T, e)] for T in low]) for e in epsilons] if len(low) >= 2 else []
    eps_sorted = sorted(epsilons)
    T_lo, T_hi, T_a, T_b = nearest(0.1), nearest(10.0), nearest(1.0), nearest(100.0)
    order_hits = [all(g[(T, a)] >= g[(T, b)] for a, b in zip(eps_sorted, eps_sorted[1:])) for T in low]
    ratio = summary["g"] / summary["corollary3_bound"]
    return {
        "low": low, "n_low": len(low), "n_eps": len(epsilons), "epsilons": list(epsilons), "slopes": slopes,
        "slope_misfit": [abs(s + 1) if not math.isnan(s) else math.inf for s in slopes],
        "T_high_min": min(high) if high else float("nan"),
        "slopes_high": [_law_slope(high, [g[(T, e)] for T in high]) for e in epsilons] if len(high) >= 2 else [],
        "logit_scale": logit_scale, "order_hits": order_hits, "hits": sum(order_hits), "n_hot": len(hot),
        "spread": max((max(g[(T, e)] for e in epsilons) / min(g[(T, e)] for e in epsilons) for T in hot),
                      default=float("nan")),
        "T_lo": T_lo, "T_hi": T_hi, "grid_decades": [abs(math.log10(T_lo / 0.1)), abs(math.log10(T_hi / 10.0))],
        "drops": [g[(T_lo, e)] / g[(T_hi, e)] for e in epsilons],
        "T_a": T_a, "T_b": T_b, "drops_alt": [g[(T_a, e)] / g[(T_b, e)] for e in epsilons],
        "ratio_max": float(ratio.max()),
        "close": float(ratio[summary["T"] <= 0.1 * (1 + 1e-9)].max()) if low else float("nan"),
        "valid_ok": bool((summary["g"] <= summary["finite_difference_bound"] * (1 + 1e-9)).all()),
        "g_max": float(summary["g"].max()), "T_model": T_model, "T_min": Ts[0],
        "g_at_model": [g[(T_model, e)] for e in epsilons], "g_smallest_T": [g[(Ts[0], e)] for e in epsilons],
    }


def figure4_prose(found: dict) -> dict:
    """The values the prose quotes from :func:`figure4_findings` (``fig4_`` names; per-eps lists as text)."""
    eps = found["epsilons"]
    return {"fig4_scale": found["logit_scale"], "fig4_T_model": fmt(found["T_model"], 4),
            "fig4_slopes": per_eps(eps, found["slopes"], 2), "fig4_slopes_high": per_eps(eps, found["slopes_high"], 2),
            "fig4_T_high_min": found["T_high_min"], "fig4_hits": found["hits"], "fig4_n_low": found["n_low"],
            "fig4_spread": found["spread"], "fig4_T_lo": found["T_lo"], "fig4_T_hi": found["T_hi"],
            "fig4_drops": per_eps(eps, found["drops"]), "fig4_T_a": found["T_a"], "fig4_T_b": found["T_b"],
            "fig4_drops_alt": per_eps(eps, found["drops_alt"]), "fig4_ratio_max": found["ratio_max"],
            "fig4_close": found["close"], "fig4_g_max": found["g_max"], "fig4_T_min": found["T_min"],
            "fig4_g_at_model": per_eps(eps, found["g_at_model"]), "fig4_smallT_g": per_eps(eps, found["g_smallest_T"])}


#: The measured values each claim of the chapter is judged on (its rule and template in ledger/ch4_gradient.yml).
CLAIM_VALUES = {
    "ch4-lemma2": ("instances", "normalizers", "violations", "min_ratio", "max_error"),
    "ch4-corollary3-spectral": ("norm", "stated", "ratio_min"),
    "ch4-corollary3-entries": ("instances", "entry_max"),
    "ch4-corrected-spectral": ("instances", "norm_max", "share_norm_pct"),
    "ch4-finite-difference-bound": ("pairs", "fd_max", "share_g_pct"),
    "ch4-fig4-inverse-T": ("logit_scale", "epsilons", "slopes", "slope_misfit"),
    "ch4-fig4-eps-order": ("n_eps", "n_low", "hits", "order_hits"),
    "ch4-fig4-collapse": ("n_eps", "n_hot", "spread"),
    "ch4-fig4-drop": ("epsilons", "T_lo", "T_hi", "grid_decades", "drops"),
    "ch4-fig4-under-dashed": ("ratio_max", "valid_ok"),
    "ch4-fig4-close-to-limit": ("n_low", "close"),
}
FIGURE4_CLAIMS = tuple(key for key in CLAIM_VALUES if key.startswith("ch4-fig4-"))


def claim_values(key: str, found: dict) -> dict:
    """The values of ``found`` that claim ``key`` is judged on (:data:`CLAIM_VALUES`)."""
    return {name: found[name] for name in CLAIM_VALUES[key]}


def plot_figure4(summary: pd.DataFrame, T_model: float, logit_scale: str, model: str, L: int, heads: int) -> plt.Figure:
    """Fig. 4 measured: g(T, eps) per eps against T, log-log, under the paper's dashed min{1/(4T), sqrt 2} and our
    dotted 1/(2T), with the model's own temperature marked."""
    fig, ax = plt.subplots(figsize=(7.4, 5.2), layout="constrained")
    curves = summary.assign(eps=summary["eps"].map(lambda e: f"ε = {e:g}"))
    sns.lineplot(data=curves, x="T", y="g", hue="eps", style="eps", markers=True, dashes=False, ax=ax,
                 palette=figures.PALETTE)
    T_dense = np.logspace(np.log10(summary["T"].min()), np.log10(summary["T"].max()), 200)
    ax.plot(T_dense, [theory.corollary3_bound(T) for T in T_dense], "k--", lw=1.2,
            label=r"paper: $\min\{1/(4T),\sqrt{2}\}$")
    ax.plot(T_dense, [theory.softmax_jacobian_norm_bound(T) for T in T_dense], color="0.45", ls=":", lw=1.2,
            label=r"ours: $1/(2T)$ (and $\sqrt{2}/\varepsilon$ per $\varepsilon$)")
    ax.axvline(T_model, color="0.6", lw=0.8)
    ax.text(T_model, 0.02, " model's own T", transform=ax.get_xaxis_transform(), va="bottom", fontsize=10,
            color="0.4")
    ax.set(xscale="log", yscale="log", xlabel=f"temperature T (logit scale: {logit_scale})",
           ylabel=r"$g(T,\varepsilon)$, max over heads")
    handles, labels = ax.get_legend_handles_labels()
    ax.get_legend().remove()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, frameon=False, fontsize=10)
    figures.model_title(fig, f"Finite-difference Jacobian norm, L = {L}, {heads} heads", model)
    return fig


def g_table(summary: pd.DataFrame) -> pd.DataFrame:
    """g(T, eps) of the summary of Algorithm 5, one row per temperature T and one column per eps."""
    wide = summary.pivot(index="T", columns="eps", values="g")
    return wide.rename(columns=lambda e: f"g at ε = {fmt(e)}").rename_axis(columns=None).reset_index()


def verdict_table(recorded: dict) -> pd.DataFrame:
    """The ledger rows of ``recorded`` (key: :class:`attn_utils.book.claims.Claim`) as claim, ours, verdict, for the
    page (HTML, its math typeset)."""
    return pd.DataFrame([{"claim": tex(c.claim), "ours": tex(c.ours), "verdict": c.verdict} for c in recorded.values()])
