"""LLaMA building blocks: RMSNorm, DyT, OLMo-1's LayerNorm, RoPE, attention, SwiGLU MLP, the residual add and GPAS.

Architecture only: no training plumbing. The blocks of every normalization scheme are assembled from these
parts in `schemes.py`. Numerics follow Hugging Face's Llama exactly (fp32 RMSNorm statistics, rotate-half RoPE)
so that weights move between the two with identical logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from depthlab.config import ModelConfig
from depthlab.model.arch import arch_of


class RMSNorm(nn.Module):
    """weight * x / rms(x), statistics in fp32. `scale` is a fixed, non-learned multiplier on the output
    (LayerNorm Scaling sets it to l^(-p)); since it is a constant it folds into `weight` at export."""

    def __init__(self, dim: int, eps: float = 1e-6, scale: float = 1.0):
        super().__init__()
        self.eps = eps
        self.scale = scale
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFn.apply(x, self.weight, self.eps, self.scale)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}" + (f", scale={self.scale:.4g}" if self.scale != 1.0 else "")


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm with HF Llama's forward operations (bitwise the same output) that saves only its input and the
    per-row 1/rms for backward; autograd's own graph also keeps the normalised x (one more activation per norm)."""

    @staticmethod
    def forward(ctx, x, weight, eps: float, scale: float):
        dtype = x.dtype
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        out = weight * (xf * rstd).to(dtype)
        ctx.save_for_backward(x, weight, rstd)
        ctx.scale = scale
        return out if scale == 1.0 else out * scale

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        xd = xhat.to(x.dtype)
        grad = grad if ctx.scale == 1.0 else grad * ctx.scale
        grad_w = (grad * xd).sum(dim=tuple(range(grad.dim() - 1))).to(weight.dtype)
        gx = (grad * weight).to(x.dtype).float()
        grad_x = rstd * (gx - xhat * (gx * xhat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_w, None, None


class _SiluMul(torch.autograd.Function):
    """silu(gate) * up saving only gate and up (autograd's graph also keeps silu(gate)); backward in fp32."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        g, x, u = grad.float(), gate.float(), up.float()
        sig = torch.sigmoid(x)
        grad_gate = g * u * sig * (1 + x * (1 - sig))
        return grad_gate.to(gate.dtype), (g * x * sig).to(up.dtype)


class LayerNorm(nn.Module):
    """LayerNorm, statistics in fp32: (x - mean) / sqrt(var + eps), then weight and bias when affine (the ViT's),
    none for OLMo-1's non-parametric one. `scale` as in RMSNorm: it folds into weight and bias, or, with no weight,
    into the linear layers reading the output."""

    def __init__(self, dim: int, eps: float = 1e-5, scale: float = 1.0, affine: bool = False):
        super().__init__()
        self.dim, self.eps, self.scale = dim, eps, scale
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = (None, None) if self.weight is None else (self.weight.float(), self.bias.float())
        out = F.layer_norm(x.float(), (self.dim,), w, b, self.eps).to(x.dtype)
        return out if self.scale == 1.0 else out * self.scale

    def extra_repr(self) -> str:
        return (f"{self.dim}, eps={self.eps}" + (", no weight" if self.weight is None else "")
                + (f", scale={self.scale:.4g}" if self.scale != 1.0 else ""))


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
    """Causal self-attention with RoPE and grouped-query heads. What the families change (depthlab.model.arch):
    biases on q, k, v (qwen2, vit) and o (vit); RMSNorm on q and on k over all heads, before RoPE (olmo2's
    QK-norm); q, k, v clamped to [-clip_qkv, clip_qkv] (olmo, when model.clip_qkv is set); bidirectional without
    RoPE (vit: called with rope=None)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        arch = arch_of(cfg)
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.n_kv_heads = cfg.n_kv_heads or cfg.n_heads
        self.clip_qkv = cfg.clip_qkv
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.dim, q_dim, bias=arch.qkv_bias)
        self.k_proj = nn.Linear(cfg.dim, kv_dim, bias=arch.qkv_bias)
        self.v_proj = nn.Linear(cfg.dim, kv_dim, bias=arch.qkv_bias)
        self.o_proj = nn.Linear(q_dim, cfg.dim, bias=arch.out_bias)
        self.causal = arch.causal
        qk_norm = arch.qk_norm
        self.q_norm = RMSNorm(q_dim, cfg.norm_eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(kv_dim, cfg.norm_eps) if qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        q = self.q_norm(q).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_norm(k).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); for the vit family the original ViT's down(gelu(up(x))), with biases."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        arch = arch_of(cfg)
        self.gelu = arch.mlp == "gelu"
        self.gate_proj = None if self.gelu else nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=arch.out_bias)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.dim, bias=arch.out_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gelu:
            return self.down_proj(F.gelu(self.up_proj(x)))
        return self.down_proj(_SiluMul.apply(self.gate_proj(x), self.up_proj(x)))


class Residual(nn.Module):
    """The residual add `alpha * h + update`, as a module so diagnostics can hook it without editing forward.
    alpha is 1 except for DeepNorm."""

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, h: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        return (h if self.alpha == 1.0 else self.alpha * h) + update


class GPASGate(nn.Module):
    """Gradient-Preserving Activation Scaling (arXiv 2506.22049): x - SiLU(a) * stopgrad(x), so the forward pass
    scales the stream by 1 - SiLU(a) and the backward pass sees it unscaled. One learnable scalar a, from 0."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - F.silu(self.gate) * x.detach()


GPAS_GATES = ("per_block", "per_add")  # model.gpas_gate: one gate shared by a block's two adds, or one per add


class GPASResidual(Residual):
    """The residual add followed by GPAS. `shared` is a gate registered elsewhere (on the block, so that the state
    dict holds it once: safetensors refuses two entries sharing storage); without it the add owns its own gate."""

    def __init__(self, alpha: float = 1.0, shared: GPASGate | None = None):
        super().__init__(alpha)
        if shared is None:
            self.gpas = GPASGate()
        else:
            object.__setattr__(self, "gpas", shared)  # a plain reference, not a child module

    @property
    def gate(self) -> nn.Parameter:
        return self.gpas.gate

    def extra_repr(self) -> str:
        return "" if "gpas" in self._modules else "gate shared: the block's gpas"

    def forward(self, h: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        return self.gpas(super().forward(h, update))
