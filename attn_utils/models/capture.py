"""Per layer and head: q, k, v, raw logits, temperature, mask and attention weights, as the model computes them.

A capturing attention function is registered with ``transformers.AttentionInterface`` under
``CAPTURE_IMPLEMENTATION``, together with the eager mask function under the same name (without it transformers
passes ``attention_mask=None`` and the causal mask silently disappears). The function calls the model's own eager
attention, so the forward pass is unchanged, and hands each layer to a callback as it is computed.

Conventions: ``logits = q @ k^T`` (raw, unscaled, computed in the model's dtype like the model does, then cast); the
model computes ``softmax(logits * scaling + mask)``, so its temperature is ``T = 1 / scaling``. ``k`` and ``v`` are
expanded to the query heads (grouped-query attention: query head h reads key/value head h // groups); ``q`` and ``k``
are taken as the model multiplies them: after QK-norm (Gemma 3) and rotary embeddings. ``mask`` is the additive mask
that layer applied: the causal mask, a sliding-window mask on Gemma's sliding layers (each layer its own), zeros for
a bidirectional encoder (transformers passes it no mask at all). A causal layer that receives no mask is an error,
never a silent bidirectional capture. The forward pass runs through the base model (``model.base_model``), so no
logits over the vocabulary are computed (Gemma's 262k tokens: 1 GB per 1024-token pass).
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

CAPTURE_IMPLEMENTATION = "attn_companion_capture"
FIELDS = ("q", "k", "v", "logits", "weights", "mask")


@dataclass
class LayerCapture:
    """One layer's attention for a batch: tensors are ``(B, H, L, d_head)`` or ``(B, H, L, L)``; ``mask`` is the
    additive mask this layer applied, ``(B, 1, L, L)`` (0 where allowed, a huge negative number elsewhere; one
    tensor shared by the layers that share a mask, e.g. Gemma's sliding layers). Fields not asked for are ``None``."""

    layer: int
    scaling: float
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    @property
    def temperature(self) -> float:
        """The model's softmax temperature, ``1 / scaling``."""
        return 1.0 / self.scaling


@dataclass
class AttentionCapture:
    """Stacked captures of one sequence: ``q, k, v`` are ``(n_layers, H, L, d_head)``; ``logits, weights`` are
    ``(n_layers, H, L, L)``; ``mask`` is ``(n_layers, L, L)``; ``scaling`` is ``(n_layers,)``; ``layers`` names the
    model layers in the order they are stacked."""

    layers: tuple[int, ...]
    scaling: torch.Tensor
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    @property
    def temperature(self) -> torch.Tensor:
        """``1 / scaling`` per layer."""
        return 1.0 / self.scaling


@dataclass
class _Session:
    """The state of one ``capture()`` call, seen by the attention function through ``_SESSION``."""

    callback: Callable[[LayerCapture], object]
    layers: frozenset[int]
    dtype: torch.dtype | None
    what: frozenset[str]
    calls: int = 0
    seen: list[int] = field(default_factory=list)
    masks: dict = field(default_factory=dict)  # id of a mask seen -> (the mask, its cast): layers share a few masks

    def cast(self, tensor):
        if tensor is None or self.dtype is None or not tensor.is_floating_point():
            return tensor
        return tensor.to(self.dtype)

    def cast_mask(self, mask):
        if id(mask) not in self.masks:
            self.masks[id(mask)] = (mask, self.cast(mask))
        return self.masks[id(mask)][1]

    def mask(self, module, query, key, attention_mask):
        """The additive mask the layer applied: a causal layer must have one; a bidirectional layer without one
        (transformers skips an all-zero mask) gets explicit zeros ``(B, 1, L, L)``."""
        if attention_mask is None:
            if getattr(module, "is_causal", True):
                raise RuntimeError(f"layer {module.layer_idx} of a causal model received no attention mask: the "
                                   f"capture would be bidirectional. The mask function registered under "
                                   f"{CAPTURE_IMPLEMENTATION!r} is missing")
            shape = (query.shape[0], 1, query.shape[2], key.shape[2])
            if shape not in self.masks:
                self.masks[shape] = (None, self.cast(query.new_zeros(shape)))
            return self.masks[shape][1]
        return self.cast_mask(attention_mask)


class _Stop(Exception):
    """Raised after the last requested layer, to skip the rest of the forward pass."""


_SESSION: ContextVar[_Session | None] = ContextVar("attn_companion_capture", default=None)


def _eager_attention(module):
    """The eager attention function of the module's own modeling file."""
    function = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if function is None:
        raise TypeError(f"cannot capture {type(module).__name__}: its modeling file defines no "
                        "eager_attention_forward (GPT-2, Llama, Gemma 3 and BERT models are supported)")
    return function


def _capturing_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention, plus a :class:`LayerCapture` handed to the active session's callback."""
    if kwargs.get("softcap") is not None:
        raise TypeError(f"cannot capture {type(module).__name__}: it soft-caps its logits (softcap "
                        f"{kwargs['softcap']}), so softmax(q.k * scaling + mask) would not give its weights")
    if getattr(module, "reorder_and_upcast_attn", False):  # GPT-2's eager path for this option
        output, weights = module._upcast_and_reordered_attn(query, key, value, attention_mask)
    else:
        output, weights = _eager_attention(module)(module, query, key, value, attention_mask, scaling=scaling,
                                                   dropout=dropout, **kwargs)
    session = _SESSION.get()
    if session is None:
        return output, weights
    layer = module.layer_idx if isinstance(getattr(module, "layer_idx", None), int) else session.calls
    session.calls += 1
    if layer in session.layers:
        session.seen.append(layer)
        scaling = query.size(-1) ** -0.5 if scaling is None else float(scaling)
        groups = query.shape[1] // key.shape[1]
        if groups > 1:  # grouped-query attention: one key/value head serves `groups` query heads
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        tensors = {"q": query, "k": key, "v": value, "weights": weights}
        if "logits" in session.what:
            tensors["logits"] = query @ key.transpose(-1, -2)  # the model's own product, before scaling
        captured = {name: session.cast(t) for name, t in tensors.items() if name in session.what}
        if "mask" in session.what:
            captured["mask"] = session.mask(module, query, key, attention_mask)
        session.callback(LayerCapture(layer, scaling, **captured))
        if len(session.seen) == len(session.layers):
            raise _Stop
    return output, weights


AttentionInterface.register(CAPTURE_IMPLEMENTATION, _capturing_attention)
AttentionMaskInterface.register(CAPTURE_IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["eager"])


@contextmanager
def capture_mode(model):
    """Switch ``model`` to the capturing attention for the ``with`` block, then restore its implementation."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(CAPTURE_IMPLEMENTATION)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


def _check_input(model, input_ids) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.long or input_ids.dim() not in (1, 2):
        raise ValueError("input_ids must be a LongTensor of shape (L,) or (batch, L), e.g. from token_windows()")
    ids = input_ids.unsqueeze(0) if input_ids.dim() == 1 else input_ids
    if model.training:
        raise ValueError("the model is in training mode (dropout active); call model.eval() first")
    return ids.to(model.device)


def _check_layers(model, layers: Iterable[int] | None) -> frozenset[int]:
    n = model.config.num_hidden_layers
    chosen = frozenset(range(n) if layers is None else [layers] if isinstance(layers, int) else layers)
    if not chosen or not chosen <= set(range(n)):
        raise ValueError(f"layers must be a non-empty subset of 0..{n - 1}, got {layers!r}")
    return chosen


def capture(model, input_ids: torch.Tensor, callback: Callable[[LayerCapture], object], *,
            layers: int | Iterable[int] | None = None, dtype: torch.dtype | None = torch.float64,
            what: Iterable[str] = FIELDS) -> list[int]:
    """Run ``model`` on ``input_ids`` and call ``callback(LayerCapture)`` for each requested layer, in order.

    Nothing is kept between callbacks, so memory holds one layer's capture at a time. The forward pass runs through
    the base model (no vocabulary logits) and stops after the last requested layer. ``dtype`` casts the captured
    tensors (``None`` keeps the model's dtype and hands over the model's own tensors: do not modify them in place);
    ``what`` picks fields from ``FIELDS``. Returns the layers captured.
    """
    what = frozenset([what] if isinstance(what, str) else what)
    if not what <= set(FIELDS):
        raise ValueError(f"what must be a subset of {FIELDS}, got {sorted(what)}")
    ids = _check_input(model, input_ids)
    session = _Session(callback, _check_layers(model, layers), dtype, what)
    token = _SESSION.set(session)
    try:
        with torch.inference_mode(), capture_mode(model):
            model.base_model(input_ids=ids, use_cache=False)
    except _Stop:
        pass
    finally:
        _SESSION.reset(token)
    if len(session.seen) != len(session.layers):
        raise RuntimeError(f"captured layers {session.seen} of {sorted(session.layers)}: {type(model).__name__} "
                           "does not route all its attention through transformers' AttentionInterface")
    return session.seen


def capture_all(model, input_ids: torch.Tensor, *, layers: int | Iterable[int] | None = None,
                dtype: torch.dtype | None = torch.float64, what: Iterable[str] = FIELDS) -> AttentionCapture:
    """Capture the requested layers of one sequence (``(L,)`` or ``(1, L)``) and stack them."""
    if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] != 1:
        raise ValueError(f"capture_all takes one sequence, got a batch of {input_ids.shape[0]}; "
                         "use capture() with a callback for batches")
    captured: list[LayerCapture] = []
    capture(model, input_ids, captured.append, layers=layers, dtype=dtype, what=what)
    stacked = {}
    for name in FIELDS:
        tensors = [getattr(c, name) for c in captured]
        if all(t is not None for t in tensors):
            stacked[name] = torch.stack([t[0, 0] if name == "mask" else t[0] for t in tensors])
    return AttentionCapture(layers=tuple(c.layer for c in captured),
                            scaling=torch.tensor([c.scaling for c in captured], dtype=torch.float64), **stacked)
