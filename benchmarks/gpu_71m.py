"""LLaMA-71M, `pre` against `lns`, on one GPU in one command.

Sized to end within 8 minutes on an H100-class GPU (estimate: 2 x 1,200 steps of 16k tokens, 344 MFLOP
per token, at 20-40% MFU is 1-2 minutes of training, plus tokenizer training and evaluations; then the
throughput / MFU / peak-memory table of benchmarks/gpu_table.py, 71M and 130M, depthlab and LlamaForCausalLM,
eager and compiled, about 3-4 minutes with compilation). It has not yet been run on a GPU.

    python -m benchmarks.gpu_71m --out benchmarks/results/gpu_71m

Both runs use the paper's 71M dimensions (dim 512, 12 layers, 8 heads, FFN 1368, vocab 32k, sequence 256,
embedding std 0.632), bf16 autocast, the same packed data (the built-in corpus, tokenized once and shared) and
the same seed; only model.norm_scheme differs. Written under --out: summary.json (tokens/s, MFU, final
validation loss / perplexity, loss curves, last per-layer variance of each run), loss.png, var_by_depth.png,
and the two run directories (metrics.jsonl, config.json); table.json (gpu_table.py's rows) when a GPU is
present or --table is given. The step count is far below the paper's 10k (a time
budget, not a reproduction); --max-steps changes it. It is a throughput check, not a test of claim 1: 19.7M
tokens are 0.28 tokens per parameter (the paper: about 20); `python -m benchmarks.lns_study run --gpu` asks claim
1's question on a GPU. Tested on CPU with tiny step counts only (see
tests/test_benchmarks.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from benchmarks import gpu_table
from benchmarks.common import environment, write_result
from depthlab.config import apply_overrides
from depthlab.data.dataset import build_token_data
from depthlab.model.families import preset
from depthlab.model.validate import validate
from depthlab.runfolder import read_metrics
from depthlab.study.figures import curve, plot_runs
from depthlab.train.trainer import train

SCHEMES = ("pre", "lns")


def config(scheme: str, out: Path, max_steps: int, extra: list[str]):
    cfg = preset("llama-71m")
    return validate(apply_overrides(cfg, [
        f"model.norm_scheme={scheme}", f"train.out_dir={out}", f"train.max_steps={max_steps}",
        f"train.warmup_steps={max(1, max_steps // 10)}", "train.batch_size=64", "train.grad_accum=1",
        f"train.eval_every={max(1, max_steps // 5)}", "train.log_every=10", "train.monitor_every=100",
        "data.builtin_mb=64", *extra]))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results/gpu_71m", help="output directory (replaced)")
    p.add_argument("--max-steps", type=int, default=1200)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config overrides for both runs, e.g. train.compile=true or train.device=cpu")
    p.add_argument("--table", action=argparse.BooleanOptionalAction, default=None,
                   help="also run benchmarks/gpu_table.py into OUT/table.json (default: when a GPU is present)")
    args = p.parse_args(argv)
    t0 = time.time()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    data = build_token_data(config("pre", out, args.max_steps, args.set))  # one tokenizer and token stream for both
    print(f"data: {data.source}; {len(data.train):,} train / {len(data.val):,} val tokens "
          f"({time.time() - t0:.0f} s)", flush=True)
    runs, metrics = {}, {}
    for scheme in SCHEMES:
        cfg = config(scheme, out, args.max_steps, args.set)
        result = train(cfg, run_dir=out / scheme, data=data, progress=False)
        records = metrics[scheme] = read_metrics(result.run_dir)
        logged = [r for r in records if "tokens_per_s" in r]
        logged = logged[1:] or logged  # the first window includes warm-up
        runs[scheme] = {
            "val_loss": result.val_loss, "val_ppl": result.val_ppl, "steps": result.steps, "wall_s": result.wall_s,
            "tokens_per_s": sum(r["tokens_per_s"] for r in logged) / max(1, len(logged)),
            "mfu": sum(r["mfu"] for r in logged) / max(1, len(logged)),
            "loss_curve": curve(records, "loss"), "val_curve": curve(records, "val_loss"),
            "last_depth_var": next((r["depth/var"] for r in records[::-1] if "depth/var" in r), None)}
        print(f"{scheme}: val loss {result.val_loss:.4f} (ppl {result.val_ppl:.2f}), "
              f"{runs[scheme]['tokens_per_s']:,.0f} tok/s, MFU {runs[scheme]['mfu']:.1%}, {result.wall_s:.0f} s",
              flush=True)
    plot_runs(metrics, out)
    wall = time.time() - t0
    write_result("gpu_71m", {"benchmark": "gpu_71m", "argv": sys.argv[1:] if argv is None else argv,
                             "env": environment(), "wall_s": wall, "runs": runs,
                             "tokens_per_s_ratio_lns_over_pre":
                                 runs["lns"]["tokens_per_s"] / runs["pre"]["tokens_per_s"]},
                 out / "summary.json")
    print(json.dumps({s: {k: r[k] for k in ("val_loss", "tokens_per_s", "mfu")} for s, r in runs.items()}))
    if args.table if args.table is not None else torch.cuda.is_available():
        gpu_table.main(["--out", str(out / "table.json")])
    print(f"wrote {out} ({wall:.0f} s wall)")


if __name__ == "__main__":
    main()
