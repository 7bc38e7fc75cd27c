"""Chapter 1, vanishing attention: the synthetic checks of Lemma 1 and Corollary 1, the normalizers that escape
them, and the measurements on every head of a model.

The mathematics lives in :mod:`attn_utils.mathematics` (``normalizers.general`` is the paper's Eq. (3),
``theory.lemma1_bounds`` and ``theory.corollary1_bounds`` its Lemma 1 and Corollary 1); this module draws the
synthetic instances, runs the checks, shapes the results as tidy tables and draws the chapter's figures.

* Lemma 1: for ``alpha_i = F(l_i) / sum_j F(l_j)`` (Eq. (3)) with ``F`` positive, independent of ``L``, and
  logits in ``[-a, a]``: ``C1 / L <= alpha_i <= C2 / L`` with ``C1 = m_F / M_F = 1 / C2``.
* Corollary 1: for the softmax of Eq. (2) with ``l_i = q . k_i``: ``e^{-2 Delta / T} / L <= alpha_i <=
  e^{2 Delta / T} / L`` with ``Delta = ||q|| max_j ||k_j||``.

A row's *tightness* is ``max(max_i alpha_i / (C2 / L), (C1 / L) / min_i alpha_i)``: at most 1 exactly when the
row keeps both bounds.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from matplotlib.ticker import NullLocator

from attn_utils.book import figures
from attn_utils.book.formatting import fmt
from attn_utils.mathematics import normalizers, registry, theory
from attn_utils.mathematics.fitting import loglog_fit, loglog_slope

F64 = torch.float64
A_GRID = (0.5, 1.0, 2.0, 4.0)   # logit bounds a of the synthetic rows of Lemma 1
PATTERNS = ("uniform", "random +-a", "clipped Gaussian", "one at +a", "one at -a")
COMBOS = [(a, p) for p in PATTERNS for a in A_GRID]   # rows cycle through these (a, pattern) pairs
REL_TOL = 1e-9                  # float64 rounding allowance when a bound is attained (up to) equality
D_SYN = 8                       # dimension of the synthetic queries and keys of Corollary 1
CONSTRUCTIONS = ("Gaussian", "aligned", "one long key")
GAP, NOISE = 2.0, 0.25          # logit gap of the planted key; standard deviation of the other logits
ESCAPE_NORMALIZERS = ("softmax", "ssmax", "sparsemax")
MODEL_RTOL = 1e-3               # relative tolerance of a model weight against its row's bounds (float32 weights)
MODEL_ATOL = torch.finfo(torch.float32).tiny   # a weight that underflowed to 0 is no violation
# per-head slope classes: "decays ~1/t" <= HEAD_DECAY, "O(1)" >= HEAD_FLAT
HEAD_DECAY, HEAD_FLAT = -0.5, -0.2
READING = {"reproduced": "the typical largest weight does shrink at a rate close to 1/t",
           "partly reproduced": "the typical largest weight shrinks, but clearly more slowly than 1/t",
           "not reproduced": "the typical largest weight does not shrink like 1/t over this window",
           "not comparable": "the decay with t is not measured on this model (an encoder: every row sees the whole "
                             "window)"}
# short column headers of the decay curves of decay_curves, for the chapter's table
DECAY_LABELS = {"mean_max": "mean max", "median_max": "median max", "mean_nosink": "mean max, token 0 excluded",
                "median_nosink": "median max, token 0 excluded", "mean_top5": "mean of top 5",
                "sink": "weight on token 0"}


# --- Lemma 1 on synthetic rows ----------------------------------------------------------------------------


def power_ticks(ax, largest: float) -> None:
    """Label a log-scaled x axis at the powers of two from 2 to ``largest`` (every other one beyond seven of them),
    without minor labels, so that no two labels collide on a short range."""
    powers = [2 ** k for k in range(1, int(math.log2(largest)) + 1)]
    shown = powers if len(powers) <= 7 else powers[::2]
    ax.set_xticks(shown, labels=[fmt(v) for v in shown])
    ax.xaxis.set_minor_locator(NullLocator())


def positive_functions(Ts: Sequence[float]) -> dict[str, Callable]:
    """The functions F of Eq. (3) checked against Lemma 1: softmax ``e^{l/T}`` at each T, softplus, 1 + sigmoid."""
    family: dict[str, Callable] = {f"softmax, T={T:g}": (lambda l, T=T: torch.exp(l / T)) for T in Ts}
    family["softplus"] = torch.nn.functional.softplus
    family["1 + sigmoid"] = lambda l: 1 + torch.sigmoid(l)
    return family


def draw_logits(pattern: str, a: float, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` rows of ``length`` logits in [-a, a] following ``pattern`` (one of :data:`PATTERNS`); the two
    "one at" patterns are the extreme rows where Lemma 1's bounds are nearly attained."""
    if pattern == "uniform":
        return (2 * torch.rand(n, length, generator=gen, dtype=F64) - 1) * a
    if pattern == "random +-a":
        return torch.where(torch.rand(n, length, generator=gen, dtype=F64) < 0.5, a, -a).to(F64)
    if pattern == "clipped Gaussian":
        return (torch.randn(n, length, generator=gen, dtype=F64) * a / 2).clamp(-a, a)
    extreme = torch.full((n, length), -a if pattern == "one at +a" else a, dtype=F64)
    extreme[:, 0] = -extreme[:, 0]
    return extreme


def _split(n: int, k: int) -> list[int]:
    """How many of ``n`` rows each of ``k`` cases gets when the rows cycle through the cases."""
    return [len(range(c, n, k)) for c in range(k)]


def representable(F: Callable, a: float) -> bool:
    """Whether F is a positive, finite float64 at -a, 0 and a: Lemma 1 needs m_F > 0 and M_F finite, and e^{l/T}
    leaves float64 on [-a, a] once a/T > 709 (softmax at T = 0.001 for a >= 0.71)."""
    ends = F(torch.tensor([-a, 0.0, a], dtype=F64))
    return bool(torch.isfinite(ends).all() and (ends > 0).all())


def lemma1_skipped(family: dict[str, Callable]) -> list[tuple[str, float]]:
    """The (F, a) pairs of :data:`A_GRID` that :func:`lemma1_table` leaves out, F not :func:`representable`."""
    return [(name, a) for name, F in family.items() for a in A_GRID if not representable(F, a)]


def lemma1_table(family: dict[str, Callable], lengths: Sequence[int], n_trials: int,
                 gen: torch.Generator) -> pd.DataFrame:
    """One row per synthetic row of logits: its F, length L, bound a, pattern, largest and smallest weight
    (Eq. (3) in float64), Lemma 1's bounds C1/L and C2/L and its tightness. ``n_trials`` rows per (F, L)
    cycle through :data:`COMBOS`; the rows of a bound a on which F is not a float64 (:func:`lemma1_skipped`) are
    left out."""
    frames = []
    counts = _split(n_trials, len(COMBOS))
    for f_name, F in family.items():
        kept = [(a, p, n) for (a, p), n in zip(COMBOS, counts) if n and representable(F, a)]
        if not kept:
            continue
        labels = {"a": [a for a, _, n in kept for _ in range(n)], "pattern": [p for _, p, n in kept for _ in range(n)]}
        for length in lengths:
            logits = torch.cat([draw_logits(p, a, n, length, gen) for a, p, n in kept])
            weights = normalizers.general(logits, F=F)
            bounds = {a: theory.lemma1_bounds(F, a, length) for a in dict.fromkeys(a for a, _, _ in kept)}
            frame = pd.DataFrame({**labels, "max weight": weights.amax(-1).cpu().numpy(),
                                  "min weight": weights.amin(-1).cpu().numpy()})
            frame["lower"] = frame.a.map(lambda a: bounds[a].lower)
            frame["upper"] = frame.a.map(lambda a: bounds[a].upper)
            frame["F"], frame["L"] = f_name, length
            frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    table["tightness"] = np.maximum(table["max weight"] / table.upper, table.lower / table["min weight"])
    return table


def lemma1_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per function F: rows checked, rows outside the bounds (beyond :data:`REL_TOL`), largest and median tightness."""
    return table.groupby("F", sort=False).agg(
        rows=("tightness", "size"), violations=("tightness", lambda r: int((r > 1 + REL_TOL).sum())),
        tightest=("tightness", "max"), **{"median tightness": ("tightness", "median")})


def lemma1_facts(table: pd.DataFrame, Ts: Sequence[float], skipped: Sequence[tuple[str, float]] = ()) -> dict:
    """The numbers the prose quotes about the check of Lemma 1 (and the claim ``ch1-lemma1-synthetic`` records):
    counts, the tightest row, the median tightness of the uniform rows, the bound ``a_fig`` of the figure (2 when
    drawn), Lemma 1's C2 = e^{2a/T} of the softmax at the smallest T for that bound, and the ``skipped`` (F, a)
    pairs (:func:`lemma1_skipped`)."""
    uniform = table[table.pattern == "uniform"]
    lengths = sorted(table.L.unique())
    a_fig = 2.0 if (table.a == 2.0).any() else float(table.a.iloc[0])
    T_small = min(Ts)
    exponent = 2 * a_fig / T_small  # C2 = e^{2a/T} of the softmax at T_small
    try:
        c2_small = math.exp(exponent)
    except OverflowError:
        c2_small = f"e^{exponent:.0f}, beyond float64"
    return {"lemma1_cases": len(table), "lemma1_n_F": table.F.nunique(), "lemma1_n_L": len(lengths),
            "lemma1_Lmin": int(lengths[0]), "lemma1_Lmax": int(lengths[-1]),
            "lemma1_violations": int((table.tightness > 1 + REL_TOL).sum()),
            "lemma1_tightest": float(table.tightness.max()),
            "lemma1_uniform_median": float(uniform.tightness.median()) if len(uniform) else float("nan"),
            "a_grid": list(A_GRID), "a_fig": a_fig, "T_small": T_small,
            "c2_small": c2_small,
            "lemma1_skipped": "; ".join(f"{name} with a = {fmt(a)}" for name, a in skipped) or "none"}


def plot_lemma1(table: pd.DataFrame, a: float) -> plt.Figure:
    """One panel per F, two per row: against L, the largest weight of any row and of the uniform rows, the smallest
    weight of any row, and Lemma 1's envelope C1/L, C2/L (two lines of slope -1 in log-log), for the rows with
    bound ``a``."""
    shown = table[table.a == a]
    names = list(dict.fromkeys(table.F))
    n_rows = math.ceil(len(names) / 2)
    fig, axes = plt.subplots(n_rows, 2, figsize=(7.5, 2.4 * n_rows + 1.3), sharex=True, sharey=True, squeeze=False)
    colors = sns.color_palette(figures.PALETTE)
    for ax, f_name in zip(axes.flat, names):
        sub = shown[shown.F == f_name]
        if sub.empty:  # F is not a float64 on [-a, a] (lemma1_skipped)
            ax.text(0.5, 0.5, f"not a float64 on [-{a:g}, {a:g}]:\nno rows", ha="center", va="center",
                    transform=ax.transAxes, fontsize="small")
            ax.set(xscale="log", yscale="log", title=f_name)
            continue
        by_L = sub.groupby("L").agg(worst_max=("max weight", "max"), worst_min=("min weight", "min"),
                                    lower=("lower", "first"), upper=("upper", "first"))
        typical = sub[sub.pattern == "uniform"].groupby("L")["max weight"].median()
        ax.plot(by_L.index, by_L.upper, "--", color="black", lw=1, label="$C_2/L$ and $C_1/L$")
        ax.plot(by_L.index, by_L.lower, "--", color="black", lw=1)
        ax.plot(by_L.index, by_L.worst_max, "o", color=colors[0], ms=4, label="largest weight (any row)")
        ax.plot(typical.index, typical.values, "s", color=colors[2], ms=3, label="largest weight (uniform rows)")
        ax.plot(by_L.index, by_L.worst_min, "v", color=colors[1], ms=4, label="smallest weight (any row)")
        ax.axhline(1, color="grey", lw=0.6)
        ax.set(xscale="log", yscale="log", title=f_name)
        power_ticks(ax, table.L.max())
    for i, ax in enumerate(axes.flat[:len(names)]):
        if i + 2 >= len(names):  # nothing below it: it carries the x axis
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel("row length $L$")
    for ax in axes[:, 0]:
        ax.set_ylabel("attention weight")
    handles = axes[0, 0].get_legend_handles_labels()
    if len(names) % 2:  # the free slot beside the last panel holds the legend
        axes.flat[-1].axis("off")
        axes.flat[-1].legend(*handles, loc="center", fontsize="small")
    else:
        fig.legend(*handles, loc="outside lower center", ncols=2, fontsize="small")
    figures.model_title(fig, f"Lemma 1 on synthetic rows with logits in [-{a:g}, {a:g}]", "synthetic data, no model")
    return fig


# --- Corollary 1 on synthetic queries and keys ------------------------------------------------------------


def draw_qk(construction: str, n: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` queries (n, d) and ``n`` key sets (n, length, d), d = :data:`D_SYN`, with random scales:
    "Gaussian"; "aligned" (k_1 = c q/||q||, k_j = -c q/||q||: every logit at +-Delta, where the bound is nearly
    attained); "one long key" (short random keys and one key 4c q/||q|| much longer than the others)."""
    scale_q = torch.exp(2 * torch.rand(n, 1, generator=gen, dtype=F64) - 1)
    scale_k = torch.exp(2 * torch.rand(n, 1, 1, generator=gen, dtype=F64) - 1)
    q = torch.randn(n, D_SYN, generator=gen, dtype=F64) * scale_q / math.sqrt(D_SYN)
    q_hat = (q / q.norm(dim=-1, keepdim=True)).unsqueeze(1)  # (n, 1, d)
    if construction == "aligned":
        k = -scale_k * q_hat.expand(n, length, D_SYN).clone()
        k[:, 0] = -k[:, 0]
        return q, k
    k = torch.randn(n, length, D_SYN, generator=gen, dtype=F64) * scale_k / math.sqrt(D_SYN)
    if construction == "one long key":
        k = k * 0.1
        k[:, 0] = 4 * scale_k[:, 0] * q_hat[:, 0]
    return q, k


def corollary1_table(Ts: Sequence[float], lengths: Sequence[int], n_trials: int,
                     gen: torch.Generator) -> pd.DataFrame:
    """One row per synthetic (q, keys) row: its T, L, construction, tightness against Corollary 1 (Delta with the
    largest key norm), and whether it violates the bound read with the *mean* key norm instead."""
    frames = []
    for T in Ts:
        for length in lengths:
            for construction, n in zip(CONSTRUCTIONS, _split(n_trials, len(CONSTRUCTIONS))):
                if n == 0:
                    continue
                q, k = draw_qk(construction, n, length, gen)
                weights = normalizers.softmax((k @ q.unsqueeze(-1)).squeeze(-1), T=T)
                lower, upper = (b[:, 0] for b in theory.corollary1_bounds(q.unsqueeze(1), k, T))
                spread_mean = torch.exp(2 * q.norm(dim=-1) * k.norm(dim=-1).mean(-1) / T)  # the "mean key" reading
                w_max, w_min = weights.amax(-1), weights.amin(-1)
                mean_violated = ((w_max > spread_mean / length * (1 + REL_TOL))
                                 | (w_min < 1 / (spread_mean * length) * (1 - REL_TOL)))
                frames.append(pd.DataFrame({
                    "T": T, "L": length, "construction": construction,
                    "tightness": torch.maximum(w_max / upper, torch.where(w_min > 0, lower / w_min, 0.0)).cpu().numpy(),
                    "mean reading violated": mean_violated.cpu().numpy()}))
    return pd.concat(frames, ignore_index=True)


def corollary1_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per construction: rows, largest tightness, rows violating the mean-key-norm reading."""
    return table.groupby("construction", sort=False).agg(
        rows=("tightness", "size"), tightest=("tightness", "max"),
        **{"violations, mean-norm reading": ("mean reading violated", "sum")})


def corollary1_facts(table: pd.DataFrame) -> dict:
    """The numbers the prose quotes about the synthetic check of Corollary 1."""
    long_key = table[table.construction == "one long key"]
    return {"cor1_cases": len(table), "cor1_violations": int((table.tightness > 1 + REL_TOL).sum()),
            "cor1_tightest": float(table.tightness.max()),
            "cor1_mean_violations": int(table["mean reading violated"].sum()),
            "cor1_mean_violations_long": int(long_key["mean reading violated"].sum()), "cor1_long_rows": len(long_key)}


# --- who escapes Lemma 1 ----------------------------------------------------------------------------------


def escape_table(lengths: Sequence[int], n_trials: int, gen: torch.Generator) -> pd.DataFrame:
    """One row per (synthetic row, normalizer): the largest weight when one planted key exceeds the others, small
    Gaussian noise of sd :data:`NOISE`, by :data:`GAP`, under softmax, scalable softmax (s = 1) and sparsemax
    at T = 1."""
    rows = []
    for length in lengths:
        logits = torch.randn(n_trials, length, generator=gen, dtype=F64) * NOISE
        logits[:, 0] = GAP + logits[:, 1:].amax(-1) if length > 1 else GAP
        for name in ESCAPE_NORMALIZERS:
            w = registry.normalize(logits, name, T=1.0)
            rows += [{"normalizer": name, "L": length, "max weight": float(v)} for v in w.amax(-1)]
    return pd.DataFrame(rows)


def plot_escape(table: pd.DataFrame) -> plt.Figure:
    """Mean largest weight against L for each normalizer, with the 1/L of Lemma 1."""
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    sns.lineplot(data=table, x="L", y="max weight", hue="normalizer", style="normalizer", markers=True,
                 errorbar=None, ax=ax, palette=figures.NORMALIZER_COLOURS)
    grid_L = np.array(sorted(table.L.unique()), dtype=float)
    ax.plot(grid_L, 1 / grid_L, ":", color="grey", label="$1/L$")
    ax.set(xscale="log", yscale="log", xlabel="row length $L$", ylabel="largest weight of the row (mean)")
    power_ticks(ax, table.L.max())
    ax.legend(fontsize="small", loc="lower left")
    figures.model_title(fig, f"One planted key with logit gap {GAP:g}: who keeps it?", "synthetic data, no model")
    return fig


# --- Corollary 1 on a model -------------------------------------------------------------------------------


class ModelCheck(NamedTuple):
    """Corollary 1 on every row of a captured model: the tidy per-row table and the global counts."""

    rows: pd.DataFrame   # one row per (layer, head, t): largest/smallest weights, token-0 weight, bounds, spread
    violations: int      # weights outside their row's bounds beyond MODEL_RTOL (and MODEL_ATOL below)
    weights: int         # weights checked (the causal triangle of every head)
    recon_error: float   # max |softmax(q k^T / T) - captured weight|: is T = 1/scaling the model's temperature?


def model_rows(captured, visible: torch.Tensor | None = None) -> ModelCheck:
    """Check Corollary 1 on every weight of ``captured`` (weights, q and k, as the model computed them), row t
    seeing the keys of ``visible`` ((L, L) booleans; None: the causal prefix j <= t), n_t of them:
    Delta_t = ||q_t|| max_{j seen} ||k_j||, bounds e^{-+2 Delta_t/T} / n_t, T = 1/scaling. The table's ``t`` is n_t."""
    n_layers, n_heads, L = captured.weights.shape[:3]
    device = captured.weights.device  # the analysis runs where the model ran
    visible = normalizers.causal_mask(L, device=device) if visible is None else visible.to(device)
    hidden = ~visible
    per_row = {name: torch.full((n_layers, n_heads, L), torch.nan, dtype=F64, device=device)
               for name in ("max weight", "min weight", "max weight, token 0 excluded", "mean top-5 weight",
                            "weight on token 0", "log10 spread", "lower", "upper")}
    n_t = visible.sum(-1)
    n_violations, recon_error = 0, 0.0
    for layer in range(n_layers):
        T = float(captured.temperature[layer])
        q, k, w = captured.q[layer], captured.k[layer], captured.weights[layer]
        lower, upper = theory.corollary1_bounds(q.to(F64), k.to(F64), T, mask=visible)  # (heads, L) each
        row_max, row_min = w.amax(-1).to(F64), w.masked_fill(hidden, torch.inf).amin(-1).to(F64)
        high, low = upper * (1 + MODEL_RTOL), lower * (1 - MODEL_RTOL) - MODEL_ATOL
        if (row_max > high).any():  # count the offending weights exactly
            bad = row_max > high
            n_violations += int((w[bad].to(F64) > high[bad].unsqueeze(-1)).sum())
        if (row_min < low).any():
            bad = row_min < low
            n_violations += int(((w[bad].to(F64) < low[bad].unsqueeze(-1)) & visible.expand_as(w)[bad]).sum())
        recomputed = torch.softmax((q @ k.mT).mul_(1 / T).masked_fill_(hidden, -torch.inf), dim=-1)
        recon_error = max(recon_error, float(recomputed.sub_(w).abs_().amax()))
        key_norms = k.to(F64).norm(dim=-1)  # (heads, L): the largest norm among the keys each row sees
        delta = q.to(F64).norm(dim=-1) * key_norms[:, None, :].masked_fill(hidden, 0).amax(-1)
        per_row["log10 spread"][layer] = 2 * delta / T / math.log(10)  # log10 of e^{2 Delta / T}
        per_row["lower"][layer], per_row["upper"][layer] = lower, upper
        per_row["max weight"][layer], per_row["min weight"][layer] = row_max, row_min
        per_row["weight on token 0"][layer] = w[..., 0]
        more = n_t > 1  # rows that see a key besides token 0 (every key they see but token 0 comes after it)
        per_row["max weight, token 0 excluded"][layer, :, more] = w[:, more, 1:].amax(-1).to(F64)
        five = n_t >= 5
        if five.any():
            per_row["mean top-5 weight"][layer, :, five] = torch.topk(w[:, five], 5, dim=-1).values.mean(-1).to(F64)
    rows = pd.DataFrame({name: v.flatten().cpu().numpy() for name, v in per_row.items()})
    rows["layer"] = np.repeat(np.arange(n_layers), n_heads * L)
    rows["head"] = np.tile(np.repeat(np.arange(n_heads), L), n_layers)
    rows["t"] = np.tile(n_t.cpu().numpy(), n_layers * n_heads)
    return ModelCheck(rows, n_violations, n_layers * n_heads * int(n_t.sum()), recon_error)


#: the window lengths an encoder reads for the decay of its rows (one forward pass each), besides its window's L
ENCODER_LENGTHS = (4, 8, 16, 32, 64, 128, 256)


def session_rows(session, what=("weights", "q", "k")):
    """Corollary 1 on every row (:func:`model_rows`) and the capture of the session's window. On a causal model one
    window holds every row length t <= L; on an encoder every row sees the whole window, so it reads a window of each
    length of :data:`ENCODER_LENGTHS` below L besides its own (one forward pass each), and the table holds the rows
    of every window (t: that window's length)."""
    captured = session.capture(what=what)
    if session.causal:
        return model_rows(captured), captured
    windows = [session.window(n) for n in ENCODER_LENGTHS if n < session.L]
    checks = [model_rows(w.capture(what=what), w.visible()) for w in windows]
    checks.append(model_rows(captured, session.visible()))
    return ModelCheck(pd.concat([c.rows for c in checks], ignore_index=True), sum(c.violations for c in checks),
                      sum(c.weights for c in checks), max(c.recon_error for c in checks)), captured


def last_rows(rows: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """The per-row quantities of the longest row (t = L) of the first ``n`` heads, one column per head, for reading."""
    last = rows[rows.t == rows.t.max()].groupby(["layer", "head"]).tail(1).head(n)  # an encoder's: its last row
    shown = last.drop(columns=["layer", "head", "t"]).T
    shown.columns = [f"layer {r.layer}, head {r.head}" for r in last.itertuples()]
    return shown.rename_axis(f"row t = {int(rows.t.max())}")


def model_facts(check: ModelCheck, captured) -> dict:
    """The numbers the prose quotes about Corollary 1 on the model: the counts, how close rows t >= 2 come to their
    bounds, and how far the bound lets a weight stray from 1/t (log10 e^{2 Delta_t/T}) against what is used."""
    n_layers, n_heads, L = captured.weights.shape[:3]
    temperatures = captured.temperature.tolist()
    longer = check.rows[check.rows.t >= 2]
    observed = np.log10(longer.t * longer["max weight"])
    nan = float("nan")
    return {"m_L": L, "m_heads": f"{n_layers} layers x {n_heads} heads", "m_n_heads": n_layers * n_heads,
            "m_T": (f"{temperatures[0]:g}" if len(set(temperatures)) == 1
                    else f"{min(temperatures):g} to {max(temperatures):g} (by layer)"),
            "m_weights": check.weights, "m_rows": len(check.rows), "m_violations": check.violations,
            "m_recon_err": check.recon_error,
            "m_tight_up": float((longer["max weight"] / longer.upper).max()) if len(longer) else nan,
            "m_tight_lo": float((longer.lower / longer["min weight"]).replace(np.inf, 0).max()) if len(longer) else nan,
            "m_spread_median": float(longer["log10 spread"].median()),
            "m_spread_min": float(longer["log10 spread"].min()),
            "m_vacuous": 100 * float((longer["log10 spread"] >= np.log10(longer.t)).mean()),
            "m_obs_median": float(observed.median()), "m_obs_max": float(observed.max())}


def plot_spread(rows: pd.DataFrame, model: str) -> plt.Figure:
    """Top: per layer, the distribution over rows t >= 2 of log10 e^{2 Delta_t/T}, the factor Corollary 1 allows
    above 1/t; bottom: that factor pooled, against the factor used, log10(t max_j alpha_{t,j})."""
    valid = rows[rows.t >= 2]
    L = int(rows.t.max())
    observed = np.log10(valid.t * valid["max weight"])
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7.5, 7.0))
    sns.boxplot(data=valid, x="layer", y="log10 spread", showfliers=False,
                color=sns.color_palette(figures.PALETTE)[0], ax=ax1, linewidth=0.8)
    ax1.axhline(np.log10(L), ls="--", color="black", lw=1, label=f"$\\log_{{10}} {L}$: upper bound > 1 on every row")
    ax1.set(ylabel="$\\log_{10} e^{2\\Delta_t/T}$\n= $\\log_{10}$(upper bound $\\times\\, t$)", xlabel="layer")
    ax1.tick_params(axis="x", labelsize="small")
    ax1.legend(fontsize="small", loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    both = pd.concat([
        pd.DataFrame({"value": valid["log10 spread"], "quantity": "allowed: $\\log_{10} e^{2\\Delta_t/T}$"}),
        pd.DataFrame({"value": observed, "quantity": "observed: $\\log_{10}(t\\,\\max_j \\alpha_{t,j})$"})])
    sns.histplot(data=both, x="value", hue="quantity", bins=80, stat="density", common_norm=False, element="step",
                 ax=ax2)
    ax2.set(xlabel="$\\log_{10}$ of ($t$ times a weight)")
    sns.move_legend(ax2, "lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, title=None, frameon=False,
                    fontsize="small")
    figures.model_title(fig, "How far Corollary 1 lets a weight stray from 1/t, per row", model)
    return fig


# --- do the weights vanish like 1/t? ----------------------------------------------------------------------


def fit_start(L: int) -> int:
    """The shortest row length t the decay fits use: 16, or L/4 for short windows (at least 2)."""
    return max(2, min(16, L // 4))


def decay_curves(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per row length t >= 2, averages over all heads of the largest weight (with and without token 0), the mean of
    the top five weights and the weight on token 0; and the same curves averaged over ~40 log-spaced bins of t,
    indexed by the bins' geometric centres."""
    L = int(rows.t.max())
    by_t = rows[rows.t >= 2].groupby("t").agg(
        mean_max=("max weight", "mean"), median_max=("max weight", "median"),
        mean_nosink=("max weight, token 0 excluded", "mean"), median_nosink=("max weight, token 0 excluded", "median"),
        mean_top5=("mean top-5 weight", "mean"), sink=("weight on token 0", "mean"))
    edges = np.unique(np.round(np.geomspace(2, L + 1, 41)).astype(int))
    t_bin = pd.Series(np.digitize(by_t.index, edges), index=by_t.index)
    binned = by_t.groupby(t_bin).mean()
    binned.index = by_t.index.to_series().groupby(t_bin).apply(lambda s: float(np.exp(np.log(s).mean()))).round(1) \
        .to_numpy()
    binned.index.name = "t (bin centre)"
    return by_t, binned


def fitted_slope(series: pd.Series, t_min: float) -> float:
    """The log-log slope of series against its index over the entries with index >= t_min
    (``fitting.loglog_slope``, with its NaN rule): -1 for a weight that decays like 1/t."""
    keep = series.index >= t_min
    return loglog_slope(np.asarray(series.index[keep], dtype=float), series.to_numpy(dtype=float)[keep])


def decay_facts(rows: pd.DataFrame, binned: pd.DataFrame) -> dict:
    """The fitted slopes of the binned curves over t >= t_min (the claim ``ch1-vanishing-model`` is decided on the
    median largest weight excluding token 0) and the mean weight on token 0 over the second half of the window."""
    L = int(rows.t.max())
    t_min = fit_start(L)
    return {"m_tmin": t_min, "m_slope_nosink": fitted_slope(binned.median_nosink, t_min),
            "m_slope_max": fitted_slope(binned.median_max, t_min),
            "m_slope_top5": fitted_slope(binned.mean_top5, t_min),
            "m_sink_share": float(rows[rows.t > L // 2]["weight on token 0"].mean())}


def plot_decay(by_t: pd.DataFrame, binned: pd.DataFrame, slope: float, model: str) -> plt.Figure:
    """The curves of :func:`decay_curves` (thin: single t, thick: log-binned), the fit of the binned median largest
    weight without token 0 over t >= t_min, and the uniform weight 1/t."""
    t_min = fit_start(int(by_t.index.max()))
    fig, ax = plt.subplots(figsize=(7.0, 5.6))
    curves = {"mean_max": "mean max weight", "mean_nosink": "mean max weight, token 0 excluded",
              "median_nosink": "median max weight, token 0 excluded", "mean_top5": "mean of the top-5 weights",
              "sink": "mean weight on token 0"}
    palette = sns.color_palette(figures.PALETTE)
    colours = [palette[i] for i in (0, 1, 2, 5, 4)]  # no two oranges side by side
    for (column, label), ls, color in zip(curves.items(), ["-", "-", "--", "-", ":"], colours):
        ax.plot(by_t.index, by_t[column], ls, color=color, lw=0.6, alpha=0.3)
        ax.plot(binned.index, binned[column], ls, color=color, lw=1.8, label=label)
    fit_x = binned.index[binned.index >= t_min].to_numpy()
    fit_y = loglog_fit(fit_x, binned.median_nosink.loc[fit_x].to_numpy())(fit_x)
    ax.plot(fit_x, fit_y, color="grey", lw=3, alpha=0.5, label=f"fit, slope {slope:.2f}")
    ax.plot(by_t.index, 1 / by_t.index.to_numpy(), color="black", lw=1, ls="-.",
            label="$1/t$ (uniform weight, slope $-1$)")
    ax.axvline(t_min, color="grey", lw=0.6)
    ax.set(xscale="log", yscale="log", xlabel="row length $t$ (keys seen by the query)", ylabel="weight")
    power_ticks(ax, by_t.index.max())
    fig.legend(loc="outside lower center", ncols=2, fontsize="small")
    figures.model_title(fig, "Largest attention weights against row length, averaged over all heads", model)
    return fig


def head_slopes(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (layer, head): the log-log slope of the head's median largest weight (token 0 included, and
    excluded) over 12 log-spaced bins of t >= t_min, each bin at the geometric mean of its t."""
    L = int(rows.t.max())
    t_min = fit_start(L)
    edges = np.unique(np.round(np.geomspace(t_min, L + 1, 13)).astype(int))
    fit_rows = rows[rows.t >= t_min].copy()
    fit_rows["bin"] = np.digitize(fit_rows.t, edges)
    binned = fit_rows.groupby(["layer", "head", "bin"]).agg(
        t=("t", lambda s: float(np.exp(np.log(s).mean()))), with_sink=("max weight", "median"),
        without_sink=("max weight, token 0 excluded", "median")).reset_index()

    def slopes(column):
        return binned.groupby(["layer", "head"]).apply(
            lambda g: loglog_slope(g.t, g[column]),
            include_groups=False)

    return pd.DataFrame({"token 0 included": slopes("with_sink"), "token 0 excluded": slopes("without_sink")})


def head_classes(slopes: pd.DataFrame) -> pd.DataFrame:
    """Share (%) of the heads whose slope says "decays ~1/t" (<= HEAD_DECAY), "in between", or "O(1)" (>= HEAD_FLAT)."""
    classes = slopes.apply(lambda s: pd.cut(s, [-np.inf, HEAD_DECAY, HEAD_FLAT, np.inf], right=False,
                                            labels=["decays ~1/t", "in between", "O(1)"]).value_counts(normalize=True))
    return (100 * classes).reindex(["decays ~1/t", "in between", "O(1)"]).rename_axis("heads (%)")


def plot_head_slopes(slopes: pd.DataFrame, t_min: int, model: str) -> plt.Figure:
    """Histogram of the per-head slopes, with the slope -1 of Lemma 1 and the class limits."""
    fig, ax = plt.subplots(figsize=(6.8, 4.0))
    long_slopes = slopes.melt(var_name="largest weight", value_name="slope")
    sns.histplot(data=long_slopes, x="slope", hue="largest weight", bins=30, element="step", ax=ax)
    sns.move_legend(ax, "lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False, fontsize="small")
    for x, ls in ((-1, "-"), (HEAD_DECAY, "--"), (HEAD_FLAT, "--")):
        ax.axvline(x, color="black", lw=0.8, ls=ls)
    ax.set(xlabel=f"log-log slope of the head's median largest weight against $t$ ($t\\geq{t_min}$)",
           ylabel="number of heads")
    figures.model_title(fig, "Per-head decay of the largest weight", model)
    return fig
