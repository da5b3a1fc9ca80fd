"""Worker processes that do not outlive the process that started them.

A pool's workers are separate processes: when their parent is killed with SIGKILL it gets no chance to stop them,
and an orphan would go on writing into a directory that a rerun now owns (a `data prepare` unit, a study's cell),
or wait forever for work on a queue that it holds open itself. `exit_with_parent`, a pool worker's initializer,
exits at once if the parent is already gone (a worker still starting up when the parent died) and otherwise sends
the worker a signal when the parent dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time


def exit_with_parent(parent: int, signum: int = signal.SIGKILL) -> None:
    """Make this worker get `signum` once `parent` (the pid the parent passed, `os.getpid()` there) is gone: SIGKILL
    for a worker with nothing to save, SIGTERM for one that saves its step and stops (a study's training cell).

    SIGKILL is asked of the kernel too (Linux's PR_SET_PDEATHSIG), which sends it at once. The kernel sends it
    once per thread of the parent that exits while the worker is attached to it, so a signal that the worker
    handles comes from a polling thread alone, exactly once: a second SIGTERM would cut short the save that the
    first one asked for. The polling thread waits for the GIL, so it can take a second or so under load."""
    if signum == signal.SIGKILL:
        with contextlib.suppress(OSError, AttributeError):  # no libc prctl: not Linux
            import ctypes

            ctypes.CDLL(None).prctl(1, int(signum))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_signal_when_orphaned, args=(parent, signum), daemon=True).start()


def _signal_when_orphaned(parent: int, signum: int) -> None:
    while os.getppid() == parent:  # a dead parent's children are reparented (to init or a subreaper)
        time.sleep(0.2)
    os.kill(os.getpid(), signum)
