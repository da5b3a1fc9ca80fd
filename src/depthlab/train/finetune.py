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

import sys
from pathlib import Path

import numpy as np
import torch

from depthlab import UserError
from depthlab.data.dataset import OrderedSampler, SeededOrder
from depthlab.data.instructions import InstructionData, build_instruction_data
from depthlab.eval.perplexity import response_loss
from depthlab.train.distributed import shutdown
from depthlab.train.tasks import LanguageModelling
from depthlab.train.trainer import Trainer


class ExampleSampler(OrderedSampler):
    """Batches of padded examples (rows) and their targets in the SeededOrder of the rows."""

    def __init__(self, x: np.ndarray, y: np.ndarray, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1):
        self.rows, self.targets = x.reshape(-1, seq_len), y.reshape(-1, seq_len)
        self.order = SeededOrder(len(self.rows), batch_size, seed, rank, world_size, same="data, seq_len",
                                 windows=len(self.rows), seq_len=seq_len)

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
