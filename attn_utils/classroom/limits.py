"""The time limits of the course's cells, importable without nbgrader (the command line checks them first)."""
from __future__ import annotations

from typing import Any

DEFAULT_TIME_LIMIT = 300.0          # seconds per cell
MAX_TIME_LIMIT = 86_400             # seconds a cell may run at most (a day)


def check_time_limit(value: Any) -> float:
    """``value`` as the seconds one cell may run, or ValueError naming the allowed range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIME_LIMIT:
        raise ValueError(f"time_limit must be a number of seconds in (0, {MAX_TIME_LIMIT}], got {value!r}")
    return float(value)
