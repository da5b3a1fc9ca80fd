"""The training loop: packed batches, AdamW, warmup + cosine, clipping, accumulation, bf16 autocast,
per-token validation perplexity over the whole fixed validation set, metrics.jsonl, a final checkpoint."""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from depthlab.config import Config, validate
from depthlab.data.dataset import PackedSampler, TokenData, build_token_data, eval_batches
from depthlab.model import Transformer, lm_loss
from depthlab.train.checkpoint import save_checkpoint
from depthlab.train.optim import make_optimizer, make_scheduler


@dataclass
class RunResult:
    run_dir: Path
    checkpoint: Path
    val_loss: float
    val_ppl: float
    steps: int
    wall_s: float


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def autocast(device: torch.device, dtype: str):
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(model: Transformer, tokens: np.ndarray, seq_len: int, batch_size: int, device: torch.device,
             dtype: str = "fp32") -> dict:
    """Per-token mean loss over every window of the validation stream, and its perplexity."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in eval_batches(tokens, seq_len, batch_size):
        x, y = x.to(device), y.to(device)
        with autocast(device, dtype):
            logits = model(x)
        total += lm_loss(logits, y, reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    loss = total / count
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0)), "val_tokens": count}


def new_run_dir(cfg: Config) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.train.out_dir) / f"{cfg.preset}-{cfg.model.norm_scheme}-{stamp}"
    run_dir, i = base, 1
    while run_dir.exists():
        run_dir, i = base.with_name(f"{base.name}-{i}"), i + 1
    return run_dir


class MetricsLog:
    """Append-only metrics.jsonl, flushed every line so a crash loses nothing already logged."""

    def __init__(self, path: Path):
        self.file = open(path, "a")

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def train(cfg: Config, run_dir: Path | None = None, data: TokenData | None = None, progress: bool = True) -> RunResult:
    validate(cfg)
    t0 = time.time()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    device = resolve_device(cfg.train.device)
    seed_everything(cfg.train.seed)
    data = data or build_token_data(cfg)
    m = cfg.model
    print(f"depthlab train: preset {cfg.preset}, scheme {m.norm_scheme}, {m.n_layers} layers x {m.dim}, "
          f"{cfg.train.max_steps} steps; data: {data.source}, {len(data.train):,} train / {len(data.val):,} val tokens",
          file=sys.stderr)

    run_dir = Path(run_dir) if run_dir else new_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.save(run_dir / "config.json")
    data.tokenizer.save(str(run_dir / "tokenizer.json"))

    tc, seq_len = cfg.train, cfg.data.seq_len
    seed_everything(cfg.train.seed)  # model init independent of how much randomness the data step used
    model = Transformer(cfg.model).to(device)
    opt = make_optimizer(model, tc)
    sched = make_scheduler(opt, tc)
    sampler = PackedSampler(data.train, seq_len, tc.batch_size, tc.seed)
    log = MetricsLog(run_dir / "metrics.jsonl")
    tokens_per_step = tc.batch_size * tc.grad_accum * seq_len
    meta = {"source": data.source, "tokenizer_hash": data.tokenizer_hash, "n_params": model.num_params(),
            "train_tokens": int(len(data.train)), "val_tokens": int(len(data.val))}
    (run_dir / "run.json").write_text(json.dumps(meta, indent=2) + "\n")

    bar = tqdm(total=tc.max_steps, desc=f"train {cfg.model.norm_scheme}", disable=not progress, dynamic_ncols=True)
    model.train()
    val = {}
    t_log, tokens_since = time.time(), 0
    for step in range(1, tc.max_steps + 1):
        loss_sum = 0.0
        for _ in range(tc.grad_accum):
            x, y = (t.to(device) for t in sampler.next_batch())
            with autocast(device, tc.dtype):
                loss = lm_loss(model(x), y) / tc.grad_accum
            loss.backward()
            loss_sum += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip or float("inf")).item()
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        tokens_since += tokens_per_step

        record = None
        if step % tc.log_every == 0 or step == tc.max_steps:
            now = time.time()
            record = {"step": step, "loss": loss_sum, "lr": lr, "grad_norm": grad_norm,
                      "tokens_per_s": tokens_since / max(now - t_log, 1e-9), "tokens": step * tokens_per_step}
            t_log, tokens_since = now, 0
            bar.set_postfix(loss=f"{loss_sum:.3f}", tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
        if step % tc.eval_every == 0 or step == tc.max_steps:
            val = evaluate(model, data.val, seq_len, tc.batch_size, device, tc.dtype)
            record = {**(record or {"step": step, "loss": loss_sum, "lr": lr}), **val}
            bar.set_postfix(loss=f"{loss_sum:.3f}", val_ppl=f"{val['val_ppl']:.2f}", refresh=False)
        if record:
            log.write(record)
        bar.update(1)
    bar.close()
    log.close()

    ckpt = save_checkpoint(run_dir / "checkpoints" / f"step_{tc.max_steps:07d}", model, cfg,
                           {**meta, "step": tc.max_steps, **val}, data.tokenizer)
    return RunResult(run_dir, ckpt, val["val_loss"], val["val_ppl"], tc.max_steps, time.time() - t0)
