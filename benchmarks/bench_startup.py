"""Start-up of the processes that import nbformat: as they come against after ``import attn_utils``.

nbformat imports jsonschema, and jsonschema 4.26 imports ``rfc3987_syntax``, which compiles the IRI grammars at
import (:mod:`attn_utils.startup`). Every notebook kernel of the book (myst-nb's ``glue``), every papermill run, the
Sphinx build and nbgrader import nbformat. Each workload is timed in a fresh interpreter, ``--repeat`` times, the two
cases interleaved: the baseline imports the workload's module alone, ours imports attn_utils first (its own import
time included). The wall seconds, their medians and the ratio baseline / ours go to
benchmarks/results/bench_startup.json.

    python benchmarks/bench_startup.py [--repeat 7] [--workloads NAME ...]
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys

import record  # benchmarks/record.py: where results go


# what each kind of process imports first that reaches nbformat
WORKLOADS = {"nbformat": "import nbformat", "kernel's first glue": "import myst_nb.ext.glue",
             "papermill": "import papermill", "the Sphinx build (myst-nb)": "import myst_nb.sphinx_ext",
             "nbgrader": "import nbgrader.apps"}
CASES = {"baseline": "", "ours": "import attn_utils; "}
TIMED = "import time; start = time.perf_counter(); {code}; print(time.perf_counter() - start)"


def seconds(code: str) -> float:
    done = subprocess.run([sys.executable, "-c", TIMED.format(code=code)], check=True, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    return float(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS), metavar="NAME",
                        help=f"the workloads to time (default all: {', '.join(map(repr, WORKLOADS))})")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    chosen = {name: WORKLOADS[name] for name in args.workloads}
    for code in chosen.values():  # warm the bytecode caches, so no case pays for compiling
        seconds(code)
    workloads = {}
    for name, code in chosen.items():
        runs = {case: [] for case in CASES}
        for _ in range(args.repeat):
            for case, first in CASES.items():
                runs[case].append(seconds(first + code))
        median = {case: statistics.median(s) for case, s in runs.items()}
        workloads[name] = {"code": code, "seconds": runs, "median_s": median,
                           "baseline_over_ours": median["baseline"] / median["ours"]}
    result = {"jsonschema": importlib.metadata.version("jsonschema"),
              "rfc3987-syntax": importlib.metadata.version("rfc3987-syntax"), "repeat": args.repeat,
              "workloads": workloads}
    record.write("bench_startup.json", result)
    print(json.dumps({n: {k: v for k, v in w.items() if k != "seconds"} for n, w in workloads.items()}, indent=1))


if __name__ == "__main__":
    main()
