"""Weight mapping between depthlab's Transformer and stock Hugging Face models (both directions).

Which schemes map onto which stock class is declared on each scheme (`hf_export`, depthlab.model.schemes), and
which class a family exports to, with its own config fields and norm names, on the family
(depthlab.model.families): `pre` and `lns` map onto the family's own class (LlamaForCausalLM, Qwen2ForCausalLM,
OlmoForCausalLM, Olmo2ForCausalLM, ...). For `lns` the constant norm scale
folds into the norm weight, Norm_g(x) / sqrt(l) == Norm_{g / sqrt(l)}(x); OLMo-1's norm has no weight, so there it
folds into the linear layers that read the norm's output, W (x / sqrt(l)) + b == (W / sqrt(l)) x + b (q, k, v
after the attention norm, gate and up after the MLP norm). Either way the exported model is exact and costs
nothing extra. `sandwich` maps onto stock Gemma-2, the gemma2 family's class (its own block, and the llama
family's sandwich), whose block is exactly Sandwich-LN (a norm before and after each branch); what else Gemma's
weights store differently (its RMSNorm's 1 + w, its embedding times sqrt(dim)) the gemma2 family converts
(to_hf_weights), as every family converts its own.
"""

from __future__ import annotations

import torch

from depthlab import UserError
from depthlab.config import ModelConfig
from depthlab.model import Transformer
from depthlab.model.families import FAMILIES, Family, family_of
from depthlab.model.schemes import SCHEMES, scheme_class

_BLOCK_NORMS = ("attn_norm", "mlp_norm", "attn_out_norm", "mlp_out_norm")  # the last two: sandwiched blocks'
_READERS = {"attn_norm": ("attn.q_proj", "attn.k_proj", "attn.v_proj"), "mlp_norm": ("mlp.gate_proj", "mlp.up_proj")}


def stock_family(cfg: ModelConfig) -> Family:
    """The family whose stock class a model of config `cfg` exports to: its own, or the one its scheme names
    (sandwich: gemma2)."""
    target = scheme_class(cfg.norm_scheme).hf_export
    return family_of(cfg) if target in ("family", None) else FAMILIES[target]


def hf_config_dict(cfg: ModelConfig) -> dict:
    """Config fields of the stock class the model exports to (stock_family): the shared ones and the family's own."""
    return stock_family(cfg).hf_config(cfg)


def _our_state(model: Transformer) -> dict[str, torch.Tensor]:
    """A detached copy of the model's weights (a tied LM head once, as the embedding; ProRes's ramps are folded
    into the projections with the branch multiplier, _fold_branch_multiplier, not kept)."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.endswith("_add.ramp")}
    if model.cfg.tie_embeddings:
        del state["lm_head.weight"]
    return state


def _plain(scheme: str) -> bool:
    """The scheme's weights are a stock class's weights as they are (norm scales fold); branch gains (layerscale,
    skipinit) are folded into the projections by the exporter first."""
    cls = scheme_class(scheme)
    return cls.hf_export is not None and not cls.branch_gains


@torch.no_grad()
def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The stock weights (stock_family's) for a model of a scheme that maps onto a stock block, each block norm's
    scale folded into the norm's weight or, for a norm without one (OLMo-1), into the layers reading its output
    (module docstring), the branch multiplier into the layers ending the branch."""
    cfg = model.cfg
    if not _plain(cfg.norm_scheme) or cfg.gpas:
        direct = [name for name in SCHEMES if _plain(name)]
        raise UserError(f"scheme {cfg.norm_scheme!r}{' + gpas' if cfg.gpas else ''} cannot be expressed as a stock "
                        f"{stock_family(cfg).hf_class} checkpoint (only {', '.join(direct)} without gpas)")
    state = _our_state(model)
    for i, layer in enumerate(model.layers):
        for name in _BLOCK_NORMS[:4 if layer.sandwiched else 2]:
            norm = layer.get_submodule(name)
            # a weightless norm is OLMo-1's, which sits before its branch: its output feeds exactly the readers
            for target in [name] if getattr(norm, "weight", None) is not None else _READERS[name]:
                state[f"layers.{i}.{target}.weight"] *= norm.scale
        _fold_branch_multiplier(state, i, layer)
    return stock_family(cfg).to_hf_weights(state, cfg)


def _fold_branch_multiplier(state: dict, i: int, layer) -> None:
    """A multiplier on the branch outputs, s F(.) (LNS's branch placement, the depth parameterizations' m^(-alpha)
    and static scales, ProRes's ramp where it stands): into the output projections, s (W y + b) = (s W) y + s b;
    where a norm ends the branch (olmo2's; the one after it in a sandwiched block), into its weight:
    s Norm_g(y) = Norm_{s g}(y)."""
    s = getattr(layer, "branch_multiplier_now", 1.0)
    if s == 1.0:
        return
    targets = (_BLOCK_NORMS[2:] if layer.sandwiched else _BLOCK_NORMS[:2] if layer.output_norms
               else ("attn.o_proj", "mlp.down_proj"))
    for t in targets:
        for kind in ("weight", "bias"):
            if f"layers.{i}.{t}.{kind}" in state:
                state[f"layers.{i}.{t}.{kind}"] = state[f"layers.{i}.{t}.{kind}"] * s


def from_hf_state_dict(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """depthlab weights from the family's stock HF weights (the family's from_hf_weights: its norm names, OLMo-2
    names its norms after the branches they follow, and any transform of its own)."""
    return family_of(cfg).from_hf_weights(hf_state, cfg)
