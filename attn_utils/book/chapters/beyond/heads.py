"""Several heads in chapter ch6_beyond (Def. ch6-def-coverage, Prop. ch6-prop-coverage): the keys a layer's heads
cover together, the paper's prediction, the prediction under independence and a permutation test of it."""
from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch

from attn_utils.book import figures
from attn_utils.book.chapters.beyond.common import F64, legend_below, n_axis, nothing_to_draw, two_panels
from attn_utils.book.chapters.beyond.geometry import GeometryModel
from attn_utils.book.chapters.beyond.logits import ModelLogits
from attn_utils.book.formatting import fmt
from attn_utils.mathematics import beyond


@dataclass
class Coverage:
    """``table``: one row per N (observed coverage, the two predictions, the permutation test); ``phis``: one row per
    (N, layer, pair of heads) with the phi coefficient of their separation on the keys both select."""

    m: ModelLogits = field(repr=False)
    Ns: list[int]
    n_samples: int
    table: pd.DataFrame
    phis: pd.DataFrame

    @property
    def N(self) -> int | None:
        """The N the prose and the claims report: the largest N <= 16 of the grid (else the largest measured)."""
        if not len(self.table):
            return None
        measured = set(self.table.N)
        return int(max([n for n in self.Ns if n <= 16 and n in measured] or [self.table.N.max()]))

    @property
    def row(self) -> pd.Series:
        return self.table.set_index("N").loc[self.N]

    def shown(self) -> pd.DataFrame:
        """The table on its side, one column per N, so that it fits the text column."""
        return self.table.set_index("N").T.rename(columns=lambda n: f"N = {n}").rename_axis(columns=None)

    @property
    def pvalue_text(self) -> str:
        p = self.row["permutation p-value"]
        return "n/a (no pair of heads without a shared key/value head)" if p != p else \
            f"< {1 / self.n_samples:.2g}" if p == 0 else f"= {fmt(p)}"

    def prose(self) -> dict:
        if self.N is None:
            return {k: "n/a" for k in ("cov_N", "cov_p", "cov_U", "cov_obs", "cov_ind", "cov_paper", "cov_z",
                                        "cov_pvalue", "cov_nperm", "cov_layers", "phi_median", "phi_share", "phi_same",
                                        "phi_other", "cov_direction", "cov_paper_relation", "cov_formula_text",
                                        "cov_tested")}
        r, N = self.row, self.N
        paper, observed, z = r["paper 1-(1-p)^H"], r["observed coverage"], r["z (observed vs null)"]
        at = self.phis[self.phis.N == N].dropna()
        same, other = at[at.pair == "same key/value head"].phi, at[at.pair != "same key/value head"].phi
        gap = paper - observed
        return {"cov_N": N, "cov_p": r["mean p = N_s/N"], "cov_U": fmt(r["mean |U| / N"], 3), "cov_obs": observed,
                "cov_ind": r["independence given selection"], "cov_paper": paper, "cov_z": fmt(z, 2),
                "cov_pvalue": self.pvalue_text, "cov_nperm": self.n_samples,
                "cov_layers": f"{int(r['layers rejecting at 0.01'])} of {self.m.n_layers}",
                "phi_median": at.phi.median() if len(at) else "n/a",
                "phi_share": f"{100 * (at.pvalue < 0.01).mean():.0f}%" if len(at) else "n/a",
                "phi_same": same.median() if len(same) else "n/a (every head has its own key/value head)",
                "phi_other": other.median() if len(other) else "n/a",
                "cov_tested": f"{int(r['head pairs tested per layer'])} pairs of heads per layer that share no "
                              "key/value head" if r["head pairs tested per layer"] else
                              "no pair of heads: every pair of a layer shares its key/value head, so the test is not "
                              "comparable on this model",
                "cov_direction": "n/a (no pair tested)" if z != z and not r["head pairs tested per layer"] else
                                 "about as many keys as independent heads would" if not abs(z) >= 2 else
                                 "fewer keys than independent heads would (the heads separate overlapping sets)"
                                 if z < 0 else
                                 "more keys than independent heads would (the heads complement each other)",
                "cov_paper_relation": "matches (within 0.05)" if abs(gap) <= 0.05 else
                                      "overstates" if gap > 0 else "understates",
                "cov_formula_text": f"is not a good model of these heads: at N = {N} it predicts {fmt(paper)}, while "
                                    f"{fmt(observed)} of the keys are covered" if abs(gap) > 0.05 else
                                    f"matches these heads to within 0.05 at N = {N} ({fmt(paper)} predicted, "
                                    f"{fmt(observed)} observed)"}

    def coverage_claim(self) -> dict:
        r = self.row
        return {"N": self.N, "heads": self.m.n_heads, "observed": r["observed coverage"], "p": r["mean p = N_s/N"],
                "paper": r["paper 1-(1-p)^H"], "independent": r["independence given selection"]}

    def independence_claim(self) -> dict:
        r = self.row
        return {"N": self.N, "z": r["z (observed vs null)"], "pvalue": r["permutation p-value"],
                "pairs": int(r["head pairs tested per layer"]), "p_text": self.pvalue_text,
                "permutations": self.n_samples,
                "layers_rejecting": int(r["layers rejecting at 0.01"]), "layers": self.m.n_layers}


def independence_groups(kv_head) -> np.ndarray:
    """The query heads split into groups that share no key/value head, ``(per, n_kv)``: group j holds the j-th
    query head of every key/value head (``kv_head``: the key/value head of each query head). Without sharing it is
    one group of all heads; with one key/value head for all, groups of one head each (no pair to test)."""
    kv = np.asarray(kv_head)
    kvs = np.unique(kv)
    members = [np.flatnonzero(kv == g) for g in kvs]
    if len({len(g) for g in members}) != 1:
        raise ValueError(f"every key/value head must serve as many query heads, got kv_head={kv.tolist()}")
    return np.stack(members, axis=1)


def coverage(m: ModelLogits, geo: GeometryModel, Ns, n_samples: int, seed: int) -> Coverage:
    """Per N of ``Ns``, over every layer and sampled row t <= L (softmax, value vectors on the sphere): the observed
    coverage of the universe U by all the heads of a layer (``beyond.coverage``), the paper's 1 - (1 - p)^H with p
    the mean N_s / N, the expectation under independence given each head's top-N set (Prop. ch6-prop-coverage), and
    a permutation test of that independence (``n_samples`` within-head shuffles seeded by ``seed + 2``; the pooled
    total and each layer) between heads that share no key/value head (:func:`independence_groups`: the groups'
    covered totals are pooled; no test where every pair shares one, as on Gemma 3); per pair of heads, the phi
    coefficient (``beyond.head_association``)."""
    gen = torch.Generator().manual_seed(seed + 2)
    n_layers, n_heads = m.n_layers, m.n_heads
    kv_head = m.kv_head if m.kv_head is not None else list(np.arange(n_heads) // max(1, n_heads // m.kv_heads))
    group_of = np.asarray(kv_head)  # key/value head of each query head (GQA)
    groups = independence_groups(kv_head)
    pairs = groups.shape[0] * groups.shape[1] * (groups.shape[1] - 1) // 2
    order = torch.as_tensor(groups.flatten(), device=m.device)
    iu = np.triu_indices(n_heads, 1)
    same = np.broadcast_to((group_of[iu[0]] == group_of[iu[1]])[None, :], (n_layers, len(iu[0])))
    rows, phis = [], []
    for n_top in Ns:
        if not geo.coverage_inputs.get(n_top):
            continue
        total = dict.fromkeys(("covered", "union", "expected", "p", "t_covered", "t_expected"), 0.0) | {"rows": 0}
        f64 = dict(dtype=F64, device=m.device)
        null, null_layer = torch.zeros(n_samples, **f64), torch.zeros(n_samples, n_layers, **f64)
        obs_layer, exp_layer, counts = torch.zeros(n_layers, **f64), torch.zeros(n_layers, **f64), None
        for sel, sep, ok in geo.coverage_inputs[n_top]:
            res = beyond.coverage(sel, sep, ok, n_top)
            v = res.valid
            for key in ("covered", "union", "expected"):
                total[key] += float(getattr(res, key)[v].sum())
            total["p"] += float((res.separated.double() / n_top).mean(-2)[v].sum())
            total["rows"] += int(v.sum())
            if pairs:
                shape = (*sel.shape[:-3], *groups.shape, *sel.shape[-2:])
                test = beyond.coverage(sel[..., order, :, :].reshape(shape), sep[..., order, :, :].reshape(shape),
                                       v[..., None, None, :], n_top, n_perm=n_samples, generator=gen)
                t_v = test.valid
                total["t_covered"] += float(test.covered[t_v].sum())
                total["t_expected"] += float(test.expected[t_v].sum())
                null, null_layer = null + test.null.sum((-1, -2)), null_layer + test.null.sum(-1)
                obs_layer += torch.where(t_v, test.covered, 0).sum((-1, -2)).double()
                exp_layer += torch.where(t_v, test.expected, 0.0).sum((-1, -2))
            assoc = beyond.head_association(sel, sep, ok)
            counts = {k: assoc[k] + (counts[k] if counts else 0) for k in ("n11", "n10", "n01", "n00")}
        if total["rows"] == 0:
            continue
        rows.append(_coverage_row(n_top, n_heads, n_samples, pairs, total, null, null_layer, obs_layer, exp_layer))
        assoc = beyond.association_from_counts(**counts)
        phis.append(pd.DataFrame({"N": n_top, "phi": assoc["phi"].cpu().numpy()[:, iu[0], iu[1]].flatten(),
                                  "pvalue": assoc["pvalue"].cpu().numpy()[:, iu[0], iu[1]].flatten(),
                                  "pair": np.where(same, "same key/value head",
                                                   "different key/value heads").flatten()}))
    phis = pd.concat(phis, ignore_index=True) if phis else pd.DataFrame(columns=["N", "phi", "pvalue", "pair"])
    return Coverage(m, list(Ns), n_samples, pd.DataFrame(rows), phis)


def _coverage_row(n_top, n_heads, n_samples, pairs, total, null, null_layer, obs_layer, exp_layer) -> dict:
    """One row of the coverage table: pooled totals of all the heads; the z-score and two-sided permutation p-value
    of the covered total of the groups of heads that share no key/value head against its null (NaN without a pair
    of such heads), and how many layers reject independence on their own at 0.01."""
    observed, expected = total["t_covered"], total["t_expected"]
    spread = float(null.std()) if n_samples > 1 and pairs else float("nan")
    if pairs:
        pvalue = float(((null - expected).abs() >= abs(observed - expected) - 1e-9).double().mean())
        per_layer = ((null_layer - exp_layer).abs() >= (obs_layer - exp_layer).abs() - 1e-9).double().mean(0)
        rejecting = int((per_layer < 0.01).sum())
    else:
        pvalue, rejecting = float("nan"), 0
    p_bar = total["p"] / total["rows"]
    return {"N": n_top, "rows": total["rows"], "mean p = N_s/N": p_bar,
            "mean |U| / N": total["union"] / total["rows"] / n_top,
            "observed coverage": total["covered"] / total["union"],
            "independence given selection": total["expected"] / total["union"],
            "paper 1-(1-p)^H": 1 - (1 - p_bar) ** n_heads,
            "head pairs tested per layer": pairs,
            "z (observed vs null)": (observed - expected) / spread if spread > 0 else float("nan"),
            "permutation p-value": pvalue, "layers rejecting at 0.01": rejecting}


def plot_coverage(res: Coverage, corpus: str, seed: int) -> plt.Figure:
    """(a) Against N: the observed coverage, its two predictions and the mean p; (b) per N, box plots of the phi
    coefficient of the pairs of heads of a layer."""
    if not len(res.table):
        return nothing_to_draw("Softmax is not among the normalizers measured, or no N of the grid is below L: "
                               "no coverage to draw.")
    fig, axes = two_panels()
    t = res.table
    for column, style in (("observed coverage", "o-"), ("independence given selection", "s--"),
                          ("paper 1-(1-p)^H", "^:"), ("mean p = N_s/N", "v-.")):
        axes[0].plot(t.N, t[column], style, label=column)
    axes[0].set(xlabel="top-N size $N$", ylabel="share of U (or p)", ylim=(0, 1.05))
    axes[0].set_title("(a) coverage by a layer's heads", fontsize="medium")
    n_axis(axes[0], t.N)
    sns.boxplot(data=res.phis.dropna(), x="N", y="phi", hue="pair", ax=axes[1], fliersize=1, linewidth=0.8)
    axes[1].axhline(0, color="black", lw=0.8)
    axes[1].set(xlabel="top-N size $N$", ylabel="phi of a pair of heads")
    axes[1].set_title("(b) pairs of heads", fontsize="medium")
    legend_below(fig, *axes, ncol=2)
    m = res.m
    figures.model_title(fig, f"Coverage by {m.n_heads} heads per layer ({res.n_samples} permutations, seed {seed})",
                        m.model)
    return fig
