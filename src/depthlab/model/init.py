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


def init_normal(model: nn.Module, cfg: ModelConfig, out_std=None) -> None:
    """N(0, init_std) everywhere, N(0, embed_std) for the token embedding; out_std(name) overrides the std of
    output projections."""
    for name, lin in _named_linears(model):
        std = cfg.weight_std
        if out_std is not None and name.endswith(OUTPUT_PROJECTIONS):
            std = out_std(name)
        fill_(lin.weight, lambda t, std=std: nn.init.normal_(t, 0.0, std))
    init_embedding(model, cfg)


def init_embedding(model: nn.Module, cfg: ModelConfig) -> None:
    """N(0, embed_std), or N(0, init_std) when the embedding is also the LM head: a tied head with the paper's
    embedding std 0.632 would start with logits of std ~0.632 * sqrt(dim) and a loss far above ln V."""
    if isinstance(getattr(model, "embed_tokens", None), nn.Embedding):  # a ViT's patch embedding is a Linear
        std = cfg.weight_std if cfg.tie_embeddings else cfg.embed_std
        fill_(model.embed_tokens.weight, lambda t: nn.init.normal_(t, 0.0, std))


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
            fill_(lin.weight, lambda t, gain=gain: nn.init.xavier_normal_(t, gain=gain))
        else:
            fill_(lin.weight, lambda t: nn.init.normal_(t, 0.0, cfg.weight_std))
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
