"""One record per normalizer: everything the book knows about a rule that turns logits into weights.

A :class:`Normalizer` holds the function (the uniform contract of :mod:`normalizers`: logits of any batch
shape, keys on the last axis, a boolean ``mask``, masked keys weigh exactly 0), its label for figures and
tables, what its rows are (``distribution``, ``sub-distribution`` of mass <= 1, or ``signed``), its keyword
parameters, the Lemma 1 envelope (the band every weight of a row of L logits in [-a, a] lies in, chapter
``ch6_beyond``, Propositions 1-2), whether Lemma 1 or Proposition ch6-prop-still-vanish forces its weights to
vanish like 1/L (``vanishes``), the weight it guarantees a key whose logit leads its row by a gap (``planted``),
its Jacobian d alpha / d l in closed form (:mod:`beyond` evaluates it) and the bound on that Jacobian's spectral
norm of Proposition ch6-prop-jacobians (``jacobian_norm``). **Adding a normalizer is one record in**
:data:`RECORDS` **plus its tests**: ``tests/mathematics/test_registry.py`` checks every record's Jacobian against
autograd, its envelope on random rows, its kind, its planted-key guarantee on random rows, its ``vanishes`` against the
weights it gives planted keys, and its Jacobian norm bound. :func:`get` raises ``ValueError`` for an unknown
name, everywhere.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attn_utils import normalizer_names
from attn_utils.mathematics import normalizers

__all__ = ["COMPARED", "KINDS", "RECORDS", "REGISTRY", "Jacobian", "NormBound", "Normalizer", "Parts", "get",
           "normalize"]

KINDS = ("distribution", "sub-distribution", "signed")


@dataclass(frozen=True)
class Parts:
    """What a closed-form Jacobian needs for one batch of rows: J_l = ``scale`` * J_z with z = l / T (``scale``
    is 1/T, or s log(n) / T for scalable softmax; shape (..., 1)), the row vector ``a`` of its symmetric part
    (alpha, the support indicator, sqrt(alpha) or p) and any ``extra`` terms."""

    scale: torch.Tensor
    a: torch.Tensor
    extra: dict


@dataclass(frozen=True)
class Jacobian:
    """A closed-form Jacobian: ``parts(l, visible, T, s)`` (float64 logits), ``jvp(parts, v)`` = J_z v and
    ``matrix(parts)`` = J_z, both without the factor ``parts.scale``."""

    parts: Callable[[torch.Tensor, torch.Tensor, float, float], Parts]
    jvp: Callable[[Parts, torch.Tensor], torch.Tensor]
    matrix: Callable[[Parts], torch.Tensor]


@dataclass(frozen=True)
class NormBound:
    """A bound on ||d alpha / d l||_2 per row: ``value(logits, T, s)`` (rows (..., L) of L visible keys) gives it per
    row (...); with ``exact`` it is the norm itself (the check is equality, not an upper bound)."""

    value: Callable[[torch.Tensor, float, float], torch.Tensor]
    exact: bool = False


@dataclass(frozen=True)
class Normalizer:
    """One normalizer (see the module docstring). ``envelope(b, L, s)`` with b = a / T returns (lower, upper);
    ``planted(gap, L, T, s)`` a lower bound on the weight of a key whose logit exceeds every other logit of its row
    of L keys by at least gap; ``vanishes``: None where the book states nothing."""

    name: str
    label: str
    fn: Callable[..., torch.Tensor]
    kind: str
    params: tuple[str, ...]
    envelope: Callable[[float, int, float], tuple[float, float]] | None = None
    jacobian: Jacobian | None = None
    vanishes: bool | None = None
    planted: Callable[[float, int, float, float], float] | None = None
    jacobian_norm: NormBound | None = None

    @property
    def sums_to_one(self) -> bool:
        """Whether its rows are probability distributions."""
        return self.kind == "distribution"

    def keywords(self, **values) -> dict:
        """The subset of ``values`` that this normalizer takes (e.g. T for all, s for scalable softmax)."""
        return {k: v for k, v in values.items() if k in self.params}


# --- Jacobians: J_z = diag(a) - a a^T / total (symmetric), or the self-adjust forms -----------------------


def _symmetric_jvp(a: torch.Tensor, v: torch.Tensor, total: torch.Tensor | None) -> torch.Tensor:
    """(diag(a) - a a^T / total) v, with total = 1 when None."""
    dot = (a * v).sum(-1, keepdim=True)
    if total is None:
        return a * v - a * dot
    return a * v - a * dot / torch.where(total > 0, total, 1.0)


def _symmetric_matrix(a: torch.Tensor, total: torch.Tensor | None) -> torch.Tensor:
    outer = a.unsqueeze(-1) * a.unsqueeze(-2)
    if total is None:
        return torch.diag_embed(a) - outer
    total = total.unsqueeze(-1)
    return torch.diag_embed(a) - outer / torch.where(total > 0, total, 1.0)


def _scale(l: torch.Tensor, T: float) -> torch.Tensor:
    return torch.full((*l.shape[:-1], 1), 1.0 / T, dtype=torch.float64, device=l.device)


def _weights_parts(name: str) -> Callable[..., Parts]:
    """Parts of a rule whose J_z = diag(alpha) - alpha alpha^T (softmax, softmax-1)."""
    fn = getattr(normalizers, name)
    return lambda l, visible, T, s: Parts(_scale(l, T), fn(l, mask=visible, T=T), {})


def _ssmax_parts(l, visible, T, s) -> Parts:
    n = visible.sum(-1, keepdim=True).clamp(min=1).to(torch.float64)
    return Parts(_scale(l, T) * s * torch.log(n), normalizers.ssmax(l, mask=visible, s=s, T=T), {})


SOFTMAX_FAMILY = Jacobian(_weights_parts("softmax"), lambda p, v: _symmetric_jvp(p.a, v, None),
                          lambda p: _symmetric_matrix(p.a, None))
SOFTMAX1 = Jacobian(_weights_parts("softmax1"), SOFTMAX_FAMILY.jvp, SOFTMAX_FAMILY.matrix)
SSMAX = Jacobian(_ssmax_parts, SOFTMAX_FAMILY.jvp, SOFTMAX_FAMILY.matrix)
# sparsemax: a = the indicator of the support S (total |S|); 1.5-entmax: a = sqrt(alpha) (total sum(a))
SPARSE_JVP = (lambda p, v: _symmetric_jvp(p.a, v, p.a.sum(-1, keepdim=True)),
              lambda p: _symmetric_matrix(p.a, p.a.sum(-1, keepdim=True)))
SPARSEMAX = Jacobian(lambda l, visible, T, s: Parts(
    _scale(l, T), (normalizers.sparsemax(l, mask=visible, T=T) > 0).to(torch.float64), {}), *SPARSE_JVP)
ENTMAX15 = Jacobian(lambda l, visible, T, s: Parts(
    _scale(l, T), normalizers.entmax15(l, mask=visible, T=T).clamp(min=0).sqrt(), {}), *SPARSE_JVP)


def _self_adjust_parts(l, visible, T, s) -> Parts:
    """alpha = z p with p = softmax(z), z = l / T: J_z = diag(p (1 + z)) - (z p) p^T."""
    return Parts(_scale(l, T), normalizers.softmax(l, mask=visible, T=T), {"z": torch.where(visible, l, 0.0) / T})


SELF_ADJUST = Jacobian(
    _self_adjust_parts,
    lambda p, v: p.a * (1 + p.extra["z"]) * v - p.extra["z"] * p.a * (p.a * v).sum(-1, keepdim=True),
    lambda p: torch.diag_embed(p.a * (1 + p.extra["z"])) - (p.extra["z"] * p.a).unsqueeze(-1) * p.a.unsqueeze(-2))


def _normalized_parts(l, visible, T, s) -> Parts:
    """alpha = f p, f = (z - lo) / (hi - lo), lo = min(z_min, 0), hi = max(z_max, 0): J_z = diag(f) J_p + diag(p) df/dz;
    the derivatives of lo and hi are shared evenly among tied extremes (as autograd does for amin / amax)."""
    p = normalizers.softmax(l, mask=visible, T=T)
    z = torch.where(visible, l, 0.0) / T
    z_min = torch.where(visible, z, torch.inf).amin(-1, keepdim=True)
    z_max = torch.where(visible, z, -torch.inf).amax(-1, keepdim=True)
    lo, hi = z_min.clamp(max=0), z_max.clamp(min=0)
    ok = hi - lo > 0
    span = torch.where(ok, hi - lo, 1.0)
    at_min, at_max = (visible & (z == z_min)).to(torch.float64), (visible & (z == z_max)).to(torch.float64)
    dlo = torch.where(z_min < 0, at_min / at_min.sum(-1, keepdim=True).clamp(min=1), 0.0)
    dhi = torch.where(z_max > 0, at_max / at_max.sum(-1, keepdim=True).clamp(min=1), 0.0)
    f = torch.where(ok, (z - lo) / span, 0.0)
    return Parts(_scale(l, T), p, {"z": z, "lo": lo, "span": span, "ok": ok, "f": f, "dlo": dlo, "dhi": dhi})


def _normalized_jvp(p: Parts, v: torch.Tensor) -> torch.Tensor:
    e = p.extra
    v_lo, v_hi = (e["dlo"] * v).sum(-1, keepdim=True), (e["dhi"] * v).sum(-1, keepdim=True)
    dfv = (v - v_lo) / e["span"] - (e["z"] - e["lo"]) * (v_hi - v_lo) / e["span"] ** 2
    return torch.where(e["ok"], e["f"] * _symmetric_jvp(p.a, v, None) + p.a * dfv, 0.0)


def _normalized_matrix(p: Parts) -> torch.Tensor:
    e = p.extra
    eye = torch.eye(p.a.shape[-1], dtype=torch.float64, device=p.a.device)
    span = e["span"].unsqueeze(-1)
    df = ((eye - e["dlo"].unsqueeze(-2)) / span
          - (e["z"] - e["lo"]).unsqueeze(-1) * (e["dhi"] - e["dlo"]).unsqueeze(-2) / span ** 2)
    J = e["f"].unsqueeze(-1) * _symmetric_matrix(p.a, None) + p.a.unsqueeze(-1) * df
    return torch.where(e["ok"].unsqueeze(-1), J, 0.0)


SELF_ADJUST_NORMALIZED = Jacobian(_normalized_parts, _normalized_jvp, _normalized_matrix)


# --- planted keys (Prop. ch6-prop-escape) and Jacobian norms (Prop. ch6-prop-jacobians) ------------------


def _softmax_planted(gap: float, L: int, T: float, s: float) -> float:
    """1 / (1 + (L - 1) e^{-gap/T}): every other key has at most e^{-gap/T} times the planted key's weight (-> 0)."""
    return 1.0 / (1.0 + (L - 1) * math.exp(-gap / T))


def _ssmax_planted(gap: float, L: int, T: float, s: float) -> float:
    """1 / (1 + (L - 1) L^{-s gap/T}): softmax's bound at temperature T / (s log L) (-> 1 when s gap / T > 1)."""
    return 1.0 / (1.0 + (L - 1) * math.exp(-s * math.log(L) * gap / T))


def _threshold_planted(width: float) -> Callable[[float, int, float, float], float]:
    """1 if gap >= width T (every other key is outside the support: sparsemax width 1, 1.5-entmax width 2), else
    1 / L (the largest weight of a distribution over L keys)."""
    return lambda gap, L, T, s: 1.0 if gap >= width * T else 1.0 / L


def _sparsemax_norm(logits: torch.Tensor, T: float, s: float) -> torch.Tensor:
    """Exactly 1/T when the support holds at least two keys, else 0 (J_l = (diag(sigma) - sigma sigma^T / |S|) / T
    is 1/T times an orthogonal projection)."""
    support = (normalizers.sparsemax(logits, T=T) > 0).sum(-1)
    return torch.full(support.shape, 1.0 / T, dtype=torch.float64, device=logits.device).masked_fill_(support < 2, 0.0)


def _constant_norm(c: float, log_n: bool = False) -> Callable[[torch.Tensor, float, float], torch.Tensor]:
    """c / T per row (softmax, softmax-1: c = 1/2; 1.5-entmax: c = 1), times s log(n) for scalable softmax."""
    def value(logits: torch.Tensor, T: float, s: float) -> torch.Tensor:
        factor = s * math.log(logits.shape[-1]) if log_n else 1.0
        return torch.full(logits.shape[:-1], c * factor / T, dtype=torch.float64, device=logits.device)
    return value


HALF_OVER_T = NormBound(_constant_norm(0.5))


# --- the records --------------------------------------------------------------------------------------


def _ssmax_envelope(b: float, L: int, s: float) -> tuple[float, float]:
    spread = 2 * s * b * math.log(L)  # log(M_F / m_F) with F = L^{s l / T}: no decay once 2 s b >= 1
    return math.exp(-spread) / L, min(1.0, math.exp(spread) / L)


RECORDS: tuple[Normalizer, ...] = (
    Normalizer("softmax", "softmax", normalizers.softmax, "distribution", ("T",),
               lambda b, L, s: (math.exp(-2 * b) / L, min(1.0, math.exp(2 * b) / L)), SOFTMAX_FAMILY,
               vanishes=True, planted=_softmax_planted, jacobian_norm=HALF_OVER_T),
    Normalizer("sparsemax", "sparsemax", normalizers.sparsemax, "distribution", ("T",),
               lambda b, L, s: (0.0, 1.0), SPARSEMAX,
               vanishes=False, planted=_threshold_planted(1.0), jacobian_norm=NormBound(_sparsemax_norm, exact=True)),
    Normalizer("entmax15", "1.5-entmax", normalizers.entmax15, "distribution", ("T",),
               lambda b, L, s: (0.0, 1.0), ENTMAX15,
               vanishes=False, planted=_threshold_planted(2.0), jacobian_norm=NormBound(_constant_norm(1.0))),
    Normalizer("ssmax", "scalable softmax", normalizers.ssmax, "distribution", ("T", "s"), _ssmax_envelope, SSMAX,
               vanishes=False, planted=_ssmax_planted, jacobian_norm=NormBound(_constant_norm(0.5, log_n=True))),
    Normalizer("softmax1", "softmax-1", normalizers.softmax1, "sub-distribution", ("T",),
               lambda b, L, s: (math.exp(-b) / (1 + L * math.exp(b)), math.exp(b) / (1 + L * math.exp(-b))),
               SOFTMAX1, vanishes=True, jacobian_norm=HALF_OVER_T),
    Normalizer("self_adjust", "self-adjust softmax", normalizers.self_adjust, "signed", ("T",),
               lambda b, L, s: (0.0, b * min(1.0, math.exp(2 * b) / L)), SELF_ADJUST, vanishes=True),
    Normalizer("self_adjust_normalized", "self-adjust (normalized)", normalizers.self_adjust_normalized,
               "sub-distribution", ("T",), lambda b, L, s: (0.0, min(1.0, math.exp(2 * b) / L)),
               SELF_ADJUST_NORMALIZED, vanishes=True),
    Normalizer("general", "general Eq. (3)", normalizers.general, "distribution", ("F", "theta")),
)
REGISTRY: dict[str, Normalizer] = {r.name: r for r in RECORDS}
#: The normalizers the book compares: every record with an envelope and a Jacobian, in the order of
#: :data:`attn_utils.normalizer_names.COMPARED` (their names where the command line reads them without torch).
COMPARED: tuple[str, ...] = tuple(r.name for r in RECORDS if r.envelope and r.jacobian)
if COMPARED != normalizer_names.COMPARED:
    raise ImportError(f"attn_utils/normalizer_names.py lists {normalizer_names.COMPARED}, but the records with an "
                      f"envelope and a Jacobian are {COMPARED}: make them agree")


def get(name: str) -> Normalizer:
    """The record of normalizer ``name``; ``ValueError`` naming the known ones otherwise."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"unknown normalizer {name!r}; known normalizers: {list(REGISTRY)}")
    return REGISTRY[name]


def normalize(logits, name: str = "softmax", *, mask=None, **params) -> torch.Tensor:
    """Normalize ``logits`` along the last axis with normalizer ``name``; ``params`` are its keyword parameters
    (``T`` for all but "general", ``s`` for "ssmax", ``F`` and ``theta`` for "general")."""
    record = get(name)
    unknown = sorted(set(params) - set(record.params))
    if unknown:
        raise ValueError(f"normalizer {name!r} takes the parameters {list(record.params)}, not {unknown}")
    return record.fn(logits, mask=mask, **params)
