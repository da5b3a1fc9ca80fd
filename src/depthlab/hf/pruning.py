"""The mechanics of reworking a model's decoder blocks and saving it as a stock Hugging Face model: remove some
(`prune_blocks`: which ones, a span or a choice, is the caller's: depthlab.surgery), or repeat a span (`duplicate`):
the layers up to the span's end, a copy of the span, then the rest.

Layers are counted as in the HF weight names (`model.layers.{i}`): from 0, the span START:END a Python slice, so
`--remove 20:24` drops model.layers.20 .. model.layers.23 (blocks 21-24 counted from 1), `-1:` the last layer and
`:2` the first two; `--span 4:8` repeats model.layers.4 .. model.layers.7. The
blocks are renumbered (weights, and each attention's `layer_idx`, which indexes the KV cache), and the config is
made consistent: `num_hidden_layers`, every per-layer list (`layer_types`, ...) and `max_window_layers`
(depthlab.block_order).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import tempfile
from pathlib import Path

from torch import nn

from depthlab import UserError
from depthlab.block_order import reorder_config
from depthlab.model.blocks import find_blocks, set_blocks


def parse_span(text: str, flag: str = "--remove") -> tuple[int | None, int | None]:
    """--remove's (or duplicate's --span) START:END as (start, end), either None where left out."""
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return _bound(start), _bound(end)
    except ValueError:
        raise UserError(f"{flag} expects START:END (0-based, END excluded, e.g. 20:24; -1: is the last layer), got "
                        f"{text!r}") from None


def _bound(text: str) -> int | None:
    return int(text) if text.strip() else None


def layer_span(start: int | None, end: int | None, n: int, verb: str = "remove") -> range:
    """The layers START:END names in a model of n layers, sliced as Python slices (negative: counted from the end,
    None: open); refused unless both bounds are within -n..n and the span holds at least one layer and (to remove)
    leaves at least one of n."""
    span = range(n)[start:end]
    keep = verb == "remove"
    if any(b is not None and not -n <= b <= n for b in (start, end)) or not 0 < len(span) < n + (not keep):
        raise UserError(f"cannot {verb} layers {'' if start is None else start}:{'' if end is None else end} of a "
                        f"{n}-layer model: need START < END within -{n}..{n} (negative: from the end)"
                        + (", keeping at least one layer" if keep else ""))
    return span


def prune_layers(model: nn.Module, start: int | None, end: int | None) -> nn.Module:
    """Drop blocks start..end-1 (a slice: `layer_span`) in place; returns the model."""
    return drop_layers(model, layer_span(start, end, len(find_blocks(model)[1])))


def drop_layers(model: nn.Module, removed) -> nn.Module:
    """Drop the blocks whose 0-based indices are in `removed` (at least one kept), in place; returns the model."""
    n = len(find_blocks(model)[1])
    kept = [i for i in range(n) if i not in set(removed)]
    if not kept or any(not 0 <= i < n for i in removed):
        raise UserError(f"cannot remove layers {sorted(removed)} of a {n}-layer model: need indices 0..{n - 1}, "
                        "keeping at least one layer")
    return relayer(model, kept)


def duplicate_layers(model: nn.Module, start: int | None, end: int | None) -> nn.Module:
    """Run layers start..end-1 (a slice: `layer_span`) twice: the model's layers up to end-1, then a copy of the
    span, then the rest; in place, returns the model."""
    n = len(find_blocks(model)[1])
    span = layer_span(start, end, n, "repeat")
    return relayer(model, [*range(span.stop), *span, *range(span.stop, n)])


def relayer(model: nn.Module, order: list[int]) -> nn.Module:
    """The model's blocks in `order` (0-based indices of its blocks; a block named again is a copy with its own
    weights), renumbered (each attention's `layer_idx`, which indexes the KV cache) and the config made consistent;
    in place, returns the model."""
    prefix, blocks = find_blocks(model)
    layers, seen = [], set()
    for old in order:
        layers.append(copy.deepcopy(blocks[old]) if old in seen else blocks[old])
        seen.add(old)
    set_blocks(model, prefix, layers)
    reorder_config(model.config, len(blocks), order)
    return model


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


def refuse_non_causal(path: Path, src, command: str = "prune") -> None:
    """prune and duplicate rework the decoder blocks of a causal language model; another kind (a ViT) is named as
    such."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from depthlab.paths import read_json

    config = read_json(Path(path) / "config.json")
    model_type = config.get("model_type") if isinstance(config, dict) else None  # else load_pretrained says why
    if isinstance(model_type, str) and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        what = "a ViT (an image classifier)" if model_type == "vit" else f"a {model_type!r} model"
        raise UserError(f"{command} reworks the decoder blocks of a causal language model, and {src} is {what}")


def prune(src: str | Path, start: int | None, end: int | None, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Prune layers start..end-1 (a slice: `layer_span`) of any model path: see `prune_blocks`."""
    return prune_blocks(src, lambda n: layer_span(start, end, n), out_dir, overwrite)[0]


def prune_blocks(src: str | Path, choose, out_dir: str | Path, overwrite: bool = False, why: str = "",
                 reads: tuple[str | Path, ...] = (), beside: dict[str, dict] | None = None) -> tuple[Path, list[int]]:
    """Prune any model path (see `rewrite_blocks`): `choose(n)` names the 0-based blocks to remove of its n, `why`
    says why in the provenance file, `beside` ({file name: record}, filled by `choose`) what else is written next
    to the model. Returns the output and the removed blocks."""
    removed: list[int] = []

    def edit(model) -> dict:
        removed.extend(sorted(choose(len(find_blocks(model)[1]))))
        drop_layers(model, removed)
        return {"removed_layers": removed,
                "note": f"model.layers {', '.join(map(str, removed))} removed{why}, the rest renumbered"}

    return rewrite_blocks(src, edit, out_dir, "prune", overwrite, reads, beside), removed


def duplicate(src: str | Path, start: int | None, end: int | None, out_dir: str | Path,
              overwrite: bool = False) -> tuple[Path, list[int]]:
    """Write any model path (see `rewrite_blocks`) with layers start..end-1 (a slice: `layer_span`) run twice.
    Returns the output and the repeated layers."""
    repeated: list[int] = []

    def edit(model) -> dict:
        repeated.extend(layer_span(start, end, len(find_blocks(model)[1]), "repeat"))
        duplicate_layers(model, start, end)
        return {"duplicated_layers": repeated, "note": f"model.layers {repeated[0]}..{repeated[-1]} run twice (a "
                f"copy of them inserted after model.layers.{repeated[-1]}), the layers renumbered"}

    return rewrite_blocks(src, edit, out_dir, "duplicate", overwrite), repeated


def rewrite_blocks(src: str | Path, edit, out_dir: str | Path, command: str, overwrite: bool = False,
                   reads: tuple[str | Path, ...] = (), beside: dict[str, dict] | None = None) -> Path:
    """Rework the blocks of any model path, an HF model directory or a depthlab checkpoint / run (exported to a
    stock HF model first), and save it as a stock HF model: `edit(model)` reworks the loaded model in place and
    returns what the provenance file records. `out_dir` is written whole (depthlab.ownership.writing): an existing
    one must be an earlier export, prune or duplicate, unless `overwrite`; never `src` nor what else the choice
    `reads` (an analysis). `beside`: {file name: record} written next to the model once `edit` has run, each
    record that is not empty then."""
    from transformers import AutoTokenizer

    from depthlab.hf.exporter import export
    from depthlab.model.apply import load_pretrained
    from depthlab.ownership import is_depthlab_hf, writing
    from depthlab.paths import EXPORT_INFO, Kind, model_path

    kind, path = model_path(src)
    with tempfile.TemporaryDirectory() as tmp, writing(out_dir, is_depthlab_hf, command, overwrite,
                                                             inputs=[src, *reads]) as out:
        if kind is Kind.CHECKPOINT:
            path = export(path, Path(tmp) / "exported")
        refuse_non_causal(path, src, command)
        try:
            model = load_pretrained(path)  # a patched (LNS) model keeps each layer's own scale
        except UserError as e:  # name the user's model, not the temporary export it was loaded from
            raise UserError(str(e).replace(str(path), str(src))) from None
        info = {"source": str(src), **edit(model)}
        with safetensors_os_errors(out_dir):
            model.save_pretrained(out)
        try:
            AutoTokenizer.from_pretrained(path).save_pretrained(out)
        except (OSError, ValueError, TypeError, KeyError):
            pass  # a model directory without tokenizer files: the written one has none either
        (out / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
        for name, content in (beside or {}).items():
            if content:
                (out / name).write_text(json.dumps(content, indent=2) + "\n")
    return Path(out_dir)
