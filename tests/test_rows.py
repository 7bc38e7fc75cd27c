"""The one container of validated attention rows (attn_utils.mathematics.rows) and its use by metrics and bounds."""
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
