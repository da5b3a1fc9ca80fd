"""Instruction records (Commonsense170K's format: `{"instruction", "input", "output", "answer"}`, one JSON array
or JSON lines) and the prompt they become: LLM-Adapters' Alpaca template, byte for byte. Read by fine-tuning
(depthlab.train.finetune) and by the commonsense evaluation (depthlab.hf.commonsense)."""

from __future__ import annotations

import json
from pathlib import Path

from depthlab import UserError

FIELDS = ("instruction", "input", "output")
PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request. \n\n"
    "                ### Instruction:\n                {instruction}\n                \n"
    "                ### Input:\n                {input}\n                \n"
    "                ### Response:\n                ")
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.  \n\n"
    "                ### Instruction:\n                {instruction}\n                \n"
    "                ### Response:\n                ")


def prompt_of(instruction: str, input: str = "") -> str:
    """LLM-Adapters' generate_prompt without the output: what the response follows."""
    if input:
        return PROMPT_WITH_INPUT.format(instruction=instruction, input=input)
    return PROMPT_NO_INPUT.format(instruction=instruction)


def _objects(text: str, path: Path):
    """(line number, object) for each record of a JSON array or of JSON lines."""
    dec = json.JSONDecoder()
    body = text.strip()
    if body.startswith("{") and "\n" in body:  # JSON lines never span lines: one object holds the whole file
        try:
            whole = json.loads(body)
        except (ValueError, RecursionError):
            whole = None
        if isinstance(whole, dict):
            raise UserError(f"{path}: one JSON object (keys {', '.join(map(str, list(whole)[:5]))}), not an array "
                            "of records or JSON lines")
    if not body.startswith("["):
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    yield n, json.loads(line)
                except ValueError as e:
                    raise UserError(f"{path}:{n}: not JSON ({e.msg})") from None
                except RecursionError:
                    raise UserError(f"{path}:{n}: JSON nested too deeply for a record") from None
        return
    pos = text.index("[") + 1
    line, counted = 1, 0  # the line of `pos`, counted incrementally (a count from 0 each time is quadratic)
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            raise UserError(f"{path}:{text.rstrip().count(chr(10)) + 1}: the JSON array is not closed (a truncated "
                            "file?)")
        if text[pos] == "]":
            return
        line, counted = line + text.count("\n", counted, pos), pos
        try:
            obj, pos = dec.raw_decode(text, pos)
        except ValueError as e:
            raise UserError(f"{path}:{text.count(chr(10), 0, e.pos) + 1}: not JSON ({e.msg})") from None
        except RecursionError:
            raise UserError(f"{path}:{line}: JSON nested too deeply for a record") from None
        yield line, obj


def read_records(path: str | Path) -> list[dict]:
    """The records of an instruction file; a malformed one is one error line naming its line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read instruction file {path}: {e}") from None
    out = []
    for n, rec in _objects(text, path):
        if not isinstance(rec, dict):
            raise UserError(f"{path}:{n}: expected an object with 'instruction', 'input' and 'output'")
        if not any(k in rec for k in FIELDS):
            raise UserError(f"{path}:{n}: expected an object with 'instruction', 'input' and 'output', found keys "
                            f"{', '.join(map(str, list(rec)[:5])) or '(none)'}")
        bad = [k for k in FIELDS if not isinstance(rec.get(k, "" if k == "input" else None), str)]
        if bad or not rec["instruction"].strip() or not rec["output"].strip():
            raise UserError(f"{path}:{n}: a record needs string 'instruction' and 'output' (non-empty) and "
                            f"'input'; bad: {', '.join(bad) or 'empty instruction or output'}")
        out.append({**rec, "input": rec.get("input", ""), "line": n})
    if not out:
        raise UserError(f"instruction file {path} holds no records")
    return out
