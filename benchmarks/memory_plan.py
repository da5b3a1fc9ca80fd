"""The `depthlab train --dry-run` memory plan (depthlab.train.plan) against what PyTorch's trackers measure.

For a ladder of configs -- widths, depths, batch x sequence, fp32 and bf16, the loss through full logits and by
chunks, one and two micro-batches, activation checkpointing off and on, one process, two FSDP (and DDP) ranks over
gloo, and the paper presets up to olmo-7b at one rank's shard under FakeTensorMode, then train.optimizer=muon on one
process and two FSDP ranks -- depthlab.memtrack measures two training steps and each category is printed beside
the plan's figure, with estimate / measured.

    python -m benchmarks.memory_plan    # about 10 minutes on one core; writes benchmarks/results/memory_plan.json
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from benchmarks.common import RESULTS, environment, write_result
from depthlab.memtrack import ladder_row
from depthlab.study.page.systems import memory_plan_lines, plan_label, plan_largest_errors

NOTES = {"ddp": "DDP's buckets are rebuilt during the first step, so the tracker counts them as activations; the "
                "plan counts them as gradients (the total agrees)"}
SMALL = {"dim": 128, "n_layers": 4, "batch": 8, "seq": 128}
WIDE = {"dim": 256, "n_layers": 8, "batch": 8, "seq": 128}
MUON_STEP = {"dim": 512, "n_layers": 2, "batch": 1, "seq": 16}
LADDER = [  # (shape or preset, ranks, fake, overrides, note)
    ({"dim": 64, "n_layers": 2, "batch": 4, "seq": 64}, 1, False, [], None),
    (SMALL, 1, False, [], None),
    (WIDE, 1, False, ["train.loss_chunk=256"], None),
    ({**WIDE, "n_layers": 4}, 1, False, ["train.loss_chunk=256", "train.dtype=bf16"], None),
    (SMALL, 1, False, ["train.grad_accum=2"], None),
    (SMALL, 1, False, ["train.activation_checkpointing=true"], None),
    (WIDE, 1, False, ["train.activation_checkpointing=true", "train.loss_chunk=256"], None),
    ({**WIDE, "n_layers": 4}, 1, False, ["train.activation_checkpointing=true", "train.loss_chunk=256",
                                         "train.dtype=bf16"], None),
    (SMALL, 2, False, ["train.parallel=fsdp"], None),
    (WIDE, 2, False, ["train.parallel=fsdp", "train.loss_chunk=256"], None),
    (SMALL, 2, False, ["train.parallel=fsdp", "train.dtype=bf16", "train.grad_accum=2"], None),
    (WIDE, 2, True, ["train.parallel=fsdp", "train.loss_chunk=256", "train.activation_checkpointing=true"], None),
    (SMALL, 2, False, ["train.parallel=ddp"], "ddp"),
    ("llama-130m", 1, True, [], None),
    ("llama-1b", 8, True, [], None),
    ("olmo-1b", 8, True, [], None),
    ("olmo-7b", 16, True, [], None),
    ("olmo-7b", 16, True, ["train.activation_checkpointing=true"], None),
    # train.optimizer=muon: Muon's one momentum buffer, and its Newton-Schulz step (the "Muon step" column), the
    # run's peak at few tokens on one process; on 2 FSDP2 ranks the wide down projection gathered whole for it
    (SMALL, 1, False, ["train.optimizer=muon"], None),
    (MUON_STEP, 1, False, ["train.optimizer=muon"], None),
    (SMALL, 2, False, ["train.parallel=fsdp", "train.optimizer=muon"], None),
    (WIDE, 2, False, ["train.parallel=fsdp", "train.loss_chunk=256", "train.optimizer=muon"], None),
]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(RESULTS / "memory_plan.json"))
    p.add_argument("--rows", type=int, nargs="*", help="only these rows of the ladder (0-based)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    rows = []
    for i, (shape, ranks, fake, overrides, note) in enumerate(LADDER):
        if args.rows is None or i in args.rows:
            rows.append({**ladder_row(shape, ranks, fake, overrides), "note": NOTES.get(note)})
            print(f"{plan_label(rows[-1]['config'])}: " + ", ".join(
                f"{k} {v['ratio']:.2f}" for k, v in rows[-1]["categories"].items() if v["ratio"]), flush=True)
    result = {"benchmark": "memory_plan", "argv": sys.argv[1:] if argv is None else argv, "env": environment(),
              "rows": rows, "largest_error": plan_largest_errors(rows), "wall_s": time.time() - t0}
    path = write_result("memory_plan", result, args.out)
    print("\n".join(memory_plan_lines(result)))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
