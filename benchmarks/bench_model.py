"""The paper's Algorithms 1-5 on a captured model at the book's defaults, against a baseline version of the library.

One window of the corpus goes through the model once (``Session.open``: the book's default model, L = 1024, or
``--model`` and ``--L``, checked by the session as the chapters' parameters are); its
attention weights, value vectors and raw logits then go through the chapters' calls of
``attn_utils.mathematics.algorithms``:

* ch2: Algorithms 1-2 (N = 5 over the lengths 32..L, and Ns 1, 5, 10, 20, 100 at L) and Algorithm 3 (the KS scan
  with ``distance.critical_grid``), every query row and 32 rows per octave;
* ch3: Algorithm 4 (Ns 1, 2, 4, ..., 100); ch4: Algorithm 5 (the chapter's temperatures and epsilons, raw logits).

With ``--baseline REV`` the same calls run on the library of git revision REV (its ``attn_utils/mathematics``,
imported as a separate package) on the first ``--layers`` layers, alternately with the working tree's, in this
process: the ratios of CPU times are what a shared machine measures best. The results also check that both give
the same numbers (largest relative difference per column, and the critical N per length). Every run of the working
tree's code is also timed on all layers, with one torch thread and with ``--threads``. ``--profile NAME ...``
profiles those calls with cProfile on the compared layers, baseline and working tree (one thread each): the
functions that take the most time, by their own time. Prints a table and writes
``benchmarks/results/bench_model.json``.

    python benchmarks/bench_model.py [--baseline HEAD] [--layers 2] [--threads 2] [--model auto] [--L 1024] \
        [--skip alg4 alg5] [--profile "alg3 every row"]
"""
from __future__ import annotations

import argparse
import cProfile
import importlib
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import record  # benchmarks/record.py: where results go

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = [32, 64, 128, 256, 512, 1024]
TS = [1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0]
EPSILONS = [1e-3, 1e-1, 10.0]


def baseline_package(rev: str) -> str:
    """Import ``attn_utils/mathematics`` of git revision ``rev`` as the package ``baseline_mathematics``."""
    folder = Path(tempfile.mkdtemp(prefix="bench_model_"))
    package = folder / "baseline_mathematics"
    package.mkdir()
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", f"{rev}:attn_utils/mathematics"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    for name in (n for n in names if n.endswith(".py")):  # subpackages too (theory/)
        text = subprocess.run(["git", "show", f"{rev}:attn_utils/mathematics/{name}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(re.sub(r"attn_utils\.mathematics", "baseline_mathematics", text))
    sys.path.insert(0, str(folder))
    return "baseline_mathematics"


def calls(algorithms, weights, x, logits, T_model: float, critical_grid) -> dict:
    """The chapters' calls, by name, with the lengths cut to the window's L keys and the numbers of keys N below
    it."""
    Ts = sorted({*TS, T_model})
    L = weights.shape[-1]
    lengths = [n for n in LENGTHS if n <= L]
    Ns2, Ns4 = ([n for n in grid if n < L] for grid in ([1, 5, 10, 20, 100], [1, 2, 4, 8, 16, 32, 64, 100]))
    options = dict(reading="sum_of_norms", progress=False)
    return {
        "alg1-2 every row": lambda: (algorithms.distance_vs_length(weights, x, N=5, lengths=lengths, **options),
                                     algorithms.distance_vs_n(weights, x, Ns=Ns2, **options)),
        "alg1-2 32/octave": lambda: (
            algorithms.distance_vs_length(weights, x, N=5, lengths=lengths, rows_per_octave=32, **options),
            algorithms.distance_vs_n(weights, x, Ns=Ns2, rows_per_octave=32, **options)),
        "alg3 every row": lambda: algorithms.critical_n(weights, x, lengths, critical_grid, alpha=0.01, **options),
        "alg3 32/octave": lambda: algorithms.critical_n(weights, x, lengths, critical_grid, alpha=0.01,
                                                        rows_per_octave=32, **options),
        "alg4": lambda: algorithms.separability_vs_n(weights, x, Ns=Ns4, progress=False),
        "alg5": lambda: algorithms.gradient_sensitivity(logits, Ts, epsilons=EPSILONS, seed=0, progress=False),
    }


def timed(fn, threads: int):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        return result, {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "threads": threads}
    finally:
        torch.set_num_threads(previous)


def profile(fn, top: int = 12) -> dict:
    """cProfile of fn() on one torch thread: its total seconds and the ``top`` functions by own time."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    profiler = cProfile.Profile()
    try:
        profiler.runcall(fn)
    finally:
        torch.set_num_threads(previous)
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]
    return {"seconds": stats.total_tt, "functions": [
        {"function": f"{Path(file).name}:{line}({name})" if line else name, "calls": count, "own s": own,
         "cumulative s": cumulative} for (file, line, name), (_, count, own, cumulative, _) in rows]}


def frames(result) -> list:
    """The DataFrames of an algorithm's result."""
    if isinstance(result, tuple) and not hasattr(result, "_fields"):
        return [f for r in result for f in frames(r)]
    return [result.tests, result.summary] if hasattr(result, "tests") else [result.heads] if hasattr(result, "heads") \
        else [result]


def differences(new, old) -> dict:
    """Largest relative difference per numeric column (rows matched on the key columns), and equal critical N."""
    out = {}
    for a, b in zip(frames(new), frames(old)):
        keys = [c for c in ("L", "N", "T", "eps", "layer", "head") if c in a.columns]
        a, b = a.sort_values(keys, ignore_index=True), b.sort_values(keys, ignore_index=True)
        for column in a.columns:
            if column in keys or a[column].dtype == bool:
                continue
            x, y = a[column].to_numpy(float), b[column].to_numpy(float)
            rel = np.abs(x - y) / np.maximum(np.abs(y), 1e-300)
            out[column] = max(out.get(column, 0.0), float(np.nanmax(rel)) if np.isfinite(rel).any() else 0.0)
        if "critical_n" in a.columns:
            out["same critical N"] = bool((a["critical_n"].to_numpy() == b["critical_n"].to_numpy()).all())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="git revision whose attn_utils/mathematics is the baseline")
    parser.add_argument("--layers", type=int, default=2, help="layers of the baseline comparison")
    parser.add_argument("--model", default="auto", help="the model, as the chapters' model parameter (default auto)")
    parser.add_argument("--L", type=int, default=1024, help="window length in tokens (default 1024)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads of the full run")
    parser.add_argument("--skip", nargs="*", default=[], help="calls to leave out (prefix match: alg1, alg3, ...)")
    parser.add_argument("--profile", nargs="*", default=[], help="calls to profile on the compared layers")
    args = parser.parse_args()

    from attn_utils.book.chapters import distance
    from attn_utils.book.session import Session
    from attn_utils.mathematics import algorithms

    load = {"before": os.getloadavg()}
    session = Session.open(model=args.model, corpus="war-and-peace", chapters=None, offset=0, L=args.L, seed=0)
    captured = session.capture(what=("weights", "v"))
    weights, x = captured.weights, session.vectors(captured, "value")
    raw = session.capture(what=("logits",), logit_scale="raw")
    logits, T_model = raw.logits, float(raw.temperature.median())
    keep = lambda name: not any(name.startswith(s) for s in args.skip)  # noqa: E731

    report = {"model": session.name, "shape": list(weights.shape), "baseline": args.baseline, "compared": {},
              "full": {}}
    if args.baseline:
        old = importlib.import_module(baseline_package(args.baseline) + ".algorithms")
        n = args.layers
        sub = (weights[:n], x[:n], logits[:n])
        new_calls = calls(algorithms, *sub, T_model, distance.critical_grid)
        old_calls = calls(old, *sub, T_model, distance.critical_grid)
        for name in filter(keep, new_calls):
            new_result, new_time = timed(new_calls[name], 1)
            old_result, old_time = timed(old_calls[name], 1)
            report["compared"][name] = {"layers": n, "new": new_time, "baseline": old_time,
                                        "cpu ratio": old_time["cpu"] / new_time["cpu"],
                                        "differences": differences(new_result, old_result)}
            print(f"{name:18s} {n} layers, 1 thread: baseline {old_time['cpu']:7.1f} s CPU, new "
                  f"{new_time['cpu']:6.1f} s CPU, ratio {old_time['cpu'] / new_time['cpu']:5.2f}", flush=True)
        for name in args.profile:
            report.setdefault("profiles", {})[name] = {"layers": n, "baseline": profile(old_calls[name]),
                                                       "new": profile(new_calls[name])}
            for side in ("baseline", "new"):
                prof = report["profiles"][name][side]
                print(f"profile of {name}, {side}: {prof['seconds']:.1f} s", flush=True)
                for row in prof["functions"][:8]:
                    print(f"  {row['own s']:7.2f} s own {row['cumulative s']:7.2f} s cum {row['calls']:8d}  "
                          f"{row['function']}", flush=True)
    full = calls(algorithms, weights, x, logits, T_model, distance.critical_grid)
    for name in filter(keep, full):
        for threads in sorted({1, args.threads}):
            result, t = timed(full[name], threads)
            report["full"].setdefault(name, []).append(t)
            print(f"{name:18s} all {weights.shape[0]} layers, {threads} thread(s): {t['wall']:6.1f} s wall, "
                  f"{t['cpu']:6.1f} s CPU", flush=True)
            if name.startswith("alg3"):
                report["full"][name][-1]["critical_n"] = result.summary["critical_n"].tolist()
    load["after"] = os.getloadavg()
    report["load_average"] = load
    record.write("bench_model.json", report, indent=2)


if __name__ == "__main__":
    main()
