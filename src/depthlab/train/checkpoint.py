"""Checkpoints: a directory with weights in safetensors, the resolved config and metadata in JSON, and the
tokenizer. Loading rebuilds the model from the saved config, so the scheme always comes back."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from depthlab import UserError
from depthlab.config import Config
from depthlab.model import Transformer

WEIGHTS, META, CONFIG, TOKENIZER = "model.safetensors", "meta.json", "config.json", "tokenizer.json"


def save_checkpoint(path: str | Path, model: Transformer, cfg: Config, meta: dict, tokenizer=None) -> Path:
    """Write to a temporary sibling directory, then rename: a crash never leaves a half-written checkpoint."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if cfg.model.tie_embeddings:
        state.pop("lm_head.weight", None)  # safetensors refuses shared storage; the tie is in the config
    save_file(state, str(tmp / WEIGHTS))
    cfg.save(tmp / CONFIG)
    (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(str(tmp / TOKENIZER))
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or a run directory (its newest checkpoint)."""
    path = Path(path)
    if (path / WEIGHTS).is_file():
        return path
    ckpts = sorted((path / "checkpoints").glob("step_*[0-9]")) if (path / "checkpoints").is_dir() else []
    if not ckpts:
        raise UserError(f"{path} is neither a checkpoint nor a run directory with checkpoints")
    return ckpts[-1]


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple[Transformer, Config, dict]:
    path = find_checkpoint(path)
    cfg = Config.load(path / CONFIG)
    try:
        state = load_file(str(path / WEIGHTS), device=device)
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError, Exception) as e:  # safetensors raises its own error types
        raise UserError(f"corrupted checkpoint {path}: {e}") from None
    model = Transformer(cfg.model, init=False).to(device)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (cfg.model.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise UserError(f"checkpoint {path} does not match its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model, cfg, meta
