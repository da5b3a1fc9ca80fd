"""Kill-and-resume exactness at demo scale: an uninterrupted run against one killed with SIGKILL at a random
step and resumed with `--resume auto`, compared step for step.

    python benchmarks/kill_resume.py [--steps 60 --ckpt-every 10 --seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from depthlab.paths import METRICS
from depthlab.runfolder import read_metrics


def run(args: list[str], **kw):
    cmd = [sys.executable, "-m", "depthlab", "train", "--no-progress", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="picks the kill step")
    ap.add_argument("--json", default="benchmarks/results/kill_resume.json")
    a = ap.parse_args()
    t0 = time.time()
    kill_at = random.Random(a.seed).randint(a.steps // 4, 3 * a.steps // 4)
    common = ["--max-steps", str(a.steps), "--set", "train.log_every=1", "--set", f"train.ckpt_every={a.ckpt_every}",
              "--set", "data.builtin_mb=1"]
    with tempfile.TemporaryDirectory() as tmp:
        ref, cut = Path(tmp) / "ref", Path(tmp) / "cut"
        assert run(["--run-dir", str(ref), *common]).wait() == 0
        proc = run(["--run-dir", str(cut), "--resume", "auto", *common])
        while proc.poll() is None:
            if (cut / METRICS).exists() and len(read_metrics(cut)) >= kill_at:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        proc.wait()
        killed_after = max(losses(cut))
        resumed = run(["--run-dir", str(cut), "--resume", "auto", *common])
        assert resumed.wait() == 0, resumed.stderr.read()
        a_l, b_l = losses(ref), losses(cut)
    same = [s for s in a_l if a_l[s] == b_l.get(s)]
    result = {"steps": a.steps, "ckpt_every": a.ckpt_every, "killed_after_step": killed_after,
              "resumed_from_step": killed_after // a.ckpt_every * a.ckpt_every,
              "steps_bitwise_equal": len(same), "max_abs_diff": max(abs(a_l[s] - b_l[s]) for s in a_l),
              "wall_s": round(time.time() - t0, 1), "command": "python " + " ".join(sys.argv),
              "threads": os.environ.get("OMP_NUM_THREADS", "default")}
    print(json.dumps(result, indent=2))
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
