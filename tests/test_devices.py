"""The mathematics runs on the device of its inputs: a GPU, when the session's model runs on one.

Without a GPU the check runs on the CPU with another device as torch's default (``with torch.device("meta")``):
every tensor the library makes without taking the device from its inputs lands on that default device, and the
first operation that mixes it with the CPU inputs raises (``test_the_check_catches...`` shows it). So each public
function of ``attn_utils.mathematics``, and each chapter's analysis of a capture, is called on CPU tensors under
that default and must return CPU results.
(The default device is thread-local: torch runs on one thread here, so the layers run in this thread.)

With a GPU, the same functions run on CUDA tensors and must agree with the CPU to rounding (skipped otherwise).
"""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from attn_utils.mathematics import algorithms, beyond, metrics, registry, theory
from attn_utils.mathematics.normalizers import causal_mask

LAYERS, HEADS, L, D = 2, 3, 24, 4


def attention(seed: int = 0):
    """Causal float64 attention: logits, weights (layers, heads, L, L) and vectors (layers, heads, L, d)."""
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(LAYERS, HEADS, L, L, generator=g, dtype=torch.float64)
    weights = torch.softmax(logits.masked_fill(~causal_mask(L), -torch.inf), -1)
    return logits, weights, torch.randn(LAYERS, HEADS, L, D, generator=g, dtype=torch.float64)


def calls(logits, w, x, device):
    """Each public function of the mathematics on inputs on ``device`` (generators always on the CPU)."""
    logits, w, x = logits.to(device), w.to(device), x.to(device)
    mask = causal_mask(L, device=device)
    l1, w1, x1 = logits[0], w[0], x[0]  # (heads, L, L) and (heads, L, d): one layer
    top, valid = metrics.top_n_mask(w1, 3, mask)
    sep = beyond.separated_keys(w1, x1, 3, mask)[1]
    gen = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    return {
        "Algorithm 1": lambda: algorithms.distance_vs_length(w, x, N=2, lengths=[8, 16, 24], progress=False),
        "Algorithm 1, sampled rows": lambda: algorithms.distance_vs_length(w, x, N=2, lengths=[8, 16, 24],
                                                                          rows_per_octave=2, progress=False),
        "Algorithm 2": lambda: algorithms.distance_vs_n(w, x, Ns=[1, 3, 9], reading="norm_of_sum", progress=False),
        "Algorithm 3": lambda: algorithms.critical_n(w, x, [8, 16, 24], [1, 3, 9], progress=False),
        "Theorem 1 rows": lambda: algorithms.theorem1_row_check(w, x, [1, 3], progress=False),
        "Algorithm 4": lambda: algorithms.separability_vs_n(w, x, Ns=[1, 2, 4], progress=False),
        "Algorithm 5": lambda: algorithms.gradient_sensitivity(logits, [0.1, 1.0], epsilons=[1e-3, 1.0],
                                                               progress=False),
        "cumulative_distance": lambda: metrics.cumulative_distance(w1, x1, top, mask),
        "context_vector": lambda: metrics.context_vector(w1, x1, top),
        "expected_distance_mc": lambda: metrics.expected_distance_mc(w1, x1, 3, mask, n_samples=4, generator=gen()),
        "finite_difference_gradient": lambda: metrics.finite_difference_gradient(l1, 0.5, 1e-2, mask, gen()),
        "random_directions": lambda: metrics.random_directions(mask.expand(HEADS, L, L), gen()),
        "separability": lambda: metrics.separability(w1, x1, 3, mask),
        "min_pairwise_distance": lambda: metrics.min_pairwise_distance(x1),
        "entropy and max_weight": lambda: (metrics.entropy(w1), metrics.max_weight(w1)),
        "project_to_sphere": lambda: metrics.project_to_sphere(x1, 2.0),
        "theorem1_fixed_bound": lambda: theory.theorem1_fixed_bound(w1, x1, top, mask),
        "theorem1_random_main_sum": lambda: theory.theorem1_random_main_sum(w1, x1, 3, mask),
        "theorem2_bounds": lambda: tuple(theory.theorem2_bounds(w1, top, 0.5, 1.0, 0.1)),
        "theorem2_xi": lambda: theory.theorem2_xi(w1, top, 1.0, 0.1),
        "corollary1_bounds": lambda: tuple(theory.corollary1_bounds(x1, x1, 2.0, mask)),
        "softmax_jacobian": lambda: theory.softmax_jacobian(w1[:, -1], 2.0),
        "row_stats": lambda: beyond.row_stats(w1, mask),
        "geometry": lambda: beyond.geometry(w1, x1, [2, 3], mask),
        "coverage": lambda: beyond.coverage(top, sep, valid, 3, n_perm=3, generator=gen()),
        "head_association": lambda: beyond.head_association(top, sep, valid),
        **{f"normalizer {name}": (lambda name=name: registry.normalize(l1, name, mask=mask))
           for name in registry.COMPARED},
        **{f"jacobian {name}": (lambda name=name: beyond.jacobian(l1[:, 5:7, :8], name, mask=mask[5:7, :8]))
           for name in registry.COMPARED},
        **{f"jvp {name}": (lambda name=name: beyond.jvp(l1, torch.ones_like(l1), name, mask=mask))
           for name in registry.COMPARED},
    }


def leaves(result) -> list:
    """The tensors, tables and numbers of a result, as they are, in a fixed order."""
    if isinstance(result, (torch.Tensor, pd.DataFrame, int, float, bool)):
        return [result]
    if isinstance(result, dict):
        return [v for key in sorted(result) for v in leaves(result[key])]
    if isinstance(result, (tuple, list)):
        return [v for item in result for v in leaves(item)]
    if hasattr(result, "__dataclass_fields__"):
        return [v for name in result.__dataclass_fields__ for v in leaves(getattr(result, name))]
    return []


def tensors(result) -> list:
    """The tensors of a result, on the device they were made on."""
    return [v for v in leaves(result) if isinstance(v, torch.Tensor)]


def values(result) -> list:
    """The tensors, tables and numbers of a result, as CPU float64 tensors."""
    return [v.detach().cpu().to(torch.float64) if isinstance(v, torch.Tensor)
            else torch.as_tensor(v.select_dtypes("number").to_numpy(dtype=float, copy=True))  # writable: no warning
            if isinstance(v, pd.DataFrame) else torch.tensor(float(v), dtype=torch.float64) for v in leaves(result)]


def same(a, b, rtol: float = 0.0, atol: float = 0.0) -> None:
    va, vb = values(a), values(b)
    assert va and len(va) == len(vb)
    for x, y in zip(va, vb):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol, equal_nan=True)


NAMES = list(calls(*attention(), "cpu"))


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", NAMES)
def test_every_tensor_is_made_on_the_device_of_the_inputs(name, one_thread):
    inputs = attention()
    with torch.device("meta"):  # a tensor made without the inputs' device would be a meta tensor, and raise
        result = calls(*inputs, "cpu")[name]()
    assert all(t.device.type == "cpu" for t in tensors(result)) and values(result)


def test_the_check_catches_a_tensor_made_on_the_default_device(one_thread):
    w = attention()[1][0]
    with torch.device("meta"), pytest.raises(RuntimeError, match="device"):
        torch.where(w > 0.5, w, torch.zeros(w.shape))  # torch.zeros without device=w.device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_gives_what_the_cpu_gives(name):
    inputs = attention()
    same(calls(*inputs, "cuda")[name](), calls(*inputs, "cpu")[name](), rtol=1e-9, atol=1e-12)


# --- the chapters' model pipelines -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def captures(tiny_gpt2):
    """A tiny GPT-2 on a 32-token window: what each model chapter captures (on the CPU, outside the check)."""
    from attn_utils.book.chapters import beyond as chapter6
    from attn_utils.book.session import Session

    s = Session.open(model=tiny_gpt2, L=32, device="cpu")
    return {"weights": s.capture(what=("weights", "q", "k", "v")),
            "logits": s.capture(what=("logits",), logit_scale="model"),
            "lenses": chapter6.capture_logits(s, [64], 2)}


def pipelines(c):
    """Each model chapter's analysis of the captures, as the chapters call it."""
    from attn_utils.book.chapters import beyond as chapter6
    from attn_utils.book.chapters import distance, gradient, separability, setting, vanishing

    w, x = c["weights"].weights, c["weights"].v
    names = list(registry.COMPARED)
    grid = dict(N=2, lengths=[8, 16, 32], alpha=0.01, reading="sum_of_norms", rows_per_octave=None)

    def ch6():
        geometry = chapter6.geometry_model(c["lenses"], names, 2, [2, 4])
        return (chapter6.lemma1_model(c["lenses"], names).rows, geometry.rows,
                chapter6.gradient_model(c["lenses"], names, [0.1, 1.0], 0).table,
                chapter6.long_context(c["lenses"], geometry).curves,
                chapter6.coverage(c["lenses"], geometry, [2, 4], 3, 0).shown())

    return {
        "ch0": lambda: setting.layer_checks(w[0], causal_mask(w.shape[-1], device=w.device)),
        "ch1": lambda: (lambda check: (check.rows, vanishing.model_facts(check, c["weights"])))(
            vanishing.model_rows(c["weights"])),
        "ch2": lambda: (distance.figure2(w, x, Ns=[1, 2, 4], **{k: v for k, v in grid.items()}).by_n,
                        distance.row_bound_check(w, x, [1, 2], reading="sum_of_norms", rows_per_octave=None),
                        distance.sampling_checks(w, x, **{k: v for k, v in grid.items() if k != "rows_per_octave"},
                                                 rows_per_octave=4)[1]),
        "ch3": lambda: (lambda sep: (sep, separability.rowwise_table(separability.model_rowwise(
            w, x, separability.head_deltas(sep), [1, 2], M=1.0, stride=4))))(
            algorithms.separability_vs_n(w, x, Ns=[1, 2], progress=False)),
        "ch4": lambda: (algorithms.gradient_sensitivity(c["logits"].logits, [0.1, 1.0], epsilons=[1e-3, 1.0],
                                                        progress=False).heads,
                        gradient.top_two_gaps(c["logits"].logits)),
        "ch6": ch6,
    }


@pytest.mark.parametrize("chapter", ["ch0", "ch1", "ch2", "ch3", "ch4", "ch6"])
def test_every_chapter_analyses_the_capture_on_its_device(chapter, captures, one_thread):
    with torch.device("meta"):
        result = pipelines(captures)[chapter]()
    assert all(t.device.type == "cpu" for t in tensors(result)) and values(result)

