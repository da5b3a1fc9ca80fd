"""One update ratio: the training monitor's depth/update_ratio and the analysis' update_ratio are the same
quantity, pinned on the same batch."""

import torch

from depthlab.analysis.analyze import Options, analyze
from depthlab.analysis.calibration import Batch
from depthlab.analysis.layers import from_depthlab
from depthlab.model import Transformer
from depthlab.train.callbacks import DepthMonitor
from tests.conftest import tiny_model_config


class _Trainer:  # what the monitor reads of the trainer
    def __init__(self, model):
        self.layers = model.layers


def test_monitor_and_analysis_agree_on_the_same_batch():
    model = Transformer(tiny_model_config(n_layers=5, init_std=0.1)).eval()
    ids = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(1))
    mon, trainer, record = DepthMonitor(every=1), _Trainer(model), {}
    mon.on_step_start(trainer, 0)
    model(ids).sum().backward()
    mon.on_after_backward(trainer, 0)
    mon.on_log(trainer, 0, record)
    res = analyze(from_depthlab(model, "m"), [Batch(ids, torch.ones_like(ids, dtype=torch.bool))],
                  Options(removal=False, jacobian=False))
    analysis = [b["update_ratio"] for b in res["blocks"]]
    assert torch.allclose(torch.tensor(record["depth/update_ratio"]), torch.tensor(analysis), rtol=1e-5)
    # and it is the per-token mean, not the batch-level ||dH||_F / ||H||_F the monitor once computed
    h = model(ids, return_hidden=True)[1]
    frob = [((b - a).norm() / a.norm()).item() for a, b in zip(h[:-1], h[1:])]
    assert max(abs(x - y) for x, y in zip(frob, analysis)) > 1e-4
