"""train.compile: a compiled model trains like the eager one."""

import pytest
import torch

from depthlab.config import Config, DataConfig, TrainConfig
from depthlab.train.trainer import Trainer
from tests.conftest import tiny_model_config

pytestmark = pytest.mark.slow


def _losses(tmp_path, compile: bool) -> list[float]:
    cfg = Config(tiny_model_config(norm_scheme="lns", n_layers=2, max_seq_len=16, vocab_size=512),
                 DataConfig(seq_len=16, builtin_mb=0.05),
                 TrainConfig(max_steps=3, batch_size=2, eval_every=3, log_every=1, monitor_every=0, device="cpu",
                             compile=compile))
    trainer = Trainer(cfg, run_dir=tmp_path / f"run-{compile}", progress=False)
    losses = []
    for _ in range(cfg.train.max_steps):
        loss, _ = trainer.train_step()
        trainer.opt.step()
        trainer.opt.zero_grad(set_to_none=True)
        losses.append(loss)
    return losses


def test_compiled_model_matches_eager_losses(tmp_path):
    torch._dynamo.reset()
    eager, compiled = _losses(tmp_path, False), _losses(tmp_path, True)
    assert compiled == pytest.approx(eager, rel=1e-4, abs=1e-5)
