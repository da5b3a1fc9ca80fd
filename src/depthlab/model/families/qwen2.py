"""The qwen2 family: LLaMA's block with biases on the q, k and v projections."""

from __future__ import annotations

from depthlab.model.families.base import Family, register, released_preset


@register("qwen2")
class Qwen2(Family):
    """Qwen2 / Qwen2.5: biases on q, k, v (every released one has nonzero ones), none on o or the MLP."""

    hf_class = "Qwen2ForCausalLM"
    hf_names = {"qwen2": "Qwen2"}
    qkv_bias = True
    # Qwen2.5-0.5B's shape; the paper's run: 6B tokens, PPL 20.62 -> 19.57
    presets = {"qwen2.5-0.5b": lambda name: released_preset(
        name, "qwen2", 6e9, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, ffn_dim=4864, vocab_size=151_936,
        tie_embeddings=True, rope_theta=1e6, norm_eps=1e-6, max_seq_len=4096)}
