"""The family spec: everything depthlab knows about a model family, declared once, on one class in one module.

Every family is a variant of the LLaMA block, so `Family` holds LLaMA's answers; a family's module subclasses it,
overrides what differs and registers it with @register("name") (the name is `model.arch`). What a family declares,
and who asks:

    parts and flags       qkv_bias, out_bias, norm, fixed_norm_eps,     the block (depthlab.model.schemes)
                          qk_norm, norms_after_branch, mlp, activation,
                          causal; attention(), feed_forward(),
                          make_norm()
    around the blocks     embed_scale(), logit_softcap()                the model (depthlab.model.transformer)
    its config fields     options: ModelConfig fields only it reads     validate
    validation            check(model config)                           validate
    presets               presets: name -> Config                       --preset (depthlab.model.families)
    FLOPs                 train_flops_per_token()                       the trainer's MFU (depthlab.train.flops)
    HF class and config   hf_class, hf_names (model types it imports    export (depthlab.hf.convert), import,
                          from, display names), hf_config()             the --help texts
    HF weight names       hf_norm_names                                 depthlab.hf.convert
    import rules          from_hf(HF config)                            depthlab.hf.importer

The scheme (depthlab.model.schemes) decides where the norms and residual adds sit; the family decides what the
parts are. Which schemes combine with which family: depthlab.model.schemes.family_refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from torch import nn

from depthlab import UserError
from depthlab.config import Config, DataConfig, ModelConfig, TrainConfig
from depthlab.model.llama import MLP, Attention, LayerNorm, RMSNorm

FAMILIES: dict[str, Family] = {}


def register(name: str):
    """Class decorator: make the Family subclass the family `name` (model.arch=name)."""

    def deco(cls):
        if not cls.hf_class or not cls.hf_names:
            raise TypeError(f"family {name!r}: {cls.__name__} must declare hf_class and hf_names")
        cls.name = name
        FAMILIES[name] = cls()
        return cls

    return deco


def family_of(cfg: ModelConfig) -> Family:
    """The family of a model config."""
    if cfg.arch not in FAMILIES:
        raise UserError(f"unknown model.arch {cfg.arch!r}; valid: {', '.join(FAMILIES)}")
    return FAMILIES[cfg.arch]


def require(ok: bool, message: str) -> None:
    """A setting a user can get wrong: UserError with `message` unless ok."""
    if not ok:
        raise UserError(message)


class Family:
    """A model family; this base is the LLaMA block: RMSNorm with a weight, no biases, SwiGLU, causal attention
    with rotate-half RoPE and grouped-query heads, tied or untied embeddings."""

    name: ClassVar[str]  # set by @register
    hf_class: ClassVar[str] = ""  # the stock Hugging Face class that `pre` / `lns` export to
    hf_names: ClassVar[dict[str, str]] = {}  # HF model_type -> display name, for the models importing as this family
    # (the first is the export's model_type)
    qkv_bias: ClassVar[bool] = False  # biases on q, k, v (not on o)
    out_bias: ClassVar[bool] = False  # biases on o_proj and on the MLP's projections too
    norm: ClassVar[str] = "rms"  # rms: RMSNorm with a weight; layernorm: neither weight nor bias; layernorm_affine
    fixed_norm_eps: ClassVar[float | None] = None  # the stock class hard-codes the norm's epsilon
    qk_norm: ClassVar[bool] = False  # RMSNorm on the q and k projections' outputs
    norms_after_branch: ClassVar[bool] = False  # h + Norm(F(h)) instead of h + F(Norm(h))
    mlp: ClassVar[str] = "gated"  # gated: down(act(gate(x)) * up(x)); plain: down(act(up(x)))
    activation: ClassVar[str] = "silu"  # act: silu (SwiGLU), gelu_tanh (GeGLU), gelu (exact); ACTIVATIONS
    causal: ClassVar[bool] = True  # causal attention with RoPE (language), or bidirectional without (vision)
    options: ClassVar[dict[str, str]] = {}  # ModelConfig fields only this family reads (null for any other): what
    # each is, for the refusal
    hf_norm_names: ClassVar[dict[str, str]] = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
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
        """Config fields of the stock class that only this family has (the shared ones: depthlab.hf.convert)."""
        return {}

    def from_hf(self, hf_cfg, seq_len: int) -> dict:
        """ModelConfig fields this family reads from an HF config beyond the shared ones (depthlab.hf.importer);
        UserError where the HF model computes what this family does not: here, sliding-window attention."""
        window, types = getattr(hf_cfg, "sliding_window", None), getattr(hf_cfg, "layer_types", None)
        if window and (types is None or "sliding_attention" in types) and window < seq_len:
            raise UserError(f"this {hf_cfg.model_type} model uses sliding-window attention ({window} tokens) and "
                            f"ours is full attention; import with max_seq_len <= {window}")
        return {}


def released_preset(name: str, arch: str, tokens: float, **shape) -> Config:
    """A released model's shape (`shape`: ModelConfig fields) trained on `tokens` tokens with the paper's LLaMA
    recipe: sequence 256, global batch 512, cosine to 10%, wd 0, bf16, LNS, at the paper's lr for its largest models,
    5e-4 (the paper gives only the token budgets of its Qwen2.5 and OLMo runs: lr and schedule are our choice)."""
    model = ModelConfig(arch=arch, **shape, norm_scheme="lns", embed_std=(2 / 5) ** 0.5)
    train = TrainConfig(max_steps=round(tokens / (512 * 256)), global_batch=512, batch_size=64, grad_accum=8,
                        lr=5e-4, warmup_steps=1000, dtype="bf16", eval_every=1000, log_every=10, ckpt_every=1000,
                        parallel="fsdp" if model.dim >= 2048 else "ddp")
    return Config(model, DataConfig(seq_len=256), train, preset=name)
