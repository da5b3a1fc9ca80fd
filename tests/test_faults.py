"""Faults a user's work must survive: two writers at once, corrupted newest checkpoints with keep_last, a kill
during a checkpoint save or a data prepare, a half-written metrics line, a full disk, and resuming elsewhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from depthlab.checkpoint import list_checkpoints, verify_checkpoint
from depthlab.cli import main
from depthlab.paths import LOCK_SUFFIX
from depthlab.train.callbacks import Callback
from depthlab.train.trainer import Trainer
from tests.test_trainer import TINY, losses, make_cfg

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TRAIN = [f"--set={k}={v}" for k, v in TINY.items()] + ["--no-progress"]


def run_main(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err.strip()


def spawn(code: str, *args) -> subprocess.Popen:
    """A Python subprocess running `code` (with depthlab importable), stdout/stderr to pipes."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        assert proc is None or proc.poll() is None, proc.communicate()
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


class StopAt(Callback):
    """Interrupts training before the given step, as a kill would."""

    def __init__(self, step: int):
        self.step = step

    def on_step_start(self, trainer, step):
        if step == self.step:
            raise KeyboardInterrupt


def train_in_process(cfg, run_dir, resume=None, stop_at=None):
    trainer = Trainer(cfg, run_dir=run_dir, resume=resume, progress=False,
                      callbacks=[StopAt(stop_at)] if stop_at else None)
    try:
        return trainer.train()
    finally:
        trainer.close()


# ---------------------------------------------------------------- one writer at a time
@pytest.mark.slow
def test_second_writer_fails_naming_the_pid_and_sigkill_releases_the_lock(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-m", "depthlab", "train", "--run-dir", str(run), "--resume", "auto",
                               "--data", str(corpus), "--max-steps", "100000", *TRAIN], env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (run / "metrics.jsonl").is_file(), proc=holder)
        config_before = (run / "config.json").read_text()
        code, err = run_main(capsys, "train", "--run-dir", run, "--resume", "auto", "--data", corpus,
                             "--max-steps", 4, "--set", "train.seed=5", "--set", "train.lr=0.01", *TRAIN)
        assert code == 2 and err.count("\n") == 0 and f"pid {holder.pid}" in err and "in use" in err, err
        assert (run / "config.json").read_text() == config_before  # the loser wrote nothing
        code, err = run_main(capsys, "train", "--run-dir", run, "--data", corpus, *TRAIN)
        assert code == 2 and f"pid {holder.pid}" in err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the OS released the lock with the process: the next writer continues the run
    code, err = run_main(capsys, "train", "--run-dir", run, "--resume", "auto", "--data", corpus, "--max-steps", 2,
                         *TRAIN)
    assert code == 0, err


@pytest.mark.slow
def test_every_writer_takes_the_lock(tmp_path, corpus, capsys):
    """export, prune, analyze --out, import and data prepare refuse an output another process is writing."""
    from tests.test_hf_fixtures import make_checkpoint

    make_checkpoint(tmp_path / "ckpt", "lns")
    out = tmp_path / "out"
    holder = spawn("""
        import sys, time
        from depthlab.ownership import locked
        with locked(sys.argv[1], "test"):
            print("held", flush=True)
            time.sleep(120)
    """, out)
    try:
        assert holder.stdout.readline().strip() == "held"
        for argv in (["export", tmp_path / "ckpt", out], ["prune", tmp_path / "ckpt", "--remove", "0:1", out],
                     ["analyze", tmp_path / "ckpt", "--tokens", 32, "--out", out],
                     ["data", "prepare", corpus, "--out", out, "--vocab-size", 300, "--workers", 1, "--no-progress"]):
            code, err = run_main(capsys, *argv)
            assert code == 2 and err.count("\n") == 0 and f"pid {holder.pid}, depthlab test" in err, (argv, err)
        assert not out.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (tmp_path / f".out{LOCK_SUFFIX}").exists()  # left by the killed holder: harmless, flock is released
    code, err = run_main(capsys, "export", tmp_path / "ckpt", out)
    assert code == 0, err
    assert not (tmp_path / f".out{LOCK_SUFFIX}").exists()  # removed by the next holder when it is done


# ---------------------------------------------------------------- retention
def test_corrupted_newest_checkpoints_never_push_out_valid_ones(tmp_path, corpus, capsys):
    cfg = make_cfg(corpus, **{"train.max_steps": 10, "train.ckpt_every": 1, "train.keep_last": 3})
    run = tmp_path / "run"
    train_in_process(cfg, run)
    assert [c.name[-2:] for c in list_checkpoints(run)] == ["08", "09", "10"]
    for ckpt in list_checkpoints(run):  # one byte flipped in each trainer.pt
        blob = bytearray((ckpt / "trainer.pt").read_bytes())
        blob[len(blob) // 2] ^= 0xFF
        (ckpt / "trainer.pt").write_bytes(bytes(blob))
    # no valid checkpoint: --resume auto starts over, and is killed at step 5
    with pytest.raises(KeyboardInterrupt):
        train_in_process(cfg, run, resume="auto", stop_at=6)
    assert "skipping corrupted checkpoint" in capsys.readouterr().err
    valid = [c.name[-2:] for c in list_checkpoints(run) if (c / "meta.json").is_file() and _valid(c)]
    assert valid == ["03", "04", "05"]  # the corrupted 8-10 did not count as the newest three
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5]
    result = train_in_process(cfg, run, resume="auto")  # from step 5; 8-10 are rewritten
    assert result.steps == 10 and [c.name[-2:] for c in list_checkpoints(run)] == ["08", "09", "10"]
    assert all(_valid(c) for c in list_checkpoints(run))
    assert list(losses(run)) == list(range(1, 11))  # each step once


def _valid(ckpt: Path) -> bool:
    try:
        verify_checkpoint(ckpt)
        return True
    except Exception:
        return False


def test_retention_keeps_the_newest_valid_checkpoint_when_fewer_than_keep_last(tmp_path):
    from depthlab.checkpoint import prune_checkpoints
    from tests.test_hf_fixtures import make_checkpoint

    run = tmp_path / "run"
    for step in (1, 2, 3):
        make_checkpoint(run / "checkpoints" / f"step_{step:07d}")
    (run / "checkpoints" / "step_0000003" / "model.safetensors").write_bytes(b"corrupted")
    (run / "checkpoints" / "step_0000002" / "model.safetensors").write_bytes(b"corrupted")
    assert prune_checkpoints(run, 2, {}) == []  # one valid checkpoint: nothing is deleted
    make_checkpoint(run / "checkpoints" / "step_0000004")
    assert prune_checkpoints(run, 2, {}) == []  # the two newest valid ones are 4 and 1
    make_checkpoint(run / "checkpoints" / "step_0000005")
    assert [p.name for p in prune_checkpoints(run, 2, {})] == ["step_0000001", "step_0000002", "step_0000003"]


# ---------------------------------------------------------------- kills
KILL_DURING_SAVE = """
    import os, signal, sys
    import torch
    real, calls = torch.save, []
    def save(obj, f, *a, **k):  # the third checkpoint dies half-written, as SIGKILL or a power cut leaves it
        calls.append(1)
        if len(calls) == 3:
            with open(f, "wb") as out:
                out.write(b"partial")
            os.kill(os.getpid(), signal.SIGKILL)
        return real(obj, f, *a, **k)
    torch.save = save
    from depthlab.cli import main
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_kill_during_save_leaves_no_valid_looking_checkpoint_and_resumes_exactly(tmp_path, corpus):
    args = ["--data", corpus, "--max-steps", 6, *TRAIN, "--set", "train.ckpt_every=2"]
    depthlab = [sys.executable, "-m", "depthlab", "train"]  # every run in a process of its own: same threads
    args = [str(a) for a in args]
    ref = subprocess.run([*depthlab, "--run-dir", str(tmp_path / "ref"), *args], env=ENV, capture_output=True)
    assert ref.returncode == 0, ref.stderr
    run = tmp_path / "run"
    killed = spawn(KILL_DURING_SAVE, "train", "--run-dir", run, "--resume", "auto", *args)
    killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL
    assert [c.name for c in list_checkpoints(run)] == ["step_0000002", "step_0000004"]
    assert (run / "checkpoints" / "step_0000006.tmp").is_dir()  # half-written, and not counted
    res = subprocess.run([*depthlab, "--run-dir", str(run), "--resume", "auto", *args], env=ENV,
                         capture_output=True, text=True)
    assert res.returncode == 0 and "resuming" in res.stderr and "step 4" in res.stderr, res.stderr
    assert not list((run / "checkpoints").glob("*.tmp"))
    assert losses(run) == losses(tmp_path / "ref")  # bitwise, each step once


def test_kill_between_the_renames_of_a_replaced_checkpoint_is_undone(tmp_path, corpus, capsys):
    args = ["--data", corpus, "--max-steps", 4, *TRAIN, "--set", "train.ckpt_every=2"]
    run = tmp_path / "run"
    assert run_main(capsys, "train", "--run-dir", run, *args)[0] == 0
    ckpts = run / "checkpoints"
    (ckpts / "step_0000004").rename(ckpts / "step_0000004.old")  # killed after the first os.replace
    (ckpts / "step_0000004.tmp").mkdir()  # ... before the second
    code, err = run_main(capsys, "train", "--run-dir", run, "--resume", "auto", *args)
    assert code == 0 and "step 4" in err, err
    assert [p.name for p in sorted(ckpts.iterdir())] == ["step_0000002", "step_0000004"]


def test_partial_metrics_line_is_dropped_and_reported(tmp_path, corpus, capsys):
    args = ["--data", corpus, "--max-steps", 6, *TRAIN, "--set", "train.ckpt_every=2"]
    run = tmp_path / "run"
    assert run_main(capsys, "train", "--run-dir", run, *args)[0] == 0
    import shutil

    shutil.rmtree(run / "checkpoints" / "step_0000006")  # killed before its last checkpoint ...
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "loss": 3.2')  # ... in the middle of a metrics line
    code, err = run_main(capsys, "train", "--run-dir", run, "--resume", "auto", *args)
    assert code == 0 and "its last line was cut short" in err and "step 4" in err, err
    assert list(losses(run)) == [1, 2, 3, 4, 5, 6]


def test_full_disk_during_a_checkpoint_is_one_line_and_leaves_nothing(tmp_path, corpus, capsys, monkeypatch):
    import torch

    real, calls = torch.save, []

    def full(obj, f, *a, **k):  # torch.save reports a full disk as RuntimeError, not OSError
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 5373952 vs 5373848\n"
                               "PytorchStreamWriter failed writing file data/7: file write failed")
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", full)
    run = tmp_path / "run"
    code, err = run_main(capsys, "train", "--run-dir", run, "--data", corpus, "--max-steps", 4, *TRAIN,
                         "--set", "train.ckpt_every=2")
    lines = err.splitlines()
    assert code == 2 and lines[-1].startswith("depthlab: error: cannot write checkpoint") and "Traceback" not in err
    # progress lines (stderr is not a terminal here) may come before it, but the error is one line, said once
    assert "earlier checkpoints are intact" in lines[-1] and sum("error" in line for line in lines) == 1
    assert [c.name for c in list_checkpoints(run)] == ["step_0000002"] and not list(run.rglob("*.tmp"))


@pytest.mark.slow
def test_kill_during_prepare_takes_the_workers_along_and_a_rerun_finishes(tmp_path, capsys):
    from depthlab.data.prepare import prepare
    from tests.test_data_prepare import WORDS
    from tests.test_data_sources import small_bpe

    rng = np.random.default_rng(0)
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(120):
        (raw / f"{i:03d}.txt").write_text(" ".join(rng.choice(WORDS, 24000)))  # seconds of work to kill
    small_bpe().save(str(tmp_path / "tok.json"))  # given: no BPE training before the units start
    out = tmp_path / "out"
    job = ["data", "prepare", raw, "--out", out, "--tokenizer", tmp_path / "tok.json", "--workers", 2, "--unit-mb",
           0.05, "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "depthlab", *map(str, job)], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    wait_for(lambda: list((out / ".work").glob("unit-*.json")), proc=proc)  # the workers are busy
    workers = [int(p) for p in children.read_text().split()]
    code, err = run_main(capsys, *job)
    assert code == 2 and f"pid {proc.pid}" in err, err  # a concurrent prepare into the same --out
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert workers and not (out / "index.json").exists()
    wait_for(lambda: not any(alive(w) for w in workers), timeout=30)  # no orphan goes on writing unit files
    code, err = run_main(capsys, *job)
    assert code == 0 and "resuming" in err, err
    prepare([str(raw)], tmp_path / "clean", tokenizer=str(tmp_path / "tok.json"), workers=1, progress=False,
            log=lambda m: None)
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes()


@pytest.mark.slow
def test_kill_while_the_workers_start_up_leaves_no_orphan(tmp_path):
    """A worker that is still importing when its parent dies is too late for the kernel's parent-death signal; it must
    see that it has been reparented and exit (it used to wait forever for work, holding the rerun's lock open)."""
    from tests.test_data_prepare import WORDS
    from tests.test_data_sources import small_bpe

    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(8):
        (raw / f"{i}.txt").write_text(" ".join(np.random.default_rng(i).choice(WORDS, 4000)))
    small_bpe().save(str(tmp_path / "tok.json"))
    job = ["data", "prepare", raw, "--out", tmp_path / "out", "--tokenizer", tmp_path / "tok.json", "--workers", 2,
           "--unit-mb", 0.01, "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "depthlab", *map(str, job)], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")

    def worker_started() -> bool:
        pids = children.read_text().split()
        return any(b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes() for p in pids if alive(int(p)))

    wait_for(worker_started, proc=proc)
    started = [int(p) for p in children.read_text().split()]
    proc.send_signal(signal.SIGKILL)  # at once: the worker has not got as far as its initializer
    proc.wait()
    wait_for(lambda: not any(alive(p) for p in started), timeout=30)


# ---------------------------------------------------------------- resuming elsewhere
def test_resume_path_with_run_dir_branches_and_leaves_the_source_alone(tmp_path, corpus, capsys):
    args = ["--data", corpus, *TRAIN, "--set", "train.ckpt_every=2"]
    src = tmp_path / "src"
    assert run_main(capsys, "train", "--run-dir", src, "--max-steps", 4, *args)[0] == 0
    before = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    branch = tmp_path / "branch"
    code, err = run_main(capsys, "train", "--resume", src / "checkpoints" / "step_0000002", "--run-dir", branch,
                         "--max-steps", 4, *args)
    assert code == 0 and "resuming" in err, err
    assert {p: p.read_bytes() for p in src.rglob("*") if p.is_file()} == before  # the source run is untouched
    assert losses(branch) == losses(src)  # the branch's history up to step 2, then the same steps again, exactly
    assert [c.name for c in list_checkpoints(branch)] == ["step_0000004"]


def test_a_loose_checkpoint_resumes_only_into_a_given_run_dir(tmp_path, corpus, capsys):
    args = ["--data", corpus, *TRAIN, "--set", "train.ckpt_every=2"]
    src = tmp_path / "src"
    assert run_main(capsys, "train", "--run-dir", src, "--max-steps", 4, *args)[0] == 0
    (tmp_path / "mine").mkdir()
    loose = tmp_path / "mine" / "saved"
    (src / "checkpoints" / "step_0000002").rename(loose)
    (tmp_path / "mine" / "config.json").write_text('{"my": "own file"}')
    code, err = run_main(capsys, "train", "--resume", loose, "--max-steps", 4, *args)
    assert code == 2 and "--run-dir" in err
    assert (tmp_path / "mine" / "config.json").read_text() == '{"my": "own file"}'  # never taken for a run's
    code, err = run_main(capsys, "train", "--resume", loose, "--run-dir", tmp_path / "new", "--max-steps", 4, *args)
    assert code == 0, err
    assert [c.name for c in list_checkpoints(tmp_path / "new")] == ["step_0000004"]


def test_a_run_whose_every_step_is_nonfinite_stops_instead_of_skipping_forever(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    code, err = run_main(capsys, "train", "--run-dir", run, "--data", corpus, "--max-steps", 6, *TRAIN,
                         "--set", "train.on_nonfinite=skip", "--set", "train.lr=1e30", "--set", "train.max_skips=3")
    lines = err.splitlines()
    assert code == 2 and lines[-1].startswith("depthlab: error: step ") and "Traceback" not in err
    assert "4 times in a row (train.max_skips=3); last good checkpoint: none" in lines[-1]
    assert sum("skipped step" in line for line in lines) == 3


def test_written_files_get_the_usual_permissions(tmp_path, corpus, capsys):
    umask = os.umask(0o022)
    try:
        run = tmp_path / "run"
        assert run_main(capsys, "train", "--run-dir", run, "--data", corpus, "--max-steps", 1, *TRAIN)[0] == 0
        assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    finally:
        os.umask(umask)
    ckpt = list_checkpoints(run)[-1]
    for f in [ckpt / "model.safetensors", ckpt / "meta.json", tmp_path / "hf" / "model.safetensors"]:
        assert oct(f.stat().st_mode & 0o777) == oct(0o644), f  # safetensors alone leaves 0600


def test_a_failed_file_write_leaves_the_old_files_whole(tmp_path):
    import errno

    from depthlab import UserError
    from depthlab.ownership import writing_files

    old = [tmp_path / "t.md", tmp_path / "t.json"]
    for f in old:
        f.write_text("old " + f.name)
    with pytest.raises(UserError, match="No space left on device; the old files are intact"):
        with writing_files(old, lambda p: True, "test") as (md, js):
            md.write_text("new")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert [f.read_text() for f in old] == ["old t.md", "old t.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.md"]  # no temporary or lock file left
    with writing_files(old, lambda p: True, "test") as (md, js):
        md.write_text("new md")
        js.write_text("new json")
    assert [f.read_text() for f in old] == ["new md", "new json"]


SIGNAL_MID_STEP = """
    import os, signal, sys
    from depthlab.train.trainer import Trainer
    signum, times = getattr(signal, sys.argv[1]), int(sys.argv[2])
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal (a background job ignores SIGINT)
    real = Trainer.train_step
    def train_step(self):  # the signal lands inside step 5, between its backward and its optimizer step
        out = real(self)
        if self.step == 4:
            for _ in range(times):
                os.kill(os.getpid(), signum)
        return out
    Trainer.train_step = train_step
    from depthlab.cli import main
    sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize("name, times", [("SIGTERM", 1), ("SIGINT", 1), ("SIGTERM", 2)])
@pytest.mark.slow
def test_a_signal_mid_step_finishes_the_step_saves_it_and_the_run_resumes_exactly(tmp_path, corpus, name, times):
    """Ctrl-C or SIGTERM (preemption) in the middle of a step: that step completes, a checkpoint of it is saved
    even with no checkpoint schedule (ckpt_every=0), the exit status is the signal's, and --resume auto continues
    bit for bit. A second signal does not wait: it unwinds at once and saves nothing."""
    args = [str(a) for a in ["--data", corpus, "--max-steps", 8, *TRAIN]]
    depthlab = [sys.executable, "-m", "depthlab", "train"]
    ref = subprocess.run([*depthlab, "--run-dir", str(tmp_path / "ref"), *args], env=ENV, capture_output=True)
    assert ref.returncode == 0, ref.stderr
    run = tmp_path / "run"
    proc = spawn(SIGNAL_MID_STEP, name, times, "train", "--run-dir", run, *args)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + getattr(signal, name), err
    assert err.strip().splitlines()[-1] == "depthlab: interrupted", err
    if times == 2:
        assert not list_checkpoints(run) and "interrupted after" not in err
        return
    assert f"interrupted after step 5; saved {run / 'checkpoints' / 'step_0000005'}" in err
    assert [c.name for c in list_checkpoints(run)] == ["step_0000005"] and verify_checkpoint(list_checkpoints(run)[0])
    res = subprocess.run([*depthlab, "--run-dir", str(run), "--resume", "auto", *args], env=ENV,
                         capture_output=True, text=True)
    assert res.returncode == 0 and "step 5" in res.stderr, res.stderr
    assert losses(run) == losses(tmp_path / "ref")  # bitwise, each step once
