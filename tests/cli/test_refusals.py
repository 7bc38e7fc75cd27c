"""Refusals that come early, fast and in one line; locks, interrupted runs and a sweep's scratch files (issue 23)."""
from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import jupytext
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_utils import cli
from attn_utils.book import build, params, sources, sweep, windows

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "papermill", "jupytext", "nbformat", "pandas", "distributed")

# runs the CLI with argv[1:], then prints which heavy modules it imported
PROBE = ("import sys; from attn_utils import cli; rc = cli.main(sys.argv[1:]); "
         f"print(sorted(m for m in {HEAVY!r} if m in sys.modules)); sys.exit(rc)")


@pytest.mark.parametrize("argv, message", [
    (["run", "ch2_distance", "-p", "L", "abc"], "ch2_distance: parameter L must be an integer >= 2, got 'abc'"),
    (["run", "ch1_vanishing", "-p", "Ts", "[1e-300]"], "parameter Ts must be a non-empty list of numbers in [1e-06"),
    (["run", "ch3_separability", "-p", "M", "1e-300"], "parameter M must be a number in [1e-100, 1e+100]"),
    (["run", "ch0_setting", "-p", "seed", "18446744073709551616"], "parameter seed must be an integer in [0, 2**63"),
    (["run", "ch1_vanishing", "-p", "n_trials", "1000000000000"],
     "parameter n_trials = 1000000000000 needs at least 8 TB"),
    (["run", "ch2_distance", "-p", "n_samples", "10000000000000"], "needs at least 80 TB of memory"),
    (["sweep", "ch0_setting", "-p", "seed", "0,18446744073709551616"],
     "parameter seed must be an integer in [0, 2**63"),
    (["sweep", "ch2_distance", "-p", "L", ","], "-p L: no value given"),
    (["book", "-p", "L", "abc"], "parameter L must be an integer >= 2, got 'abc'"),
    (["run", "ch9_nothing"], "notebook 'ch9_nothing' not found"),
    (["student", "--out", "{tmp}/c", "--time-limit", "inf"], "time_limit must be a number of seconds in (0, 86400]"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_argument_and_parameter_errors_come_before_the_heavy_imports(argv, message, tmp_path):
    argv = [a.format(tmp=tmp_path) for a in argv]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    seconds = time.perf_counter() - start  # reported, not asserted: a loaded machine is slow, the import set is not
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert done.stdout.strip() == "[]", f"imported {done.stdout.strip()} before refusing ({seconds:.1f} s)"
    assert not (tmp_path / "c").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("src", sorted((ROOT / "notebooks").glob("*.py")), ids=lambda p: p.stem)
def test_the_light_parameters_cell_is_the_one_jupytext_reads(src):
    cell = next((c for c in jupytext.read(src).cells if "parameters" in c.metadata.get("tags", [])), None)
    expected = {} if cell is None else {k: v for k, v in _literal_assignments(cell.source).items()}
    assert sources.notebook_parameters(src) == expected


def _literal_assignments(source: str) -> dict:
    namespace: dict = {}
    exec(source, {}, namespace)  # the cell of one of our notebooks: literals only
    return namespace


def test_a_notebook_in_another_format_is_read_with_jupytext(tmp_path):
    src = tmp_path / "light.py"
    src.write_text(textwrap.dedent('''\
        # + tags=["parameters"]
        L = 8
        Ts = [1.0, 2.0]
        # -

        print(L)
        '''))
    assert sources.notebook_parameters(src) == {"L": 8, "Ts": [1.0, 2.0]}


# --- the bounds of the specification --------------------------------------------------------------------------

def test_seed_is_a_signed_64_bit_integer():
    assert params.validate(seed=2**63 - 1).seed == 2**63 - 1
    for bad in (2**63, 2**64, -1):
        with pytest.raises(params.ParameterError, match=r"seed must be an integer in \[0, 2\*\*63 - 1\]"):
            params.validate(seed=bad)


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=1e-320, max_value=1e300))
def test_scales_and_radius_are_accepted_exactly_in_their_ranges(x):
    lo, hi = params.SCALE_RANGE
    for name in ("Ts", "epsilons", "sigmas"):
        assert _accepts(**{name: [1.0, x]}) == (lo <= x <= hi)
    lo, hi = params.RADIUS_RANGE
    assert _accepts(M=x) == (lo <= x <= hi)


def _accepts(**values) -> bool:
    try:
        params.validate(**values)
    except params.ParameterError:
        return False
    return True


def test_sizes_are_checked_against_the_memory_with_the_estimate():
    assert params.validate(facts={"memory": 8000}, n_trials=1000, n_samples=1000).n_trials == 1000
    with pytest.raises(params.ParameterError, match=r"n_trials = 1001 needs at least 8.01 kB .* but 8 kB are "):
        params.validate(facts={"memory": 8000}, n_trials=1001)
    with pytest.raises(params.ParameterError, match=r"n_samples = 2000 needs at least 16 kB"):
        params.validate(facts={"memory": 8000}, n_samples=2000)
    # the memory is read for the rule but not recorded: it would change every cache key
    assert dict(params.validate(facts={"memory": 8000}, n_trials=5).facts) == {}
    assert any("n_trials x 8 bytes" in rule.states for rule in params.RULES)


def test_available_memory_is_read_and_plausible():
    memory = params.available_memory()
    assert memory is not None and 2**20 < memory < 2**50


def test_a_huge_sparse_corpus_is_refused_by_its_size(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(2 * 2**30)  # 2 GiB of NUL bytes, sparse: no disk used
    with pytest.raises(params.ParameterError, match="UTF-8 text file of at most 256 MiB"):
        params.validate(corpus=str(big))


def test_a_binary_corpus_is_refused_from_its_head_without_reading_it_whole(tmp_path):
    from attn_utils.models import corpus

    binary = tmp_path / "sparse.txt"
    with open(binary, "wb") as f:
        f.truncate(200 * 2**20)  # within the spec's size, all NUL bytes
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="holds NUL bytes"):
            corpus.load_text(binary)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20  # the first MiB, not the 200 MiB


# --- no traceback from any command ----------------------------------------------------------------------------

@pytest.mark.parametrize("claims", [3, [1, 2], [{"key": "x", "verdicts": 5, "stable": True, "seen": 1, "headline": 1,
                                                   "values": {}}]])
def test_windows_file_of_the_wrong_shape_is_one_line(tmp_path, claims, capsys):
    path = tmp_path / "windows.json"
    path.write_text(json.dumps({"K": 2, "windows": [], "claims": claims}))
    with pytest.raises(ValueError, match=f"--windows {path}"):
        windows.load(path)
    assert cli.main(["book", "--out", str(tmp_path / "html"), "--windows", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("command, target", [(["run", "ch0_setting"], "run_one"),
                                             (["sweep", "ch0_setting", "-p", "seed", "1,2"], "sweep")])
def test_a_full_disk_is_one_line(command, target, monkeypatch, tmp_path, capsys):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "runs" / "status.json"))

    monkeypatch.setattr(sweep, target, full)
    assert cli.main([*command, "--out", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert err == f"attn-companion {command[0]}: error: No space left on device: {tmp_path / 'runs' / 'status.json'}\n"


def test_exercises_only_refuses_an_unknown_model_by_name(tmp_path, capsys):
    out = tmp_path / "course"
    assert cli.main(["student", "--out", str(out), "ch0_setting", "--exercises-only", "-p", "model", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-p model 'nonsense': unknown model 'nonsense'" in err
    assert not out.exists()


# --- one writer per output folder -----------------------------------------------------------------------------

HOLD = ("import sys, time; from pathlib import Path; from attn_utils.book import build; "
        "lock = build.hold_lock(Path(sys.argv[1])); print('held', flush=True); time.sleep(120)")


def _tiny_book(root: Path) -> Path:
    (root / "book").mkdir(parents=True)
    (root / "notebooks").mkdir()
    (root / "book" / "intro.md").write_text("# Intro\n")
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: notebooks/one\n")
    (root / "notebooks" / "one.py").write_text("# %%\nprint(1)\n")
    return root


def test_a_second_build_into_the_same_folder_is_refused_and_a_killed_one_leaves_no_lock(tmp_path):
    out = tmp_path / "html"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(build.FolderBusy) as busy:
            build.build_book(root=_tiny_book(tmp_path / "proj"), out=out, progress=False)
        assert f"{out} is being written by another build (process {holder.pid}" in str(busy.value)
        assert not list(tmp_path.glob(".staging-*"))
    finally:
        holder.kill()  # as kill -9
        holder.wait()
    build.hold_lock(out).close()  # free again: flock died with its process


def test_a_second_run_into_the_same_run_folder_is_refused(tmp_path, monkeypatch):
    src = sources.resolve_notebook("ch0_setting")
    monkeypatch.setattr(sweep, "preflight", lambda runs: [None])
    folder = sweep.run_folder(src, {"seed": 1}, tmp_path)
    with build.hold_lock(folder, "run"):
        pid = os.getpid()
        with pytest.raises(build.FolderBusy, match=f"another run \\(process {pid}"):
            sweep.run_one(src, {"seed": 1}, tmp_path)


def test_the_cli_says_the_folder_is_busy_in_one_line(tmp_path, monkeypatch, capsys):
    def busy(*args, **kwargs):
        raise build.FolderBusy(f"{tmp_path} is being written by another build (process 1, lock x)")

    monkeypatch.setattr(build, "build_book", busy)
    assert cli.main(["book", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# --- interrupted runs -----------------------------------------------------------------------------------------

def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_killed_run_reads_as_interrupted(tmp_path):
    for name, pid, host, expected in [("dead", _dead_pid(), socket.gethostname(), "interrupted"),
                                      ("alive", os.getpid(), socket.gethostname(), "running"),
                                      ("elsewhere", _dead_pid(), "another-host", "running")]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "status.json").write_text(json.dumps({"status": "running", "pid": pid, "host": host}))
        assert sweep.read_status(folder)["status"] == expected, name
    assert "its process" in sweep.read_status(tmp_path / "dead")["error"]


def test_run_records_its_pid_and_an_interruption(tmp_path, monkeypatch):
    src = sources.resolve_notebook("ch0_setting")
    seen = {}

    def interrupted(src, out, p, *, run_dir, **kwargs):
        seen.update(json.loads((run_dir / "status.json").read_text()))
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "preflight", lambda runs: [None])
    monkeypatch.setattr(sweep, "run_notebook", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_one(src, {"seed": 1}, tmp_path)
    assert seen == {"status": "running", "pid": os.getpid(), "host": socket.gethostname()}
    assert sweep.read_status(sweep.run_folder(src, {"seed": 1}, tmp_path))["status"] == "interrupted"


def test_a_sweeps_scratch_folder_is_removed_on_ctrl_c(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "mine"))
    with pytest.raises(KeyboardInterrupt):
        with sweep._scratch() as scratch:
            assert os.environ["JUPYTER_RUNTIME_DIR"] == str(scratch / "jupyter")
            assert os.environ["TMPDIR"] == str(scratch / "tmp")
            (scratch / "jupyter" / "kernel-1.json").write_text("{}")
            (scratch / "dask" / "worker-1").mkdir(parents=True)
            raise KeyboardInterrupt
    assert not scratch.exists()
    assert os.environ["JUPYTER_RUNTIME_DIR"] == str(tmp_path / "mine")


def test_the_local_cluster_keeps_its_files_in_the_scratch_folder(monkeypatch):
    import distributed

    seen = {}

    class Stop(Exception):
        pass

    def cluster(**kwargs):
        seen.update(kwargs, runtime=os.environ["JUPYTER_RUNTIME_DIR"])
        raise Stop

    monkeypatch.setattr(distributed, "LocalCluster", cluster)
    with pytest.raises(Stop):
        with sweep._client(sweep.Cluster(workers=1)):
            pass
    scratch = Path(seen["local_directory"]).parent
    assert seen["runtime"] == str(scratch / "jupyter") and not scratch.exists()


def test_a_cell_failed_by_keyboard_interrupt_is_an_interruption(monkeypatch, tmp_path):
    import papermill

    def interrupted(*args, **kwargs):
        raise papermill.PapermillExecutionError(0, 1, "", "KeyboardInterrupt", "", [])

    monkeypatch.setattr(papermill, "execute_notebook", interrupted)
    src = tmp_path / "nb.py"
    src.write_text("# %%\nprint(1)\n")
    with pytest.raises(KeyboardInterrupt):
        build.execute_notebook(src, tmp_path / "nb.ipynb", params.validate())


def test_a_failure_after_ctrl_c_ends_as_an_interruption(monkeypatch, tmp_path, capsys):
    def run_one(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:  # as papermill does: the kernel's cell failed, the notebook failed
            raise build.NotebookFailed("notebook ch0_setting.py failed: KeyboardInterrupt: ") from None

    monkeypatch.setattr(sweep, "run_one", run_one)
    assert cli.main(["run", "ch0_setting", "--out", str(tmp_path)]) == 130
    assert capsys.readouterr().err.strip() == "attn-companion run: interrupted"
