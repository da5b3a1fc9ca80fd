"""Jacobians of the blocks and of the output, by random projections (vector-Jacobian products).

For u ~ N(0, I) on real tokens, E||J^T u||^2 = ||J||_F^2 and E||J^T u - u||^2 = ||J - I||_F^2, and E||u||^2 = n =
(real tokens) x d; the estimates divide by the probes' actual sum of ||u||^2:
- block_gain(l)      sqrt(||dh_{l+1}/dh_l||_F^2 / n): 1 for an identity block.
- block_vs_identity  sqrt(||dh_{l+1}/dh_l - I||_F^2 / n): 0 for an identity block; the paper's claim is that
                     deep Pre-LN blocks have this close to 0.
- output_gain(l)     sqrt(||dy/dh_l||_F^2 / n), y = final_norm(h_L): how much the output still hears block l's input.
The Jacobians are of whole sequences (attention mixes tokens); the heatmap is one token's own d x d block,
dh_{l+1}[t] / dh_l[t], on evenly spaced channels when the model is wide.
"""

from __future__ import annotations

import math

import torch

from depthlab.analysis.calibration import Batch, last_real_index
from depthlab.analysis.layers import LayeredLM, Trace


def _probe(shape, gen, m):
    return torch.randn(shape, generator=gen).to(m) * m


def block_jacobian(lm: LayeredLM, l: int, h: torch.Tensor, call, mask: torch.Tensor, probes: int = 4,
                   seed: int | None = None) -> tuple[float, float]:
    """(block_gain, block_vs_identity) of block l at input h (one batch). The probes are drawn from `seed`, by
    default l; layer-by-layer mode runs block j in a slot l (one per kind of attention) and passes seed=j, so
    block j gets whole-model mode's probes whatever its slot."""
    gen = torch.Generator().manual_seed(l if seed is None else seed)
    m = mask[..., None].to(h.dtype)
    gain = dist = norm = 0.0
    with torch.enable_grad():
        h = h.detach().requires_grad_(True)
        out = lm.run_block(l, h, call)
        for _ in range(probes):
            u = _probe(h.shape, gen, m)
            (g,) = torch.autograd.grad(out, h, u, retain_graph=True)
            gain += float((g * m).float().pow(2).sum())
            dist += float(((g - u) * m).float().pow(2).sum())
            norm += float(u.float().pow(2).sum())
    # ratios to the probes' actual squared norm (not its expectation), so an identity block gives exactly 1 and 0
    return math.sqrt(gain / norm), math.sqrt(dist / norm)


def output_jacobian(lm: LayeredLM, batch: Batch, tr: Trace, probes: int = 4, seed: int = 0) -> list[float]:
    """output_gain(l) for every stream state l = 0..L: one graph through all blocks, one backward per probe
    gives dy/dh_l for every l at once."""
    gen = torch.Generator().manual_seed(seed)
    m = batch.mask[..., None].to(tr.hidden[0].dtype)
    sq, norm = [0.0] * (lm.n_layers + 1), 0.0
    with torch.enable_grad():
        hs = [tr.hidden[0].detach().requires_grad_(True)]
        for j in range(lm.n_layers):
            hs.append(lm.run_block(j, hs[-1], tr.calls[j]))
        y = lm.final_norm(hs[-1])
        for _ in range(probes):
            u = _probe(y.shape, gen, m)
            norm += float(u.float().pow(2).sum())
            for l, g in enumerate(torch.autograd.grad(y, hs, u, retain_graph=True)):
                sq[l] += float((g * m).float().pow(2).sum())
    return [math.sqrt(s / norm) for s in sq]


def token_jacobian(lm: LayeredLM, l: int, h: torch.Tensor, call, mask: torch.Tensor, channels: int = 48) -> dict:
    """dh_{l+1}[t, c_out] / dh_l[t, c_in] for the last real token t of the first sequence, on <= `channels`
    evenly spaced channels (rows: output channel, columns: input channel)."""
    d = h.shape[-1]
    idx = torch.linspace(0, d - 1, min(channels, d)).round().long().unique()
    t = int(last_real_index(mask)[0])
    rows = []
    with torch.enable_grad():
        h = h.detach().requires_grad_(True)
        out = lm.run_block(l, h, call)
        for c in idx.tolist():
            u = torch.zeros_like(out)
            u[0, t, c] = 1
            (g,) = torch.autograd.grad(out, h, u, retain_graph=True)
            rows.append(g[0, t, idx.to(g.device)].float().cpu())
    J = torch.stack(rows)
    return {"block": l + 1, "token_position": t, "channels": idx.tolist(), "matrix": J.tolist(),
            "identity_distance": float((J - torch.eye(len(idx))).norm() / math.sqrt(len(idx)))}
