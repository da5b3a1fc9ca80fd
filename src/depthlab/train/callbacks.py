"""Trainer callbacks: monitors and loggers plug in here; the training loop is never edited for them.

Hooks, in order within a step: on_step_start(step) -> forward/backward of every micro-batch ->
on_after_backward(step) (gradients present, before clipping) -> optimizer step -> on_log(step, record) on
logged steps, where a callback may add fields to the metrics record.
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch import nn

from depthlab.metrics import token_update_ratio


class Callback:
    def on_train_start(self, trainer) -> None: ...
    def on_step_start(self, trainer, step: int) -> None: ...
    def on_after_backward(self, trainer, step: int) -> None: ...
    def on_log(self, trainer, step: int, record: dict) -> None: ...
    def on_train_end(self, trainer) -> None: ...


class DepthMonitor(Callback):
    """The paper's "variance over training", live: every `every` steps, per block l (1-based), on the first
    micro-batch of that step's real training forward pass (no extra pass):

      depth/var[l-1]           variance of the residual stream after block l
      depth/rms[l-1]           its root mean square
      depth/update_ratio[l-1]  mean over tokens of ||h_l - h_{l-1}|| / ||h_{l-1}||, how much block l changes the
                               stream: the analysis' update_ratio (depthlab.metrics.token_update_ratio)
      depth/grad_norm[l-1]     gradient norm of block l's parameters (before clipping)

    Hooks exist only on monitor steps, so other steps pay nothing.
    """

    def __init__(self, every: int):
        self.every = every
        self.handles: list = []
        self.stats: dict[str, list[float]] = {}

    def on_step_start(self, trainer, step: int) -> None:
        if step % self.every:
            return
        self.stats = {"var": [], "rms": [], "update_ratio": []}
        for layer in trainer.layers:
            self.handles.append(layer.register_forward_hook(self._record))

    @torch.no_grad()
    def _record(self, module: nn.Module, args, output: torch.Tensor) -> None:
        if len(self.stats["var"]) == len(self.handles):  # later micro-batches: the first one is the sample
            return
        h_in, h_out = args[0].float(), output.float()
        self.stats["var"].append(h_out.var().item())
        self.stats["rms"].append(h_out.pow(2).mean().sqrt().item())
        self.stats["update_ratio"].append(token_update_ratio(h_in, h_out).mean().item())

    def on_after_backward(self, trainer, step: int) -> None:
        if not self.handles:
            return
        for h in self.handles:
            h.remove()
        self.handles = []
        norms = []
        for layer in trainer.layers:
            sq = sum(_full(p.grad).float().pow(2).sum() for p in layer.parameters() if p.grad is not None)
            norms.append(float(sq) ** 0.5)
        self.stats["grad_norm"] = norms

    def on_log(self, trainer, step: int, record: dict) -> None:
        if self.stats and not step % self.every:
            record.update({f"depth/{k}": [float(f"{v:.6g}") for v in vals] for k, vals in self.stats.items()})
            self.stats = {}


def _full(t: torch.Tensor) -> torch.Tensor:
    """A sharded FSDP2 gradient (DTensor) as a full tensor; plain tensors unchanged."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def require(module: str, flag: str, extra: str | None = None):
    """Import an optional logging backend, or explain in one line how to get it (`extra`: depthlab's extra that
    installs it)."""
    import importlib

    from depthlab import UserError

    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".")[0]
        how = f"'depthlab[{extra}]'" if extra else package
        raise UserError(f"{flag} needs the `{package}` package: pip install {how}") from None


def scalars(record: dict) -> dict[str, float]:
    """A metrics record as the trackers' scalars: each number under its key (but the step), each list's entries
    as `key/layer_NN` (the depth monitors' per-block values, 1-based)."""
    out = {}
    for k, v in record.items():
        if isinstance(v, (int, float)) and k != "step":
            out[k] = v
        elif isinstance(v, list):
            out.update({f"{k}/layer_{i + 1:02d}": x for i, x in enumerate(v)})
    return out


class TensorBoardLogger(Callback):
    """Scalars of every logged record to TensorBoard (needs the `tensorboard` package)."""

    def __init__(self):
        require("tensorboard", "train.tensorboard")

    def on_train_start(self, trainer) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(trainer.run_dir / "tensorboard"))

    def on_log(self, trainer, step: int, record: dict) -> None:
        for k, v in scalars(record).items():
            self.writer.add_scalar(k, v, step)

    def on_train_end(self, trainer) -> None:
        self.writer.close()


class WandbLogger(Callback):
    """Logged scalars to Weights & Biases (needs the `wandb` package and a login; never required)."""

    def __init__(self):
        self.wandb = require("wandb", "train.wandb")

    def on_train_start(self, trainer) -> None:
        self.run = self.wandb.init(project="depthlab", dir=str(trainer.run_dir), config=trainer.cfg.to_dict(),
                              name=trainer.run_dir.name)

    def on_log(self, trainer, step: int, record: dict) -> None:
        self.run.log({k: v for k, v in record.items() if not isinstance(v, list)}, step=step)

    def on_train_end(self, trainer) -> None:
        self.run.finish()


class TrackioLogger(Callback):
    """The TensorBoard scalars (`scalars`) to Trackio (needs `depthlab[trackio]`), in its local store: the folder
    TRACKIO_DIR names (Trackio's default: ~/.cache/huggingface/trackio), project `depthlab`, a run named after the
    run directory; a resumed run goes on in the newest Trackio run of its name. Trackio's own lines go to stderr
    (stdout is depthlab's), and its CPU and GPU sampling stays off: it logs what TensorBoard gets, no more."""

    def __init__(self):
        self.trackio = require("trackio", "train.trackio", extra="trackio")

    def on_train_start(self, trainer) -> None:
        with contextlib.redirect_stdout(sys.stderr):
            self.trackio.init(project="depthlab", name=trainer.run_dir.name, config=trainer.cfg.to_dict(),
                              resume="allow" if trainer.step else "never", auto_log_cpu=False, auto_log_gpu=False,
                              embed=False)

    def on_log(self, trainer, step: int, record: dict) -> None:
        self.trackio.log(scalars(record), step=step)

    def on_train_end(self, trainer) -> None:
        with contextlib.redirect_stdout(sys.stderr):
            self.trackio.finish()
