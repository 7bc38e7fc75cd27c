"""Every normalizer record (attn_utils.mathematics.registry) against independent oracles.

A new record is tested here without writing anything: its closed-form Jacobian against autograd, its
Jacobian-vector product against the matrix, its Lemma 1 envelope on random rows, and its kind of rows."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from attn_utils.mathematics import beyond, registry
from attn_utils.mathematics.normalizers import causal_mask

COMPARED = registry.COMPARED


def _logits(seed: int, L: int, scale: float) -> torch.Tensor:
    return torch.randn(3, L, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


@pytest.mark.parametrize("name", COMPARED)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(1, 7), scale=st.sampled_from([0.3, 1.0, 4.0]),
       T=st.sampled_from([0.5, 1.0, 2.0]), masked=st.booleans())
def test_closed_form_jacobian_is_autograds(name, seed, L, scale, T, masked):
    record = registry.get(name)
    l = _logits(seed, L, scale)
    mask = causal_mask(L)[-3:] if masked and L >= 3 else None
    kw = record.keywords(T=T, s=1.3)
    J = beyond.jacobian(l, name, mask=mask, **kw)
    for r in range(l.shape[0]):
        row_mask = None if mask is None else mask[r:r + 1]
        auto = torch.autograd.functional.jacobian(lambda z: record.fn(z.unsqueeze(0), mask=row_mask, **kw)[0], l[r])
        torch.testing.assert_close(J[r], auto, rtol=1e-9, atol=1e-12)
    v = torch.randn(l.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=l.dtype)
    v = v if mask is None else torch.where(mask, v, 0.0)
    # the closed forms divide by the logits near a kink (self_adjust_normalized by max(z, 0) - min(z, 0)): their
    # rounding grows like |v| / |z| (z = 2.5e-4 gave 1.8e-12 where J v = 0), so the tolerance does too
    atol = 1e-12 * float(v.abs().max()) * (1 + T / float(l.abs().min()))
    torch.testing.assert_close(beyond.jvp(l, v, name, mask=mask, **kw), (J @ v.unsqueeze(-1)).squeeze(-1),
                               rtol=1e-9, atol=atol)


@pytest.mark.parametrize("name", COMPARED)
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(1, 40), a=st.sampled_from([0.1, 0.5, 1.0, 2.0]),
       T=st.sampled_from([0.5, 1.0, 3.0]))
def test_envelope_holds_and_kind_is_right(name, seed, L, a, T):
    record = registry.get(name)
    l = (torch.rand(4, L, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2 - 1) * a
    w = record.fn(l, **record.keywords(T=T, s=1.0))
    low, high = beyond.lemma1_envelope(name, a, L, T=T, s=1.0)
    assert (w.abs() >= low * (1 - 1e-9)).all() and (w.abs() <= high * (1 + 1e-9) + 1e-15).all()
    mass = w.sum(-1)
    if record.kind == "distribution":
        assert (w >= 0).all() and torch.allclose(mass, torch.ones_like(mass))
    elif record.kind == "sub-distribution":
        assert (w >= 0).all() and (mass <= 1 + 1e-12).all()


def test_unknown_names_and_missing_parts_are_errors_everywhere():
    for call in (lambda: registry.get("softmax2"), lambda: beyond.lemma1_envelope("softmax2", 1.0, 4),
                 lambda: beyond.jacobian(torch.zeros(1, 3), "softmax2")):
        with pytest.raises(ValueError, match="unknown normalizer 'softmax2'"):
            call()
    with pytest.raises(ValueError, match="has no envelope"):
        beyond.lemma1_envelope("general", 1.0, 4)
    assert registry.get("ssmax").keywords(T=2.0, s=1.5, eps=3) == {"T": 2.0, "s": 1.5}
    assert set(registry.KINDS) >= {r.kind for r in registry.RECORDS}
    assert len({r.label for r in registry.RECORDS}) == len(registry.RECORDS)


@pytest.mark.parametrize("name", [r.name for r in registry.RECORDS if r.planted])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(2, 300), gap=st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]),
       T=st.sampled_from([0.5, 1.0, 2.0]), s=st.sampled_from([0.5, 1.0, 1.5]))
def test_planted_key_keeps_its_guaranteed_weight(name, seed, L, gap, T, s):
    """``planted``: a key whose logit leads every other logit of its row by >= gap weighs at least the bound."""
    record = registry.get(name)
    l = beyond.synthetic_rows("planted", 8, L, 2.0, gap, generator=torch.Generator().manual_seed(seed))
    w = record.fn(l, **record.keywords(T=T, s=s))
    assert (w[:, 0] >= record.planted(gap, L, T, s) * (1 - 1e-9)).all()


@pytest.mark.parametrize("name", [r.name for r in registry.RECORDS if r.vanishes is not None])
def test_vanishes_is_what_planted_keys_and_the_envelope_show(name):
    """``vanishes``: a rule forced to vanish loses a planted key's weight as L grows (median weight at L = 4096 below
    half of that at L = 16, the chapter's rule), one that escapes keeps it; the envelope agrees (L times its upper
    end stays bounded exactly when the rule vanishes)."""
    record = registry.get(name)
    g = torch.Generator().manual_seed(0)
    kept = []
    for L in (16, 4096):
        l = beyond.synthetic_rows("planted", 200, L, 2.0, 2.0, generator=g)
        kept.append(float(record.fn(l, **record.keywords(T=1.0, s=1.0))[:, 0].abs().median()))
    assert (kept[1] >= 0.5 * kept[0]) == (not record.vanishes)
    if record.envelope is not None:
        spread = [L * record.envelope(2.0, L, 1.0)[1] for L in (10**3, 10**6)]
        assert (spread[1] <= 2 * spread[0]) == record.vanishes


@pytest.mark.parametrize("name", [r.name for r in registry.RECORDS if r.jacobian_norm])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), L=st.integers(1, 40), scale=st.sampled_from([0.3, 1.0, 4.0]),
       T=st.sampled_from([0.01, 0.1, 1.0, 10.0]), s=st.sampled_from([0.5, 1.0, 2.0]))
def test_jacobian_norm_bound_holds(name, seed, L, scale, T, s):
    """``jacobian_norm``: the spectral norm of the closed-form Jacobian (itself checked against autograd above) is
    at most the bound, or equal to it where the record says the value is exact."""
    record = registry.get(name)
    l = torch.randn(5, L, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale
    norm = torch.linalg.matrix_norm(beyond.jacobian(l, name, **record.keywords(T=T, s=s)), ord=2)
    value = record.jacobian_norm.value(l, T, s)
    assert value.shape == norm.shape and value.dtype == torch.float64
    if record.jacobian_norm.exact:
        torch.testing.assert_close(norm, value, rtol=1e-9, atol=1e-12)
    else:
        assert (norm <= value * (1 + 1e-9)).all()
