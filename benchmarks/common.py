"""Shared pieces of the benchmarks: a Hugging Face twin of a depthlab model, interleaved timing, result files.

Timings on a shared machine drift with other people's load. Every comparison here is therefore *interleaved*:
repetition r times each contender back to back (in alternating order), so a load change hits both, and the
figure reported is the median over repetitions of the paired ratio. Times are the process's CPU time (the
benchmarks run one thread), which other people's processes barely change.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from depthlab.config import Config, TrainConfig
from depthlab.device import autocast
from depthlab.model import lm_loss
from depthlab.train.optim import make_optimizer

RESULTS = Path(__file__).parent / "results"


def hf_twin(model, attn: str = "sdpa"):
    """transformers.LlamaForCausalLM with the same dimensions and the same weights as a `pre` / `lns` model
    (the LNS scale folded into the norm weights, as at export)."""
    import transformers

    from depthlab.hf.convert import hf_config_dict, to_hf_state_dict

    fields = {k: v for k, v in hf_config_dict(model.cfg).items() if k not in ("architectures", "torch_dtype")}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields, attn_implementation=attn))
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return hf


def adamw_groups(model) -> list[dict]:
    """The trainer's parameter groups (which parameters decay), for a plain torch.optim.AdamW."""
    return [{"params": g["params"], "weight_decay": g["weight_decay"]}
            for g in make_optimizer(model, Config()).param_groups]


def make_train_step(model, x, y, dtype: str, hf: bool, fused_adamw: bool, loss_chunk: int = TrainConfig.loss_chunk):
    """One training step as a zero-argument callable: forward under autocast, cross-entropy, backward,
    clipping, and AdamW with the trainer's parameter groups and settings, either PyTorch's fused kernel (what
    `depthlab train` uses, `depthlab.train.optim.make_optimizer`) or its default per-tensor loop (what a plain
    `torch.optim.AdamW(...)`, as in the reference code, runs on CPU); `hf` models are called the transformers way
    (fp32 cross-entropy of the logits), depthlab's as `depthlab train` does (its loss by chunks of `loss_chunk`
    tokens, 0: through the full logits)."""
    device = x.device
    tc = TrainConfig(lr=1e-4)
    opt = torch.optim.AdamW(adamw_groups(model), lr=tc.lr, betas=(tc.beta1, tc.beta2), fused=fused_adamw)
    # HF: no KV cache in training (its default builds one), as a careful training loop would do.

    def step():
        with autocast(device, dtype):
            if hf:
                loss = lm_loss(model(x, use_cache=False).logits, y)
            else:
                loss = model(x, targets=y, loss_chunk=loss_chunk)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def matmul_probe(dtype: str, n: int = 1024, calls: int = 4):
    """A zero-argument callable doing `calls` n x n matmuls, and its FLOPs. Timed as one more contender, it
    measures the achievable matmul peak under the same load as the steps it is compared with."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)

    def run():
        for _ in range(calls):
            a @ b

    return run, 2 * n**3 * calls


def interleaved(contenders: dict, reps: int, steps: int, warmup: int = 1, clock=time.process_time
                ) -> dict[str, list[float]]:
    """Seconds per call of each zero-argument callable, `reps` rounds of `steps` calls each, contenders timed
    back to back within a round and their order reversed every other round.

    The default clock is this process's CPU time: with one thread it is the compute time of the call, which
    other processes on a shared machine barely touch (wall time also counts the time they hold the core)."""
    names = list(contenders)
    for name in names:
        for _ in range(warmup):
            contenders[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = clock()
            for _ in range(steps):
                contenders[name]()
            times[name].append((clock() - t0) / steps)
    return times


def paired_ratio(num: list[float], den: list[float]) -> dict:
    """Median, min and max over repetitions of num[r] / den[r]."""
    ratios = [a / b for a, b in zip(num, den)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def best_ratio(num: list[float], den: list[float]) -> float:
    """min(num) / min(den): each contender's least-disturbed repetition (load only ever adds time)."""
    return min(num) / min(den)


def environment(**facts) -> dict:
    """Where a benchmark ran: date, commit, versions, CPU, device, this process's torch threads and the load; `facts`
    add or correct entries (a benchmark whose work ran in child processes with their own thread count says so:
    environment(threads=1, processes=4))."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "git_commit": commit,
            "torch": torch.__version__, "transformers": tf_version, "cpu": cpu,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "threads": torch.get_num_threads(), "load_avg_1min": _loadavg(), **facts}


def _loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return None


def write_result(name: str, result: dict, out: str | Path | None = None) -> Path:
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
