"""Types for every command's numeric flags, and flags that only act with another one.

A value a flag cannot use (NaN, inf, 0 ranks, a negative seed) is refused before the command reads any model or
data, in one line that names the flag. The CLI's parser gives every `type=float` flag `finite` (cli.Parser), so no
float flag, whichever module adds it, takes NaN or inf; flags with a range take `at_least`, `positive`,
`non_negative`, `fraction` or `share`. `only_with` declares flags that have no effect without another: a flag that
changes nothing is never accepted silently.

Text that is not a number at all is argparse's own error. A number out of range parses as `Refused`, and
`refusal` (called by cli.Parser once parsing is done) makes the first one the command itself: it raises the
UserError, so `depthlab.cli.main` reports it as any other (one line, exit status 2, returned, not exited).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from depthlab import UserError

SET_EPILOG = "Configs are typed dataclasses; --set takes dotted paths, e.g. --set model.n_layers=24 --set train.lr=2e-3"

@dataclass(frozen=True)
class Refused:
    """A flag's value its type refused, and why ("must be at least 1, got 0")."""

    problem: str


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except ValueError:  # argparse's own wording for a value that is not a number
        raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
    if kind is float and not math.isfinite(value):
        return Refused(f"must be a finite number, got {text!r}")
    return value


def _float(text: str, ok, what: str) -> float | Refused:
    value = _number(text, float)
    return value if isinstance(value, Refused) or ok(value) else Refused(f"must be {what}, got {text!r}")


def finite(text: str) -> float | Refused:
    """Any finite float (the rule of every float flag)."""
    return _number(text, float)


def positive(text: str) -> float | Refused:
    return _float(text, lambda v: v > 0, "positive")


def non_negative(text: str) -> float | Refused:
    return _float(text, lambda v: v >= 0, "a number >= 0")


def fraction(text: str) -> float | Refused:
    """A probability that is not certain: [0, 1) (dropout)."""
    return _float(text, lambda v: 0 <= v < 1, "in [0, 1)")


def share(text: str) -> float | Refused:
    """A part of a whole that may be all of it: (0, 1] (a similarity threshold)."""
    return _float(text, lambda v: 0 < v <= 1, "above 0 and at most 1")


def at_least(low: int, high: int | None = None):
    """An integer in low..high; the type function is named int for argparse's messages."""

    def integer(text: str) -> int | Refused:
        value = _number(text, int)
        if value < low or (high is not None and value > high):
            return Refused(f"must be {f'at least {low:,}' if high is None else f'between {low:,} and {high:,}'}, "
                           f"got {value:,}")
        return value

    integer.__name__ = "int"
    return integer


SEED = at_least(0, 2**32 - 1)  # what numpy's and torch's generators take


def only_with(parser: argparse.ArgumentParser, needed: str, *flags: str) -> None:
    """`flags` (option strings of `parser`) have no effect without `needed`: giving one alone is an error."""
    parser.only_with = [*getattr(parser, "only_with", []), (needed, flags)]


def refusal(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The message for the first refused value of `parser`'s flags, or the first flag given without the flag it
    needs (only_with); None when there is none."""
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        bad = next((v for v in (value if isinstance(value, list) else [value]) if isinstance(v, Refused)), None)
        if bad is not None:
            return f"{action.option_strings[0] if action.option_strings else action.dest} {bad.problem}"

    def given(flag: str) -> bool:
        action = parser._option_string_actions[flag]
        return getattr(args, action.dest) != action.default

    for needed, flags in getattr(parser, "only_with", []):
        orphans = [] if given(needed) else [f for f in flags if given(f)]
        if orphans:
            return f"{orphans[0]} has no effect without {needed}; drop it or add {needed}"
    return None


def refuse(message: str):
    """A command that is only the refusal of its command line."""

    def command(args) -> None:
        raise UserError(message)

    return command
