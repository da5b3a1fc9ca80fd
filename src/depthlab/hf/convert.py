"""Weight mapping between depthlab's Transformer and stock Hugging Face models (both directions).

Which schemes map onto which stock class is declared on each scheme (`hf_export`, depthlab.model.schemes), and
which class a family exports to, with its own config fields and norm names, on the family
(depthlab.model.families): `pre` and `lns` map onto the family's own class (LlamaForCausalLM, Qwen2ForCausalLM,
OlmoForCausalLM, Olmo2ForCausalLM, ...). For `lns` the constant norm scale
folds into the norm weight, Norm_g(x) / sqrt(l) == Norm_{g / sqrt(l)}(x); OLMo-1's norm has no weight, so there it
folds into the linear layers that read the norm's output, W (x / sqrt(l)) + b == (W / sqrt(l)) x + b (q, k, v
after the attention norm, gate and up after the MLP norm). Either way the exported model is exact and costs
nothing extra. `sandwich` maps onto stock Gemma-2 (llama family only), whose block is exactly Sandwich-LN (a norm
before and after each branch); Gemma's RMSNorm multiplies by (1 + w) and its embedding by sqrt(dim), both folded
here.
"""

from __future__ import annotations

import math

import torch

from depthlab import UserError
from depthlab.config import ModelConfig
from depthlab.model import Transformer
from depthlab.model.families import family_of
from depthlab.model.families.base import HF_PROJECTIONS, hf_shape, rename_to_hf
from depthlab.model.schemes import SCHEMES, scheme_class

_GEMMA2_NORMS = {"attn_norm": "input_layernorm", "attn_out_norm": "post_attention_layernorm",
                 "mlp_norm": "pre_feedforward_layernorm", "mlp_out_norm": "post_feedforward_layernorm"}
_BLOCK_NORMS = ("attn_norm", "mlp_norm", "attn_out_norm", "mlp_out_norm")  # the last two: sandwiched blocks'
_READERS = {"attn_norm": ("attn.q_proj", "attn.k_proj", "attn.v_proj"), "mlp_norm": ("mlp.gate_proj", "mlp.up_proj")}


def hf_config_dict(cfg: ModelConfig) -> dict:
    """Config fields of the family's stock class (the `pre` / `lns` export): the shared ones and the family's own."""
    return family_of(cfg).hf_config(cfg)


def hf_gemma2_config_dict(cfg: ModelConfig) -> dict:
    """Gemma-2 with everything that is not Sandwich-LN switched off: SiLU, 1/sqrt(head_dim) attention, no logit
    soft-capping, full attention in every layer (the window is unused but Gemma-2 requires one)."""
    return {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", **hf_shape(cfg),
            "hidden_activation": "silu", "query_pre_attn_scalar": cfg.head_dim, "sliding_window": cfg.max_seq_len,
            "layer_types": ["full_attention"] * cfg.n_layers, "final_logit_softcapping": None,
            "attn_logit_softcapping": None}


def _our_state(model: Transformer) -> dict[str, torch.Tensor]:
    """A detached copy of the model's weights (a tied LM head once, as the embedding; ProRes's ramps are folded
    into the projections with the branch scale, _fold_branch_scale, not kept)."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.endswith("_add.ramp")}
    if model.cfg.tie_embeddings:
        del state["lm_head.weight"]
    return state


def _plain(scheme: str) -> bool:
    """The scheme's weights are its family's stock weights as they are (norm scales fold); branch gains
    (layerscale, skipinit) are folded into the projections by the exporter first."""
    cls = scheme_class(scheme)
    return cls.hf_export == "family" and not cls.branch_gains


@torch.no_grad()
def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The family's stock weights for a `pre` or `lns` model, each block norm's scale folded into the norm's
    weight or, for a norm without one (OLMo-1), into the layers reading its output (module docstring)."""
    cfg = model.cfg
    if not _plain(cfg.norm_scheme) or cfg.gpas:
        direct = [name for name in SCHEMES if _plain(name)]
        raise UserError(f"scheme {cfg.norm_scheme!r}{' + gpas' if cfg.gpas else ''} cannot be expressed as a stock "
                        f"{family_of(cfg).hf_class} checkpoint (only {', '.join(direct)} without gpas)")
    state = _our_state(model)
    for i, layer in enumerate(model.layers):
        for name in _BLOCK_NORMS[:4 if layer.sandwiched else 2]:
            norm = layer.get_submodule(name)
            # a weightless norm is OLMo-1's, which sits before its branch: its output feeds exactly the readers
            for target in [name] if getattr(norm, "weight", None) is not None else _READERS[name]:
                state[f"layers.{i}.{target}.weight"] *= norm.scale
        _fold_branch_scale(state, i, layer)
    return family_of(cfg).to_hf_weights(state, cfg)


def _fold_branch_scale(state: dict, i: int, layer) -> None:
    """A multiplier on the branch outputs, s F(.) (LNS's branch placement, the depth parameterizations' m^(-alpha)
    and static scales, ProRes's ramp where it stands): into the output projections, s (W y + b) = (s W) y + s b;
    where a norm ends the branch (olmo2's; the one after it in a sandwiched block), into its weight:
    s Norm_g(y) = Norm_{s g}(y)."""
    s = getattr(layer, "out_scale", 1.0)
    if s == 1.0:
        return
    targets = (_BLOCK_NORMS[2:] if layer.sandwiched else _BLOCK_NORMS[:2] if layer.output_norms
               else ("attn.o_proj", "mlp.down_proj"))
    for t in targets:
        for kind in ("weight", "bias"):
            if f"layers.{i}.{t}.{kind}" in state:
                state[f"layers.{i}.{t}.{kind}"] = state[f"layers.{i}.{t}.{kind}"] * s


@torch.no_grad()
def to_hf_gemma2_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """HF Gemma-2 weights for a `sandwich` model of the llama family (untied embeddings: Gemma scales the input
    embedding by sqrt(dim) but not the LM head, so a tied matrix cannot carry the fold)."""
    cfg = model.cfg
    if scheme_class(cfg.norm_scheme).hf_export != "gemma2" or cfg.gpas or cfg.tie_embeddings or cfg.arch != "llama":
        gemma = [name for name, cls in SCHEMES.items() if cls.hf_export == "gemma2"]
        raise UserError(f"only {', '.join(gemma)} of model.arch=llama, without gpas and with untied embeddings, maps "
                        "onto stock Gemma-2")
    state = _our_state(model)
    for i, layer in enumerate(model.layers):  # a branch multiplier s: s Norm_g(y) = Norm_{s g}(y)
        for norm in ("attn_out_norm", "mlp_out_norm"):
            state[f"layers.{i}.{norm}.weight"] = state[f"layers.{i}.{norm}.weight"] * layer.out_scale
    for key in state:
        if key.rsplit(".", 1)[0].endswith("norm"):  # the four block norms and the final one
            state[key] = state[key] - 1.0
    state["embed_tokens.weight"] = state["embed_tokens.weight"] * (1 / math.sqrt(cfg.dim))
    return rename_to_hf(state, {**_GEMMA2_NORMS, **HF_PROJECTIONS})


def from_hf_state_dict(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """depthlab weights from the family's stock HF weights (the family's from_hf_weights: its norm names, OLMo-2
    names its norms after the branches they follow, and any transform of its own)."""
    return family_of(cfg).from_hf_weights(hf_state, cfg)
