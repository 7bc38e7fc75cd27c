"""The GPU against the CPU, in one run: capture and Algorithms 1-5 over every query row, on GPT-2 small's shape.

``gpt2-random`` (GPT-2 small's architecture, 12 layers x 12 heads, head dimension 64, seeded random weights; it
loads without the network) reads one 1024-token window of the corpus on each device. Each step is timed on the
GPU (CUDA synchronised) and on the CPU with ``--threads`` torch threads, and the ratio CPU / GPU is reported with
the largest relative difference between the two results (the calls of ``bench_model.calls``: the chapters' grids,
every row). Writes ``benchmarks/results/bench_gpu.json``. Without a CUDA GPU it says so and exits 0.

    python benchmarks/bench_gpu.py [--threads 2] [--L 1024] [--skip alg4]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import calls, differences  # noqa: E402
import record  # noqa: E402  (benchmarks/record.py)


def timed(fn, device: str) -> tuple[object, float]:
    """fn() and its wall time in seconds, the GPU's queue drained before and after."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads on the CPU")
    parser.add_argument("--L", type=int, default=1024, help="window length in tokens")
    parser.add_argument("--skip", nargs="*", default=["alg1-2 32/octave", "alg3 32/octave"],
                        help="calls to leave out (prefix match)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu: skipped, torch sees no CUDA GPU on this machine")
        return

    from attn_utils.book.chapters import distance
    from attn_utils.book.session import Session
    from attn_utils.mathematics import algorithms

    torch.set_num_threads(args.threads)
    report = {"model": "gpt2-random", "L": args.L, "cpu threads": args.threads,
              "gpu": torch.cuda.get_device_name(0), "steps": {}}
    inputs, results = {}, {}
    for device in ("cuda", "cpu"):
        session = Session.open(model="gpt2-random", L=args.L, seed=0, device=device)
        (captured, raw), seconds = timed(lambda: (session.capture(what=("weights", "v")),
                                                  session.capture(what=("logits",), logit_scale="raw")), device)
        report["steps"].setdefault("capture", {})[device] = seconds
        inputs[device] = (captured.weights, captured.v, raw.logits, float(raw.temperature.median()))
    for device in ("cuda", "cpu"):
        steps = calls(algorithms, *inputs[device], distance.critical_grid)
        for name, fn in steps.items():
            if any(name.startswith(s) for s in args.skip):
                continue
            results.setdefault(name, {})[device], seconds = timed(fn, device)
            report["steps"].setdefault(name, {})[device] = seconds
            print(f"{name:18s} {device:4s} {seconds:8.2f} s", flush=True)
    for name, times in report["steps"].items():
        times["cpu / gpu"] = times["cpu"] / times["cuda"]
        if name in results:
            times["differences"] = differences(results[name]["cuda"], results[name]["cpu"])
    for name, times in report["steps"].items():
        print(f"{name:18s} CPU {times['cpu']:8.2f} s, GPU {times['cuda']:7.2f} s, ratio {times['cpu / gpu']:6.1f}")
    record.write("bench_gpu.json", report, indent=2)


if __name__ == "__main__":
    main()
