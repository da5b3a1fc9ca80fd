"""Supervised fine-tuning on instruction data in Commonsense170K's format, with the pretraining trainer.

Records: `{"instruction", "input", "output", "answer"}` (LLM-Adapters' `commonsense_170k.json`), as one JSON
array or as JSON lines. Each record becomes one example, in the prompt template of LLM-Adapters' `finetune.py`
(`generate_prompt`, the Alpaca template with that code's literal indentation, kept byte for byte so a model
fine-tuned here answers prompts built by LLM-Adapters' `commonsense_evaluate.py` and vice versa):

    [start token] + encode(prompt) + encode(output) + [end of text]

The prompt and the response are encoded separately and joined, so the boundary is exact; the targets are -100
on the prompt's tokens (no loss there: LLM-Adapters' `train_on_inputs=False`) and on padding. Examples are
padded, not packed: each is one row of seq_len + 1 tokens, right-padded (causal attention never lets a real
token see the padding), longer ones truncated at the end (LLM-Adapters' `cutoff_len`); an example whose
response does not fit at all is dropped with a warning. The training loop is depthlab's `Trainer` with the
`Finetuning` task (its sampler and validation loss; depthlab.train.tasks): exact resume, atomic checkpoints,
metrics.jsonl, progress bar.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from depthlab import UserError
from depthlab.data.dataset import SeededOrder, TokenData
from depthlab.data.instructions import prompt_of, read_records
from depthlab.data.tokenizer import eot_id
from depthlab.model import loss_of
from depthlab.train.distributed import shutdown
from depthlab.train.runtime import autocast
from depthlab.train.tasks import LanguageModelling
from depthlab.train.trainer import Trainer

IGNORE = -100
def encode_examples(tok, records: list[dict], start: int | None, eot: int) -> list[tuple[list[int], int]]:
    """(token ids, number of prompt tokens) of each record: start, prompt, response, end of text."""
    prompts = tok.encode_batch([prompt_of(r["instruction"], r["input"]) for r in records], add_special_tokens=False)
    responses = tok.encode_batch([r["output"] for r in records], add_special_tokens=False)
    head = [] if start is None else [start]
    return [(head + p.ids + r.ids + [eot], len(head) + len(p.ids)) for p, r in zip(prompts, responses)]


def encode_example(tok, rec: dict, start: int | None, eot: int) -> tuple[list[int], int]:
    """encode_examples of one record."""
    return encode_examples(tok, [rec], start, eot)[0]


def pad_examples(examples: list[tuple[list[int], int]], seq_len: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each (N, seq_len): right-padded rows, targets -100 on prompt and padding."""
    x = np.full((len(examples), seq_len), pad, dtype=np.int32)  # int32: Commonsense170K padded is 350 MB, not 700
    y = np.full((len(examples), seq_len), IGNORE, dtype=np.int32)
    for i, (ids, n_prompt) in enumerate(examples):
        ids = ids[:seq_len + 1]
        x[i, :len(ids) - 1] = ids[:-1]
        y[i, n_prompt - 1:len(ids) - 1] = ids[n_prompt:]
    return x, y


@dataclass
class InstructionData(TokenData):
    """TokenData whose train / val are padded rows, flattened (seq_len each), with their targets."""

    train_targets: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    val_targets: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))


def build_instruction_data(path: str | Path, tok, seq_len: int, warn=print) -> InstructionData:
    """Read, encode and pad an instruction file; about a tenth of the records (at least one) held out."""
    records = read_records(path)
    if len(records) < 2:
        raise UserError(f"{path}: one record; fine-tuning holds out about a tenth of the records (at least one) for "
                        "validation, so it needs at least two")
    eot = eot_id(tok)
    examples = encode_examples(tok, records, eot, eot)
    keep = [i for i, (_, n) in enumerate(examples) if n < seq_len + 1]
    if len(keep) < len(examples):
        lines = [records[i]["line"] for i, (_, n) in enumerate(examples) if n >= seq_len + 1]
        warn(f"depthlab: warning: {path}: dropped {len(lines)} record(s) whose prompt fills seq_len {seq_len} "
             f"(lines {', '.join(map(str, lines[:5]))}{'...' if len(lines) > 5 else ''})")
    if not keep:
        raise UserError(f"{path}: no record's response fits in seq_len {seq_len}; raise --seq-len")
    examples = [examples[i] for i in keep]
    if len(examples) < 2:
        raise UserError(f"{path}: only one record fits in seq_len {seq_len}, and validation needs another; raise "
                        "--seq-len")
    n_val = max(1, len(examples) // 10)
    x, y = pad_examples(examples, seq_len, eot)
    tx, ty, vx, vy = x[:len(x) - n_val], y[:len(y) - n_val], x[len(x) - n_val:], y[len(y) - n_val:]
    source = f"{path} ({len(tx)} train / {len(vx)} validation examples, padded to {seq_len})"
    return InstructionData(tok, tx.reshape(-1), vx.reshape(-1), source, train_targets=ty.reshape(-1),
                           val_targets=vy.reshape(-1))


class ExampleSampler:
    """Batches of padded examples (rows) and their targets in the SeededOrder of the rows."""

    def __init__(self, x: np.ndarray, y: np.ndarray, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1):
        self.rows, self.targets = x.reshape(-1, seq_len), y.reshape(-1, seq_len)
        self.order = SeededOrder(len(self.rows), batch_size, seed, rank, world_size, same="data, seq_len",
                                 windows=len(self.rows), seq_len=seq_len)

    def state_dict(self) -> dict:
        return self.order.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.order.load_state_dict(state)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.order.next()
        return torch.from_numpy(self.rows[idx]).long(), torch.from_numpy(self.targets[idx]).long()


TASK = "finetune"  # a fine-tuning checkpoint's data["task"] (CheckpointMeta): its validation loss is the responses'


class Finetuning(LanguageModelling):
    """Language modelling on padded instruction examples (InstructionData): the loss, in training and validation,
    is the response tokens'; the checkpoint is marked `task: finetune`. The data is the instruction file encoded
    with the model's own tokenizer (`finetune()` builds it and hands it to the Trainer)."""

    def load_data(self, cfg, tokenizer, progress: bool) -> InstructionData:
        if tokenizer is None:
            raise UserError("fine-tuning encodes the instructions with the model's own tokenizer; set "
                            "train.init_from to a checkpoint with one")
        return build_instruction_data(cfg.data.paths[0], tokenizer, cfg.data.seq_len,
                                      lambda msg: print(msg, file=sys.stderr))

    def data_meta(self, data) -> dict:
        return {**super().data_meta(data), "task": TASK}

    def sampler(self, cfg, data, env) -> ExampleSampler:
        tc = cfg.train
        return ExampleSampler(data.train, data.train_targets, cfg.data.seq_len, tc.batch_size, tc.seed, env.rank,
                              env.world_size)

    def validation(self, cfg, model, data, env, device, progress: bool) -> dict:
        return response_loss(model, data.val, data.val_targets, cfg.data.seq_len, cfg.train.batch_size, device,
                             cfg.train.dtype)


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


def finetune_config(model: str, data: str, seq_len: int | None = None, overrides: list[str] | None = None,
                    lora=None):
    """The fine-tuning config: the model's own architecture and data settings, its weights as init_from, the
    instruction file as data, and fine-tuning defaults (lr 3e-4 -- LLM-Adapters' full fine-tuning used 1e-4 to
    3e-4 on 7B models, and 3e-4 for LoRA --, 100 warmup steps scaled down to the run, weight decay 0) before --set
    overrides. `lora` (a LoraConfig): LoRA adapters instead of full fine-tuning (depthlab.model.lora)."""
    from depthlab.checkpoint import CONFIG
    from depthlab.config import Config, LoraConfig, apply_overrides
    from depthlab.model.lora import check_lora, require_peft
    from depthlab.model.validate import validate
    from depthlab.paths import find_checkpoint

    ckpt = find_checkpoint(model)
    cfg = Config.load(ckpt / CONFIG)
    cfg.train.init_from, cfg.data.paths = str(model), [str(data)]
    cfg.train.lora = lora or LoraConfig()  # a LoRA run as MODEL: its merged weights start this run
    cfg.data.seq_len = seq_len or min(256, cfg.model.max_seq_len)
    cfg.train.lr, cfg.train.weight_decay, cfg.train.monitor_every = 3e-4, 0.0, 0
    cfg.train.max_steps, cfg.train.eval_every, cfg.train.ckpt_every = 200, 50, 0
    cfg.train.warmup_steps = min(cfg.train.warmup_steps, 20)
    cfg = apply_overrides(cfg, list(overrides or []))
    check_lora(cfg.train.lora)
    if cfg.train.lora.rank:
        require_peft()
    if cfg.data.seq_len > cfg.model.max_seq_len:
        raise UserError(f"--seq-len {cfg.data.seq_len} is beyond the model's context of {cfg.model.max_seq_len}")
    return validate(cfg), ckpt


def validation_of_finetune(loaded, batch_size: int, device) -> dict:
    """A fine-tuning checkpoint's own validation: the held-out records of its instruction file, scored on their
    response tokens as during fine-tuning."""
    cfg = loaded.cfg
    data = build_instruction_data(cfg.data.paths[0], loaded.fast_tokenizer(), cfg.data.seq_len,
                                  lambda msg: print(msg, file=sys.stderr))
    return response_loss(loaded.model, data.val, data.val_targets, cfg.data.seq_len, batch_size, device,
                         cfg.train.dtype)


def finetune(cfg, ckpt: Path, run_dir=None, resume: str | None = None, progress: bool = True,
             overwrite: bool = False):
    """Fine-tune `ckpt`'s weights on cfg.data.paths[0]; the trainer's RunResult."""
    from depthlab.checkpoint import TOKENIZER
    from depthlab.data.tokenizer import load_tokenizer
    from depthlab.ownership import refuse_own_input
    from depthlab.runfolder import new_run_dir

    # before the records are read: the Trainer checks again, but only once they are encoded
    refuse_own_input(run_dir or new_run_dir(cfg), [cfg.train.init_from, ckpt, *cfg.data.paths], "finetune")
    if not (ckpt / TOKENIZER).is_file():
        raise UserError(f"{ckpt} has no {TOKENIZER}; fine-tuning encodes the instructions with the model's own")
    data = build_instruction_data(cfg.data.paths[0], load_tokenizer(ckpt / TOKENIZER), cfg.data.seq_len,
                                  lambda msg: print(msg, file=sys.stderr))
    trainer = Trainer(cfg, run_dir=run_dir, resume=resume, data=data, progress=progress, overwrite=overwrite,
                      task=Finetuning())
    try:
        return trainer.train()
    finally:
        trainer.close()
        shutdown(trainer.env)
