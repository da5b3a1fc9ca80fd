"""The language-model loss, with and without the full logits.

`lm_loss(logits, targets)` is the cross-entropy of logits a model returned, in fp32 (the logits are upcast).

`linear_cross_entropy(h, weight, targets, chunk)` is the same loss of `logits = h @ weight.T` that never holds
the (tokens x vocab) logits: it runs the LM head and the cross-entropy `chunk` tokens at a time and, in the same
pass, turns each chunk's logit gradient (softmax - one-hot) into its share of dL/dh and dL/dweight, then frees
it -- the approach of Liger-Kernel's fused linear cross-entropy, in plain PyTorch. The FLOPs are those of the
unchunked head (nothing is recomputed in backward); the memory for logits is one chunk's (chunk x vocab) fp32
instead of several (batch x seq x vocab) tensors (logits, their fp32 copy, log-softmax, and their gradients).
Numerics follow `lm_loss(F.linear(h, weight), targets)`: the head's matmuls run in the autocast dtype when
autocast is on, the softmax and the loss in fp32; targets equal to -100 are ignored, as F.cross_entropy does.
With `softcap` the logits are capped first, softcap * tanh(z / softcap) (Gemma-2's final soft-capping), in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from depthlab.model.parts import softcap as capped

IGNORE_INDEX = -100


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), reduction=reduction)


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = 1024,
                         reduction: str = "mean", softcap: float | None = None) -> torch.Tensor:
    """Cross-entropy of `h @ weight.T` (h: (..., D), weight: (V, D), targets: h's shape without D), `chunk`
    tokens at a time; chunk 0 (or a chunk covering every token) computes the full logits as `lm_loss` does."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be mean or sum, got {reduction!r}")
    h, targets = h.flatten(0, -2), targets.flatten()
    if chunk <= 0 or chunk >= len(h):
        logits = F.linear(h, weight)
        return lm_loss(logits if softcap is None else capped(logits.float(), softcap), targets, reduction)
    device = h.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h, weight, targets, chunk, dtype, reduction, softcap)
    with torch.autocast(device, enabled=False):
        w = weight.to(dtype)
        total = sum(_chunk_softmax(h[i:i + chunk].to(dtype), w, targets[i:i + chunk], softcap)[0]
                    for i in range(0, len(h), chunk))
    return total / _count(targets) if reduction == "mean" else total


def _count(targets: torch.Tensor) -> torch.Tensor:
    return (targets != IGNORE_INDEX).sum()


def _chunk_softmax(hc: torch.Tensor, w: torch.Tensor, targets: torch.Tensor,
                   softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(summed loss, softmax, and with softcap the capped logits' derivative 1 - tanh^2) of one chunk's logits
    hc @ w.T; ignored rows add nothing. The softmax is formed in place in the fp32 logits (for fp32 logits, the
    matmul's own output; low-precision logits are freed as soon as they are upcast): one (chunk x vocab) fp32
    buffer in all, two with softcap."""
    z = (hc @ w.t()).float()
    slope = None
    if softcap is not None:
        t = torch.tanh(z / softcap)
        z = t * softcap
        slope = t.square_().neg_().add_(1)  # d(capped)/dz = 1 - tanh^2
    picked = z.gather(1, targets.clamp_min(0)[:, None]).squeeze(1)
    top = z.amax(dim=-1)
    total = z.sub_(top[:, None]).exp_().sum(dim=-1)
    z.div_(total[:, None])
    loss = torch.where(targets != IGNORE_INDEX, total.log() + top - picked, 0.0)  # log-sum-exp - target logit
    return loss.sum(), z, slope


class _LinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and both gradients chunk by chunk; backward only scales them."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunk: int, dtype: torch.dtype, reduction: str, softcap: float | None):
        scale = 1.0 / _count(targets).clamp_min(1) if reduction == "mean" else torch.ones((), device=h.device)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        with torch.autocast(h.device.type, enabled=False):
            w = weight.to(dtype)
            for i in range(0, len(h), chunk):
                hc, tc = h[i:i + chunk].to(dtype), targets[i:i + chunk]
                loss, z, slope = _chunk_softmax(hc, w, tc, softcap)
                total += loss
                # dL/dz = (softmax(z) - onehot(target)) * scale, in place in the softmax's buffer
                valid = (tc != IGNORE_INDEX).to(z.dtype)
                z.scatter_add_(1, tc.clamp_min(0)[:, None], -valid[:, None])
                if slope is not None:  # through the cap: times 1 - tanh^2
                    z.mul_(slope)
                    del slope
                g = z.mul_((valid * scale)[:, None]).to(dtype)
                del z  # in low precision, the fp32 buffer goes before the matmuls
                if grad_h is not None:
                    grad_h[i:i + chunk] = g @ w
                if grad_w is not None and g.dtype == grad_w.dtype:
                    grad_w.addmm_(g.t(), hc)
                elif grad_w is not None:  # bf16 products, summed over chunks in the weight's fp32
                    grad_w.add_(g.t() @ hc)
                del g  # else this chunk's buffer would still be held while the next chunk's is made
        ctx.save_for_backward(grad_h, grad_w)
        ctx.used = False
        return total * scale

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if ctx.used:
            raise RuntimeError("linear_cross_entropy: backward can run once per forward (its gradients are "
                               "scaled in place)")
        ctx.used = True
        grad_h, grad_w = ctx.saved_tensors
        grads = [g.mul_(grad_out.to(g.dtype)) if g is not None else None for g in (grad_h, grad_w)]
        return *grads, None, None, None, None, None
