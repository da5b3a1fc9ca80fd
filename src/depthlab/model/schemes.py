"""Normalization schemes: one small variant of the Pre-LN block per scheme, registered by name.

To add a scheme, write a subclass of PreLNBlock and decorate it with @register("name"); nothing else changes.
l is the 1-based block index, N the number of blocks (DESIGN.md section 2). Every scheme keeps the model's
final norm before the LM head, unscaled.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from depthlab.config import ModelConfig
from depthlab.model.llama import DyT, PreLNBlock, Residual

SCHEMES: dict[str, type[PreLNBlock]] = {}
GPAS_SCHEMES = ("pre", "lns")  # GPAS is an add-on to these


def register(name: str):
    def deco(cls):
        SCHEMES[name] = cls
        cls.scheme = name
        return cls

    return deco


register("pre")(PreLNBlock)


@register("lns")
class LNSBlock(PreLNBlock):
    """LayerNorm Scaling (arXiv 2502.05795): Pre-LN with both norm outputs of block l scaled by l^(-p)."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__(cfg, layer_id)
        self.attn_norm.scale = self.mlp_norm.scale = layer_id ** -cfg.lns_power


@register("post")
class PostLNBlock(PreLNBlock):
    """Post-LN: h = Norm(h + Attn(h)); h = Norm(h + MLP(h))."""

    def forward(self, h, rope):
        h = self.attn_norm(self.attn_add(h, self.attn(h, rope)))
        h = self.mlp_norm(self.mlp_add(h, self.mlp(h)))
        return h


def deepnorm_alpha(n_layers: int) -> float:
    """DeepNet's residual weight for a decoder-only model: (2N)^(1/4)."""
    return (2 * n_layers) ** 0.25


def deepnorm_beta(n_layers: int) -> float:
    """DeepNet's init gain for v, o and MLP weights: (8N)^(-1/4) (the reference code inverted it)."""
    return (8 * n_layers) ** -0.25


@register("deepnorm")
class DeepNormBlock(PostLNBlock):
    """DeepNorm: h = Norm(alpha * h + F(h)), alpha = (2N)^(1/4); pair with the `deepnorm` init."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__(cfg, layer_id)
        self.attn_add = Residual(deepnorm_alpha(cfg.n_layers))
        self.mlp_add = Residual(deepnorm_alpha(cfg.n_layers))


@register("mixln")
class MixLNBlock(PreLNBlock):
    """Mix-LN: blocks l <= floor(r * N) are Post-LN, the rest Pre-LN."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__(cfg, layer_id)
        self.is_post = layer_id <= math.floor(cfg.mixln_ratio * cfg.n_layers)

    def forward(self, h, rope):
        return (PostLNBlock.forward if self.is_post else PreLNBlock.forward)(self, h, rope)


@register("sandwich")
class SandwichBlock(PreLNBlock):
    """Sandwich-LN: h = h + Norm(F(Norm(h)))."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__(cfg, layer_id)
        self.attn_out_norm = self.make_norm(cfg)
        self.mlp_out_norm = self.make_norm(cfg)

    def forward(self, h, rope):
        h = self.attn_add(h, self.attn_out_norm(self.attn(self.attn_norm(h), rope)))
        h = self.mlp_add(h, self.mlp_out_norm(self.mlp(self.mlp_norm(h))))
        return h


@register("peri")
class PeriLNBlock(SandwichBlock):
    """Peri-LN (arXiv 2502.02732): the sandwich block, plus a norm on the embedding output."""

    embed_norm = True


@register("reordered")
class ReorderedBlock(PreLNBlock):
    """OLMo-2 style: h = h + Norm(F(h)); the norms sit on the branch outputs."""

    def forward(self, h, rope):
        h = self.attn_add(h, self.attn_norm(self.attn(h, rope)))
        h = self.mlp_add(h, self.mlp_norm(self.mlp(h)))
        return h


@register("layerscale")
class LayerScaleBlock(PreLNBlock):
    """LayerScale: h = h + diag(lambda) F(Norm(h)), lambda learnable per channel."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__(cfg, layer_id)
        self.attn_gain = nn.Parameter(torch.full((cfg.dim,), cfg.layerscale_init))
        self.mlp_gain = nn.Parameter(torch.full((cfg.dim,), cfg.layerscale_init))

    def forward(self, h, rope):
        h = self.attn_add(h, self.attn_gain * self.attn(self.attn_norm(h), rope))
        h = self.mlp_add(h, self.mlp_gain * self.mlp(self.mlp_norm(h)))
        return h


@register("skipinit")
class SkipInitBlock(PreLNBlock):
    """SkipInit: h = h + alpha F(Norm(h)), alpha a learnable scalar per branch."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__(cfg, layer_id)
        self.attn_gain = nn.Parameter(torch.tensor(cfg.skip_alpha_init))
        self.mlp_gain = nn.Parameter(torch.tensor(cfg.skip_alpha_init))

    forward = LayerScaleBlock.forward


@register("rezero")
class ReZeroBlock(SkipInitBlock):
    """ReZero: h = h + alpha F(h), no norms in the block."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__(cfg, layer_id)
        self.attn_norm = self.mlp_norm = nn.Identity()


@register("dyt")
class DyTBlock(PreLNBlock):
    """Dynamic Tanh: every norm (the final one too) replaced by gamma * tanh(alpha x) + beta."""

    norm_cls = DyT
