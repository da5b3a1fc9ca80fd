"""The olmo2 family (OLMo-2): QK-norm, and the block's two norms on the branch outputs."""

from __future__ import annotations

from depthlab.model.families.base import Family, register, released_preset


@register("olmo2")
class Olmo2(Family):
    """OLMo-2: RMSNorm on q and on k (over all heads, before RoPE), and h + Norm(F(h)): the norms sit on the branch
    outputs, named after the branches they follow."""

    hf_class = "Olmo2ForCausalLM"
    hf_names = {"olmo2": "OLMo-2"}
    qk_norm = True
    norms_after_branch = True
    hf_norm_names = {"attn_norm": "post_attention_layernorm", "mlp_norm": "post_feedforward_layernorm"}
    # OLMo-2 1B is not in the paper: it gets OLMo-7B's 20B tokens
    presets = {"olmo2-1b": lambda name: released_preset(
        name, "olmo2", 20e9, dim=2048, n_layers=16, n_heads=16, n_kv_heads=16, ffn_dim=8192, vocab_size=100_352,
        tie_embeddings=False, rope_theta=5e5, norm_eps=1e-6, max_seq_len=4096)}
