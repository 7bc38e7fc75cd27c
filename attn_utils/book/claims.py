"""The claims ledger: each claim of the paper, the value we measured, and a verdict.

Notebooks call :func:`record` as they test a claim; the reproducibility chapter collects every
record with :func:`load` (records live in the build's run folder, see :mod:`attn_utils.book.runlog`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from attn_utils.book import runlog
from attn_utils.mathematics.validation import check_choice

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


def record(claim: Claim) -> Claim:
    """Write ``claim`` to the run folder (one file per key, so re-running a notebook replaces its rows)."""
    runlog.write("claims", claim.key, {**asdict(claim), "notebook": runlog.notebook()})
    return claim


def load(folder: Path | None = None) -> pd.DataFrame:
    """Every recorded claim, ordered by chapter then key."""
    columns = [*Claim.__dataclass_fields__, "notebook"]
    return pd.DataFrame(runlog.read("claims", folder), columns=columns).sort_values(["chapter", "key"],
                                                                                  ignore_index=True)
