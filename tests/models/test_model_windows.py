"""Windows as each model reads them: plain text (GPT-2, SmolLM2), <bos> + L-1 text tokens (Gemma 3), [CLS] + L-2 text
tokens + [SEP] (a BERT encoder)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils.models.corpus import WindowFormat, load_text, model_windows, token_windows
from attn_utils.models.loading import gpt2_tokenizer, load_tokenizer, window_format


@pytest.fixture(scope="module")
def novel():
    return load_text(chapters=(1, 2))


@pytest.fixture(scope="module")
def tokenizer():
    tok = gpt2_tokenizer()
    tok.model_max_length = 1024
    return tok


@pytest.fixture(scope="module")
def stream(novel, tokenizer):
    """The text tokens of the two chapters, tokenized once."""
    return torch.tensor(tokenizer(novel.text, add_special_tokens=False, verbose=False)["input_ids"])


FORMATS = {"plain": WindowFormat(), "bos": WindowFormat(prefix=(50256,), prefix_text=("<bos>",)),
           "cls-sep": WindowFormat(prefix=(7,), suffix=(8,), prefix_text=("[CLS]",), suffix_text=("[SEP]",))}


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(sorted(FORMATS)), L=st.integers(3, 200), offset=st.integers(0, 500),
       n_windows=st.integers(1, 4))
def test_a_window_is_its_prefix_then_consecutive_text_tokens_then_its_suffix(novel, tokenizer, stream, kind, L, offset,
                                                                             n_windows):
    window = FORMATS[kind]
    got = model_windows(novel, tokenizer, L, window, offset=offset, n_windows=n_windows)
    n, p = window.text_tokens(L), len(window.prefix)
    assert got.shape == (n_windows, L) and got.dtype == torch.long and n == L - window.specials
    for i in range(n_windows):
        assert got[i, :p].tolist() == list(window.prefix)
        assert got[i, L - len(window.suffix):].tolist() == list(window.suffix) or not window.suffix
        assert torch.equal(got[i, p:p + n], stream[offset + i * n: offset + (i + 1) * n])


def test_plain_windows_are_token_windows(novel, tokenizer):
    assert torch.equal(model_windows(novel, tokenizer, 50, offset=7, n_windows=3),
                       token_windows(novel, tokenizer, 50, offset=7, n_windows=3))
    assert torch.equal(model_windows(novel, tokenizer, 50, FORMATS["plain"]), token_windows(novel, tokenizer, 50))


def test_a_longer_causal_window_starts_with_the_shorter_one(novel, tokenizer):
    """One pass over the longest window serves every shorter L of a causal model (with or without <bos>); an encoder
    window ends with [SEP], so it does not."""
    for kind in ("plain", "bos"):
        short, long = (model_windows(novel, tokenizer, L, FORMATS[kind], offset=40)[0] for L in (64, 256))
        assert torch.equal(long[:64], short)
    short, long = (model_windows(novel, tokenizer, L, FORMATS["cls-sep"], offset=40)[0] for L in (64, 256))
    assert not torch.equal(long[:64], short) and torch.equal(long[:63], short[:63])


def test_rules_in_words_and_windows_too_short_for_their_specials(novel, tokenizer):
    assert [FORMATS[k].describe() for k in ("plain", "bos", "cls-sep")] == [
        "L text tokens (no special tokens)", "<bos> + L-1 text tokens", "[CLS] + L-2 text tokens + [SEP]"]
    with pytest.raises(ValueError, match=r"L must be an integer in \[3, inf\], got 2"):
        model_windows(novel, tokenizer, 2, FORMATS["cls-sep"])
    with pytest.raises(ValueError, match=r"L must be an integer in \[2, inf\], got 1"):
        model_windows(novel, tokenizer, 1, FORMATS["bos"])


def test_each_model_says_how_it_reads_a_window(tokenizer):
    assert window_format("gpt2-random", tokenizer) == window_format("smollm2-135m", tokenizer) == WindowFormat()
    assert window_format("gemma3-270m", tokenizer) == WindowFormat(prefix=(tokenizer.bos_token_id,))
    minilm = load_tokenizer("minilm-l6")
    bert = window_format("minilm-l6", minilm)
    assert bert == WindowFormat(prefix=(101,), suffix=(102,)) and bert.describe() == "[CLS] + L-2 text tokens + [SEP]"
    # the encoder's window is what its tokenizer makes of the same text tokens with its special tokens
    text = "Well, Prince, so Genoa and Lucca are now just family estates of the Buonapartes."
    ids = minilm(text)["input_ids"]
    assert model_windows(text, minilm, len(ids), bert)[0].tolist() == ids


@pytest.mark.slow
def test_gemma_reads_its_bos_first():
    tok = load_tokenizer("gemma3-270m")
    window = window_format("gemma3-270m", tok)
    assert window == WindowFormat(prefix=(2,)) and window.prefix_text == ("<bos>",)
    text = "Well, Prince, so Genoa and Lucca are now just family estates of the Buonapartes."
    ids = tok(text)["input_ids"]  # its tokenizer adds <bos> itself
    assert ids[0] == 2 and model_windows(text, tok, len(ids), window)[0].tolist() == ids
