"""Reading the prepared-data format that `depthlab data prepare` (prepare.py) writes: an index, the tokenizer and
one memory-mapped token file per split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from depthlab import UserError
from depthlab.checkpoint import TOKENIZER as TOKENIZER_FILE
from depthlab.data.tokenizer import load_tokenizer, tokenizer_hash
from depthlab.paths import (
    PREPARED_FORMAT as FORMAT,
    PREPARED_INDEX as INDEX,
    PREPARED_PLAN as PLAN,
    PREPARED_WORK as WORK,
    Kind,
    what_is,
)

VERSION = 1


def is_prepared(path: str | Path) -> bool:
    """A prepared-data directory, finished or not (depthlab.paths.what_is decides)."""
    return what_is(path) is Kind.PREPARED



def load_prepared(path: str | Path) -> tuple[dict, Tokenizer, dict[str, np.ndarray]]:
    """(index, tokenizer, {split: memory-mapped tokens}) of a prepared directory; UserError if it is not one."""
    path = Path(path)
    if not (path / INDEX).is_file():
        if (path / WORK / PLAN).is_file():
            raise UserError(f"{path} is an unfinished `depthlab data prepare`; rerun the same command to finish it")
        raise UserError(f"{path} is not a prepared-data directory (no {INDEX})")
    try:
        index = json.loads((path / INDEX).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path / INDEX}: {e}") from None
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise UserError(f"{path / INDEX} is not a {FORMAT} v{VERSION} index")
    tok = load_tokenizer(path / TOKENIZER_FILE)
    if tokenizer_hash(tok) != index["tokenizer_hash"]:
        raise UserError(f"{path / TOKENIZER_FILE} is not the tokenizer the shards were made with "
                        f"({tokenizer_hash(tok)} != {index['tokenizer_hash']})")
    arrays = {}
    for split, info in index["splits"].items():
        file = path / info["file"]
        if not file.is_file() or file.stat().st_size != info["tokens"] * np.dtype(index["dtype"]).itemsize:
            raise UserError(f"{file} is missing or does not hold the {info['tokens']} tokens the index lists")
        arrays[split] = np.memmap(file, dtype=index["dtype"], mode="r")
    return index, tok, arrays
