"""Checkpoints: one directory per step.

    step_0001000/
      model.safetensors   weights (full, unsharded: loadable on any number of ranks)
      config.json         the resolved config: loading rebuilds the model with its scheme
      meta.json           step, loader position, metrics, and a sha256 of every other file
      tokenizer.json
      trainer.pt          optimizer + scheduler + RNG states (tensors and plain containers only:
                          read back with torch.load(weights_only=True), never a full unpickle)

Writing goes to a temporary sibling directory that is renamed into place only when complete, so a crash or a
full disk never leaves a checkpoint that looks valid but is not; the checksums catch later corruption. Reading,
listing and verifying checkpoints (and the file names) live in depthlab.rundir, with every other path a
command takes; this module is the writing side: saving, retention, and tidying up after a kill.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from depthlab import UserError
from depthlab.config import Config
from depthlab.rundir import (  # noqa: F401 (re-exported)
    CHECKPOINTS,
    CONFIG,
    META,
    TOKENIZER,
    TRAINER,
    WEIGHTS,
    CorruptCheckpoint,
    _sha256,
    find_checkpoint,
    is_valid,
    list_checkpoints,
    load_checkpoint,
    load_verified,
    load_weights,
    newest_valid_checkpoint,
    previous_checkpoint,
    save_weights,
    verify_checkpoint,
)


def save_checkpoint(path: str | Path, state: dict[str, torch.Tensor], cfg: Config, meta: dict, tokenizer=None,
                    trainer_state: dict | None = None) -> Path:
    """Write a checkpoint atomically. `state` is a full model state dict (tensors on any device)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        weights = {k: v.detach().contiguous().cpu() for k, v in state.items()}
        if cfg.model.tie_embeddings:
            weights.pop("lm_head.weight", None)  # safetensors refuses shared storage; the tie is in the config
        save_weights(weights, tmp / WEIGHTS)
        cfg.save(tmp / CONFIG)
        if tokenizer is not None:
            tokenizer.save(str(tmp / TOKENIZER))
        if trainer_state is not None:
            torch.save(trainer_state, tmp / TRAINER)
        files = {p.name: _sha256(p) for p in sorted(tmp.iterdir())}
        (tmp / META).write_text(json.dumps({**meta, "files": files}, indent=2) + "\n")
        with open(tmp / META) as f:
            os.fsync(f.fileno())
        old = path.with_name(path.name + ".old")
        if path.exists():  # replacing a checkpoint of the same step: keep it until the new one is in place
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    except (OSError, RuntimeError) as e:  # a full disk: torch.save raises RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        why = getattr(e, "strerror", None) or str(e).strip().splitlines()[-1]
        raise UserError(f"cannot write checkpoint {path}: {why}; earlier checkpoints are intact") from None
    return path


def load_trainer_state(ckpt: Path) -> dict:
    return torch.load(ckpt / TRAINER, weights_only=True, map_location="cpu")


def prune_checkpoints(run_dir: Path, keep_last: int, verdicts: dict[str, bool]) -> list[Path]:
    """Retention: keep the newest `keep_last` *valid* checkpoints and delete everything older than the oldest of
    them. Corrupted checkpoints never count, so they cannot push a valid one out, and the newest valid checkpoint
    is never deleted. `verdicts` caches each checkpoint's validity (by name) for this process, so each is hashed
    once; whoever writes a checkpoint records it as valid. Returns the deleted directories."""
    ckpts = list_checkpoints(run_dir)
    kept = []
    for ckpt in reversed(ckpts):
        if ckpt.name not in verdicts:
            verdicts[ckpt.name] = is_valid(ckpt)
        if verdicts[ckpt.name]:
            kept.append(ckpt)
            if len(kept) == keep_last:
                break
    if len(kept) < keep_last:
        return []
    doomed = [c for c in ckpts if c.name < kept[-1].name]
    for ckpt in doomed:
        shutil.rmtree(ckpt, ignore_errors=True)
    return doomed


def tidy_after_kill(run_dir: Path) -> None:
    """Undo what a writer killed mid-save leaves: a step_N.tmp is dropped; a step_N.old whose step_N is missing
    (killed between the two renames that replace a checkpoint) is put back. Call with the run's lock held."""
    d = Path(run_dir) / CHECKPOINTS
    for part in sorted(d.glob("step_*.old")) if d.is_dir() else []:
        final = part.with_name(part.name[:-len(".old")])
        if final.exists():
            shutil.rmtree(part, ignore_errors=True)
        else:
            os.replace(part, final)
    for part in d.glob("step_*.tmp") if d.is_dir() else []:
        shutil.rmtree(part, ignore_errors=True)
