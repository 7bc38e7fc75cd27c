"""What the execution cache saves: `attn-companion book` on a copy of the project, cold and after five kinds of change.

The project (its committed files and the working tree's changes) is copied into a temporary folder, with an empty
execution cache of its own; the copy's library is the one imported (``PYTHONPATH``), so editing a module of the copy
is a library change. Then, in one run, each scenario builds the book and is timed, with the notebooks it executed
(read from the build's ``executed in`` / ``from cache`` lines):

* ``cold``: an empty cache, every notebook executes;
* ``unchanged``: the same build again;
* ``prose``: a sentence added to the markdown of one chapter (ch3_separability);
* ``library``: a comment added to a library module that every chapter imports (``attn_utils/book/params.py``);
* ``parameter``: a parameter that one chapter declares changed (``ks_alpha``, chapter ch2_distance).

Each ratio is the scenario's time over the cold build's, measured in the same run. ``--small`` builds with the test
suite's small parameters (``model=gpt2-random L=64`` and small synthetic grids); without it, at the defaults.
Writes ``benchmarks/results/bench_build[_small].json``.

    python benchmarks/bench_build.py [--small]
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record  # benchmarks/record.py: where results go

ROOT = Path(__file__).resolve().parents[1]
SMALL = ("model=gpt2-random L=64 lengths=[16,32,64] synthetic_lengths=[4,16,64] Ns=[1,2,4,8] "
         "Ts=[0.01,0.1,1.0,10.0] n_trials=20 n_samples=32")


def copy_project(dest: Path) -> None:
    """The committed files and the working tree's edits of the project (no venv, no build, no runs)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def build(copy: Path, params: str) -> dict:
    """One `attn-companion book` of the copy: wall seconds and which notebooks executed or came from the cache."""
    env = {**os.environ, "PYTHONPATH": str(copy), "ATTN_COMPANION_CACHE": str(copy / "_build" / "cache")}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "attn_utils.cli", "book", "--params", params, "--out",
                           str(copy / "_build" / "html")], cwd=copy, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"the build failed:\n{(done.stdout + done.stderr)[-3000:]}")
    lines = re.findall(r"^\[\d+/\d+\] (\w+(?: on [\w./-]+)?) (executed in [\d.]+ s|from cache .*)$", done.stdout, re.M)
    return {"seconds": round(seconds, 1),
            "executed": [nb for nb, how in lines if how.startswith("executed")],
            "from_cache": [nb for nb, how in lines if how.startswith("from cache")]}


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if old not in text:
        raise RuntimeError(f"{path}: {old!r} not found")
    path.write_text(text.replace(old, new, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="the test suite's small parameters")
    args = parser.parse_args()
    params = SMALL if args.small else ""
    with tempfile.TemporaryDirectory(prefix="bench_build_") as tmp:
        copy = Path(tmp) / "project"
        copy_project(copy)
        runs = {"cold": build(copy, params), "unchanged": build(copy, params)}
        edit(copy / "notebooks" / "ch3_separability.py", "# # ", "# # A prose edit. ")
        runs["prose"] = build(copy, params)
        edit(copy / "attn_utils" / "book" / "params.py", "from __future__ import annotations",
             "from __future__ import annotations  # a library edit")
        runs["library"] = build(copy, params)
        runs["parameter"] = build(copy, f"{params} ks_alpha=0.05".strip())
    cold = runs["cold"]["seconds"]
    for run in runs.values():
        run["ratio_to_cold"] = round(run["seconds"] / cold, 3)
    result = {"parameters": params or "the defaults", "machine": f"{platform.node()} {platform.machine()}, "
              f"{os.cpu_count()} cores", "load_average_1min": os.getloadavg()[0], "python": sys.version.split()[0],
              "runs": runs}
    record.write(f"bench_build{'_small' if args.small else ''}.json", result)
    for name, run in runs.items():
        print(f"{name:10s} {run['seconds']:7.1f} s  ({run['ratio_to_cold']:.2f} of cold)  executed: "
              f"{', '.join(run['executed']) or 'nothing'}")


if __name__ == "__main__":
    main()
