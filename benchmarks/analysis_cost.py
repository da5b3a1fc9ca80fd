"""Cost of the analysis: the single-layer removal sweep against the naive L full forward passes, and peak memory
of layer-by-layer mode against whole-model mode.

    PYTHONPATH=src python benchmarks/analysis_cost.py            # both parts, a few minutes on 2 CPU cores
    PYTHONPATH=src python benchmarks/analysis_cost.py --part sweep

The sweep part times, in one process and on the same batches: (a) the cached sweep (one traced pass, then for
each removed block l only blocks l+1..L and the head), (b) L independent full passes with block l swapped out.
It checks that both give the same losses. The memory part runs `depthlab analyze` on a saved checkpoint in two
fresh processes (whole-model and --layer-by-layer, same options) and reads each one's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def tiny_config(dim: int, n_layers: int, vocab: int, ffn: int):
    from depthlab.config import ModelConfig

    return ModelConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=4, ffn_dim=ffn, max_seq_len=512)


def bench_sweep(dim=256, n_layers=16, vocab=1024, ffn=688, seq=128, batch=4, n_batches=1, reps=5) -> dict:
    from depthlab.analysis.calibration import Batch
    from depthlab.analysis.layers import from_depthlab
    from depthlab.analysis.removal import RemovalSums, naive_single_layer_sweep, single_layer_sweep
    from depthlab.model import Transformer

    torch.manual_seed(0)
    lm = from_depthlab(Transformer(tiny_config(dim, n_layers, vocab, ffn)).eval(), "bench")
    batches = [Batch(torch.randint(0, vocab, (batch, seq)), torch.ones(batch, seq, dtype=torch.bool))
               for _ in range(n_batches)]
    lm.discover(batches[0].ids, batches[0].mask)  # also the warm-up
    t_full, t_cached, t_naive = [], [], []
    with torch.no_grad():
        # The CPUs are shared: measure this process's CPU time (not wall time), interleave the three
        # measurements, and report the median over `reps` of each round's ratios.
        for _ in range(reps):
            t0 = time.process_time()
            for _ in range(n_layers):  # the yardstick: L independent full forward passes
                for b in batches:
                    lm.forward_fn(b.ids, b.mask)
            t_full.append(time.process_time() - t0)
            t0 = time.process_time()
            sums = RemovalSums(n_layers)
            for b in batches:
                single_layer_sweep(lm, b, lm.trace(b.ids, b.mask), sums)
            t_cached.append(time.process_time() - t0)
            t0 = time.process_time()
            naive = naive_single_layer_sweep(lm, batches)
            t_naive.append(time.process_time() - t0)
    cached = [s["loss"] for s in sums.results(n_layers)["single"]]
    err = max(abs(a - b) for a, b in zip(cached, naive))
    return {"model": f"depthlab pre, {n_layers} layers x {dim}, vocab {vocab}, {n_batches}x{batch}x{seq} tokens",
            "rounds": reps, "L_full_passes_cpu_s": statistics.median(t_full),
            "cached_sweep_cpu_s": statistics.median(t_cached), "naive_sweep_cpu_s": statistics.median(t_naive),
            "cached_over_L_full_passes": statistics.median(c / f for c, f in zip(t_cached, t_full)),
            "cached_over_naive": statistics.median(c / n for c, n in zip(t_cached, t_naive)),
            "block_pass_ratio_theory": (n_layers + 1) / (2 * n_layers), "max_loss_difference": err}


CHILD = """import resource, runpy, sys
sys.argv = ["depthlab"] + sys.argv[1:]
if sys.argv[1:] != ["--imports-only"]:
    try:
        runpy.run_module("depthlab", run_name="__main__")
    except SystemExit:
        pass
else:
    import torch, matplotlib.pyplot, depthlab.analysis.analyze, depthlab.analysis.report, depthlab.analysis.layerwise
print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def peak_rss_mb(args: list[str]) -> tuple[float, float]:
    """Run `depthlab ARGS` in a fresh process; (that process's own peak RSS in MB, wall seconds)."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    kb = int(next(line for line in p.stderr.splitlines() if line.startswith("PEAK_KB")).split()[1])
    return kb / 1024, wall


def bench_memory(dim=512, n_layers=16, vocab=4096, ffn=1376, tokens=512) -> dict:
    from depthlab.config import Config
    from depthlab.model import Transformer
    from tests.test_analysis_support import tiny_tokenizer, write_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config()
        cfg.model = tiny_config(dim, n_layers, vocab, ffn)
        cfg.data.seq_len = 128
        model = Transformer(cfg.model)
        n_params = model.num_params()
        ck = write_checkpoint(Path(tmp) / "ck", model, cfg, {"step": 0}, tiny_tokenizer(vocab))
        del model
        base = ["analyze", str(ck), "--tokens", str(tokens), "--no-removal", "--no-jacobian", "--batch-size", "4"]
        out = {"imports_only": {"peak_rss_mb": peak_rss_mb(["--imports-only"])[0]}}
        for name, extra in (("layer_by_layer", ["--layer-by-layer"]), ("whole_model", [])):
            rss, wall = peak_rss_mb(base + extra + ["--out", str(Path(tmp) / name)])
            out[name] = {"peak_rss_mb": rss, "above_imports_mb": rss - out["imports_only"]["peak_rss_mb"],
                         "wall_s": wall}
        out["model"] = f"depthlab pre, {n_layers} layers x {dim}, vocab {vocab}: {n_params / 1e6:.1f}M params, " \
                       f"{n_params * 4 / 2**20:.0f} MiB fp32; {tokens} calibration tokens"
        return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--part", choices=["sweep", "memory", "all"], default="all")
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    res = {"torch_threads": torch.get_num_threads()}
    if args.part in ("sweep", "all"):
        res["sweep"] = bench_sweep()
    if args.part in ("memory", "all"):
        res["memory"] = bench_memory()
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
