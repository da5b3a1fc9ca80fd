"""JSON lines, the one rule for a broken line.

read_jsonl reads the records depthlab writes and reads back: a run's metrics.jsonl, a study's runs.jsonl and
probes.jsonl, coord-check's coord_check.jsonl. Every such file is appended one whole line at a time, so only a
writer killed mid-append can leave a bad line, and only as the last one, without its newline: that line is skipped
with a warning (the record is made again). Any other line that is not a JSON object (or lacks a key the caller
needs) was not written by depthlab: it is a one-line error naming the file and the line, never silently dropped.

json_line parses one line of a JSON-lines file a person gives (training text, fine-tuning records): no writer of
ours can have cut it, so every line that is not JSON, the last one too, is the error `FILE:LINE: not JSON (...)`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from depthlab import UserError


def json_line(line: str, where: str):
    """The JSON value on one line of a file a person gave; `where` is FILE:LINE for the one-line error."""
    try:
        return json.loads(line.rstrip("\r\n"))  # the column of an error counts within the line
    except ValueError as e:
        raise UserError(f"{where}: not JSON ({e.msg} at column {e.colno})" if isinstance(e, json.JSONDecodeError)
                        else f"{where}: not JSON ({e})") from None
    except RecursionError:
        raise UserError(f"{where}: not JSON that a record can be (nested too deeply)") from None


def read_jsonl(path: str | Path, cut: str = "skipped", need: tuple[str, ...] = (), warn=None) -> list[dict]:
    """Every record of the file, in order; [] when there is no file. A last line cut short is skipped with a
    warning (to `warn`, else stderr) that ends with `cut`, what becomes of that record; a record without one of
    the keys in `need` is a bad line like any other."""
    path = Path(path)
    if not path.is_file():
        return []
    text = path.read_text(errors="replace")  # bytes that are not UTF-8 make a bad line, not a traceback
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            if i == len(lines) and not text.endswith("\n"):
                message = f"depthlab: warning: {path}: its last line was cut short (a writer was interrupted); {cut}"
                warn(message) if warn else print(message, file=sys.stderr)
                continue
            record = None
        if not isinstance(record, dict):
            raise UserError(f"{path}:{i}: not a JSON record")
        if missing := [k for k in need if k not in record]:
            raise UserError(f"{path}:{i}: a record without {missing[0]!r}")
        out.append(record)
    return out
