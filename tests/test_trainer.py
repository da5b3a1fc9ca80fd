"""Trainer: exact resume after SIGKILL, checkpoint integrity, guards, depth monitors, DDP and FSDP2 on gloo."""

import errno
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from depthlab import UserError
from depthlab.checkpoint import WEIGHTS, CorruptCheckpoint, list_checkpoints, verify_checkpoint
from depthlab.config import Config, apply_overrides
from depthlab.loading import load_checkpoint
from depthlab.model import Transformer, lm_loss
from depthlab.paths import find_checkpoint
from depthlab.runfolder import read_metrics
from depthlab.train.callbacks import Callback, DepthMonitor
from depthlab.train.trainer import Trainer, TrainingDiverged

TINY = {"model.dim": 32, "model.n_layers": 3, "model.n_heads": 2, "model.ffn_dim": 64, "model.vocab_size": 300,
        "data.seq_len": 32, "train.eval_every": 1000, "train.log_every": 1, "train.warmup_steps": 2,
        "train.monitor_every": 0, "train.batch_size": 4}


def sets(**extra):
    out = []
    for k, v in {**TINY, **{k.replace("__", "."): v for k, v in extra.items()}}.items():
        out += ["--set", f"{k}={v}"]
    return out


def cli(*args, torchrun: int = 0, **popen):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(torchrun)] if torchrun else \
        [sys.executable]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [*launcher, "-m", "depthlab", "train", "--no-progress", *map(str, args)]
    if popen:
        return subprocess.Popen(cmd, env=env, **popen)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir)}


def make_cfg(corpus, **extra) -> Config:
    return apply_overrides(Config(), [f"{k}={v}" for k, v in {**TINY, "data.paths": f"[{corpus}]", **extra}.items()])


@pytest.mark.slow
def test_sigkill_then_resume_reproduces_losses_bitwise(tmp_path, corpus, extra=None):
    """(tests/test_muon.py runs it again with `extra` settings.)"""
    args = ["--data", corpus, "--max-steps", 40, *sets(train__ckpt_every=5, train__keep_last=2, **(extra or {}))]
    ref = cli("--run-dir", tmp_path / "ref", *args)
    assert ref.returncode == 0, ref.stderr

    run = tmp_path / "killed"
    proc = cli("--run-dir", run, "--resume", "auto", *args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # kill at some step past the second checkpoint
        if (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 13:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = max(losses(run))
    assert killed_at < 40, "the run finished before it could be killed"
    assert len(list_checkpoints(run)) <= 2  # keep_last

    res = cli("--run-dir", run, "--resume", "auto", *args)
    assert res.returncode == 0, res.stderr
    assert "resuming" in res.stderr
    expect, got = losses(tmp_path / "ref"), losses(run)
    assert list(got) == list(range(1, 41))  # no step logged twice, none missing
    assert got == expect  # bitwise: same floats, step for step
    final = lambda d: verify_checkpoint(list_checkpoints(d)[-1]).val["val_loss"]  # noqa: E731
    assert final(run) == final(tmp_path / "ref")


# What carries state from one optimizer step to the next besides the weights and the optimizer, by the config that
# turns it on: the optimizer's step hooks (by the function that registers them) and the trainer's callbacks.
STEP_STATE = {"advance_prores": {"model.prores_steps": 2}, "DepthMonitor": {"train.monitor_every": 2}}
# callbacks that only read the run (loggers, golden's loss recorder, the study's probes of the live model): what they
# see is the model at each step's start, which the resume test below compares too
READERS = {"TensorBoardLogger", "WandbLogger", "TrackioLogger", "Record", "_ProbeAlong",
           "_watch_step"}  # _watch_step: memtrack's measurement of a Muon step, never in a training run


class Fingerprint(Callback):
    """The model's whole state (weights and buffers: a ProRes ramp) at the start of every step."""

    def __init__(self):
        self.seen: dict[int, list] = {}

    def on_step_start(self, trainer, step: int) -> None:
        self.seen[step] = [v.clone() for v in trainer.module.state_dict().values()]


def _train_seen(cfg, run_dir, resume=None) -> dict[int, list]:
    trainer = Trainer(cfg, run_dir=run_dir, resume=resume, progress=False, callbacks=[seen := Fingerprint()])
    try:
        trainer.train()
    finally:
        trainer.close()
    return seen.seen


@pytest.mark.parametrize("extra", [{}, *STEP_STATE.values()], ids=["plain", *STEP_STATE])
def test_a_run_resumed_in_one_process_is_the_run_it_continues(tmp_path, corpus, extra):
    """Loading the optimizer takes a step at lr 0 (torch's set_optimizer_state_dict), which fires its step hooks:
    whatever they keep must be the checkpoint's again, or the first resumed step is another run's (ProRes's ramps
    were all reset to step 1)."""
    cfg = make_cfg(corpus, **{"train.max_steps": 6, "train.ckpt_every": 3, "train.keep_last": 3, **extra})
    ref = _train_seen(cfg, tmp_path / "ref")
    resumed = _train_seen(cfg, tmp_path / "resumed", resume=str(list_checkpoints(tmp_path / "ref")[0]))
    assert list(resumed) == [4, 5, 6]
    for step, state in resumed.items():
        assert all(torch.equal(a, b) for a, b in zip(state, ref[step], strict=True)), step
    keep = lambda d: [{k: v for k, v in r.items() if k in ("loss", "grad_norm") or k.startswith("depth/")}  # noqa: E731
                      for r in read_metrics(d)]
    assert keep(tmp_path / "resumed") == keep(tmp_path / "ref")  # bitwise, step 4 included


def test_every_step_hook_and_callback_has_a_resume_case():
    """A new optimizer step hook or callback must join STEP_STATE (and so the resume test) or READERS."""
    import ast
    import re

    import depthlab

    found = set()
    for path in Path(depthlab.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("Callback") for b in node.bases):
                found.add(node.name)
            elif isinstance(node, ast.FunctionDef) and any(
                    isinstance(c, ast.Call) and re.search(r"register_(optimizer_)?step_(pre|post)_hook", ast.unparse(
                        c.func)) for c in node.body for c in ast.walk(c)):
                found.add(node.name)
    assert "advance_prores" in found and "DepthMonitor" in found
    assert found <= set(STEP_STATE) | READERS, found - set(STEP_STATE) - READERS


def test_loading_the_optimizer_keeps_what_a_step_hook_keeps_in_the_model(tmp_path):
    """The mechanism, for any step hook (here a step counter in a buffer), in both checkpoint formats."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from depthlab.checkpoint import SHARDS, load_sharded_state
    from depthlab.train.distributed import full_optimizer_state, load_full_state
    from depthlab.train.optim import make_optimizer

    def counted():
        torch.manual_seed(0)
        model = Transformer(Config().model.__class__(vocab_size=50, dim=16, n_layers=2, n_heads=2, ffn_dim=32,
                                                     max_seq_len=8))
        model.register_buffer("steps_seen", torch.zeros(()))
        opt = make_optimizer(model, Config())
        opt.register_step_post_hook(lambda *_: model.steps_seen.add_(1))
        return model, opt

    model, opt = counted()
    for _ in range(2):
        model(torch.randint(0, 50, (2, 8)), targets=torch.randint(0, 50, (2, 8))).backward()
        opt.step()
        opt.zero_grad()
    assert model.steps_seen.item() == 2
    full = counted()
    load_full_state(*full, model.state_dict(), full_optimizer_state(model, opt))
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(dict(zip(("model", "optim"), get_state_dict(model, opt))), checkpoint_id=str(tmp_path / SHARDS))
    sharded = counted()
    load_sharded_state(tmp_path, *sharded)
    for again, opt_again in (full, sharded):
        assert again.steps_seen.item() == 2
        assert opt_again.state_dict()["state"][0]["step"].item() == 2


@pytest.mark.slow
def test_resume_refuses_a_different_config_and_lists_differences(tmp_path, corpus):
    run = tmp_path / "run"
    assert cli("--run-dir", run, "--data", corpus, "--max-steps", 4, *sets()).returncode == 0
    res = cli("--run-dir", run, "--resume", "auto", "--data", corpus, "--max-steps", 4,
              *sets(model__dim=64, train__lr=0.01))
    assert res.returncode == 2
    assert "model.dim: 32 -> 64" in res.stderr and "train.lr: 0.003 -> 0.01" in res.stderr
    # operational fields may change
    res = cli("--run-dir", run, "--resume", "auto", "--data", corpus, "--max-steps", 4, *sets(train__log_every=2))
    assert res.returncode == 0, res.stderr
    # a fresh run refuses to write into a directory that already holds checkpoints
    res = cli("--run-dir", run, "--data", corpus, "--max-steps", 4, *sets())
    assert res.returncode == 2 and "--resume auto" in res.stderr


def test_resume_auto_knows_one_file_by_another_path_and_refuses_another_file(tmp_path, corpus, monkeypatch):
    """data.paths are compared as files: a relative path from another directory or a link to the same file
    resumes; another file (even an identical copy) is refused in one line."""
    import contextlib
    import io

    from depthlab.cli import main

    (tmp_path / "data").mkdir()
    (tmp_path / "sub").mkdir()
    shutil.copy(corpus, tmp_path / "data" / "c.txt")
    shutil.copy(corpus, tmp_path / "data" / "copy.txt")
    (tmp_path / "sub" / "link.txt").symlink_to(tmp_path / "data" / "c.txt")
    args = ["--run-dir", str(tmp_path / "run"), "--resume", "auto", "--max-steps", "4", "--no-progress",
            *map(str, sets(train__ckpt_every=2))]

    def train(cwd: Path, *data: str) -> tuple[int, str]:
        monkeypatch.chdir(cwd)
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(["train", *(["--data", *data] if data else []), *args])
        return code, err.getvalue()

    assert train(tmp_path, "data/c.txt")[0] == 0  # a relative path, recorded with the directory it starts from
    reference = losses(tmp_path / "run")
    for cwd, data in ((tmp_path / "sub", ["../data/c.txt"]), (tmp_path / "sub", ["link.txt"]),
                      (tmp_path / "sub", [])):  # no --data: the run's own paths, from where they were given
        shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_0000004")
        code, err = train(cwd, *data)
        assert code == 0 and "resuming" in err and "step 2" in err, err
        assert losses(tmp_path / "run") == pytest.approx(reference, abs=1e-6)
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_0000004")
    code, err = train(tmp_path, "data/copy.txt")
    assert code == 2 and err.count("\n") == 1 and "different config: data.paths:" in err and "copy.txt" in err, err


@pytest.mark.slow
def test_corrupted_checkpoint_is_reported_and_previous_used(tmp_path, corpus):
    run = tmp_path / "run"
    assert cli("--run-dir", run, "--data", corpus, "--max-steps", 6, *sets(train__ckpt_every=3)).returncode == 0
    first, last = list_checkpoints(run)
    blob = bytearray((last / WEIGHTS).read_bytes())
    blob[-10] ^= 0xFF
    (last / WEIGHTS).write_bytes(bytes(blob))
    with pytest.raises(CorruptCheckpoint, match=f"does not match its checksum.*previous valid checkpoint is {first}"):
        load_checkpoint(last)
    assert find_checkpoint(run) == first  # run-level lookups fall back to the newest valid one
    res = cli("--run-dir", run, "--resume", "auto", "--data", corpus, "--max-steps", 6, *sets(train__ckpt_every=3))
    assert res.returncode == 0, res.stderr
    assert "skipping corrupted checkpoint" in res.stderr and "resuming" in res.stderr and "step 3" in res.stderr


class PoisonGrad(Callback):
    """Fault injection: a NaN gradient on one step, as a bad batch would produce."""

    def __init__(self, step):
        self.step, self.fired = step, False

    def on_after_backward(self, trainer, step):
        if step == self.step and not self.fired:  # once: a skipped step retries with the next batch
            self.fired = True
            next(trainer.module.parameters()).grad[0] = float("nan")


def test_nonfinite_gradient_stops_naming_step_and_checkpoint(tmp_path, corpus):
    cfg = make_cfg(corpus, **{"train.max_steps": 8, "train.ckpt_every": 2})
    trainer = Trainer(cfg, run_dir=tmp_path / "run", callbacks=[PoisonGrad(5)], progress=False)
    msg = r"non-finite gradient norm at step 5; last good checkpoint: .*step_0000004"
    with pytest.raises(TrainingDiverged, match=msg):
        trainer.train()


def test_nonfinite_skip_mode_counts_and_finishes(tmp_path, corpus):
    cfg = make_cfg(corpus, **{"train.max_steps": 6, "train.on_nonfinite": "skip"})
    trainer = Trainer(cfg, run_dir=tmp_path / "run", callbacks=[PoisonGrad(3)], progress=False)
    result = trainer.train()
    assert result.steps == 6 and trainer.skipped == 1
    records = list(map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()))
    assert records[-1]["skipped"] == 1 and all(torch.isfinite(p).all() for p in trainer.module.parameters())


def test_nonfinite_weights_are_never_saved(tmp_path, corpus):
    trainer = Trainer(make_cfg(corpus), run_dir=tmp_path / "run", progress=False)
    with torch.no_grad():
        trainer.module.lm_head.weight[0, 0] = float("inf")
    with pytest.raises(TrainingDiverged, match="refusing to save non-finite weights"):
        trainer.save()
    assert not list_checkpoints(tmp_path / "run")


def test_failed_save_leaves_previous_checkpoint_intact(tmp_path, corpus, monkeypatch):
    trainer = Trainer(make_cfg(corpus, **{"train.max_steps": 4, "train.ckpt_every": 2}), run_dir=tmp_path / "run",
                      progress=False)
    import safetensors.torch

    real_save = safetensors.torch.save_file
    calls = []

    def disk_full(*a, **k):  # the second save hits a full disk
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(*a, **k)

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    with pytest.raises(UserError, match="cannot write checkpoint .*the disk is full.*earlier checkpoints are intact"):
        trainer.train()
    (only,) = list_checkpoints(tmp_path / "run")
    assert only.name == "step_0000002" and verify_checkpoint(only).step == 2
    assert not list((tmp_path / "run" / "checkpoints").glob("*.tmp"))


def test_depth_monitor_matches_hidden_states():
    torch.manual_seed(0)
    model = Transformer(Config().model.__class__(vocab_size=50, dim=32, n_layers=4, n_heads=2, ffn_dim=64,
                                                 max_seq_len=16, norm_scheme="pre"))
    with torch.no_grad():  # block 2 writes nothing into the stream: its update ratio must be exactly 0
        model.layers[1].attn.o_proj.weight.zero_()
        model.layers[1].mlp.down_proj.weight.zero_()
    holder = type("T", (), {"layers": model.layers})()
    mon = DepthMonitor(every=1)
    idx = torch.randint(0, 50, (2, 16))
    mon.on_step_start(holder, 1)
    logits, hidden = model(idx, return_hidden=True)
    lm_loss(logits[:, :-1], idx[:, 1:]).backward()
    mon.on_after_backward(holder, 1)
    record = {}
    mon.on_log(holder, 1, record)
    for l in range(4):
        h_in, h_out = hidden[l].detach(), hidden[l + 1].detach()
        assert record["depth/var"][l] == pytest.approx(h_out.var().item(), rel=1e-4)
        assert record["depth/rms"][l] == pytest.approx(h_out.pow(2).mean().sqrt().item(), rel=1e-4)
        per_token = (h_out - h_in).norm(dim=-1) / h_in.norm(dim=-1)  # the analysis' update_ratio (docs/training.md)
        assert record["depth/update_ratio"][l] == pytest.approx(per_token.mean().item(), rel=1e-4)
        grads = [p.grad.flatten() for p in model.layers[l].parameters() if p.grad is not None]
        assert record["depth/grad_norm"][l] == pytest.approx(torch.cat(grads).norm().item(), rel=1e-4)
    assert record["depth/update_ratio"][1] == 0.0
    assert all(not layer._forward_hooks for layer in model.layers)  # hooks live only on monitor steps


def test_depth_monitor_logs_every_n_steps(tmp_path, corpus):
    trainer = Trainer(make_cfg(corpus, **{"train.max_steps": 4, "train.monitor_every": 2}), run_dir=tmp_path / "r",
                      progress=False)
    trainer.train()
    records = list(map(json.loads, (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()))
    assert [("depth/var" in r) for r in records] == [False, True, False, True]
    assert all(len(r["depth/update_ratio"]) == 3 for r in records if "depth/var" in r)
    env = json.loads((tmp_path / "r" / "env.json").read_text())
    assert env["torch"] == torch.__version__ and env["world_size"] == 1
    assert 0 < records[-1]["mfu"] < 1


@pytest.mark.slow
def test_ddp_two_ranks_match_one_process(tmp_path, corpus, extra=None, tol=1e-5):
    """(tests/test_muon.py runs it again with `extra` settings and its tolerance.)"""
    common = ["--data", corpus, "--max-steps", 4]
    one = cli("--run-dir", tmp_path / "one", *common, *sets(train__batch_size=4, train__grad_accum=2, **(extra or {})))
    two = cli("--run-dir", tmp_path / "two", *common, *sets(train__batch_size=2, train__grad_accum=2, **(extra or {})),
              torchrun=2)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert list(a) == list(b) == [1, 2, 3, 4]
    assert all(abs(a[s] - b[s]) < tol for s in a), (a, b)
    assert two.stdout.count("run directory:") == 1  # rank 0 reports


@pytest.mark.slow
def test_fsdp_trains_checkpoints_and_resumes_on_another_rank_count(tmp_path, corpus, extra=None, tol=1e-5):
    """(tests/test_muon.py runs it again with `extra` settings and its tolerance.)"""
    args = ["--data", corpus, "--max-steps", 6, *sets(**(extra or {}))]
    ref = cli("--run-dir", tmp_path / "ref", *args, *sets(train__batch_size=4, train__grad_accum=2))
    fsdp = cli("--run-dir", tmp_path / "fsdp", *args, *sets(train__batch_size=2, train__grad_accum=2,
                                                             train__parallel="fsdp", train__ckpt_every=3), torchrun=2)
    assert ref.returncode == 0 and fsdp.returncode == 0, ref.stderr + fsdp.stderr
    a, b = losses(tmp_path / "ref"), losses(tmp_path / "fsdp")
    assert all(abs(a[s] - b[s]) < tol for s in a), (a, b)

    # resume the 2-rank run's step-3 checkpoint in one process: same global batch (1 x 4 = 2 x 2 sequences)
    import shutil

    single = tmp_path / "single"
    shutil.copytree(tmp_path / "fsdp", single)
    shutil.rmtree(single / "checkpoints" / "step_0000006")
    bad = cli("--run-dir", single, "--resume", "auto", *args, *sets(train__batch_size=2, train__grad_accum=2))
    assert bad.returncode == 2 and "global batch" in bad.stderr
    resumed = cli("--run-dir", single, "--resume", "auto", *args,
                  *sets(train__batch_size=4, train__grad_accum=2, train__ckpt_every=3))
    assert resumed.returncode == 0, resumed.stderr
    c = losses(single)
    assert list(c) == [1, 2, 3, 4, 5, 6]
    assert all(abs(b[s] - c[s]) < tol for s in range(4, 7)), (b, c)


@pytest.mark.slow
def test_unwritable_output_is_a_clear_error(tmp_path, corpus):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    res = cli("--data", corpus, "--out", blocker / "runs", "--max-steps", 2, *sets())
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and last.startswith("depthlab: error: cannot write to run")


def test_activation_checkpointing_gives_the_same_losses(tmp_path, corpus):
    runs = {}
    for ac in (False, True):
        cfg = make_cfg(corpus, **{"train.max_steps": 3, "train.activation_checkpointing": ac})
        Trainer(cfg, run_dir=tmp_path / str(ac), progress=False).train()
        runs[ac] = losses(tmp_path / str(ac))
    assert all(abs(runs[True][s] - runs[False][s]) < 1e-6 for s in (1, 2, 3)), runs


def test_bf16_autocast_trains(tmp_path, corpus):
    cfg = make_cfg(corpus, **{"train.max_steps": 3, "train.dtype": "bf16", "train.eval_every": 3})
    result = Trainer(cfg, run_dir=tmp_path / "r", progress=False).train()
    assert math.isfinite(result.val_loss) and result.val_loss < math.log(300)


def test_missing_optional_logger_is_a_clear_error(tmp_path, corpus):
    try:
        import tensorboard  # noqa: F401
        pytest.skip("tensorboard is installed here")
    except ImportError:
        pass
    with pytest.raises(UserError, match="pip install tensorboard"):
        Trainer(make_cfg(corpus, **{"train.tensorboard": True}), run_dir=tmp_path / "r", progress=False)


@pytest.mark.slow
def test_init_from_continues_pretraining_with_another_scheme(tmp_path, corpus):
    base = cli("--run-dir", tmp_path / "base", "--scheme", "pre", "--data", corpus, "--max-steps", 6, *sets())
    assert base.returncode == 0, base.stderr
    ckpt = list_checkpoints(tmp_path / "base")[-1]
    res = cli("--run-dir", tmp_path / "cont", "--init-from", ckpt, "--scheme", "lns", "--data", corpus,
              "--max-steps", 2, "--set", "train.log_every=1", "--set", "train.warmup_steps=1")
    assert res.returncode == 0, res.stderr
    assert "starting from the weights" in res.stderr
    model, cfg, _ = load_checkpoint(tmp_path / "cont")
    assert cfg.model.norm_scheme == "lns" and cfg.model.dim == 32 and cfg.train.init_from == str(ckpt)
    # the same tokenizer as the checkpoint it started from, and its loss starts where that one ended, not at log(V)
    assert (tmp_path / "cont" / "tokenizer.json").read_text() == (ckpt / "tokenizer.json").read_text()
    assert losses(tmp_path / "cont")[1] < losses(tmp_path / "base")[1] - 0.5
    bad = cli("--run-dir", tmp_path / "bad", "--init-from", ckpt, "--scheme", "sandwich", "--data", corpus,
              "--max-steps", 2)
    assert bad.returncode == 2 and "cannot start from" in bad.stderr


def test_the_trainer_asks_its_task(tmp_path, corpus):
    """What a run trains on, validates with and records in a checkpoint is its task's; the default is the config's."""
    from depthlab.train.tasks import LanguageModelling

    class Counted(LanguageModelling):  # a task of its own: validation and checkpoint meta are what it says
        def data_meta(self, data):
            return {**super().data_meta(data), "task": "counted"}

        def validation(self, cfg, model, data, env, device, progress):
            return {**super().validation(cfg, model, data, env, device, progress), "val_counted": 1.0}

    cfg = make_cfg(corpus, **{"train.max_steps": 2})
    plain = Trainer(cfg, run_dir=tmp_path / "plain", progress=False)
    assert type(plain.task) is LanguageModelling
    plain.close()
    t = Trainer(cfg, run_dir=tmp_path / "counted", progress=False, task=Counted())
    try:
        result = t.train()
    finally:
        t.close()
    assert result.val["val_counted"] == 1.0 and read_metrics(tmp_path / "counted")[-1]["val_counted"] == 1.0
    data = verify_checkpoint(result.checkpoint).data  # the task's record of its data
    assert data["task"] == "counted" and data["train_tokens"] > 0 and "val_digest" in data
