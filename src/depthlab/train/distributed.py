"""Scale-out on PyTorch's own engine, applied after the model is built (the model code never changes).

Launched with `torchrun --nproc_per_node K -m depthlab train ...`: DDP or FSDP2 (`fully_shard`), gloo on CPU,
NCCL on GPUs. Under torchrun the model is built on the meta device and each rank materialises only its own
shards; checkpoints are sharded (depthlab.checkpoint), and reshard on load to any number of ranks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.utils.checkpoint import checkpoint

from depthlab import UserError
from depthlab.checkpoint import load_states
from depthlab.config import ModelConfig, TrainConfig
from depthlab.model import build_model
from depthlab.model.meta import build_on_meta, materialize


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

    def gather(self, obj) -> list:
        """Every rank's obj, in rank order, on every rank (small things: per-rank timings, file digests)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.host_group)
        return out

    def broadcast(self, obj):
        """Rank 0's value of obj on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.host_group)
        return box[0]

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (depthlab.eval.perplexity.Ranks)."""
        return all_reduce_sum(values, self)


def init_distributed(device: torch.device, timeout_s: float = 1800.0) -> DistEnv:
    """Join the process group torchrun set up (RANK / WORLD_SIZE in the environment); a no-op otherwise.

    One group with a backend per device type: gloo for host tensors and pickled objects, NCCL for GPU tensors
    ("nccl" alone maps only cuda, and a CPU tensor's all-reduce then fails). `timeout_s` bounds every collective
    (a rank stuck in a save, or a dead peer, ends the job instead of hanging it), and leaving the group too
    (shutdown)."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", 1)) == 1:
        return DistEnv()
    global _leave_within_s
    _leave_within_s = timeout_s
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


def mesh_shape(tc: TrainConfig, world_size: int) -> tuple[int, int]:
    """(replicate, shard) of the FSDP device mesh: HSDP replicates across train.dp_replicate groups (nodes) and
    shards within each; the default, one group, is plain FSDP over every rank."""
    shard = tc.dp_shard or world_size // tc.dp_replicate
    if tc.dp_replicate * shard != world_size:
        raise UserError(f"train.dp_replicate={tc.dp_replicate} x train.dp_shard={shard} must equal the number of "
                        f"ranks, {world_size}")
    return tc.dp_replicate, shard


def build_parallel(cfg: ModelConfig, tc: TrainConfig, env: DistEnv, device: torch.device):
    """(the model, what the loop calls: the model under DDP and / or torch.compile). Applied after the model is
    built, in the anchors' order: activation checkpointing, per-block compile, fully_shard. Under torchrun the
    model is built on the meta device and every rank materialises only its own part."""
    if not env.enabled:
        model = build_model(cfg).to(device)
        constants = None
    else:
        model, constants = build_on_meta(cfg)
    if tc.activation_checkpointing:
        apply_activation_checkpointing(model)
    fsdp = env.enabled and tc.parallel == "fsdp"
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh

        replicate, shard = mesh_shape(tc, env.world_size)
        mesh = init_device_mesh(device.type, (replicate, shard), mesh_dim_names=("replicate", "shard")) \
            if replicate > 1 else init_device_mesh(device.type, (shard,))
        shard_model(model, cfg, tc, mesh)
    if constants is not None:
        materialize(model, device, constants)
    wrapped = model
    if env.enabled and not fsdp:
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[env.local_rank] if device.type == "cuda"
                                                      else None)
    if tc.compile and not fsdp:
        wrapped = torch.compile(wrapped)
    return model, wrapped


def shard_model(model: nn.Module, cfg: ModelConfig, tc: TrainConfig, mesh) -> None:
    """FSDP2's layout over `mesh` (build_parallel's, and depthlab.memtrack's fake rank's): the token embedding in its
    own group, one group per block (each compiled first under train.compile), the root; under bf16 parameters
    gathered in bf16 (half the traffic and memory) and gradients reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if tc.dtype == "bf16" else MixedPrecisionPolicy()
    # the token embedding in its own group, as torchtitan does: the root group (head, final norm) stays small,
    # and so does what accumulation adds while a group's reduce-scattered gradient is summed into the last one
    # (the LM head has no group of its own: the chunked loss reads its weight without calling its forward)
    if isinstance(getattr(model, "embed_tokens", None), nn.Embedding) and not cfg.tie_embeddings:
        fully_shard(model.embed_tokens, mesh=mesh, mp_policy=mp)
    for layer in model.layers:
        if tc.compile:
            layer.compile()
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


def grad_sync(model: nn.Module, enabled: bool):
    """DDP: skip the gradient all-reduce on all but the last micro-batch of an accumulation (also under
    torch.compile, whose wrapper hides the DDP module). FSDP reduce-scatters every micro-batch, as torchtitan
    and OLMo-core do: skipping it would keep a full unsharded gradient on every rank."""
    inner = getattr(model, "_orig_mod", model)
    if isinstance(inner, nn.parallel.DistributedDataParallel) and not enabled:
        return inner.no_sync()
    return contextlib.nullcontext()


def all_reduce_sum(values: list[float], env: DistEnv) -> list[float]:
    if not env.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=env.host_group)
    return t.tolist()


def gather_objects(obj, env: DistEnv) -> list:
    """Every rank's obj, in rank order, on every rank (DistEnv.gather)."""
    return env.gather(obj)


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return get_model_state_dict(model, options=_FULL)


def full_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    return get_optimizer_state_dict(model, opt, options=_FULL)


def load_full_state(model: nn.Module, opt: torch.optim.Optimizer | None, model_state: dict,
                    optim_state: dict | None = None) -> None:
    """Load full state dicts (present on every rank) into a plain or FSDP-sharded model (not a DDP wrapper) and
    its optimizer (checkpoint.load_states)."""
    load_states(model, opt, model_state, optim_state, full=True)


def broadcast_object(obj, env: DistEnv):
    """Rank 0's value of obj on every rank (DistEnv.broadcast)."""
    return env.broadcast(obj)


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier(group=env.host_group)


# How long leaving the group may take: the group's own collective timeout (train.dist_timeout_s).
_leave_within_s = 1800.0
# How long the host gives gloo's worker threads the GIL before the group goes (see shutdown): a finished
# collective's clean-up takes microseconds; this is many scheduler slices on a loaded host.
_DRAIN_S = 0.2


def shutdown(env: DistEnv | None = None) -> None:
    """Leave the process group deliberately, on every way out of a torchrun worker (a finished run, a run with
    no steps left, an error), and within train.dist_timeout_s.

    Why deliberately: a gloo worker thread frees each finished collective holding the group's mutex, and freeing
    a tensor that Python has seen takes the GIL. A group destroyed from Python -- by destroy_process_group, or
    later by the last DDP reducer that holds it, at exit -- waits for that mutex holding the GIL: a deadlock when
    the thread has not finished yet (the last collective is the final validation's all-reduce, moments earlier).
    So: the caller has dropped its DDP / FSDP model (Trainer.close); collect it while the group is still
    registered, so no reducer holds the last reference; release the GIL long enough for gloo's threads to finish;
    destroy the group. faulthandler's watchdog is a C thread that needs no GIL: if leaving still takes longer
    than the timeout, it prints where the process is stuck and ends it (exit status 1)."""
    if (env is not None and not env.enabled) or not (dist.is_available() and dist.is_initialized()):
        return
    faulthandler.dump_traceback_later(_leave_within_s, exit=True)
    try:
        gc.collect()
        time.sleep(_DRAIN_S)
        dist.destroy_process_group()
    finally:
        faulthandler.cancel_dump_traceback_later()
