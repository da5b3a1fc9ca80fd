"""Progress of the long phases other than the training loop itself (validation, evaluation, tokenization,
tokenizer training, analysis, a run's setup).

On a terminal: a tqdm bar on stderr (not with --no-progress), cleared when the phase ends. Elsewhere -- a log
file, a pipe, --no-progress -- a bar's carriage-return updates are no use, and silence looks like a hang: a phase
that lasts more than START_S prints plain lines instead, one then and one every EVERY_S, and one when it ends.
Short phases print nothing. Under torchrun only rank 0 speaks (every rank runs the same phases). Every line says
the time elapsed and, once something is counted, an estimate of the time left (`eta_text`); a command made of
several phases (`analyze`) declares them with `plan_phases`, and each of its lines then says which phase of how
many it is in."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from tqdm import tqdm

START_S = 5.0  # a phase shorter than this prints nothing
EVERY_S = 10.0


_PLAN: dict = {"prefix": "", "names": []}  # the running command's phases, in order (plan_phases)


def plan_phases(prefix: str, names: list[str]) -> None:
    """Declare the phases a command runs, in order: a phase named `prefix + name` then reads "PREFIX(phase k of n)
    NAME"; an empty list ends the plan."""
    _PLAN.update(prefix=prefix, names=list(names))


@contextlib.contextmanager
def unnumbered():
    """Inside: no phase is numbered (a phase that runs the others' steps again, as the index at initialisation)."""
    saved = dict(_PLAN)
    plan_phases("", [])
    try:
        yield
    finally:
        _PLAN.update(saved)


def numbered(desc: str) -> str:
    """`desc` with its place in the declared plan, when it is one of its phases."""
    p, names = _PLAN["prefix"], _PLAN["names"]
    name = desc[len(p):] if p and desc.startswith(p) else None
    if name in names:
        return f"{p[:-2] if p.endswith(': ') else p} (phase {names.index(name) + 1} of {len(names)}): {name}"
    return desc


def clock(seconds: float) -> str:
    """Seconds as 42 s, 3:07 or 1:02:03."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def eta_text(start: float, done0: int, done: int, total: int | None) -> str:
    """"elapsed 3:07, about 1:02 left": the time since `start` (time.monotonic()), and the rest at the rate from
    `done0` to `done` of `total` (nothing said about the rest until one is counted)."""
    elapsed = time.monotonic() - start
    out = f"elapsed {clock(elapsed)}"
    if total and done > done0:
        out += f", about {clock(elapsed / (done - done0) * max(total - done, 0))} left"
    return out


def on_terminal(enabled: bool) -> bool:
    """Whether a phase's bar is drawn: asked for (no --no-progress) and stderr is a terminal."""
    return enabled and sys.stderr.isatty()


_OPEN: list = []  # the bars open now, the innermost last: what `detail` reports to


def detail(text: str) -> None:
    """Say how far the innermost open bar's current step has gone ("block 12 of 30"), for a step long enough to
    stall its counter (a block pass over every stream): shown beside the count, on a terminal and in plain lines."""
    bar = _OPEN[-1] if _OPEN else None
    if isinstance(bar, PlainProgress):
        bar.detail = text  # the timer's next line says it
    elif bar is not None and time.monotonic() - bar.last_print_t > 0.5:  # a terminal's bar, redrawn twice a second
        bar.set_postfix_str(text)


class _Bar(tqdm):
    """tqdm, known to `detail` while it is open."""

    def close(self) -> None:
        if self in _OPEN:
            _OPEN.remove(self)
        super().close()


def progress_bar(iterable=None, enabled: bool = True, **kwargs):
    """tqdm over `iterable` (or updated by hand) on stderr when `on_terminal(enabled)`; else the same interface
    (iteration, update, close, with) reporting in plain lines when the phase is long (PlainProgress)."""
    if "desc" in kwargs:
        kwargs["desc"] = numbered(kwargs["desc"])
    if on_terminal(enabled):  # tqdm's bar shows the time elapsed and left itself
        bar = _Bar(iterable, leave=False, dynamic_ncols=True, file=sys.stderr, **kwargs)
    else:
        bar = PlainProgress(iterable, desc=kwargs.get("desc", ""), total=kwargs.get("total"),
                            unit=kwargs.get("unit", "it"))
    _OPEN.append(bar)
    return bar


def phase(desc: str, enabled: bool = True, alone: bool = False) -> PlainProgress:
    """A phase with nothing to count (a tokenizer's training, a run's setup), as `with phase(desc, progress):`:
    plain lines when it is long and no bar is drawn; on a terminal its own parts draw their bars. `alone`: a phase
    whose parts draw none (a model's load) speaks on a terminal too, so that nothing is silent past START_S."""
    return PlainProgress(desc=numbered(desc), speak=alone or not on_terminal(enabled))


class PlainProgress:
    """tqdm's counting interface, reported as plain lines on stderr by a timer thread: a phase that is stuck in one
    long call (tokenizing one large document, a tokenizer's training) still says it runs. Silent on ranks other
    than 0 and for phases shorter than START_S."""

    def __init__(self, iterable=None, desc: str = "", total: int | None = None, unit: str = "it",
                 speak: bool = True):
        self.iterable, self.desc, self.unit, self.n, self.detail = iterable, desc, unit, 0, ""
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
        done += f" ({self.detail})" if self.detail and not end else ""
        left = eta_text(self.start, 0, self.n, self.total).partition(", ")[2] if not end else ""
        left = f", {left}" if left else ""
        print(f"depthlab: {self.desc}: {time.monotonic() - self.start:.0f} s{done}{end}{left}", file=self.file,
              flush=True)
        self.spoke = True

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        if self in _OPEN:
            _OPEN.remove(self)
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
