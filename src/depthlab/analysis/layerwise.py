"""The model with a single block slot, for layer-by-layer analysis of models larger than memory.

The skeleton is the model built with one layer: embedding, final norm, head and position tables in memory, plus
one block whose weights are swapped in from the safetensors files, block by block (an HF model whose blocks mix
sliding and full attention, Gemma-2's, is built with one layer of each kind: see `Skeleton`). The skeleton's own
forward gives the embedding output and the arguments a block is called with; blocks are then applied to the
calibration activations one at a time.

Memory: the skeleton is built with its parameters on the meta device (no random weights drawn, nothing held
twice), then given the tensors read from the files as they are; a block's old weights are let go before the next
block's are read. At most one block's weights, the embedding and head, and the activations are held.

The same model at initialisation (`init_skeleton`: what the trained model's curse index is read against) is drawn
as whole-model mode draws it, into memory-mapped files, and read from them block by block in the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from torch import nn

from depthlab import UserError
from depthlab.analysis.layers import LayeredLM, depthlab_mid_probes, from_depthlab, from_hf
from depthlab.checkpoint import CONFIG, TOKENIZER, WEIGHTS, is_sharded, load_verified, read_weights, weight_names
from depthlab.loading import hf_context, load_hf_tokenizer, torch_dtype
from depthlab.paths import Kind, model_path

# Kinds of HF block that differ only in the attention mask they are given (same weights, same call otherwise).
ATTENTION_KINDS = {"full_attention", "sliding_attention"}
IN_MEMORY_BYTES = 2**20  # init_skeleton: smaller tensors stay in memory, larger ones go to files


class Tensors:
    """Tensors by name (`where`: name -> where it is), read a block at a time by `with_prefix`."""

    where: dict

    def __contains__(self, key: str) -> bool:
        return key in self.where

    def get_many(self, keys: list[str]) -> dict:
        raise NotImplementedError

    def with_prefix(self, prefix: str) -> dict:
        got = self.get_many([k for k in self.where if k.startswith(prefix)])
        return {k[len(prefix):]: v for k, v in got.items()}


class ModuleTensors(Tensors):
    """A model's own tensors (its state dict), read as a checkpoint's are."""

    def __init__(self, model: nn.Module):
        self.where = model.state_dict()

    def get_many(self, keys: list[str]) -> dict:
        return {k: self.where[k] for k in keys}


class TensorFiles(Tensors):
    """Read tensors by name from a depthlab checkpoint (full or sharded: depthlab.checkpoint reads either) or from
    Hugging Face safetensors (one file or a sharded set, model.safetensors.index.json)."""

    def __init__(self, folder: Path):
        index = folder / "model.safetensors.index.json"
        self.ckpt = None
        if is_sharded(folder):
            self.ckpt, self.where = folder, dict.fromkeys(weight_names(folder), folder)
        elif index.is_file():
            wm = json.loads(index.read_text())["weight_map"]
            self.where = {k: folder / f for k, f in wm.items()}
        elif (folder / WEIGHTS).is_file():
            with safe_open(str(folder / WEIGHTS), "pt") as f:
                self.where = {k: folder / WEIGHTS for k in f.keys()}
        else:
            raise UserError(f"layer-by-layer mode needs safetensors weights or a sharded checkpoint; none in {folder}")

    def get_many(self, keys: list[str]) -> dict:
        if self.ckpt is not None:  # one read of the rank files' parts that hold these tensors
            return read_weights(self.ckpt, keys)
        out = {}
        for path in dict.fromkeys(self.where[k] for k in keys):
            with safe_open(str(path), "pt") as f:
                out.update({k: f.get_tensor(k) for k in keys if self.where[k] == path})
        return out


class Skeleton:
    """`slots[i]`: the slot block i runs in. One slot, or (an HF model whose blocks differ in kind: sliding and full
    attention) one per kind, in the order the kinds first appear: the model's own forward then gives each slot the
    mask of its kind, and block i is replayed in its kind's slot with that slot's recorded call. `cfg`: a depthlab
    model's Config (None for HF)."""

    def __init__(self, lm: LayeredLM, n_layers: int, files: Tensors, make_block=None, slots=None, cfg=None):
        self.lm, self.n_layers, self.files, self.make_block, self.cfg = lm, n_layers, files, make_block, cfg
        lm.KEEP_BYTES = 0  # its traces (of the skeleton) are never replayed: none is kept for a second use
        self.slots = list(slots or [0] * n_layers)
        p = next(lm.model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.file_prefix = lm.blocks_path + "."

    def load_block(self, i: int) -> int:
        """Put block i's weights (and, for depthlab schemes, block i itself: LNS scales by depth) in the slot;
        returns the slot block i runs in. Every slot is given the same tensors (held once), so the skeleton's own
        forward runs whichever block is loaded."""
        for blk in self.lm.blocks:  # the previous block's weights go before the next one's are read
            blk.to("meta")
        state = self.files.with_prefix(f"{self.file_prefix}{i}.")
        if not state:
            raise UserError(f"no weights for block {i} ({self.file_prefix}{i}.*) in the checkpoint")
        if self.make_block is not None:
            with params_on_meta():
                self.lm.blocks[0] = buffers_to(self.make_block(i), self.device, self.dtype)
            self.lm.mid_probes = depthlab_mid_probes(self.lm.model)
        state = {k: v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device)
                 for k, v in state.items()}
        for blk in self.lm.blocks:
            assign(blk, state, self.device, self.dtype)
        return self.slots[i]


@contextlib.contextmanager
def params_on_meta():
    """Modules built inside have their parameters on the meta device (buffers stay real: RoPE tables are computed
    at construction); `assign` then gives them the tensors read from the files."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def buffers_to(model: nn.Module, device, dtype=None) -> nn.Module:
    """The buffers on `device`, floating ones in `dtype` if given, as `model.to(device, dtype)` would put them (the
    parameters are there already, or on meta until their block is loaded)."""
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                module._buffers[name] = buf.to(device, dtype) if dtype and buf.is_floating_point() else buf.to(device)
    return model


def assign(module: nn.Module, state: dict, device, dtype, strict: bool = True) -> None:
    """Load `state` into `module` by taking its tensors (in `dtype` on `device`) rather than copying into them."""
    state = {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in state.items()}
    module.load_state_dict(state, strict=strict, assign=True)


def load_non_block(model, files: Tensors, blocks_path: str, tied: bool, device, dtype) -> None:
    wanted = []
    for k in model.state_dict():
        if k.startswith(blocks_path + "."):
            continue
        if k in files:
            wanted.append(k)
        elif not (tied and k.endswith("weight") and "head" in k):
            raise UserError(f"weight {k} missing from the checkpoint")
    assign(model, files.get_many(wanted), device, dtype, strict=False)


def load_skeleton(path: str, trust_remote_code: bool = False, dtype: str = "float32", device: str = "cpu"):
    """(Skeleton, tokenizer, seq_len, info) for any model path (depthlab.paths.model_path); info["context"] is the
    longest window the model takes."""
    p = Path(path)
    kind, ckpt = model_path(p)
    if kind is Kind.HF:
        return _hf_skeleton(ckpt, trust_remote_code, dtype, device)
    from depthlab.config import Config
    from depthlab.data.tokenizer import load_tokenizer

    cfg = Config.load(ckpt / CONFIG)
    if cfg.model.is_vit:
        raise UserError(f"{ckpt}: layer-by-layer mode is for language models; analyse a ViT in whole-model mode "
                        "(without --layer-by-layer)")
    if cfg.train.lora.rank:
        raise UserError(f"{ckpt} is a LoRA fine-tune, whose adapters are stored beside the weights they adapt; "
                        "layer-by-layer mode reads the weights as stored: analyse it in whole-model mode (the "
                        "adapters merged) or its export (`depthlab export`)")
    skel = depthlab_skeleton(cfg, TensorFiles(ckpt), device, torch_dtype(dtype), p.name or str(p))
    info = {"scheme": cfg.model.norm_scheme, "step": load_verified(ckpt).step, "checkpoint": str(ckpt),
            "context": cfg.model.max_seq_len}
    return skel, load_tokenizer(ckpt / TOKENIZER), cfg.data.seq_len, info


def depthlab_skeleton(cfg, files: Tensors, device, dtype: torch.dtype, name: str) -> Skeleton:
    """The skeleton of a depthlab model of config `cfg` whose tensors `files` gives."""
    from depthlab.model import Transformer
    from depthlab.model.schemes import build_block

    with params_on_meta():
        model = Transformer(dataclasses.replace(cfg.model, n_layers=1), init=False)
    load_non_block(model, files, "layers", cfg.model.tie_embeddings, device, dtype)
    if cfg.model.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    lm = from_depthlab(buffers_to(model, device, dtype), name)  # as load_model
    return Skeleton(lm, cfg.model.n_layers, files, lambda i: build_block(cfg.model, i + 1), cfg=cfg)


def init_skeleton(cfg, folder: Path, device) -> Skeleton:
    """The model of config `cfg` at initialisation, in float32, drawn from the generator's state as build_model(cfg)
    would draw it (bitwise: depthlab.model.meta), each tensor of IN_MEMORY_BYTES or more into
    a memory-mapped file in `folder`: the whole model is never held in memory, only the pages being read."""
    from depthlab.model.meta import build_on_meta, materialize

    names = itertools.count()

    def storage(t: torch.Tensor) -> torch.Tensor:
        if t.numel() * t.element_size() < IN_MEMORY_BYTES:
            return torch.empty_like(t, device="cpu")
        dtype = np.dtype(str(t.dtype).removeprefix("torch."))
        return torch.from_numpy(np.lib.format.open_memmap(folder / f"{next(names)}.npy", "w+", dtype, tuple(t.shape)))

    model, constants = build_on_meta(cfg.model)
    materialize(model, torch.device("cpu"), constants, storage)
    return depthlab_skeleton(cfg, ModuleTensors(model.eval()), device, torch.float32, "init")


def _hf_skeleton(p: Path, trust_remote_code: bool, dtype: str, device: str):
    import transformers

    from depthlab.analysis.layers import find_blocks

    config = transformers.AutoConfig.from_pretrained(str(p), trust_remote_code=trust_remote_code)
    n_layers = config.num_hidden_layers
    types = list(getattr(config, "layer_types", None) or [])
    kinds = list(dict.fromkeys(types))  # the skeleton's slots: one per kind, in order of first appearance
    if len(kinds) > 1 and not set(kinds) <= ATTENTION_KINDS:
        raise UserError(f"{p}: blocks of different kinds ({', '.join(sorted(kinds))}); layer-by-layer mode takes "
                        f"a mix of {' and '.join(sorted(ATTENTION_KINDS))} only, use whole-model mode")
    config.num_hidden_layers = max(1, len(kinds))
    if kinds:
        config.layer_types = kinds
    with params_on_meta():
        model = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code,
                                                              dtype=torch_dtype(dtype))
    files = TensorFiles(p)
    blocks_path, _ = find_blocks(model)
    load_non_block(model, files, blocks_path, bool(getattr(config, "tie_word_embeddings", False)), device,
                   torch_dtype(dtype))
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    lm = from_hf(buffers_to(model, device), p.name)
    tok, context = load_hf_tokenizer(p, trust_remote_code), hf_context(config)
    slots = [kinds.index(t) for t in types] if kinds else None
    info = {"model_type": config.model_type, "context": context}
    return Skeleton(lm, n_layers, files, slots=slots), tok, min(512, context), info
