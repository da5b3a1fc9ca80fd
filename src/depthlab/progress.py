"""Progress bars for the long phases other than the training loop itself (validation, evaluation, tokenization,
tokenizer training, analysis): tqdm on stderr, shown only on a terminal and not with --no-progress, and cleared
when the phase ends, so logs, pipes and captured output keep only the commands' own lines."""

from __future__ import annotations

import sys

from tqdm import tqdm


def on_terminal(enabled: bool) -> bool:
    """Whether a phase's progress is shown: asked for (no --no-progress) and stderr is a terminal."""
    return enabled and sys.stderr.isatty()


def progress_bar(iterable=None, enabled: bool = True, **kwargs) -> tqdm:
    """tqdm over `iterable` (or updated by hand), on stderr when `on_terminal(enabled)`, else a silent pass-through."""
    return tqdm(iterable, disable=not on_terminal(enabled), leave=False, dynamic_ncols=True, file=sys.stderr,
                **kwargs)
