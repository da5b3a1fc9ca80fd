import pytest
import torch

from depthlab.config import ModelConfig


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tiny_model_config(**kw) -> ModelConfig:
    base = dict(vocab_size=97, dim=32, n_layers=4, n_heads=4, ffn_dim=64, max_seq_len=32)
    base.update(kw)
    return ModelConfig(**base)
