"""A depthlab ViT (model.family=vit) as a stock transformers ViTForImageClassification, and back.

The two models compute the same function (depthlab.model.vit follows the original ViT's layout), so export is a
renaming plus exact folds of what is a constant or a gain in depthlab and a weight in the stock class:

    patch_embed  Linear (dim, C p p), each patch flattened as (C, p, p)  = the stride-p Conv2d kernel (dim, C, p, p)
    lns, norm    s (w x^ + b) = (s w) x^ + (s b)       both block norms' weight AND bias times l^(-p)
    lns, branch  s (W y + b)  = (s W) y + (s b)        attention.output.dense and output.dense times l^(-p)
    layerscale   diag(g) (W y + b) = (diag(g) W) y + g b    the same two projections, per output channel
    skipinit     the scalar gain folds the same way
    GQA          each key / value head repeated for the query heads it serves (the stock class has none)
    sincos       the fixed position table written as the stock class's (learned) position embeddings

Names (depthlab -> HF checkpoint names, the hub format that every transformers version reads; transformers 5
renames them to its in-memory names on load): q/k/v_proj -> attention.attention.query/key/value, o_proj ->
attention.output.dense, attn_norm / mlp_norm -> layernorm_before / layernorm_after, up_proj / down_proj ->
intermediate.dense / output.dense, norm -> vit.layernorm, head -> classifier.

Refused, one line each: the schemes with no stock form (their registry reason: ViTForImageClassification's block
is wired as Llama's, a norm before each branch and a plain residual add), sandwich (its stock form is Gemma-2, a
language model), GPAS, and model.pool=mean (the stock head reads the class token).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from depthlab import UserError
from depthlab.config import ModelConfig
from depthlab.model.schemes import GPAS_EXPORT_REFUSAL, scheme_class
from depthlab.model.vit import ViT

HF_CLASS = "ViTForImageClassification"
_LAYER = {  # depthlab name inside layers.i -> HF checkpoint name inside vit.encoder.layer.i
    "attn.q_proj": "attention.attention.query", "attn.k_proj": "attention.attention.key",
    "attn.v_proj": "attention.attention.value", "attn.o_proj": "attention.output.dense",
    "attn_norm": "layernorm_before", "mlp_norm": "layernorm_after",
    "mlp.up_proj": "intermediate.dense", "mlp.down_proj": "output.dense",
}
_BRANCH_OUTPUTS = {"attn.o_proj": "attn", "mlp.down_proj": "mlp"}
_IN_MEMORY = {  # transformers 5's in-memory names of the same modules (a loaded model's state_dict), for import
    "attention.q_proj": "attn.q_proj", "attention.k_proj": "attn.k_proj", "attention.v_proj": "attn.v_proj",
    "attention.o_proj": "attn.o_proj", "mlp.fc1": "mlp.up_proj", "mlp.fc2": "mlp.down_proj",
}
_TOP = {"vit.embeddings.cls_token": "cls_token", "vit.embeddings.position_embeddings": "pos_embed",
        "vit.embeddings.patch_embeddings.projection.bias": "patch_embed.bias", "vit.layernorm.weight": "norm.weight",
        "vit.layernorm.bias": "norm.bias", "classifier.weight": "head.weight", "classifier.bias": "head.bias"}
_KERNEL = "vit.embeddings.patch_embeddings.projection.weight"


def vit_export_refusal(cfg: ModelConfig) -> str:
    """The one-line reason a ViT with config `cfg` has no stock ViTForImageClassification form, or "" when it has
    one."""
    block, stock = scheme_class(cfg.norm_scheme), f"as a stock {HF_CLASS}"
    if cfg.gpas:
        return f"cannot export {cfg.norm_scheme} + gpas {stock}: {GPAS_EXPORT_REFUSAL}"
    if block.hf_export != "family":
        why = block.hf_export_refusal or ("its norm after each branch has no place in the stock ViT block (its stock "
                                          "form, Gemma-2, is a language model)")
        return (f"cannot export scheme {cfg.norm_scheme!r} {stock}, whose block is wired as Llama's (a LayerNorm "
                f"before each branch, a plain residual add): {why}")
    if cfg.pool != "cls":
        return (f"cannot export model.pool={cfg.pool} {stock}: it classifies the class token's final state and has "
                "no mean pooling (train with model.pool=cls to export)")
    return ""


def _branch_multiplier(layer: torch.nn.Module, branch: str) -> torch.Tensor:
    """The constant (LNS branch placement) times the gain (layerscale, skipinit) on a branch's output."""
    constant = torch.tensor(float(getattr(layer, "branch_multiplier_now", 1.0)))
    gain = getattr(layer, f"{branch}_gain", None)
    return constant if gain is None else gain.detach().float() * constant


def _all_heads(t: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """A key / value projection's rows for grouped-query attention repeated so that every query head has its own
    (as scaled_dot_product_attention's enable_gqa pairs them: query head h reads key / value head h // group)."""
    kv = cfg.n_kv_heads or cfg.n_heads
    if kv == cfg.n_heads:
        return t
    heads = t.reshape(kv, cfg.head_dim, *t.shape[1:]).repeat_interleave(cfg.n_heads // kv, dim=0)
    return heads.reshape(cfg.n_heads * cfg.head_dim, *t.shape[1:])


def _layer_state(layer: torch.nn.Module, prefix: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    out = {}
    for ours, theirs in _LAYER.items():
        module = layer.get_submodule(ours)
        w, b = module.weight.detach().clone(), module.bias.detach().clone()
        if ours.endswith("norm"):  # LNS, norm placement: s (w x^ + b) = (s w) x^ + s b
            w, b = w * module.scale, b * module.scale
        elif ours in _BRANCH_OUTPUTS:  # LNS branch placement, layerscale, skipinit: rows and bias of the output
            f = _branch_multiplier(layer, _BRANCH_OUTPUTS[ours])
            w, b = w * f.reshape(-1, 1), b * f.reshape(-1)
        elif ours in ("attn.k_proj", "attn.v_proj"):
            w, b = _all_heads(w, cfg), _all_heads(b, cfg)
        out[f"{prefix}{theirs}.weight"], out[f"{prefix}{theirs}.bias"] = w, b
    return out


@torch.no_grad()
def to_hf_vit_state_dict(model: ViT) -> dict[str, torch.Tensor]:
    """Stock ViTForImageClassification weights (checkpoint names) equal in function to `model`; UserError with the
    reason where there are none."""
    cfg = model.cfg
    if why := vit_export_refusal(cfg):
        raise UserError(why)
    p = cfg.patch_size
    state = {theirs: model.get_parameter(ours) if ours != "pos_embed" else model.pos_embed
             for theirs, ours in _TOP.items()}  # pos_embed: a parameter, or sincos's fixed buffer
    state[_KERNEL] = model.patch_embed.weight.reshape(cfg.dim, cfg.channels, p, p)
    for i, layer in enumerate(model.layers):
        state.update(_layer_state(layer, f"vit.encoder.layer.{i}.", cfg))
    return {k: v.detach().float().clone().contiguous() for k, v in state.items()}


def hf_vit_config_dict(cfg: ModelConfig, classes: list[str] | None = None) -> dict:
    """ViTConfig fields for the export: the shape, exact GELU, LayerNorm epsilon, biases on q/k/v, no dropout;
    label names from the run's classes (checkpoint meta), LABEL_i for the rest."""
    names = [str(c) for c in (classes or [])][:cfg.num_classes]
    names += [f"LABEL_{i}" for i in range(len(names), cfg.num_classes)]
    return {"architectures": [HF_CLASS], "model_type": "vit", "hidden_size": cfg.dim,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.ffn_dim,
            "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            "layer_norm_eps": cfg.norm_eps, "image_size": cfg.image_size, "patch_size": cfg.patch_size,
            "num_channels": cfg.channels, "qkv_bias": True, "encoder_stride": cfg.patch_size,
            "initializer_range": cfg.weight_std, "problem_type": "single_label_classification",
            "id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}


def image_processor_dict(cfg: ModelConfig, data: dict) -> dict | None:
    """A ViTImageProcessor config doing what the run's data pipeline did to 8-bit images: resize to image_size,
    pixels / 255, minus the training split's per-channel mean, over its std (None when the checkpoint's record
    of its data, CheckpointMeta.data, has no pixel statistics)."""
    mean, std = data.get("pixel_mean"), data.get("pixel_std")
    if not mean or not std or len(mean) != cfg.channels or len(std) != cfg.channels:
        return None
    return {"image_processor_type": "ViTImageProcessor", "do_resize": True,
            "size": {"height": cfg.image_size, "width": cfg.image_size}, "resample": 2,  # PIL bilinear
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [float(m) for m in mean], "image_std": [float(s) for s in std]}


def export_vit(loaded, out_dir: str | Path, overwrite: bool = False) -> Path:
    """depthlab.hf.exporter.export for a ViT checkpoint (`loaded`: depthlab.loading.load_model's): config.json,
    model.safetensors, preprocessor_config.json (when the run recorded its pixel statistics), the provenance
    file and the model card, written whole."""
    from depthlab.card import write_card
    from depthlab.ownership import is_depthlab_hf, writing

    state = to_hf_vit_state_dict(loaded.model)
    fields = hf_vit_config_dict(loaded.cfg.model, loaded.meta.data.get("classes"))
    with writing(out_dir, is_depthlab_hf, "export", overwrite) as tmp:
        _write_vit_dir(tmp, state, fields, loaded)
        write_card(tmp, out_dir, loaded)
    return Path(out_dir)


def _write_vit_dir(out: Path, state: dict, fields: dict, loaded) -> None:
    from transformers import AutoConfig

    from depthlab.checkpoint import WEIGHTS, save_weights
    from depthlab.paths import EXPORT_INFO

    architectures = fields.pop("architectures")
    hf_cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    hf_cfg.architectures, hf_cfg.dtype = architectures, "float32"
    hf_cfg.save_pretrained(out)
    save_weights(state, out / WEIGHTS, {"format": "pt"})  # the names save_pretrained writes
    processor = image_processor_dict(loaded.cfg.model, loaded.meta.data)
    if processor is not None:
        (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    m = loaded.cfg.model
    provenance = {"source": str(loaded.path), "scheme": m.norm_scheme, "step": loaded.meta.step,
                  "architecture": architectures[0],
                  "note": "scheme constants are folded into the weights: load as a plain HF model"}
    if m.norm_scheme == "lns":
        provenance["lns_placement"] = m.lns_placement
    (out / EXPORT_INFO).write_text(json.dumps(provenance, indent=2) + "\n")


def _our_name(key: str) -> str:
    """A stock ViT weight name (checkpoint or transformers 5 in-memory) -> depthlab's; unknown names unchanged."""
    if key in _TOP:
        return _TOP[key]
    for layers in ("vit.encoder.layer.", "vit.layers."):
        if key.startswith(layers):
            i, rest = key[len(layers):].split(".", 1)
            module, param = rest.rsplit(".", 1)
            names = {theirs: ours for ours, theirs in _LAYER.items()} | _IN_MEMORY
            return f"layers.{i}.{names.get(module, module)}.{param}"
    return key


def import_hf_vit(src, scheme: str = "pre") -> tuple[ViT, ModelConfig]:
    """A depthlab ViT from a stock ViTForImageClassification (a loaded model or its directory): with scheme pre
    its logits equal the stock model's; another scheme (lns) takes the same weights from here on."""
    import pickle

    from transformers import ViTForImageClassification

    from depthlab.pickled import refusal

    try:
        hf = src if isinstance(src, torch.nn.Module) else ViTForImageClassification.from_pretrained(src)
    except pickle.UnpicklingError as e:  # a pytorch_model.bin that holds more than tensors
        raise refusal(src, e) from None
    c = hf.config
    square = all(isinstance(getattr(c, k), int) for k in ("image_size", "patch_size"))
    if type(hf).__name__ != HF_CLASS or c.hidden_act != "gelu" or not square:
        raise UserError(f"cannot import {type(hf).__name__} (activation {c.hidden_act}, image {c.image_size}, patch "
                        f"{c.patch_size}): only a {HF_CLASS} with exact GELU and square images and patches maps onto "
                        "depthlab's ViT")
    cfg = ModelConfig(family="vit", dim=c.hidden_size, n_layers=c.num_hidden_layers, n_heads=c.num_attention_heads,
                      ffn_dim=c.intermediate_size, norm_eps=c.layer_norm_eps, image_size=c.image_size,
                      patch_size=c.patch_size, channels=c.num_channels, num_classes=c.num_labels, pool="cls",
                      pos_embed="learned", norm_scheme=scheme)
    model = ViT(cfg, init=False)
    state = {_our_name(k): v.detach().float().clone() for k, v in hf.state_dict().items()}
    state["patch_embed.weight"] = state.pop(_KERNEL).reshape(cfg.dim, -1)
    for name, p in model.state_dict().items():  # qkv_bias=False: the stock model's q/k/v biases are zero
        if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")) and not c.qkv_bias:
            state[name] = torch.zeros_like(p)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise UserError(f"cannot import this {HF_CLASS} as scheme {scheme!r}: missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}")
    return model.eval(), cfg
