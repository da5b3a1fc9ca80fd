"""Argparse types for every command's numeric flags, and flags that only act with another one.

A value a flag cannot use (NaN, inf, 0 ranks, a negative seed) is refused while the command line is parsed, in
argparse's one line that names the flag, before any model or data is read. The CLI's parser gives every
`type=float` flag `finite` (cli.Parser), so no float flag, whichever module adds it, takes NaN or inf; flags with
a range take `at_least`, `positive` or `fraction`. `only_with` declares flags that have no effect without another
(cli.Parser refuses them after parsing): a flag that changes nothing is never accepted silently.
"""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except ValueError:  # argparse's own wording for a value that is not a number
        raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def finite(text: str) -> float:
    """Any finite float (the rule of every float flag)."""
    return _number(text, float)


def positive(text: str) -> float:
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative(text: str) -> float:
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A probability that is not certain: [0, 1) (dropout)."""
    value = _number(text, float)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return value


def at_least(low: int, high: int | None = None):
    """An integer in low..high; the type function is named after its range for argparse's messages."""

    def integer(text: str) -> int:
        value = _number(text, int)
        if value < low or (high is not None and value > high):
            rng = f"at least {low:,}" if high is None else f"between {low:,} and {high:,}"
            raise argparse.ArgumentTypeError(f"must be {rng}, got {value:,}")
        return value

    integer.__name__ = "int"
    return integer


SEED = at_least(0, 2**32 - 1)  # what numpy's and torch's generators take


def only_with(parser: argparse.ArgumentParser, needed: str, *flags: str) -> None:
    """`flags` (option strings of `parser`) have no effect without `needed`: giving one alone is an error."""
    parser.only_with = [*getattr(parser, "only_with", []), (needed, flags)]


def orphan_flag(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The message for the first flag given without the flag it needs (only_with), or None."""

    def given(flag: str) -> bool:
        action = parser._option_string_actions[flag]
        return getattr(args, action.dest) != action.default

    for needed, flags in getattr(parser, "only_with", []):
        orphans = [] if given(needed) else [f for f in flags if given(f)]
        if orphans:
            return f"{orphans[0]} has no effect without {needed}; drop it or add {needed}"
    return None
