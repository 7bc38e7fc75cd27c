"""Conversion time of the embedded GGUF models: transformers' reading of the GGUF as it comes against ours.

The baseline is the conversion with transformers and gguf as they come (``embedded._one_parse_per_gguf`` replaced by
a block that changes nothing): the GGUF header parsed through ``np.memmap`` slices, the config read twice, the
table of tensor names built again for each module. Ours is ``embedded._convert`` as it is. Each conversion runs in a
fresh process into an empty folder, ``--repeat`` times each, one torch thread; the wall seconds, their medians, the
ratio baseline / ours and whether both wrote the same files (the sha256 of every file of the manifests) go to
benchmarks/results/bench_conversion.json.

    python benchmarks/bench_conversion.py [--repeat 1] [--models smollm2-135m gemma3-270m]
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import record  # benchmarks/record.py: where results go


CONVERT = """
import contextlib, json, sys, tempfile, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from attn_utils.models import embedded
if sys.argv[2] == "baseline":
    embedded._one_parse_per_gguf = contextlib.nullcontext
model, folder = embedded.EMBEDDED[sys.argv[1]], Path(sys.argv[3])
start = time.perf_counter()
embedded._convert(model, folder)
seconds = time.perf_counter() - start
files = json.loads((folder / embedded.MANIFEST).read_text())["files"]
print(json.dumps({"seconds": seconds, "files": {name: f["sha256"] for name, f in files.items()}}))
"""
CASES = ("baseline", "ours")


def convert(model: str, case: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-c", CONVERT, model, case, str(Path(tmp) / "model")], check=True,
                              capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"],
                        choices=["smollm2-135m", "gemma3-270m"])
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    models = {}
    for model in args.models:
        runs = {case: [convert(model, case) for _ in range(args.repeat)] for case in CASES}
        seconds = {case: [r["seconds"] for r in rs] for case, rs in runs.items()}
        median = {case: statistics.median(s) for case, s in seconds.items()}
        models[model] = {"seconds": seconds, "median_s": median,
                         "baseline_over_ours": median["baseline"] / median["ours"],
                         "same_files": len({json.dumps(r["files"], sort_keys=True)
                                            for rs in runs.values() for r in rs}) == 1}
    result = {"transformers": __import__("transformers").__version__, "gguf": importlib.metadata.version("gguf"),
              "repeat": args.repeat, "models": models}
    record.write("bench_conversion.json", result)
    print(json.dumps({m: {k: v for k, v in r.items() if k != "seconds"} for m, r in models.items()}, indent=1))


if __name__ == "__main__":
    main()
