"""Model FLOPs utilisation: training FLOPs per token against the device's peak, and the trainer's meter of
throughput, MFU and per-rank timings between log lines."""

from __future__ import annotations

import functools
import time

import torch

from depthlab.config import ModelConfig
from depthlab.model.families import family_of

# Dense bf16 tensor-core peaks (FLOP/s) of data-centre GPUs, by a substring of torch.cuda.get_device_name().
GPU_BF16_PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12}


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: the family's formula (depthlab.model.families.base.Family.train_flops_per_token:
    6 x matmul parameters + PaLM's 12 x L x T x d for attention; for a ViT a token is a patch)."""
    return family_of(cfg).train_flops_per_token(cfg, seq_len)


def thread_seconds() -> float:
    """The process's CPU time per intra-op thread: a clock that stops while the process is not scheduled."""
    return time.process_time() / torch.get_num_threads()


@functools.cache
def measured_matmul_peak(device: str, dtype: str, n: int = 1024, seconds: float = 0.5) -> float:
    """Achievable matmul FLOP/s on this device, measured once per process with square n x n products.

    On a CPU the clock is the process's CPU time divided by its intra-op threads (torch.get_num_threads()), not the
    wall clock: time the process is not scheduled (other jobs, `nice`) would otherwise count as matmul time and
    shrink the peak. With one thread this is the time spent computing exactly; with several it never undercounts
    (each thread's spin-waits and any other thread's work count too), so the peak is at most the true one. On a GPU
    the clock is the wall clock, synchronized."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    g = torch.Generator(device).manual_seed(0)  # not the global one: training's dropout (LoRA) draws from that
    a = torch.randn(n, n, device=device, dtype=dt, generator=g)
    b = torch.randn(n, n, device=device, dtype=dt, generator=g)
    a @ b  # warm-up
    clock = thread_seconds if device.startswith("cpu") else time.perf_counter
    iters, start = 0, clock()
    while clock() - start < seconds:
        a @ b
        iters += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 2 * n**3 * iters / (clock() - start)


def peak_flops(device: torch.device, dtype: str, configured: float = 0.0) -> float:
    if configured > 0:
        return configured
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in GPU_BF16_PEAK.items():
            if key in name:
                return peak
    return measured_matmul_peak(str(device), dtype)


class Meter:
    """Throughput and MFU over the steps since the last log line, of a Trainer (its config, task, ranks, device
    and data-loading time)."""

    def __init__(self, trainer):
        tc, seq_len, world = trainer.cfg.train, trainer.task.tokens_per_sample(trainer.cfg), trainer.env.world_size
        self.tokens_per_step = tc.batch_size * tc.grad_accum * seq_len * world
        self.flops_per_step = train_flops_per_token(trainer.cfg.model, seq_len) * self.tokens_per_step
        self.peak = peak_flops(trainer.device, tc.dtype, tc.peak_flops) * world
        self.t, self.steps, self.trainer, self.step_s, self.last_steps = time.time(), 0, trainer, 0.0, 0

    def per_rank(self) -> dict:
        """Collective: each rank's mean step time and data time since the last log line, and its peak memory."""
        trainer, steps = self.trainer, max(self.last_steps, 1)  # record() has just closed the interval
        mine = (self.step_s / steps, trainer.data_s / steps, peak_memory_mib(trainer.device))
        trainer.data_s = 0.0
        step_s, data_s, peak = zip(*trainer.env.gather(mine), strict=True)
        return {"rank_step_s": list(step_s), "rank_data_s": list(data_s), "rank_peak_mib": list(peak)}

    def record(self, step: int, loss: float, lr: float, grad_norm: float) -> dict:
        now = time.time()
        elapsed = max(now - self.t, 1e-9)
        record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                  "tokens_per_s": self.steps * self.tokens_per_step / elapsed,
                  "mfu": self.steps * self.flops_per_step / elapsed / self.peak, "tokens": step * self.tokens_per_step}
        self.step_s, self.last_steps = elapsed, self.steps
        self.t, self.steps = now, 0
        return record

    @staticmethod
    def summary(record: dict) -> str:
        """A metrics record's headline figures, as the bar and the log lines show them."""
        parts = [f"loss {record['loss']:.4f}"]
        if "tokens_per_s" in record:  # a log step's (an evaluation-only step has no throughput)
            parts += [f"lr {record['lr']:.2e}", f"{record['tokens_per_s']:,.0f} tok/s", mfu_text(record["mfu"])]
        return " ".join(parts + [f"{k} {v:.4f}" for k, v in record.items()
                                 if k.startswith("val_") and isinstance(v, float)])


def mfu_text(mfu: float) -> str:
    """MFU for a log line; over 100% it can only be a peak measured too low, and the line says so."""
    return f"mfu {mfu:.1%}" + (" (peak suspect)" if mfu > 1 else "")


def peak_memory_mib(device: torch.device) -> float:
    """This process's peak memory so far: the device's allocator peak on a GPU, the resident set's on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
