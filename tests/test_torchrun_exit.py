"""Every way out of a torchrun job ends the job: a run resumed with no steps left (what a requeued job runs) leaves
its process group deliberately instead of deadlocking in gloo's teardown, leaving is bounded by
train.dist_timeout_s, and a user's mistake is one line from rank 0, its status in torchrun's summary.

Run as a script under torchrun, this file is the worker of the first test: `main` (the whole CLI path) once per
try in one process, so that twenty tries cost one start-up (a try is a second or two) and a try that hangs is
caught by its own deadline."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TRIES = 20  # the bar: 20 exits in a row (before the fix, about 1 try in 5 hung)
PER_TRY_S = 120  # a try takes seconds; this only bounds one that hangs (the first includes start-up)


def torchrun(*args, **popen) -> subprocess.Popen:
    """Two ranks on gloo."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *map(str, args)],
                            env=env, text=True, **popen)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every process under it: torchrun starts each worker in a session of its own, and
    a worker that hangs would outlive its launcher."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    family = [proc.pid]
    for pid in family:  # grows as it goes: children, then theirs
        family += [child for child, parent in parents.items() if parent == pid]
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def one_process_run(root: Path, corpus: Path) -> Path:
    """A finished run of one process, 4 sequences a step (resumed on 2 ranks: 2 each, no steps left)."""
    from tests.test_long_phases import TINY, run_cli

    run_cli(["train", "--data", corpus, "--run-dir", root / "one", "--no-progress", *TINY])
    return root / "one"


def test_resuming_a_finished_run_under_torchrun_exits_every_time(tmp_path, corpus):
    from tests.test_long_phases import TINY

    one = one_process_run(tmp_path, corpus)
    fresh = ["--data", corpus, "--run-dir", tmp_path / "two", *TINY, "--set", "train.batch_size=2",
             "--set", "train.dist_timeout_s=60"]
    log = open(tmp_path / "stderr.log", "w+")
    proc = torchrun(__file__, one, json.dumps([str(a) for a in fresh]), stdout=subprocess.PIPE, stderr=log)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in proc.stdout if line.startswith("try")],
                     daemon=True).start()
    for i in range(TRIES):
        try:
            line = lines.get(timeout=PER_TRY_S)
        except queue.Empty:
            kill(proc)
            log.seek(0)
            raise AssertionError(f"try {i + 1} of {TRIES} did not end in {PER_TRY_S} s\n{log.read()[-3000:]}") from None
        assert line.endswith("exit 0"), line
    try:  # the workers' own exit, after the last try: interpreter shutdown must not hang either
        assert proc.wait(timeout=PER_TRY_S) == 0
    except subprocess.TimeoutExpired:
        kill(proc)
        raise AssertionError("the tries ended but the job did not exit") from None
    log.seek(0)
    err = log.read()
    assert err.count("depthlab: resuming") == TRIES - 1, err[-3000:]  # rank 0 says it, once a resume
    assert err.count("depthlab train: step 2/2:") == 1  # and logs the first try's steps, alone


def test_leaving_the_group_is_bounded_by_the_timeout(tmp_path):
    """A teardown that blocks (what gloo's deadlock does) ends the process once train.dist_timeout_s is spent."""
    script = """
import threading, torch, torch.distributed as dist
from depthlab.train import distributed
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
distributed.init_distributed(torch.device("cpu"), timeout_s=2)  # joins the group there is, and takes its timeout
dist.destroy_process_group = lambda: threading.Event().wait()  # blocks, as the deadlock did
distributed.shutdown()
print("left")
"""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 1 and "left" not in res.stdout, (res.returncode, res.stdout, res.stderr[-2000:])
    assert "Timeout (0:00:02)!" in res.stderr  # faulthandler's watchdog, with where it was stuck


def test_a_mistake_under_torchrun_is_one_line_from_rank_0(tmp_path, corpus):
    one = one_process_run(tmp_path, corpus)
    # two ranks of 4 sequences each: another global batch than the run's, refused on every rank
    proc = torchrun("-m", "depthlab", "train", "--no-progress", "--run-dir", one, "--resume", "auto",
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        kill(proc)
        raise
    line = f"depthlab: error: cannot resume {one / 'checkpoints' / 'step_0000002'} with a different config"
    mine = [x for x in err.splitlines() if x.startswith("depthlab: error:")]
    assert len(mine) == 1 and mine[0].startswith(line), err  # once, not once per rank
    # torchrun's own summary (it always prints one, and exits 1): the root cause is that line, with its status
    assert f"traceback : {mine[0]}" in err and "exitcode  : 2" in err, err
    assert "To enable traceback" not in err and proc.returncode == 1


if __name__ == "__main__":  # the worker of the first test, on each rank
    import torch.distributed as dist

    from depthlab.cli import main

    one, fresh = sys.argv[1], json.loads(sys.argv[2])
    two = fresh[fresh.index("--run-dir") + 1]
    attempts = [["train", "--no-progress", *fresh]]  # a run trained on these 2 ranks: its exit, then its resumes
    for i in range(1, TRIES):  # in turn: each finished run, under DDP and under FSDP
        attempts.append(["train", "--no-progress", "--run-dir", (one, two)[i % 2], "--resume", "auto",
                         "--set", "train.batch_size=2", "--set", "train.dist_timeout_s=60",
                         "--set", f"train.parallel={('ddp', 'fsdp')[i // 2 % 2]}"])
    store, rank, world = None, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for i, argv in enumerate(attempts):
        if i:  # the first try's group is the trainer's own; later ones join under keys of their own, as a new job
            # would (torchrun's store still holds the addresses of the group the last try left)
            store = store or dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
            dist.init_process_group("gloo", store=dist.PrefixStore(f"try{i}", store), rank=rank, world_size=world)
        code = main(argv)
        if rank == 0:
            print(f"try {i + 1} exit {code}", flush=True)
