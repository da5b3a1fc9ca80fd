"""The device a flag names, for every command that runs a model (train, eval, analyze, the HF tools), and the
autocast a run's dtype asks for on it (training and every scorer)."""

from __future__ import annotations

import contextlib

import torch

from depthlab import UserError


def resolve_device(name: str, what: str = "--device", instead: str = "use cpu or auto") -> torch.device:
    """The device a flag or config field (`what`) names; one error line when this machine has no such device, saying
    what to give `instead`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"{what}: unknown device {name!r} (use auto, cpu, cuda, cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{what} {name}: this machine has no CUDA device (PyTorch {torch.__version__} sees none); "
                        + instead)
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"{what} {name}: there are only {torch.cuda.device_count()} CUDA device(s)")
    return device


def autocast(device: torch.device, dtype: str):
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
