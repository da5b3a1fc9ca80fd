"""Training-step throughput of depthlab against transformers.LlamaForCausalLM, side by side in one run.

Both models have identical dimensions and identical weights (the HF twin is built by the exporter's own weight
mapping, and the first loss of both is checked equal), see the same batches, and run the same step: forward
under the same autocast, the same cross-entropy, backward, gradient clipping, and the trainer's AdamW. What
differs is only the model code. With --compile (the default) each model also runs with its blocks compiled
(`torch.compile` per block, as torchtitan does: one compilation serves every identical block). Figures:
tokens/s of each, their paired ratio (depthlab / HF, median over interleaved repetitions), and MFU: train_flops_per_token (depthlab.train.flops) against the matmul peak, measured
inside every repetition (1024^3 matmuls, the same probe as depthlab.train.flops.measured_matmul_peak) so that
both see the same load, median over repetitions.

    python -m benchmarks.train_speed                      # both cases, fp32 and bf16, 1 thread
    python -m benchmarks.train_speed --case deep-thin --dtype fp32 --reps 3 --profile
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from dataclasses import asdict

import torch

from benchmarks.common import (environment, hf_twin, interleaved, make_train_step, matmul_probe, paired_ratio,
                               write_result)
from depthlab.config import ModelConfig
from depthlab.model import Transformer, lm_loss
from depthlab.train.flops import train_flops_per_token
from depthlab.train.trainer import autocast

# Model dimensions and a batch small enough that one CPU step takes about a second.
CASES = {
    "llama-71m": (dict(vocab_size=32000, dim=512, n_layers=12, n_heads=8, ffn_dim=1368), 4, 64),
    "deep-thin": (dict(vocab_size=4096, dim=128, n_layers=32, n_heads=4, ffn_dim=344), 8, 128),
}


def first_losses(ours, hf, x, y, dtype: str) -> tuple[float, float]:
    with torch.no_grad(), autocast(torch.device("cpu"), dtype):
        return lm_loss(ours(x), y).item(), lm_loss(hf(x, use_cache=False).logits, y).item()


def profile(steps: dict, top: int = 12) -> dict[str, str]:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    tables = {}
    for name, step in steps.items():
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        tables[name] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
    return tables


def bench_case(case: str, dtype: str, reps: int, steps: int, do_profile: bool, compile_blocks: bool) -> dict:
    dims, batch, seq = CASES[case]
    cfg = ModelConfig(**dims, max_seq_len=seq, norm_scheme="pre")
    torch.manual_seed(0)
    ours = Transformer(cfg).train()
    hf = hf_twin(ours).train()
    x = torch.randint(0, cfg.vocab_size, (batch, seq))
    y = torch.roll(x, -1, dims=1)
    loss_ours, loss_hf = first_losses(ours, hf, x, y, dtype)
    contenders = {"depthlab": make_train_step(ours, x, y, dtype, hf=False), "hf": make_train_step(hf, x, y, dtype, hf=True)}
    if compile_blocks:
        ours_c, hf_c = copy.deepcopy(ours), copy.deepcopy(hf)
        for layer in [*ours_c.layers, *hf_c.model.layers]:
            layer.compile()
        contenders["depthlab+compile"] = make_train_step(ours_c, x, y, dtype, hf=False)
        contenders["hf+compile"] = make_train_step(hf_c, x, y, dtype, hf=True)
    probe, probe_flops = matmul_probe(dtype)
    times = interleaved({**contenders, "matmul_peak": probe}, reps, steps)
    peaks = [probe_flops / t for t in times.pop("matmul_peak")]  # one per repetition, under that repetition's load
    tokens = batch * seq
    flops = train_flops_per_token(cfg, seq) * tokens
    med = {n: statistics.median(t) for n, t in times.items()}
    result = {
        "case": case, "dtype": dtype, "model": asdict(cfg), "batch": batch, "seq_len": seq, "tokens_per_step": tokens,
        "params": ours.num_params(), "first_loss": {"depthlab": loss_ours, "hf": loss_hf},
        "step_s": times, "tokens_per_s": {n: tokens / t for n, t in med.items()},
        "mfu": {n: statistics.median(flops / t / p for t, p in zip(ts, peaks)) for n, ts in times.items()},
        "speedup_depthlab_over_hf": paired_ratio(times["hf"], times["depthlab"]),
        **({"speedup_compiled_depthlab_over_hf": paired_ratio(times["hf"], times["depthlab+compile"]),
            "speedup_compiled_depthlab_over_compiled_hf": paired_ratio(times["hf+compile"], times["depthlab+compile"])}
           if compile_blocks else {}),
        "matmul_peak_flops": peaks, "train_flops_per_step": flops,
    }
    if do_profile:
        result["profile"] = profile(contenders)
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions")
    p.add_argument("--steps", type=int, default=2, help="timed steps per repetition and contender")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: PyTorch's default)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="eager only")
    p.add_argument("--profile", action="store_true", help="also profile one step of each (torch.profiler)")
    p.add_argument("--out", help="result file (default benchmarks/results/train_speed.json)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    runs = []
    for case in args.case:
        for dtype in args.dtype:
            r = bench_case(case, dtype, args.reps, args.steps, args.profile, args.compile)
            runs.append(r)
            s = r["speedup_depthlab_over_hf"]
            print(f"{case:10s} {dtype}: depthlab {r['tokens_per_s']['depthlab']:8.0f} tok/s (MFU "
                  f"{r['mfu']['depthlab']:.1%}), HF {r['tokens_per_s']['hf']:8.0f} tok/s (MFU {r['mfu']['hf']:.1%}); "
                  f"depthlab/HF {s['median']:.3f}x [{s['min']:.3f}, {s['max']:.3f}]; first loss "
                  f"{r['first_loss']['depthlab']:.5f} vs {r['first_loss']['hf']:.5f}", flush=True)
            if args.compile:
                c, ch = r["speedup_compiled_depthlab_over_hf"], r["speedup_compiled_depthlab_over_compiled_hf"]
                print(f"{'':10s}   compiled blocks: depthlab {r['tokens_per_s']['depthlab+compile']:8.0f} tok/s, HF "
                      f"{r['tokens_per_s']['hf+compile']:8.0f} tok/s; depthlab+compile / HF eager {c['median']:.3f}x, "
                      f"/ HF+compile {ch['median']:.3f}x", flush=True)
            for name, table in r.get("profile", {}).items():
                print(f"--- profile: {name}, {case}, {dtype}\n{table}")
    wall = time.time() - t0
    path = write_result("train_speed", {"benchmark": "train_speed", "argv": sys.argv[1:] if argv is None else argv, "env": environment(),
                                        "wall_s": wall, "runs": runs}, args.out)
    print(f"wrote {path} ({wall:.0f} s wall)")


if __name__ == "__main__":
    main()
