"""Scale-out memory by phase: peak resident memory of every rank while the model is built, while it trains (at
grad_accum 1 and 2), while it saves a checkpoint and while a new process resumes from it, in one process and on 2
ranks (DDP and FSDP, gloo on CPU), on a ~160M-parameter model.

    python benchmarks/scaleout.py [--dim 768 --layers 16 --vocab 32128]

Each configuration runs in fresh processes (torchrun for 2 ranks); a thread samples the process's resident set
every 2 ms and keeps the peak of each phase. Figures are MiB of resident memory, the Python interpreter and
PyTorch's libraries included (their share is the `base` column: the resident set before the model is built),
with glibc's mmap threshold fixed at 1 MiB so that freed tensors leave the resident set.

The resident set also moves with where glibc places small allocations (by tens of MiB from one run to the
next), so after the save each process runs one more step at grad_accum 1 and one at 2 under PyTorch's memory
profiler, which records every tensor allocation and free: the `live` figures are the exact peak of live tensor
bytes in such a step above its start. Two more configurations are a minimal hand-written accumulation loop in
plain PyTorch (the same model; `AdamW(fused=True)`; `loss.backward()` per micro-batch, clipping, step,
`zero_grad`) at the micro-batch of one process (2 sequences) and of an FSDP rank (1): the cost of gradient
accumulation any loop pays, against which the trainer is compared.
Results: benchmarks/results/scaleout.json, and the table it prints.
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

from depthlab.memtrack import PeakSampler, live_peak
from depthlab.study.page.systems import criteria, scaleout_lines

PHASES = ("build", "step", "step_accum2", "save", "resume")


def plain_loop(cfg, phase) -> dict:
    """The baseline: a minimal hand-written accumulation loop in plain PyTorch on the same model and batch shape."""
    import torch

    from depthlab.model import build_model

    torch.manual_seed(0)
    model = phase("build", lambda: build_model(cfg.model))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(0)

    def step(accum):
        for _ in range(accum):
            x = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.data.seq_len + 1), generator=gen)
            loss = model(x[:, :-1], targets=x[:, 1:], loss_chunk=cfg.train.loss_chunk) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    phase("step", lambda: [step(1) for _ in range(2)])
    phase("step_accum2", lambda: [step(2) for _ in range(2)])
    return {f"accum{k}": live_peak(step, k) for k in (1, 2)}


def worker(a) -> None:
    """One rank of one configuration: build, two steps at grad_accum 1, two at 2, save, a profiled step at each
    grad_accum (or: resume; or: the plain loop)."""
    import torch

    from depthlab.config import Config, apply_overrides
    from depthlab.train.trainer import Trainer

    torch.set_num_threads(1)
    sampler = PeakSampler()
    cfg = apply_overrides(Config(), json.loads(a.overrides))
    base = sampler.rss()
    times = {}

    def phase(name, fn):
        sampler.begin(name)
        t0 = time.perf_counter()
        out = fn()
        times[name] = time.perf_counter() - t0
        sampler.end()
        return out

    live = None
    if a.plain:
        live = plain_loop(cfg, phase)
    elif a.resume:
        trainer = phase("resume", lambda: Trainer(cfg, run_dir=a.run_dir, resume="auto", progress=False))
    else:
        trainer = phase("build", lambda: Trainer(cfg, run_dir=a.run_dir, progress=False))

        def steps(accum, n=2):
            trainer.cfg.train.grad_accum = accum
            for _ in range(n):
                trainer.train_step()
                trainer.opt.step()
                trainer.opt.zero_grad(set_to_none=True)
            trainer.step += 1

        phase("step", lambda: steps(1))
        phase("step_accum2", lambda: steps(2))
        trainer.cfg.train.grad_accum = 1  # the config the run was started with (the resume compares them)
        phase("save", trainer.save)
        live = {f"accum{k}": live_peak(steps, k, 1) for k in (1, 2)}
    if not a.plain:
        trainer.close()
    rank = int(os.environ.get("RANK", 0))
    record = {"rank": rank, "base": base, "peaks": sampler.peaks, "start": sampler.start, "seconds": times,
              **({"live": live} if live else {})}
    Path(a.out, f"rank{rank}-{'resume' if a.resume else 'train'}.json").write_text(json.dumps(record))


def launch(world: int, overrides: list[str], run_dir: Path, out: Path, resume: bool, plain: bool = False) -> None:
    me = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world)] if world > 1 else \
        [sys.executable]
    cmd = [*me, str(Path(__file__).resolve()), "worker", "--overrides", json.dumps(overrides), "--run-dir",
           str(run_dir), "--out", str(out)] + (["--resume"] if resume else []) + (["--plain"] if plain else [])
    # glibc would serve tensors under 32 MiB from its heap and keep them after they are freed; a fixed 1 MiB mmap
    # threshold returns every freed tensor to the OS, so that the resident set follows the live tensors
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(2**20),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"scaleout: {' '.join(cmd)} failed:\n{res.stderr[-3000:]}")


def measure(a) -> dict:
    from depthlab.config import Config, apply_overrides
    from depthlab.data.dataset import build_token_data

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = [f"model.dim={a.dim}", f"model.n_layers={a.layers}", f"model.n_heads={a.dim // 64}",
                f"model.ffn_dim={a.ffn}", f"model.vocab_size={a.vocab}", "data.seq_len=128",
                f"data.builtin_mb={a.builtin_mb}", "train.monitor_every=0", "train.eval_every=1000000",
                "train.threads=1", "train.loss_chunk=1024"]
        # one tokenizer for every configuration, trained here: the ranks' build is the model's, not BPE's
        data = build_token_data(apply_overrides(Config(), base))
        data.tokenizer.save(str(tmp / "tokenizer.json"))
        base.append(f"data.tokenizer={tmp / 'tokenizer.json'}")
        for world, parallel in ((1, "single"), (2, "ddp"), (2, "fsdp")):
            name = f"{world}-{parallel}"
            overrides = [*base, f"train.batch_size={2 // world}", f"train.parallel={'ddp' if world == 1 else parallel}"]
            out = tmp / name
            out.mkdir()
            launch(world, overrides, tmp / f"run-{name}", out, resume=False)
            launch(world, overrides, tmp / f"run-{name}", out, resume=True)
            rows[name] = collect(out)
            print(f"scaleout: {name} done", file=sys.stderr)
        for batch in (2, 1):  # the plain loop at one process's micro-batch and at an FSDP rank's
            name = "1-plain" + ("" if batch == 2 else f"-b{batch}")
            out = tmp / name
            out.mkdir()
            launch(1, [*base, f"train.batch_size={batch}"], tmp / f"run-{name}", out, resume=False, plain=True)
            rows[name] = collect(out)
            print(f"scaleout: {name} done", file=sys.stderr)
    return rows


def collect(out: Path) -> dict:
    """The records of one configuration's processes, by rank."""
    ranks = {}
    for f in sorted(out.glob("rank*.json")):
        r = json.loads(f.read_text())
        ranks.setdefault(str(r["rank"]), {"base": r["base"], "peaks": {}, "start": {}, "seconds": {}})
        for k in ("peaks", "start", "seconds"):
            ranks[str(r["rank"])][k].update(r[k])
        if "live" in r:
            ranks[str(r["rank"])]["live"] = r["live"]
    return ranks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--overrides", required=True)
    w.add_argument("--run-dir", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--resume", action="store_true")
    w.add_argument("--plain", action="store_true")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32128)
    ap.add_argument("--builtin-mb", type=float, default=0.5)
    ap.add_argument("--json", default="benchmarks/results/scaleout.json")
    ap.add_argument("--report", action="store_true", help="print the table of the existing --json file, add its "
                    "targets to it, and stop")
    a = ap.parse_args()
    if a.cmd == "worker":
        worker(a)
        return
    if a.report:
        result = json.loads(Path(a.json).read_text())
    else:
        t0 = time.time()
        rows = measure(a)
        n = a.layers * (4 * a.dim ** 2 + 3 * a.dim * a.ffn) + 2 * a.vocab * a.dim
        result = {"command": " ".join(["python", "benchmarks/scaleout.py", *sys.argv[1:]]), "params": n,
                  "weights_mib": 4 * n / 2**20, "rows": rows, "wall_s": round(time.time() - t0, 1)}
    result["criteria"] = criteria(result)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(scaleout_lines(result)))


if __name__ == "__main__":
    main()
