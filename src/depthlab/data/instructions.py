"""Instruction records (Commonsense170K's format: `{"instruction", "input", "output", "answer"}`, one JSON array
or JSON lines) and the prompt they become: LLM-Adapters' Alpaca template, byte for byte; and an instruction file
encoded and padded as fine-tuning trains on it (`build_instruction_data`). Read by fine-tuning
(depthlab.train.finetune), by a fine-tune's own validation (depthlab.eval.perplexity) and by the commonsense
evaluation (depthlab.eval.commonsense)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from depthlab import UserError
from depthlab.data.dataset import TokenData
from depthlab.data.tokenizer import eot_id
from depthlab.jsonl import json_line

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
                yield n, json_line(line, f"{path}:{n}")
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


IGNORE = -100  # the target of a prompt or padding position: no loss there


def encode_examples(tok, records: list[dict], start: int | None, eot: int) -> list[tuple[list[int], int]]:
    """(token ids, number of prompt tokens) of each record: start, prompt, response, end of text."""
    prompts = tok.encode_batch([prompt_of(r["instruction"], r["input"]) for r in records], add_special_tokens=False)
    responses = tok.encode_batch([r["output"] for r in records], add_special_tokens=False)
    head = [] if start is None else [start]
    return [(head + p.ids + r.ids + [eot], len(head) + len(p.ids)) for p, r in zip(prompts, responses)]


def encode_example(tok, rec: dict, start: int | None, eot: int) -> tuple[list[int], int]:
    """encode_examples of one record."""
    return encode_examples(tok, [rec], start, eot)[0]


def pad_examples(examples: list[tuple[list[int], int]], seq_len: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each (N, seq_len): right-padded rows, targets -100 on prompt and padding."""
    x = np.full((len(examples), seq_len), pad, dtype=np.int32)  # int32: Commonsense170K padded is 350 MB, not 700
    y = np.full((len(examples), seq_len), IGNORE, dtype=np.int32)
    for i, (ids, n_prompt) in enumerate(examples):
        ids = ids[:seq_len + 1]
        x[i, :len(ids) - 1] = ids[:-1]
        y[i, n_prompt - 1:len(ids) - 1] = ids[n_prompt:]
    return x, y


@dataclass
class InstructionData(TokenData):
    """TokenData whose train / val are padded rows, flattened (seq_len each), with their targets."""

    train_targets: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    val_targets: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))


def build_instruction_data(path: str | Path, tok, seq_len: int, warn=print) -> InstructionData:
    """Read, encode and pad an instruction file; about a tenth of the records (at least one) held out."""
    records = read_records(path)
    if len(records) < 2:
        raise UserError(f"{path}: one record; fine-tuning holds out about a tenth of the records (at least one) for "
                        "validation, so it needs at least two")
    eot = eot_id(tok)
    examples = encode_examples(tok, records, eot, eot)
    keep = [i for i, (_, n) in enumerate(examples) if n < seq_len + 1]
    if len(keep) < len(examples):
        lines = [records[i]["line"] for i, (_, n) in enumerate(examples) if n >= seq_len + 1]
        warn(f"depthlab: warning: {path}: dropped {len(lines)} record(s) whose prompt fills seq_len {seq_len} "
             f"(lines {', '.join(map(str, lines[:5]))}{'...' if len(lines) > 5 else ''})")
    if not keep:
        raise UserError(f"{path}: no record's response fits in seq_len {seq_len}; raise --seq-len")
    examples = [examples[i] for i in keep]
    if len(examples) < 2:
        raise UserError(f"{path}: only one record fits in seq_len {seq_len}, and validation needs another; raise "
                        "--seq-len")
    n_val = max(1, len(examples) // 10)
    x, y = pad_examples(examples, seq_len, eot)
    tx, ty, vx, vy = x[:len(x) - n_val], y[:len(y) - n_val], x[len(x) - n_val:], y[len(y) - n_val:]
    source = f"{path} ({len(tx)} train / {len(vx)} validation examples, padded to {seq_len})"
    return InstructionData(tok, tx.reshape(-1), vx.reshape(-1), source, train_targets=ty.reshape(-1),
                           val_targets=vy.reshape(-1))
