"""The `depthlab train --dry-run` memory plan (depthlab.train.plan) against what PyTorch's trackers measure.

For a ladder of configs -- widths, depths, batch x sequence, fp32 and bf16, the loss through full logits and by
chunks, one and two micro-batches, activation checkpointing off and on, one process, two FSDP (and DDP) ranks over
gloo, and the paper presets up to olmo-7b at one rank's shard under FakeTensorMode -- depthlab.memtrack measures
two training steps and each category is printed beside the plan's figure, with estimate / measured.

    python -m benchmarks.memory_plan    # about 10 minutes on one core; writes benchmarks/results/memory_plan.json

"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, environment, write_result

NOTES = {"ddp": "DDP's buckets are rebuilt during the first step, so the tracker counts them as activations; the "
                "plan counts them as gradients (the total agrees)"}
SMALL = {"dim": 128, "n_layers": 4, "batch": 8, "seq": 128}
WIDE = {"dim": 256, "n_layers": 8, "batch": 8, "seq": 128}
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
]


def config(shape, overrides: list[str]):
    from depthlab.config import Config, apply_overrides
    from depthlab.model.families import preset
    from depthlab.model.validate import validate

    if isinstance(shape, str):
        return validate(apply_overrides(preset(shape), overrides))
    d = shape["dim"]
    return validate(apply_overrides(Config(), [
        f"model.dim={d}", f"model.n_layers={shape['n_layers']}", f"model.ffn_dim={d * 8 // 3}",
        f"model.n_heads={d // 32}", "model.vocab_size=4096", f"model.max_seq_len={shape['seq']}",
        f"data.seq_len={shape['seq']}", f"train.batch_size={shape['batch']}", "train.dtype=fp32", *overrides]))


def row(shape, ranks: int, fake: bool, overrides: list[str], note: str | None) -> dict:
    from depthlab.config import per_rank_batch
    from depthlab.memtrack import compare, measure
    from depthlab.train.plan import memory_plan

    cfg, t0 = config(shape, overrides), time.time()
    measured = measure(cfg, ranks, fake)
    m, tc = cfg.model, cfg.train
    return {"config": {"preset": shape if isinstance(shape, str) else None, "dim": m.dim, "n_layers": m.n_layers,
                       "batch": per_rank_batch(tc, ranks),
                       "seq": cfg.data.seq_len, "dtype": tc.dtype, "loss_chunk": tc.loss_chunk,
                       "grad_accum": tc.grad_accum, "world_size": ranks,
                       "parallel": tc.parallel if ranks > 1 else None, "tensors": "fake" if fake else "real",
                       "activation_checkpointing": tc.activation_checkpointing},
            "categories": compare(memory_plan(cfg, ranks)["bytes"], measured),
            "note": NOTES.get(note), "wall_s": round(time.time() - t0, 1)}


def _label(c: dict) -> str:
    """A ladder row's cells: the model and batch, its ranks, checkpointing, tensors."""
    shape = c.get("preset") or f"{c['dim']} x {c['n_layers']}"
    extra = [c["dtype"]] * (c.get("dtype", "fp32") != "fp32") + \
        [f"loss chunk {c['loss_chunk']}"] * (c.get("loss_chunk", 1024) < c["batch"] * c["seq"]) + \
        [f"{c['grad_accum']} micro-batches"] * (c.get("grad_accum", 1) > 1 and not c.get("preset"))
    ranks = f"{c.get('world_size', 1)}" + (f" {c['parallel']}" if c.get("parallel") else "")
    ac = "on" if c["activation_checkpointing"] else "off"
    return (f"{shape}, {c['batch']} x {c['seq']}" + "".join(f", {e}" for e in extra)
            + f" | {ranks} | {ac} | {c.get('tensors', 'real')}")


def _where(label: str) -> str:
    """A row's label in a sentence."""
    shape, ranks, ac, tensors = label.split(" | ")
    return f"{shape} ({ranks} rank{'s' * (ranks != '1')}, AC {ac}, {tensors} tensors)"


def largest_errors(rows: list[dict]) -> dict:
    """The largest |estimate / measured - 1| of the activations and the total over the rows without a note."""
    out = {}
    for k in ("activations", "total"):
        err = {_label(r["config"]): abs(r["categories"][k]["ratio"] - 1) for r in rows
               if not r.get("note") and r["categories"][k]["ratio"]}
        worst = max(err, key=err.get)
        out[k] = {"error": err[worst], "row": worst}
    return out


def page_lines(path: Path = RESULTS / "memory_plan.json") -> list[str]:
    """The results page's section: estimate / measured per category per config, the largest errors and the
    command that reproduces them; [] before the benchmark has run."""
    if not path.exists():
        return []
    r = json.loads(path.read_text())
    cats = list(r["rows"][0]["categories"])
    out = ["## Memory: the dry-run plan against a tracker", "",
           "`depthlab train --dry-run`'s bytes per rank (src/depthlab/train/plan.py) beside what PyTorch's "
           "MemTracker (FSDPMemTracker on an FSDP rank) measures over two training steps (depthlab.memtrack), in "
           "MiB: estimate / measured (ratio). Each category at the total's peak, the gradients and activations at "
           "their own. Real tensors on the CPU (spawned gloo ranks), or FakeTensorMode (no memory; rank 0 of a "
           "fake process group) for the paper presets. AC: activation checkpointing.", "",
           "| config | ranks | AC | tensors | " + " | ".join(cats) + " |", "|---|---|---|---|" + "---:|" * len(cats)]
    for row_ in r["rows"]:
        out.append(f"| {_label(row_['config'])} | " + " | ".join(
            f"{v['estimate'] / 2**20:,.1f} / {v['measured'] / 2**20:,.1f} "
            + (f"({v['ratio']:.2f})" if v["ratio"] else "(none)") for v in row_["categories"].values()) + " |")
    worst = r["largest_error"]
    out += ["", "Largest |estimate / measured - 1| over the rows without a note: " + "; ".join(
        f"{k} {v['error']:.0%}, {_where(v['row'])}" for k, v in worst.items())
        + f". Reproduce: `python -m benchmarks.memory_plan` (commit {r['env'].get('git_commit')}, "
        f"torch {r['env'].get('torch')}, {r['wall_s']:.0f} s)."]
    notes = {row_["note"]: [] for row_ in r["rows"] if row_.get("note")}
    for row_ in r["rows"]:
        if row_.get("note"):
            notes[row_["note"]].append(_where(_label(row_["config"])))
    out += [""] * bool(notes) + [f"- {'; '.join(where)}: {note}." for note, where in notes.items()]
    out += ["- The gathered blocks of the small FSDP rows read above the tracker: their peak falls in the loss "
            "head's backward, where no block's gradient waits for its reduce-scatter yet; at the presets' sizes the "
            "peak is a block's backward, and they agree."]
    return out + [""]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(RESULTS / "memory_plan.json"))
    p.add_argument("--rows", type=int, nargs="*", help="only these rows of the ladder (0-based)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    rows = []
    for i, spec in enumerate(LADDER):
        if args.rows is None or i in args.rows:
            rows.append(row(*spec))
            print(f"{_label(rows[-1]['config'])}: " + ", ".join(
                f"{k} {v['ratio']:.2f}" for k, v in rows[-1]["categories"].items() if v["ratio"]), flush=True)
    result = {"benchmark": "memory_plan", "argv": sys.argv[1:] if argv is None else argv, "env": environment(),
              "rows": rows, "largest_error": largest_errors(rows), "wall_s": time.time() - t0}
    path = write_result("memory_plan", result, args.out)
    print("\n".join(page_lines(path)))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
