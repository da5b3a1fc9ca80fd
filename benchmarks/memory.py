"""Peak memory of one training step: depthlab against transformers.LlamaForCausalLM, at the paper's 71M and 130M dims.

Contenders, same dimensions and weights (the HF twin of benchmarks/common.py), same batch, same step (forward under
autocast, fp32 cross-entropy, backward, clipping, AdamW):

    depthlab            as `depthlab train` runs it: the LM head + cross-entropy by chunks of train.loss_chunk
                        tokens (depthlab.model.loss), never the full logits; fused AdamW
    depthlab-unchunked  the same with train.loss_chunk=0: the full logits, as before the chunked loss
    hf                  LlamaForCausalLM as the reference code trains it: logits, lm_loss, a plain AdamW

Each contender runs in a fresh subprocess (one thread), so no allocator state carries over. How the step's own
memory is separated from weights and optimizer state: a warm-up step first allocates everything a step keeps
(gradients, kept allocated with zero_grad(set_to_none=False), and both AdamW moments); the resident memory then
(after gc and malloc_trim) is the *baseline*: weights + gradients + optimizer state (+ the interpreter and
libraries). The peak is then reset (Linux: `echo 5 > /proc/self/clear_refs` resets VmHWM) and the measured step's
forward + backward run: `activation_and_logits` = peak RSS - baseline, i.e. the activations saved for backward,
the logits and their gradients, and every temporary of forward and backward. The optimizer step's own peak is
measured the same way, separately. The child runs with MALLOC_MMAP_THRESHOLD_=65536, so that glibc returns every
freed large block to the system and RSS follows live memory. On a GPU the same phases read
torch.cuda.memory_allocated / max_memory_allocated. A cross-check that depends on no allocator: the bytes of the
distinct tensors autograd saves for backward during the forward (`saved_for_backward`, parameters excluded), also
split by the module that saved each (`saved_by_module_bytes`; the docs table lists them per block).

Step time: depthlab against depthlab-unchunked (the same model, the loss before the chunked loss) and against HF's
operators with fused AdamW, interleaved in one process as benchmarks/common.py does; the paired ratio's median over
repetitions. With --time-against COMMIT, also this tree's depthlab step against the same step at a git commit
(say, the one before a change), each in its own worker process, one step of each per round in alternating order.

    python -m benchmarks.memory                                   # 71M and 130M, fp32, 8 x 256 tokens on CPU
    python -m benchmarks.memory --case llama-71m --dtype bf16 --reps 2
    python -m benchmarks.memory --dtype fp32 bf16 --reps 5 --time-against 79dadac   # as in results/memory.json
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.common import environment, hf_twin, interleaved, make_train_step, paired_ratio, write_result
from depthlab.config import Config, TrainConfig
from depthlab.device import autocast
from depthlab.memtrack import saved_for_backward
from depthlab.model import Transformer, lm_loss
from depthlab.model.families import preset
from depthlab.study.page.systems import memory_table
from depthlab.train.optim import make_optimizer

CASES = {"llama-71m": {}, "llama-130m": {}}  # preset names; the values override model dims (tests use tiny ones)
CONTENDERS = ("depthlab", "depthlab-unchunked", "hf")
MiB = 2**20


def model_config(case: str):
    cfg = preset(case).model if case in ("llama-71m", "llama-130m") else preset("llama-71m").model
    for k, v in CASES[case].items():
        setattr(cfg, k, v)
    return cfg


def build(case: str, contender: str, device: torch.device, loss_chunk: int = TrainConfig.loss_chunk):
    """(model, optimizer, loss function of (x, y)) of a contender."""
    torch.manual_seed(0)
    ours = Transformer(model_config(case))
    if contender == "hf":
        model = hf_twin(ours).to(device).train()
        del ours
        opt = torch.optim.AdamW(common.adamw_groups(model), lr=1e-4)  # the reference code's plain AdamW
        return model, opt, lambda x, y: lm_loss(model(x, use_cache=False).logits, y)
    model = ours.to(device).train()
    chunk = loss_chunk if contender == "depthlab" else 0
    opt = make_optimizer(model, Config(model=model.cfg, train=TrainConfig(lr=1e-4)))
    return model, opt, lambda x, y: model(x, targets=y, loss_chunk=chunk)


class Meter:
    """Current and peak memory since the last reset: resident set on CPU, allocated memory on a GPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def reset(self) -> int:
        """Frees what is garbage, resets the peak, returns the current memory (the baseline)."""
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return torch.cuda.memory_allocated()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
        return self._status("VmRSS")

    def peak(self) -> int:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        return self._status("VmHWM")

    @staticmethod
    def _status(key: str) -> int:
        line = next(s for s in Path("/proc/self/status").read_text().splitlines() if s.startswith(key + ":"))
        return int(line.split()[1]) * 1024


def _tensor_bytes(model, opt) -> int:
    """Bytes of the weights, their gradients and the optimizer's state tensors (each storage once)."""
    tensors = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
    tensors += [t for state in opt.state.values() for t in state.values() if torch.is_tensor(t)]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def measure(case: str, contender: str, dtype: str, batch: int, seq: int, device: str,
            loss_chunk: int = TrainConfig.loss_chunk) -> dict:
    """One contender's memory (run in a fresh process: see child())."""
    from transformers import LlamaForCausalLM  # noqa: F401  (loaded by every contender: no library is a step's)

    dev = torch.device(device)
    meter = Meter(dev)
    start = meter.reset()
    model, opt, loss_fn = build(case, contender, dev, loss_chunk)
    x = torch.randint(0, model_config(case).vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    x = x.to(dev)
    y = torch.roll(x, -1, dims=1)

    def forward():
        with autocast(dev, dtype):
            return loss_fn(x, y)

    def optimizer_step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)  # gradients stay allocated: part of the baseline

    forward().backward()  # warm-up: gradients, AdamW moments, kernels' one-time state
    optimizer_step()
    base = meter.reset()
    saved, saved_by_module, loss = saved_for_backward(model, forward)
    loss.backward()
    fwd_bwd = meter.peak() - base
    del loss
    base_opt = meter.reset()
    optimizer_step()
    return {"contender": contender, "case": case, "dtype": dtype, "batch": batch, "seq_len": seq, "device": device,
            "params": sum(p.numel() for p in model.parameters()), "static_bytes": base - start,
            "static_tensor_bytes": _tensor_bytes(model, opt),
            "activation_and_logits_bytes": fwd_bwd, "saved_for_backward_bytes": saved,
            "saved_by_module_bytes": saved_by_module, "n_layers": model_config(case).n_layers,
            "optimizer_step_bytes": meter.peak() - base_opt, "baseline_bytes": base}


def child(spec: dict) -> dict:
    """Runs measure() in a fresh interpreter (one thread, large blocks returned to the system when freed)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), str(Path(__file__).parents[1]),
                                          os.environ.get("PYTHONPATH", "")])}
    code = ("import json, sys, torch; torch.set_num_threads(1); from benchmarks import memory as m; "
            "m.CASES.update(json.loads(sys.argv[2])); print(json.dumps(m.measure(**json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(spec), json.dumps(CASES)], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"memory child {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def step_time(case: str, dtype: str, batch: int, seq: int, reps: int, device: str) -> dict:
    """Seconds per step of depthlab's chunked loss and of the full-logits loss, interleaved; their paired ratio."""
    torch.manual_seed(0)
    model = Transformer(model_config(case)).to(device).train()
    x = torch.randint(0, model.cfg.vocab_size, (batch, seq), device=device)
    y = torch.roll(x, -1, dims=1)
    hf = hf_twin(model).to(device).train()
    steps = {name: make_train_step(model, x, y, dtype, hf=False, fused_adamw=True,
                                   loss_chunk=TrainConfig.loss_chunk if name == "depthlab" else 0)
             for name in ("depthlab", "depthlab-unchunked")}
    # depthlab's step before this change: its model code ran HF's operators (docs/benchmarks.md), with fused AdamW
    steps["hf+fused_adamw"] = make_train_step(hf, x, y, dtype, hf=True, fused_adamw=True)
    clock = time.perf_counter if device.startswith("cuda") else time.process_time
    times = interleaved(steps, reps, steps=1, clock=clock)
    return {"case": case, "dtype": dtype, "step_s": times,
            "ratio_chunked_over_unchunked": paired_ratio(times["depthlab"], times["depthlab-unchunked"]),
            "ratio_over_hf_fused": paired_ratio(times["depthlab"], times["hf+fused_adamw"])}


# A worker of step_time_against, run with one source tree first on the path: builds the case's model and the
# training step as step_time does, then runs one step per line read from stdin and prints its seconds and loss.
_AB_WORKER = """
import json, sys, time, torch
torch.set_num_threads(1)
from benchmarks.common import make_train_step
from depthlab.model.families import preset
from depthlab.model import Transformer
s = json.loads(sys.argv[1])
cfg = preset(s["case"] if s["case"] in ("llama-71m", "llama-130m") else "llama-71m").model
for k, v in s["overrides"].items():
    setattr(cfg, k, v)
torch.manual_seed(0)
model = Transformer(cfg).to(s["device"]).train()
x = torch.randint(0, cfg.vocab_size, (s["batch"], s["seq"]), generator=torch.Generator().manual_seed(1))
x = x.to(s["device"])
step = make_train_step(model, x, torch.roll(x, -1, dims=1), s["dtype"], hf=False, fused_adamw=True)
cuda = s["device"].startswith("cuda")
clock = time.perf_counter if cuda else time.process_time
step()
print("ready", flush=True)
for _ in sys.stdin:
    t0 = clock()
    loss = step().item()
    print(clock() - t0, loss, flush=True)
"""


def _worker(tree: Path, spec: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(tree)])}
    w = subprocess.Popen([sys.executable, "-c", _AB_WORKER, spec], cwd=tree, env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    if w.stdout.readline().strip() != "ready":
        raise RuntimeError(f"step-time worker in {tree} failed to start")
    return w


def _ask(w: subprocess.Popen) -> tuple[float, float]:
    w.stdin.write("step\n")
    w.stdin.flush()
    seconds, loss = w.stdout.readline().split()
    return float(seconds), float(loss)


def step_time_against(ref: str, case: str, dtype: str, batch: int, seq: int, reps: int, device: str) -> dict:
    """Seconds per training step of depthlab in this tree and at git commit `ref` (its src/ and benchmarks/,
    archived to a temporary directory), each in its own worker process, one step of each per round and the order
    reversed every other round; the paired ratio this tree / ref, and the largest difference of their losses."""
    root = Path(__file__).parents[1]
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=root, capture_output=True, text=True,
                            check=True).stdout.strip()
    spec = json.dumps(dict(case=case, overrides=CASES[case], dtype=dtype, batch=batch, seq=seq, device=device))
    runs = {"ref": [], "here": []}
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", commit, "src", "benchmarks"], cwd=root, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        workers = {"ref": _worker(Path(tmp), spec), "here": _worker(root, spec)}
        try:
            for r in range(reps):
                for name in list(workers) if r % 2 == 0 else list(workers)[::-1]:
                    runs[name].append(_ask(workers[name]))
        finally:
            for w in workers.values():
                w.stdin.close()
                w.wait()
    times = {name: [t for t, _ in v] for name, v in runs.items()}
    return {"case": case, "dtype": dtype, "ref": commit, "step_s": times,
            "ratio_here_over_ref": paired_ratio(times["here"], times["ref"]),
            "max_loss_difference": max(abs(a[1] - b[1]) for a, b in zip(runs["here"], runs["ref"]))}


def summarize(rows: list[dict]) -> dict:
    """Per case and dtype: depthlab's activation-and-logits memory over HF's (and the unchunked loss's)."""
    out = {}
    for r in rows:
        key = f"{r['case']} {r['dtype']}"
        out.setdefault(key, {})[r["contender"]] = r["activation_and_logits_bytes"]
    return {k: {"depthlab_over_hf": v["depthlab"] / v["hf"],
                "depthlab_over_unchunked": v["depthlab"] / v["depthlab-unchunked"]} for k, v in out.items()}


def _timings(args) -> tuple[list[dict], list[dict]]:
    """The step-time comparisons main() asks for: within this tree (step_time), against a commit (--time-against)."""
    cases = [(c, d) for c in args.time_case for d in args.dtype if c in args.case]
    timing = [step_time(c, d, args.batch, args.seq, args.reps, args.device) for c, d in cases]
    against = [step_time_against(args.time_against, c, d, args.batch, args.seq, args.reps, args.device)
               for c, d in (cases if args.time_against else [])]
    return timing, against


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--dtype", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    p.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions of the step-time comparison")
    p.add_argument("--time-case", nargs="*", default=["llama-71m"], help="cases whose step time is compared")
    p.add_argument("--time-against", metavar="COMMIT", help="also time each time-case's step against depthlab at "
                   "this git commit (e.g. the commit before a change): paired ratio this tree / COMMIT")
    p.add_argument("--out", help="result file (default benchmarks/results/memory.json)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    rows = []
    for case in args.case:
        for dtype in args.dtype:
            for contender in CONTENDERS:
                rows.append(child(dict(case=case, contender=contender, dtype=dtype, batch=args.batch, seq=args.seq,
                                       device=args.device)))
                r = rows[-1]
                print(f"{case} {dtype} {contender:18s} activations+logits {r['activation_and_logits_bytes'] / MiB:7.0f}"
                      f" MiB, saved for backward {r['saved_for_backward_bytes'] / MiB:7.0f} MiB, weights+grads+AdamW "
                      f"{r['static_bytes'] / MiB:6.0f} MiB, optimizer step {r['optimizer_step_bytes'] / MiB:5.0f} MiB",
                      flush=True)
    timing, against = _timings(args)
    result = {"benchmark": "memory", "argv": sys.argv[1:] if argv is None else argv, "env": environment(),
              "loss_chunk": TrainConfig.loss_chunk, "batch": args.batch, "seq_len": args.seq, "device": args.device,
              "rows": rows, "ratios": summarize(rows), "step_time": timing, "step_time_against": against,
              "wall_s": time.time() - t0}
    print("\n".join(memory_table(result)))  # what docs/benchmarks.md will say
    path = write_result("memory", result, args.out)
    print(f"wrote {path} ({result['wall_s']:.0f} s wall)")
    return result


if __name__ == "__main__":
    main()
