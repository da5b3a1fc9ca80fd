"""What a Trainer trains on: a task is the data, the sampler, the evaluation and what a checkpoint records of them.

The Trainer (depthlab.train.trainer) owns everything else -- the model, optimizer, schedule, loop, checkpoints and
exact resume, callbacks, run directory -- and asks its task, passing what each question needs:

    saved_tokenizer(cfg, ckpt, run_dir)     the tokenizer the data must use (None: the task makes its own, or has none)
    load_data(cfg, tokenizer, progress)     the training and validation data
    tokenizer(data)                         the tokenizer kept in the run directory and each checkpoint (or None)
    data_meta(data)                         what each checkpoint records about the data (CheckpointMeta.data);
                                            its train_* entries must match on resume
    save_run_files(run_dir, data)           what the run directory keeps of the data (its tokenizer, ...)
    tokens_per_sample(cfg)                  positions per sample, for throughput and MFU
    sampler(cfg, data, env)                 the training batches: next_batch(), state_dict(), load_state_dict()
    validation(cfg, model, data, env, device, progress)   the validation metrics ({'val_loss', ...})

Three tasks: LanguageModelling (here, the default), ImageClassification (depthlab.train.vision, the default for
model.family=vit) and Finetuning (depthlab.train.finetune). Every sampler draws from one SeededOrder
(depthlab.data.dataset), so each task's batches are seeded, per rank and resumable in the same way.
"""

from __future__ import annotations

from pathlib import Path

from depthlab.checkpoint import TOKENIZER
from depthlab.data.dataset import PackedSampler, build_token_data, save_val_tokens, tokens_digest
from depthlab.data.tokenizer import load_tokenizer, tokenizer_hash
from depthlab.eval.perplexity import evaluate
from depthlab.paths import find_checkpoint


class Task:
    """The questions a Trainer asks about its data (see the module docstring); a task keeps no state of its own."""

    def saved_tokenizer(self, cfg, ckpt: Path | None, run_dir: Path):
        return None

    def load_data(self, cfg, tokenizer, progress: bool):
        raise NotImplementedError

    def tokenizer(self, data):
        return None

    def tokenizer_hash(self, data) -> str | None:
        tok = self.tokenizer(data)
        return tokenizer_hash(tok) if tok is not None else None

    def data_meta(self, data) -> dict:
        raise NotImplementedError

    def save_run_files(self, run_dir: Path, data) -> None:
        pass

    def tokens_per_sample(self, cfg) -> int:
        raise NotImplementedError

    def sampler(self, cfg, data, env):
        raise NotImplementedError

    def validation(self, cfg, model, data, env, device, progress: bool) -> dict:
        raise NotImplementedError


class LanguageModelling(Task):
    """Next-token prediction on packed token windows: the configured text (prepared or tokenized now), its
    per-token validation loss and perplexity over the whole held-out stream."""

    def saved_tokenizer(self, cfg, ckpt: Path | None, run_dir: Path):
        """The resumed checkpoint's tokenizer (a branch's new run directory has none yet), or with
        train.init_from the parent model's (continued pretraining keeps it); None: train one."""
        if ckpt:
            return load_tokenizer(ckpt / TOKENIZER if (ckpt / TOKENIZER).is_file() else run_dir / TOKENIZER)
        if cfg.train.init_from and not cfg.data.tokenizer:
            src_tok = find_checkpoint(cfg.train.init_from) / TOKENIZER
            return load_tokenizer(src_tok) if src_tok.is_file() else None
        return None

    def load_data(self, cfg, tokenizer, progress: bool):
        return build_token_data(cfg, tokenizer=tokenizer, progress=progress)

    def tokenizer(self, data):
        return data.tokenizer

    def data_meta(self, data) -> dict:
        """Token counts; raw text tokenized for this run also records its validation tokens' digest: the run
        keeps them (VAL_TOKENS). Prepared data keeps its own memory-mapped splits."""
        counts = {"train_tokens": int(len(data.train)), "val_tokens": int(len(data.val))}
        return counts if data.meta else {**counts, "val_digest": tokens_digest(data.val)}

    def save_run_files(self, run_dir: Path, data) -> None:
        data.tokenizer.save(str(run_dir / TOKENIZER))
        if not data.meta:  # as data_meta's val_digest
            save_val_tokens(run_dir, data.val)

    def tokens_per_sample(self, cfg) -> int:
        return cfg.data.seq_len

    def sampler(self, cfg, data, env):
        tc = cfg.train
        return PackedSampler(data.train, cfg.data.seq_len, tc.batch_size, tc.seed, env.rank, env.world_size)

    def validation(self, cfg, model, data, env, device, progress: bool) -> dict:
        """{'val_loss', 'val_ppl', 'val_tokens'} over every window of the held-out stream."""
        tc = cfg.train
        return evaluate(model, data.val, cfg.data.seq_len, tc.batch_size, device, tc.dtype, env, tc.loss_chunk,
                        progress)
