"""Progress of the long phases other than the training loop itself (validation, evaluation, tokenization,
tokenizer training, analysis, a run's setup).

On a terminal: a tqdm bar on stderr (not with --no-progress), cleared when the phase ends. Elsewhere -- a log
file, a pipe, --no-progress -- a bar's carriage-return updates are no use, and silence looks like a hang: a phase
that lasts more than START_S prints plain lines instead, one then and one every EVERY_S, and one when it ends.
Short phases print nothing. Under torchrun only rank 0 speaks (every rank runs the same phases)."""

from __future__ import annotations

import os
import sys
import threading
import time

from tqdm import tqdm

START_S = 5.0  # a phase shorter than this prints nothing
EVERY_S = 10.0


def on_terminal(enabled: bool) -> bool:
    """Whether a phase's bar is drawn: asked for (no --no-progress) and stderr is a terminal."""
    return enabled and sys.stderr.isatty()


def progress_bar(iterable=None, enabled: bool = True, **kwargs):
    """tqdm over `iterable` (or updated by hand) on stderr when `on_terminal(enabled)`; else the same interface
    (iteration, update, close, with) reporting in plain lines when the phase is long (PlainProgress)."""
    if on_terminal(enabled):
        return tqdm(iterable, leave=False, dynamic_ncols=True, file=sys.stderr, **kwargs)
    return PlainProgress(iterable, desc=kwargs.get("desc", ""), total=kwargs.get("total"),
                         unit=kwargs.get("unit", "it"))


def phase(desc: str, enabled: bool = True) -> PlainProgress:
    """A phase with nothing to count (a tokenizer's training, a run's setup), as `with phase(desc, progress):`:
    plain lines when it is long and no bar is drawn; on a terminal its own parts draw their bars."""
    return PlainProgress(desc=desc, speak=not on_terminal(enabled))


class PlainProgress:
    """tqdm's counting interface, reported as plain lines on stderr by a timer thread: a phase that is stuck in one
    long call (tokenizing one large document, a tokenizer's training) still says it runs. Silent on ranks other
    than 0 and for phases shorter than START_S."""

    def __init__(self, iterable=None, desc: str = "", total: int | None = None, unit: str = "it",
                 speak: bool = True):
        self.iterable, self.desc, self.unit, self.n = iterable, desc, unit, 0
        self.total = len(iterable) if total is None and hasattr(iterable, "__len__") else total
        self.file, self.start, self.spoke = sys.stderr, time.monotonic(), False  # the stderr of the phase's start
        self.done = threading.Event()
        self.timer = None
        if speak and not int(os.environ.get("RANK", 0)):
            self.timer = threading.Thread(target=self._beat, daemon=True, name=f"progress {desc}")
            self.timer.start()

    def _beat(self) -> None:
        wait = START_S  # 0: a line at the start of every phase, however short
        while wait <= 0 or not self.done.wait(wait):
            self._say("")
            wait = EVERY_S

    def _say(self, end: str) -> None:
        count = f"{self.n:,}/{self.total:,}" if self.total else f"{self.n:,}"
        done = f", {count} {self.unit}" if self.total or self.n else ""
        print(f"depthlab: {self.desc}: {time.monotonic() - self.start:.0f} s{done}{end}", file=self.file, flush=True)
        self.spoke = True

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        if self.timer is not None and not self.done.is_set():
            self.done.set()
            self.timer.join()
            if self.spoke:  # a phase that said it started says it ended
                self._say(", done")

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.n += 1
        finally:
            self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
