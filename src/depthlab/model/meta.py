"""A model built on the meta device and given storage afterwards, with the weights an eager build draws: what FSDP
materialises shard by shard (depthlab.train.distributed) and layer-by-layer analysis draws into files
(depthlab.analysis.layerwise.init_skeleton)."""

from __future__ import annotations

import copy
import itertools

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from depthlab.config import ModelConfig
from depthlab.model.init import fill_
from depthlab.model.transformer import build_model


class _EmptyOnMeta(TorchFunctionMode):
    """torch.empty on the meta device: the storage constructors draw into (Linear and Embedding weights and
    biases), while what they make with ones / zeros / full / arange (norm gains, scheme constants, position
    tables) stays real, and small."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.empty:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def build_on_meta(cfg: ModelConfig) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """(the model on the meta device, its constructed values that are not drawn). The draws that the eager
    constructors make on the CPU generator are replayed, one module's worth of memory at a time, so that
    `materialize` continues the generator where an eager build_model(cfg) would: the same weights, bitwise."""
    with _EmptyOnMeta():
        model = build_model(cfg, init=False)
    for module in model.modules():
        if hasattr(module, "reset_parameters") and any(p.is_meta for p in module.parameters(recurse=False)):
            copy.deepcopy(module).to_empty(device="cpu").reset_parameters()
    tensors = itertools.chain(model.named_parameters(), model.named_buffers())
    constants = {name: t.detach().clone() for name, t in tensors if not t.is_meta}
    return model.to("meta"), constants


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device, constants: dict[str, torch.Tensor], storage=None) -> None:
    """Give a meta-built (and perhaps sharded) model storage on `device` (each rank only its shards), put the
    constructed constants back and draw the weights: init_weights draws each parameter whole on the CPU and keeps
    this rank's part (model.init.fill_), so the values do not depend on the world size. `storage(t)`: an empty
    tensor for meta tensor t, instead of one on `device` (files: depthlab.analysis.layerwise.init_skeleton)."""
    first: dict[int, str] = {}
    ties = [(name, first.setdefault(id(p), name)) for name, p in model.named_parameters(remove_duplicate=False)]
    model._apply(storage or (lambda t: torch.empty_like(t, device=device)))  # model.to_empty(device=device)
    for name, same in ties:  # to_empty gives each name its own storage: tie them again (tied embeddings)
        if name != same:
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, model.get_parameter(same))
    targets = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for name, value in constants.items():
        fill_(targets[name], lambda t, v=value: t.copy_(v))
    model.initialize()
