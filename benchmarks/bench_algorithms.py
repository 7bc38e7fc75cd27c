"""Benchmark of the paper's Algorithms 1-5 (attn_utils.mathematics.algorithms) on GPT-2 small's shape.

Random causal attention of GPT-2 small's shape (12 layers, 12 heads, L = 1024, head dim 64; seeded
N(0, 1) logits -> causal softmax, stored in float32) runs through the paper's grids. One run reports:

* the full-grid time of each algorithm: wall clock, CPU time of the process, and the CPU time spent
  computing the bounds (the functions of ``attn_utils.mathematics.theory`` and the kernels of the bounds' terms in
  ``attn_utils.mathematics.kernels`` that the algorithms call, :data:`THEORY_FUNCTIONS`);
* the same three numbers for the vectorised code and for the loop reference (``tests/reference.py``,
  plain per-row loops that compute every distance and bound themselves) on one subset (layer 0,
  heads 0-1, L = 256, the grids cut to L), and the reference / vectorised ratios of wall and CPU
  times (with K threads the vectorised code uses up to K cores, the reference mostly one; the
  vectorised subset is timed as the best of 5 repetitions, since it takes a fraction of a second);
* the peak resident memory of the process (``resource.getrusage``).

CPU times are reported because a shared machine inflates wall times. Usage:
``python benchmarks/bench_algorithms.py [--threads K] [--subset-only] [--subset-length L]``. Prints a table and writes
``benchmarks/results/bench_algorithms.json``. Targets: full grid < 2 min on 2 cores, peak < 4 GB,
reference / vectorised >= 100.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

import record  # benchmarks/record.py: where results go

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import reference as ref  # noqa: E402

from attn_utils.mathematics import algorithms, kernels, metrics, theory  # noqa: E402

SHAPE = dict(layers=12, heads=12, L=1024, d=64)
GRIDS = dict(
    alg1=dict(N=5, lengths=(32, 64, 128, 256, 512, 1024)),
    alg2=dict(Ns=(1, 5, 10, 20, 100)),
    alg3=dict(lengths=(32, 64, 128, 256, 512, 1024), Ns=(1, 2, 4, 8, 16, 32, 64), alpha=0.01),
    alg4=dict(Ns=(1, 2, 4, 8, 16, 32, 64, 100)),
    alg5=dict(Ts=tuple(float(t) for t in np.logspace(-3, 2, 12)), epsilons=(1e-3, 1e-1, 10.0)),
)
SUBSET = dict(layers=1, heads=2, L=256)
# the bounds as the algorithms compute them: the theory functions they call and the kernels of the bounds' terms
THEORY_FUNCTIONS = ((theory, ("farthest_keys", "corollary3_bound", "finite_difference_bound")),
                    (kernels, ("main_sum_terms", "main_sum", "max_cross_sq_distance", "theorem2_selected")))


def random_attention(layers, heads, L, d, seed=0):
    """Seeded N(0, 1) logits, their causal softmax (computed in float64 per layer) and N(0, 1) vectors,
    all stored in float32."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    logits = torch.randn(layers, heads, L, L, generator=g, dtype=torch.float32)
    weights = torch.empty_like(logits)
    for layer in range(layers):
        weights[layer] = torch.softmax(logits[layer].double().masked_fill(~mask, -torch.inf), -1)
    return weights, torch.randn(layers, heads, L, d, generator=g, dtype=torch.float32), logits


@contextmanager
def theory_timer(totals: dict):
    """Add the CPU seconds spent inside the bounds that the algorithms compute (:data:`THEORY_FUNCTIONS`) to
    ``totals["theory"]``, counting a call made inside another timed call once."""
    originals = [(module, name, getattr(module, name)) for module, names in THEORY_FUNCTIONS for name in names]
    depth = [0]

    def timed(fn):
        def wrapper(*args, **kwargs):
            depth[0] += 1
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    totals["theory"] += time.process_time() - start
        return wrapper

    for module, name, fn in originals:
        setattr(module, name, timed(fn))
    try:
        yield
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)


def measure(runs: dict, announce: bool = False, repeat: int = 1) -> dict:
    """Per run: wall seconds, CPU seconds of this process, and CPU seconds computing the bounds (:func:`theory_timer`);
    with ``repeat`` > 1, the repetition with the least wall time (the usual defence against noise)."""
    out = {}
    for name, fn in runs.items():
        for _ in range(repeat):
            totals = {"theory": 0.0}
            wall, cpu = time.perf_counter(), time.process_time()
            with theory_timer(totals):
                fn()
            got = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "theory_cpu": totals["theory"]}
            if name not in out or got["wall"] < out[name]["wall"]:
                out[name] = got
        if announce:
            print(f"{name}: {out[name]['wall']:.1f} s", flush=True)
    return out


def cut(L: int) -> dict:
    """The paper's grids cut to L keys: the lengths up to L, the numbers of keys N below L."""
    keep = {"lengths": lambda n: n <= L, "Ns": lambda n: n < L}
    return {alg: {k: tuple(filter(keep[k], v)) if k in keep else v for k, v in grid.items()}
            for alg, grid in GRIDS.items()}


def vectorised_runs(weights, x, logits, L):
    """The five algorithms with the paper's grids cut to L keys (:func:`cut`)."""
    g = cut(L)
    return {
        "alg1": lambda: algorithms.distance_vs_length(weights, x, g["alg1"]["N"], g["alg1"]["lengths"], progress=False),
        "alg2": lambda: algorithms.distance_vs_n(weights, x, g["alg2"]["Ns"], progress=False),
        "alg3": lambda: algorithms.critical_n(
            weights, x, g["alg3"]["lengths"], g["alg3"]["Ns"], g["alg3"]["alpha"], progress=False),
        "alg4": lambda: algorithms.separability_vs_n(weights, x, g["alg4"]["Ns"], progress=False),
        "alg5": lambda: algorithms.gradient_sensitivity(logits, g["alg5"]["Ts"], g["alg5"]["epsilons"], progress=False),
    }


def reference_runs(weights, x, logits, L):
    """The same five computations with the loop reference (row by row)."""
    w, xs, lg = weights.double().numpy(), x.double().numpy(), logits.double()
    g = cut(L)
    layers, heads = w.shape[:2]

    def directions():
        generator = torch.Generator().manual_seed(0)
        return torch.stack([metrics.random_directions(torch.ones(heads, L, L, dtype=torch.bool).tril(), generator)
                            for _ in range(layers)])

    return {
        "alg1": lambda: ref.distance_table(w, xs, [(n, g["alg1"]["N"]) for n in g["alg1"]["lengths"]]),
        "alg2": lambda: ref.distance_table(w, xs, [(L, n) for n in g["alg2"]["Ns"]]),
        "alg3": lambda: ref.critical_n(w, xs, g["alg3"]["lengths"], g["alg3"]["Ns"], g["alg3"]["alpha"]),
        "alg4": lambda: ref.separability_table(w, xs, g["alg4"]["Ns"]),
        "alg5": lambda: ref.gradient_table(lg.numpy(), directions().numpy(), g["alg5"]["Ts"], g["alg5"]["epsilons"]),
    }


def subset_length(text: str) -> int:
    """``--subset-length``: an integer from the shortest length of the grids to the shape's L."""
    low, high = min(GRIDS["alg1"]["lengths"]), SHAPE["L"]
    if not text.isdigit() or not low <= int(text) <= high:
        raise argparse.ArgumentTypeError(f"must be an integer in [{low}, {high}], got {text!r}")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--subset-only", action="store_true",
                        help="skip the full grid and draw only the subset's heads (a quick check)")
    parser.add_argument("--subset-length", type=subset_length, default=SUBSET["L"],
                        help=f"keys of the subset, the grids cut to them (default {SUBSET['L']})")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]

    L, layers, heads = args.subset_length, SUBSET["layers"], SUBSET["heads"]
    weights, x, logits = random_attention(**(dict(SHAPE, layers=layers, heads=heads) if args.subset_only else SHAPE))
    sub = (weights[:layers, :heads, :L, :L], x[:layers, :heads, :L], logits[:layers, :heads, :L, :L])
    measure(vectorised_runs(*sub, L))  # warm-up: first calls pay for lazy initialisation
    subset_vec = measure(vectorised_runs(*sub, L), repeat=5)
    subset_ref = measure(reference_runs(*sub, L))
    full = {} if args.subset_only else measure(vectorised_runs(weights, x, logits, SHAPE["L"]), announce=True)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    load_after = os.getloadavg()[0]

    def total(results):
        return {k: sum(r[k] for r in results.values()) for k in ("wall", "cpu", "theory_cpu")}

    for results in (full, subset_vec, subset_ref):
        if results:
            results["total"] = total(results)
    print(f"\nshape {SHAPE}, torch threads {args.threads}, load average {load_before:.2f} before, "
          f"{load_after:.2f} after; times in s, CPU = CPU time of this process")
    print(f"{'':<8}{'full grid':>26}{'subset: vectorised':>29}{'subset: loop reference':>29}"
          f"{'ratio ref / vec':>18}")
    print(f"{'':<8}" + f"{'wall':>9}{'CPU':>8}{'theory':>9}" * 3 + f"{'wall':>9}{'CPU':>9}")
    blank = {"wall": float("nan"), "cpu": float("nan"), "theory_cpu": float("nan")}
    for name in subset_vec:
        f, v, r = full.get(name, blank), subset_vec[name], subset_ref[name]
        line = "".join(f"{c['wall']:>9.2f}{c['cpu']:>8.2f}{c['theory_cpu']:>9.2f}" for c in (f, v, r))
        print(f"{name:<8}{line}{r['wall'] / v['wall']:>9.0f}{r['cpu'] / v['cpu']:>9.0f}")
    print(f"peak resident memory {peak_gb:.2f} GB")

    result = {
        "shape": SHAPE, "grids": GRIDS, "subset": dict(SUBSET, L=L), "subset_only": args.subset_only,
        "threads": args.threads,
        "load_average": {"before": load_before, "after": load_after},
        "full_grid": full, "subset_vectorised": subset_vec, "subset_reference": subset_ref,
        "peak_rss_gb": peak_gb,
    }
    record.write("bench_algorithms.json", result, indent=2)


if __name__ == "__main__":
    main()
