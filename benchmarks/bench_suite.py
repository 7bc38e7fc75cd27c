"""Whether the test suite got faster: the tests of a baseline revision against the working tree's, on one machine.

Each suite is its revision's own ``make test`` (after its ``make install``, which is not timed), with an empty HOME
and a JUnit report (``PYTEST_ADDOPTS``): the baseline in a clone of REV with the environment of REV (its own lock),
then the working tree with its ``.venv``. A test's time is its setup, call and teardown. Tests are matched by name,
the function and its parameters, not by module: modules were moved and renamed between revisions.

The comparison is over the tests that passed in both runs, less those named by ``--changed`` (tests whose work was
changed on purpose, such as a book build over more models): their summed time at each revision and the ratio
working tree / baseline. Beside it: each suite's wall time and counts, and what the tests that only one suite has
cost. Writes benchmarks/results/bench_suite.json. Minutes per suite: run by hand, not by ``make benchmark``.

    python benchmarks/bench_suite.py --baseline REV [--clone DIR] [--changed NAME ...]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import record  # benchmarks/record.py: where results go

ROOT = Path(__file__).resolve().parents[1]
TOP = 20  # the largest tests listed in each group


def cases(report: Path) -> dict[str, dict]:
    """name -> {"seconds", "status"} of a JUnit report (pytest's ``--junitxml``): a name that several modules
    share sums their times, and is "passed" only if each of them passed."""
    out: dict[str, dict] = {}
    for case in ET.parse(report).iter("testcase"):
        status = next((child.tag for child in case if child.tag in ("skipped", "failure", "error")), "passed")
        seen = out.setdefault(case.get("name"), {"seconds": 0.0, "status": "passed"})
        seen["seconds"] += float(case.get("time", 0))
        if status != "passed":
            seen["status"] = status
    return out


def only(suite: dict[str, dict], other: dict[str, dict]) -> dict:
    """The tests of ``suite`` that ``other`` has not: how many, their summed seconds and the largest."""
    seconds = {name: suite[name]["seconds"] for name in suite.keys() - other.keys()}
    return {"tests": len(seconds), "s": round(sum(seconds.values()), 1),
            "largest": [[name, round(s, 2)] for name, s in sorted(seconds.items(), key=lambda t: -t[1])[:TOP]]}


def compare(baseline: dict[str, dict], new: dict[str, dict], changed: set[str]) -> dict:
    """The tests that passed in both suites, less ``changed``: their times, summed and test by test; and the tests
    that one suite only has, or that one of them did not pass."""
    passed = {name for name in baseline.keys() & new.keys()
              if baseline[name]["status"] == new[name]["status"] == "passed"}
    same = passed - changed
    b, n = (sum(s[name]["seconds"] for name in same) for s in (baseline, new))
    long = {t for t in same if baseline[t]["seconds"] >= 1}
    return {"same_tests": len(same), "baseline_s": round(b, 1), "new_s": round(n, 1),
            "new_over_baseline": round(n / b, 3) if b else None,
            # among the tests of at least a second at the baseline (shorter ones move by scheduling and fixtures)
            "faster_of_those_over_1s": sum(new[t]["seconds"] < baseline[t]["seconds"] for t in long),
            "slower_of_those_over_1s": sum(new[t]["seconds"] > baseline[t]["seconds"] for t in long),
            "largest": [[t, round(baseline[t]["seconds"], 2), round(new[t]["seconds"], 2)]
                        for t in sorted(same, key=lambda t: -baseline[t]["seconds"])[:TOP]],
            "changed": {t: [baseline[t]["seconds"], new[t]["seconds"]] for t in sorted(changed & passed)},
            "passed_in_one_only": {t: [baseline[t]["status"], new[t]["status"]]
                                   for t in sorted((baseline.keys() & new.keys()) - passed)
                                   if "passed" in (baseline[t]["status"], new[t]["status"])},
            "only_baseline": only(baseline, new), "only_new": only(new, baseline)}


def run_suite(folder: Path, report: Path) -> dict:
    """``make install``, then ``make test`` of ``folder`` (its Makefile says how its suite runs), timed, with a
    JUnit report."""
    with tempfile.TemporaryDirectory(prefix="bench_suite_home_") as home:
        env = {**os.environ, "HOME": home, "PYTEST_ADDOPTS": f"--junitxml={report}"}
        env.pop("ATTN_COMPANION_TEST_ROOT", None)
        subprocess.run(["make", "-s", "install"], cwd=folder, env=env, check=True)
        start = time.perf_counter()
        done = subprocess.run(["make", "-s", "test"], cwd=folder, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    print(f"{folder}: {summary}", flush=True)
    return {"wall_s": round(wall, 1), "returncode": done.returncode, "summary": summary}


def checkout(rev: str, clone: Path) -> str:
    """``clone`` at ``rev`` (made by ``git clone`` of this repository if missing); the full commit id."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    if not clone.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
    return commit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the revision to compare with (a commit, tag or branch)")
    parser.add_argument("--clone", type=Path, help="where the baseline is checked out and installed (kept, so a "
                                                   "second run reuses its environment); a temporary folder without it")
    parser.add_argument("--changed", nargs="*", default=[], help="tests left out of the comparison, by name")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_suite_") as tmp:
        clone = args.clone or Path(tmp) / "baseline"
        commit = checkout(args.baseline, clone)
        runs = {"baseline": run_suite(clone, Path(tmp) / "baseline.xml"),
                "working tree": run_suite(ROOT, Path(tmp) / "new.xml")}
        baseline, new = cases(Path(tmp) / "baseline.xml"), cases(Path(tmp) / "new.xml")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    result = {"baseline": commit, "working_tree_head": head, "runs": runs,
              "comparison": compare(baseline, new, set(args.changed))}
    record.write("bench_suite.json", result)
    c = result["comparison"]
    print(f"{c['same_tests']} tests in both: {c['baseline_s']} s at {commit[:7]}, {c['new_s']} s now "
          f"(x{c['new_over_baseline']}); suites {runs['baseline']['wall_s']} s and {runs['working tree']['wall_s']} s")


if __name__ == "__main__":
    main()
