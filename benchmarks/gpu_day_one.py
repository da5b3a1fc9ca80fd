"""GPU day one: what depthlab should check the first time it has a GPU, in one command (sized for 8 minutes on one
H100/H200; it has not yet run on one).

    python -m benchmarks.gpu_day_one                          # writes benchmarks/results/gpu_day_one/
    python -m benchmarks.gpu_day_one --tiny --out /tmp/d1     # the same parts on CPU at toy sizes (the test's)

    throughput   benchmarks/gpu_table.py: llama-71m and llama-130m, depthlab beside HF LlamaForCausalLM on the same
                 batch (64 x 256), eager and compiled, bf16: tokens/s, MFU, peak memory
    memory       `depthlab train --dry-run`'s plan (depthlab.train.plan) against torch.cuda.max_memory_allocated
                 over 10 training steps of llama-71m, 64 x 256, bf16
    fsdp_resume  `depthlab train` under a 1-rank torchrun (NCCL), train.parallel=fsdp: a sharded checkpoint at step
                 10, resumed to step 20; its losses against the uninterrupted run's (atol 1e-3: CUDA kernels may
                 add in another order). --tiny: 2 ranks on gloo, bitwise
    golden       depthlab.golden's single-rank cases in bf16 on the GPU against the fp32 CPU file (atol 0.05; bf16
                 on CPU stays within 0.005 of it over the 100 steps)
    lns_study    benchmarks/lns_study.py --gpu, short: 12 blocks, pre and lns at 1e-3, 300 steps of 64 x 256

Each part runs on its own: a failure is recorded in OUT/summary.json (with its traceback) and the next part goes
on; summary.json is rewritten after every part, so a run stopped midway keeps what finished. The memory and FSDP
runs train on depthlab.golden's generated corpus and stored tokenizer (nothing to download or to tokenize at
length); their models keep their own vocabulary size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from benchmarks.common import RESULTS, environment, write_result

OUT = RESULTS / "gpu_day_one"
GPU = {"device": "cuda", "dtype": "bf16", "throughput": ["--steps", "10", "--warmup", "3"],
       "train": ["train.batch_size=64", "data.seq_len=256"], "memory_steps": 10, "resume_steps": 10, "ranks": 1,
       "resume_atol": 1e-3, "golden": {"steps": 100, "atol": 0.05, "cases": None},
       "lns": ["--steps", "300", "--eval-every", "100", "--probe-every", "1638400", "--along-depths", "12",
               "--along-lrs", "1e-3", "--corpus-mb", "8"]}
TINY_MODEL = {"dim": 32, "n_layers": 2, "n_heads": 2, "ffn_dim": 64, "vocab_size": 300}
TINY = {"device": "cpu", "dtype": "fp32", "throughput": ["--steps", "1", "--warmup", "1", "--case", "tiny",
                                                         "--contenders", "depthlab", "hf", "--batch", "2", "--seq",
                                                         "16"],
        "train": [*(f"model.{k}={v}" for k, v in TINY_MODEL.items()), "train.batch_size=8", "data.seq_len=16"],
        "memory_steps": 2, "resume_steps": 2, "ranks": 2, "resume_atol": 0.0, "golden": {"steps": 3, "atol": 0.05,
                                                                              "cases": ["lns"]},
        "lns": ["--device", "cpu", "--dtype", "fp32", "--no-compile", "--along-depths", "2", "--along-lrs", "1e-3",
                "--probe-every", "32", "--steps", "4", "--eval-every", "2", "--dim", "16", "--heads", "2", "--ffn",
                "32", "--vocab", "300", "--seq", "16", "--batch", "2", "--corpus-mb", "0.05", "--probe-windows",
                "4", "--jobs", "1"]}


def train_args(s: dict, work: Path, steps: int, *extra: str) -> list[str]:
    """`depthlab train` arguments for llama-71m on the golden corpus, sized by the settings `s`."""
    from depthlab import golden

    corpus = work / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(golden.corpus_text())
    sets = [f"train.device={s['device']}", f"train.dtype={s['dtype']}", f"train.max_steps={steps}",
            f"data.tokenizer={golden.TOKENIZER}", "train.global_batch=0", "train.grad_accum=1", "train.warmup_steps=2",
            "train.log_every=1", "train.eval_every=1000", "train.ckpt_every=0", "train.monitor_every=0", *s["train"],
            *extra]
    return ["--preset", "llama-71m", "--data", str(corpus), "--no-progress", *(a for x in sets for a in ("--set", x))]


def throughput(s: dict, out: Path, work: Path) -> dict:
    from benchmarks import gpu_table

    gpu_table.CASES.setdefault("tiny", TINY_MODEL)  # the table's own hook for toy dims
    r = gpu_table.main(["--dtype", s["dtype"], "--device", s["device"], "--out", str(out / "throughput.json"),
                        *s["throughput"]])
    return {"rows": [{k: row[k] for k in ("case", "contender", "tokens_per_s", "mfu", "peak_bytes")}
                     for row in r["rows"]]}


def memory(s: dict, out: Path, work: Path) -> dict:
    from depthlab.cli import build_config, make_parser
    from depthlab.train.plan import memory_plan
    from depthlab.train.trainer import train

    cfg = build_config(make_parser().parse_args(["train", *train_args(s, work, s["memory_steps"])]))
    plan = memory_plan(cfg, 1)["bytes"]
    cuda = s["device"] == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    train(cfg, run_dir=work / "memory", progress=False)
    measured = torch.cuda.max_memory_allocated() if cuda else None
    return {"estimate_bytes": plan, "measured_peak_bytes": measured,
            "estimate_over_measured": plan["total"] / measured if measured else None,
            "note": None if cuda else "no CUDA allocator on CPU: estimate only (benchmarks/memory_plan.py measures "
                                      "on CPU)"}


def fsdp_resume(s: dict, out: Path, work: Path) -> dict:
    from depthlab import golden
    from depthlab.checkpoint import is_sharded, list_checkpoints
    from depthlab.runfolder import read_metrics

    k = s["resume_steps"]
    args = train_args(s, work, 2 * k, "train.parallel=fsdp", f"train.ckpt_every={k}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}

    def torchrun(run: Path, *more: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                               str(s["ranks"]), "-m", "depthlab", "train", *args, "--run-dir", str(run), *more],
                              env=env, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"torchrun exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")

    full, cut = work / "fsdp_full", work / "fsdp_cut"
    torchrun(full)
    first = list_checkpoints(full)[0]
    shutil.copytree(full, cut)
    shutil.rmtree(list_checkpoints(cut)[-1])  # as a kill after step k leaves it
    torchrun(cut, "--resume", "auto")
    want, got = ([r["loss"] for r in read_metrics(d) if r["step"] > k] for d in (full, cut))
    problem = golden.differences("resumed", got, want, atol=s["resume_atol"])
    if not is_sharded(first):
        raise RuntimeError(f"{first.name} is not sharded: a {s['ranks']}-rank torchrun trained as one process "
                           "(depthlab.train.distributed.init_distributed), so neither FSDP nor NCCL ran")
    if problem:
        raise RuntimeError(problem)
    return {"checkpoint": first.name, "sharded": True, "resumed_losses": got}


def golden_bf16(s: dict, out: Path, work: Path) -> dict:
    from depthlab import golden

    g = s["golden"]
    names = g["cases"] or [n for n, c in golden.cases().items() if c.world == 1]  # 1 GPU: no 2-rank NCCL case
    problems = golden.check(names, atol=g["atol"], steps=g["steps"],
                            extra=[f"train.device={s['device']}", "train.dtype=bf16"])
    if problems:
        raise RuntimeError("; ".join(problems))
    return {"cases": names, "atol": g["atol"], "steps": g["steps"]}


def lns_slice(s: dict, out: Path, work: Path) -> dict:
    from benchmarks import lns_study

    lns_study.main(["run", "--gpu", *s["lns"], "--out", str(out / "lns_study_gpu"), "--runs-dir",
                    str(work / "lns_runs")])
    from depthlab.jsonl import read_jsonl

    runs = read_jsonl(out / "lns_study_gpu" / "runs.jsonl")
    return {"cells": [{k: r.get(k) for k in ("variant", "lr", "val_loss")} for r in runs]}


PARTS = {"throughput": throughput, "memory": memory, "fsdp_resume": fsdp_resume, "golden": golden_bf16,
         "lns_study": lns_slice}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_day_one", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", default=str(OUT), help=f"results folder (default {OUT})")
    p.add_argument("--tiny", action="store_true", help="toy sizes on the CPU (tests/test_gpu_day_one.py)")
    p.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    args = p.parse_args(argv)
    s, out, t0 = TINY if args.tiny else GPU, Path(args.out), time.time()
    out.mkdir(parents=True, exist_ok=True)
    summary = {"benchmark": "gpu_day_one", "argv": sys.argv[1:] if argv is None else argv, "env": environment(),
               "tiny": args.tiny, "parts": {}}
    with tempfile.TemporaryDirectory(prefix="depthlab-day-one-") as tmp:
        for name in args.parts:
            t = time.time()
            work = Path(tmp) / name
            work.mkdir()
            try:
                part = {"status": "ok", "result": PARTS[name](s, out, work)}
            except (Exception, SystemExit) as e:  # recorded; the next part goes on
                part = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            summary["parts"][name] = {**part, "wall_s": round(time.time() - t, 1)}
            summary["wall_s"] = round(time.time() - t0, 1)
            write_result("gpu_day_one", summary, out / "summary.json")
            print(f"{name}: {part['status']} ({time.time() - t:.0f} s){'' if part['status'] == 'ok' else ': '}"
                  f"{part.get('error', '')}", flush=True)
    print(f"wrote {out / 'summary.json'} ({summary['wall_s']:.0f} s wall)")
    return summary


if __name__ == "__main__":
    main()
