"""The LLaMA decoder: embedding -> blocks of the chosen scheme -> final norm -> LM head."""

from __future__ import annotations

import torch
from torch import nn

from depthlab.config import ModelConfig, TrainConfig
from depthlab.model.families import family_of
from depthlab.model.init import init_weights
from depthlab.model.loss import linear_cross_entropy, lm_loss
from depthlab.model.parts import rope_cache, softcap
from depthlab.model.schemes import build_block, scheme_class
from depthlab.model.vit import ViT


class Transformer(nn.Module):
    """The LLaMA-style decoder of config `cfg`: token embedding, cfg.n_layers blocks of scheme cfg.norm_scheme
    (depthlab.model.schemes) built with the family's parts (cfg.family), the final norm (never scaled), the LM head;
    with model.resid_lambda / x0_lambda each block also reads the embedding output x0 (its StreamMix);
    the family may scale the embedding's output and soft-cap the logits (Gemma's). init=False leaves the weights
    undrawn (a meta-device build, or weights about to be loaded)."""

    def __init__(self, cfg: ModelConfig, init: bool = True):
        super().__init__()
        self.cfg = cfg
        block = scheme_class(cfg.norm_scheme)
        family = family_of(cfg)
        self.embed_scale, self.logit_softcap = family.embed_scale(cfg), family.logit_softcap(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.embed_norm = block.make_norm(cfg) if block.embed_norm else nn.Identity()
        self.layers = nn.ModuleList(build_block(cfg, l) for l in range(1, cfg.n_layers + 1))
        self.norm = block.make_norm(cfg)  # final norm: never scaled
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_cache(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if init:
            self.initialize()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def initialize(self) -> None:
        """Draw the weights (model.init). Also what a meta-device build calls once materialised."""
        init_weights(self, self.cfg)

    def forward(self, idx: torch.Tensor, return_hidden: bool = False, *, targets: torch.Tensor | None = None,
                loss_chunk: int = TrainConfig.loss_chunk, reduction: str = "mean"):
        """idx: (B, T) token ids -> logits (B, T, V). With return_hidden, also the residual stream before each
        block and after the last one (N + 1 tensors, none of them final-normed). With targets (B, T), the fp32
        cross-entropy instead of the logits, computed `loss_chunk` tokens at a time without ever holding the
        full logits (depthlab.model.loss; 0: through the full logits, as lm_loss)."""
        T = idx.shape[1]
        rope = (self.rope_cos[:T], self.rope_sin[:T])
        h = self.embed_tokens(idx)
        if self.embed_scale != 1.0:  # the scale rounded to fp32, then to the embedding's dtype, as transformers' Gemma
            h = h * torch.tensor(self.embed_scale).to(h.dtype)
        h = self.embed_norm(h)
        hidden = [h]
        x0 = (h,) if self.cfg.resid_lambda or self.cfg.x0_lambda else ()  # the stream scalars' x0, for every block
        for layer in self.layers:
            h = layer(h, rope, *x0)
            if return_hidden:
                hidden.append(h)
        if targets is not None:
            out = linear_cross_entropy(self.norm(h), self.lm_head.weight, targets, loss_chunk, reduction,
                                       self.logit_softcap)
        else:
            out = self.lm_head(self.norm(h))
            if self.logit_softcap is not None:
                out = softcap(out, self.logit_softcap)
        return (out, hidden) if return_hidden else out

    def num_params(self, embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n if embeddings else n - self.embed_tokens.weight.numel()


def build_model(cfg: ModelConfig, init: bool = True) -> Transformer | ViT:
    """The model a config describes: a ViT for model.family=vit, else the language model."""
    return ViT(cfg, init) if cfg.is_vit else Transformer(cfg, init)


def loss_of(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, reduction: str = "mean",
            loss_chunk: int = TrainConfig.loss_chunk) -> torch.Tensor:
    """The fp32 LM loss of any module from token ids to logits. A depthlab Transformer (also under DDP or
    torch.compile) computes it by chunks without the full logits; any other module through its logits."""
    inner = getattr(model, "module", model)  # DDP, also through torch.compile's wrapper (it forwards attributes)
    inner = getattr(inner, "_orig_mod", inner)  # torch.compile of an unwrapped model
    if isinstance(inner, Transformer | ViT):
        return model(idx, targets=targets, loss_chunk=loss_chunk, reduction=reduction)
    return lm_loss(model(idx), targets, reduction)
