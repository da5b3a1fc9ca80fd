"""`depthlab train --dry-run`: the layout a run would have and its memory per rank, before any data is read.

The model is built on the meta device (no memory), two of its blocks at most (blocks are alike: the rest are
counted), so the plan of a 7B run takes a second on a laptop. Parameters,
gradients and AdamW's two moments are exact byte counts (fp32, divided by the ranks that shard them); what FSDP
gathers for the block it computes, and the activations, are estimates: per block and micro-batch about
34 x tokens x width bytes in bf16 (Korthikanti et al. 2022, without recomputation; twice that in fp32; their
5 x heads x sequence x tokens for the attention scores is left out: scaled_dot_product_attention's fused kernels
keep no score matrix), with activation checkpointing the block's input only plus one block recomputed; the loss
head's logits for min(loss_chunk, tokens) tokens. benchmarks/memory_plan.py measures them against PyTorch's
MemTracker.
"""

from __future__ import annotations

import dataclasses

import torch

from depthlab import UserError
from depthlab.config import Config, per_rank_batch
from depthlab.model import build_model
from depthlab.train.distributed import mesh_shape

GIB = 2**30


def parameter_counts(m) -> tuple[int, int]:
    """Parameters of the model and of one block. Every block of a scheme has as many as the others (only their
    values and constants differ with depth), so a model of at most two blocks is built, on the meta device, and
    the rest counted: a 100,000-block plan takes as long as a 2-block one."""
    small = dataclasses.replace(m, n_layers=min(m.n_layers, 2))
    with torch.device("meta"):
        model = build_model(small, init=False)
    block = sum(p.numel() for p in model.layers[0].parameters())
    return sum(p.numel() for p in model.parameters()) + (m.n_layers - small.n_layers) * block, block


def memory_plan(cfg: Config, world_size: int) -> dict:
    """The layout and the bytes per rank of a run of `cfg` on `world_size` ranks."""
    m, tc = cfg.model, cfg.train
    n, block = parameter_counts(m)
    batch = per_rank_batch(tc, world_size)
    fsdp = world_size > 1 and tc.parallel == "fsdp"
    replicate, shard = mesh_shape(tc, world_size) if fsdp else (world_size, 1)
    act_bytes = 2 if tc.dtype == "bf16" else 4
    tokens = batch * (cfg.data.seq_len if not m.is_vit else m.n_patches + 1)
    per_block = 17 * tokens * m.dim * act_bytes
    if tc.activation_checkpointing:
        activations = m.n_layers * tokens * m.dim * act_bytes + per_block
    else:
        activations = m.n_layers * per_block
    head = min(tc.loss_chunk or tokens, tokens) * (m.num_classes if m.is_vit else m.vocab_size) * 4 * 2
    plan = {
        "parameters": 4 * n / shard,
        "gradients": 4 * n / shard * (1 if fsdp or world_size == 1 else 2),  # DDP: plus its reducer buckets
        "optimizer": 8 * n / shard,
        "gathered blocks": 2 * block * act_bytes + 4 * block if fsdp else 0,  # compute + prefetch, one grad
        "activations": activations + head,
    }
    plan["total"] = sum(plan.values())
    layout = {"world_size": world_size, "parallel": tc.parallel if world_size > 1 else "single process",
              "mesh": f"{replicate} replicate x {shard} shard" if fsdp else None, "params": n,
              "batch_per_rank": batch, "grad_accum": tc.grad_accum,
              "global_batch": batch * tc.grad_accum * world_size, "steps": tc.max_steps,
              "ckpt_every": tc.ckpt_every}
    return {"layout": layout, "bytes": plan}


def format_plan(plan: dict) -> str:
    lay = plan["layout"]
    lines = [f"layout: {lay['world_size']} rank(s), {lay['parallel']}" + (f" ({lay['mesh']})" if lay["mesh"] else "")
             + f"; {lay['params'] / 1e6:,.1f}M parameters; {lay['batch_per_rank']} sequences per rank x "
             f"{lay['grad_accum']} micro-batches = global batch {lay['global_batch']}; {lay['steps']:,} steps, "
             f"a checkpoint every {lay['ckpt_every'] or 'end'}",
             "memory per rank (GiB):"]
    lines += [f"  {k:<16}{v / GIB:9.2f}" for k, v in plan["bytes"].items()]
    return "\n".join(lines)


def check_fits(plan: dict, gpu_memory_gib: float | None) -> None:
    """One error line when the plan needs more than `gpu_memory_gib` per rank."""
    if gpu_memory_gib is None:
        return
    need = plan["bytes"]["total"] / GIB
    if need > gpu_memory_gib:
        lay = plan["layout"]
        hint = "use train.parallel=fsdp" if lay["parallel"] == "ddp" else \
            "use more ranks, activation checkpointing or a smaller train.batch_size (more train.grad_accum)"
        raise UserError(f"the plan needs {need:.1f} GiB per rank on {lay['world_size']} rank(s), more than "
                        f"--gpu-memory {gpu_memory_gib:g}: {hint}")
