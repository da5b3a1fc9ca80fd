"""Per-token loss and perplexity: over every window of a token stream (the trainer's validation, `depthlab eval`
on a language model, the studies), and over the response tokens of padded instruction examples (a fine-tune's
validation). Under torchrun the trainer hands `evaluate` its ranks (anything with `rank`, `world_size` and `sum`:
depthlab.train.distributed.DistEnv), so evaluation itself needs nothing of the training package."""

from __future__ import annotations

import math
import sys
from typing import Protocol

import numpy as np
import torch

from depthlab.config import TrainConfig
from depthlab.data.dataset import eval_batches
from depthlab.data.instructions import IGNORE, build_instruction_data
from depthlab.device import autocast
from depthlab.model import loss_of
from depthlab.progress import progress_bar


class Ranks(Protocol):
    """The processes an evaluation's batches are dealt out to, and the sum of a list of floats over them."""

    rank: int
    world_size: int

    def sum(self, values: list[float]) -> list[float]: ...


class OneRank:
    rank, world_size = 0, 1

    def sum(self, values: list[float]) -> list[float]:
        return values


@torch.no_grad()
def evaluate(model: torch.nn.Module, tokens: np.ndarray, seq_len: int, batch_size: int, device: torch.device,
             dtype: str = "fp32", env: Ranks | None = None, loss_chunk: int = TrainConfig.loss_chunk,
             progress: bool = False, desc: str = "validation") -> dict:
    """Per-token mean loss over every window of the validation stream, and its perplexity. Under torchrun
    the batches are dealt out to the ranks; every rank runs the same number of forwards (FSDP needs that).
    `progress`: a bar of this rank's batches on a terminal, named `desc`."""
    env = env or OneRank()
    was_training = model.training
    model.eval()
    total, count, mine, filler = 0.0, 0, 0, None
    n_batches = math.ceil(((len(tokens) - 1) // seq_len) / batch_size)
    bar = progress_bar(total=math.ceil(n_batches / env.world_size), enabled=progress, desc=desc,
                       unit="batch")
    for b, (x, y) in enumerate(eval_batches(tokens, seq_len, batch_size)):
        filler = filler if filler is not None else x
        if b % env.world_size != env.rank:
            continue
        with autocast(device, dtype):
            total += loss_of(model, x.to(device), y.to(device), reduction="sum", loss_chunk=loss_chunk).item()
        count += y.numel()
        mine += 1
        bar.update(1)
    bar.close()
    for _ in range(math.ceil(n_batches / env.world_size) - mine):  # FSDP: every rank runs as many forwards
        with autocast(device, dtype):
            loss_of(model, filler.to(device), filler.to(device), loss_chunk=loss_chunk)  # no full logits either
    model.train(was_training)
    total, count = env.sum([total, float(count)])
    loss = total / count
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0)), "val_tokens": int(count)}


def first_tokens(tokens, n_tokens: int | None, seq_len: int):
    """The start of a token stream that `evaluate` scores in ceil(n_tokens / seq_len) whole windows (each window's
    seq_len inputs and the seq_len tokens after them): all of it when n_tokens is None or beyond it."""
    if n_tokens is None:
        return tokens
    return tokens[:-(-n_tokens // seq_len) * seq_len + 1]


@torch.no_grad()
def response_loss(model, x: np.ndarray, y: np.ndarray, seq_len: int, batch_size: int, device, dtype="fp32") -> dict:
    """Mean loss over the response tokens of padded examples (flattened rows), and its perplexity."""
    was = model.training
    model.eval()
    rows, targets = x.reshape(-1, seq_len), y.reshape(-1, seq_len)
    total, count = 0.0, 0
    for i in range(0, len(rows), batch_size):
        xb, yb = (torch.from_numpy(a[i:i + batch_size]).long() for a in (rows, targets))
        with autocast(torch.device(device), dtype):
            total += loss_of(model, xb.to(device), yb.to(device), reduction="sum").item()
        count += int((yb != IGNORE).sum())
    model.train(was)
    loss = total / max(count, 1)
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0)), "val_tokens": count}


def finetune_validation(loaded, batch_size: int, device) -> dict:
    """A fine-tuning checkpoint's own validation: the held-out records of its instruction file, scored on their
    response tokens as during fine-tuning."""
    cfg = loaded.cfg
    data = build_instruction_data(cfg.data.paths[0], loaded.fast_tokenizer(), cfg.data.seq_len,
                                  lambda msg: print(msg, file=sys.stderr))
    return response_loss(loaded.model, data.val, data.val_targets, cfg.data.seq_len, batch_size, device,
                         cfg.train.dtype)
