"""The mistral family: LLaMA's block with sliding-window attention (model.sliding_window).

Each token attends to itself and the sliding_window - 1 tokens before it, in every layer: transformers' Mistral
mask, key j visible to query i when i - sliding_window < j <= i (masking_utils.sliding_window_causal_mask_function,
the same for its eager and sdpa attention). With sliding_window null, or at least the context, it is Llama.
"""

from __future__ import annotations

from depthlab.config import ModelConfig
from depthlab.model.families.base import Family, register, require
from depthlab.model.parts import Attention


@register("mistral")
class Mistral(Family):
    """Mistral (7B v0.1: a 4096-token window over a 32k context): Llama's block, attention in a sliding window."""

    hf_class = "MistralForCausalLM"
    hf_names = {"mistral": "Mistral"}
    options = {"sliding_window": "Mistral's attention window"}

    def attention(self, cfg: ModelConfig, layer_id: int, **variant) -> Attention:
        return super().attention(cfg, layer_id, window=cfg.sliding_window, **variant)

    def check(self, m: ModelConfig) -> None:
        require(m.sliding_window is None or m.sliding_window > 0,
                f"model.sliding_window must be a positive number of tokens or null, got {m.sliding_window}")

    def attended_keys(self, cfg: ModelConfig, seq_len: int) -> int:
        return min(seq_len, cfg.sliding_window or seq_len)

    def hf_config(self, cfg: ModelConfig) -> dict:
        return {**super().hf_config(cfg), "sliding_window": cfg.sliding_window}

    def from_hf(self, hf_cfg, seq_len: int) -> dict:  # MistralForCausalLM slides in every layer
        return {**super().from_hf(hf_cfg, seq_len), "sliding_window": hf_cfg.sliding_window}
