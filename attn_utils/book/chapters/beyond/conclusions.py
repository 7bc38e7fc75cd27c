"""The conclusions of chapter ch6_beyond: one row per normalizer from every lens, and the sentences built from it."""
from __future__ import annotations

import math

import pandas as pd

from attn_utils.book.chapters.beyond.common import label, listing
from attn_utils.book.chapters.beyond.geometry import GeometryModel, GeometrySynthetic
from attn_utils.book.chapters.beyond.gradient import GradientModel, GradientSynthetic
from attn_utils.book.chapters.beyond.lemma1 import Lemma1Model, Lemma1Synthetic
from attn_utils.book.formatting import fmt
from attn_utils.mathematics import registry


def summary(names, lem: Lemma1Synthetic, geo_syn: GeometrySynthetic, grad_syn: GradientSynthetic,
            lem_m: Lemma1Model, geo_m: GeometryModel, grad_m: GradientModel) -> tuple[pd.DataFrame, str, str]:
    """The summary table (one row per normalizer), a sentence per normalizer assembled from the same numbers, and
    the sentence on which rules both escape Lemma 1 and keep a usable gradient."""
    lo, hi, esc = lem.planted_lo, lem.planted_hi, lem.escapes
    slopes, zeros, syn_slopes = lem_m.slopes, lem_m.zeros, geo_syn.slopes
    sep, dist = geo_m.at(geo_m.N_max), geo_m.at(geo_m.N)
    keeps = {n: grad_syn.keeps[n] and grad_m.keeps[n] for n in names}
    geo = set(geo_m.names)
    table = pd.DataFrame({label(n): {
        "rows are": registry.get(n).kind,
        "forced to vanish (Lemma 1 or Prop.)": fmt(registry.get(n).vanishes),
        f"planted key, weight at L={min(lem.lengths)} -> {max(lem.lengths)} (synthetic)":
            f"{fmt(lo[n])} -> {fmt(hi[n])}",
        "escapes Lemma 1 (measured)": fmt(esc[n]),
        "model: slope of max weight vs t (token 0 excluded)": fmt(slopes[n], 2),
        "model: exact zeros": f"{100 * zeros[n]:.0f}%",
        f"synthetic: slope of d~ vs L (N={geo_syn.N})": fmt(syn_slopes[n], 2) if n in geo else "n/a (signed)",
        f"model: d~ at N={geo_m.N}": fmt(dist.loc[n, "distance"]) if n in geo else "n/a (signed)",
        f"model: N_s/N at N={geo_m.N_max}": fmt(sep.loc[n, "separability"], 2) if n in geo else "n/a (signed)",
        f"gradient kept at T={fmt(min(grad_syn.Ts))} (synthetic, model)":
            f"{fmt(grad_syn.usable[n], 2)}, {fmt(grad_m.usable[n], 2)}",
        "keeps a usable gradient": fmt(keeps[n])} for n in names}).T
    table.index.name = "normalizer"

    def sentence(n: str) -> str:
        parts = ["escapes Lemma 1" if esc[n] else "does not escape Lemma 1"]
        mine = sep.loc[n, "separability"] if n in geo else None
        if n == "softmax":
            parts.append(f"separates {fmt(mine, 2)} of its top {geo_m.N_max} (the reference)")
        elif n in geo:
            ref = sep.loc["softmax", "separability"] if "softmax" in sep.index else float("nan")
            relation = ("" if not math.isfinite(ref) else " about as much as softmax" if abs(mine - ref) <= 0.05 else
                        " more than softmax" if mine > ref else " less than softmax")
            short = sep.loc[n, "support < N"]
            tail = f"; its support is smaller than N on {100 * short:.0f}% of the rows)" if short > 0.5 else ")"
            parts.append(f"separates{relation} at N = {geo_m.N_max} ({fmt(mine, 2)}{tail}")
        else:
            parts.append("has no distance or separability (signed weights)")
        parts.append("keeps a usable gradient at small T" if keeps[n] else "loses its gradient at small T")
        return f"{label(n)}: " + ", ".join(parts) + "."

    both = [n for n in names if esc[n] and keeps[n]]
    both_text = (f"Only {listing(both)} both escapes Lemma 1 and keeps a usable gradient" if both else
                 "No rule measured here both escapes Lemma 1 and keeps a usable gradient")
    return table, " ".join(sentence(n) for n in names), both_text


def summary_tables(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The summary table of :func:`summary` in two parts that each fit the text column, keyed by their captions: the
    columns of Lemma 1's lens, then those from the distance lens on."""
    cut = next(i for i, c in enumerate(table.columns) if c.startswith("synthetic: slope of d~"))
    return {"The remedies under Lemma 1's lens": table.iloc[:, :cut],
            "The remedies under the distance, separability and gradient lenses": table.iloc[:, cut:]}
