"""The study scripts' command lines (benchmarks/*_study.py, own_rate, depth_transfer): depthlab's parser, so that a
mistake is one `depthlab: error:` line with exit status 2, as in any depthlab command."""

from __future__ import annotations

import argparse

from depthlab.cli import Parser


def parser(prog: str, doc: str) -> Parser:
    """The parser of `python -m PROG`, described by the first line of `doc`."""
    return Parser(prog=f"python -m {prog}", description=doc.split("\n")[0])


def parse(p: Parser, argv) -> argparse.Namespace:
    """The arguments; a value out of range (flags.at_least, positive, ...) is a UserError, as in any command."""
    a = p.parse_args(argv)
    if callable(getattr(a, "func", None)):  # cli.Parser's refusal of a value: it raises the one-line error
        a.func(a)
    return a
