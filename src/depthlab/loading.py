"""A depthlab checkpoint as a model: the model its config builds, holding its weights, a LoRA fine-tune's adapters
merged in (W + (alpha / r) B A, as peft's merge computes it), so that every command reading a checkpoint (eval,
export, analyze, fine-tuning from it) sees a plain model. Any model path, an HF directory included, is
depthlab.hf.load's; the LoRA adapters themselves (adding them, their live names) are depthlab.train.lora's.

A LoRA run's checkpoint stores the frozen base weights under their own names and each adapter as
`<module>.lora_A.weight` and `<module>.lora_B.weight` (see depthlab.train.lora).
"""

from __future__ import annotations

from pathlib import Path

import torch

from depthlab import UserError
from depthlab.checkpoint import CONFIG, load_verified, load_weights
from depthlab.config import Config, LoraConfig
from depthlab.model import build_model
from depthlab.paths import find_checkpoint

LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"  # an adapter's two matrices in checkpoint names
DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str):
    if name not in DTYPES:
        raise UserError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return getattr(torch, name)


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple:
    """(model, config, meta) from a checkpoint or a run directory; the model is rebuilt with its saved scheme."""
    ckpt = find_checkpoint(path)
    meta = load_verified(ckpt)
    cfg = Config.load(ckpt / CONFIG)
    model = build_model(cfg.model, init=False).to(device)
    missing, unexpected = model.load_state_dict(plain_weights(ckpt, device), strict=False)
    missing = [k for k in missing if not (cfg.model.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise UserError(f"checkpoint {ckpt} does not match its config: missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}")
    return model, cfg, meta


def plain_weights(ckpt, device: str = "cpu") -> dict:
    """A checkpoint's weights as a plain model of its config takes them: a LoRA run's adapters merged."""
    state = load_weights(ckpt, device)
    lora = Config.load(Path(ckpt) / CONFIG).train.lora
    return merged(state, lora) if lora.rank else state


def scaling(lora: LoraConfig) -> float:
    return lora.alpha / lora.rank  # peft's (not rsLoRA's alpha / sqrt(r))


@torch.no_grad()
def merged(state: dict, lora: LoraConfig) -> dict:
    """Checkpoint weights with every adapter merged into its weight, W + (alpha / r) B A, as peft's merge computes
    it; the adapters' own entries dropped. A state without adapters comes back as it is."""
    out = base_weights(state)
    for key in (k for k in state if k.endswith(LORA_A)):
        module = key[:-len(LORA_A)]
        delta = (state[module + LORA_B] @ state[key]) * scaling(lora)
        out[module + ".weight"] = out[module + ".weight"] + delta.to(out[module + ".weight"].dtype)
    return out


def base_weights(state: dict) -> dict:
    """Checkpoint weights without the adapters: the base model's, unmerged."""
    return {k: v for k, v in state.items() if not k.endswith((LORA_A, LORA_B))}


def adapters(state: dict) -> dict:
    """Only the adapters of checkpoint weights: {module: (A, B)}."""
    return {k[:-len(LORA_A)]: (state[k], state[k[:-len(LORA_A)] + LORA_B]) for k in state if k.endswith(LORA_A)}
