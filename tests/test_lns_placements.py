"""LNS placements for language models (the paper's Table 8): each block against its hand-written formula, and each
exported as a stock checkpoint whose logits match, the scale folded where it sits."""

import pytest
import torch

from depthlab import UserError
from depthlab.config import Config, apply_overrides
from depthlab.hf.exporter import export
from depthlab.model import Transformer
from depthlab.model.validate import validate
from tests.test_hf_fixtures import make_checkpoint
from tests.test_schemes import block_io, rms

transformers = pytest.importorskip("transformers")


def reference(placement: str, blk, h, rope, s: float) -> torch.Tensor:
    """docs/method.md's formula for each placement, with s = l^(-p)."""
    a_in, m_in, a_out, m_out = {"norm": (s, s, 1, 1), "branch": (1, 1, s, s), "attn_only": (s, 1, 1, 1),
                                "mlp_only": (1, s, 1, 1)}[placement]
    h1 = h + a_out * blk.attn(a_in * rms(h, blk.attn_norm.weight), rope)
    return h1 + m_out * blk.mlp(m_in * rms(h1, blk.mlp_norm.weight))


@pytest.mark.parametrize("placement", ["norm", "branch", "attn_only", "mlp_only"])
@pytest.mark.parametrize("p", [0.5, 1.0])
def test_each_placement_follows_its_formula(placement, p):
    model = Transformer(Config().model.__class__(vocab_size=97, dim=32, n_layers=5, n_heads=4, ffn_dim=64,
                                                 max_seq_len=32, norm_scheme="lns", lns_placement=placement,
                                                 lns_power=p, init_std=0.1))
    for w in model.parameters():
        if w.dim() == 1:
            w.data.uniform_(0.5, 1.5)
    for l in (1, 3, 5):
        h, blk, rope = block_io(model, l)
        assert torch.allclose(blk(h, rope), reference(placement, blk, h, rope, l ** -p), atol=1e-5)
    if placement != "norm":  # and it is not the paper's LNS: the placements are different functions
        h, blk, rope = block_io(model, 4)
        assert not torch.allclose(blk(h, rope), reference("norm", blk, h, rope, 4 ** -p), atol=1e-4)


@pytest.mark.parametrize("placement,family", [("branch", "llama"), ("attn_only", "llama"), ("mlp_only", "llama"),
                                            ("branch", "qwen2"), ("branch", "olmo2"), ("attn_only", "olmo")])
def test_each_placement_exports_to_a_stock_checkpoint_with_the_same_logits(tmp_path, placement, family):
    eps = {"norm_eps": 1e-5} if family == "olmo" else {}  # OLMo-1's stock LayerNorm fixes its epsilon
    model = make_checkpoint(tmp_path / "ckpt", "lns", lns_placement=placement, family=family, init_std=0.1, **eps)
    hf = transformers.AutoModelForCausalLM.from_pretrained(export(tmp_path / "ckpt", tmp_path / "hf")).eval()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 13))
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max() < 1e-4


def test_an_unknown_placement_is_one_line():
    with pytest.raises(UserError, match="model.lns_placement must be norm or branch or attn_only or mlp_only"):
        validate(apply_overrides(Config(), ["model.lns_placement=ffn"]))
