"""The training loop.

Packed batches, AdamW, warmup + cosine, clipping, gradient accumulation (gradient sync only on the last
micro-batch), bf16 autocast, per-token validation perplexity over the whole fixed validation set,
metrics.jsonl, atomic checkpoints with exact resume, a non-finite guard, and callbacks for everything else
(depth monitors, TensorBoard, W&B). Single process, or DDP / FSDP2 under torchrun. The run directory it writes
(which one, what it resumes, its metrics log) is depthlab.runfolder's; the checkpoint format depthlab.checkpoint's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from depthlab import UserError
from depthlab.checkpoint import (
    CHECKPOINTS,
    CONFIG,
    CheckpointMeta,
    is_sharded,
    load_sharded_state,
    load_trainer_state,
    load_verified,
    load_weights,
    prune_checkpoints,
    rank0_decides,
    save_checkpoint,
    save_sharded,
    step_dir,
)
from depthlab.config import Config, TrainConfig, per_rank_batch
from depthlab.data.dataset import TokenData
from depthlab.device import autocast, resolve_device
from depthlab.loading import plain_weights
from depthlab.model import lora
from depthlab.model.validate import check_fits_host, validate
from depthlab.paths import ENV, METRICS, find_checkpoint
from depthlab.progress import eta_text, on_terminal
from depthlab.runfolder import MetricsLog, check_resumable, open_run
from depthlab.train.callbacks import Callback, DepthMonitor, TensorBoardLogger, TrackioLogger, WandbLogger
from depthlab.train.distributed import (
    all_reduce_sum,
    barrier,
    build_parallel,
    full_model_state,
    full_optimizer_state,
    grad_sync,
    init_distributed,
    load_full_state,
    local_device,
    mesh_shape,
    shutdown,
)
from depthlab.train.flops import Meter
from depthlab.train.optim import clip_gradients, make_optimizer, make_scheduler, optimizer_split
from depthlab.train.runtime import deferred_interrupts, environment, rng_state, seed_everything, set_rng_state
from depthlab.train.tasks import LanguageModelling, Task
from depthlab.train.vision import ImageClassification


class TrainingDiverged(UserError):
    pass


def backward_steps(model, next_batch, tc: TrainConfig, device: torch.device, n: int = 0):
    """The forward and backward passes of one optimizer step: `n` (0: train.grad_accum) micro-batches (x, y) from
    next_batch(), each loss over grad_accum under autocast, the gradients synchronized across ranks on the last
    one only; yields each micro-batch's loss after its backward. Trainer.train_step takes its step with it, and
    depthlab.memtrack measures the same step."""
    n = n or tc.grad_accum
    for micro in range(n):
        x, y = next_batch()
        with grad_sync(model, micro == n - 1), autocast(device, tc.dtype):
            loss = model(x, targets=y, loss_chunk=tc.loss_chunk) / tc.grad_accum
        loss.backward()
        yield loss


@dataclass
class RunResult:
    run_dir: Path
    checkpoint: Path
    val_loss: float
    val_ppl: float
    steps: int
    wall_s: float
    val: dict = field(default_factory=dict)  # every validation metric (a ViT's val_acc too)


class Trainer:
    """One training run: opens (or resumes) its run directory and holds its lock, builds the data (through its
    task), model and optimizer from the config, then `train()` steps to train.max_steps, writing metrics.jsonl,
    validation and checkpoints and calling the callbacks. The task (depthlab.train.tasks) is what is trained on:
    data, sampler, validation and what a checkpoint records of the data; by default image classification for
    model.family=vit, else language modelling (fine-tuning passes its own). `train(cfg)` below runs one and
    releases the directory."""

    def __init__(self, cfg: Config, run_dir: str | Path | None = None, resume: str | None = None,
                 data: TokenData | None = None, callbacks: list[Callback] | None = None, progress: bool = True,
                 overwrite: bool = False, task: Task | None = None):
        self.cfg = validate(cfg)
        self.task = task or (ImageClassification() if cfg.model.is_vit else LanguageModelling())
        tc = cfg.train
        if tc.threads:
            torch.set_num_threads(tc.threads)
        self.device = resolve_device(tc.device, "train.device")
        self.env = init_distributed(self.device, tc.dist_timeout_s)
        self.device = local_device(self.device, self.env)
        self.cfg = cfg = dataclasses.replace(cfg, train=dataclasses.replace(
            tc, batch_size=per_rank_batch(tc, self.env.world_size)))
        tc = cfg.train
        mesh_shape(tc, self.env.world_size)  # a layout that does not fit the ranks: one line, before any work
        if self.device.type == "cpu":  # before the tokenizer and the model are sized by the config
            check_fits_host(cfg)
        self.progress = progress and self.env.is_main
        self._held = contextlib.ExitStack()  # the run directory's lock, held until close()
        try:  # the run directory, locked, and the checkpoint it resumes (depthlab.runfolder)
            opened = open_run(cfg, self.env, self._held, run_dir, resume, overwrite, self._warn)
            self.run_dir, self.branch_of = opened.run_dir, opened.branch_of
            if self.env.is_main:  # first, before minutes of data preparation: where to look (on stdout, so that a
                # mistake found while preparing the data stays the one line on stderr)
                print(f"depthlab train: run directory {self.run_dir}", flush=True)
            self._build(data, opened.ckpt, opened.meta)
        except BaseException:
            self.close()
            raise
        self.callbacks = list(callbacks or [])
        if tc.monitor_every:
            self.callbacks.append(DepthMonitor(tc.monitor_every))
        if tc.tensorboard:
            self.callbacks.append(TensorBoardLogger())
        if tc.wandb:
            self.callbacks.append(WandbLogger())
        if tc.trackio:
            self.callbacks.append(TrackioLogger())
        if not self.env.is_main:  # rank 0 logs; other ranks only take part in collectives
            self.callbacks = [c for c in self.callbacks if isinstance(c, DepthMonitor)]

    def close(self) -> None:
        """Release the run directory (also done by the OS if the process dies); under torchrun the model too: a
        DDP wrapper's reducer holds the process group, and must go while the group is still registered, or the
        group is destroyed from the reducer's destructor, where it can deadlock (distributed.shutdown says how)."""
        self._held.close()
        if self.env.enabled:
            for name in ("model", "module", "layers", "opt", "sched"):
                vars(self).pop(name, None)
            gc.collect()  # the wrappers hold reference cycles

    # ------------------------------------------------------------------ setup
    def _build(self, data: TokenData | None, ckpt: Path | None, resumed: CheckpointMeta | None) -> None:
        tc, cfg = self.cfg.train, self.cfg
        seed_everything(tc.seed)
        self.data = data or self._shared_data(self.task.saved_tokenizer(cfg, ckpt, self.run_dir))
        self.tokenizer = self.task.tokenizer(self.data)  # None for images

        seed_everything(tc.seed)  # model init does not depend on how much randomness the data step used
        self.module, self.model = build_parallel(cfg.model, tc, self.env, self.device)
        if tc.init_from and not ckpt:
            self._init_from(tc.init_from)
        if tc.lora.rank:
            self._add_adapters()
        self.layers = self.module.layers
        self.opt = make_optimizer(self.model, cfg)
        self.sched = make_scheduler(self.opt, tc)
        self.sampler = self.task.sampler(cfg, self.data, self.env)
        self.step, self.skipped, self.last_ckpt, self.verdicts, self.data_s = 0, 0, None, {}, 0.0
        self.skipped_in_a_row = 0
        self.meta = CheckpointMeta(step=0, source=self.data.source, tokenizer_hash=self.task.tokenizer_hash(self.data),
                                   n_params=self.module.num_params(), world_size=self.env.world_size,
                                   cwd=os.getcwd(), data=self.task.data_meta(self.data))
        if ckpt:
            self._restore(ckpt, resumed)

    def _shared_data(self, tokenizer):
        """The task's load_data on every rank, with one tokenizer: when there is none yet, rank 0 trains it (or
        fails, and every rank reports its error) and the other ranks take it, instead of each training its own."""
        if tokenizer is not None or not self.env.enabled:
            return self.task.load_data(self.cfg, tokenizer, self.progress)
        first = None
        if self.env.is_main:
            try:
                first = self.task.load_data(self.cfg, None, self.progress)
                made = self.task.tokenizer(first)
                shared = made.to_str() if made is not None else None
            except UserError as e:
                shared = e
        else:
            shared = None
        shared = self.env.broadcast(shared)
        if isinstance(shared, UserError):
            raise shared
        if first is not None:
            return first
        from tokenizers import Tokenizer

        return self.task.load_data(self.cfg, Tokenizer.from_str(shared) if shared is not None else None, self.progress)

    def validation(self) -> dict:
        """The task's validation metrics of the model now ({'val_loss', ...})."""
        return self.task.validation(self.cfg, self.model, self.data, self.env, self.device, self.progress)

    def _init_from(self, path: str) -> None:
        """Continued pretraining: weights from a checkpoint, everything else fresh. The scheme may differ from the
        checkpoint's (pre and lns share every weight), the shapes may not."""
        src = find_checkpoint(path)
        rank0_decides(self.env, lambda: load_verified(src))  # every rank hashes its share of the files
        # ProRes's ramps (`*.ramp`) are schedule state, not weights: a fresh run starts its own warm-up at 0
        state = {k: v for k, v in plain_weights(src).items() if not k.endswith(".ramp")}
        mine = {k: tuple(v.shape) for k, v in self.module.state_dict().items()  # global shapes, also sharded
                if not k.endswith(".ramp")}
        wrong = next((f"{k}: {tuple(v.shape)} in the checkpoint, {mine[k]} here" for k, v in state.items()
                      if k in mine and tuple(v.shape) != mine[k]), None)
        if wrong:
            raise UserError(f"cannot start from {src}: its weights do not fit this model ({wrong})")
        missing = [k for k in mine if k not in state and not (self.cfg.model.tie_embeddings and k == "lm_head.weight")]
        unexpected = [k for k in state if k not in mine]
        if missing or unexpected:
            raise UserError(f"cannot start from {src}: missing {missing[:3]}, unexpected {unexpected[:3]} "
                            f"(scheme {self.cfg.model.norm_scheme!r} has other parameters than the checkpoint's)")
        load_full_state(self.module, None, state)
        self._warn(f"depthlab: starting from the weights of {src}")

    def _add_adapters(self) -> None:
        """LoRA (train.lora): adapters on the weights just loaded, which freeze; the optimizer, built next, holds
        only the adapters."""
        if self.env.enabled:
            raise UserError("LoRA fine-tuning runs in one process; launch it without torchrun")
        lora.check_lora(self.cfg.train.lora)
        n = lora.add_adapters(self.module, self.cfg.train.lora)
        self._warn(f"depthlab: LoRA rank {self.cfg.train.lora.rank} on {', '.join(self.cfg.train.lora.targets)}: "
                   f"{n:,} trainable of {self.module.num_params():,} parameters")

    def _warn(self, msg: str) -> None:
        if self.env.is_main:
            print(msg, file=sys.stderr)

    def _restore(self, ckpt: Path, meta: CheckpointMeta) -> None:
        """Continue from `ckpt` (its meta verified by rank 0): weights, optimizer, schedule, RNGs, data position."""
        check_resumable(ckpt, meta, self.cfg, self.env.world_size, self.meta)
        state = load_trainer_state(ckpt)
        if is_sharded(ckpt):  # every rank reads only what its shards need, resharding to this world size
            load_sharded_state(ckpt, self.module, self.opt)
        else:
            load_full_state(self.module, self.opt, lora.peft_names(load_weights(ckpt)), state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        own_cuda = state.get("cuda_rng", [])  # each rank's own device's generator
        if torch.cuda.is_available() and self.env.rank < len(own_cuda) and own_cuda[self.env.rank] is not None:
            torch.cuda.set_rng_state(own_cuda[self.env.rank])
        self.sampler.load_state_dict(meta.loader)
        self.step, self.skipped, self.last_ckpt = meta.step, meta.skipped, ckpt
        self.verdicts[ckpt.name] = True
        self._warn(f"depthlab: resuming {ckpt} at step {self.step}")

    # ------------------------------------------------------------------ checkpoints
    def save(self, val: dict | None = None) -> Path:
        """A checkpoint of this step (`val`: its validation metrics, when it evaluated): the full format in one
        process, the sharded one on several ranks (every rank writes its own shards; nothing is gathered)."""
        local = [v.to_local() if hasattr(v, "to_local") else v for v in self.module.state_dict().values()]
        (bad,) = all_reduce_sum([float(not all(torch.isfinite(v).all() for v in local if v.is_floating_point()))],
                                self.env)
        if bad:
            raise TrainingDiverged(f"refusing to save non-finite weights at step {self.step}; "
                                   f"last good checkpoint: {self.last_ckpt or 'none'}")
        path = self.run_dir / CHECKPOINTS / step_dir(self.step)
        meta = dataclasses.replace(self.meta, step=self.step, skipped=self.skipped, loader=self.sampler.state_dict(),
                                   val=val or {})
        rngs = self.env.gather(rng_state())
        trainer_state = {"scheduler": self.sched.state_dict(), "rng": rngs[0],
                         "cuda_rng": [r.get("cuda") for r in rngs]}
        if self.env.enabled:
            save_sharded(path, self.module, self.opt, self.cfg, meta, self.tokenizer, trainer_state, self.env)
        else:
            trainer_state["optimizer"] = full_optimizer_state(self.module, self.opt)
            save_checkpoint(path, lora.checkpoint_names(full_model_state(self.module)), self.cfg, meta,
                            self.tokenizer, trainer_state)
        if self.env.is_main:
            self.verdicts[path.name] = True
            prune_checkpoints(self.run_dir, self.cfg.train.keep_last, self.verdicts)
        barrier(self.env)
        self.last_ckpt = path
        return path

    # ------------------------------------------------------------------ loop
    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        x, y = (t.to(self.device) for t in self.sampler.next_batch())
        self.data_s += time.perf_counter() - t0
        return x, y

    def train_step(self) -> tuple[float, float]:
        """One optimizer step over grad_accum micro-batches: (mean loss, gradient norm before clipping)."""
        tc = self.cfg.train
        loss_sum = 0.0
        for loss in backward_steps(self.model, self._next_batch, tc, self.device):
            loss_sum += loss.item()
        for cb in self.callbacks:
            cb.on_after_backward(self, self.step + 1)
        grad_norm = clip_gradients(self.model, self.cfg)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        (loss_sum,) = all_reduce_sum([loss_sum], self.env)
        return loss_sum / self.env.world_size, grad_norm

    def _start_run(self) -> MetricsLog:
        """Rank 0: the run directory's config, tokenizer and environment, a one-line banner, and the metrics log
        (from this step on: later lines, a kill's partial line, or a branch's parent lines are dealt with)."""
        tc, m = self.cfg.train, self.cfg.model
        counts = self.meta.data
        unit = next(k for k in counts if k.startswith("train_")).split("_", 1)[1]
        sizes = f"{counts['train_' + unit]:,} train / {counts['val_' + unit]:,} val {unit}"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.cfg.save(self.run_dir / CONFIG)
        self.task.save_run_files(self.run_dir, self.data)
        (self.run_dir / ENV).write_text(json.dumps(environment(self.device, self.env), indent=2) + "\n")
        print(f"depthlab train: preset {self.cfg.preset}, scheme {m.norm_scheme}, {m.n_layers} layers x {m.dim} "
              f"({self.module.num_params() / 1e6:.1f}M params), {tc.max_steps} steps on {self.env.world_size} x "
              f"{self.device.type}; data: {self.data.source}, {sizes}", file=sys.stderr)
        if tc.optimizer != "adamw":
            print(f"depthlab train: optimizers: {optimizer_split(self.model, self.opt)}", file=sys.stderr)
        source = self.branch_of / METRICS if self.branch_of else None
        return MetricsLog(self.run_dir / METRICS, self.step, source, warn=self._warn)

    def train(self) -> RunResult:
        tc = self.cfg.train
        t0 = time.time()
        log = self._start_run() if self.env.is_main else None
        meter = Meter(self)
        for cb in self.callbacks:
            cb.on_train_start(self)
        # a bar on a terminal; into a log, a pipe or with --no-progress, a line a record instead (_after_step)
        bar = tqdm(total=tc.max_steps, initial=self.step, desc=f"train {self.cfg.model.norm_scheme}",
                   disable=not on_terminal(self.progress), dynamic_ncols=True)
        self._clock = (time.monotonic(), self.step)  # the plain step lines' elapsed time and estimate (_after_step)
        self.model.train()
        val: dict = {}
        with deferred_interrupts(self.env) as stopping:  # Ctrl-C / SIGTERM: this step ends, is saved, then we stop
            while self.step < tc.max_steps:
                for cb in self.callbacks:
                    cb.on_step_start(self, self.step + 1)
                lr = self.sched.get_last_lr()[0]
                loss, grad_norm = self.train_step()
                if not self._finite(loss, grad_norm):
                    continue
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
                self.step += 1
                val = self._after_step(loss, lr, grad_norm, meter, bar, log) or val
                bar.update(1)
                if stopping():
                    bar.close()
                    self._stop_interrupted()
        bar.close()
        for cb in self.callbacks:
            cb.on_train_end(self)
        if log:
            log.close()
        if not val:  # resumed a finished run
            val = self.validation()
        return RunResult(self.run_dir, self.last_ckpt, val["val_loss"], val.get("val_ppl", math.nan), self.step,
                         time.time() - t0, val)

    def _stop_interrupted(self) -> None:
        """A signal came during the step just done: save it (unless this step was just saved) and unwind as Ctrl-C
        does, saying how to continue."""
        if self.last_ckpt is None or self.last_ckpt.name != step_dir(self.step):
            self.save()
        if self.env.is_main:
            print(f"depthlab train: interrupted after step {self.step}; saved {self.last_ckpt}. Continue with "
                  f"--run-dir {self.run_dir} --resume auto", file=sys.stderr, flush=True)
        raise KeyboardInterrupt

    def _finite(self, loss: float, grad_norm: float) -> bool:
        """True for a usable step; a non-finite one stops the run, or with on_nonfinite=skip is dropped."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.skipped_in_a_row = 0
            return True
        if self.cfg.train.on_nonfinite == "stop":
            raise TrainingDiverged(f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at "
                                   f"step {self.step + 1}; last good checkpoint: {self.last_ckpt or 'none'}")
        self.skipped += 1
        self.skipped_in_a_row += 1
        if self.skipped_in_a_row > self.cfg.train.max_skips:  # every batch diverges: skipping would never end
            raise TrainingDiverged(f"step {self.step + 1} was non-finite {self.skipped_in_a_row} times in a row "
                                   f"(train.max_skips={self.cfg.train.max_skips}); last good checkpoint: "
                                   f"{self.last_ckpt or 'none'}")
        self.opt.zero_grad(set_to_none=True)
        self._warn(f"depthlab: warning: skipped step {self.step + 1} (non-finite loss or gradient), "
                   f"{self.skipped} skipped so far")
        return False

    def _after_step(self, loss: float, lr: float, grad_norm: float, meter: Meter, bar, log) -> dict:
        """Log, evaluate and checkpoint as the config asks after an optimizer step; returns the validation
        metrics when this step evaluated."""
        tc, step = self.cfg.train, self.step
        meter.steps += 1
        record, val = None, {}
        if step % tc.log_every == 0 or step == tc.max_steps:
            record = meter.record(step, loss, lr, grad_norm)
            if self.env.enabled:  # every rank's own figures, so that a straggler shows
                record.update(meter.per_rank())
            if self.skipped:
                record["skipped"] = self.skipped
            bar.set_postfix_str(Meter.summary(record), refresh=False)
        if step % tc.eval_every == 0 or step == tc.max_steps:
            val = self.validation()
            record = {**(record or {"step": step, "loss": loss, "lr": lr}), **val}
        if record:
            for cb in self.callbacks:
                cb.on_log(self, step, record)
            if log:
                log.write(record)
            if bar.disable and self.env.is_main:
                print(f"depthlab train: step {step}/{tc.max_steps}: {Meter.summary(record)}, "
                      f"{eta_text(*self._clock, step, tc.max_steps)}", file=sys.stderr, flush=True)
        if step == tc.max_steps or (tc.ckpt_every and step % tc.ckpt_every == 0):
            self.save(val if step == tc.max_steps else None)
        return val


def train(cfg: Config, run_dir: Path | None = None, data: TokenData | None = None, progress: bool = True,
          resume: str | None = None, overwrite: bool = False) -> RunResult:
    trainer = Trainer(cfg, run_dir=run_dir, resume=resume, data=data, progress=progress, overwrite=overwrite)
    try:
        return trainer.train()
    finally:
        trainer.close()
        shutdown(trainer.env)
