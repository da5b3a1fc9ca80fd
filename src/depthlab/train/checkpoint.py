"""Checkpoints: one directory per step.

    step_0001000/
      model.safetensors   weights (full, unsharded: loadable on any number of ranks)
      config.json         the resolved config: loading rebuilds the model with its scheme
      meta.json           step, loader position, metrics, and a sha256 of every other file
      tokenizer.json
      trainer.pt          optimizer + scheduler + RNG states (tensors and plain containers only:
                          read back with torch.load(weights_only=True), never a full unpickle)

Writing goes to a temporary sibling directory that is renamed into place only when complete, so a crash or a
full disk never leaves a checkpoint that looks valid but is not; the checksums catch later corruption.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from depthlab import UserError
from depthlab.config import Config
from depthlab.model import Transformer

WEIGHTS, META, CONFIG, TOKENIZER, TRAINER = "model.safetensors", "meta.json", "config.json", "tokenizer.json", "trainer.pt"


class CorruptCheckpoint(UserError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
        save_file(weights, str(tmp / WEIGHTS))
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
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"cannot write checkpoint {path}: {e.strerror or e}; earlier checkpoints are intact") from None
    return path


def verify_checkpoint(path: Path) -> dict:
    """The checkpoint's meta.json, after checking every file against its recorded sha256."""
    try:
        meta = json.loads((path / META).read_text())
        files = meta["files"]
    except (OSError, ValueError, KeyError) as e:
        raise CorruptCheckpoint(f"corrupted checkpoint {path}: unreadable {META} ({e})") from None
    for name, digest in files.items():
        if not (path / name).is_file():
            raise CorruptCheckpoint(f"corrupted checkpoint {path}: {name} is missing")
        if _sha256(path / name) != digest:
            raise CorruptCheckpoint(f"corrupted checkpoint {path}: {name} does not match its checksum")
    return meta


def list_checkpoints(run_dir: Path) -> list[Path]:
    d = Path(run_dir) / "checkpoints"
    return sorted(p for p in d.glob("step_*") if p.is_dir() and p.name[5:].isdigit()) if d.is_dir() else []


def newest_valid_checkpoint(run_dir: Path, warn=print) -> Path | None:
    for ckpt in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(ckpt)
            return ckpt
        except CorruptCheckpoint as e:
            warn(f"depthlab: warning: skipping {e}")
    return None


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or a run directory (its newest valid checkpoint)."""
    path = Path(path)
    if (path / META).is_file() or (path / WEIGHTS).is_file():
        return path
    ckpt = newest_valid_checkpoint(path) if list_checkpoints(path) else None
    if ckpt is None:
        raise UserError(f"{path} is neither a checkpoint nor a run directory with a valid checkpoint")
    return ckpt


def previous_checkpoint(ckpt: Path) -> Path | None:
    older = [p for p in list_checkpoints(ckpt.parent.parent) if p.name < ckpt.name]
    for p in reversed(older):
        try:
            verify_checkpoint(p)
            return p
        except CorruptCheckpoint:
            continue
    return None


def load_verified(ckpt: Path) -> dict:
    """verify_checkpoint, naming the previous valid checkpoint when this one is corrupted."""
    try:
        return verify_checkpoint(ckpt)
    except CorruptCheckpoint as e:
        prev = previous_checkpoint(ckpt)
        raise CorruptCheckpoint(f"{e}; " + (f"the previous valid checkpoint is {prev}" if prev else
                                            "no earlier valid checkpoint exists")) from None


def load_weights(ckpt: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / WEIGHTS), device=device)


def load_trainer_state(ckpt: Path) -> dict:
    return torch.load(ckpt / TRAINER, weights_only=True, map_location="cpu")


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple[Transformer, Config, dict]:
    """(model, config, meta) from a checkpoint or a run directory; the model is rebuilt with its saved scheme."""
    ckpt = find_checkpoint(path)
    meta = load_verified(ckpt)
    cfg = Config.load(ckpt / CONFIG)
    model = Transformer(cfg.model, init=False).to(device)
    missing, unexpected = model.load_state_dict(load_weights(ckpt, device), strict=False)
    missing = [k for k in missing if not (cfg.model.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise UserError(f"checkpoint {ckpt} does not match its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model, cfg, meta
