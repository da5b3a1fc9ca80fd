"""Layer removal: the perplexity when one block, or a contiguous run of n blocks, is skipped; for a classifier (a
ViT), the cross-entropy against the labels and the top-1 accuracy instead. Also a block's attention or MLP alone
taken out (its output zeroed), a block replaced by its least-squares linear map (depthlab.analysis.linear), and
the k least useful blocks taken out together. Each is a `Plan`: what happens at each block.

Non-destructive: blocks are skipped by replaying the others on cached activations; no weight is touched (a
sublayer is zeroed by a forward hook, removed afterwards). The sweep reuses the traced pass: a plan that first
changes block l only re-runs blocks l..L from the cached input of block l, so the single-layer sweep costs
1 + sum_l (L - l) / L = (L + 1) / 2 + 1 block-passes of L blocks, about half of the L independent full passes a
naive sweep needs. Whole-model mode replays plan by plan (`replay`); layer-by-layer mode advances every plan's
stream block by block (depthlab.analysis.streaming); both use `through_block`, so they compute the same thing.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from depthlab.analysis.calibration import Batch, ImageBatch
from depthlab.analysis.layers import LayeredLM, Trace
from depthlab.progress import detail


@torch.no_grad()
def token_nll(logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T - 1) each next token's negative log-likelihood, and whether it is a pair of real tokens. One window's
    log-softmax at a time: a batch's (B x T x vocabulary) in fp32 is never held twice over (SmolLM2's vocabulary
    of 49,152 made that 0.4 GB per copy for 8 windows of 256)."""
    nll = torch.stack([-torch.log_softmax(lg[:-1].float(), -1).gather(-1, ids[1:, None]).squeeze(-1)
                       for lg, ids in zip(logits, batch.ids)])
    return nll, batch.mask[:, :-1] & batch.mask[:, 1:]


def next_token_nll(logits: torch.Tensor, batch: Batch) -> tuple[float, int]:
    """Summed next-token negative log-likelihood over pairs of real tokens, and their count."""
    nll, pred = token_nll(logits, batch)
    return float(nll[pred].sum()), int(pred.sum())


@torch.no_grad()
def class_scores(logits: torch.Tensor, batch: ImageBatch) -> tuple[float, int, int]:
    """Summed cross-entropy against the labels, the number of images, and how many the top-1 class gets right."""
    lg = logits.float()
    nll = F.cross_entropy(lg, batch.labels, reduction="sum")
    return float(nll), len(batch.labels), int((lg.argmax(-1) == batch.labels).sum())


def scores(logits: torch.Tensor, batch: Batch | ImageBatch) -> tuple[float, int, int]:
    """(summed loss, count, correct top-1): next-token NLL over text (correct unused: 0), cross-entropy over images."""
    if isinstance(batch, ImageBatch):
        return class_scores(logits, batch)
    return (*next_token_nll(logits, batch), 0)


@torch.no_grad()
def window_scores(logits: torch.Tensor, batch: Batch | ImageBatch) -> tuple[list[float], list[int]]:
    """Per window (a text sequence, or an image): its summed loss and its count of scored tokens (1 per image);
    what the curse index's bootstrap resamples."""
    if isinstance(batch, ImageBatch):
        nll = F.cross_entropy(logits.float(), batch.labels, reduction="none")
        return nll.tolist(), [1] * len(batch.labels)
    nll, pred = token_nll(logits, batch)
    return (nll * pred).sum(1).tolist(), pred.sum(1).tolist()


PARTS = ("attn", "mlp")  # sublayers that can be taken out alone
PART_NAMES = {"block": "whole block", "attn": "attention only", "mlp": "MLP only", "linear": "linear replacement"}


@dataclass(frozen=True)
class Plan:
    """One way of taking part of the model out. The blocks in `skip` are left out (their input goes on as their
    output); at block `at`, `part` is taken out instead: "attn" or "mlp" (that sublayer's output zeroed), or
    "linear" (the block replaced by its least-squares linear map). With `repeat` = (i, j), blocks i..j (0-based,
    inclusive) run again after block j (layer duplication, depthlab.analysis.duplication). `key` names it in the
    results."""

    key: tuple
    skip: frozenset = frozenset()
    at: int | None = None
    part: str | None = None
    repeat: tuple[int, int] | None = None

    @property
    def first(self) -> int | None:
        """The first block it changes (the stream before it is the model's own; a repeated span i..j: the stream
        after block j is); None for the model itself."""
        if self.repeat is not None:
            return self.repeat[1] + 1
        changed = [*self.skip, *([] if self.at is None else [self.at])]
        return min(changed) if changed else None

    def blocks_from_first(self, n_layers: int) -> list[int]:
        """The blocks run from the stream at `first` on, in order: a repeated span's second pass, then the rest."""
        again = range(self.repeat[0], self.repeat[1] + 1) if self.repeat is not None else ()
        return [*again, *range(self.first, n_layers)]


BASE = Plan(("base",))


def single_plans(n_layers: int, parts=("block",)) -> list[Plan]:
    """For each block: the block removed ("block"), its attention or MLP alone ("attn", "mlp"), or the block
    replaced by its linear map ("linear")."""
    return [Plan(("block", l), frozenset({l})) if part == "block" else Plan((part, l), at=l, part=part)
            for part in parts for l in range(n_layers)]


def run_plans(runs: list[tuple[int, int]]) -> list[Plan]:
    """Contiguous runs (0-based start, n) removed."""
    return [Plan(("run", s, n), frozenset(range(s, s + n))) for s, n in runs]


def drop_plans(by: str, order: list[int], k_max: int) -> list[Plan]:
    """The k least useful blocks (the first k of `order`, 0-based) removed together, k = 1..k_max."""
    return [Plan(("drop", by, k), frozenset(order[:k])) for k in range(1, min(k_max, len(order) - 1) + 1)]


def through_block(lm: LayeredLM, slot: int, j: int, plan: Plan, h: torch.Tensor, call, linear=None) -> torch.Tensor:
    """The stream after block j (held in lm.blocks[slot]) under `plan`; `linear` maps block index -> LinearMap."""
    if j in plan.skip:
        return h
    if j == plan.at:
        if plan.part == "linear":
            return linear[j](h)
        with lm.without(slot, plan.part):
            return lm.run_block(slot, h, call)
    return lm.run_block(slot, h, call)


@torch.no_grad()
def replay_state(lm: LayeredLM, tr: Trace, plan: Plan, linear=None) -> torch.Tensor:
    """The raw last stream state under `plan`, replaying only the blocks from the first one it changes, on the
    traced activations."""
    if plan.first is None:
        return tr.hidden[-1]
    h = tr.hidden[plan.first]
    for j in plan.blocks_from_first(lm.n_layers):
        detail(f"block {j + 1} of {lm.n_layers}")
        h = through_block(lm, j, j, plan, h, tr.calls[j], linear)
    return h


def replay(lm: LayeredLM, tr: Trace, plan: Plan, linear=None) -> torch.Tensor:
    """Logits under `plan` (the model's own for the model itself; a kept trace has none, and they are read off its
    last state as every plan's are)."""
    if plan.first is None and tr.logits is not None:
        return tr.logits
    return lm.logits(replay_state(lm, tr, plan, linear))


class RemovalSums:
    """Summed loss (and, for a classifier, correct top-1 predictions) per plan key, over batches; per-window
    losses of the base model and of each single-block removal (what the curse index's bootstrap resamples)."""

    def __init__(self, n_layers: int, classify: bool = False):
        self.n_layers, self.classify, self.count = n_layers, classify, 0
        self.loss: dict[tuple, float] = defaultdict(float)
        self.correct: dict[tuple, int] = defaultdict(int)
        self.windows: dict = {"count": [], BASE.key: [], **{("block", l): [] for l in range(n_layers)}}

    def add(self, key: tuple, logits: torch.Tensor, batch: Batch | ImageBatch) -> None:
        loss, count, correct = scores(logits, batch)
        if key in self.windows:
            w, c = window_scores(logits, batch)
            self.windows[key] += w
            if key == BASE.key:
                self.windows["count"] += c
        if key == BASE.key:
            self.count += count
        self.loss[key] += loss
        self.correct[key] += correct

    def track(self, keys) -> None:
        """Also keep the per-window losses of the plans with these keys."""
        self.windows.update({k: [] for k in keys})

    def window_results(self) -> dict:
        """Per window: its scored-token count, its summed loss, and each single removal's summed loss minus it."""
        base = self.windows[BASE.key]
        return {"count": self.windows["count"], "base_loss": base,
                "single_delta": [[a - b for a, b in zip(self.windows[("block", l)], base)]
                                 for l in range(self.n_layers)]}

    def row(self, key: tuple) -> dict:
        """The scores of one plan: loss and its increase; perplexity (language models) or top-1 accuracy and its
        drop (a classifier)."""
        n = max(self.count, 1)
        s, base = self.loss[key], self.loss[BASE.key]
        if self.classify:
            acc, base_acc = self.correct[key] / n, self.correct[BASE.key] / n
            return {"loss": s / n, "delta_loss": (s - base) / n, "acc": acc, "acc_drop": base_acc - acc}
        ppl = lambda x: math.exp(min(x / n, 50.0))  # noqa: E731
        return {"loss": s / n, "ppl": ppl(s), "delta_ppl": ppl(s) - ppl(base), "delta_loss": (s - base) / n}

    def results(self, n_layers: int | None = None) -> dict:
        base = self.row(BASE.key)
        out = {"base_loss": base["loss"], **({"base_acc": base["acc"]} if self.classify else {"base_ppl": base["ppl"]})}
        out.update(plan_rows(self.loss, self.row))
        out["windows"] = self.window_results()
        return out


def plan_rows(keys, row) -> dict:
    """Rows per kind of plan, from the keys scored: "single" (whole blocks), "attn", "mlp", "linear" (one row per
    block, 1-based), "runs" (contiguous runs by n), "drop" (the k least useful, by what usefulness is read from),
    "duplicate" (a span repeated, depthlab.analysis.duplication)."""
    out: dict = {}
    for part, name in (("block", "single"), *((p, p) for p in (*PARTS, "linear"))):
        blocks = sorted(k[1] for k in keys if k[0] == part)
        if blocks:
            out[name] = [{"block": l + 1, **row((part, l))} for l in blocks]
    runs = sorted((k for k in keys if k[0] == "run"), key=lambda k: k[2])
    out["runs"] = [{"n": n, "start_block": s + 1, "blocks": [s + 1, s + n], **row(("run", s, n))} for _, s, n in runs]
    drops = defaultdict(list)
    for key in sorted(k for k in keys if k[0] == "drop"):
        drops[key[1]].append({"k": key[2], **row(key)})
    if drops:
        out["drop"] = dict(drops)
    dups = sorted(k for k in keys if k[0] == "dup")
    if dups:
        out["duplicate"] = [{"start_block": i + 1, "end_block": j + 1, "n": j - i + 1, **row(("dup", i, j))}
                            for _, i, j in dups]
    return out


@torch.no_grad()
def single_layer_sweep(lm: LayeredLM, batch: Batch, tr: Trace, sums: RemovalSums, plans: list[Plan] | None = None,
                       linear=None, tick=lambda: None) -> None:
    """Add this batch's scores under each plan (default: the model itself and each block removed in turn); `tick`
    after each plan (progress)."""
    for plan in plans or [BASE, *single_plans(lm.n_layers)]:
        sums.add(plan.key, replay(lm, tr, plan, linear), batch)
        tick()


class _Skip(nn.Module):
    """Stands in for a removed block: returns the hidden state it is given."""

    def forward(self, *args, **kwargs):
        return args[0] if args else kwargs["hidden_states"]


@contextlib.contextmanager
def skipping(lm: LayeredLM, l: int):
    """The naive way, for the benchmark and as a cross-check: the model runs whole with block l swapped out."""
    blk = lm.blocks[l]
    lm.blocks[l] = _Skip()
    try:
        yield
    finally:
        lm.blocks[l] = blk


@torch.no_grad()
def naive_single_layer_sweep(lm: LayeredLM, batches: list[Batch]) -> list[float]:
    """Loss with each block removed, by L independent full forward passes per batch."""
    losses = []
    for l in range(lm.n_layers):
        tot, cnt = 0.0, 0
        with skipping(lm, l):
            for b in batches:
                s, c, _ = scores(lm.forward_fn(b.inputs, b.mask), b)
                tot, cnt = tot + s, cnt + c
        losses.append(tot / max(cnt, 1))
    return losses
