"""Model FLOPs utilisation: training FLOPs per token against the device's peak."""

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


@functools.cache
def measured_matmul_peak(device: str, dtype: str, n: int = 1024, seconds: float = 0.5) -> float:
    """Achievable matmul FLOP/s on this device, measured once per process with square n x n products."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    g = torch.Generator(device).manual_seed(0)  # not the global one: training's dropout (LoRA) draws from that
    a = torch.randn(n, n, device=device, dtype=dt, generator=g)
    b = torch.randn(n, n, device=device, dtype=dt, generator=g)
    a @ b  # warm-up
    iters, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        iters += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - start)


def peak_flops(device: torch.device, dtype: str, configured: float = 0.0) -> float:
    if configured > 0:
        return configured
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in GPU_BF16_PEAK.items():
            if key in name:
                return peak
    return measured_matmul_peak(str(device), dtype)
