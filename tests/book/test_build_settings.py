"""Build settings: the public repository as one setting, and the ledger executed after the chapters it reads."""
import shutil

import pytest
import yaml

from attn_utils.book import build


def test_without_a_repository_no_button_points_anywhere(tmp_path):
    config = tmp_path / "_config.yml"
    shutil.copy(build.ROOT / "_config.yml", config)
    build._configure(config, None)
    settings = yaml.safe_load(config.read_text())
    assert "url" not in settings["repository"] and not settings["html"]["use_repository_button"]
    assert "binderhub_url" not in settings["launch_buttons"] and "colab_url" not in settings["launch_buttons"]


def test_a_repository_turns_on_its_buttons(tmp_path):
    config = tmp_path / "_config.yml"
    shutil.copy(build.ROOT / "_config.yml", config)
    build._configure(config, "https://github.com/someone/attn-companion")
    settings = yaml.safe_load(config.read_text())
    assert settings["repository"]["url"] == "https://github.com/someone/attn-companion"
    assert settings["html"]["use_repository_button"] and settings["launch_buttons"]["binderhub_url"]
    assert settings["sphinx"] == yaml.safe_load((build.ROOT / "_config.yml").read_text())["sphinx"]


@pytest.mark.parametrize("bad", ["github.com/a/b", "https://example.org/a/b", "https://github.com/a", "x"])
def test_a_bad_repository_is_refused_before_any_work(bad, tmp_path):
    with pytest.raises(ValueError, match="repository must look like https://github.com/OWNER/NAME"):
        build.build_book({}, out=tmp_path / "html", repository=bad)
    assert not (tmp_path / "html").exists()


def test_the_ledger_runs_after_every_chapter_it_reads_but_stays_in_place_in_the_toc():
    notebooks = build.book_notebooks()
    order = [nb.stem for nb in sorted(notebooks, key=build.reads_run_records)]
    assert order[-1] == "ch5_reproducibility" and build.reads_run_records(build.NOTEBOOK_DIR / "ch5_reproducibility.py")
    toc = [nb.stem for nb in notebooks]
    assert toc.index("ch5_reproducibility") == toc.index("ch4_gradient") + 1  # right after the paper's chapters
