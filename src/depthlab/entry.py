"""How a command runs, from `depthlab` or a study script: SIGTERM unwinds it as Ctrl-C does, and every way out is
one line and an exit status, never a traceback for a user's mistake. Below every package, so that an entry point
inside one (`python -m depthlab.eval.lmeval`) needs nothing from depthlab.cli, which imports them all."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from depthlab import UserError


def run_script(func, *args) -> int:
    """func(*args) as a command runs: SIGTERM unwinds it as Ctrl-C does (sigterm_as_interrupt), every way out is
    one line (one_line_errors); the exit status, 143 after SIGTERM. The CLI's and the study scripts' entry."""
    with sigterm_as_interrupt() as terminated:
        code = one_line_errors(func, *args)
    return 128 + signal.SIGTERM if terminated and code == 130 else code  # the status a plain kill would give


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (kill, systemd, SLURM preemption, torchrun) unwinds the command as Ctrl-C does, so that outputs
    written whole stay whole and temporary files and locks are removed; a second SIGTERM ends the process at once.
    Yields a list that holds the signal once one came. In a thread other than the main one: nothing to install."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    pid = os.getpid()

    def interrupt(signum, frame):
        signal.signal(signum, signal.SIG_DFL)
        if os.getpid() != pid:  # a forked child inherited this handler: it ends as it would without one
            os.kill(os.getpid(), signum)
            return
        got.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, previous)


def one_line_errors(func, *args) -> int:
    """Run func(*args); a user's mistake (UserError), what the machine refuses (OSError) and Ctrl-C end in one line
    on stderr and an exit status (2, 2, 130), not a traceback. The CLI's and the study scripts' way out.

    Under torchrun every rank meets the error and rank 0 alone prints it; each failing rank also hands its line to
    torchrun (TORCHELASTIC_ERROR_FILE), whose failure summary then shows it as the root cause instead of "To enable
    traceback see ...", so an error that only rank 3 met is not lost. A worker leaves its process group on every
    way out: a group left to interpreter shutdown can deadlock it (depthlab.train.distributed.shutdown)."""
    status, line = 0, None
    try:
        func(*args)
    except UserError as e:  # one line, whatever the message (a YAML parser's, say) holds
        status, line = 2, "depthlab: error: " + " ".join(x.strip() for x in str(e).splitlines() if x.strip())
    except OSError as e:  # what the machine refuses (a full disk, a vanished file) is not a bug to trace back
        where = f" ({e.filename})" if e.filename else ""
        status, line = 2, f"depthlab: error: {e.strerror or e}{where}"
    except KeyboardInterrupt:
        status, line = 130, "depthlab: interrupted"
    finally:  # a bug's traceback leaves the group too
        if line and not int(os.environ.get("RANK", 0)):
            print(line, file=sys.stderr)  # first: torchrun stops the other ranks as soon as one has failed
        if line and os.environ.get("TORCHELASTIC_ERROR_FILE"):
            import contextlib
            import json
            import time

            with contextlib.suppress(OSError), open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
                json.dump({"message": line, "timestamp": int(time.time())}, f)  # the form torchrun reads
        # a worker joins its group through depthlab.train.distributed, so only a command that imported it can have
        # joined one (looked up, not imported: this module sits below every package)
        joined = sys.modules.get("depthlab.train.distributed")
        if joined is not None:
            joined.shutdown()  # nothing when no group is initialized
    return status
