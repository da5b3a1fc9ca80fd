"""The ViT (depthlab.model.vit): every scheme and every LNS placement against its formula (tests/scheme_oracles.py,
with attention and MLP written out by hand here), the patch embedding against the stride-p convolution, and the
model as a whole against a hand-written forward."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from depthlab import UserError
from depthlab.config import Config, ModelConfig
from depthlab.model import SCHEMES, ViT, build_model
from depthlab.model.families import preset
from depthlab.model.validate import validate
from depthlab.model.vit import patchify
from tests.scheme_oracles import ORACLES, Parts, norm_by_hand

CFG = ModelConfig(family="vit", dim=16, n_layers=4, n_heads=2, ffn_dim=32, image_size=8, patch_size=4, channels=3,
                  num_classes=5, norm_eps=1e-6, norm_scheme="pre")


def jitter(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Move every parameter off its init value (norm weights off 1, biases off 0) so each term of a formula shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model


def attn(x, a, heads):
    B, T, D = x.shape
    q, k, v = (lin(x).view(B, T, heads, D // heads).transpose(1, 2) for lin in (a.q_proj, a.k_proj, a.v_proj))
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // heads), dim=-1)  # no mask: bidirectional
    return a.o_proj((w @ v).transpose(1, 2).reshape(B, T, D))


def mlp(x, m):
    return m.down_proj(0.5 * m.up_proj(x) * (1 + torch.erf(m.up_proj(x) / math.sqrt(2))))  # exact GELU


def block_by_hand(b, h, cfg: ModelConfig, l: int):
    """Block l under its scheme's oracle (tests/scheme_oracles.py), attention and MLP written out above."""
    return ORACLES[cfg.norm_scheme].block(h, Parts(b, lambda x: attn(x, b.attn, cfg.n_heads),
                                                   lambda x: mlp(x, b.mlp), l, cfg))


CASES = [(s, "norm") for s in SCHEMES] + [("lns", p) for p in ("branch", "attn_only", "mlp_only")]


@pytest.mark.parametrize("scheme,placement", CASES)
def test_every_vit_block_matches_its_formula(scheme, placement):
    cfg = dataclasses.replace(CFG, norm_scheme=scheme, lns_placement=placement)
    model = jitter(ViT(cfg)).eval()
    h = torch.randn(2, 5, cfg.dim)
    with torch.no_grad():
        for l, block in enumerate(model.layers, start=1):
            want = block_by_hand(block, h, cfg, l)
            torch.testing.assert_close(block(h, None), want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("pool,pos", [("cls", "learned"), ("mean", "sincos")])
def test_the_whole_vit_by_hand(pool, pos):
    cfg = dataclasses.replace(CFG, norm_scheme="lns", lns_placement="branch", pool=pool, pos_embed=pos)
    model = jitter(ViT(cfg)).eval()
    images = torch.randn(3, 3, 8, 8)
    # patch embedding = the stride-p convolution of the original ViT, its kernel the Linear's weight as (D, C, p, p)
    kernel = model.patch_embed.weight.view(cfg.dim, 3, 4, 4)
    conv = F.conv2d(images, kernel, model.patch_embed.bias, stride=4).flatten(2).transpose(1, 2)
    torch.testing.assert_close(model.patch_embed(patchify(images, 4)), conv, atol=1e-5, rtol=1e-5)
    h = conv
    if pool == "cls":
        h = torch.cat([model.cls_token.expand(3, -1, -1), h], dim=1)
    h = h + model.pos_embed
    for l, block in enumerate(model.layers, start=1):
        h = block_by_hand(block, h, cfg, l)
    h = norm_by_hand(model.norm, h)
    want = model.head(h[:, 0] if pool == "cls" else h.mean(1))
    with torch.no_grad():
        torch.testing.assert_close(model(images), want, atol=2e-5, rtol=1e-5)
        labels = torch.tensor([0, 3, 4])
        torch.testing.assert_close(model(images, targets=labels), F.cross_entropy(want, labels))


def test_sincos_positions_are_fixed_and_distinct():
    model = ViT(dataclasses.replace(CFG, pos_embed="sincos", image_size=16))
    pos = model.pos_embed[0, 1:]
    assert "pos_embed" not in dict(model.named_parameters()) and "pos_embed" not in model.state_dict()
    assert pos.shape == (16, 16) and torch.cdist(pos, pos).add(torch.eye(16)).min() > 0.1


@pytest.mark.slow
def test_vit_init_starts_near_chance_and_learns_under_every_scheme():
    torch.manual_seed(0)
    images, labels = torch.randn(16, 3, 8, 8), torch.randint(0, 5, (16,))
    for scheme in ("pre", "lns", "post", "sandwich", "dyt"):
        model = build_model(dataclasses.replace(CFG, norm_scheme=scheme))
        assert isinstance(model, ViT)
        first = model(images, targets=labels)
        assert abs(first.item() - math.log(5)) < 1.0
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(60):
            opt.zero_grad()
            model(images, targets=labels).backward()
            opt.step()
        assert model(images, targets=labels).item() < 0.5 * first.item(), scheme


def test_vit_presets_and_bad_vit_settings():
    for name, dim in (("vit-ti", 192), ("vit-s", 384), ("vit-b", 768)):
        cfg = validate(preset(name))
        assert (cfg.model.dim, cfg.model.patch_size, cfg.model.image_size, cfg.model.n_patches) == (dim, 16, 224, 196)
    digits = validate(preset("vit-digits"))
    assert digits.model.lns_placement == "branch" and digits.model.channels == 1
    for bad, msg in (({"patch_size": 3}, "must divide"), ({"pool": "max"}, "model.pool"),
                     ({"pos_embed": "rope"}, "model.pos_embed"), ({"lns_placement": "after"}, "lns_placement"),
                     ({"tie_embeddings": True}, "tie_embeddings"), ({"num_classes": 0}, "num_classes")):
        with pytest.raises(UserError, match=msg):
            validate(Config(dataclasses.replace(CFG, **bad)))
