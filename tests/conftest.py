"""Session set-up: a fresh data cache seeded with War and Peace from ../shared, as .ci/run does.

Converted models (the dequantized SmolLM2) stay in the user's cache (ATTN_COMPANION_MODELS), so that seeding the
data folder does not force a slow conversion on every run.
"""
import shutil
from pathlib import Path

import pytest

from attn_utils.models import models_dir

SHARED_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "war-and-peace" / "pg2600.txt"


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory):
    """The seeded ATTN_COMPANION_DATA folder; it lacks pg2600.txt when ../shared does not have it."""
    patch = pytest.MonkeyPatch()
    patch.setenv("ATTN_COMPANION_MODELS", str(models_dir()))
    folder = tmp_path_factory.mktemp("attn-companion-data")
    if SHARED_CORPUS.is_file():
        shutil.copy(SHARED_CORPUS, folder / "pg2600.txt")
    patch.setenv("ATTN_COMPANION_DATA", str(folder))
    yield folder
    patch.undo()
