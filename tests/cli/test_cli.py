"""How ``attn-companion`` fails: interrupted builds, bad output folders, ``make book PARAMS=...`` quoting."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from attn_utils import cli

from attn_utils.book import build
from helpers import busy_cores

ROOT = Path(__file__).resolve().parents[2]

# builds the book of the project folder argv[1] with the CLI arguments argv[2:]
BOOK_OF = ("import functools, sys; from pathlib import Path; "
           "from attn_utils import cli; from attn_utils.book import build; "
           "build.build_book = functools.partial(build.build_book, root=Path(sys.argv[1])); "
           "sys.exit(cli.main(sys.argv[2:]))")


@pytest.fixture
def sleepy_book(tmp_path):
    """A book whose one notebook (parameter ``seed``) writes its kernel's PID to ``kernel-<seed>.pid``, then
    sleeps."""
    root = tmp_path / "proj"
    (root / "book").mkdir(parents=True)
    (root / "notebooks").mkdir()
    shutil.copy(ROOT / "_config.yml", root / "_config.yml")
    (root / "book" / "intro.md").write_text("# Intro\n")
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: notebooks/sleepy\n")
    (root / "notebooks" / "sleepy.py").write_text(textwrap.dedent(f'''\
        # %% tags=["parameters"]
        seed = 0

        # %%
        import os, time
        open(f"{tmp_path}/kernel-{{seed}}.pid", "w").write(str(os.getpid()))
        time.sleep(120)
        '''))
    return root


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("command, signum, group", [("book", signal.SIGINT, True), ("book", signal.SIGTERM, False),
                                                    ("run", signal.SIGINT, True), ("sweep", signal.SIGINT, True)],
                         ids=["book-ctrl-c", "book-sigterm", "run-ctrl-c", "sweep-ctrl-c"])
def test_interrupted_command_ends_with_one_line_and_no_process_left(sleepy_book, tmp_path, command, signum, group):
    """Ctrl-C (SIGINT to the process group) or SIGTERM while a kernel runs a cell: exit 130, one line, the previous
    book kept, and no kernel left (a sweep's too, whose workers die first); from the signal on, every core is busy."""
    notebook = str(sleepy_book / "notebooks" / "sleepy.py")
    out = tmp_path / ("_build/html" if command == "book" else "runs")
    out.mkdir(parents=True)
    (out / "index.html").write_text("the previous book")
    argv = {"book": ["book"], "run": ["run", notebook], "sweep": ["sweep", notebook, "-p", "seed", "0,1"]}[command]
    process = subprocess.Popen([sys.executable, "-c", BOOK_OF, str(sleepy_book), *argv, "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    started = 2 if command == "sweep" else 1
    deadline = time.monotonic() + 120
    while (len([f for f in tmp_path.glob("kernel-*.pid") if f.read_text()]) < started and process.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.2)
    kernels = [int(f.read_text()) for f in tmp_path.glob("kernel-*.pid")]
    assert len(kernels) == started, process.communicate()
    with busy_cores():
        if group:
            os.killpg(process.pid, signum)  # as Ctrl-C does: the whole foreground process group
        else:
            process.send_signal(signum)
        _, err = process.communicate(timeout=180)  # generous: the kernel shuts down on a loaded machine too
        deadline = time.monotonic() + 10
        while any(_running(k) for k in kernels) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert process.returncode == 130
    assert "Traceback" not in err
    kept = {"book": f"; the previous book in {out} is kept",
            "sweep": f"; the finished runs in {out} are kept (a re-run skips them)"}.get(command, "")
    assert err.strip().splitlines()[-1] == f"attn-companion {command}: interrupted{kept}"
    assert err.count("attn-companion") == 1
    assert (out / "index.html").read_text() == "the previous book"
    assert not list(out.parent.glob(".staging-*"))
    assert not [k for k in kernels if _running(k)]


@pytest.mark.parametrize("command", [["book"], ["run", "ch2_distance"], ["sweep", "ch2_distance", "-p", "N", "5,10"]])
def test_bad_out_folder_is_refused_before_any_work(command, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for bad, reason in (("/dev/null/x", "/dev/null is not a folder"), (a_file / "sub", f"{a_file} is not a folder")):
        assert cli.main([*command, "--out", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err == f"attn-companion {command[0]}: error: --out {bad}: {reason}\n"
    assert list(tmp_path.iterdir()) == [a_file]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_out_folder_is_refused(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert cli.main(["run", "ch2_distance", "--out", str(locked / "runs")]) == 2
    assert f"--out {locked / 'runs'}: {locked} is not writable" in capsys.readouterr().err


def test_book_params_are_split_like_a_shell_line(monkeypatch, tmp_path, capsys):
    seen = {}

    def build_book(parameters, *, out, repository=None, windows=None, reuse=True):
        seen.update(parameters)
        return build.BookResult(out, out.with_name("html-records"), {})

    monkeypatch.setattr(build, "build_book", build_book)
    argv = ["book", "--out", str(tmp_path / "html"), "--params", "Ts=[1,2] Ns='[1, 5]' model=gpt2 L=512",
            "-p", "seed", "3"]
    assert cli.main(argv) == 0
    assert seen == {"Ts": [1, 2], "Ns": [1, 5], "model": "gpt2", "L": 512, "seed": 3}
    assert cli.main(["book", "--out", str(tmp_path / "html"), "--params", ""]) == 0


@pytest.mark.parametrize("params", ["Ts=[1, 2]", "L=512 seed", "Ts='[1, 2]"])
def test_book_params_that_spaces_broke_explain_the_quoting(params, capsys):
    assert cli.main(["book", "--params", params]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attn-companion book: error: --params") and err.count("\n") == 1
    assert "PARAMS is split at spaces" in err and "PARAMS='Ts=[1,2]'" in err


def test_auto_says_on_the_terminal_which_model_it_takes(tmp_path, capsys):
    nb = tmp_path / "nb.py"
    nb.write_text('# %% tags=["parameters"]\nmodel = "auto"\nL = 8\n')
    build.preflight([(nb, {}), (nb, {"L": 16})])  # once for both runs
    line = capsys.readouterr().out.strip()
    assert line.startswith("model 'auto' -> smollm2-135m: GPT-2 could not be loaded here (") and "\n" not in line
    build.preflight([(nb, {"model": "gpt2-random"})])
    assert capsys.readouterr().out == ""


def test_corpus_command_checks_the_shipped_copy(capsys, monkeypatch, tmp_path):
    from attn_utils.models import corpus

    assert cli.main(["corpus"]) == 0
    assert f"sha256 {corpus.WAR_AND_PEACE_SHA256} (pinned), 365 chapters" in capsys.readouterr().out
    damaged = tmp_path / "pg2600.txt.xz"
    damaged.write_bytes(b"not xz")
    monkeypatch.setattr(corpus, "WAR_AND_PEACE_DATA", damaged)
    assert cli.main(["corpus"]) == 2
    assert "not a valid xz file" in capsys.readouterr().err
    assert cli.main(["corpus", "--refresh"]) == 2  # no network in the tests: a clear error, the copy untouched
    assert "download of" in capsys.readouterr().err and damaged.read_bytes() == b"not xz"
