"""The gemma2 family (Gemma-2): Sandwich-LN, GeGLU, the embedding times sqrt(dim), soft-capped attention scores and
logits, a sliding window in every other layer, heads of their own width.

transformers' Gemma2ForCausalLM (models/gemma2/modeling_gemma2.py), part by part, and where each sits here:

    a norm before and after each branch (input_layernorm -> attn ->          norms_around_branch: scheme sandwich
    post_attention_layernorm; pre_ / post_feedforward_layernorm around the   (hf_scheme), the block's norms in
    MLP)                                                                      PreLNBlock's sandwiched wiring
    Gemma2RMSNorm: x / rms(x) * (1 + w), in fp32                              our RMSNorm with weight g = 1 + w
                                                                              (to_hf_weights: w = g - 1)
    embed_tokens(ids) * sqrt(hidden_size), the scale in the weights' dtype    embed_scale()
    down(gelu_pytorch_tanh(gate(x)) * up(x))                                  activation = "gelu_tanh" (GeGLU)
    scores q k^T * query_pre_attn_scalar^(-1/2), then                         attention(): model.query_pre_attn_scalar,
    attn_logit_softcapping * tanh(scores / attn_logit_softcapping)            model.attn_softcap
    layer_types: sliding_attention in layers 0, 2, 4, ... (0-based)           attention(): model.sliding_window in
                                                                              the odd layers (1-based)
    head_dim, not hidden_size / heads                                         model.head_size
    final_logit_softcapping * tanh(logits / final_logit_softcapping)          logit_softcap(): model.logit_softcap

LNS on Gemma-2 scales the norms after the branches (block l adds l^(-p) Norm(F(Norm(h)))): the norm after a branch
sets what the branch adds, and a scale on the norm before it would be undone by it. The schemes that wire their
own block are refused (depthlab.model.schemes.family_refusal). Stock Gemma-2 is also the export of the llama
family's `sandwich`: to_hf_weights and hf_config read the model's own family, so a llama model exports with SiLU,
no soft-capping, full attention and its embedding divided by sqrt(dim).
"""

from __future__ import annotations

import math

from depthlab import UserError
from depthlab.config import ModelConfig
from depthlab.model.families.base import Family, family_of, register, require
from depthlab.model.parts import Attention

SLIDING, FULL = "sliding_attention", "full_attention"


def slides(layer_id: int) -> bool:
    """Gemma-2's alternation: block layer_id (1-based) attends in the window when odd (transformers' layer i, from
    0, when (i + 1) % 2)."""
    return layer_id % 2 == 1


@register("gemma2")
class Gemma2(Family):
    """Gemma-2: Sandwich-LN, (1 + w) RMSNorm, GeGLU, sqrt(dim) embedding scale, soft-capped attention and logits,
    sliding-window attention in every other layer."""

    hf_class = "Gemma2ForCausalLM"
    hf_names = {"gemma2": "Gemma-2"}
    norms_around_branch = True
    hf_scheme = "sandwich"
    activation = "gelu_tanh"
    hf_activation_field = "hidden_activation"
    hf_norm_names = {"attn_norm": "input_layernorm", "attn_out_norm": "post_attention_layernorm",
                     "mlp_norm": "pre_feedforward_layernorm", "mlp_out_norm": "post_feedforward_layernorm"}
    options = {"sliding_window": "Gemma-2's attention window, in every other layer",
               "attn_softcap": "Gemma-2's attention soft-cap", "logit_softcap": "Gemma-2's final logit soft-cap",
               "query_pre_attn_scalar": "Gemma-2's attention scale"}

    # ------------------------------------------------------------ parts
    def attention(self, cfg: ModelConfig, layer_id: int, **variant) -> Attention:
        return super().attention(cfg, layer_id, window=cfg.sliding_window if slides(layer_id) else None,
                                 softcap=cfg.attn_softcap, query_scale=cfg.query_pre_attn_scalar, **variant)

    def embed_scale(self, cfg: ModelConfig) -> float:
        return cfg.dim ** 0.5

    def logit_softcap(self, cfg: ModelConfig) -> float | None:
        return cfg.logit_softcap

    def check(self, m: ModelConfig) -> None:
        for name in self.options:
            v = getattr(m, name)
            require(v is None or (math.isfinite(v) and v > 0), f"model.{name} must be positive or null, got {v}")

    def attended_keys(self, cfg: ModelConfig, seq_len: int) -> float:
        """The mean over layers: the window in the sliding ones, the whole context in the others."""
        window = min(seq_len, cfg.sliding_window or seq_len)
        sliding = sum(slides(l) for l in range(1, cfg.n_layers + 1))
        return (sliding * window + (cfg.n_layers - sliding) * seq_len) / cfg.n_layers

    # ------------------------------------------------------------ Hugging Face
    def hf_config(self, cfg: ModelConfig) -> dict:
        source = family_of(cfg)  # the llama family's sandwich has Gemma-2's block with Gemma-2's extras off
        if source is not self and source.name != "llama":
            raise UserError(f"only sandwich of model.family=llama or {self.name}, without gpas, maps onto stock "
                            f"Gemma-2, not model.family={source.name}")
        fields = {**super().hf_config(cfg), "query_pre_attn_scalar": cfg.query_pre_attn_scalar or cfg.head_dim,
                  "attn_logit_softcapping": cfg.attn_softcap, "final_logit_softcapping": cfg.logit_softcap,
                  "sliding_window": cfg.sliding_window or cfg.max_seq_len,  # unused without one, but required
                  "layer_types": [SLIDING if cfg.sliding_window and slides(l) else FULL
                                  for l in range(1, cfg.n_layers + 1)]}
        del fields["mlp_bias"]  # Gemma-2 has none, and no such field
        return fields

    def to_hf_weights(self, state, cfg):
        """Gemma's norms store w for their 1 + w. A llama model's embedding (the sandwich export) is divided by
        Gemma's sqrt(dim) here, which a tied LM head could not follow."""
        source = family_of(cfg)
        fold = source.embed_scale(cfg) / self.embed_scale(cfg)
        if fold != 1.0 and cfg.tie_embeddings:
            raise UserError(f"cannot export scheme {cfg.norm_scheme!r} of model.family={source.name} with tied "
                            "embeddings: its stock form, Gemma-2, scales the input embedding by sqrt(dim) but not "
                            "the LM head, so one shared matrix cannot carry both")
        hf = super().to_hf_weights(state, cfg)
        for key in hf:
            if key.endswith("norm.weight"):  # the four block norms and the final one
                hf[key] = hf[key] - 1.0
        if fold != 1.0:
            hf["model.embed_tokens.weight"] = hf["model.embed_tokens.weight"] * fold
        return hf

    def from_hf_weights(self, hf_state, cfg):
        return super().from_hf_weights({k: v + 1.0 if k.endswith("norm.weight") else v for k, v in hf_state.items()},
                                       cfg)

    def hf_refusals(self, hf_cfg, seq_len: int) -> list[str]:
        types = list(getattr(hf_cfg, "layer_types", None) or [])
        alternating = [SLIDING if slides(l) else FULL for l in range(1, hf_cfg.num_hidden_layers + 1)]
        problems = super().hf_refusals(hf_cfg, seq_len)
        if types not in (alternating, [FULL] * hf_cfg.num_hidden_layers):
            problems.append("layer types other than Gemma-2's alternation (sliding window in layers 0, 2, 4, ...)")
        if getattr(hf_cfg, "use_bidirectional_attention", False):
            problems.append("bidirectional attention")
        return problems

    def from_hf(self, hf_cfg, seq_len: int) -> dict:
        slid = SLIDING in (hf_cfg.layer_types or [])
        return {**super().from_hf(hf_cfg, seq_len), "sliding_window": hf_cfg.sliding_window if slid else None,
                "attn_softcap": hf_cfg.attn_logit_softcapping, "logit_softcap": hf_cfg.final_logit_softcapping,
                "query_pre_attn_scalar": hf_cfg.query_pre_attn_scalar}
