"""Load time of ``gpt2-random``: its weights drawn once (``load_model``) against the ordinary construction.

The baseline is what ``load_model("gpt2-random")`` did before: ``GPT2LMHeadModel._from_config(GPT2Config())`` after
``torch.manual_seed(seed)``, which initialises every module twice (the modules' own ``reset_parameters``, then
GPT-2's ``init_weights`` in ``post_init``), and the weights' sha256. Each timing runs in a fresh process after the
imports (the first touch of 500 MB of memory counts, as in a notebook's kernel), ``--repeat`` times each, one
torch thread; the median wall seconds and the ratio baseline / ours go to benchmarks/results/bench_gpt2_random.json.

    python benchmarks/bench_gpt2_random.py [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import record  # benchmarks/record.py: where results go


SETUP = """
import hashlib, time, torch
torch.set_num_threads(1)
from transformers import GPT2Config, GPT2LMHeadModel
from attn_utils.models.loading import load_model
"""
CASES = {
    "baseline: modules' init, then post_init": SETUP + """
start = time.perf_counter()
with torch.random.fork_rng(devices=[]):
    torch.manual_seed(0)
    model = GPT2LMHeadModel._from_config(GPT2Config(), attn_implementation="eager")
digest = hashlib.sha256()
for key, tensor in sorted(model.state_dict().items()):
    digest.update(key.encode())
    digest.update(tensor.detach().contiguous().numpy())
print(time.perf_counter() - start)
""",
    "load_model('gpt2-random')": SETUP + """
start = time.perf_counter()
load_model("gpt2-random")
print(time.perf_counter() - start)
""",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    seconds = {name: [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                           text=True, env=env, timeout=300).stdout.split()[-1])
                      for _ in range(args.repeat)] for name, code in CASES.items()}
    median = {name: statistics.median(s) for name, s in seconds.items()}
    baseline, ours = median.values()
    result = {"transformers": __import__("transformers").__version__, "repeat": args.repeat,
              "seconds": seconds, "median_s": median, "baseline_over_ours": baseline / ours}
    record.write("bench_gpt2_random.json", result)
    print(json.dumps({"median_s": median, "baseline_over_ours": round(baseline / ours, 2)}, indent=1))


if __name__ == "__main__":
    main()
