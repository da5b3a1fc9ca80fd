"""Scale-out on gloo, inside the test process's children: collectives on the right device, the resume decision
shared by every rank, sharded checkpoints that reshard, and the meta-device build."""

from __future__ import annotations

import os
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from depthlab.train import distributed as D


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, backend, fn, args, errors):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        if backend:
            dist.init_process_group(backend)
        fn(rank, *args)
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn, *args, world: int = 2, backend: str | None = "gloo") -> None:
    """fn(rank, *args) on `world` spawned processes that joined a group of `backend` (None: fn does it)."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    mp.start_processes(_entry, args=(world, _free_port(), backend, fn, args, errors), nprocs=world, join=True,
                       start_method="spawn")
    assert errors.empty(), errors.get()


def _reductions_under_a_cuda_only_group(rank):
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        dist.all_reduce(torch.ones(2, dtype=torch.float64))  # what "nccl" alone did to the trainer's reductions
    env = D.init_distributed(torch.device("cpu"))
    assert env.host_group is not None and env.world_size == 2
    assert D.all_reduce_sum([1.0, rank], env) == [2.0, 1.0]
    assert D.broadcast_object(f"from {rank}", env) == "from 0"
    assert D.gather_objects(rank * 10, env) == [0, 10]
    D.barrier(env)


def test_trainer_reductions_run_under_a_group_whose_only_backend_is_for_cuda():
    run_ranks(_reductions_under_a_cuda_only_group, backend="cuda:gloo")


def _reductions_under_the_trainers_own_group(rank):
    env = D.init_distributed(torch.device("cpu"), timeout_s=30)
    assert env.host_group is None and "cpu:gloo" in dist.get_backend_config()  # one group serves the host
    assert D.all_reduce_sum([float(rank)], env) == [1.0]


def test_trainer_group_has_a_cpu_backend_and_a_timeout():
    run_ranks(_reductions_under_the_trainers_own_group, backend=None)
