"""One hand-written oracle per registered scheme, in one place: the block's formula written out from docs/method.md
section 2, and where the scheme is expected to go (stock HF export, ViT export, OLMo-2's block, hf.apply_scheme).

The tests that cover every scheme iterate over the registry (depthlab.model.SCHEMES) and read each scheme's
expectation here; tests/test_schemes.py fails while a registered scheme has no oracle. So a new scheme is its class
in depthlab/model/schemes.py, its entry here, and its rows in the docs (tests/test_docs.py), nothing else.

A formula sees the block through `Parts`, plain functions each test builds for its family (a LLaMA block with its
RoPE, or a ViT block with attention and MLP written out by hand); the norms are written out from their parameters
(`norm_by_hand`), without the LNS scale the module carries, so the scale in a formula is the formula's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from depthlab.model.parts import DyT, LayerNorm, RMSNorm

Fn = Callable[[torch.Tensor], torch.Tensor]


def norm_by_hand(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A norm module's output from its parameters, ignoring its constant `scale`."""
    if isinstance(m, DyT):
        return m.weight * torch.tanh(m.alpha * x) + m.bias
    if isinstance(m, RMSNorm):
        return m.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.eps)
    if isinstance(m, LayerNorm):
        mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        y = (x - mu) / torch.sqrt(var + m.eps)
        return y if m.weight is None else y * m.weight + m.bias
    raise AssertionError(f"no hand-written form for {type(m).__name__}")


@dataclass(frozen=True)
class Parts:
    """Block l (1-based) of a model with config cfg, as functions: its attention and MLP, and its norms by hand."""

    block: torch.nn.Module
    attn: Fn
    mlp: Fn
    l: int
    cfg: object

    def norm(self, name: str) -> Fn:
        return lambda x: norm_by_hand(self.block.get_submodule(name), x)

    def gain(self, name: str) -> torch.Tensor:
        return self.block.get_parameter(name)


def pre(h, b: Parts):
    h = h + b.attn(b.norm("attn_norm")(h))
    return h + b.mlp(b.norm("mlp_norm")(h))


def lns(h, b: Parts):
    s = b.l ** -b.cfg.lns_power
    s_attn, s_mlp, s_branch = {"norm": (s, s, 1), "branch": (1, 1, s), "attn_only": (s, 1, 1),
                               "mlp_only": (1, s, 1)}[b.cfg.lns_placement]
    h = h + s_branch * b.attn(s_attn * b.norm("attn_norm")(h))
    return h + s_branch * b.mlp(s_mlp * b.norm("mlp_norm")(h))


def post(h, b: Parts, alpha: float = 1.0):
    h = b.norm("attn_norm")(alpha * h + b.attn(h))
    return b.norm("mlp_norm")(alpha * h + b.mlp(h))


def deepnorm(h, b: Parts):
    return post(h, b, alpha=(2 * b.cfg.n_layers) ** 0.25)


def mixln(h, b: Parts):
    return (post if b.l <= math.floor(b.cfg.mixln_ratio * b.cfg.n_layers) else pre)(h, b)


def sandwich(h, b: Parts):
    h = h + b.norm("attn_out_norm")(b.attn(b.norm("attn_norm")(h)))
    return h + b.norm("mlp_out_norm")(b.mlp(b.norm("mlp_norm")(h)))


def reordered(h, b: Parts):
    h = h + b.norm("attn_norm")(b.attn(h))
    return h + b.norm("mlp_norm")(b.mlp(h))


def gained(h, b: Parts):  # layerscale (per channel), skipinit (a scalar)
    h = h + b.gain("attn_gain") * b.attn(b.norm("attn_norm")(h))
    return h + b.gain("mlp_gain") * b.mlp(b.norm("mlp_norm")(h))


def rezero(h, b: Parts):
    h = h + b.gain("attn_gain") * b.attn(h)
    return h + b.gain("mlp_gain") * b.mlp(h)


@dataclass(frozen=True)
class Oracle:
    block: Callable[[torch.Tensor, Parts], torch.Tensor]  # the block's output from its input h
    hf_export: str | None  # the stock HF class it exports to: "family" (the run's own), "gemma2"; None: refused
    vit_export: bool  # a ViT under it exports to a stock ViTForImageClassification
    olmo2: bool  # it runs on OLMo-2's block (model.family=olmo2); else validation refuses it
    hf_patchable: bool  # depthlab.hf.apply_scheme patches it onto a stock HF decoder


ORACLES = {
    "pre": Oracle(pre, "family", vit_export=True, olmo2=True, hf_patchable=True),
    "lns": Oracle(lns, "family", vit_export=True, olmo2=True, hf_patchable=True),
    "post": Oracle(post, None, vit_export=False, olmo2=False, hf_patchable=False),
    "deepnorm": Oracle(deepnorm, None, vit_export=False, olmo2=False, hf_patchable=False),
    "mixln": Oracle(mixln, None, vit_export=False, olmo2=False, hf_patchable=False),
    "sandwich": Oracle(sandwich, "gemma2", vit_export=False, olmo2=False, hf_patchable=False),
    "peri": Oracle(sandwich, None, vit_export=False, olmo2=False, hf_patchable=False),  # + the embedding norm
    "reordered": Oracle(reordered, None, vit_export=False, olmo2=False, hf_patchable=False),
    "layerscale": Oracle(gained, "family", vit_export=True, olmo2=False, hf_patchable=False),
    "skipinit": Oracle(gained, "family", vit_export=True, olmo2=False, hf_patchable=False),
    "rezero": Oracle(rezero, None, vit_export=False, olmo2=False, hf_patchable=False),
    "dyt": Oracle(pre, None, vit_export=False, olmo2=True, hf_patchable=False),  # its norms are DyT (norm_by_hand)
}


def names(**expected) -> list[str]:
    """The schemes whose oracle has every given attribute value, e.g. names(olmo2=True), in registry order."""
    from depthlab.model import SCHEMES

    return [n for n in SCHEMES if all(getattr(ORACLES[n], k) == v for k, v in expected.items())]
