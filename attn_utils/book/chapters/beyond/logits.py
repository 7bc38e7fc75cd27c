"""The model's logits for chapter ch6_beyond: one forward pass over the longest window, keeping the scaled logits
of the query rows sampled per octave and every head's value vectors."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import psutil
import torch

from attn_utils.book.chapters.beyond.common import F64
from attn_utils.book.formatting import fmt
from attn_utils.mathematics import algorithms
from attn_utils.models import capture

# the lenses hold, besides the float64 logits of the sampled rows, temporaries of about twice their size (measured:
# peak memory grows by 2.9 bytes per byte of logits between 4 and 16 rows per octave on SmolLM2)
LENS_MEMORY = 3.0


@dataclass
class Block:
    """Sampled query rows of one octave: ``rows`` (0-based), K = keys the last of them sees (all L_run keys on an
    encoder), the scaled logits ``(layers, heads, len(rows), K)`` in float64 and the model's ``mask``
    ``(len(rows), K)`` of the keys each row sees (``Session.visible``)."""

    rows: np.ndarray
    K: int
    logits: torch.Tensor
    mask: torch.Tensor


@dataclass
class ModelLogits:
    """What the chapter keeps of one forward pass over the window of ``L_run`` >= L tokens: the scaled logits
    l = q.k * scaling of the sampled query rows (``blocks["main"]``: rows t <= L; ``blocks["extra"]``: the further
    rows of the longer windows) and every head's value vectors."""

    model: str
    context: int
    L: int
    long_lengths: list[int]
    rows_per_octave: int | None
    samples: dict[int, tuple[np.ndarray, np.ndarray]]
    blocks: dict[str, list[Block]]
    values: torch.Tensor        # (layers, heads, L_run, d), the model's dtype
    softmax_error: float        # max |softmax of our logits - the model's attention| (sanity check)
    kv_heads: int
    kv_head: list[int] | None = None  # the key/value head of each query head (architecture fact kv_head)
    causal: bool = True         # False on an encoder: every row sees all L_run keys

    @property
    def L_run(self) -> int:
        return max([self.L, *self.long_lengths])

    @property
    def s(self) -> float:
        """SSMax's parameter on the model, 1 / log L: it coincides with the model's softmax on a row of L keys."""
        return 1.0 / math.log(self.L)

    @property
    def n_layers(self) -> int:
        return int(self.values.shape[0])

    @property
    def device(self) -> torch.device:
        """Where the logits are kept and analysed: the device the model ran on."""
        return self.values.device

    @property
    def n_heads(self) -> int:
        return int(self.values.shape[1])

    def seen(self, rows) -> np.ndarray:
        """How many keys each 0-based query row of ``rows`` sees: t = row + 1 on a causal model, L_run on an
        encoder."""
        rows = np.asarray(rows)
        return rows + 1 if self.causal else np.full(rows.shape, self.L_run)

    @property
    def main_rows(self) -> np.ndarray:
        return self.samples[self.L][0]

    @property
    def n_extra_rows(self) -> int:
        return sum(len(b.rows) for b in self.blocks.get("extra", []))

    def row_weights(self, length: int) -> pd.Series:
        """Row index -> how many rows it stands for among the rows t <= length (exact at octave ends): the sample of
        that length, or the complete octaves of the L sample for a power of two below L."""
        if length in self.samples:
            rows, weight = self.samples[length]
        else:
            keep = self.samples[self.L][0] < length
            rows, weight = self.samples[self.L][0][keep], self.samples[self.L][1][keep]
        return pd.Series(weight, index=rows)

    def head_means(self, frame: pd.DataFrame, column: str, length: int) -> pd.DataFrame:
        """Per (normalizer, layer, head): the weighted mean of ``column`` over the valid sampled rows t <= length,
        each row weighted by the rows it stands for (the estimator of chapter ch2_distance)."""
        weights = self.row_weights(length)
        sub = frame[frame.row.isin(weights.index)].copy()
        sub["w"] = sub.row.map(weights) * sub[column].notna()
        sub["wx"] = sub.w * sub[column].fillna(0)
        out = sub.groupby(["name", "layer", "head"])[["wx", "w"]].sum()
        return (out.wx / out.w.replace(0, np.nan)).rename(column).reset_index()

    def tidy(self, rows: np.ndarray, **columns) -> pd.DataFrame:
        """A frame with one row per (layer, head, sampled row) from ``(layers, heads, rows)`` tensors or scalars."""
        n = len(rows)
        base = {"layer": np.repeat(np.arange(self.n_layers), self.n_heads * n),
                "head": np.tile(np.repeat(np.arange(self.n_heads), n), self.n_layers),
                "row": np.tile(rows, self.n_layers * self.n_heads)}
        return pd.DataFrame({**{k: v.flatten().cpu().numpy() if torch.is_tensor(v) else v for k, v in columns.items()},
                             **base})

    def facts(self, session_summary: dict) -> pd.DataFrame:
        return pd.Series({**session_summary, "window read": f"{self.L_run} tokens (rows t <= {self.L} for the "
                                                            "normalizer lenses)"}, name="value").to_frame()

    def prose(self) -> dict:
        return {"model_name": self.model, "m_L": self.L, "m_Lrun": self.L_run, "m_rows": len(self.main_rows),
                "m_heads": f"{self.n_layers} layers x {self.n_heads} heads = {self.n_layers * self.n_heads} heads",
                "m_rows_extra": self.n_extra_rows, "m_err": self.softmax_error, "m_s": fmt(self.s, 4),
                "m_measured": f"{self.model} is a causal model: the lenses read each row over its own prefix." if
                              self.causal else f"{self.model} is an encoder: every row has the same {self.L} keys, so "
                              "no lens reads a slope against the row length t on it (the claims that do are not "
                              "comparable there) and no window beyond L is read.",
                "m_every_row_gib": fmt(lens_memory({"n_layers": self.n_layers, "n_heads": self.n_heads},
                                                   _row_sets(self.L, self.long_lengths, None, self.causal)[2]) / 2**30)}


def capture_logits(session, long_lengths: list[int], rows_per_octave, threads: int | None = None) -> ModelLogits:
    """One forward pass over the longest window (``Session.longer``; ``long_lengths`` is the validated list of the
    parameter rule of :mod:`attn_utils.book.params`, possibly empty), keeping layer by layer the scaled logits of the
    rows sampled per octave (``algorithms.sample_rows``, grouped by ``algorithms.octave_blocks``) and the value
    vectors, of the layers the reader measures (``Session.layers``: on Gemma 3 beyond 512 tokens its global layers),
    each row over the keys the model lets it see (``Session.visible``). On an encoder a row's weights depend on the
    whole window, so the rows t <= L' of one window are not an L'-token window: no longer window is read there
    (``long_lengths`` is ignored) and every block holds all L keys. Checks on the last block of every layer that
    softmax of the kept logits is the model's attention. ``threads``: torch threads for the forward pass (the
    chapter's small operations run on one)."""
    L = session.L
    long_run = list(long_lengths) if session.causal else []
    reader = session.longer(max([L, *long_run]))
    samples, row_sets, groups = _row_sets(L, long_run, rows_per_octave, causal=reader.causal)
    main, device = row_sets["main"], reader.input_ids.device
    layers, arch = reader.layers, session.provenance.architecture
    visible = reader.visible()
    _check_memory(lens_memory({**arch, "n_layers": len(layers)}, groups), rows_per_octave, reader.L, device)
    stored = {g: [[] for _ in blocks] for g, blocks in groups.items()}
    values, check = [], {"err": 0.0}

    def collect(layer):  # on the session's device, where the forward pass runs and the lenses then run
        q, k, v, w = (t[0] for t in (layer.q, layer.k, layer.v, layer.weights))
        for g, blocks in groups.items():
            for b, (pos, K) in enumerate(blocks):
                rows = torch.as_tensor(row_sets[g][pos], device=device)
                stored[g][b].append((q[:, rows] @ k[:, :K].mT) * layer.scaling)
        values.append(v.clone())
        pos, K = groups["main"][-1]
        rows = torch.as_tensor(main[pos], device=device)
        ours = torch.softmax(stored["main"][-1][-1].masked_fill(~visible[rows, :K], -torch.inf), -1)
        check["err"] = max(check["err"], float((ours - w[:, rows, :K]).abs().max()))

    previous = torch.get_num_threads()
    torch.set_num_threads(threads or previous)
    try:
        capture.capture(reader.model, reader.input_ids, collect, layers=layers, dtype=None,
                        what=("q", "k", "v", "weights"))
    finally:
        torch.set_num_threads(previous)
    blocks = {g: [Block(row_sets[g][pos], K, torch.stack(stored[g][b]).to(F64),
                        visible[torch.as_tensor(row_sets[g][pos], device=device), :K])
                  for b, (pos, K) in enumerate(blocks)]
              for g, blocks in groups.items()}
    return ModelLogits(session.name, session.context, L, long_run, rows_per_octave, samples, blocks,
                       torch.stack(values), check["err"], int(arch.get("n_kv_heads") or arch["n_heads"]),
                       list(arch["kv_head"]) if arch.get("kv_head") is not None else None, reader.causal)


def _row_sets(L: int, long_run: list[int], rows_per_octave, causal: bool = True):
    """The sampled rows of each length (``algorithms.sample_rows``), the rows kept (``main``: t <= L; ``extra``: the
    further rows of the longer windows) and their blocks of one octave each (``algorithms.octave_blocks``; on an
    encoder every block holds all L keys)."""
    samples = {Lp: algorithms.sample_rows(Lp, rows_per_octave) for Lp in [L, *long_run]}
    main = samples[L][0]
    extra = np.setdiff1d(np.concatenate([samples[Lp][0] for Lp in long_run]), main) if long_run else np.array([], int)
    row_sets = {"main": main, **({"extra": extra} if len(extra) else {})}
    groups = {g: algorithms.octave_blocks(rows) for g, rows in row_sets.items()}
    if not causal:
        groups = {g: [(pos, max([L, *long_run])) for pos, _ in blocks] for g, blocks in groups.items()}
    return samples, row_sets, groups


def lens_memory(arch: dict, groups: dict) -> float:
    """Bytes that the lenses need for the blocks ``groups`` of a row sample (:func:`_row_sets`): the float64 logits
    of its (row, key) pairs in every layer and head, times :data:`LENS_MEMORY` for the temporaries."""
    keys = sum(len(pos) * K for blocks in groups.values() for pos, K in blocks)
    return LENS_MEMORY * 8 * keys * arch["n_layers"] * arch["n_heads"]


def _check_memory(need: float, rows_per_octave, L_run: int, device: torch.device) -> None:
    """Refuse, before the forward pass, a row sample that needs ``need`` bytes (:func:`lens_memory`) when that
    does not fit in the memory available now on ``device`` (a GPU's free memory, or the machine's): the chapter
    would otherwise be killed minutes later for want of memory."""
    available = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else psutil.virtual_memory().available
    if need > available:
        raise ValueError(f"rows_per_octave={rows_per_octave!r} over a {L_run}-token window needs about "
                         f"{need / 2**30:.3g} GiB for the logits of its rows and the lenses' temporaries, and "
                         f"{available / 2**30:.3g} GiB of memory is available; sample fewer rows (a smaller "
                         f"rows_per_octave) or read a shorter window (long_lengths)")
