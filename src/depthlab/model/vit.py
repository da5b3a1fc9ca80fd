"""The Vision Transformer (model.family=vit): patches -> blocks of the chosen scheme -> final norm -> class head.

    image (B, C, H, W) ─ patches (B, P, C p p) ─ patch_embed ─ [class token] + positions ─ blocks ─ norm ─ pool ─ head

The blocks are the scheme registry's (depthlab.model.schemes), built with the vit family's parts
(depthlab.model.families.vit): LayerNorm with weight and bias, biases on every projection, a GELU MLP and bidirectional
attention without RoPE. So every scheme runs on a ViT unchanged, and LNS has its two placements (model.lns_placement:
norm, as for language models, or branch, the paper's best for ViT). The layout follows the original ViT and
Hugging Face's ViTForImageClassification (patch embedding = a linear map of each patch flattened as (C, p, p), the
same as the stride-p convolution; class token first; positions learned or fixed 2-D sine-cosine), so `pre` and
`lns` export to it with the same logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from depthlab.config import ModelConfig, TrainConfig
from depthlab.model.init import fill_normal_, init_weights
from depthlab.model.schemes import build_block, scheme_class


def patchify(images: torch.Tensor, p: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/p * W/p, C * p * p): patches in row-major order, each flattened as (C, p, p)."""
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(B, (H // p) * (W // p), C * p * p)


def sincos_positions(grid: int, dim: int) -> torch.Tensor:
    """Fixed 2-D sine-cosine position embeddings (MAE / "simple ViT"): (grid * grid, dim), half of the channels
    for the row, half for the column; dim must be a multiple of 4."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
    ys, xs = torch.meshgrid(torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64),
                            indexing="ij")
    parts = [f(torch.outer(c.flatten(), omega)) for c in (ys, xs) for f in (torch.sin, torch.cos)]
    return torch.cat(parts, dim=1).float()


class ViT(nn.Module):
    """The Vision Transformer of config `cfg` (cfg.family == "vit"): patch embedding, class token (pool=cls) and
    positions, cfg.n_layers blocks of scheme cfg.norm_scheme, the final norm, the class head on the pooled stream.
    init=False leaves the weights undrawn, as for Transformer."""

    def __init__(self, cfg: ModelConfig, init: bool = True):
        super().__init__()
        self.cfg = cfg
        block = scheme_class(cfg.norm_scheme)
        self.patch_embed = nn.Linear(cfg.channels * cfg.patch_size ** 2, cfg.dim)
        extra = 1 if cfg.pool == "cls" else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim)) if extra else None
        if cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, cfg.n_patches + extra, cfg.dim))
        else:  # fixed; the class token gets position zero, as in MAE
            pos = sincos_positions(cfg.image_size // cfg.patch_size, cfg.dim)
            self.register_buffer("pos_embed", torch.cat([torch.zeros(extra, cfg.dim), pos])[None], persistent=False)
        self.embed_norm = block.make_norm(cfg) if block.embed_norm else nn.Identity()
        self.layers = nn.ModuleList(build_block(cfg, l) for l in range(1, cfg.n_layers + 1))
        self.norm = block.make_norm(cfg)  # final norm: never scaled
        self.head = nn.Linear(cfg.dim, cfg.num_classes)
        if init:
            self.initialize()

    def initialize(self) -> None:
        """Draw the weights (model.init). Also what a meta-device build calls once materialised."""
        init_weights(self, self.cfg)
        with torch.no_grad():  # ViT / DeiT: the class token and learned positions drawn like the weights
            for p in (self.cls_token, self.pos_embed):
                if isinstance(p, nn.Parameter):
                    fill_normal_(p, self.cfg.weight_std)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """The residual stream entering block 1: (B, P [+ 1], dim)."""
        h = self.patch_embed(patchify(images, self.cfg.patch_size))
        if self.cls_token is not None:
            h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1).to(h.dtype), h], dim=1)
        return self.embed_norm(h + self.pos_embed.to(h.dtype))

    def pool(self, h: torch.Tensor) -> torch.Tensor:
        return h[:, 0] if self.cls_token is not None else h.mean(dim=1)

    def forward(self, images: torch.Tensor, return_hidden: bool = False, *, targets: torch.Tensor | None = None,
                loss_chunk: int = TrainConfig.loss_chunk, reduction: str = "mean"):
        """images: (B, C, H, W) -> class logits (B, num_classes). With return_hidden, also the residual stream before
        each block and after the last one (N + 1 tensors). With targets (B,), the fp32 cross-entropy instead of the
        logits (loss_chunk is accepted, and unused, so the trainer calls every model alike)."""
        h = self.embed(images)
        hidden = [h]
        for layer in self.layers:
            h = layer(h, None)
            if return_hidden:
                hidden.append(h)
        logits = self.head(self.pool(self.norm(h)))
        out = logits if targets is None else F.cross_entropy(logits.float(), targets, reduction=reduction)
        return (out, hidden) if return_hidden else out

    def num_params(self, embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n if embeddings else n - self.patch_embed.weight.numel()

