"""The run directory: its name, its metrics log, where a run resumes from, and who may write it.

    RUN/
      config.json        the run's config
      env.json           where and with what it ran (depthlab.train.runtime.environment)
      tokenizer.json     what the task keeps of its data (and val_tokens.npy for raw text)
      metrics.jsonl      one JSON record per logged step: MetricsLog writes it, read_metrics reads it
      trackio.json       with train.trackio: the Trackio run this directory logs to (train.callbacks)
      checkpoints/
        step_0001000/    one checkpoint: its name, files and CheckpointMeta are depthlab.checkpoint's
    .RUN.depthlab-lock   beside it, held by the one process that writes the run (depthlab.ownership)

`open_run` decides which directory a run writes and what it resumes (`resume_point`), and refuses what is not
ours: train locks the directory for the whole run, never writes into its own inputs, continues a run only with
--resume, replaces another run's checkpoints only with --overwrite, and under torchrun every rank must see the
directory and checkpoint rank 0 chose. `check_resumable` says whether a checkpoint may go on under this config
and data. A checkpoint's own format sits below this module (paths and ownership need its names first).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from depthlab import UserError
from depthlab.checkpoint import (
    CHECKPOINTS,
    CONFIG,
    META,
    TRAINER,
    CheckpointMeta,
    list_checkpoints,
    load_verified,
    newest_valid_checkpoint,
    rank0_decides,
    tidy_after_kill,
)
from depthlab.config import Config
from depthlab.data.sources import resolved
from depthlab.jsonl import read_jsonl
from depthlab.ownership import InUse, claim, input_paths, lock_text, locked, refuse_own_input, write_whole
from depthlab.paths import METRICS, Kind, model_path, run_of, what_is


def new_run_dir(cfg: Config) -> Path:
    """A fresh run directory's name under train.out_dir: preset, scheme and the time (the next free one)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.train.out_dir) / f"{cfg.preset}-{cfg.model.norm_scheme}-{stamp}"
    run_dir, i = base, 1
    while run_dir.exists():
        run_dir, i = base.with_name(f"{base.name}-{i}"), i + 1
    return run_dir


# ---------------------------------------------------------------- metrics.jsonl
def read_metrics(path: str | Path, warn=None) -> list[dict]:
    """The records of a metrics.jsonl (or of a run directory's), in order (depthlab.jsonl: a last line cut short by
    a killed run is skipped with a warning, any other bad line is an error naming it)."""
    path = Path(path)
    path = path / METRICS if path.is_dir() else path
    return read_jsonl(path, "skipped, that step is logged again on resume", need=("step",), warn=warn)


class MetricsLog:
    """Append-only metrics.jsonl, flushed every line so a crash loses nothing already logged.

    When a run starts at `step` (0 for a fresh start, the checkpoint's step on resume) the lines past that step
    -- written after the last checkpoint by a run that died -- are dropped, so each step appears once; so is a
    partial line a kill left, with a warning. A branch (`source`: the parent run's metrics) starts with the
    parent's lines up to the step it branches at."""

    def __init__(self, path: Path, step: int, source: Path | None = None, warn=print):
        origin = path if path.exists() else source
        if origin is not None and origin.exists():
            keep = [r for r in read_metrics(origin, warn) if r["step"] <= step]  # rewritten whole: no cut line
            write_whole(path, "".join(json.dumps(r) + "\n" for r in keep))
        self.file = open(path, "a")

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


# ---------------------------------------------------------------- resuming
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


# Config fields that may change when resuming: they do not affect which tokens are seen or the numerics.
RESUMABLE_CHANGES = {"train." + k for k in ("eval_every", "log_every", "ckpt_every", "keep_last", "monitor_every",
                                             "device", "threads", "out_dir", "compile", "activation_checkpointing",
                                             "peak_flops", "tensorboard", "wandb", "trackio", "parallel",
                                             "on_nonfinite", "max_skips", "dist_timeout_s", "dp_replicate", "dp_shard",
                                             "loss_chunk")}  # a memory knob: the same loss to 1e-5, not bitwise


def config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts, as `key: a -> b`."""
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out


def check_resumable(ckpt: Path, meta: CheckpointMeta, cfg: Config, world_size: int, now: CheckpointMeta) -> None:
    """Refuse to resume `ckpt` (its verified `meta`) under `cfg` on `world_size` ranks, with the data and tokenizer
    this run has (`now`: its own metadata), when anything but RESUMABLE_CHANGES differs. Another number of ranks
    is fine when the global micro-batch (ranks x sequences) is unchanged."""
    if meta.loader is None:
        raise UserError(f"{ckpt} records no data-loader position in its {META}: start from its weights with "
                        f"--init-from {ckpt}")
    saved = Config.load(ckpt / CONFIG).to_dict()  # fields newer than the checkpoint read as their defaults
    paths = cfg.data.paths  # the same files named another way (from another directory, through a link)
    if resolved(saved["data"]["paths"], meta.cwd) == resolved(paths):  # are the same data
        saved["data"]["paths"] = paths
    diffs = [d for d in config_diff(saved, cfg.to_dict()) if d.split(":")[0] not in RESUMABLE_CHANGES]
    saved_global = saved["train"]["batch_size"] * meta.world_size
    if saved_global == cfg.train.batch_size * world_size:
        diffs = [d for d in diffs if not d.startswith("train.batch_size:")]
    elif not any(d.startswith("train.batch_size:") for d in diffs):
        diffs.append(f"global batch: {saved_global} sequences on {meta.world_size} rank(s) -> "
                     f"{cfg.train.batch_size * world_size} on {world_size}; set "
                     f"train.batch_size to {saved_global / world_size:g}")
    if diffs:
        raise UserError(f"cannot resume {ckpt} with a different config: " + "; ".join(diffs))
    sizes = {k: v for k, v in now.data.items() if k.startswith("train_")}
    if meta.tokenizer_hash != now.tokenizer_hash or any(meta.data.get(k) != v for k, v in sizes.items()):
        was = ", ".join(f"{meta.data.get(k)} {k.split('_', 1)[1]}" for k in sizes)
        raise UserError(f"cannot resume {ckpt}: the training data or tokenizer differs from the checkpoint's "
                        f"({was}, tokenizer {meta.tokenizer_hash})")


# ---------------------------------------------------------------- who may write the run
@dataclass
class OpenRun:
    """The run directory a run writes (locked) and where it starts from."""

    run_dir: Path
    ckpt: Path | None  # the checkpoint it resumes; None: a fresh start
    in_place: bool  # that checkpoint is this run's own
    branch_of: Path | None  # else the run it branches from
    meta: CheckpointMeta | None  # the checkpoint's, verified


def open_run(cfg: Config, env, held: contextlib.ExitStack, run_dir, resume: str | None, overwrite: bool,
             warn) -> OpenRun:
    """Find the run directory and the checkpoint to resume, one decision for every rank (`env`, a DistEnv): rank 0
    locks the directory for as long as `held` is open, tidies what a kill left, chooses and verifies the
    checkpoint (every rank hashing its share of the files) and checks that the directory is ours to write;
    every rank takes its answer (or its error) and checks that it sees the same files."""
    opened, seen = rank0_decides(env, lambda: _decide(cfg, held, run_dir, resume, overwrite, warn))
    problems = [p for p in env.gather(None if env.is_main else _unseen(opened, seen, env.rank)) if p]
    if problems:
        raise UserError(problems[0])
    return opened


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _decide(cfg: Config, held: contextlib.ExitStack, run_dir, resume, overwrite: bool, warn) -> tuple:
    """Rank 0's half of open_run: the OpenRun, and what every rank must see: the lock's text and the checkpoint's
    meta.json digest."""
    if resume == "auto" and run_dir:  # lock before looking for its newest checkpoint,
        _refuse_own_inputs(cfg, Path(run_dir))
        held.enter_context(locked(run_dir, "train", "run directory "))
        tidy_after_kill(Path(run_dir))  # which a writer killed mid-save may have left renamed away
    run_dir, ckpt = resume_point(run_dir, resume, warn)
    home = run_of(ckpt) if ckpt else None
    new = new_run_dir(cfg) if not run_dir else None
    run_dir = Path(run_dir) if run_dir else new
    in_place = home is not None and home.resolve() == run_dir.resolve()
    branch_of = home if home and not in_place else None  # the run a branch starts from
    branch = [] if in_place or not ckpt else [ckpt, branch_of or ckpt]
    _refuse_own_inputs(cfg, run_dir, *branch)  # before anything is locked or removed
    if new:
        run_dir = _take_new(new, held)
    held.enter_context(locked(run_dir, "train", "run directory "))
    _claim(run_dir, ckpt, resume, overwrite, in_place)
    _check_writable(run_dir)
    tidy_after_kill(run_dir)
    meta = load_verified(ckpt) if ckpt else None  # hashed once: verify_checkpoint remembers its verdicts
    seen = (lock_text(run_dir), _digest(ckpt / META) if ckpt else None)
    return OpenRun(run_dir, ckpt, in_place, branch_of, meta), seen


def _refuse_own_inputs(cfg: Config, run_dir: Path, *sources: Path) -> None:
    """Refuse a run directory that is, holds or sits inside what this run reads (depthlab.ownership): the data, the
    tokenizer, the weights it starts from and a branch's source (`sources`). A file is claim's to refuse."""
    reads = [*input_paths(cfg.data.paths), *(p for p in (cfg.data.tokenizer, cfg.train.init_from, *sources) if p)]
    if not run_dir.is_file():
        refuse_own_input(run_dir, reads, "train")


def _take_new(name: Path, held: contextlib.ExitStack) -> Path:
    """Lock a new run directory `name`, or the next free name after it: runs started in the same second under one
    train.out_dir (a sweep, an array job) each get their own."""
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
        held.enter_context(lock)
        return d
    raise UserError(f"no free run directory name in {name.parent}: {name.name} and the 999 after it are in use")


def _unseen(opened: OpenRun, seen: tuple, rank: int) -> str | None:
    """None when this rank sees the run directory (and checkpoint) rank 0 chose, else why not, in one line."""
    lock, digest = seen
    where = f"rank {rank} on {socket.gethostname()}"
    if lock_text(opened.run_dir) != lock:
        return (f"{where} does not see run directory {opened.run_dir} as rank 0 does (its lock file is missing or "
                "another's): every rank must reach the run directory on one shared filesystem")
    try:
        same = opened.ckpt is None or _digest(opened.ckpt / META) == digest
    except OSError:
        same = False
    if not same:
        return (f"{where} does not see checkpoint {opened.ckpt} as rank 0 does: every rank must reach the run "
                "directory on one shared filesystem")
    return None


def _claim(d: Path, ckpt: Path | None, resume: str | None, overwrite: bool, in_place: bool) -> None:
    """Refuse a run directory that is not ours to write (depthlab.ownership.claim: a file, another kind of directory),
    or another run."""
    kind = claim(d, lambda p: what_is(p) is Kind.RUN, "train", overwrite, choose="--run-dir",
                 output="a run directory", anyway="to write the run into it anyway")
    if kind is not Kind.RUN:
        return
    if resume == "auto" or not list_checkpoints(d) or in_place:
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


def _check_writable(run_dir: Path) -> None:
    """Fail before any work when the run directory cannot be written."""
    probe = run_dir / f".write_test-{os.getpid()}"
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
        if created:  # made again when training starts; a run that fails on its data leaves nothing behind
            run_dir.rmdir()
    except OSError as e:
        raise UserError(f"cannot write to run directory {run_dir}: {e.strerror or e}") from None
