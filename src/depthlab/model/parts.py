"""LLaMA building blocks: RMSNorm, DyT, OLMo-1's LayerNorm, RoPE, attention, the gated MLP, the residual add, the
stream scalars and GPAS.

Architecture only: no training plumbing. The blocks of every normalization scheme are assembled from these
parts in `schemes.py`, each family (depthlab.model.families) choosing its variant of each part. Numerics follow
Hugging Face's Llama exactly (fp32 RMSNorm statistics, rotate-half RoPE) so that weights move between the two with
identical logits.
"""

from __future__ import annotations

import functools

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
        return _RMSNormFn.apply(x, self.weight, self.eps, self.scale)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}" + (f", scale={self.scale:.4g}" if self.scale != 1.0 else "")


def _rms_out(xf: torch.Tensor, dtype: torch.dtype, weight: torch.Tensor, rstd: torch.Tensor, scale: float):
    """RMSNorm's output from its fp32 input xf (of dtype `dtype`) and 1/rms, with HF Llama's operations: the
    norm's forward, and the recomputation by a projection that reads it (_Project), bitwise the same."""
    out = weight * (xf * rstd).to(dtype)
    return out if scale == 1.0 else out * scale


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm with HF Llama's forward operations (bitwise the same output) that saves only its input and the
    per-row 1/rms for backward. The projections reading its output (_Project) save nothing more: they recompute
    it from what the norm saved."""

    @staticmethod
    def forward(ctx, x, weight, eps: float, scale: float):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.scale = scale
        return _rms_out(xf, x.dtype, weight, rstd, scale)

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


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a linear layer computes in: autocast's when autocast is on for x's device, else x's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _costly_unpack() -> bool:
    """Whether reading a node's saved tensors now runs an unpack hook that costs: non-reentrant checkpointing's
    recomputes the whole checkpointed block (during the forward, keeping that copy until backward), save_on_cpu's
    copies back to the device; and the block's recomputation in backward must save what its forward saved. Plain
    hooks (a test's byte counter) unpack for free."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    return hooks is not None and hooks[0].__qualname__.split(".")[0] in COSTLY_HOOKS


COSTLY_HOOKS = ("_checkpoint_hook", "_recomputation_hook", "save_on_cpu")  # torch.utils.checkpoint, autograd.graph


def _norm_source(x: torch.Tensor) -> tuple | None:
    """(input, weight, 1/rms, scale) of the RMSNorm whose output x is, as that norm saved them for its backward;
    None when x is no RMSNorm's output, under torch.compile (whose partitioner decides what is saved), and inside
    activation checkpointing or CPU offload of saved tensors (_costly_unpack)."""
    if torch.compiler.is_compiling() or _costly_unpack():
        return None
    node = x.grad_fn
    if node is None or not isinstance(node, _RMSNormFn._backward_cls):
        return None
    try:
        return (*node.saved_tensors, node.scale)
    except RuntimeError:  # the norm's graph was already run backward and freed: x is then saved as it is
        return None


class _Project(torch.autograd.Function):
    """Linear projections of one input, (F.linear(x, w_i, b_i) for each i), as autocast computes them (x and the
    weights in the compute dtype). What autocast's linears would save for backward -- a copy of x per projection
    and a low-precision copy of every weight -- is replaced by the weights themselves (recast in backward) and
    one copy of x in the compute dtype; or, when x is an RMSNorm's output, by nothing: x is recomputed in backward
    from the input and 1/rms the norm keeps anyway. The input's gradient is summed in x's own dtype, as autograd
    does through autocast's casts."""

    @staticmethod
    def forward(ctx, x, dtype: torch.dtype, *params):
        xc = x.to(dtype)
        weights, biases = params[0::2], params[1::2]
        outs = tuple(F.linear(xc, w.to(dtype), None if b is None else b.to(dtype)) for w, b in zip(weights, biases))
        norm = _norm_source(x)
        ctx.norm_scale = None if norm is None else norm[-1]
        ctx.save_for_backward(*((xc,) if norm is None else norm[:-1]), *weights)
        ctx.dtype, ctx.x_dtype, ctx.bias_dtypes = dtype, x.dtype, [None if b is None else b.dtype for b in biases]
        return outs

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        if ctx.norm_scale is None:
            xc, weights = saved[0], saved[1:]
        else:
            (x, norm_w, rstd), weights = saved[:3], saved[3:]
            xc = _rms_out(x.float(), x.dtype, norm_w, rstd, ctx.norm_scale).to(ctx.dtype)
        x2 = xc.reshape(-1, xc.shape[-1])
        grad_x, grad_params = None, []
        for i, (w, g, b_dtype) in enumerate(zip(weights, grads, ctx.bias_dtypes)):
            g = g.to(xc.dtype)
            g2 = g.reshape(-1, g.shape[-1])
            need_w, need_b = ctx.needs_input_grad[2 + 2 * i], ctx.needs_input_grad[3 + 2 * i]
            grad_params.append((g2.t() @ x2).to(w.dtype) if need_w else None)
            grad_params.append(g2.sum(0).to(b_dtype) if need_b else None)
            if ctx.needs_input_grad[0]:
                gx = (g @ w.to(xc.dtype)).to(ctx.x_dtype)
                grad_x = gx if grad_x is None else grad_x.add_(gx)  # grad_x: this backward's own tensor
        return grad_x, None, *grad_params


def project(x: torch.Tensor, *linears: nn.Linear) -> tuple[torch.Tensor, ...]:
    """(linear(x) for each linear), as nn.Linear under autocast computes them, saving for backward at most one
    copy of x and no copy of a weight (see _Project). A projection that is not a plain nn.Linear (a LoRA adapter's
    wrapper, depthlab.model.lora) is called as the module it is: reading its weight would skip the adapter."""
    if not all(type(lin) is nn.Linear for lin in linears):
        return tuple(lin(x) for lin in linears)
    params = [t for lin in linears for t in (lin.weight, lin.bias)]
    return _Project.apply(x, compute_dtype(x), *params)


def _silu_mul_grad(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of silu(gate) * up with respect to gate and up, computed in fp32, returned in their dtype."""
    g, x, u = grad.float(), gate.float(), up.float()
    sig = torch.sigmoid(x)
    grad_up = (g * x).mul_(sig).to(up.dtype)
    tail = (1 - sig).mul_(x).add_(1)  # 1 + x (1 - sig)
    grad_gate = (g * u).mul_(sig).mul_(tail).to(gate.dtype)
    return grad_gate, grad_up


class _SwiGLUDown(torch.autograd.Function):
    """down(silu(gate) * up) in gate's dtype (weight and bias cast to it, as autocast does) that saves only gate,
    up and the weight: the product is recomputed in backward for the weight's gradient, the weight recast."""

    @staticmethod
    def forward(ctx, gate, up, weight, bias):
        dtype = gate.dtype
        prod = F.silu(gate).mul_(up)
        ctx.save_for_backward(gate, up, weight)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return F.linear(prod, weight.to(dtype), None if bias is None else bias.to(dtype))

    @staticmethod
    def backward(ctx, grad):
        gate, up, weight = ctx.saved_tensors
        g = grad.to(gate.dtype)
        g2 = g.reshape(-1, g.shape[-1])
        grad_w = grad_b = None
        if ctx.needs_input_grad[2]:
            prod = F.silu(gate).mul_(up)
            grad_w = (g2.t() @ prod.reshape(-1, prod.shape[-1])).to(weight.dtype)
            del prod
        if ctx.needs_input_grad[3]:
            grad_b = g2.sum(0).to(ctx.bias_dtype)
        grad_gate, grad_up = _silu_mul_grad(g @ weight.to(gate.dtype), gate, up)
        return grad_gate, grad_up, grad_w, grad_b


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
    """Causal self-attention with RoPE and grouped-query heads. The families' variants (depthlab.model.families)
    are arguments: biases on q, k, v (qwen2, vit) and o (vit); RMSNorm on q and on k over all heads, before RoPE
    (olmo2's QK-norm); bidirectional without RoPE (vit: called with rope=None); a sliding window of `window` keys
    (mistral, gemma2's every other layer); the scores soft-capped as softcap * tanh(s / softcap) and scaled by
    query_scale^(-1/2) instead of head_dim^(-1/2) (gemma2). q, k, v are clamped to [-clip_qkv, clip_qkv] when
    model.clip_qkv is set (olmo)."""

    def __init__(self, cfg: ModelConfig, qkv_bias: bool = False, out_bias: bool = False, qk_norm: bool = False,
                 causal: bool = True, window: int | None = None, softcap: float | None = None,
                 query_scale: float | None = None):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.n_kv_heads = cfg.n_kv_heads or cfg.n_heads
        self.clip_qkv = cfg.clip_qkv
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.dim, q_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(cfg.dim, kv_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(cfg.dim, kv_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(q_dim, cfg.dim, bias=out_bias)
        self.causal = causal
        self.q_norm = RMSNorm(q_dim, cfg.norm_eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(kv_dim, cfg.norm_eps) if qk_norm else nn.Identity()
        self.window, self.softcap = window, softcap
        self.scale = None if query_scale is None else query_scale ** -0.5  # None: SDPA's own 1/sqrt(head_dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = project(x, self.q_proj, self.k_proj, self.v_proj)
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        q = self.q_norm(q).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_norm(k).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = self.attend(q, k, v)
        return project(y.transpose(1, 2).reshape(B, T, -1), self.o_proj)[0]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(head_dim)) v over the keys each query sees: itself and every earlier one (causal)
        or all of them, and of those only the last `window` (the query's own included). q: (B, H, T, D); k, v:
        (B, H_kv, T, D). Soft-capped scores are computed as transformers' eager attention does (SDPA has no cap)."""
        gqa = self.n_kv_heads != self.n_heads
        T = q.shape[-2]
        window = self.window if self.window is not None and T > self.window else None  # else every key is inside
        visible = None
        if window is not None or (self.softcap is not None and self.causal):
            i = torch.arange(T, device=q.device)
            back = i[:, None] - i[None, :]  # query index - key index
            visible = (back >= 0) & (back < (window or T)) if self.causal else back.abs() < (window or T)
        if self.softcap is None:
            if visible is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=gqa, scale=self.scale)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=gqa, scale=self.scale)
        if gqa:
            k, v = (t.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1) for t in (k, v))
        scores = softcap(q @ k.transpose(-2, -1) * (self.scale or self.head_dim ** -0.5), self.softcap)
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        return F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v

    def extra_repr(self) -> str:
        parts = {"window": self.window, "softcap": self.softcap, "scale": self.scale}
        return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in parts.items() if v is not None)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap): x kept within (-cap, cap), nearly unchanged where |x| << cap (Gemma-2's scores and
    logits), in transformers' order of operations."""
    return torch.tanh(x / cap) * cap


ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}


class MLP(nn.Module):
    """Gated: down(act(gate(x)) * up(x)), SwiGLU with silu (LLaMA), GeGLU with gelu_tanh (Gemma-2); not gated:
    down(act(up(x))), the original ViT's with gelu. bias: on up and down (the vit family's)."""

    def __init__(self, cfg: ModelConfig, gated: bool = True, activation: str = "silu", bias: bool = False):
        super().__init__()
        self.activation = activation
        self.gate_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False) if gated else None
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=bias)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = ACTIVATIONS[self.activation]
        if self.gate_proj is None:
            return self.down_proj(act(self.up_proj(x)))
        gate, up = project(x, self.gate_proj, self.up_proj)
        if type(self.down_proj) is not nn.Linear or self.activation != "silu":  # a LoRA adapter's wrapper (see
            return self.down_proj(act(gate) * up)  # project), or an activation _SwiGLUDown does not compute
        return _SwiGLUDown.apply(gate, up, self.down_proj.weight, self.down_proj.bias)

    def extra_repr(self) -> str:
        return f"{'gated, ' * (self.gate_proj is not None)}{self.activation}"


class Residual(nn.Module):
    """The residual add `alpha * h + branch_multiplier * ramp * update`, as a module so diagnostics can hook it
    without editing forward. alpha is 1 except for DeepNorm; branch_multiplier is the scheme's constant on the
    branch (LNS's branch placement, the depth parameterizations' m^(-alpha), a static 1/L ...;
    depthlab.model.depth), 1 by default; ramp is ProRes's warm-up a(l, t), a buffer the optimizer advances
    (persistent: a checkpoint keeps where the warm-up stood), None without ProRes. Where a factor is 1 or None, no
    multiplication happens at all."""

    def __init__(self, alpha: float = 1.0, branch_multiplier: float = 1.0, ramp: bool = False):
        super().__init__()
        self.alpha, self.branch_multiplier = alpha, branch_multiplier
        self.register_buffer("ramp", torch.zeros(()) if ramp else None)

    @property
    def branch_multiplier_now(self) -> float:
        """branch_multiplier times the ramp as it stands (what export folds into the output projection)."""
        return self.branch_multiplier * (1.0 if self.ramp is None else float(self.ramp))

    def forward(self, h: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        if self.branch_multiplier != 1.0:
            update = update * self.branch_multiplier
        if self.ramp is not None:
            update = update * self.ramp
        return (h if self.alpha == 1.0 else self.alpha * h) + update

    def extra_repr(self) -> str:
        return ", ".join([f"alpha={self.alpha:.4g}"] * (self.alpha != 1.0) + [
            f"branch_multiplier={self.branch_multiplier:.4g}"] * (self.branch_multiplier != 1.0) +
            ["ramp"] * (self.ramp is not None))


class StreamMix(nn.Module):
    """The stream as a block reads it: resid_lambda * h + x0_lambda * x0, x0 the embedding output (the stream
    entering block 1). Each of the two learnable scalars is present only when its option is on (model.resid_lambda,
    model.x0_lambda); without one its term is h (or nothing). nanochat's per-layer scalars (docs/method.md)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # one element, not 0-d (FSDP2 shards dim 0 and refuses scalars); torch.full, not torch.empty: a meta-device
        # build keeps the value (depthlab.model.meta)
        self.resid_lambda = nn.Parameter(torch.full((1,), float(cfg.resid_lambda_init))) if cfg.resid_lambda else None
        self.x0_lambda = nn.Parameter(torch.full((1,), float(cfg.x0_lambda_init))) if cfg.x0_lambda else None

    def forward(self, h: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        if self.resid_lambda is not None:
            h = self.resid_lambda.to(h.dtype) * h
        if self.x0_lambda is not None:
            h = h + self.x0_lambda.to(h.dtype) * x0
        return h


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

    def __init__(self, alpha: float = 1.0, shared: GPASGate | None = None, branch_multiplier: float = 1.0,
                 ramp: bool = False):
        super().__init__(alpha, branch_multiplier, ramp)
        if shared is None:
            self.gpas = GPASGate()
        else:
            object.__setattr__(self, "gpas", shared)  # a plain reference, not a child module

    @property
    def gate(self) -> nn.Parameter:
        return self.gpas.gate

    def extra_repr(self) -> str:
        own = super().extra_repr()
        return own if "gpas" in self._modules else ", ".join(filter(None, [own, "gate shared: the block's gpas"]))

    def forward(self, h: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        return self.gpas(super().forward(h, update))
