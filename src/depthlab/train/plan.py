"""`depthlab train --dry-run`: the layout a run would have and its memory per rank, before any data is read.

The model is built on the meta device (no memory), two of its blocks at most (blocks are alike, their stream
scalars included: the rest are counted), so the plan of a 7B run takes a second on a laptop. Parameters, gradients
and AdamW's two moments (train.optimizer=muon: Muon's one momentum buffer for the blocks' matrices) are exact byte
counts (fp32, divided by the ranks that shard them); Muon's step, what its Newton-Schulz iteration holds at its
largest matrix, is counted from torch's code (newton_schulz_bytes; under FSDP2 a wide matrix is gathered whole).
What FSDP gathers (two blocks, one block's fp32 gradient, the LM head) and the activations are estimates, from what
depthlab's own code keeps: per block and micro-batch its norms' inputs, q, k, v and attention's output, SwiGLU's
gate and up (and the stream before the stream scalars' mix, x0 once); the loss head's share
(depthlab.model.loss) or the SwiGLU gradient's fp32 temporaries, whichever is larger; with activation checkpointing
each block's input and one block recomputed. The total is the peak, not the sum: the gradients are counted where
they are present, and under Muon the peak may be its step (every gradient, no activations).
benchmarks/memory_plan.py checks every category against PyTorch's MemTracker (depthlab.memtrack), on real ranks and
under FakeTensorMode up to olmo-7b.
"""

from __future__ import annotations

import dataclasses

import torch

from depthlab import UserError
from depthlab.config import Config, per_rank_batch
from depthlab.model import build_model
from depthlab.model.families import family_of
from depthlab.train.distributed import mesh_shape

GIB = 2**30


def parameter_counts(m) -> tuple[int, int, list[tuple[int, int]]]:
    """Parameters of the model and of one block, and the shapes of one block's 2-D weights (what Muon takes under
    train.optimizer=muon, depthlab.train.optim.muon_params). Every block of a scheme has as many as the others
    (only their values and constants differ with depth), so a model of at most two blocks is built, on the meta
    device, and the rest counted: a 100,000-block plan takes as long as a 2-block one."""
    small = dataclasses.replace(m, n_layers=min(m.n_layers, 2))
    with torch.device("meta"):
        model = build_model(small, init=False)
    block = sum(p.numel() for p in model.layers[0].parameters())
    matrices = [tuple(p.shape) for p in model.layers[0].parameters() if p.dim() == 2]
    return sum(p.numel() for p in model.parameters()) + (m.n_layers - small.n_layers) * block, block, matrices


def newton_schulz_bytes(shapes: list[tuple[int, int]], shard: int) -> float:
    """What Muon's step holds beside its momentum buffers, at its largest matrix (torch.optim.Muon orthogonalizes
    one at a time): the update in fp32 and two bfloat16 iterates X of it (8 bytes a parameter of the rank's part),
    and the Gram matrix A = X X^T and b A + c A^2 (m x m in bfloat16, m the smaller side). Under FSDP2 (`shard`
    ranks, each a block of rows) DTensor runs Newton-Schulz on the shards: a wide matrix (rows <= columns) is
    gathered whole for the products, into the gather's buffer and then the matrix (2 + 2 bytes a parameter), its
    Gram matrices left row-sharded; a tall one is worked on transposed, so the products sum over the sharded side:
    nothing is gathered, and the m x m Gram matrix is summed across the ranks (the partial sum, the sum and the
    polynomial). Measured on 2 gloo ranks (docs/scaling.md)."""
    def one(rows: int, cols: int) -> float:
        n, m = rows * cols, min(rows, cols)
        if shard == 1:
            return 8 * n + 4 * m * m
        if rows <= cols:
            return 8 * n / shard + 4 * n + 4 * m * m / shard
        return 8 * n / shard + 6 * m * m
    return max((one(*s) for s in shapes), default=0)


def activation_bytes(cfg: Config, batch: int, fsdp: bool) -> tuple[int, int]:
    """(the activations' and temporaries' peak over one micro-batch of `batch` sequences, what the last block's
    backward works with): the blocks' saved tensors plus the larger of the loss head's share and the SwiGLU
    gradient's fp32 temporaries; one block's saved tensors and those temporaries."""
    m, tc = cfg.model, cfg.train
    a = 2 if tc.dtype == "bf16" else 4  # what autocast computes in
    p = a if fsdp else 4  # what parameters are read in, and so the residual stream: FSDP gathers them in bf16
    tokens = batch * (cfg.data.seq_len if not m.is_vit else m.n_patches + 1)
    d, f = m.dim, m.ffn_dim
    q, kv = m.n_heads * m.head_dim, (m.n_kv_heads or m.n_heads) * m.head_dim
    # a block keeps its two norms' inputs (a LayerNorm also its fp32 copy, and the projections a copy of its
    # output: depthlab.model.parts recomputes an RMSNorm's), attention's q, k, v (and their inputs under QK-norm)
    # and output, and the MLP's gate and up
    family = family_of(m)
    norm = p * d if family.norm == "rms" else (4 + a) * d
    per_block = tokens * (2 * norm + a * (2 * q + 2 * kv) + family.qk_norm * a * (q + kv) + 2 * a * f)
    # the stream scalars: resid_lambda's product keeps the stream before the mix in every block (its gradient's
    # input), x0_lambda's keeps x0, one tensor for all blocks
    per_block += m.resid_lambda * tokens * d * p
    x0 = m.x0_lambda * tokens * d * p
    # its backward forms the SwiGLU gradient in fp32: five ffn-wide fp32 temporaries, under bf16 also fp32 copies
    # of gate, up and the incoming gradient
    swiglu_grad = tokens * f * (20 if a == 4 else 34)
    classes = m.num_classes if m.is_vit else m.vocab_size
    rows = batch if m.is_vit else tokens  # a ViT classifies the pooled token
    chunk = min(tc.loss_chunk or rows, rows)
    if chunk < rows:  # by chunks (depthlab.model.loss): the head's gradients formed in forward, one chunk's logits
        head = (classes * d * p + 3 * rows * d * p + chunk * classes * (4 + (a < 4) * a)
                + (a < 4 and not fsdp) * classes * d * a)  # fp32 logits, their gradient cast; the weight cast
    else:  # through the full logits: the fp32 log-softmax kept, its gradient and the logits' in backward
        head = 12 * rows * classes + 2 * rows * d * p
    last_block = per_block + swiglu_grad
    if tc.activation_checkpointing:  # each block's input kept; in backward, one block recomputed at a time
        return m.n_layers * tokens * d * p + x0 + max(head, last_block), last_block
    return m.n_layers * per_block + x0 + max(head, swiglu_grad), last_block


def memory_plan(cfg: Config, world_size: int) -> dict:
    """The layout and the bytes per rank of a run of `cfg` on `world_size` ranks."""
    m, tc = cfg.model, cfg.train
    n, block, shapes = parameter_counts(m)
    muon = m.n_layers * sum(r * c for r, c in shapes) if tc.optimizer == "muon" else 0
    batch = per_rank_batch(tc, world_size)
    fsdp = world_size > 1 and tc.parallel == "fsdp"
    ddp = world_size > 1 and not fsdp
    replicate, shard = mesh_shape(tc, world_size) if fsdp else (world_size, 1)
    a = 2 if tc.dtype == "bf16" else 4
    head = m.dim * (m.num_classes if m.is_vit else m.vocab_size)
    grads = 4 * n / shard * (2 if ddp else 1)  # DDP: plus its reducer buckets
    # summing micro-batches, the largest parameter's new gradient sits beside its sum for a moment (FSDP sums shards)
    adding = 4 * head if tc.grad_accum > 1 and not fsdp else 0
    plan = {
        "parameters": 4 * n / shard,
        "gradients": grads + adding,
        "optimizer": (8 * (n - muon) + 4 * muon) / shard,  # AdamW's two fp32 moments, Muon's one momentum buffer
        # a block computing and the next one prefetched, one block's fp32 gradient before its reduce-scatter, and
        # the root group's LM head, kept gathered from forward to backward
        "gathered blocks": (2 * block * a + 4 * block + head * a) if fsdp else 0,
    }
    plan["activations"], last_block = activation_bytes(cfg, batch, fsdp)
    if muon:  # Newton-Schulz's temporaries at Muon's largest matrix (under FSDP2 a wide one gathered whole)
        plan["Muon step"] = newton_schulz_bytes(shapes, shard)
    # the peak: where the last micro-batch's activations peak, beside the gradients accumulated so far (and DDP's
    # buckets) -- with one micro-batch none yet, they are set to None after each step -- or at the end of its
    # backward, with every gradient and the last block's backward (later under activation checkpointing)
    at_peak = grads - (4 * n / shard if tc.grad_accum == 1 else 0)
    rest = plan["parameters"] + plan["optimizer"] + plan["gathered blocks"]
    backward = rest + max(plan["activations"] + at_peak, plan["gradients"] + last_block)
    # or in Muon's step: every gradient and Muon's temporaries, nothing gathered, no activations
    step = plan["parameters"] + plan["optimizer"] + grads + plan.get("Muon step", 0)
    plan["total"] = max(backward, step)
    layout = {"world_size": world_size, "parallel": tc.parallel if world_size > 1 else "single process",
              "mesh": f"{replicate} replicate x {shard} shard" if fsdp else None, "params": n,
              "batch_per_rank": batch, "grad_accum": tc.grad_accum,
              "global_batch": batch * tc.grad_accum * world_size, "steps": tc.max_steps,
              "ckpt_every": tc.ckpt_every}
    return {"layout": layout, "bytes": plan}


def format_plan(plan: dict, layout: bool = True) -> str:
    """The plan as `--dry-run` prints it: in GiB, or MiB below one GiB; with the tracker's figure beside each
    estimate when the plan carries one (depthlab.memtrack.measure_plan); without its layout line when not
    `layout` (the measured table, printed below the estimate's)."""
    lay, measured = plan["layout"], plan.get("measured", {}).get("bytes")
    unit, size = ("GiB", GIB) if plan["bytes"]["total"] >= GIB else ("MiB", 2**20)
    lines = [f"layout: {lay['world_size']} rank(s), {lay['parallel']}" + (f" ({lay['mesh']})" if lay["mesh"] else "")
             + f"; {lay['params'] / 1e6:,.1f}M parameters; {lay['batch_per_rank']} sequences per rank x "
             f"{lay['grad_accum']} micro-batches = global batch {lay['global_batch']}; {lay['steps']:,} steps, "
             f"a checkpoint every {lay['ckpt_every'] or 'end'}",
             f"memory per rank ({unit}):" + ("   estimate   measured" if measured else "")]
    lines += [f"  {k:<16}{v / size:9.2f}" + (f"{measured[k] / size:11.2f}" if measured else "")
              for k, v in plan["bytes"].items()]
    if measured:
        lines.append(f"measured: {plan['measured']['what']}")
    return "\n".join(lines[0 if layout else 1:])


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
