"""The family spec: everything depthlab knows about a model family, declared once, on one class in one module.

Every family is a variant of the LLaMA block, so `Family` holds LLaMA's answers; a family's module subclasses it,
overrides what differs and registers it with @register("name") (the name is `model.family`). What a family declares,
and who asks:

    parts and flags       qkv_bias, out_bias, norm, fixed_norm_eps,     the block (depthlab.model.schemes)
                          qk_norm, norms_after_branch,
                          norms_around_branch, mlp, activation,
                          causal; attention(), feed_forward(),
                          make_norm()
    around the blocks     embed_scale(), logit_softcap()                the model (depthlab.model.transformer)
    its config fields     options: ModelConfig fields only it reads     validate
    validation            check(model config)                           validate
    presets               presets: name -> Config                       --preset (depthlab.model.families)
    FLOPs                 train_flops_per_token()                       the trainer's MFU (depthlab.train.flops)
    HF class and config   hf_class, hf_names (model types it imports    export (depthlab.hf.convert), import,
                          from, display names), hf_activation_field,    the --help texts
                          hf_config()
    HF weights            to_hf_weights(), from_hf_weights() (renames   depthlab.hf.convert
                          by hf_norm_names; a family's own transform)
    import rules          hf_refusals(), from_hf(HF config), hf_scheme  depthlab.hf.importer
    another stock form    hf_fallback() (export), claims() (import)     depthlab.hf.exporter, importer

The scheme (depthlab.model.schemes) decides where the norms and residual adds sit; the family decides what the
parts are. Which schemes combine with which family: depthlab.model.schemes.family_refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from depthlab import UserError
from depthlab.config import Config, DataConfig, ModelConfig, TrainConfig
from depthlab.model.parts import MLP, Attention, LayerNorm, RMSNorm

FAMILIES: dict[str, Family] = {}


def register(name: str):
    """Class decorator: make the Family subclass the family `name` (model.family=name)."""

    def deco(cls):
        if not cls.hf_class or not cls.hf_names:
            raise TypeError(f"family {name!r}: {cls.__name__} must declare hf_class and hf_names")
        cls.name = name
        FAMILIES[name] = cls()
        return cls

    return deco


def family_of(cfg: ModelConfig) -> Family:
    """The family of a model config."""
    if cfg.family not in FAMILIES:
        raise UserError(f"unknown model.family {cfg.family!r}; valid: {', '.join(FAMILIES)}")
    return FAMILIES[cfg.family]


def require(ok: bool, message: str) -> None:
    """A setting a user can get wrong: UserError with `message` unless ok."""
    if not ok:
        raise UserError(message)


class Family:
    """A model family; this base is the LLaMA block: RMSNorm with a weight, no biases, SwiGLU, causal attention
    with rotate-half RoPE and grouped-query heads, tied or untied embeddings."""

    name: ClassVar[str]  # set by @register
    hf_class: ClassVar[str] = ""  # the stock Hugging Face class its own block (hf_scheme) and lns export to
    hf_names: ClassVar[dict[str, str]] = {}  # HF model_type -> display name, for the models importing as this family
    # (the first is the export's model_type)
    qkv_bias: ClassVar[bool] = False  # biases on q, k, v (not on o)
    out_bias: ClassVar[bool] = False  # biases on o_proj and on the MLP's projections too
    norm: ClassVar[str] = "rms"  # rms: RMSNorm with a weight; layernorm: neither weight nor bias; layernorm_affine
    fixed_norm_eps: ClassVar[float | None] = None  # the stock class hard-codes the norm's epsilon
    qk_norm: ClassVar[bool] = False  # RMSNorm on the q and k projections' outputs
    norms_after_branch: ClassVar[bool] = False  # h + Norm(F(h)) instead of h + F(Norm(h))
    norms_around_branch: ClassVar[bool] = False  # h + Norm(F(Norm(h))): a norm before and after each branch
    hf_scheme: ClassVar[str] = "pre"  # the scheme whose block is the stock class's: import's default (same logits)
    mlp: ClassVar[str] = "gated"  # gated: down(act(gate(x)) * up(x)); plain: down(act(up(x)))
    activation: ClassVar[str] = "silu"  # act: silu (SwiGLU), gelu_tanh (GeGLU), gelu (exact); ACTIVATIONS
    causal: ClassVar[bool] = True  # causal attention with RoPE (language), or bidirectional without (vision)
    options: ClassVar[dict[str, str]] = {}  # ModelConfig fields only this family reads (null for any other): what
    # each is, for the refusal
    hf_norm_names: ClassVar[dict[str, str]] = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
    hf_activation_field: ClassVar[str] = "hidden_act"  # the stock config's field naming the activation
    presets: ClassVar[dict[str, Callable[[str], Config]]] = {}  # preset name -> its Config (called with the name)

    @property
    def hf_model_types(self) -> tuple[str, ...]:
        return tuple(self.hf_names)

    # ------------------------------------------------------------ parts
    def attention(self, cfg: ModelConfig, layer_id: int, **variant) -> nn.Module:
        """Block `layer_id`'s (1-based) attention; `variant`: a subclass's further Attention arguments (a window,
        a soft cap)."""
        return Attention(cfg, qkv_bias=self.qkv_bias, out_bias=self.out_bias, qk_norm=self.qk_norm, causal=self.causal,
                         **variant)

    def feed_forward(self, cfg: ModelConfig) -> nn.Module:
        return MLP(cfg, gated=self.mlp == "gated", activation=self.activation, bias=self.out_bias)

    def embed_scale(self, cfg: ModelConfig) -> float:
        """The token embedding's output times this (Gemma's sqrt(dim)), rounded to the embedding's dtype."""
        return 1.0

    def logit_softcap(self, cfg: ModelConfig) -> float | None:
        """The LM head's logits capped as c * tanh(z / c) (Gemma-2's final soft-capping); None: not capped."""
        return None

    def make_norm(self, cfg: ModelConfig, scale: float = 1.0) -> nn.Module:
        """The family's norm: RMSNorm, or a LayerNorm (OLMo-1's without weight, the ViT's affine one)."""
        if self.norm.startswith("layernorm"):
            return LayerNorm(cfg.dim, cfg.norm_eps, scale, affine=self.norm == "layernorm_affine")
        return RMSNorm(cfg.dim, cfg.norm_eps, scale)

    # ------------------------------------------------------------ validation
    def check(self, m: ModelConfig) -> None:
        """UserError on settings this family cannot run (the shared checks: depthlab.model.validate)."""

    # ------------------------------------------------------------ FLOPs
    def train_flops_per_token(self, cfg: ModelConfig, seq_len: int) -> float:
        """6 x (matmul parameters, LM head included, embedding lookup excluded) + 12 x L x T x d for attention
        scores and values (PaLM, appendix B), T the keys each query attends to (attended_keys)."""
        q, kv = cfg.n_heads * cfg.head_dim, (cfg.n_kv_heads or cfg.n_heads) * cfg.head_dim
        mlp_mats = 3 if self.mlp == "gated" else 2
        per_layer = 2 * cfg.dim * q + 2 * cfg.dim * kv + mlp_mats * cfg.dim * cfg.ffn_dim
        return (6 * (cfg.n_layers * per_layer + self.outer_matmul_params(cfg, seq_len))
                + 12 * cfg.n_layers * self.attended_keys(cfg, seq_len) * q)

    def outer_matmul_params(self, cfg: ModelConfig, seq_len: int) -> float:
        """Matmul parameters outside the blocks, per token: the LM head."""
        return cfg.dim * cfg.vocab_size

    def attended_keys(self, cfg: ModelConfig, seq_len: int) -> int:
        """Keys per query in the attention FLOPs: the whole window (PaLM's count, causality not discounted)."""
        return seq_len

    # ------------------------------------------------------------ Hugging Face
    def hf_config(self, cfg: ModelConfig) -> dict:
        """The stock class's config fields for a model of config `cfg` (a family adds its own to these)."""
        fields = {"architectures": [self.hf_class], "model_type": self.hf_model_types[0], **hf_shape(cfg),
                  self.hf_activation_field: HF_ACTIVATIONS[family_of(cfg).activation], "mlp_bias": False,
                  "torch_dtype": "float32"}
        if self.fixed_norm_eps is not None:
            if cfg.norm_eps != self.fixed_norm_eps:
                raise UserError(f"cannot export model.family={self.name} with model.norm_eps={cfg.norm_eps}: "
                                f"{self.hf_class} fixes its norm's epsilon at {self.fixed_norm_eps}")
            del fields["rms_norm_eps"]
        return fields

    def to_hf_weights(self, state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
        """The stock weights from depthlab's (`state`, the scheme's constants already folded in: depthlab.hf.convert):
        here renamed, each block's norms by hf_norm_names. A family whose stock weights differ in value too (Gemma's
        norms store w for 1 + w) converts them here."""
        return rename_to_hf(state, {**self.hf_norm_names, **HF_PROJECTIONS})

    def from_hf_weights(self, hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
        """depthlab weights from the stock ones: to_hf_weights undone. An HF name with no depthlab counterpart is
        kept as it is, so that loading reports it."""
        return rename_from_hf(hf_state, {**self.hf_norm_names, **HF_PROJECTIONS})

    def hf_refusals(self, hf_cfg, seq_len: int) -> list[str]:
        """What the HF model of config `hf_cfg` computes and this family does not, each a phrase of import's one-line
        refusal (seq_len: the context the import is for)."""
        act, ours = getattr(hf_cfg, self.hf_activation_field, None), HF_ACTIVATIONS[self.activation]
        rope = hf_rope(hf_cfg).get("rope_type", "default")
        window, types = getattr(hf_cfg, "sliding_window", None), getattr(hf_cfg, "layer_types", None)
        problems = []
        if act != ours:
            problems.append(f"activation {act} (ours is {ours})")
        if rope != "default":
            problems.append(f"RoPE scaling {rope!r} (ours is plain RoPE)")
        if getattr(hf_cfg, "mlp_bias", False):
            problems.append("MLP biases")
        if getattr(hf_cfg, "attention_bias", False) and not self.qkv_bias:
            problems.append("attention biases (ours: on q/k/v for qwen2 only)")
        sliding = window and (types is None or "sliding_attention" in types)
        if sliding and window < seq_len and "sliding_window" not in self.options:
            problems.append(f"sliding-window attention of {window} tokens (ours is full attention: import with "
                            f"max_seq_len <= {window})")
        return problems

    def from_hf(self, hf_cfg, seq_len: int) -> dict:
        """The ModelConfig fields of an HF config of this family (depthlab.hf.importer adds the context and the
        scheme); UserError, one line, on everything the HF model computes and this family does not (hf_refusals).
        A family with fields of its own adds them to these."""
        problems = self.hf_refusals(hf_cfg, seq_len)
        if problems:
            raise UserError(f"cannot import this {hf_cfg.model_type} model: {'; '.join(problems)}")
        head = getattr(hf_cfg, "head_dim", None)
        return dict(
            family=self.name, norm_scheme=self.hf_scheme, vocab_size=hf_cfg.vocab_size, dim=hf_cfg.hidden_size,
            n_layers=hf_cfg.num_hidden_layers, n_heads=hf_cfg.num_attention_heads,
            n_kv_heads=hf_cfg.num_key_value_heads, ffn_dim=hf_cfg.intermediate_size,
            head_size=head if head and head * hf_cfg.num_attention_heads != hf_cfg.hidden_size else None,
            rope_theta=float(hf_rope(hf_cfg).get("rope_theta", 10000.0)),
            norm_eps=self.fixed_norm_eps or hf_cfg.rms_norm_eps, tie_embeddings=bool(hf_cfg.tie_word_embeddings))

    def claims(self, hf_cfg, hf_state: dict[str, torch.Tensor]) -> bool:
        """An HF model of another family's model type is this family's: the form this family exports in where its
        own class will not do (hf_fallback), read back as this family by import."""
        return False

    def hf_fallback(self, hf_state: dict[str, torch.Tensor], fields: dict) -> tuple[dict, dict, str] | None:
        """Stock weights, config fields and a warning for the export of this family's model in another stock class
        that computes the same, for a run whose tokenizer transformers would load as another (some model types
        get a tokenizer class of their own, whatever the directory names; depthlab.hf.exporter checks); None:
        no other form."""
        return None


# depthlab name (inside layers.i) -> HF name (inside model.layers.i), besides the family's norm names
HF_PROJECTIONS = {
    "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
    "attn.v_proj": "self_attn.v_proj", "attn.o_proj": "self_attn.o_proj",
    "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
    "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj",
}
HF_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}  # ours -> transformers' name


def hf_shape(cfg: ModelConfig) -> dict:
    """The config fields every stock decoder class shares: the shape, RoPE, the norm's epsilon, the tying."""
    return {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads or cfg.n_heads, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
    }


def hf_rope(hf_cfg) -> dict:
    """An HF config's RoPE: rope_type and rope_theta (transformers 4.x kept them as separate fields)."""
    return getattr(hf_cfg, "rope_parameters", None) or {
        "rope_type": (getattr(hf_cfg, "rope_scaling", None) or {}).get("rope_type", "default"),
        "rope_theta": getattr(hf_cfg, "rope_theta", 10000.0)}


def rename_to_hf(state: dict[str, torch.Tensor], names: dict[str, str]) -> dict[str, torch.Tensor]:
    """depthlab names -> HF names: layers.i.<ours>.<param> -> model.layers.i.<names[ours]>.<param>; the embedding
    and the final norm under model.; lm_head as it is."""
    out = {}
    for key, v in state.items():
        if key.startswith("layers."):
            _, i, rest = key.split(".", 2)
            module, param = rest.rsplit(".", 1)
            key = f"model.layers.{i}.{names[module]}.{param}"
        elif not key.startswith("lm_head."):
            key = f"model.{key}"
        out[key] = v.contiguous()
    return out


def rename_from_hf(hf_state: dict[str, torch.Tensor], names: dict[str, str]) -> dict[str, torch.Tensor]:
    """rename_to_hf undone, on a detached copy; an HF name with no depthlab counterpart is kept as it is."""
    ours = {theirs: o for o, theirs in names.items()}
    out = {}
    for key, v in hf_state.items():
        if key.startswith("model.layers."):
            i, rest = key.split(".", 3)[2:]
            module, param = rest.rsplit(".", 1)
            key = f"layers.{i}.{ours[module]}.{param}" if module in ours else key
        elif key.startswith("model."):
            key = key[len("model."):]
        out[key] = v.detach().clone().contiguous()
    return out


def released_preset(name: str, family: str, tokens: float, **shape) -> Config:
    """A released model's shape (`shape`: ModelConfig fields) trained on `tokens` tokens with the paper's LLaMA
    recipe: sequence 256, global batch 512, cosine to 10%, wd 0, bf16, LNS, at the paper's lr for its largest models,
    5e-4 (the paper gives only the token budgets of its Qwen2.5 and OLMo runs: lr and schedule are our choice)."""
    model = ModelConfig(family=family, **shape, norm_scheme="lns", embed_std=(2 / 5) ** 0.5)
    train = TrainConfig(max_steps=round(tokens / (512 * 256)), global_batch=512, batch_size=64, grad_accum=8,
                        lr=5e-4, warmup_steps=1000, dtype="bf16", eval_every=1000, log_every=10, ckpt_every=1000,
                        parallel="fsdp" if model.dim >= 2048 else "ddp")
    return Config(model, DataConfig(seq_len=256), train, preset=name)
