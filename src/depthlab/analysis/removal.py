"""Layer removal: the perplexity when one block, or a contiguous run of n blocks, is skipped; for a classifier (a
ViT), the cross-entropy against the labels and the top-1 accuracy instead.

Non-destructive: blocks are skipped by replaying the others on cached activations; no weight or module is
touched. The sweep reuses the traced pass: removing block l only re-runs blocks l+1..L from the cached input of
block l, so the single-layer sweep costs 1 + sum_l (L - l) / L = (L + 1) / 2 + 1 block-passes of L blocks,
about half of the L independent full passes a naive sweep needs.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from depthlab.analysis.calibration import Batch, ImageBatch
from depthlab.analysis.layers import LayeredLM, Trace


@torch.no_grad()
def next_token_nll(logits: torch.Tensor, batch: Batch) -> tuple[float, int]:
    """Summed next-token negative log-likelihood over pairs of real tokens, and their count."""
    pred = batch.mask[:, :-1] & batch.mask[:, 1:]
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    nll = -logp.gather(-1, batch.ids[:, 1:, None]).squeeze(-1)
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
    pred = batch.mask[:, :-1] & batch.mask[:, 1:]
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    nll = -logp.gather(-1, batch.ids[:, 1:, None]).squeeze(-1)
    return (nll * pred).sum(1).tolist(), pred.sum(1).tolist()


class RemovalSums:
    """Summed loss per removal, over batches; and, for a classifier, the correct top-1 predictions."""

    def __init__(self, n_layers: int, classify: bool = False):
        self.base, self.single, self.count = 0.0, [0.0] * n_layers, 0
        self.runs: dict[tuple[int, int], float] = {}  # (start 0-based, n) -> summed NLL
        self.classify = classify
        self.correct: dict = {}  # "base" | block l (0-based) | (start, n) -> correct top-1 predictions
        self.windows: dict = {"base": [], "count": [], **{l: [] for l in range(n_layers)}}  # per-window losses

    def add(self, key, logits: torch.Tensor, batch: Batch | ImageBatch) -> None:
        """One batch's scores for `key`: "base" (nothing removed), block l (0-based) or a run (start, n)."""
        loss, count, correct = scores(logits, batch)
        if key in self.windows:
            w, c = window_scores(logits, batch)
            self.windows[key] += w
            if key == "base":
                self.windows["count"] += c
        if key == "base":
            self.base, self.count = self.base + loss, self.count + count
        elif isinstance(key, tuple):
            self.runs[key] = self.runs.get(key, 0.0) + loss
        else:
            self.single[key] += loss
        self.correct[key] = self.correct.get(key, 0) + correct

    def window_results(self) -> dict:
        """Per window: its scored-token count, its summed loss, and each single removal's summed loss minus it."""
        base = self.windows["base"]
        return {"count": self.windows["count"], "base_loss": base,
                "single_delta": [[a - b for a, b in zip(self.windows[l], base)] for l in range(len(self.single))]}

    def results(self, n_layers: int) -> dict:
        if self.classify:
            return {**self.class_results(), "windows": self.window_results()}
        n = max(self.count, 1)
        base = self.base / n
        ppl = lambda s: math.exp(min(s / n, 50.0))  # noqa: E731
        out = {"base_loss": base, "base_ppl": ppl(self.base),
               "single": [{"block": l + 1, "loss": s / n, "ppl": ppl(s), "delta_ppl": ppl(s) - ppl(self.base),
                           "delta_loss": s / n - base} for l, s in enumerate(self.single)]}
        out["runs"] = [{"n": k, "start_block": st + 1, "blocks": [st + 1, st + k], "loss": s / n, "ppl": ppl(s),
                        "delta_ppl": ppl(s) - ppl(self.base), "delta_loss": s / n - base}
                       for (st, k), s in sorted(self.runs.items(), key=lambda x: x[0][1])]
        out["windows"] = self.window_results()
        return out

    def class_results(self) -> dict:
        """Loss and top-1 accuracy per removal: delta_loss = loss - base loss, acc_drop = base accuracy - accuracy."""
        n = max(self.count, 1)
        base, acc = self.base / n, self.correct.get("base", 0) / n

        def row(s, key):
            a = self.correct.get(key, 0) / n
            return {"loss": s / n, "delta_loss": s / n - base, "acc": a, "acc_drop": acc - a}

        runs = sorted(self.runs.items(), key=lambda x: x[0][1])
        return {"base_loss": base, "base_acc": acc,
                "single": [{"block": l + 1, **row(s, l)} for l, s in enumerate(self.single)],
                "runs": [{"n": k, "start_block": st + 1, "blocks": [st + 1, st + k], **row(s, (st, k))}
                         for (st, k), s in runs]}


@torch.no_grad()
def single_layer_sweep(lm: LayeredLM, batch: Batch, tr: Trace, sums: RemovalSums) -> None:
    """Add this batch's NLL with each block removed in turn, re-running only the suffix after the removed block."""
    L = lm.n_layers
    sums.add("base", tr.logits, batch)
    for l in range(L):
        h = lm.run_blocks(l + 1, L, tr.hidden[l], tr.calls)
        sums.add(l, lm.logits(h), batch)


@torch.no_grad()
def run_removal(lm: LayeredLM, batch: Batch, tr: Trace, runs: list[tuple[int, int]], sums: RemovalSums) -> None:
    """Blocks start..start+n-1 (0-based start) removed: stream state `start` goes straight to block start+n."""
    for start, n in runs:
        h = lm.run_blocks(start + n, lm.n_layers, tr.hidden[start], tr.calls)
        sums.add((start, n), lm.logits(h), batch)


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
