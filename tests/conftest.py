import random

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


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small real-text file (random sentences over a tiny vocabulary) for trainer and fault tests."""
    rng = random.Random(1)
    words = "the quick brown fox jumps over lazy dog and cat sat on mat while birds sing in green trees".split()
    f = tmp_path_factory.mktemp("data") / "corpus.txt"
    f.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(3000)))
    return f
