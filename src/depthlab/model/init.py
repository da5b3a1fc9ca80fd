"""Weight initialisation, one function per method, chosen by name (`model.init`).

Only Linear and Embedding weights are drawn here; biases (qwen2's q/k/v) start at 0, norm weights at 1, and each
scheme's own parameters (LayerScale gains, SkipInit alphas, GPAS gates, DyT alphas) at the values their modules
set.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from depthlab.config import ModelConfig
from depthlab.model.depth import uniform_gain
from depthlab.model.schemes import deepnorm_beta, scheme_class

OUTPUT_PROJECTIONS = ("o_proj", "down_proj")  # the projections that write into the residual stream


def _named_linears(model: nn.Module):
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            yield name, module


def _block_index(name: str) -> int | None:
    """1-based block index for a parameter name like `layers.3.attn.o_proj`, else None."""
    parts = name.split(".")
    return int(parts[1]) + 1 if parts[0] == "layers" else None


def fill_(param: torch.Tensor, draw) -> None:
    """draw(t) fills t in place. A parameter that is not a plain CPU tensor (a meta-device build materialised on
    its device, or one rank's shard of it) is drawn whole on the CPU, the same numbers an eager CPU build draws
    from the same generator state, and keeps its own part: the values do not depend on how the model is
    sharded."""
    if param.device.type == "cpu" and not hasattr(param, "device_mesh"):
        draw(param)
        return
    full = torch.empty(param.shape, dtype=param.dtype)
    draw(full)
    if hasattr(param, "device_mesh"):  # a DTensor: this rank's part, cut as the sharding cuts it
        from torch.distributed.tensor import distribute_tensor

        part = distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(part.to_local())
    else:
        param.copy_(full)


PIECE = 1 << 22  # elements per piece of a piecewise draw (a multiple of 16)


def _local_span(param: torch.Tensor):
    """(this rank's elements as a flat view, their first and past-the-end index in the flattened whole), or None
    for a layout other than whole rows (replicated, or sharded along dim 0, as FSDP shards)."""
    if not hasattr(param, "device_mesh"):
        return param.view(-1), 0, param.numel()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not all(p.is_replicate() or (p.is_shard() and p.dim == 0) for p in param.placements):
        return None
    local = param.to_local()
    if not local.is_contiguous():
        return None
    _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    start = offset[0] * math.prod(param.shape[1:]) if param.dim() else 0
    return local.view(-1), start, start + local.numel()


def fill_normal_(param: torch.Tensor, std: float) -> None:
    """param.normal_(0, std), the same numbers for a parameter that is not a plain CPU tensor (a meta-device build
    materialised on its device, or one rank's shard of it), without holding it whole: the CPU generator draws the
    same numbers piece by piece when every piece but the last is a multiple of 16 long and the last is at least
    16, so the flattened parameter is drawn in pieces and each rank keeps what it holds."""
    if param.device.type == "cpu" and not hasattr(param, "device_mesh"):
        param.normal_(0.0, std)
        return
    span = _local_span(param)
    if span is None:
        fill_(param, lambda t: t.normal_(0.0, std))
        return
    local, lo, hi = span
    n = param.numel()
    bounds = [*range(0, n, PIECE), n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < 16:
        del bounds[-2]
    for a, b in zip(bounds, bounds[1:], strict=False):
        piece = torch.empty(b - a).normal_(0.0, std)
        first, last = max(a, lo), min(b, hi)
        if first < last:
            local[first - lo:last - lo].copy_(piece[first - a:last - a])


def init_normal(model: nn.Module, cfg: ModelConfig, out_std=None) -> None:
    """N(0, init_std) everywhere, N(0, embed_std) for the token embedding; out_std(name) overrides the std of
    output projections."""
    for name, lin in _named_linears(model):
        std = cfg.weight_std
        if out_std is not None and name.endswith(OUTPUT_PROJECTIONS):
            std = out_std(name)
        fill_normal_(lin.weight, std)
    init_embedding(model, cfg)


def init_embedding(model: nn.Module, cfg: ModelConfig) -> None:
    """N(0, embed_std), or N(0, init_std) when the embedding is also the LM head: a tied head with the paper's
    embedding std 0.632 would start with logits of std ~0.632 * sqrt(dim) and a loss far above ln V."""
    if isinstance(getattr(model, "embed_tokens", None), nn.Embedding):  # a ViT's patch embedding is a Linear
        std = cfg.weight_std if cfg.tie_embeddings else cfg.embed_std
        fill_normal_(model.embed_tokens.weight, std)


def init_scaled(model: nn.Module, cfg: ModelConfig) -> None:
    """GPT-2 / Megatron scaled init: output projections sigma / sqrt(2N)."""
    init_normal(model, cfg, out_std=lambda name: cfg.weight_std / math.sqrt(2 * cfg.n_layers))


def init_depth_scaled(model: nn.Module, cfg: ModelConfig) -> None:
    """Depth-scaled init: block l's output projections sigma / sqrt(2l)."""
    init_normal(model, cfg, out_std=lambda name: cfg.weight_std / math.sqrt(2 * _block_index(name)))


def init_deepnorm(model: nn.Module, cfg: ModelConfig) -> None:
    """DeepNet: Xavier-normal, gain beta = (8N)^(-1/4) on v, o and the MLP weights, gain 1 on q and k."""
    beta = deepnorm_beta(cfg.n_layers)
    for name, lin in _named_linears(model):
        if name.startswith("layers."):
            gain = 1.0 if name.endswith(("q_proj", "k_proj")) else beta
            fan_out, fan_in = lin.weight.shape  # as nn.init.xavier_normal_ computes its std
            fill_normal_(lin.weight, gain * math.sqrt(2.0 / (fan_in + fan_out)))
        else:
            fill_normal_(lin.weight, cfg.weight_std)
    init_embedding(model, cfg)


INITS = {"normal": init_normal, "scaled": init_scaled, "depth_scaled": init_depth_scaled, "deepnorm": init_deepnorm}


def resolve_init(cfg: ModelConfig) -> str:
    """The init method's name: model.init, or the scheme's default_init for auto."""
    return scheme_class(cfg.norm_scheme).default_init if cfg.init == "auto" else cfg.init


@torch.no_grad()
def init_weights(model: nn.Module, cfg: ModelConfig) -> None:
    method = resolve_init(cfg)
    warning = scheme_class(cfg.norm_scheme).init_warnings.get(method)
    if warning:
        warnings.warn(warning, stacklevel=2)
    INITS[method](model, cfg)
    for _, lin in _named_linears(model):
        if lin.bias is not None:
            fill_(lin.bias, nn.init.zeros_)
    rule = str(cfg.norm_gain_init)
    if rule in ("depth", "uniform"):  # uniform: LNS's mean damping without its depth profile (the control)
        for gain, scale in block_norm_gains(model, cfg.lns_power):
            gain.fill_(scale if rule == "depth" else uniform_gain(cfg))


def block_norm_gains(model: nn.Module, power: float) -> list[tuple[nn.Parameter, float]]:
    """Each block's norm gains where LNS's scale sits (the weights of attn_norm and mlp_norm; in a block with a
    norm before and after each branch, of the norms after: gemma2's lns) with l^(-power), l the block's 1-based
    index: what model.norm_gain_init=depth starts them at and train.norm_gain_lr=depth scales their learning rate
    by. Under Adam without weight decay on gains, both together train Pre-LN exactly as LNS (docs/method.md)."""
    out = []
    for block in model.modules():
        if not hasattr(block, "layer_id"):
            continue
        names = ("attn_out_norm", "mlp_out_norm") if getattr(block, "sandwiched", False) else ("attn_norm", "mlp_norm")
        for norm in (getattr(block, name, None) for name in names):
            if isinstance(getattr(norm, "weight", None), nn.Parameter):
                out.append((norm.weight, block.layer_id ** -power))
    return out
