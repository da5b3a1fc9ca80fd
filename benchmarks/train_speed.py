"""Training-step throughput of depthlab against transformers.LlamaForCausalLM, side by side in one run.

Both models have identical dimensions and identical weights (the HF twin is built by the exporter's own weight
mapping, and the first loss of both is checked equal), see the same batches, and run the same step: forward
under the same autocast, the same cross-entropy, backward, gradient clipping, and AdamW with the trainer's
parameter groups. `depthlab` is timed as `depthlab train` runs (PyTorch's fused AdamW), `hf` as the reference code
trains (a plain torch.optim.AdamW, on CPU a per-tensor loop); `depthlab+default_adamw` and `hf+fused_adamw` swap
the optimizers, separating what the model code and the optimizer each contribute; with --compile both are also
timed with their blocks compiled (`torch.compile` per block, as torchtitan does: one compilation serves every
identical block). Figures: tokens/s of each, its paired speed-up over HF with the default AdamW (median over
interleaved repetitions), and MFU: train_flops_per_token (depthlab.train.flops) against the matmul peak, measured
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

from benchmarks.common import (
    environment,
    hf_twin,
    interleaved,
    make_train_step,
    matmul_probe,
    paired_ratio,
    write_result,
)
from depthlab.config import Config, ModelConfig
from depthlab.device import autocast
from depthlab.model import Transformer, lm_loss
from depthlab.study.page.systems import speed_section
from depthlab.train.flops import train_flops_per_token
from depthlab.train.optim import make_optimizer

# Model dimensions and a batch small enough that one CPU step takes about a second.
CASES = {
    "llama-71m": (dict(vocab_size=32000, dim=512, n_layers=12, n_heads=8, ffn_dim=1368), 4, 64),
    "deep-thin": (dict(vocab_size=4096, dim=128, n_layers=32, n_heads=4, ffn_dim=344), 8, 128),
}


def first_losses(ours, hf, x, y, dtype: str) -> tuple[float, float]:
    with torch.no_grad(), autocast(torch.device("cpu"), dtype):
        return lm_loss(ours(x), y).item(), lm_loss(hf(x, use_cache=False).logits, y).item()


def profile(steps: dict, top: int = 10) -> dict[str, dict]:
    """One step of each contender: its CPU time, the share spent in the optimizer step, and the top operators by
    self CPU time (name, share of the step, calls)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    tables = {}
    for name, step in steps.items():
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events)
        optimizer = sum(e.cpu_time_total for e in events if e.key.startswith("Optimizer.step"))
        tables[name] = {"step_cpu_ms": total / 1e3, "optimizer_share": optimizer / total,
                        "top": [{"op": e.key, "self_cpu_share": e.self_cpu_time_total / total, "calls": e.count}
                                for e in events[:top]]}
    return tables


def bench_case(case: str, dtype: str, reps: int, steps: int, do_profile: bool, compile_blocks: bool,
               optimizer_swap: bool) -> dict:
    dims, batch, seq = CASES[case]
    cfg = ModelConfig(**dims, max_seq_len=seq, norm_scheme="pre")
    torch.manual_seed(0)
    ours = Transformer(cfg).train()
    hf = hf_twin(ours).train()
    x = torch.randint(0, cfg.vocab_size, (batch, seq))
    y = torch.roll(x, -1, dims=1)
    loss_ours, loss_hf = first_losses(ours, hf, x, y, dtype)
    models = {"depthlab": ours, "hf": hf}
    # depthlab as `depthlab train` runs it (fused AdamW, make_optimizer), HF as the reference code runs it (a plain
    # torch.optim.AdamW: the per-tensor loop on CPU); the swapped pairs separate model code from optimizer.
    assert make_optimizer(ours, Config(model=cfg)).defaults["fused"], "the trainer's optimizer is no longer fused"
    contenders = {"depthlab": make_train_step(ours, x, y, dtype, hf=False, fused_adamw=True),
                  "hf": make_train_step(hf, x, y, dtype, hf=True, fused_adamw=False)}
    if optimizer_swap:  # the same models, the other optimizer each
        contenders["depthlab+default_adamw"] = make_train_step(ours, x, y, dtype, hf=False, fused_adamw=False)
        contenders["hf+fused_adamw"] = make_train_step(hf, x, y, dtype, hf=True, fused_adamw=True)
    if compile_blocks:
        for name, m in models.items():
            m = copy.deepcopy(m)
            for layer in m.layers if name == "depthlab" else m.model.layers:
                layer.compile()
            contenders[f"{name}+compile"] = make_train_step(m, x, y, dtype, hf=name == "hf", fused_adamw=True)
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
        # every contender against HF as the reference code trains it (default AdamW, eager)
        "speedup_over_hf": {n: paired_ratio(times["hf"], t) for n, t in times.items() if n != "hf"},
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
    p.add_argument("--compile", action="store_true", help="also time both with their blocks torch.compile'd")
    p.add_argument("--no-optimizer-swap", dest="optimizer_swap", action="store_false",
                   help="skip depthlab with the default AdamW and HF with the fused one")
    p.add_argument("--profile", action="store_true", help="also profile one step of each (torch.profiler)")
    p.add_argument("--out", help="result file (default benchmarks/results/train_speed.json)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    runs = []
    for case in args.case:
        for dtype in args.dtype:
            r = bench_case(case, dtype, args.reps, args.steps, args.profile, args.compile, args.optimizer_swap)
            runs.append(r)
            print(f"{case} {dtype}: timed, first loss {r['first_loss']['depthlab']:.5f} vs HF "
                  f"{r['first_loss']['hf']:.5f} ({time.time() - t0:.0f} s)", flush=True)
    result = {"benchmark": "train_speed", "argv": sys.argv[1:] if argv is None else argv, "env": environment(),
              "wall_s": time.time() - t0, "runs": runs}
    path = write_result("train_speed", result, args.out)
    print("\n".join(speed_section(result, None)) + f"\nwrote {path}")  # the page's table


if __name__ == "__main__":
    main()
