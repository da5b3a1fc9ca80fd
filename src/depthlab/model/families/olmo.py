"""The olmo family (OLMo-1): a LayerNorm with neither weight nor bias, and an optional clamp of q, k, v."""

from __future__ import annotations

import math

from depthlab.config import ModelConfig
from depthlab.model.families.base import Family, register, released_preset, require


def _olmo(tokens: float, **shape):
    common = dict(n_kv_heads=shape["n_heads"], vocab_size=50_304, rope_theta=1e4, norm_eps=1e-5, max_seq_len=2048)
    return lambda name: released_preset(name, "olmo", tokens, **common, **shape)


@register("olmo")
class Olmo(Family):
    """OLMo-1: the norm is LayerNorm without weight or bias (transformers fixes its epsilon at 1e-5), and
    model.clip_qkv clamps q, k, v to [-c, c] (OLMo-1.7's 8.0)."""

    hf_class = "OlmoForCausalLM"
    hf_names = {"olmo": "OLMo"}
    norm = "layernorm"
    fixed_norm_eps = 1e-5
    options = {"clip_qkv": "OLMo-1's q/k/v clamp"}
    # OLMo-1B is not in the paper: it gets OLMo-7B's 20B tokens (loss 2.69 -> 2.50 there)
    presets = {"olmo-1b": _olmo(20e9, dim=2048, n_layers=16, n_heads=16, ffn_dim=8192, tie_embeddings=True),
               "olmo-7b": _olmo(20e9, dim=4096, n_layers=32, n_heads=32, ffn_dim=11008, tie_embeddings=False)}

    def check(self, m: ModelConfig) -> None:
        require(m.clip_qkv is None or (math.isfinite(m.clip_qkv) and m.clip_qkv > 0),
                f"model.clip_qkv must be a positive number or null, got {m.clip_qkv}")

    def hf_config(self, cfg: ModelConfig) -> dict:
        return {**super().hf_config(cfg), "clip_qkv": cfg.clip_qkv}

    def from_hf(self, hf_cfg, seq_len: int) -> dict:
        return {**super().from_hf(hf_cfg, seq_len), "clip_qkv": getattr(hf_cfg, "clip_qkv", None)}
