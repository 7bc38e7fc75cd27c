"""The claims ledger: each claim of the paper, the value we measured, and a verdict.

Notebooks call :func:`record` as they test a claim; the reproducibility chapter collects every
record with :func:`load`. Records are JSON files in the build's run folder (``ATTN_COMPANION_RUN_DIR``,
set by ``attn-companion``); a notebook opened by hand writes to ``runs/interactive/``.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from .validation import check_choice

VERDICTS = ("reproduced", "partly reproduced", "not reproduced", "not comparable", "holds", "fails")


@dataclass(frozen=True)
class Claim:
    """One row of the ledger.

    ``paper`` is what the paper states (its number or bound, in words); ``ours`` is what this run
    measured; ``verdict`` is one of :data:`VERDICTS` (``holds``/``fails`` for theorems checked on
    synthetic data, the others for empirical claims about a pretrained model).
    """

    key: str
    chapter: str
    claim: str
    paper: str
    ours: str
    verdict: str
    model: str
    note: str = ""

    def __post_init__(self):
        check_choice("verdict", self.verdict, VERDICTS)


def run_dir() -> Path:
    """The folder this build's artefacts go to."""
    return Path(os.environ.get("ATTN_COMPANION_RUN_DIR") or Path(__file__).resolve().parents[1] / "runs" / "interactive")


def record(claim: Claim) -> Claim:
    """Write ``claim`` to the run folder (one file per key, so re-running a notebook replaces its rows)."""
    folder = run_dir() / "claims"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{claim.key}.json").write_text(json.dumps(asdict(claim), indent=1))
    return claim


def load(folder: Path | None = None) -> pd.DataFrame:
    """Every recorded claim, ordered by chapter then key."""
    folder = (folder or run_dir()) / "claims"
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    columns = list(Claim.__dataclass_fields__)
    return pd.DataFrame(rows, columns=columns).sort_values(["chapter", "key"], ignore_index=True)
