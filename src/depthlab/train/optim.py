"""AdamW with decay only on matrices (p.dim() >= 2), linear warmup then cosine decay to a floor."""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

from depthlab.config import TrainConfig

NO_DECAY = ("cls_token", "pos_embed")  # a ViT's class token and positions, excluded as in timm / DeiT


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    decay = [p.dim() >= 2 and n.rsplit(".", 1)[-1] not in NO_DECAY for n, p in named]
    groups = [
        {"params": [p for p, d in zip(params, decay) if d], "weight_decay": cfg.weight_decay},
        {"params": [p for p, d in zip(params, decay) if not d], "weight_decay": 0.0},  # norms, gains, scalars
    ]
    # The fused kernel: on CPU the default is a per-tensor loop that took up to a third of a step
    # (docs/results.md); FSDP2's DTensor parameters keep the default implementation.
    fused = not any(isinstance(p, DTensor) for p in params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, cfg))
