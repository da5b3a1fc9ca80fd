"""The trainer's toolbox, shared with the studies: seeding and RNG state, the environment record and signals
deferred to a step's end (a run directory's naming and rules are depthlab.runfolder's; autocast is
depthlab.device's, the per-token evaluation depthlab.eval.perplexity's)."""

from __future__ import annotations

import contextlib
import os
import platform
import random
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from depthlab import __version__
from depthlab.train.distributed import DistEnv, all_reduce_sum


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def environment(device: torch.device, env: DistEnv) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"depthlab": __version__, "git_commit": commit, "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(), "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
            "threads": torch.get_num_threads(), "world_size": env.world_size,
            "cwd": os.getcwd(),  # where the config's relative data paths start from
            "started": datetime.now().isoformat(timespec="seconds")}


def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # this process's own device (torchrun: one per rank)
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]  # checkpoints before per-rank states held every visible device's
        (torch.cuda.set_rng_state_all if isinstance(cuda, list | tuple) else torch.cuda.set_rng_state)(cuda)


@contextlib.contextmanager
def deferred_interrupts(env: DistEnv) -> Iterator[Callable[[], bool]]:
    """Ctrl-C and SIGTERM while the block runs (the training loop) do not cut a step in half: the handler notes the
    signal. `stopping()`, called at each step's end, is True on every rank at the same step once any rank got one
    (one all-reduce on several ranks); the trainer then saves a checkpoint of that step and raises
    KeyboardInterrupt. The same signal a second time unwinds at once (its handler from before is back); the other
    one stays noted only, so that a SIGTERM that follows a Ctrl-C (a process pool stopping its workers) does not cut
    the save short. Leaving the block, a noted signal whose handler from before is Python's (the CLI's: exit status
    143 for SIGTERM; Python's own KeyboardInterrupt for Ctrl-C) is sent to it again; with the system's default
    handler the KeyboardInterrupt stands, so that every cleanup runs. Outside the main thread, and for a signal
    that is ignored (a background job's SIGINT), nothing is installed."""
    got: list[int] = []
    previous: dict[int, object] = {}
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    pid = os.getpid()

    def put_back(signum: int) -> None:
        handler = previous[signum]
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def note(signum, frame) -> None:
        put_back(signum)
        if os.getpid() != pid:  # a forked child inherited this handler: it ends as it would without it
            os.kill(os.getpid(), signum)
            return
        got.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, note)
    try:
        yield lambda: all_reduce_sum([float(bool(got))], env)[0] > 0
    finally:
        for signum in previous:
            put_back(signum)
        if got and callable(previous[got[0]]):
            os.kill(os.getpid(), got[0])
