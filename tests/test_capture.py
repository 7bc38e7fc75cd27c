import functools

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from attn_utils.models.capture import CAPTURE_IMPLEMENTATION, FIELDS, LayerCapture, capture, capture_all, capture_mode
from attn_utils.models.corpus import token_windows
from attn_utils.models.loading import load_model

TEXT = ("Well, Prince, so Genoa and Lucca are now just family estates of the Buonapartes. But I warn you, if you "
        "don't tell me that this means war, if you still try to defend the infamies and horrors perpetrated by that "
        "Antichrist - I really believe he is Antichrist - I will have nothing more to do with you and you are no "
        "longer my friend, no longer my 'faithful slave,' as you call yourself!")
L = 64

pytestmark = pytest.mark.slow


@functools.cache
def _load(name):
    model, tokenizer, prov = load_model(name)
    ids = token_windows(TEXT, tokenizer, L)[0]
    with torch.inference_mode():  # the base model: eager attentions without the LM head
        eager = model.base_model(input_ids=ids[None], output_attentions=True)
    return model, ids, prov, eager


@pytest.fixture(scope="module", params=["gpt2-random", "smollm2-135m"])
def loaded(request):
    return _load(request.param)


@pytest.fixture(scope="module")
def captured(loaded):
    model, ids, _, _ = loaded
    return capture_all(model, ids)


@pytest.fixture
def gpt2():
    return _load("gpt2-random")[:2]


def test_weights_equal_eager_output_attentions(loaded, captured):
    _, _, prov, eager = loaded
    assert len(captured.layers) == len(eager.attentions) == prov.architecture["n_layers"]
    for layer, reference in enumerate(eager.attentions):
        assert (captured.weights[layer] - reference[0].double()).abs().max() <= 1e-5


def test_softmax_of_scaled_logits_plus_mask_reproduces_the_weights(captured):
    c = captured
    rebuilt = torch.softmax(c.logits / c.temperature[:, None, None, None] + c.mask[:, None], dim=-1)
    assert (rebuilt - c.weights).abs().max() <= 1e-6
    assert torch.allclose(c.weights.sum(-1), torch.ones((), dtype=torch.float64), atol=1e-6)
    assert c.weights.triu(diagonal=1).abs().max() == 0


def test_causal_mask_is_applied(captured):
    """Without the mask function registered under the capture's name, the mask would silently be None."""
    assert ALL_MASK_ATTENTION_FUNCTIONS[CAPTURE_IMPLEMENTATION] is ALL_MASK_ATTENTION_FUNCTIONS["eager"]
    upper = torch.ones(L, L, dtype=torch.bool).triu(diagonal=1)
    mask = captured.mask
    assert mask.shape == (len(captured.layers), L, L)
    assert (mask[:, ~upper] == 0).all() and (mask[:, upper] < -1e30).all()
    # unmasked logits above the diagonal are real numbers that would leak attention if the mask were missing
    assert captured.logits[:, :, upper].abs().max() > 0


def test_shapes_temperature_and_expanded_kv_heads(loaded, captured):
    model, ids, prov, _ = loaded
    a = prov.architecture
    n, heads, dh = a["n_layers"], a["n_heads"], a["head_dim"]
    assert captured.q.shape == captured.k.shape == captured.v.shape == (n, heads, L, dh)
    assert captured.logits.shape == captured.weights.shape == (n, heads, L, L)
    assert captured.weights.dtype == torch.float64
    assert torch.allclose(captured.temperature, torch.full((n,), dh**0.5, dtype=torch.float64))
    groups = heads // a["n_kv_heads"]
    for head in range(heads):  # query heads of one group share their key/value head
        assert torch.equal(captured.k[:, head], captured.k[:, head - head % groups])
        assert torch.equal(captured.v[:, head], captured.v[:, head - head % groups])
    assert torch.allclose(captured.logits, captured.q @ captured.k.transpose(-1, -2), atol=1e-4)
    if groups > 1:
        assert not torch.equal(captured.k[:, 0], captured.k[:, groups])


def test_streaming_hands_over_layers_in_order(loaded):
    model, ids, prov, _ = loaded
    seen = []

    def keep_shapes(c: LayerCapture):
        seen.append((c.layer, tuple(c.q.shape), tuple(c.weights.shape), c.weights.dtype))

    heads = prov.architecture["n_heads"]
    layers = capture(model, ids, keep_shapes, dtype=None)
    assert layers == [s[0] for s in seen] == list(range(prov.architecture["n_layers"]))
    assert all(s[1] == (1, heads, L, 64) and s[2] == (1, heads, L, L) and s[3] == torch.float32 for s in seen)


def test_capture_leaves_the_model_as_it_was(loaded):
    model, ids, _, eager = loaded
    with torch.inference_mode(), capture_mode(model):
        assert model.config._attn_implementation == CAPTURE_IMPLEMENTATION
        assert torch.equal(model.base_model(input_ids=ids[None]).last_hidden_state, eager.last_hidden_state)
    assert model.config._attn_implementation == "eager"

    def fail(c):
        raise KeyError("callback failed")

    with pytest.raises(KeyError):
        capture(model, ids, fail)
    assert model.config._attn_implementation == "eager"


def test_selected_layers_stop_the_forward_pass_early(gpt2):
    model, ids = gpt2
    ran = []
    hooks = [block.register_forward_hook(lambda *args, i=i: ran.append(i)) for i, block in
             enumerate(model.transformer.h)]
    try:
        c = capture_all(model, ids, layers=[5, 2], what="weights")
    finally:
        for hook in hooks:
            hook.remove()
    assert c.layers == (2, 5) and c.weights.shape == (2, 12, L, L)
    assert c.q is None and c.logits is None and c.mask is None
    assert ran == [0, 1, 2, 3, 4]  # block 5 stopped inside its attention; nothing after it ran


def test_batches_through_the_callback(gpt2):
    model, ids = gpt2
    batch = torch.stack([ids, ids.flip(0)])
    with torch.inference_mode():
        eager = model.base_model(input_ids=batch, output_attentions=True).attentions
    got = {}
    capture(model, batch, lambda c: got.setdefault(c.layer, c.weights), layers=[0, 11])
    for layer in (0, 11):
        assert got[layer].shape == (2, 12, L, L)
        assert (got[layer] - eager[layer].double()).abs().max() <= 1e-5


def test_gpt2_layer_scaling_comes_through():
    config = GPT2Config(n_layer=3, n_head=4, n_embd=32, n_positions=32, scale_attn_by_inverse_layer_idx=True)
    model = GPT2LMHeadModel._from_config(config, attn_implementation="eager").eval()
    ids = torch.arange(16)
    c = capture_all(model, ids)
    assert torch.allclose(c.scaling, torch.tensor([8**-0.5 / (i + 1) for i in range(3)], dtype=torch.float64))
    with torch.inference_mode():
        eager = model(input_ids=ids[None], output_attentions=True).attentions
    assert max((c.weights[i] - eager[i][0].double()).abs().max() for i in range(3)) <= 1e-6


def test_bad_input_is_refused(gpt2):
    model, ids = gpt2
    with pytest.raises(ValueError, match="input_ids must be a LongTensor"):
        capture_all(model, torch.zeros(8))
    with pytest.raises(ValueError, match="subset of 0..11"):
        capture_all(model, ids, layers=[12])
    with pytest.raises(ValueError, match="what must be a subset"):
        capture_all(model, ids, what=("attention",))
    with pytest.raises(ValueError, match="LongTensor"):
        capture_all(model, ids.float())
    with pytest.raises(ValueError, match="LongTensor"):
        capture_all(model, ids.tolist())
    with pytest.raises(ValueError, match="one sequence"):
        capture_all(model, torch.stack([ids, ids]))
    model.train()
    try:
        with pytest.raises(ValueError, match="model.eval"):
            capture_all(model, ids)
    finally:
        model.eval()
    assert set(FIELDS) == {"q", "k", "v", "logits", "weights", "mask"}
