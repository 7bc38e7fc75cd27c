"""The benchmark commands that the README shows run, at small sizes, and write what they promise.

``make benchmark``: every line of its recipe (read from the Makefile, so a line added there is run here) with the
small sizes of :data:`SMALL` added; and ``bench_model.py --baseline REV`` on ``gpt2-random``. Each writes into a
temporary folder (``$ATTN_COMPANION_BENCH_RESULTS``, ``benchmarks/record.py``): the results of record are left alone.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch

from helpers import ROOT

# what each script of `make benchmark` gets after its line: sizes that take seconds (later options win in argparse)
SMALL = {
    "bench_algorithms.py": ["--subset-only", "--subset-length", "32"],
    "bench_capture.py": ["--L", "32", "--rounds", "1", "--models", "gpt2-random"],
    "bench_gpu.py": ["--L", "64"],
    "bench_models.py": ["--models", "minilm-l6", "--threads", "1", "--windows", "1"],
    "bench_gpt2_random.py": ["--repeat", "1"],
    "bench_conversion.py": ["--repeat", "1", "--models", "smollm2-135m"],
    "bench_startup.py": ["--repeat", "1", "--workloads", "nbformat", "papermill"],
}
# the scripts that `make benchmark` does not run: bench_model.py (the README shows it, with --baseline REV; tested
# below), bench_build.py (cold and edited builds of the whole book, minutes each: run by hand) and bench_suite.py
# (the whole test suite at two revisions, about ten minutes each: run by hand; its comparison is tested below)
OTHERS = {"bench_model.py", "bench_build.py", "bench_suite.py"}


def recipe() -> list[list[str]]:
    """The command lines of the Makefile's ``benchmark`` target, ``$(PY)`` as this interpreter."""
    lines = (ROOT / "Makefile").read_text().split("\nbenchmark:", 1)[1].split("\n")[1:]
    commands = []
    for line in lines:
        if not line.startswith("\t"):
            break
        commands.append([sys.executable if word == "$(PY)" else word for word in shlex.split(line)])
    return commands


def run(argv: list[str], results, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a script (``argv[1]``, relative to the repository) from the results folder: no script may depend on
    the folder it is started from."""
    env = {**os.environ, "ATTN_COMPANION_BENCH_RESULTS": str(results), "OMP_NUM_THREADS": "1"}
    argv = [argv[0], str(ROOT / argv[1]), *argv[2:]]
    done = subprocess.run(argv, cwd=results, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{shlex.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def test_the_recipe_runs_every_benchmark_script_and_each_has_small_sizes():
    scripts = [command[1].removeprefix("benchmarks/") for command in recipe()]
    assert scripts and all(command[0] == sys.executable for command in recipe())
    assert set(scripts) == set(SMALL), "a script of `make benchmark` needs its small sizes in SMALL"
    assert {p.name for p in (ROOT / "benchmarks").glob("bench_*.py")} == set(SMALL) | OTHERS


def check_algorithms(result, stdout):
    assert result["subset"] == {"layers": 1, "heads": 2, "L": 32} and result["subset_only"] and not result["full_grid"]
    for table in ("subset_vectorised", "subset_reference"):
        assert set(result[table]) == {"alg1", "alg2", "alg3", "alg4", "alg5", "total"}
        assert all(positive(t["wall"], t["cpu"]) and t["theory_cpu"] >= 0 for t in result[table].values())
    # the bounds' time is found (THEORY_FUNCTIONS names what the algorithms call) and is part of the CPU time
    vec = result["subset_vectorised"]
    assert 0 < vec["alg1"]["theory_cpu"] <= vec["alg1"]["cpu"] and vec["alg3"]["theory_cpu"] > 0


def check_capture(result, stdout):
    [r] = result["results"]
    assert (r["model"], r["L"], r["heads_captured"], r["rounds"]) == ("gpt2-random", 32, 144, 1)
    assert positive(*r["wall_min_s"].values(), *r["ratio"].values())
    assert "gpt2-random target" in stdout


def check_gpu(result, stdout):
    if torch.cuda.is_available():
        assert result["L"] == 64 and positive(*(t["cpu / gpu"] for t in result["steps"].values()))
    else:
        assert result is None and "skipped, torch sees no CUDA GPU" in stdout


def check_models(result, stdout):
    assert [(m["model"], m["phase"]) for m in result["models"]] == [("minilm-l6", p) for p in ("cold", "warm",
                                                                                               "capture")]
    capture = result["models"][2]
    assert (capture["L"], capture["layers"], capture["heads"]) == (512, 6, 12) and positive(capture["capture_wall_s"])
    rows = result["minilm_lengths"]
    assert sorted({(r["L"], r["layer"]) for r in rows}) == [(L, layer) for L in (64, 128, 256, 512) for layer in
                                                            range(6)]
    assert all(0 < r["entropy_over_logL"] <= 1 and 0 <= r["cls_share"] <= 1 for r in rows)


def check_gpt2_random(result, stdout):
    assert result["repeat"] == 1 and len(result["median_s"]) == 2 and positive(*result["median_s"].values())


def check_conversion(result, stdout):
    [(name, model)] = result["models"].items()
    assert name == "smollm2-135m" and model["same_files"] is True, "ours and transformers' reading differ"
    assert positive(*model["median_s"].values(), model["baseline_over_ours"])


def check_startup(result, stdout):
    assert set(result["workloads"]) == {"nbformat", "papermill"} and result["repeat"] == 1
    assert all(positive(*w["median_s"].values()) for w in result["workloads"].values())


CHECKS = {"bench_algorithms.py": check_algorithms, "bench_capture.py": check_capture, "bench_gpu.py": check_gpu,
          "bench_models.py": check_models, "bench_gpt2_random.py": check_gpt2_random,
          "bench_conversion.py": check_conversion, "bench_startup.py": check_startup}


@pytest.mark.slow
@pytest.mark.parametrize("command", recipe(), ids=lambda command: command[1].removeprefix("benchmarks/"))
def test_each_line_of_make_benchmark_runs_at_small_sizes(command, tmp_path):
    script = command[1].removeprefix("benchmarks/")
    done = run(command + SMALL[script], tmp_path)
    written = list(tmp_path.iterdir())
    assert all(p.name == script.replace(".py", ".json") for p in written)
    assert (ROOT / "benchmarks" / "results") not in [p.parent for p in written]
    result = json.loads(written[0].read_text()) if written else None
    # each result says where it was measured, torch's version too where the script times it in other processes
    assert result is None or (result["measured_on"]["cpus"], result["measured_on"]["torch"]) == (os.cpu_count(),
                                                                                             torch.__version__)
    CHECKS[script](result, done.stdout)


@pytest.mark.slow
def test_bench_model_compares_the_library_of_a_revision_with_the_working_tree(tmp_path):
    """Against HEAD's attn_utils/mathematics (a copy imported as another package: subpackages too), on the first
    layer of gpt2-random at L = 64: the same code gives the same numbers, and every call is timed on all layers."""
    run([sys.executable, "benchmarks/bench_model.py", "--baseline", "HEAD", "--layers", "1", "--threads", "1",
         "--model", "gpt2-random", "--L", "64", "--skip", "alg1-2 32", "alg3 32", "--profile", "alg3 every row"],
        tmp_path)
    report = json.loads((tmp_path / "bench_model.json").read_text())
    assert report["model"] == "gpt2-random" and report["shape"] == [12, 12, 64, 64]
    assert report["measured_on"]["torch"] == torch.__version__
    assert set(report["compared"]) == set(report["full"]) == {"alg1-2 every row", "alg3 every row", "alg4", "alg5"}
    for name, compared in report["compared"].items():
        differences = compared["differences"]
        assert differences and all(v is True if k == "same critical N" else v == 0 for k, v in differences.items())
        assert positive(compared["new"]["cpu"], compared["baseline"]["cpu"]), name
    assert report["profiles"]["alg3 every row"]["new"]["functions"]


def junit(folder, files: dict[str, str]):
    """The JUnit report of pytest run on ``files`` (name -> source) in ``folder``."""
    folder.mkdir()
    for name, source in files.items():
        (folder / name).write_text(source)
    report = folder / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", "."],
                   cwd=folder, capture_output=True, timeout=120)
    return report


def test_bench_suite_compares_the_tests_that_passed_in_both_suites_by_name(tmp_path):
    """On two real pytest reports: a test moved to another module is matched by name, its parameters part of it; a
    test that failed or was skipped in one suite, or that is named as changed, is left out; a name two modules share
    sums their times and passes only if both passed."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    head = "import time, pytest\n"
    old = junit(tmp_path / "old", {
        "test_a.py": head + "def test_moved(): time.sleep(1.0)\ndef test_gone(): pass\ndef test_fails_later(): pass\n"
                            "def test_changed(): pass\n@pytest.mark.parametrize('x', [1, 2])\ndef test_p(x): pass\n",
        "test_b.py": head + "def test_shared(): pass\n"})
    new = junit(tmp_path / "new", {
        "test_c.py": head + "def test_moved(): pass\ndef test_fails_later(): assert False\ndef test_changed(): pass\n"
                            "@pytest.mark.parametrize('x', [1, 3])\ndef test_p(x): pass\ndef test_added(): pass\n"
                            "def test_shared(): pass\n",
        "test_d.py": head + "def test_shared(): pytest.skip('here')\n"})
    baseline, now = bench_suite.cases(old), bench_suite.cases(new)
    assert set(baseline) == {"test_moved", "test_gone", "test_fails_later", "test_changed", "test_p[1]", "test_p[2]",
                             "test_shared"}
    assert now["test_fails_later"]["status"] == "failure" and now["test_shared"]["status"] == "skipped"
    assert baseline["test_moved"]["seconds"] >= 1.0
    # the oracle: each test's time read from the report itself
    times = {c.get("name"): float(c.get("time")) for c in ET.parse(old).iter("testcase")}
    new_times = {c.get("name"): float(c.get("time")) for c in ET.parse(new).iter("testcase")}
    shared = sum(float(c.get("time")) for c in ET.parse(new).iter("testcase") if c.get("name") == "test_shared")
    assert now["test_shared"]["seconds"] == pytest.approx(shared)
    result = bench_suite.compare(baseline, now, {"test_changed"})
    assert result["same_tests"] == 2 and {t for t, _, _ in result["largest"]} == {"test_moved", "test_p[1]"}
    assert result["baseline_s"] == round(times["test_moved"] + times["test_p[1]"], 1)
    ratio = (new_times["test_moved"] + new_times["test_p[1]"]) / (times["test_moved"] + times["test_p[1]"])
    assert result["new_over_baseline"] == round(ratio, 3)
    assert set(result["changed"]) == {"test_changed"}
    assert result["passed_in_one_only"] == {"test_fails_later": ["passed", "failure"], "test_shared": ["passed",
                                                                                                      "skipped"]}
    # test_moved, the one test of a second (it sleeps one at the baseline only)
    assert (result["faster_of_those_over_1s"], result["slower_of_those_over_1s"]) == (1, 0)
    # only in the baseline: test_gone and test_p[2]; only in the new suite: test_added and test_p[3]
    assert result["only_baseline"]["tests"] == 2 and result["only_new"]["tests"] == 2
    assert {t for t, _ in result["only_new"]["largest"]} == {"test_added", "test_p[3]"}
