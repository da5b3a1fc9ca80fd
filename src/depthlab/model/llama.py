"""LLaMA building blocks: RMSNorm, RoPE, attention, SwiGLU MLP, the residual add, and the Pre-LN block.

Architecture only: no training plumbing. Every normalization scheme in `schemes.py` is a small subclass of
`PreLNBlock`. Numerics follow Hugging Face's Llama exactly (fp32 RMSNorm statistics, rotate-half RoPE) so that
weights move between the two with identical logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from depthlab.config import ModelConfig


class RMSNorm(nn.Module):
    """weight * x / rms(x), statistics in fp32. `scale` is a fixed, non-learned multiplier on the output
    (LayerNorm Scaling sets it to l^(-p)); since it is a constant it folds into `weight` at export."""

    def __init__(self, dim: int, eps: float = 1e-6, scale: float = 1.0):
        super().__init__()
        self.eps = eps
        self.scale = scale
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * x.to(dtype)
        return out if self.scale == 1.0 else out * self.scale

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}" + (f", scale={self.scale:.4g}" if self.scale != 1.0 else "")


class DyT(nn.Module):
    """Dynamic Tanh (arXiv 2503.10622): gamma * tanh(alpha * x) + beta, a drop-in replacement for a norm."""

    def __init__(self, dim: int, alpha_init: float = 0.5, scale: float = 1.0):
        super().__init__()
        self.scale = scale
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.weight * torch.tanh(self.alpha * x) + self.bias
        return out if self.scale == 1.0 else out * self.scale


def rope_cache(head_dim: int, max_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, D); cos/sin: (T, D). Rotate-half convention, as in Hugging Face Llama."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.n_kv_heads = cfg.n_kv_heads or cfg.n_heads
        self.q_proj = nn.Linear(cfg.dim, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Residual(nn.Module):
    """The residual add `alpha * h + update`, as a module so diagnostics can hook it without editing forward.
    alpha is 1 except for DeepNorm."""

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, h: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        return (h if self.alpha == 1.0 else self.alpha * h) + update


class GPASResidual(Residual):
    """Gradient-Preserving Activation Scaling (arXiv 2506.22049): the forward pass scales the stream by
    1 - SiLU(a), the backward pass sees it unscaled: x - SiLU(a) * stopgrad(x)."""

    def __init__(self, alpha: float = 1.0):
        super().__init__(alpha)
        self.gate = nn.Parameter(torch.zeros(()))

    def forward(self, h: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        x = super().forward(h, update)
        return x - F.silu(self.gate) * x.detach()


class PreLNBlock(nn.Module):
    """The vanilla Pre-LN block; every scheme in schemes.py is a small variant of it.

        h ─┬──────────────────────(+)─┬──────────────────────(+)─>
           └─ attn_norm ─ attn ────┘  └─ mlp_norm ─ mlp ──────┘

    layer_id is 1-based (LayerNorm Scaling counts blocks from 1).
    """

    norm_cls: type[nn.Module] = RMSNorm  # DyT swaps this; the model's final norm uses it too
    embed_norm: bool = False  # Peri-LN also normalises the embedding output

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.attn_norm = self.make_norm(cfg)
        self.attn = Attention(cfg)
        self.mlp_norm = self.make_norm(cfg)
        self.mlp = MLP(cfg)
        residual = GPASResidual if cfg.gpas else Residual
        self.attn_add = residual()
        self.mlp_add = residual()

    @classmethod
    def make_norm(cls, cfg: ModelConfig) -> nn.Module:
        if cls.norm_cls is DyT:
            return DyT(cfg.dim, cfg.dyt_alpha_init)
        return RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        h = self.attn_add(h, self.attn(self.attn_norm(h), rope))
        h = self.mlp_add(h, self.mlp(self.mlp_norm(h)))
        return h
