"""Capture equals the model's own eager attention, for each architecture: GPT-2, Llama (grouped-query attention),
Gemma 3 (sliding-window and global layers, QK-norm, query scaling) and BERT (a bidirectional encoder).

Fast tests run on tiny seeded configurations of each architecture; the tests marked ``slow`` on the real models at a
few hundred tokens (Gemma beyond its 512-key window)."""
import functools

import pytest
import torch
from transformers import (BertConfig, BertModel, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel,
                          LlamaConfig, LlamaForCausalLM)
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from attn_utils.models.capture import CAPTURE_IMPLEMENTATION, FIELDS, LayerCapture, capture, capture_all, capture_mode
from attn_utils.models.corpus import load_text, model_windows
from attn_utils.models.loading import architecture, load_model, visible_keys

TINY_L = 16
REAL_L = {"gpt2-random": 64, "smollm2-135m": 256, "gemma3-270m": 640, "minilm-l6": 384}


def _tiny(name):
    """A tiny random-initialised model of each architecture (seeded), in eval mode, with the eager attention."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if name == "gemma3":  # head_dim 16 but query_pre_attn_scalar 32: the scaling is not 1/sqrt(head_dim)
            config = Gemma3TextConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=5,
                                      query_pre_attn_scalar=32, max_position_embeddings=64,
                                      layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                                   "full_attention"])
            model = Gemma3ForCausalLM._from_config(config, attn_implementation="eager")
            for layer in model.model.layers:  # QK-norm weights away from their zero init, so that they matter
                for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                    norm.weight.data.normal_(0, 0.5)
        elif name == "bert":
            model = BertModel._from_config(BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2,
                                                      num_attention_heads=4, intermediate_size=64,
                                                      max_position_embeddings=64), attn_implementation="eager")
        elif name == "llama":
            model = LlamaForCausalLM._from_config(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                                              num_hidden_layers=2, num_attention_heads=4,
                                                              num_key_value_heads=2, max_position_embeddings=64),
                                                  attn_implementation="eager")
        else:
            model = GPT2LMHeadModel._from_config(GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4,
                                                            n_positions=64, bos_token_id=0, eos_token_id=0),
                                                 attn_implementation="eager")
        ids = torch.randint(0, 97, (TINY_L,))
    return model.eval(), ids


@functools.cache
def _real(name):
    model, tokenizer, prov = load_model(name)
    ids = model_windows(load_text(), tokenizer, REAL_L[name], prov.window)[0]
    return model, ids


@functools.cache
def _eager(model, ids):
    with torch.inference_mode():  # the base model: eager attentions without the LM head
        return model.base_model(input_ids=ids[None], output_attentions=True).attentions


TINY = ["gemma3", "bert", "llama", "gpt2"]
REAL = [pytest.param(name, marks=pytest.mark.slow) for name in REAL_L]


@pytest.fixture(scope="module", params=[*TINY, *REAL])
def loaded(request):
    model, ids = _tiny(request.param) if request.param in TINY else _real(request.param)
    return model, ids, architecture(model)


@pytest.fixture(scope="module")
def captured(loaded):
    model, ids, _ = loaded
    return capture_all(model, ids)


@pytest.fixture(scope="module")
def gpt2():
    return _tiny("gpt2")


def test_weights_equal_eager_output_attentions(loaded):
    model, ids, arch = loaded
    eager = _eager(model, ids)
    c = capture_all(model, ids, dtype=torch.float32, what=("weights",))
    assert len(c.layers) == len(eager) == arch["n_layers"] and c.weights.dtype == torch.float32
    for layer, reference in enumerate(eager):
        assert (c.weights[layer] - reference[0]).abs().max() <= 1e-6


def test_softmax_of_scaled_logits_plus_mask_reproduces_the_weights(loaded, captured):
    """q and k as the model multiplies them (after QK-norm and rotary embeddings), its scaling and each layer's mask."""
    c = captured
    rebuilt = torch.softmax(c.logits * c.scaling[:, None, None, None] + c.mask[:, None], dim=-1)
    assert (rebuilt - c.weights).abs().max() <= 1e-6
    assert torch.allclose(c.weights.sum(-1), torch.ones((), dtype=torch.float64), atol=1e-6)
    assert torch.allclose(c.scaling, torch.tensor(loaded[2]["scaling"], dtype=torch.float64))


def test_each_layer_carries_the_mask_it_applied(loaded, captured):
    """Causal prefix, sliding window or all keys, from the architecture's facts; the weights vanish exactly outside."""
    _, ids, arch = loaded
    L = len(ids)
    assert ALL_MASK_ATTENTION_FUNCTIONS[CAPTURE_IMPLEMENTATION] is ALL_MASK_ATTENTION_FUNCTIONS["eager"]
    assert captured.mask.shape == (arch["n_layers"], L, L)
    for layer in range(arch["n_layers"]):
        seen = visible_keys(arch, layer, L)
        mask, weights = captured.mask[layer], captured.weights[layer]
        assert (mask[seen] == 0).all() and (mask[~seen] < -1e30).all()
        assert (weights[:, ~seen] == 0).all()
    if not arch["causal"]:
        assert (captured.mask == 0).all()  # an encoder: every row sees all L keys
    else:  # unmasked logits above the diagonal are real numbers that would leak attention if the mask were missing
        upper = torch.ones(L, L, dtype=torch.bool).triu(diagonal=1)
        assert captured.logits[:, :, upper].abs().max() > 0


def test_sliding_layers_see_their_window_and_global_layers_the_prefix(loaded, captured):
    _, ids, arch = loaded
    if not arch["sliding_layers"]:
        pytest.skip("no sliding-window layers")
    L, W = len(ids), arch["sliding_window"]
    assert L > W  # rows beyond the window exist
    keys = (captured.mask == 0).sum(-1)  # (layers, L): the keys each row sees
    rows = torch.arange(L)
    for layer in range(arch["n_layers"]):
        expected = torch.minimum(rows + 1, torch.tensor(W)) if layer in arch["sliding_layers"] else rows + 1
        assert torch.equal(keys[layer], expected)
    sliding, full = arch["sliding_layers"][0], arch["global_layers"][0]
    # a sliding layer read with the global layer's mask would give other weights: the per-layer mask matters
    c = captured
    wrong = torch.softmax(c.logits[sliding] * c.scaling[sliding] + c.mask[full], dim=-1)
    assert (wrong - c.weights[sliding]).abs().max() > 1e-3


def test_shapes_and_expanded_kv_heads(loaded, captured):
    _, ids, a = loaded
    n, heads, dh, L = a["n_layers"], a["n_heads"], a["head_dim"], len(ids)
    assert captured.q.shape == captured.k.shape == captured.v.shape == (n, heads, L, dh)
    assert captured.logits.shape == captured.weights.shape == (n, heads, L, L)
    assert captured.weights.dtype == torch.float64
    for head in range(heads):  # query heads that read one key/value head get its keys and values
        first = a["kv_head"].index(a["kv_head"][head])
        assert torch.equal(captured.k[:, head], captured.k[:, first])
        assert torch.equal(captured.v[:, head], captured.v[:, first])
    # the logits are the model's float32 product; the float64 product of the float32 vectors differs by rounding
    product = captured.q @ captured.k.transpose(-1, -2)
    assert (captured.logits - product).abs().max() <= 1e-5 * product.abs().max()
    if a["n_kv_heads"] > 1:
        other = a["kv_head"].index(1)
        assert not torch.equal(captured.k[:, 0], captured.k[:, other])


def test_no_vocabulary_logits_are_computed(loaded):
    """The capture runs the base model: the LM head (Gemma: 262k logits per token) never runs."""
    model, ids, _ = loaded
    head = model.get_output_embeddings()
    if head is None:
        pytest.skip("an encoder without an LM head")
    calls = []
    hook = head.register_forward_hook(lambda *args: calls.append(1))
    try:
        capture_all(model, ids, what="weights")
    finally:
        hook.remove()
    assert calls == []


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("how", ["no mask function", "a mask function that returns None"])
def test_a_missing_mask_is_an_error_on_a_causal_model(monkeypatch, name, how):
    """Without the mask registered under the capture's name, transformers passes no mask: on a causal model the
    capture would silently be bidirectional. It is an error; an encoder, which has no mask anyway, is unchanged."""
    model, ids = _tiny(name)
    if how == "no mask function":
        monkeypatch.delitem(AttentionMaskInterface._global_mapping, CAPTURE_IMPLEMENTATION)
    else:
        monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS, CAPTURE_IMPLEMENTATION, lambda *args, **kwargs: None)
    if architecture(model)["causal"]:
        with pytest.raises(Exception, match="layer 0 of a causal model received no attention mask"):
            capture_all(model, ids)
    else:
        c = capture_all(model, ids, dtype=torch.float32)
        assert max((c.weights[i] - e[0]).abs().max() for i, e in enumerate(_eager(model, ids))) <= 1e-6


def test_streaming_hands_over_layers_in_order(loaded):
    model, ids, arch = loaded
    seen = []

    def keep_shapes(c: LayerCapture):
        seen.append((c.layer, tuple(c.q.shape), tuple(c.weights.shape), c.weights.dtype))

    heads, L, dh = arch["n_heads"], len(ids), arch["head_dim"]
    layers = capture(model, ids, keep_shapes, dtype=None)
    assert layers == [s[0] for s in seen] == list(range(arch["n_layers"]))
    assert all(s[1] == (1, heads, L, dh) and s[2] == (1, heads, L, L) and s[3] == torch.float32 for s in seen)


def test_capture_leaves_the_model_as_it_was(loaded):
    model, ids, _ = loaded
    with torch.inference_mode():
        before = model.base_model(input_ids=ids[None]).last_hidden_state
    with torch.inference_mode(), capture_mode(model):
        assert model.config._attn_implementation == CAPTURE_IMPLEMENTATION
        assert torch.equal(model.base_model(input_ids=ids[None]).last_hidden_state, before)
    assert model.config._attn_implementation == "eager"

    def fail(c):
        raise KeyError("callback failed")

    with pytest.raises(KeyError):
        capture(model, ids, fail)
    assert model.config._attn_implementation == "eager"


def test_selected_layers_stop_the_forward_pass_early():
    model = GPT2LMHeadModel._from_config(GPT2Config(vocab_size=97, n_embd=32, n_layer=6, n_head=4, n_positions=64),
                                         attn_implementation="eager").eval()
    ids = torch.arange(TINY_L)
    ran = []
    hooks = [block.register_forward_hook(lambda *args, i=i: ran.append(i)) for i, block in
             enumerate(model.transformer.h)]
    try:
        c = capture_all(model, ids, layers=[4, 2], what="weights")
    finally:
        for hook in hooks:
            hook.remove()
    assert c.layers == (2, 4) and c.weights.shape == (2, 4, TINY_L, TINY_L)
    assert c.q is None and c.logits is None and c.mask is None
    assert ran == [0, 1, 2, 3]  # block 4 stopped inside its attention; nothing after it ran


@pytest.mark.parametrize("name", TINY)
def test_batches_through_the_callback(name):
    model, ids = _tiny(name)
    batch = torch.stack([ids, ids.flip(0)])
    with torch.inference_mode():
        eager = model.base_model(input_ids=batch, output_attentions=True).attentions
    got = {}
    last = architecture(model)["n_layers"] - 1
    capture(model, batch, lambda c: got.setdefault(c.layer, (c.weights, c.mask)), layers=[0, last])
    for layer in (0, last):
        weights, mask = got[layer]
        assert weights.shape == (2, 4, TINY_L, TINY_L) and mask.shape[0] in (1, 2)
        assert (weights - eager[layer].double()).abs().max() <= 1e-6


def test_gpt2_layer_scaling_comes_through():
    config = GPT2Config(n_layer=3, n_head=4, n_embd=32, n_positions=32, scale_attn_by_inverse_layer_idx=True)
    model = GPT2LMHeadModel._from_config(config, attn_implementation="eager").eval()
    ids = torch.arange(16)
    c = capture_all(model, ids)
    assert torch.allclose(c.scaling, torch.tensor([8**-0.5 / (i + 1) for i in range(3)], dtype=torch.float64))
    with torch.inference_mode():
        eager = model(input_ids=ids[None], output_attentions=True).attentions
    assert max((c.weights[i] - eager[i][0].double()).abs().max() for i in range(3)) <= 1e-6


def test_softcapped_logits_are_refused():
    """Gemma 2 soft-caps its logits (Gemma 3 does not: QK-norm instead), so the logits would not rebuild the weights."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    assert config.attn_logit_softcapping == 50.0
    model = Gemma2ForCausalLM._from_config(config, attn_implementation="eager").eval()
    with pytest.raises(TypeError, match=r"soft-caps its logits \(softcap 50.0\)"):
        capture_all(model, torch.arange(TINY_L))


def test_bad_input_is_refused(gpt2):
    model, ids = gpt2
    with pytest.raises(ValueError, match="input_ids must be a LongTensor"):
        capture_all(model, torch.zeros(8))
    with pytest.raises(ValueError, match="subset of 0..1"):
        capture_all(model, ids, layers=[2])
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
