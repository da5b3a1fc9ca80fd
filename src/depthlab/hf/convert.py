"""Weight mapping between depthlab's Transformer and stock Hugging Face models (both directions).

Which schemes map onto which stock class is declared on each scheme (`hf_export`, depthlab.model.schemes).
`pre` and `lns` map onto stock Llama. For `lns` the constant norm scale folds into the norm weight:
Norm_g(x) / sqrt(l) == Norm_{g / sqrt(l)}(x), so the exported model is exact and costs nothing extra.
`sandwich` maps onto stock Gemma-2, whose block is exactly Sandwich-LN (a norm before and after each branch);
Gemma's RMSNorm multiplies by (1 + w) and its embedding by sqrt(dim), both folded here.
"""

from __future__ import annotations

import math

import torch

from depthlab import UserError
from depthlab.config import ModelConfig
from depthlab.model import Transformer
from depthlab.model.schemes import SCHEMES, scheme_class

# depthlab name (inside layers.i) -> HF name (inside model.layers.i)
_PROJECTIONS = {
    "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
    "attn.v_proj": "self_attn.v_proj", "attn.o_proj": "self_attn.o_proj",
    "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj",
}
_LLAMA_NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
_GEMMA2_NORMS = {"attn_norm": "input_layernorm", "attn_out_norm": "post_attention_layernorm",
                 "mlp_norm": "pre_feedforward_layernorm", "mlp_out_norm": "post_feedforward_layernorm"}
_BLOCK_NAMES = {**_LLAMA_NORMS, **_PROJECTIONS}


def _shared_config(cfg: ModelConfig) -> dict:
    return {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads or cfg.n_heads, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
    }


def hf_llama_config_dict(cfg: ModelConfig) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **_shared_config(cfg),
            "hidden_act": "silu", "mlp_bias": False, "torch_dtype": "float32"}


def hf_gemma2_config_dict(cfg: ModelConfig) -> dict:
    """Gemma-2 with everything that is not Sandwich-LN switched off: SiLU, 1/sqrt(head_dim) attention, no logit
    soft-capping, full attention in every layer (the window is unused but Gemma-2 requires one)."""
    return {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", **_shared_config(cfg),
            "hidden_activation": "silu", "query_pre_attn_scalar": cfg.head_dim, "sliding_window": cfg.max_seq_len,
            "layer_types": ["full_attention"] * cfg.n_layers, "final_logit_softcapping": None,
            "attn_logit_softcapping": None}


def _state_dict(model: Transformer, norms: dict[str, str], norm_weight, embed_scale: float = 1.0):
    out = {"model.embed_tokens.weight": model.embed_tokens.weight * embed_scale,
           "model.norm.weight": norm_weight(model.norm)}
    if not model.cfg.tie_embeddings:
        out["lm_head.weight"] = model.lm_head.weight
    for i, layer in enumerate(model.layers):
        for ours, theirs in norms.items():
            out[f"model.layers.{i}.{theirs}.weight"] = norm_weight(layer.get_submodule(ours))
        for ours, theirs in _PROJECTIONS.items():
            out[f"model.layers.{i}.{theirs}.weight"] = layer.get_submodule(ours).weight
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def _plain_llama(scheme: str) -> bool:
    """The scheme's weights are Llama's as they are (norm scales fold into the norm weights); branch gains
    (layerscale, skipinit) are folded into the projections by the exporter first."""
    cls = scheme_class(scheme)
    return cls.hf_export == "llama" and not cls.branch_gains


@torch.no_grad()
def to_hf_llama_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """HF Llama weights for a `pre` or `lns` model, norm scales folded into the norm weights."""
    cfg = model.cfg
    if not _plain_llama(cfg.norm_scheme) or cfg.gpas:
        direct = [name for name in SCHEMES if _plain_llama(name)]
        raise UserError(f"scheme {cfg.norm_scheme!r}{' + gpas' if cfg.gpas else ''} cannot be expressed as a stock "
                        f"Llama checkpoint (only {', '.join(direct)} without gpas)")
    return _state_dict(model, _LLAMA_NORMS, lambda norm: norm.weight * getattr(norm, "scale", 1.0))


@torch.no_grad()
def to_hf_gemma2_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """HF Gemma-2 weights for a `sandwich` model (untied embeddings: Gemma scales the input embedding by
    sqrt(dim) but not the LM head, so a tied matrix cannot carry the fold)."""
    cfg = model.cfg
    if scheme_class(cfg.norm_scheme).hf_export != "gemma2" or cfg.gpas or cfg.tie_embeddings:
        gemma = [name for name, cls in SCHEMES.items() if cls.hf_export == "gemma2"]
        raise UserError(f"only {', '.join(gemma)} without gpas and with untied embeddings maps onto stock Gemma-2")
    return _state_dict(model, _GEMMA2_NORMS, lambda norm: norm.weight - 1.0, embed_scale=1 / math.sqrt(cfg.dim))


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
