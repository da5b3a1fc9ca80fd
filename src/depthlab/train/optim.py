"""AdamW with decay only on matrices (p.dim() >= 2), linear warmup then cosine decay to a floor."""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

from depthlab.config import TrainConfig
from depthlab.model.init import block_norm_gains

NO_DECAY = ("cls_token", "pos_embed")  # a ViT's class token and positions, excluded as in timm / DeiT


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, lns_power: float = 0.5) -> torch.optim.AdamW:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    decay = [p.dim() >= 2 and n.rsplit(".", 1)[-1] not in NO_DECAY for n, p in named]
    scales = lr_scales(model, cfg, lns_power)
    groups = []
    for decayed, wd in ((True, cfg.weight_decay), (False, 0.0)):  # matrices; norms, gains, scalars
        by_scale: dict[float, list] = {}
        for p, d in zip(params, decay):
            if d == decayed:
                by_scale.setdefault(scales.get(id(p), 1.0), []).append(p)
        # one group per learning-rate multiplier (the scheduler scales each group's own peak)
        groups += [{"params": ps, "weight_decay": wd, **({"lr": cfg.lr * s} if s != 1.0 else {})}
                   for s, ps in (by_scale or {1.0: []}).items()]
    # The fused kernel: on CPU the default is a per-tensor loop that took up to a third of a step
    # (docs/results.md); FSDP2's DTensor parameters keep the default implementation.
    fused = not any(isinstance(p, DTensor) for p in params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def lr_scales(model: torch.nn.Module, cfg: TrainConfig, lns_power: float) -> dict[int, float]:
    """Learning-rate multipliers by parameter id (1 where absent): train.block_lr=depth puts every parameter of
    block l at l^(-p), a plain depth-wise rate decay; train.norm_gain_lr=depth block l's norm gains (both: the
    product)."""
    out: dict[int, float] = {}
    if str(cfg.block_lr) == "depth":
        for block in model.modules():
            if hasattr(block, "layer_id"):
                out.update({id(p): block.layer_id ** -lns_power for p in block.parameters()})
    if str(cfg.norm_gain_lr) == "depth":
        for g, s in block_norm_gains(model, lns_power):
            out[id(g)] = out.get(id(g), 1.0) * s
    return out


@torch.no_grad()
def clip_gradients(model: torch.nn.Module, cfg: TrainConfig, lns_power: float = 0.5) -> torch.Tensor:
    """Clip the gradients to norm cfg.grad_clip (0: no clipping) and return their norm before clipping. Under
    train.norm_gain_lr=depth the norm is measured as LNS measures it, each block-l gain's gradient weighted by
    l^(-p) (LNS's gain gradient is l^(-p) times Pre-LN's), so that clipping keeps the two runs identical."""
    gains = block_norm_gains(model, lns_power) if str(cfg.norm_gain_lr) == "depth" else []
    for g, s in gains:
        if g.grad is not None:
            g.grad.mul_(s)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
    for g, s in gains:
        if g.grad is not None:
            g.grad.div_(s)
    return norm


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, cfg))
