"""Cost of attention capture against a plain eager forward pass with ``output_attentions=True``.

For each model, one window of L tokens is run alternately through every mode (side by side, a few rounds after
a warm-up). The capture streams every layer and head (q, k, v, logits, weights, mask, cast to float64) to a
callback that reduces and discards them. It stops after the last layer and so skips the LM head; the eager pass of
the base model (no LM head) is timed as well, for a stricter comparison. Ratios use the fastest round of each
mode (the one least disturbed by other processes) and, as a check, the median CPU time. Peak resident memory is
measured per mode (Linux: VmHWM, reset through /proc/self/clear_refs). Results go to
benchmarks/results/bench_capture.json.

    python benchmarks/bench_capture.py [--L 1024] [--rounds 3] [--models gpt2-random smollm2-135m]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from attn_utils.models.capture import capture
from attn_utils.models.corpus import load_text, token_windows
from attn_utils.models.loading import load_model

import record  # benchmarks/record.py: where results go

MAX_RATIO = 1.3
MAX_PEAK_GB = 3.0


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_gb() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def _window(tokenizer, L: int) -> tuple[torch.Tensor, str]:
    """The first window of L tokens of the shipped War and Peace."""
    return token_windows(load_text(), tokenizer, L)[0], "War and Peace, offset 0"


def _eager(model, ids):
    with torch.inference_mode():
        out = model(input_ids=ids[None], output_attentions=True, use_cache=False)
    return len(out.attentions)


def _capture(model, ids, dtype=torch.float64):
    sums = []
    capture(model, ids, lambda c: sums.append(c.weights.sum().item()), dtype=dtype)
    return len(sums)


def _timed(fn) -> tuple[float, float, float | None]:
    """Wall seconds, CPU seconds and peak resident GB of one call."""
    measured = _reset_peak()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0, _peak_gb() if measured else None


def bench(name: str, L: int, rounds: int) -> dict:
    model, tokenizer, prov = load_model(name)
    ids, source = _window(tokenizer, L)
    modes = {"eager_output_attentions": lambda: _eager(model, ids),
             "eager_base_model_output_attentions": lambda: _eager(model.base_model, ids),  # no LM head
             "capture_float64": lambda: _capture(model, ids),
             "capture_native_dtype": lambda: _capture(model, ids, dtype=None)}
    for run in modes.values():  # warm-up
        run()
    wall, cpu, peaks = ({mode: [] for mode in modes} for _ in range(3))
    for _ in range(rounds):
        for mode, run in modes.items():
            for table, value in zip((wall, cpu, peaks), _timed(run)):
                table[mode].append(value)
    best = {mode: min(t) for mode, t in wall.items()}
    cpu_median = {mode: statistics.median(t) for mode, t in cpu.items()}
    ratio = {f"{kind}_{mode}{vs}": table[mode] / table[base]
             for kind, table in (("wall_min", best), ("cpu_median", cpu_median)) for mode in modes if "capture" in mode
             for vs, base in (("", "eager_output_attentions"), ("_vs_base", "eager_base_model_output_attentions"))}
    a = prov.architecture
    return {"model": name, "L": L, "input": source, "heads_captured": a["n_layers"] * a["n_heads"],
            "threads": torch.get_num_threads(), "rounds": rounds, "wall_s": wall, "cpu_s": cpu,
            "wall_min_s": best, "cpu_median_s": cpu_median, "ratio": ratio,
            "peak_rss_gb": {mode: max(p) if None not in p else None for mode, p in peaks.items()},
            "provenance": prov.to_dict()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--L", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["gpt2-random", "smollm2-135m"])
    args = parser.parse_args()
    results = [bench(name, args.L, args.rounds) for name in args.models]
    for r in results:
        m, ratio = r["wall_min_s"], r["ratio"]
        print(f"{r['model']} L={r['L']} ({r['heads_captured']} heads), fastest of {r['rounds']}: "
              f"eager {m['eager_output_attentions']:.2f} s; capture float64 {m['capture_float64']:.2f} s "
              f"(x{ratio['wall_min_capture_float64']:.2f}, CPU x{ratio['cpu_median_capture_float64']:.2f}); "
              f"capture native {m['capture_native_dtype']:.2f} s (x{ratio['wall_min_capture_native_dtype']:.2f}, "
              f"CPU x{ratio['cpu_median_capture_native_dtype']:.2f})")
        print(f"  against the base model without LM head ({m['eager_base_model_output_attentions']:.2f} s): "
              f"capture float64 x{ratio['wall_min_capture_float64_vs_base']:.2f} "
              f"(CPU x{ratio['cpu_median_capture_float64_vs_base']:.2f})")
        print("  peak RSS GB: " + ", ".join(f"{k} {v:.2f}" for k, v in r["peak_rss_gb"].items() if v is not None))
    record.write("bench_capture.json", {"max_ratio": MAX_RATIO, "max_peak_gb": MAX_PEAK_GB, "results": results},
                 indent=2)
    gpt2 = [r for r in results if r["model"] == "gpt2-random"]
    for r in gpt2:
        peak = r["peak_rss_gb"]["capture_float64"]
        verdict = r["ratio"]["wall_min_capture_float64"] <= MAX_RATIO and (peak is None or peak < MAX_PEAK_GB)
        print(f"gpt2-random target (ratio <= {MAX_RATIO}, peak < {MAX_PEAK_GB} GB): {'met' if verdict else 'MISSED'}")


if __name__ == "__main__":
    main()
