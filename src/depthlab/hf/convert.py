"""Weight mapping between depthlab's Transformer and Hugging Face's LlamaForCausalLM (both directions).

Only `pre` and `lns` map onto stock Llama. For `lns` the constant norm scale folds into the norm weight:
Norm_g(x) / sqrt(l) == Norm_{g / sqrt(l)}(x), so the exported model is exact and costs nothing extra.
"""

from __future__ import annotations

import torch

from depthlab import UserError
from depthlab.config import ModelConfig
from depthlab.model import Transformer

STOCK_LLAMA_SCHEMES = ("pre", "lns")

# depthlab name (inside layers.i) -> HF name (inside model.layers.i)
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "mlp_norm": "post_attention_layernorm",
    "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
    "attn.v_proj": "self_attn.v_proj", "attn.o_proj": "self_attn.o_proj",
    "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj",
}


def hf_llama_config_dict(cfg: ModelConfig) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads or cfg.n_heads, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "torch_dtype": "float32",
    }


@torch.no_grad()
def to_hf_llama_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """HF Llama weights for a `pre` or `lns` model, norm scales folded into the norm weights."""
    cfg = model.cfg
    if cfg.norm_scheme not in STOCK_LLAMA_SCHEMES or cfg.gpas:
        raise UserError(f"scheme {cfg.norm_scheme!r}{' + gpas' if cfg.gpas else ''} cannot be expressed as a stock "
                        f"Llama checkpoint (only {', '.join(STOCK_LLAMA_SCHEMES)} without gpas)")
    out = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm.weight}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = model.lm_head.weight
    for i, layer in enumerate(model.layers):
        for ours, theirs in _BLOCK_NAMES.items():
            module = layer.get_submodule(ours)
            w = module.weight * getattr(module, "scale", 1.0)
            out[f"model.layers.{i}.{theirs}.weight"] = w
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def from_hf_llama_state_dict(hf_state: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """depthlab weights from HF Llama-layout weights (Llama, Mistral, Qwen2 share the names); biases are left to
    the caller, which must have checked that they are zero."""
    out = {"embed_tokens.weight": hf_state["model.embed_tokens.weight"], "norm.weight": hf_state["model.norm.weight"]}
    if "lm_head.weight" in hf_state:
        out["lm_head.weight"] = hf_state["lm_head.weight"]
    for i in range(n_layers):
        for ours, theirs in _BLOCK_NAMES.items():
            out[f"layers.{i}.{ours}.weight"] = hf_state[f"model.layers.{i}.{theirs}.weight"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}
