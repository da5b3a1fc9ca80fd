"""The training loop.

Packed batches, AdamW, warmup + cosine, clipping, gradient accumulation (gradient sync only on the last
micro-batch), bf16 autocast, per-token validation perplexity over the whole fixed validation set,
metrics.jsonl, atomic checkpoints with exact resume, a non-finite guard, and callbacks for everything else
(depth monitors, TensorBoard, W&B). Single process, or DDP / FSDP2 under torchrun.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import shutil
import socket
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
    META,
    TRAINER,
    _sha256,
    is_sharded,
    list_checkpoints,
    load_sharded_state,
    load_trainer_state,
    load_verified,
    load_weights,
    newest_valid_checkpoint,
    prune_checkpoints,
    rank0_decides,
    save_checkpoint,
    save_sharded,
    tidy_after_kill,
)
from depthlab.config import Config, per_rank_batch
from depthlab.data.dataset import TokenData
from depthlab.data.sources import resolved
from depthlab.device import resolve_device
from depthlab.loading import plain_weights
from depthlab.model import lora
from depthlab.model.validate import check_fits_host, validate
from depthlab.owned import InUse, claim, input_paths, lock_text, locked, refuse_own_input
from depthlab.paths import ENV, METRICS, Kind, find_checkpoint, model_path, run_of, what_is
from depthlab.progress import on_terminal
from depthlab.train import distributed as D
from depthlab.train.callbacks import Callback, DepthMonitor, TensorBoardLogger, WandbLogger
from depthlab.train.flops import peak_flops, train_flops_per_token
from depthlab.train.optim import clip_gradients, make_optimizer, make_scheduler
from depthlab.train.runtime import (
    autocast,
    config_diff,
    environment,
    new_run_dir,
    rng_state,
    seed_everything,
    set_rng_state,
)
from depthlab.train.tasks import LanguageModelling, Task
from depthlab.train.vision import ImageClassification

# Config fields that may change when resuming: they do not affect which tokens are seen or the numerics.
RESUMABLE_CHANGES = {"train." + k for k in ("eval_every", "log_every", "ckpt_every", "keep_last", "monitor_every",
                                             "device", "threads", "out_dir", "compile", "activation_checkpointing",
                                             "peak_flops", "tensorboard", "wandb", "parallel", "on_nonfinite",
                                             "max_skips", "dist_timeout_s", "dp_replicate", "dp_shard",
                                             "loss_chunk")}  # a memory knob: the same loss to 1e-5, not bitwise


class TrainingDiverged(UserError):
    pass


@dataclass
class RunResult:
    run_dir: Path
    checkpoint: Path
    val_loss: float
    val_ppl: float
    steps: int
    wall_s: float
    val: dict = field(default_factory=dict)  # every validation metric (a ViT's val_acc too)


def _records_up_to(path: Path, step: int) -> tuple[list[str], int, int]:
    """(lines of steps <= step, how many later ones, how many unreadable) of a metrics.jsonl."""
    keep, later, broken = [], 0, 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record_step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):  # a partial last line: what SIGKILL mid-write leaves
            broken += 1
            continue
        if record_step <= step:
            keep.append(line)
        else:
            later += 1
    return keep, later, broken


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl (or of a run directory's), in order; a partial last line is skipped."""
    path = Path(path)
    path = path / METRICS if path.is_dir() else path
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


class MetricsLog:
    """Append-only metrics.jsonl, flushed every line so a crash loses nothing already logged.

    When a run starts at `step` (0 for a fresh start, the checkpoint's step on resume) the lines past that step
    -- written after the last checkpoint by a run that died -- are dropped, so each step appears once; so is a
    partial line a kill left, with a warning. A branch (`source`: the parent run's metrics) starts with the
    parent's lines up to the step it branches at."""

    def __init__(self, path: Path, step: int, source: Path | None = None, warn=print):
        origin = path if path.exists() else source
        if origin is not None and origin.exists():
            keep, later, broken = _records_up_to(origin, step)
            if broken:
                warn(f"depthlab: warning: {origin}: dropped {broken} unreadable line(s), a partial line left by a "
                     "killed run")
            if later or broken or origin != path:
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text("".join(line + "\n" for line in keep))
                os.replace(tmp, path)
        self.file = open(path, "a")

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def resume_point(run_dir: str | Path | None, resume: str | None,
                 warn=lambda msg: None) -> tuple[Path | None, Path | None]:
    """(run directory, checkpoint to resume from) for --run-dir and --resume; the run directory is None when a
    new one is to be named, the checkpoint None for a fresh start.

    --resume auto continues --run-dir from its newest valid checkpoint (or starts it). --resume PATH resumes
    into --run-dir when given (a branch), else into the run that holds the checkpoint; a checkpoint outside any
    run needs --run-dir."""
    if resume is None:
        return (Path(run_dir) if run_dir else None), None
    if resume == "auto":
        if not run_dir:
            raise UserError("--resume auto needs --run-dir (the run directory to continue)")
        run_dir = Path(run_dir)
        return run_dir, (newest_valid_checkpoint(run_dir, warn) if what_is(run_dir) is Kind.RUN else None)
    _, ckpt = model_path(resume, hf=False, warn=warn)
    if not (ckpt / TRAINER).is_file():
        raise UserError(f"{ckpt} holds no training state ({TRAINER}; it was not written by `depthlab train`): "
                        f"start from its weights with --init-from {ckpt}")
    if run_dir:
        return Path(run_dir), ckpt
    home = run_of(ckpt)
    if home is None:
        raise UserError(f"{ckpt} is not inside a run directory (RUN/{CHECKPOINTS}/step_N); give --run-dir to "
                        "resume it into a run")
    return home, ckpt


class Trainer:
    """One training run: opens (or resumes) its run directory and holds its lock, builds the data (through its
    task), model and optimizer from the config, then `train()` steps to train.max_steps, writing metrics.jsonl,
    validation and checkpoints and calling the callbacks. The task (depthlab.train.tasks) is what is trained on:
    data, sampler, validation and what a checkpoint records of the data; by default image classification for
    model.arch=vit, else language modelling (fine-tuning passes its own). `train(cfg)` below runs one and
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
        self.env = D.init_distributed(self.device, tc.dist_timeout_s)
        self.device = D.local_device(self.device, self.env)
        self.cfg = cfg = dataclasses.replace(cfg, train=dataclasses.replace(
            tc, batch_size=per_rank_batch(tc, self.env.world_size)))
        tc = cfg.train
        D.mesh_shape(tc, self.env.world_size)  # a layout that does not fit the ranks: one line, before any work
        if self.device.type == "cpu":  # before the tokenizer and the model are sized by the config
            check_fits_host(cfg)
        self.progress = progress and self.env.is_main
        self._held = contextlib.ExitStack()  # the run directory's lock, held until close()
        try:
            ckpt = self._open_run(run_dir, resume, overwrite)
            self._build(data, ckpt)
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
        if not self.env.is_main:  # rank 0 logs; other ranks only take part in collectives
            self.callbacks = [c for c in self.callbacks if isinstance(c, DepthMonitor)]

    def close(self) -> None:
        """Release the run directory (also done by the OS if the process dies); under torchrun the model too: a
        DDP wrapper's reducer holds the process group, and must go while the group is still registered, or the
        group is destroyed from the reducer's destructor, where it can deadlock (D.shutdown says how)."""
        self._held.close()
        if self.env.enabled:
            for name in ("model", "module", "layers", "opt", "sched"):
                vars(self).pop(name, None)
            gc.collect()  # the wrappers hold reference cycles

    # ------------------------------------------------------------------ setup
    def _build(self, data: TokenData | None, ckpt: Path | None) -> None:
        tc, cfg = self.cfg.train, self.cfg
        seed_everything(tc.seed)
        self.data = data or self._shared_data(self.task.saved_tokenizer(cfg, ckpt, self.run_dir))
        self.tokenizer = self.task.tokenizer(self.data)  # None for images

        seed_everything(tc.seed)  # model init does not depend on how much randomness the data step used
        self.module, self.model = D.build_parallel(cfg.model, tc, self.env, self.device)
        if tc.init_from and not ckpt:
            self._init_from(tc.init_from)
        if tc.lora.rank:
            self._add_adapters()
        self.layers = self.module.layers
        self.opt = make_optimizer(self.model, tc, cfg.model.lns_power)
        self.sched = make_scheduler(self.opt, tc)
        self.sampler = self.task.sampler(cfg, self.data, self.env)
        self.step, self.skipped, self.last_ckpt, self.verdicts, self.data_s = 0, 0, None, {}, 0.0
        self.skipped_in_a_row = 0
        self.meta = {"source": self.data.source, "tokenizer_hash": self.task.tokenizer_hash(self.data),
                     "n_params": self.module.num_params(), **self.task.data_meta(self.data),
                     "world_size": self.env.world_size,
                     "cwd": os.getcwd()}  # where data.paths start from when they are relative
        if ckpt:
            self._restore(ckpt)

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
        shared = D.broadcast_object(shared, self.env)
        if isinstance(shared, UserError):
            raise shared
        if first is not None:
            return first
        from tokenizers import Tokenizer

        return self.task.load_data(self.cfg, Tokenizer.from_str(shared) if shared is not None else None, self.progress)

    def validation(self) -> dict:
        """The task's validation metrics of the model now ({'val_loss', ...})."""
        return self.task.validation(self.cfg, self.model, self.data, self.env, self.device, self.progress)

    def _open_run(self, run_dir, resume, overwrite: bool) -> Path | None:
        """Find the run directory and the checkpoint to resume (None: a fresh start). One decision for every
        rank: rank 0 locks the directory for the whole run, tidies what a kill left, chooses and verifies the
        checkpoint (every rank hashing its share of the files) and checks that the directory is ours to write;
        every rank takes its answer (or its error) and checks that it sees the same files."""
        decision = rank0_decides(self.env, lambda: self._decide(run_dir, resume, overwrite))
        self.run_dir, ckpt, self.in_place, self.branch_of, self.resume_meta, seen = decision
        problems = [p for p in D.gather_objects(None if self.env.is_main else self._unseen(ckpt, seen), self.env)
                    if p]
        if problems:
            raise UserError(problems[0])
        return ckpt

    def _decide(self, run_dir, resume, overwrite: bool) -> tuple:
        """Rank 0's half of _open_run: (run dir, checkpoint, in place, branch of, its verified meta, what every
        rank must see: the lock's text and the checkpoint's meta.json digest)."""
        if resume == "auto" and run_dir:  # lock before looking for its newest checkpoint,
            self._refuse_own_inputs(Path(run_dir))
            self._held.enter_context(locked(run_dir, "train", "run directory "))
            tidy_after_kill(Path(run_dir))  # which a writer killed mid-save may have left renamed away
        run_dir, ckpt = resume_point(run_dir, resume, self._warn)
        home = run_of(ckpt) if ckpt else None
        new = new_run_dir(self.cfg) if not run_dir else None
        self.run_dir = Path(run_dir) if run_dir else new
        self.in_place = home is not None and home.resolve() == self.run_dir.resolve()
        self.branch_of = home if home and not self.in_place else None  # the run a branch starts from
        branch = [] if self.in_place or not ckpt else [ckpt, self.branch_of or ckpt]
        self._refuse_own_inputs(self.run_dir, *branch)  # before anything is locked or removed
        if new:
            self.run_dir = self._take_new(new)
        self._held.enter_context(locked(self.run_dir, "train", "run directory "))
        self._claim(ckpt, resume, overwrite)
        self._check_writable()
        tidy_after_kill(self.run_dir)
        meta = load_verified(ckpt) if ckpt else None  # hashed once: verify_checkpoint remembers its verdicts
        seen = (lock_text(self.run_dir), _sha256(ckpt / META) if ckpt else None)
        return self.run_dir, ckpt, self.in_place, self.branch_of, meta, seen

    def _refuse_own_inputs(self, run_dir: Path, *sources: Path) -> None:
        """Refuse a run directory that is, holds or sits inside what this run reads (depthlab.owned): the data, the
        tokenizer, the weights it starts from and a branch's source (`sources`). A file is claim's to refuse."""
        c = self.cfg
        reads = [*input_paths(c.data.paths), *(p for p in (c.data.tokenizer, c.train.init_from, *sources) if p)]
        if not run_dir.is_file():
            refuse_own_input(run_dir, reads, "train")

    def _take_new(self, name: Path) -> Path:
        """Lock a new run directory `name`, or the next free name after it: runs started in the same second
        under one train.out_dir (a sweep, an array job) each get their own."""
        for i in range(1000):
            d = name.with_name(f"{name.name}-{i}") if i else name
            lock = contextlib.ExitStack()
            try:
                lock.enter_context(locked(d, "train", "run directory "))
            except InUse:
                continue
            if d.exists():  # another run took it and has finished since
                lock.close()
                continue
            self._held.enter_context(lock)
            return d
        raise UserError(f"no free run directory name in {name.parent}: {name.name} and the 999 after it are in use")

    def _unseen(self, ckpt: Path | None, seen: tuple) -> str | None:
        """None when this rank sees the run directory (and checkpoint) rank 0 chose, else why not, in one line."""
        lock, digest = seen
        where = f"rank {self.env.rank} on {socket.gethostname()}"
        if lock_text(self.run_dir) != lock:
            return (f"{where} does not see run directory {self.run_dir} as rank 0 does (its lock file is missing "
                    "or another's): every rank must reach the run directory on one shared filesystem")
        try:
            same = ckpt is None or _sha256(ckpt / META) == digest
        except OSError:
            same = False
        if not same:
            return (f"{where} does not see checkpoint {ckpt} as rank 0 does: every rank must reach the run "
                    "directory on one shared filesystem")
        return None

    def _claim(self, ckpt: Path | None, resume: str | None, overwrite: bool) -> None:
        """Refuse a run directory that is not ours to write (depthlab.owned.claim: a file, another kind of directory),
        or another run."""
        d = self.run_dir
        kind = claim(d, lambda p: what_is(p) is Kind.RUN, "train", overwrite, choose="--run-dir",
                     output="a run directory", anyway="to write the run into it anyway")
        if kind is not Kind.RUN:
            return
        if resume == "auto" or not list_checkpoints(d) or self.in_place:
            return  # continuing it, or a run that never wrote a checkpoint
        if overwrite:
            shutil.rmtree(d / CHECKPOINTS)
            (d / METRICS).unlink(missing_ok=True)
        elif ckpt is None:
            raise UserError(f"{d} already holds checkpoints; use --resume auto to continue it, another --run-dir, "
                            "or --overwrite to start it over")
        else:
            raise UserError(f"{d} is another run (it holds checkpoints); branch into a new --run-dir, or pass "
                            "--overwrite to replace its checkpoints")

    def _check_writable(self) -> None:
        """Fail before any work when the run directory cannot be written."""
        probe = self.run_dir / f".write_test-{os.getpid()}"
        created = not self.run_dir.exists()
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            probe.write_text("ok")
            probe.unlink()
            if created:  # made again when training starts; a run that fails on its data leaves nothing behind
                self.run_dir.rmdir()
        except OSError as e:
            raise UserError(f"cannot write to run directory {self.run_dir}: {e.strerror or e}") from None

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
        D.load_full_state(self.module, None, state)
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

    def _restore(self, ckpt: Path) -> None:
        meta = self.resume_meta  # verified by rank 0 (_open_run)
        saved = Config.load(ckpt / CONFIG).to_dict()  # fields newer than the checkpoint read as their defaults
        paths = self.cfg.data.paths  # the same files named another way (from another directory, through a link)
        if resolved(saved["data"]["paths"], meta.get("cwd")) == resolved(paths):  # are the same data
            saved["data"]["paths"] = paths
        diffs = [d for d in config_diff(saved, self.cfg.to_dict()) if d.split(":")[0] not in RESUMABLE_CHANGES]
        # Another number of ranks is fine when the global micro-batch (ranks x sequences) is unchanged.
        saved_global = saved["train"]["batch_size"] * meta.get("world_size", 1)
        if saved_global == self.cfg.train.batch_size * self.env.world_size:
            diffs = [d for d in diffs if not d.startswith("train.batch_size:")]
        elif not any(d.startswith("train.batch_size:") for d in diffs):
            diffs.append(f"global batch: {saved_global} sequences on {meta.get('world_size', 1)} rank(s) -> "
                         f"{self.cfg.train.batch_size * self.env.world_size} on {self.env.world_size}; set "
                         f"train.batch_size to {saved_global / self.env.world_size:g}")
        if diffs:
            raise UserError(f"cannot resume {ckpt} with a different config: " + "; ".join(diffs))
        sizes = {k: v for k, v in self.task.data_meta(self.data).items() if k.startswith("train_")}
        if meta.get("tokenizer_hash") != self.meta["tokenizer_hash"] or any(meta.get(k) != v for k, v in sizes.items()):
            saved = ", ".join(f"{meta.get(k)} {k.split('_', 1)[1]}" for k in sizes)
            raise UserError(f"cannot resume {ckpt}: the training data or tokenizer differs from the checkpoint's "
                            f"({saved}, tokenizer {meta.get('tokenizer_hash')})")
        state = load_trainer_state(ckpt)
        if is_sharded(ckpt):  # every rank reads only what its shards need, resharding to this world size
            load_sharded_state(ckpt, self.module, self.opt)
        else:
            D.load_full_state(self.module, self.opt, lora.peft_names(load_weights(ckpt)), state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        own_cuda = state.get("cuda_rng", [])  # each rank's own device's generator
        if torch.cuda.is_available() and self.env.rank < len(own_cuda) and own_cuda[self.env.rank] is not None:
            torch.cuda.set_rng_state(own_cuda[self.env.rank])
        self.sampler.load_state_dict(meta["loader"])
        self.step, self.skipped, self.last_ckpt = meta["step"], meta.get("skipped", 0), ckpt
        self.verdicts[ckpt.name] = True
        self._warn(f"depthlab: resuming {ckpt} at step {self.step}")

    # ------------------------------------------------------------------ checkpoints
    def save(self, extra: dict | None = None) -> Path:
        """A checkpoint of this step: the full format in one process, the sharded one on several ranks (every
        rank writes its own shards; nothing is gathered)."""
        local = [v.to_local() if hasattr(v, "to_local") else v for v in self.module.state_dict().values()]
        (bad,) = D.all_reduce_sum([float(not all(torch.isfinite(v).all() for v in local if v.is_floating_point()))],
                                  self.env)
        if bad:
            raise TrainingDiverged(f"refusing to save non-finite weights at step {self.step}; "
                                   f"last good checkpoint: {self.last_ckpt or 'none'}")
        path = self.run_dir / CHECKPOINTS / f"step_{self.step:07d}"
        meta = {**self.meta, "step": self.step, "skipped": self.skipped, "loader": self.sampler.state_dict(),
                **(extra or {})}
        rngs = D.gather_objects(rng_state(), self.env)
        trainer_state = {"scheduler": self.sched.state_dict(), "rng": rngs[0],
                         "cuda_rng": [r.get("cuda") for r in rngs]}
        if self.env.enabled:
            save_sharded(path, self.module, self.opt, self.cfg, meta, self.tokenizer, trainer_state, self.env)
        else:
            trainer_state["optimizer"] = D.full_optimizer_state(self.module, self.opt)
            save_checkpoint(path, lora.checkpoint_names(D.full_model_state(self.module)), self.cfg, meta,
                            self.tokenizer, trainer_state)
        if self.env.is_main:
            self.verdicts[path.name] = True
            prune_checkpoints(self.run_dir, self.cfg.train.keep_last, self.verdicts)
        D.barrier(self.env)
        self.last_ckpt = path
        return path

    # ------------------------------------------------------------------ loop
    def train_step(self) -> tuple[float, float]:
        """One optimizer step over grad_accum micro-batches: (mean loss, gradient norm before clipping)."""
        tc = self.cfg.train
        loss_sum = 0.0
        for micro in range(tc.grad_accum):
            t0 = time.perf_counter()
            x, y = (t.to(self.device) for t in self.sampler.next_batch())
            self.data_s += time.perf_counter() - t0
            with D.grad_sync(self.model, micro == tc.grad_accum - 1), autocast(self.device, tc.dtype):
                loss = self.model(x, targets=y, loss_chunk=tc.loss_chunk) / tc.grad_accum
            loss.backward()
            loss_sum += loss.item()
        for cb in self.callbacks:
            cb.on_after_backward(self, self.step + 1)
        grad_norm = clip_gradients(self.model, tc, self.cfg.model.lns_power)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        (loss_sum,) = D.all_reduce_sum([loss_sum], self.env)
        return loss_sum / self.env.world_size, grad_norm

    def _start_run(self) -> MetricsLog:
        """Rank 0: the run directory's config, tokenizer and environment, a one-line banner, and the metrics log
        (from this step on: later lines, a kill's partial line, or a branch's parent lines are dealt with)."""
        tc, m = self.cfg.train, self.cfg.model
        meta = self.task.data_meta(self.data)
        unit = next(k for k in meta if k.startswith("train_")).split("_", 1)[1]
        sizes = f"{meta['train_' + unit]:,} train / {meta['val_' + unit]:,} val {unit}"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.cfg.save(self.run_dir / CONFIG)
        self.task.save_run_files(self.run_dir, self.data)
        (self.run_dir / ENV).write_text(json.dumps(environment(self.device, self.env), indent=2) + "\n")
        print(f"depthlab train: preset {self.cfg.preset}, scheme {m.norm_scheme}, {m.n_layers} layers x {m.dim} "
              f"({self.module.num_params() / 1e6:.1f}M params), {tc.max_steps} steps on {self.env.world_size} x "
              f"{self.device.type}; data: {self.data.source}, {sizes}", file=sys.stderr)
        source = self.branch_of / METRICS if self.branch_of else None
        return MetricsLog(self.run_dir / METRICS, self.step, source, warn=self._warn)

    def train(self) -> RunResult:
        tc = self.cfg.train
        t0 = time.time()
        log = self._start_run() if self.env.is_main else None
        meter = _Meter(self)
        for cb in self.callbacks:
            cb.on_train_start(self)
        # a bar on a terminal; into a log, a pipe or with --no-progress, a line a record instead (_after_step)
        bar = tqdm(total=tc.max_steps, initial=self.step, desc=f"train {self.cfg.model.norm_scheme}",
                   disable=not on_terminal(self.progress), dynamic_ncols=True)
        self.model.train()
        val: dict = {}
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
        bar.close()
        for cb in self.callbacks:
            cb.on_train_end(self)
        if log:
            log.close()
        if not val:  # resumed a finished run
            val = self.validation()
        return RunResult(self.run_dir, self.last_ckpt, val["val_loss"], val.get("val_ppl", math.nan), self.step,
                         time.time() - t0, val)

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

    def _after_step(self, loss: float, lr: float, grad_norm: float, meter: _Meter, bar, log) -> dict:
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
            bar.set_postfix_str(_Meter.summary(record), refresh=False)
        if step % tc.eval_every == 0 or step == tc.max_steps:
            val = self.validation()
            record = {**(record or {"step": step, "loss": loss, "lr": lr}), **val}
        if record:
            for cb in self.callbacks:
                cb.on_log(self, step, record)
            if log:
                log.write(record)
            if bar.disable and self.env.is_main:
                print(f"depthlab train: step {step}/{tc.max_steps}: {_Meter.summary(record)}", file=sys.stderr,
                      flush=True)
        if step == tc.max_steps or (tc.ckpt_every and step % tc.ckpt_every == 0):
            self.save(val if step == tc.max_steps else None)
        return val


class _Meter:
    """Throughput and MFU over the steps since the last log line."""

    def __init__(self, trainer: Trainer):
        tc, seq_len, world = trainer.cfg.train, trainer.task.tokens_per_sample(trainer.cfg), trainer.env.world_size
        self.tokens_per_step = tc.batch_size * tc.grad_accum * seq_len * world
        self.flops_per_step = train_flops_per_token(trainer.cfg.model, seq_len) * self.tokens_per_step
        self.peak = peak_flops(trainer.device, tc.dtype, tc.peak_flops) * world
        self.t, self.steps, self.trainer, self.step_s, self.last_steps = time.time(), 0, trainer, 0.0, 0

    def per_rank(self) -> dict:
        """Collective: each rank's mean step time and data time since the last log line, and its peak memory."""
        trainer, steps = self.trainer, max(self.last_steps, 1)  # record() has just closed the interval
        mine = (self.step_s / steps, trainer.data_s / steps, peak_memory_mib(trainer.device))
        trainer.data_s = 0.0
        step_s, data_s, peak = zip(*D.gather_objects(mine, trainer.env), strict=True)
        return {"rank_step_s": list(step_s), "rank_data_s": list(data_s), "rank_peak_mib": list(peak)}

    def record(self, step: int, loss: float, lr: float, grad_norm: float) -> dict:
        now = time.time()
        elapsed = max(now - self.t, 1e-9)
        record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                  "tokens_per_s": self.steps * self.tokens_per_step / elapsed,
                  "mfu": self.steps * self.flops_per_step / elapsed / self.peak, "tokens": step * self.tokens_per_step}
        self.step_s, self.last_steps = elapsed, self.steps
        self.t, self.steps = now, 0
        return record

    @staticmethod
    def summary(record: dict) -> str:
        """A metrics record's headline figures, as the bar and the log lines show them."""
        parts = [f"loss {record['loss']:.4f}"]
        if "tokens_per_s" in record:  # a log step's (an evaluation-only step has no throughput)
            parts += [f"lr {record['lr']:.2e}", f"{record['tokens_per_s']:,.0f} tok/s", f"mfu {record['mfu']:.1%}"]
        return " ".join(parts + [f"{k} {v:.4f}" for k, v in record.items()
                                 if k.startswith("val_") and isinstance(v, float)])


def peak_memory_mib(device: torch.device) -> float:
    """This process's peak memory so far: the device's allocator peak on a GPU, the resident set's on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def train(cfg: Config, run_dir: Path | None = None, data: TokenData | None = None, progress: bool = True,
          resume: str | None = None, overwrite: bool = False) -> RunResult:
    trainer = Trainer(cfg, run_dir=run_dir, resume=resume, data=data, progress=progress, overwrite=overwrite)
    try:
        return trainer.train()
    finally:
        trainer.close()
        D.shutdown(trainer.env)
