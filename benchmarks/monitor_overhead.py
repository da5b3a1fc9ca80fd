"""Cost of the depth monitors on training step time, measured side by side in one run.

Alternates blocks of plain steps and blocks of monitored steps (DepthMonitor active on every step: its worst
case) on the same trainer, and reports the median step-time ratio. With the default `train.monitor_every=50`
the amortised overhead is that per-step cost divided by 50.

    python benchmarks/monitor_overhead.py [--layers 8 --dim 128 --rounds 6 --steps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from depthlab.config import Config, apply_overrides
from depthlab.train.callbacks import DepthMonitor
from depthlab.train.trainer import Trainer


def timed_steps(trainer: Trainer, steps: int, monitor: DepthMonitor | None) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step = trainer.step + 1
        if monitor:
            monitor.on_step_start(trainer, step)
        trainer.train_step()
        if monitor:
            monitor.on_after_backward(trainer, step)
            monitor.on_log(trainer, step, {})
        trainer.opt.step()
        trainer.opt.zero_grad(set_to_none=True)
        trainer.step = step
    return (time.perf_counter() - start) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", default="benchmarks/results/monitor_overhead.json")
    args = ap.parse_args()
    t0 = time.time()
    cfg = apply_overrides(Config(), [f"model.n_layers={args.layers}", f"model.dim={args.dim}", "train.monitor_every=0",
                                     "data.builtin_mb=0.5", "model.vocab_size=2048"])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, run_dir=Path(tmp) / "run", progress=False)
        # the callback hooks receive the trainer; DepthMonitor's hooks do not go through Trainer.train here
        trainer.callbacks = []
        monitor = DepthMonitor(every=1)
        timed_steps(trainer, 2, None)  # warm-up
        plain, monitored = [], []
        for _ in range(args.rounds):
            plain.append(timed_steps(trainer, args.steps, None))
            monitored.append(timed_steps(trainer, args.steps, monitor))
    p, m = statistics.median(plain), statistics.median(monitored)
    result = {"layers": args.layers, "dim": args.dim, "batch": cfg.train.batch_size, "seq_len": cfg.data.seq_len,
              "plain_step_s": p, "monitored_step_s": m, "ratio_every_step": m / p,
              "amortised_overhead_every_50": (m / p - 1) / 50, "wall_s": time.time() - t0,
              "command": "python " + " ".join(sys.argv)}
    print(json.dumps(result, indent=2))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
