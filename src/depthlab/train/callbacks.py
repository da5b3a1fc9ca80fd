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


TRACKIO_RUN = "trackio.json"  # in the run directory: the name of the Trackio run it logs to


class TrackioLogger(Callback):
    """The TensorBoard scalars (`scalars`) to Trackio (needs `depthlab[trackio]`), in its local store: the folder
    TRACKIO_DIR names (Trackio's default: ~/.cache/huggingface/trackio), project `depthlab`.

    Each run directory logs to a Trackio run of its own, named after it with a random suffix and recorded in
    RUN/trackio.json (Trackio resumes a run by its name, the newest of that name: two runs called `exp` in different
    folders would share one). A resume goes on in the run its directory records, after re-sending the steps up to
    the resume point that the store lacks (logged, but not yet sent when the run was killed: Trackio sends every
    half second); a fresh start or a branch into a new directory starts a new Trackio run, a branch with its
    parent's steps. Trackio's own lines go to stderr (stdout is depthlab's), and its CPU and GPU sampling stays off:
    it logs what TensorBoard gets, no more."""

    def __init__(self):
        self.trackio = require("trackio", "train.trackio", extra="trackio")

    def on_train_start(self, trainer) -> None:
        name = self._run_name(trainer)
        with contextlib.redirect_stdout(sys.stderr):
            self.trackio.init(project="depthlab", name=name, config=trainer.cfg.to_dict(),
                              resume="allow" if trainer.step else "never", auto_log_cpu=False, auto_log_gpu=False,
                              embed=False)
        if trainer.step:
            self._resend(trainer, name)

    @staticmethod
    def _run_name(trainer) -> str:
        """The Trackio run of this run directory: the one it records when it resumes, else a new one."""
        import json
        import secrets

        from depthlab.ownership import write_whole

        record = trainer.run_dir / TRACKIO_RUN
        if trainer.step and record.is_file():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                return str(json.loads(record.read_text())["run"])
        name = f"{trainer.run_dir.name}-{secrets.token_hex(4)}"
        write_whole(record, json.dumps({"run": name}) + "\n")
        return name

    def _resend(self, trainer, name: str) -> None:
        """Log again the records of metrics.jsonl (those up to the resume point) whose step the store lacks."""
        from trackio.sqlite_storage import SQLiteStorage

        from depthlab.runfolder import read_metrics

        stored = {r["step"] for r in SQLiteStorage.get_logs("depthlab", name)}
        for record in read_metrics(trainer.run_dir):
            if record["step"] <= trainer.step and record["step"] not in stored:
                self.trackio.log(scalars(record), step=record["step"])

    def on_log(self, trainer, step: int, record: dict) -> None:
        self.trackio.log(scalars(record), step=step)

    def on_train_end(self, trainer) -> None:
        with contextlib.redirect_stdout(sys.stderr):
            self.trackio.finish()
