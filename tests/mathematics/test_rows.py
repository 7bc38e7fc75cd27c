"""The one container of validated attention rows (attn_utils.mathematics.rows) and its use by metrics and bounds."""
import math

import pytest
import torch

from attn_utils.mathematics import metrics, theory
from attn_utils.mathematics.normalizers import causal_mask, softmax
from attn_utils.mathematics.rows import Rows, unit_scale


def _instance(seed=0, heads=2, L=6, d=3):
    g = torch.Generator().manual_seed(seed)
    w = softmax(torch.randn(heads, L, L, generator=g, dtype=torch.float64), mask=causal_mask(L))
    return w, torch.randn(heads, L, d, generator=g, dtype=torch.float64), causal_mask(L)


def test_rows_are_validated_once_and_passed_through():
    w, x, mask = _instance()
    rows = Rows.of(w.float(), x[:1], mask)  # x broadcasts over the heads, float32 weights become float64
    assert rows.weights.dtype == rows.x.dtype == torch.float64 and rows.x.shape == (2, 6, 3)
    assert rows.masked and rows.lengths().tolist() == [list(range(1, 7))] * 2
    assert Rows.of(rows) is rows
    with pytest.raises(ValueError, match="do not pass them again"):
        Rows.of(rows, x)


@pytest.mark.parametrize("kwargs, message", [
    ({"weights": torch.ones(3)}, "weights must be a float tensor of shape"),
    ({"weights": torch.ones(2, 0)}, "at least one key"),
    ({"weights": torch.full((2, 2), 0.7)}, "sum to one"),
    ({"weights": torch.full((2, 2), 0.5), "x": torch.ones(3, 2)}, "x must be a float tensor of shape"),
    ({"weights": torch.full((2, 2), 0.5), "x": torch.tensor([[1.0], [float("nan")]])}, "finite"),
    ({"weights": torch.full((3, 2, 2), 0.5), "x": torch.ones(4, 2, 1)}, "do not broadcast"),
    ({"weights": torch.full((2, 2), 0.5), "mask": torch.ones(2, 2)}, "mask must be a boolean tensor"),
    ({"weights": torch.full((2, 2), 0.5), "mask": torch.ones(3, 2, dtype=torch.bool)}, "does not broadcast"),
    ({"weights": "abc"}, "weights must be"),
])
def test_bad_rows_name_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Rows.of(**kwargs)


def test_metrics_and_bounds_take_rows_or_tensors_alike():
    w, x, mask = _instance(seed=3)
    rows = Rows.of(w, x, mask)
    selected, valid = metrics.top_n_mask(Rows.of(w, mask=mask), 2)
    assert torch.equal(selected, metrics.top_n_mask(w, 2, mask)[0])
    assert torch.equal(metrics.cumulative_distance(rows, None, selected),
                       metrics.cumulative_distance(w, x, selected, mask))
    assert torch.equal(metrics.separability(rows, None, 2)[0].nan_to_num(-1),
                       metrics.separability(w, x, 2, mask)[0].nan_to_num(-1))
    assert torch.equal(theory.theorem1_fixed_bound(rows, None, selected),
                       theory.theorem1_fixed_bound(w, x, selected, mask))


def test_unit_scale_is_exact_and_bounded():
    x = torch.tensor([[[3.0, -1e200]], [[0.0, 0.0]], [[0.25, 0.1]]], dtype=torch.float64)
    unit, c = unit_scale(x)
    assert torch.equal(unit * c.view(-1, 1, 1), x) and (unit.abs() < 2).all()
    assert c.tolist() == [2.0 ** 664, 1.0, 0.25]  # max |x / c| in [1, 2), c = 1 for a zero head


@pytest.mark.parametrize("kwargs, options, message", [
    ({"weights": torch.ones(3)}, {"row_axis": False, "sums_to_one": False}, None),  # one row (L,)
    ({"weights": torch.ones(())}, {"row_axis": False, "name": "logits"},
     r"logits must be a float tensor of shape \(\.\.\., L\) with at least one key"),
    ({"weights": torch.full((2, 3, 4, 4), 0.25)}, {"lead": ("layers", "heads"), "square": True}, None),
    ({"weights": torch.full((3, 4, 4), 0.25)}, {"lead": ("layers", "heads"), "square": True},
     r"weights must be a float tensor of shape \(layers, heads, L, L\)"),
    ({"weights": torch.full((2, 3, 4, 5), 0.2)}, {"lead": ("layers", "heads"), "square": True},
     r"shape \(layers, heads, L, L\) with at least one key, got shape \(2, 3, 4, 5\)"),
    ({"weights": torch.full((2, 3, 4, 4), 0.25), "x": torch.ones(1, 3, 4, 2)}, {"lead": ("layers", "heads")},
     r"x must be a float tensor of shape \(layers, heads, L, d\) = \(2, 3, 4\) \+ \(d,\), like weights"),
    ({"weights": torch.tensor([[1.0, float("inf")]])}, {"sums_to_one": False}, "weights must contain only finite"),
    ({"weights": torch.tensor([[1.0, -float("inf")]])}, {"sums_to_one": False, "finite": False}, None),
    ({"weights": torch.tensor([[1.0, float("nan")]])}, {"sums_to_one": False, "finite": False}, "NaN"),
    ({"weights": torch.full((2, 2), 0.5), "mask": torch.tensor([[True, False], [False, False]])},
     {"nonempty": True}, r"mask must leave at least one visible key in every row; row \(1,\) has none"),
    ({"weights": torch.full((2, 2), 0.5), "x": torch.ones(2, 1), "mask": torch.ones(3, 2, dtype=torch.bool)},
     {"name": "logits", "sums_to_one": False}, r"mask of shape \(3, 2\) does not broadcast to logits of shape"),
])
def test_the_options_of_the_one_validator(kwargs, options, message):
    if message is None:
        Rows.of(**kwargs, **options)
    else:
        with pytest.raises(ValueError, match=message):
            Rows.of(**kwargs, **options)


def test_shapes_only_checks_neither_values_nor_copies():
    """``values=False`` checks the layout and keeps the given tensors (float32, rows that do not sum to one, NaN x):
    algorithms read one layer at a time and check its values then."""
    w, x = torch.full((2, 3, 4, 4), 0.7), torch.full((2, 3, 4, 5), float("nan"))
    rows = Rows.of(w, x, name="weights", lead=("layers", "heads"), square=True, values=False)
    assert rows.weights.data_ptr() == w.data_ptr() and rows.x.data_ptr() == x.data_ptr()
    assert rows.weights.dtype == torch.float32 and not rows.masked
    with pytest.raises(ValueError, match="x must contain only finite numbers"):
        Rows.of(w, x)
    with pytest.raises(ValueError, match="sum to one"):
        Rows.of(w)


def test_per_head_rows_restore_the_units_and_the_batch():
    w, x, mask = _instance(seed=4, heads=3)
    x = x * torch.tensor([1e-300, 1.0, 1e300], dtype=torch.float64).view(3, 1, 1)  # scales a plain norm would lose
    rows = Rows.of(w.view(3, 1, 6, 6), x.view(3, 1, 6, 3), mask, nonempty=True).per_head()
    assert rows.weights.shape == (3, 6, 6) and rows.batch == (3, 1) and rows.scale.shape == (3,)
    assert (rows.x.abs().amax((-2, -1)) < 2).all() and (rows.x.abs().amax((-2, -1)) >= 1).all()
    norms = rows.restore(rows.x.norm(dim=-1))  # homogeneous of degree 1: back in x's units
    exact = torch.tensor([[math.hypot(*v) for v in head.tolist()] for head in x], dtype=torch.float64)  # no overflow
    torch.testing.assert_close(norms, exact.view(3, 1, 6), rtol=1e-14, atol=0)
    weights, visible = rows.distribution(slice(0, 2), slice(2, 5))
    assert weights.shape == visible.shape == (2, 3, 6) and torch.equal(visible, mask[2:5].expand(2, 3, 6))
    bad = Rows.of(torch.zeros(1, 2, 2), torch.ones(1, 2, 1), sums_to_one=False).per_head()
    with pytest.raises(ValueError, match="a row sums to 0"):
        bad.distribution(slice(None), slice(None))
