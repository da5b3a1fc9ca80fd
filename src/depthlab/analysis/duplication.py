"""Layer duplication (RYS, DeepPass), the converse of removal: the model with a contiguous span of blocks i..j run
twice (blocks 0..j, then i..j again, then j+1..L-1), for every start i and every span of 1..MAX_SPAN blocks,
scored without training by the loss on the calibration windows and, given questions, by task accuracy.

Each span is a removal `Plan` with `repeat` = (i, j): the stream after block j is the model's own, so the scan
replays from the traced activations (depthlab.analysis.removal.replay_state) and runs only the n repeated blocks and
the L - 1 - j after them; an independent evaluation of the duplicated model runs all L + n. `naive_scan` is that
yardstick (the model run whole with its block list swapped for the duplicated order), for the benchmark and the
tests. `depthlab duplicate MODEL --span i:j+1 OUT` writes the duplicated model as a stock HF directory.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from depthlab.analysis.calibration import Batch
from depthlab.analysis.curse import cost_interval
from depthlab.analysis.layers import LayeredLM
from depthlab.analysis.removal import BASE, Plan, RemovalSums, plan_rows, scores, single_layer_sweep
from depthlab.analysis.tasks import TaskSums, task_sweep

INTERVAL = ("delta_loss_ci: 95% bootstrap interval over the calibration windows (resampled with replacement, "
            "seeded), paired: each window's loss with the span repeated minus the model's own on that window; it is "
            "the chosen span's own interval, not corrected for choosing the best of all the spans scanned")


def duplicate_plans(n_layers: int, max_span: int) -> list[Plan]:
    """Every span i..j (0-based, inclusive) of 1..max_span blocks, run twice."""
    return [Plan(("dup", i, i + n - 1), repeat=(i, i + n - 1)) for n in range(1, min(max_span, n_layers) + 1)
            for i in range(n_layers - n + 1)]


def duplicated_order(n_layers: int, i: int, j: int) -> list[int]:
    """The blocks the model runs with span i..j repeated once."""
    return [*range(j + 1), *range(i, n_layers)]


def span_flag(start_block: int, end_block: int) -> str:
    """`depthlab duplicate`'s --span for 1-based blocks start..end: a 0-based slice, END excluded."""
    return f"{start_block - 1}:{end_block}"


@torch.no_grad()
def duplication_scan(lm: LayeredLM, batches: list[Batch], max_span: int, questions: dict | None = None,
                     tick=lambda: None, progress=lambda it, desc: it) -> dict:
    """Every span of up to `max_span` blocks repeated, scored on `batches` (and `questions`, {task: [ScoredQuestion]}):
    each batch traced once, every span replayed from the stream after its last block."""
    plans = [BASE, *duplicate_plans(lm.n_layers, max_span)]
    sums = RemovalSums(lm.n_layers, lm.classifier)
    sums.track(p.key for p in plans[1:])
    for b in batches:
        single_layer_sweep(lm, b, lm.trace(b.inputs, b.mask), sums, plans, tick=tick)
    tsums = TaskSums()
    task_sweep(lm, questions or {}, plans, tsums, progress=progress)
    return duplication_results(sums, tsums, lm.n_layers, max_span)


def duplication_results(sums: RemovalSums, tsums: TaskSums, n_layers: int, max_span: int) -> dict:
    """The spans' rows (1-based blocks), the (start, end) table of Δ loss, and the best span with its interval."""
    base = sums.row(BASE.key)
    rows = plan_rows([k for k in sums.loss if k[0] == "dup"], sums.row)["duplicate"]
    for r in rows:
        r["span"] = span_flag(r["start_block"], r["end_block"])
    table: list[list[float | None]] = [[None] * n_layers for _ in range(n_layers)]
    for r in rows:
        table[r["start_block"] - 1][r["end_block"] - 1] = r["delta_loss"]
    best = dict(min(rows, key=lambda r: r["delta_loss"]))
    key = ("dup", best["start_block"] - 1, best["end_block"] - 1)
    delta = [a - b for a, b in zip(sums.windows[key], sums.windows[BASE.key])]
    best.update(delta_loss_ci=cost_interval(delta, sums.windows["count"]), windows=len(delta))
    out = {"max_span": min(max_span, n_layers), "base_loss": base["loss"], "spans": rows,
           "delta_loss_table": table, "best": best, "interval": INTERVAL}
    if tsums.tasks:
        tasks = tsums.results()
        for t in tasks["tasks"].values():
            t["best"] = min(t["duplicate"], key=lambda r: (r["acc_drop"], r["ll_drop"]))
        out["task_interval"], out["tasks"] = tasks["interval"], tasks["tasks"]
    return out


def duplication_lines(res: dict) -> list[str]:
    """The best span, for the terminal."""
    d = res.get("duplication")
    if d is None:
        return []
    b = d["best"]
    lo, hi = b["delta_loss_ci"]
    lines = [f"duplication (spans of 1..{d['max_span']} blocks): the lowest loss repeats blocks {b['start_block']}-"
             f"{b['end_block']}, loss {b['delta_loss']:+.4f} [{lo:+.4f}, {hi:+.4f}] against the model's own "
             f"(`depthlab duplicate MODEL --span {b['span']} OUT` writes it)"]
    for name, t in d.get("tasks", {}).items():
        tb = t["best"]
        lines.append(f"  {name}: best repeated blocks {tb['start_block']}-{tb['end_block']}, accuracy {tb['acc']:.4f} "
                     f"(the model's {t['base_acc']:.4f}, drop {tb['acc_drop']:+.4f} [{tb['drop_ci'][0]:+.4f}, "
                     f"{tb['drop_ci'][1]:+.4f}])")
    return lines


@contextlib.contextmanager
def duplicating(lm: LayeredLM, i: int, j: int):
    """The naive way, for the benchmark and as a cross-check: the model's block list is the duplicated order (the
    repeated blocks are the same modules), and an HF config follows it while it runs (num_hidden_layers and the
    per-layer lists: each repeated block keeps its own kind of attention, as `depthlab duplicate` writes it)."""
    from depthlab.block_order import config_in_order

    parent_path, _, attr = lm.blocks_path.rpartition(".")
    parent = lm.model.get_submodule(parent_path)
    blocks, cfg = lm.blocks, getattr(lm.model, "config", None)
    order = duplicated_order(len(blocks), i, j)
    setattr(parent, attr, nn.ModuleList(blocks[k] for k in order))
    try:
        with config_in_order(cfg, len(blocks), order) if cfg is not None else contextlib.nullcontext():
            yield
    finally:
        setattr(parent, attr, blocks)


@torch.no_grad()
def naive_scan(lm: LayeredLM, batches: list[Batch], max_span: int) -> dict[tuple, float]:
    """Loss per span key, by one independent full forward pass of each duplicated model per batch."""
    losses = {}
    for p in duplicate_plans(lm.n_layers, max_span):
        tot, cnt = 0.0, 0
        with duplicating(lm, *p.repeat):
            for b in batches:
                s, c, _ = scores(lm.forward_fn(b.inputs, b.mask), b)
                tot, cnt = tot + s, cnt + c
        losses[p.key] = tot / max(cnt, 1)
    return losses


def block_passes(n_layers: int, max_span: int) -> tuple[int, int]:
    """(blocks the cached scan runs, blocks the independent evaluations run) per batch, base pass included."""
    plans = duplicate_plans(n_layers, max_span)
    cached = n_layers + sum(len(p.blocks_from_first(n_layers)) for p in plans)
    return cached, sum(n_layers + p.repeat[1] - p.repeat[0] + 1 for p in plans)
