"""Layer removal: the perplexity when one block, or a contiguous run of n blocks, is skipped.

Non-destructive: blocks are skipped by replaying the others on cached activations; no weight or module is
touched. The sweep reuses the traced pass: removing block l only re-runs blocks l+1..L from the cached input of
block l, so the single-layer sweep costs 1 + sum_l (L - l) / L = (L + 1) / 2 + 1 block-passes of L blocks,
about half of the L independent full passes a naive sweep needs.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from depthlab.analysis.calibration import Batch
from depthlab.analysis.layers import LayeredLM, Trace


@torch.no_grad()
def next_token_nll(logits: torch.Tensor, batch: Batch) -> tuple[float, int]:
    """Summed next-token negative log-likelihood over pairs of real tokens, and their count."""
    pred = batch.mask[:, :-1] & batch.mask[:, 1:]
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    nll = -logp.gather(-1, batch.ids[:, 1:, None]).squeeze(-1)
    return float(nll[pred].sum()), int(pred.sum())


class RemovalSums:
    """Summed NLL per removal, over batches."""

    def __init__(self, n_layers: int):
        self.base, self.single, self.count = 0.0, [0.0] * n_layers, 0
        self.runs: dict[tuple[int, int], float] = {}  # (start 0-based, n) -> summed NLL

    def results(self, n_layers: int) -> dict:
        n = max(self.count, 1)
        base = self.base / n
        ppl = lambda s: math.exp(min(s / n, 50.0))  # noqa: E731
        out = {"base_loss": base, "base_ppl": ppl(self.base),
               "single": [{"block": l + 1, "loss": s / n, "ppl": ppl(s), "delta_ppl": ppl(s) - ppl(self.base),
                           "delta_loss": s / n - base} for l, s in enumerate(self.single)]}
        out["runs"] = [{"n": k, "start_block": st + 1, "blocks": [st + 1, st + k], "loss": s / n, "ppl": ppl(s),
                        "delta_ppl": ppl(s) - ppl(self.base)} for (st, k), s in sorted(self.runs.items(),
                                                                                        key=lambda x: x[0][1])]
        return out


@torch.no_grad()
def single_layer_sweep(lm: LayeredLM, batch: Batch, tr: Trace, sums: RemovalSums) -> None:
    """Add this batch's NLL with each block removed in turn, re-running only the suffix after the removed block."""
    L = lm.n_layers
    base, count = next_token_nll(tr.logits, batch)
    sums.base += base
    sums.count += count
    for l in range(L):
        h = lm.run_blocks(l + 1, L, tr.hidden[l], tr.calls)
        sums.single[l] += next_token_nll(lm.logits(h), batch)[0]


@torch.no_grad()
def run_removal(lm: LayeredLM, batch: Batch, tr: Trace, runs: list[tuple[int, int]], sums: RemovalSums) -> None:
    """Blocks start..start+n-1 (0-based start) removed: stream state `start` goes straight to block start+n."""
    for start, n in runs:
        h = lm.run_blocks(start + n, lm.n_layers, tr.hidden[start], tr.calls)
        sums.runs[(start, n)] = sums.runs.get((start, n), 0.0) + next_token_nll(lm.logits(h), batch)[0]


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
                s, c = next_token_nll(lm.forward_fn(b.ids, b.mask), b)
                tot, cnt = tot + s, cnt + c
        losses.append(tot / max(cnt, 1))
    return losses
