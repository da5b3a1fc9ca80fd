"""Training a ViT through the same CLI and trainer: scikit-learn's digits, top-1 accuracy as the metric, exact
resume after SIGKILL, depth monitors, `depthlab eval` on the run."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from depthlab import UserError
from depthlab.checkpoint import list_checkpoints, verify_checkpoint
from depthlab.config import apply_overrides
from depthlab.model.families import preset
from depthlab.train.trainer import Trainer, train

SMALL = ["model.dim=64", "model.n_layers=4", "model.n_heads=4", "model.ffn_dim=128", "train.batch_size=32",
         "train.log_every=1", "train.warmup_steps=5"]


def cli(*args, **popen):
    cmd = [sys.executable, "-m", "depthlab", *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if popen:
        return subprocess.Popen(cmd, env=env, **popen)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def sets(*kv):
    return [a for x in (*SMALL, *kv) for a in ("--set", x)]


def losses(run_dir):
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_vit_digits_trains_and_reports_accuracy(tmp_path):
    cfg = apply_overrides(preset("vit-digits"), [*SMALL, "train.max_steps=60", "train.eval_every=30",
                                                   "train.monitor_every=30"])
    res = train(cfg, run_dir=tmp_path / "run", progress=False)
    assert res.val["val_images"] == 359 and res.val["val_acc"] > 0.2  # chance is 0.1
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "val_acc" in r]
    assert [r["step"] for r in evals] == [30, 60] and evals[0]["val_loss"] > evals[1]["val_loss"]
    assert len(evals[-1]["depth/update_ratio"]) == 4  # the per-block monitors run on a ViT too
    data = verify_checkpoint(res.checkpoint).data
    assert data["train_images"] == 1438 and len(data["classes"]) == 10 and len(data["pixel_mean"]) == 1
    assert not (tmp_path / "run" / "tokenizer.json").exists()


@pytest.mark.slow
def test_vit_sigkill_then_resume_reproduces_losses_bitwise(tmp_path):
    args = ["train", "--no-progress", "--preset", "vit-digits", "--max-steps", 30,
            *sets("train.ckpt_every=5", "train.keep_last=2", "train.eval_every=15")]
    ref = cli(*args, "--run-dir", tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr
    assert "top-1 accuracy" in ref.stdout
    run = tmp_path / "killed"
    proc = cli(*args, "--run-dir", run, "--resume", "auto", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # kill past the second checkpoint
        if (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 12:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert max(losses(run)) < 30, "the run finished before it could be killed"
    res = cli(*args, "--run-dir", run, "--resume", "auto")
    assert res.returncode == 0, res.stderr
    assert "resuming" in res.stderr
    assert list(losses(run)) == list(range(1, 31)) and losses(run) == losses(tmp_path / "ref")
    final = lambda d: verify_checkpoint(list_checkpoints(d)[-1]).val  # noqa: E731
    assert (final(run)["val_loss"], final(run)["val_acc"]) == (final(tmp_path / "ref")["val_loss"],
                                                               final(tmp_path / "ref")["val_acc"])
    ev = cli("eval", "images", tmp_path / "ref")  # the run's own validation split, the same number as training's last
    assert ev.returncode == 0, ev.stderr
    assert f"loss {final(run)['val_loss']:.4f}  top-1 accuracy {final(run)['val_acc']:.4f}  images 359" in ev.stdout
    import numpy as np

    rng = np.random.default_rng(0)  # images whose labels the 10-class head cannot have
    np.savez(tmp_path / "more.npz", x=rng.random((40, 8, 8), np.float32), y=np.arange(40) % 12)
    ev = cli("eval", "images", tmp_path / "ref", "--data", tmp_path / "more.npz")
    assert ev.returncode == 2 and ev.stderr.count("\n") == 1 and "but the model has 10 classes" in ev.stderr, ev.stderr


def test_vit_needs_as_many_classes_as_the_data(tmp_path):
    cfg = apply_overrides(preset("vit-digits"), [*SMALL, "model.num_classes=5"])
    with pytest.raises(UserError, match="10 classes but model.num_classes is 5"):
        Trainer(cfg, run_dir=tmp_path / "r")  # model.family=vit: the image classification task
