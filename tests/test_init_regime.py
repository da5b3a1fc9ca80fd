"""Initialisation that transfers across width, and a tied LM head that starts near ln V."""

import dataclasses
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


@pytest.mark.parametrize("init", ["scaled", "depth_scaled"])
def test_scaled_inits_change_exactly_the_output_projections(init):
    """GPT-2 / Megatron's rule scales the matrices that write into the residual stream, attention's o_proj and the
    MLP's down_proj, and nothing else: not SwiGLU's up_proj beside down_proj (torchtitan's and llama2.c's
    depth-scaled init scale w3 with w2), nor gate_proj, q, k or v. Drawn from one seed, every matrix is the
    normal init's, those two multiplied by their factor (sigma / sqrt(2N), or sigma / sqrt(2l) in block l)."""
    n = 4
    cfg = ModelConfig(vocab_size=64, dim=32, n_layers=n, n_heads=2, ffn_dim=64, norm_scheme="pre", init_std=0.02)
    models = {}
    for name in ("normal", init):
        torch.manual_seed(0)
        models[name] = dict(Transformer(dataclasses.replace(cfg, init=name)).named_parameters())
    scaled = set()
    for key, base in models["normal"].items():
        got = models[init][key]
        if torch.equal(got, base):
            continue
        block = int(key.split(".")[1]) + 1
        factor = (2 * (n if init == "scaled" else block)) ** -0.5
        torch.testing.assert_close(got, base * factor, rtol=1e-6, atol=0)
        scaled.add(key.split(".")[-2])
    assert scaled == {"o_proj", "down_proj"}
    assert {k.split(".")[-2] for k in models["normal"] if k.startswith("layers.0.") and k.endswith("proj.weight")} \
        == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # the names checked
