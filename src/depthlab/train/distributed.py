"""Scale-out on PyTorch's own engine, applied after the model is built (the model code never changes).

Launched with `torchrun --nproc_per_node K -m depthlab train ...`: DDP or FSDP2 (`fully_shard`), gloo on CPU,
NCCL on GPUs. Checkpoints always hold the full (unsharded) state, gathered through
`torch.distributed.checkpoint.state_dict`, so a run can resume on any number of ranks, with or without FSDP.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.utils.checkpoint import checkpoint


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    host_group: object = None  # the group of the trainer's own host-side messages (see host_group)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device, timeout_s: float = 1800.0) -> DistEnv:
    """Join the process group torchrun set up (RANK / WORLD_SIZE in the environment); a no-op otherwise.

    One group with a backend per device type: gloo for host tensors and pickled objects, NCCL for GPU tensors
    ("nccl" alone maps only cuda, and a CPU tensor's all-reduce then fails). `timeout_s` bounds every collective
    (a rank stuck in a save, or a dead peer, ends the job instead of hanging it)."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", 1)) == 1:
        return DistEnv()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        extra = {"device_id": torch.device("cuda", local_rank)} if device.type == "cuda" else {}
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=timeout_s), **extra)
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, host_group(timeout_s))


def host_group(timeout_s: float = 1800.0):
    """The group for host-side collectives (the trainer's scalar reductions, object broadcasts, barriers): the
    default group when it has a CPU backend, else a gloo group beside it -- a default group that someone else
    created with a GPU-only backend (NCCL alone) cannot reduce a CPU tensor. Collective: every rank calls it."""
    if "cpu:" in dist.get_backend_config():
        return None  # the default group
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


def local_device(device: torch.device, env: DistEnv) -> torch.device:
    return torch.device("cuda", env.local_rank) if device.type == "cuda" and env.enabled else device


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in backward. Wraps forward only, so names and hooks are unchanged."""
    for layer in model.layers:
        layer.forward = functools.partial(checkpoint, type(layer).forward, layer, use_reentrant=False)


def parallelize(model: nn.Module, env: DistEnv, parallel: str, device: torch.device) -> nn.Module:
    if not env.enabled:
        return model
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    return nn.parallel.DistributedDataParallel(model, device_ids=[env.local_rank] if device.type == "cuda" else None)


def grad_sync(model: nn.Module, enabled: bool):
    """Skip gradient all-reduce on all but the last micro-batch of an accumulation."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext() if enabled else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def all_reduce_sum(values: list[float], env: DistEnv) -> list[float]:
    if not env.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=env.host_group)
    return t.tolist()


def gather_objects(obj, env: DistEnv) -> list:
    """Every rank's obj, in rank order, on every rank (small things: per-rank timings, file digests)."""
    if not env.enabled:
        return [obj]
    out = [None] * env.world_size
    dist.all_gather_object(out, obj, group=env.host_group)
    return out


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return get_model_state_dict(model, options=_FULL)


def full_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    return get_optimizer_state_dict(model, opt, options=_FULL)


def load_full_state(model: nn.Module, opt: torch.optim.Optimizer | None, model_state: dict,
                    optim_state: dict | None) -> None:
    """Load full state dicts (present on every rank) into a plain or FSDP-sharded model (not a DDP wrapper) and
    its optimizer."""
    set_model_state_dict(model, model_state, options=StateDictOptions(full_state_dict=True, strict=False))
    if opt is not None and optim_state is not None:
        set_optimizer_state_dict(model, opt, optim_state, options=StateDictOptions(full_state_dict=True))


def broadcast_object(obj, env: DistEnv):
    """Rank 0's value of obj on every rank."""
    if not env.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=env.host_group)
    return box[0]


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier(group=env.host_group)


def shutdown(env: DistEnv) -> None:
    if env.enabled and dist.is_initialized():
        dist.destroy_process_group()
