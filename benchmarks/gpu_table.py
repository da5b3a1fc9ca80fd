"""Throughput, MFU and peak memory of a training step on one GPU: depthlab against transformers.LlamaForCausalLM at
the paper's 71M and 130M dims, eager and with compiled blocks.

Each row: one model (same dims and weights: benchmarks/common.py's HF twin), the paper's micro-batch (64 x 256
tokens), bf16 autocast, the step of benchmarks/common.py (depthlab as `depthlab train` runs it: its chunked loss
and fused AdamW; HF as the reference code trains it: logits, fp32 cross-entropy, a plain AdamW), `+compile` with
every block torch.compile'd (as torchtitan does). Timed over --steps steps after --warmup (compilation included
in the warm-up); MFU = train_flops_per_token x tokens/s over the device's bf16 peak (depthlab.train.flops);
peak memory = torch.cuda.max_memory_allocated during the timed steps, and the same less the memory allocated
before them (weights, AdamW moments). `benchmarks/gpu_71m.py` runs it after its pre-vs-lns comparison on a GPU.
It has not yet been run on a GPU; tests/test_benchmarks.py runs it on CPU at tiny sizes.

    python -m benchmarks.gpu_table --out benchmarks/results/gpu_table.json
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import torch

from benchmarks.common import environment, hf_twin, make_train_step, write_result
from benchmarks.memory import CASES, model_config  # the same cases (and their hook for toy dims)
from depthlab.model import Transformer
from depthlab.train.flops import peak_flops, train_flops_per_token

CONTENDERS = ("depthlab", "hf", "depthlab+compile", "hf+compile")


def bench(case: str, name: str, dtype: str, batch: int, seq: int, steps: int, warmup: int, device: str) -> dict:
    dev = torch.device(device)
    cfg = model_config(case)
    torch.manual_seed(0)
    model = Transformer(cfg)
    hf = name.startswith("hf")
    model = (hf_twin(model) if hf else model).to(dev).train()
    if name.endswith("+compile"):
        for layer in model.model.layers if hf else model.layers:
            layer.compile()
    x = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1)).to(dev)
    step = make_train_step(model, x, torch.roll(x, -1, dims=1), dtype, hf=hf, fused_adamw=not hf)
    for _ in range(warmup):
        step()
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss.item()  # waits for the device
    elapsed = time.perf_counter() - t0
    tokens_per_s = batch * seq * steps / elapsed
    peak = torch.cuda.max_memory_allocated() if cuda else None
    return {"case": case, "contender": name, "dtype": dtype, "batch": batch, "seq_len": seq, "steps": steps,
            "step_s": elapsed / steps, "tokens_per_s": tokens_per_s,
            "mfu": train_flops_per_token(cfg, seq) * tokens_per_s / peak_flops(dev, dtype),
            "peak_bytes": peak, "step_bytes": None if peak is None else peak - before, "loss": loss.item()}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS))
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", help="result file (default benchmarks/results/gpu_table.json)")
    args = p.parse_args(argv)
    t0, rows = time.time(), []
    for case in args.case:
        for name in args.contenders:
            rows.append(bench(case, name, args.dtype, args.batch, args.seq, args.steps, args.warmup, args.device))
            r = rows[-1]
            mem = f", peak {r['peak_bytes'] / 2**30:.2f} GiB" if r["peak_bytes"] is not None else ""
            print(f"{case} {name:17s} {r['tokens_per_s']:>12,.0f} tok/s  MFU {r['mfu']:.1%}{mem}", flush=True)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    result = {"benchmark": "gpu_table", "argv": sys.argv[1:] if argv is None else argv, "env": environment(),
              "device": args.device, "rows": rows, "wall_s": time.time() - t0}
    path = write_result("gpu_table", result, args.out)
    print(f"wrote {path} ({result['wall_s']:.0f} s wall)")
    return result

