"""What several test modules share (importable as ``helpers``: pyproject's ``pythonpath = ["tests"]``); fixtures
live in the ``conftest.py`` of the folder whose tests use them. The loop reference is ``reference``."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import jupytext
import nbformat
import numpy as np
import torch

from attn_utils.book import build

ROOT = Path(__file__).resolve().parents[1]

# --- random causal attention (the mathematics) -------------------------------------------------------------------

LAYERS, HEADS, L, D = 2, 3, 24, 8


def causal_attention(seed, layers=LAYERS, heads=HEADS, L=L, d=D, scale=2.0):
    """Random causal softmax attention (layers, heads, L, L), vectors (layers, heads, L, d), mask (L, L)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    logits = scale * torch.randn(layers, heads, L, L, generator=g, dtype=torch.float64)
    weights = torch.softmax(logits.masked_fill(~mask, -torch.inf), -1)
    return weights, torch.randn(layers, heads, L, d, generator=g, dtype=torch.float64), mask, logits


def close(a, b, rtol=1e-10, atol=1e-12):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rtol, atol=atol)


@contextmanager
def busy_cores():
    """One process per core spinning for the duration of the block (killed after): what runs inside, such as an
    interruption and the shutdown that follows, runs with every core busy and must not depend on timing. Started
    only around the moment under test, so that the rest of the suite (the other pytest worker) is not slowed for the
    whole test."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


# --- the small book (tests/book/test_book.py builds it; tests/cli/test_documented_commands.py scales to it) -------

# Small parameters: a random-weight GPT-2 and short windows, so the whole book executes in a few minutes.
SMALL = {
    "model": "gpt2-random",
    "L": 64,
    "lengths": [16, 32, 64],
    "synthetic_lengths": [4, 16, 64],
    "Ns": [1, 2, 4, 8],
    "Ts": [0.01, 0.1, 1.0, 10.0],
    "n_trials": 20,
    "n_samples": 32,
}

# --- the master notebooks of the exercises ----------------------------------------------------------------------


def master(stem: str) -> nbformat.NotebookNode:
    return jupytext.read(build.NOTEBOOK_DIR / f"{stem}.py")


def solution_cells(stem: str) -> dict[str, str]:
    """exercise key -> source of its cell tagged ``solution`` in the master notebook."""
    cells, key = {}, None
    for cell in master(stem).cells:
        if cell.cell_type == "markdown":
            key = next(iter(re.findall(r"```\{solution-start\} (\S+)", cell.source)[-1:]), key)
        elif "solution" in cell.metadata.get("tags", []):
            cells[key] = cell.source
    return cells


def solution_prose(stem: str) -> list[str]:
    """The markdown lines between solution-start and solution-end (directives excluded)."""
    text = "\n".join(c.source for c in master(stem).cells if c.cell_type == "markdown")
    blocks = re.findall(r"```\{solution-start\}.*?\n```\n(.*?)```\{solution-end\}", text, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if len(line.strip()) > 20]
