"""The command line as a user meets it: real subprocesses, real files, real (tiny) training."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from depthlab.loading import load_checkpoint

pytestmark = pytest.mark.slow

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "shakespeare"
TINY = ["--set", "model.dim=32", "--set", "model.n_layers=3", "--set", "model.n_heads=2", "--set", "model.ffn_dim=64",
        "--set", "model.vocab_size=300", "--set", "data.seq_len=32", "--set", "train.batch_size=4",
        "--set", "train.eval_every=4", "--set", "train.log_every=2", "--set", "train.warmup_steps=2", "--no-progress"]


def depthlab(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "depthlab", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def assert_user_error(res, *fragments):
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("depthlab: error:"), res.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.fixture
def text_file(tmp_path):
    f = tmp_path / "a.txt"
    line = "Line {}: the quick brown fox jumps over the lazy dog, again and again.\n"
    f.write_text("".join(line.format(i) for i in range(400)))
    return f


def test_help_for_every_command():
    for args in ([], ["--help"], ["train", "--help"], ["eval", "--help"], ["eval", "ppl", "--help"], ["schemes"]):
        res = depthlab(*args)
        assert res.returncode == 0 and res.stdout.strip(), (args, res.stderr)
    assert "--set" in depthlab("train", "--help").stdout
    assert "lns" in depthlab("schemes").stdout


def test_bad_input_is_one_line_exit_2(tmp_path, text_file):
    assert_user_error(depthlab("train", "--scheme", "LNS"), "unknown norm scheme", "pre, lns, post")
    assert_user_error(depthlab("train", "--set", "model.n_heads=5"), "does not divide")
    assert_user_error(depthlab("train", "--preset", "gpt5"), "unknown preset")
    assert_user_error(depthlab("train", "--set", "model.depth=3"), "unknown config key")
    assert_user_error(depthlab("train", "--data", tmp_path / "missing.txt"), "does not exist")
    (tmp_path / "empty.txt").write_text("")
    assert_user_error(depthlab("train", "--data", tmp_path / "empty.txt"), "no usable text", "empty file")
    (tmp_path / "bin.txt").write_bytes(bytes(range(256)) * 10)
    assert_user_error(depthlab("train", "--data", tmp_path / "bin.txt"), "binary")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") * 50)
    assert_user_error(depthlab("train", "--data", tmp_path / "latin1.txt"), "not valid UTF-8")
    assert_user_error(depthlab("train", "--data", tmp_path / "latin1.txt", "--set", "data.fatal_bad_files=true"),
                      "latin1.txt", "UTF-8")
    assert_user_error(depthlab("eval", "ppl", tmp_path), "neither a checkpoint nor a run directory")


def test_train_end_to_end_and_reload_keeps_scheme(tmp_path, text_file):
    res = depthlab("train", "--scheme", "lns", "--data", text_file, "--out", tmp_path / "runs", "--max-steps", 8, *TINY)
    assert res.returncode == 0, res.stderr
    run_dir = Path(res.stdout.split("run directory:")[1].split()[0])
    assert "perplexity" in res.stdout
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["model"]["norm_scheme"] == "lns" and cfg["model"]["n_layers"] == 3
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6, 8]
    assert all({"step", "loss", "lr", "tokens_per_s"} <= set(r) for r in records)
    assert {"val_loss", "val_ppl"} <= set(records[1]) and {"val_loss", "val_ppl"} <= set(records[-1])
    assert records[-1]["val_loss"] < records[0]["loss"]  # it learned something
    model, loaded_cfg, meta = load_checkpoint(run_dir)
    assert loaded_cfg.model.norm_scheme == "lns"  # the reference code silently reloads LNS as Pre-LN
    assert model.layers[2].attn_norm.scale == pytest.approx(3 ** -0.5)
    assert meta.step == 8 and meta.val["val_ppl"] == pytest.approx(records[-1]["val_ppl"])
    # eval on the run's own validation split reproduces the final val loss
    res = depthlab("eval", "ppl", run_dir)
    assert res.returncode == 0, res.stderr
    assert f"loss {records[-1]['val_loss']:.4f}" in res.stdout


@pytest.mark.skipif(not SHAKESPEARE.is_dir(), reason="../shared/data/shakespeare not present")
def test_train_on_shakespeare_folder_then_eval_other_text(tmp_path):
    res = depthlab("train", "--scheme", "pre", "--data", SHAKESPEARE / "sonnets_gut.txt",
                   SHAKESPEARE / "macbeth_gut.txt",
                   "--out", tmp_path, "--max-steps", 4, *TINY)
    assert res.returncode == 0, res.stderr
    run_dir = res.stdout.split("run directory:")[1].split()[0]
    res = depthlab("eval", "ppl", run_dir, "--data", SHAKESPEARE / "tempest_gut.txt")
    assert res.returncode == 0, res.stderr
    ppl = float(res.stdout.split("perplexity")[1].split()[0])
    assert 1 < ppl < 300 * 2  # a 300-token vocabulary: better than uniform after 4 steps is not guaranteed, sane is


def test_checkpoint_weights_are_safetensors_not_pickle(tmp_path, text_file):
    res = depthlab("train", "--data", text_file, "--out", tmp_path, "--max-steps", 2, *TINY)
    assert res.returncode == 0, res.stderr
    ckpt = next(tmp_path.glob("*/checkpoints/step_*"))
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "meta.json", "model.safetensors", "tokenizer.json",
                                                      "trainer.pt"]
    from safetensors.torch import load_file

    assert all(isinstance(v, torch.Tensor) for v in load_file(ckpt / "model.safetensors").values())
    state = torch.load(ckpt / "trainer.pt", weights_only=True)  # optimizer, scheduler, RNG: no arbitrary pickle
    assert {"optimizer", "scheduler", "rng"} <= set(state)


def test_prepare_then_train_then_eval_on_prepared_data(tmp_path, text_file):
    docs = tmp_path / "docs"
    docs.mkdir()
    lines = text_file.read_text().splitlines(keepends=True)
    for i in range(40):  # held out by document: every 20th document goes to validation
        (docs / f"{i:02d}.txt").write_text("".join(lines[i * 10:(i + 1) * 10]))
    res = depthlab("data", "prepare", docs, "--out", tmp_path / "prep", "--vocab-size", 300, "--no-progress")
    assert res.returncode == 0, res.stderr
    res = depthlab("train", "--data", tmp_path / "prep", "--run-dir", tmp_path / "run", "--max-steps", 4, *TINY)
    assert res.returncode == 0, res.stderr
    final = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    res = depthlab("eval", "ppl", tmp_path / "run", "--data", tmp_path / "prep")  # the prepared validation split
    assert res.returncode == 0, res.stderr
    assert f"loss {final['val_loss']:.4f}" in res.stdout
