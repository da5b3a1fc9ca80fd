"""Muon under 2 gloo ranks against one process (issue 60): the largest |loss difference| over 20 steps of the test
model (tests/test_trainer.py's TINY: 3 blocks x 32, 2 x 2 x 32 tokens per rank and step), DDP and FSDP2, for AdamW,
Muon, and Muon with its Newton-Schulz in float32 instead of torch's bfloat16 (a sitecustomize the workers import
replaces torch.optim._muon._zeropower_via_newtonschulz, for this measurement only). docs/training.md quotes it.

    python -m benchmarks.muon_ranks            # about 10 minutes on 2 CPU cores; prints one JSON line per optimizer
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from depthlab.runfolder import read_metrics

TINY = {"model.dim": 32, "model.n_layers": 3, "model.n_heads": 2, "model.ffn_dim": 64, "model.vocab_size": 300,
        "data.seq_len": 32, "train.eval_every": 1000, "train.log_every": 1, "train.warmup_steps": 2,
        "train.monitor_every": 0, "train.grad_accum": 2}
FLOAT32_NEWTON_SCHULZ = '''
import torch, torch.optim._muon as m
def ns(grad, coefficients, steps, eps):
    a, b, c = coefficients
    x = grad.float().T if grad.size(0) > grad.size(1) else grad.float()
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        g = x @ x.T
        x = torch.addmm(x, torch.addmm(g, g, g, beta=b, alpha=c), x, beta=a)
    return x.T if grad.size(0) > grad.size(1) else x
m._zeropower_via_newtonschulz = ns
'''


def train(run: Path, corpus: Path, ranks: int, settings: dict, env: dict) -> dict[int, float]:
    launch = [sys.executable, *(["-m", "torch.distributed.run", "--nproc_per_node", str(ranks)] if ranks else [])]
    sets = [a for k, v in {**TINY, **settings}.items() for a in ("--set", f"{k}={v}")]
    subprocess.run([*launch, "-m", "depthlab", "train", "--no-progress", "--data", str(corpus), "--run-dir", str(run),
                    "--max-steps", "20", *sets], env=env, check=True, capture_output=True)
    return {r["step"]: r["loss"] for r in read_metrics(run)}


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        rng = random.Random(1)  # tests/conftest.py's corpus
        words = "the quick brown fox jumps over lazy dog and cat sat on mat while birds sing in green trees".split()
        (root / "corpus.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(12))
                                                   for _ in range(3000)))
        (root / "ns32").mkdir()
        (root / "ns32" / "sitecustomize.py").write_text(FLOAT32_NEWTON_SCHULZ)
        for name, optimizer, patch in (("adamw", "adamw", False), ("muon", "muon", False),
                                       ("muon, Newton-Schulz in float32", "muon", True)):
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            if patch:
                env["PYTHONPATH"] = os.pathsep.join([str(root / "ns32"), env.get("PYTHONPATH", "")])
            opt = {"train.optimizer": optimizer}
            one = train(root / f"{optimizer}{patch}-one", root / "corpus.txt", 0, {**opt, "train.batch_size": 4}, env)
            gaps = {}
            for layout, extra in (("ddp", {}), ("fsdp", {"train.parallel": "fsdp"})):
                two = train(root / f"{optimizer}{patch}-{layout}", root / "corpus.txt", 2,
                            {**opt, "train.batch_size": 2, **extra}, env)
                gaps[layout] = max(abs(one[s] - two[s]) for s in one)
            print(json.dumps({"optimizer": name, **{k: float(f"{v:.2g}") for k, v in gaps.items()}}), flush=True)


if __name__ == "__main__":
    main()
