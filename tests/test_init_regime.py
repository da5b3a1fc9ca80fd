"""Initialisation that transfers across width, and a tied LM head that starts near ln V."""

import math
import statistics

import pytest
import torch

from depthlab.config import ModelConfig
from depthlab.metrics import init_update_ratios
from depthlab.model import Transformer, lm_loss

PAPER_EMBED_STD = (2 / 5) ** 0.5


def mean_ratio(cfg: ModelConfig) -> float:
    return statistics.fmean(init_update_ratios(cfg, batch=2, seq_len=32))


@pytest.fixture(scope="module")
def llama_130m_ratio() -> float:
    # the paper's LLaMA-130M block shape (768 x 12, std 0.02, embedding std 0.632); the vocabulary does not matter
    cfg = ModelConfig(vocab_size=256, dim=768, n_layers=12, n_heads=12, ffn_dim=2048, norm_scheme="pre",
                      init_std=0.02, embed_std=PAPER_EMBED_STD)
    return mean_ratio(cfg)


def test_auto_std_is_the_small_init_rule():
    assert ModelConfig(dim=64, init_std="auto").weight_std == pytest.approx(math.sqrt(2 / 320))
    assert ModelConfig(dim=64, init_std=0.05).weight_std == 0.05


@pytest.mark.parametrize("dim", [64, 256])
def test_auto_std_starts_in_the_paper_regime(dim, llama_130m_ratio):
    assert 0.2 < llama_130m_ratio < 0.35
    auto = ModelConfig(vocab_size=256, dim=dim, n_layers=12, n_heads=4, ffn_dim=dim * 8 // 3, norm_scheme="pre",
                       init_std="auto", embed_std=PAPER_EMBED_STD)
    assert llama_130m_ratio / 2 < mean_ratio(auto) < llama_130m_ratio * 2
    fixed = ModelConfig(**{**auto.__dict__, "init_std": 0.02})
    assert mean_ratio(fixed) < llama_130m_ratio / 2  # the width-768 value leaves small models' blocks nearly silent


@pytest.mark.parametrize("init_std", [0.02, "auto"])
def test_tied_model_starts_near_log_vocab(init_std):
    cfg = ModelConfig(vocab_size=4096, dim=256, n_layers=2, n_heads=4, ffn_dim=512, tie_embeddings=True,
                      embed_std=PAPER_EMBED_STD, init_std=init_std)
    model = Transformer(cfg)
    idx = torch.randint(cfg.vocab_size, (2, 65))
    with torch.no_grad():
        loss = lm_loss(model(idx[:, :-1]), idx[:, 1:]).item()
    assert abs(loss - math.log(cfg.vocab_size)) < 1.0
