"""LoRA through peft: low-rank adapters on a depthlab model's linear layers, only they train.

    y = W x + b  ->  y = W x + b + (alpha / r) B A dropout(x)      A: r x in (Kaiming), B: out x r (zeros)

so at the start the adapted model is the base model exactly. peft's `inject_adapter_in_model` puts its
`lora.Linear` in place of each target (the model stays a depthlab Transformer) and freezes every other weight;
depthlab.model.parts calls such a wrapped projection as a module, so its adapter is never skipped. Targets are
named by the block's projections, LLM-Adapters' LLaMA set by default (TARGETS; q, k, v, up, down). A scheme's
constants (the LNS scale 1/sqrt(l) on a norm's output, DeepNorm's residual alpha) are attributes, not weights:
the adapters never touch them, and an adapter on q_proj reads the scaled norm output exactly as q_proj does.

A LoRA run's checkpoint is self-contained, in depthlab's names: model.safetensors holds the frozen base weights
under their own names (`layers.0.attn.q_proj.weight`) and each adapter as `<module>.lora_A.weight` and
`<module>.lora_B.weight` (peft's adapter names without its `base_model.model.` prefix), beside the config's
`train.lora`. `merged` folds them into a plain model's weights (depthlab.loading reads a checkpoint so);
`checkpoint_names` / `peft_names` translate between these names and those of the live, adapted model (trainer
save and resume).
"""

from __future__ import annotations

import importlib.util

import torch

from depthlab import UserError
from depthlab.config import LORA_TARGETS, LoraConfig
from depthlab.model.validate import check_lora, check_lora_rank  # noqa: F401 (check_lora: the trainer's name)

TARGETS = LORA_TARGETS  # --lora-targets name -> the projection in a depthlab block
ADAPTER = "default"  # peft's name for the one adapter
LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"  # an adapter's two matrices in checkpoint names
_A = LORA_A


def target_modules(lora: LoraConfig) -> list[str]:
    """The depthlab module suffixes the targets name (q or q_proj: attn.q_proj)."""
    return [TARGETS[t.removesuffix("_proj")] for t in lora.targets]


def require_peft() -> None:
    if importlib.util.find_spec("peft") is None:
        raise UserError("LoRA needs peft: pip install 'depthlab[lora]'")


def peft_config(lora: LoraConfig, modules: list[str]):
    """peft's LoraConfig for these settings on modules named by `modules` (suffixes of module names)."""
    require_peft()
    import peft

    return peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=modules)


def add_adapters(model: torch.nn.Module, lora: LoraConfig) -> int:
    """Put adapters on `model`'s targets in place and freeze everything else; the number of trainable values."""
    require_peft()
    import peft

    targets = target_modules(lora)
    missing = [t for t in targets if not any(name.endswith("." + t) for name, _ in model.named_modules())]
    if missing:  # a ViT's MLP, say, has no gate_proj
        raise UserError(f"this model has no {missing[0].split('.')[-1]} to put a LoRA adapter on")
    check_lora_rank(model, lora.rank, targets)
    peft.inject_adapter_in_model(peft_config(lora, targets), model, adapter_name=ADAPTER)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def checkpoint_names(state: dict) -> dict:
    """The adapted model's state dict in checkpoint names: base weights as the plain model names them, adapters
    as <module>.lora_A.weight / lora_B.weight. A plain model's state comes back as it is."""
    return {k.replace(".base_layer.", ".").replace(f".{ADAPTER}.", "."): v for k, v in state.items()}


def peft_names(state: dict) -> dict:
    """checkpoint_names' inverse: the names of the live adapted model (peft's base_layer and adapter name)."""
    adapted = {k[:-len(_A)] for k in state if k.endswith(_A)}
    out = {}
    for k, v in state.items():
        module, _, param = k.rpartition(".")
        if module in adapted:
            k = f"{module}.base_layer.{param}"
        elif module.endswith((".lora_A", ".lora_B")):
            k = f"{module}.{ADAPTER}.{param}"
        out[k] = v
    return out


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
