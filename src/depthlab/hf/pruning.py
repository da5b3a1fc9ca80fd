"""Remove a contiguous span of decoder blocks from a Hugging Face model and save the smaller model.

Layers are counted as in the HF weight names (`model.layers.{i}`): from 0, the span START:END half-open like a
Python slice, so `--remove 20:24` drops model.layers.20 .. model.layers.23 (blocks 21-24 counted from 1). The kept
blocks are renumbered (weights, and each attention's `layer_idx`, which indexes the KV cache), and the config is
made consistent: `num_hidden_layers`, every per-layer list (`layer_types`, ...) and `max_window_layers`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path

from torch import nn

from depthlab import UserError
from depthlab.model.blocks import find_blocks


def parse_span(text: str) -> tuple[int, int]:
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(start), int(end)
    except ValueError:
        raise UserError(f"--remove expects START:END (0-based, END excluded, e.g. 20:24), got {text!r}") from None


def prune_layers(model: nn.Module, start: int, end: int) -> nn.Module:
    """Drop blocks start..end-1 in place; returns the model."""
    prefix, blocks = find_blocks(model)
    n = len(blocks)
    if not 0 <= start < end <= n or end - start == n:
        raise UserError(f"cannot remove layers {start}:{end} of a {n}-layer model: need 0 <= START < END <= {n}, "
                        "keeping at least one layer")
    kept = [i for i in range(n) if not start <= i < end]
    for new, old in enumerate(kept):
        for module in blocks[old].modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = new
    parent, _, attr = prefix.rpartition(".")
    setattr(model.get_submodule(parent), attr, nn.ModuleList(blocks[i] for i in kept))
    _prune_config(model.config, n, kept)
    return model


_NOT_PER_LAYER = {"architectures", "bos_token_id", "eos_token_id", "pad_token_id"}


def _prune_config(cfg, n: int, kept: list[int]) -> None:
    for key, value in list(vars(cfg).items()):  # per-layer fields: layer_types, ...
        if isinstance(value, (list, tuple)) and len(value) == n and key not in _NOT_PER_LAYER:
            setattr(cfg, key, type(value)(value[i] for i in kept))
    if isinstance(getattr(cfg, "max_window_layers", None), int):
        # Qwen2: layers below this index use full attention, the rest a sliding window
        cfg.max_window_layers = sum(i < cfg.max_window_layers for i in kept)
    cfg.num_hidden_layers = len(kept)


@contextlib.contextmanager
def safetensors_os_errors(path):
    """safetensors reports a write the machine refused (a full disk) as its own error, "... (os error 28)": raised
    as that OSError, the CLI's one line for what the machine refuses."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # an older safetensors raises plain errors
        SafetensorError = ()
    try:
        yield
    except SafetensorError as e:
        code = re.search(r"os error (\d+)", str(e))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(path)) from None


def refuse_non_causal(path: Path, src) -> None:
    """prune removes the decoder blocks of a causal language model; another kind (a ViT) is named as such."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from depthlab.paths import read_json

    config = read_json(Path(path) / "config.json")
    model_type = config.get("model_type") if isinstance(config, dict) else None  # else load_pretrained says why
    if isinstance(model_type, str) and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        what = "a ViT (an image classifier)" if model_type == "vit" else f"a {model_type!r} model"
        raise UserError(f"prune removes decoder blocks of a causal language model, and {src} is {what}")


def prune(src: str | Path, start: int, end: int, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Prune any model path: an HF model directory, or a depthlab checkpoint / run (exported to a stock HF model
    first). `out_dir` is written whole (depthlab.owned.writing): an existing one must be an earlier export or
    prune, unless `overwrite`."""
    from transformers import AutoTokenizer

    from depthlab.hf.exporter import export
    from depthlab.model.apply import load_pretrained
    from depthlab.owned import is_depthlab_hf, writing
    from depthlab.paths import EXPORT_INFO, Kind, model_path

    kind, path = model_path(src)
    with tempfile.TemporaryDirectory() as tmp, writing(out_dir, is_depthlab_hf, "prune", overwrite,
                                                             inputs=[src]) as out:
        if kind is Kind.CHECKPOINT:
            path = export(path, Path(tmp) / "exported")
        refuse_non_causal(path, src)
        try:
            model = load_pretrained(path)  # a patched (LNS) model keeps each kept layer's own scale
        except UserError as e:  # name the user's model, not the temporary export it was loaded from
            raise UserError(str(e).replace(str(path), str(src))) from None
        prune_layers(model, start, end)
        with safetensors_os_errors(out_dir):
            model.save_pretrained(out)
        try:
            AutoTokenizer.from_pretrained(path).save_pretrained(out)
        except (OSError, ValueError, TypeError, KeyError):
            pass  # a model directory without tokenizer files: the pruned one has none either
        provenance = {"source": str(src), "removed_layers": f"{start}:{end}",
                      "note": f"model.layers.{start}..{end - 1} removed, the rest renumbered"}
        (out / EXPORT_INFO).write_text(json.dumps(provenance, indent=2) + "\n")
    return Path(out_dir)
