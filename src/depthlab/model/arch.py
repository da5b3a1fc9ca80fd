"""Architecture families (`model.arch`): what a family changes in the LLaMA block, declared once per family.

    llama   RMSNorm with a weight; no biases                                 -> LlamaForCausalLM (Mistral imports)
    qwen2   + biases on the q, k, v projections                              -> Qwen2ForCausalLM
    olmo    OLMo-1's LayerNorm with no weight and no bias (eps 1e-5, fixed   -> OlmoForCausalLM
            by transformers); optional clamp of q, k, v (model.clip_qkv)
    olmo2   RMSNorm on q and on k (QK-norm, over all heads, before RoPE);    -> Olmo2ForCausalLM
            the block's two norms sit on the branch outputs: h + Norm(F(h))
    vit     the Vision Transformer's block (depthlab.model.vit): LayerNorm   -> ViTForImageClassification
            with weight and bias, biases on every projection, a GELU MLP,
            bidirectional attention, no RoPE (positions are added to the patch embeddings)

Everything else (SwiGLU, rotate-half RoPE with model.rope_theta, GQA, tied or untied embeddings) is shared by the
language families. The
flags are read where they act: Attention (qkv_bias, qk_norm, clip_qkv), the norm factory PreLNBlock.make_norm
(norm), PreLNBlock.forward (norms_after_branch). Which schemes combine with which family:
depthlab.model.schemes.family_refusal (docs/method.md section 2.4).
"""

from __future__ import annotations

from dataclasses import dataclass

from depthlab import UserError
from depthlab.config import ModelConfig


@dataclass(frozen=True)
class Arch:
    name: str
    hf_class: str  # the stock Hugging Face class that `pre` / `lns` export to
    hf_model_types: tuple[str, ...]  # HF `model_type`s that import as this family
    qkv_bias: bool = False  # biases on q, k, v (not on o)
    norm: str = "rms"  # rms: RMSNorm with a weight; layernorm: LayerNorm with neither weight nor bias
    fixed_norm_eps: float | None = None  # the stock class hard-codes the norm's epsilon
    qk_norm: bool = False  # RMSNorm on the q and k projections' outputs
    norms_after_branch: bool = False  # h + Norm(F(h)) instead of h + F(Norm(h))
    clip_qkv: bool = False  # the stock class can clamp q, k, v to [-c, c]
    out_bias: bool = False  # biases on o_proj and on the MLP's projections too
    mlp: str = "swiglu"  # swiglu: down(silu(gate(x)) * up(x)); gelu: down(gelu(up(x)))
    causal: bool = True  # causal attention with RoPE (language), or bidirectional without (vision)


ARCHS = {a.name: a for a in (
    Arch("llama", "LlamaForCausalLM", ("llama", "mistral")),
    Arch("qwen2", "Qwen2ForCausalLM", ("qwen2",), qkv_bias=True),
    Arch("olmo", "OlmoForCausalLM", ("olmo",), norm="layernorm", fixed_norm_eps=1e-5, clip_qkv=True),
    Arch("olmo2", "Olmo2ForCausalLM", ("olmo2",), qk_norm=True, norms_after_branch=True),
    Arch("vit", "ViTForImageClassification", ("vit",), qkv_bias=True, norm="layernorm_affine", out_bias=True,
         mlp="gelu", causal=False),
)}


def arch_of(cfg: ModelConfig) -> Arch:
    """The family of a model config."""
    if cfg.arch not in ARCHS:
        raise UserError(f"unknown model.arch {cfg.arch!r}; valid: {', '.join(ARCHS)}")
    return ARCHS[cfg.arch]
