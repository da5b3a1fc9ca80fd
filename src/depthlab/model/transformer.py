"""The LLaMA decoder: embedding -> blocks of the chosen scheme -> final norm -> LM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from depthlab.config import ModelConfig
from depthlab.model.init import init_weights
from depthlab.model.llama import rope_cache
from depthlab.model.schemes import build_block, scheme_class


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, init: bool = True):
        super().__init__()
        self.cfg = cfg
        block = scheme_class(cfg.norm_scheme)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.embed_norm = block.make_norm(cfg) if block.embed_norm else nn.Identity()
        self.layers = nn.ModuleList(build_block(cfg, l) for l in range(1, cfg.n_layers + 1))
        self.norm = block.make_norm(cfg)  # final norm: never scaled
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_cache(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if init:
            init_weights(self, cfg)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, idx: torch.Tensor, return_hidden: bool = False):
        """idx: (B, T) token ids -> logits (B, T, V). With return_hidden, also the residual stream before each
        block and after the last one (N + 1 tensors, none of them final-normed)."""
        T = idx.shape[1]
        rope = (self.rope_cos[:T], self.rope_sin[:T])
        h = self.embed_norm(self.embed_tokens(idx))
        hidden = [h]
        for layer in self.layers:
            h = layer(h, rope)
            if return_hidden:
                hidden.append(h)
        logits = self.lm_head(self.norm(h))
        return (logits, hidden) if return_hidden else logits

    def num_params(self, embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n if embeddings else n - self.embed_tokens.weight.numel()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction=reduction)
