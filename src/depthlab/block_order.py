"""A Hugging Face config made that of the same model with its blocks in another order (some dropped, some run
twice): every per-layer list (`layer_types`, `depthlab_layer_scales`, ...) follows the order, `max_window_layers`
counts what is left below it, `num_hidden_layers` is the new depth. Below hf (which saves such a model: prune,
duplicate) and analysis (which runs one in place: the duplication cross-check)."""

from __future__ import annotations

import contextlib

_NOT_PER_LAYER = {"architectures", "bos_token_id", "eos_token_id", "pad_token_id"}


def reorder_config(cfg, n: int, order: list[int]) -> None:
    """Make `cfg`, the config of a model of n blocks, that of the model whose blocks run in `order` (0-based
    indices of its blocks), in place."""
    for key, value in list(vars(cfg).items()):  # per-layer fields: layer_types, depthlab_layer_scales, ...
        if isinstance(value, (list, tuple)) and len(value) == n and key not in _NOT_PER_LAYER:
            setattr(cfg, key, type(value)(value[i] for i in order))
    if isinstance(getattr(cfg, "max_window_layers", None), int):
        # Qwen2: layers below this index use full attention, the rest a sliding window (layer_types, where the
        # config has it, is what transformers reads)
        cfg.max_window_layers = sum(i < cfg.max_window_layers for i in order)
    cfg.num_hidden_layers = len(order)


@contextlib.contextmanager
def config_in_order(cfg, n: int, order: list[int]):
    """An HF config made, while the `with` lasts, that of the model whose n blocks run in `order`: what gives each
    block the attention mask and RoPE table of its own kind (Gemma-3 reads `layer_types[i]` by position), as
    `depthlab.hf.pruning.relayer` makes it for good."""
    saved = dict(vars(cfg))
    reorder_config(cfg, n, order)
    try:
        yield cfg
    finally:
        for key, value in saved.items():
            setattr(cfg, key, value)
