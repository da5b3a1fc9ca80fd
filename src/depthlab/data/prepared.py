"""Reading the prepared-data format that `depthlab data prepare` (prepare.py) writes: an index, the tokenizer and
one memory-mapped token file per split."""

from __future__ import annotations

import hashlib
import json
import sys
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



def load_prepared(path: str | Path, check: tuple[str, ...] | None = None) -> tuple[dict, Tokenizer,
                                                                                  dict[str, np.ndarray]]:
    """(index, tokenizer, {split: memory-mapped tokens}) of a prepared directory; UserError if it is not one, or
    if a split in `check` (None: every split) is not what was prepared (_check_tokens): a caller that reads only
    some splits (eval: the validation split) checks only those."""
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
        if check is None or split in check:
            _check_tokens(file, np.dtype(index["dtype"]), info.get("sha256"), tok.get_vocab_size())
        arrays[split] = np.memmap(file, dtype=index["dtype"], mode="r")
    if not any(info.get("sha256") for info in index["splits"].values()):
        _note_unsealed(path)
    return index, tok, arrays


_CHECKED: set[tuple] = set()  # token files this process has checked, by identity (path, inode, size, mtime)
_NOTED: list[bool] = []  # prepared data without checksums has been mentioned (once per process)
BLOCK = 4 << 20  # bytes read at a time (cache-sized): one pass checks the checksum and the ids
LOUD_BYTES = 2e9  # checking more than this takes seconds: say so first


def _check_tokens(file: Path, dtype: np.dtype, digest: str | None, vocab_size: int) -> None:
    """A token file against its recorded sha256 (data prepared before checksums were recorded: `digest` None)
    and every id below the vocabulary size, in one read of the file, once per process for the same file.
    sha256 is most of the cost: about 1.5 GB/s on an idle core (a 512 MB split took 1.4 s on a busy 2-core
    machine), so a run's start pays roughly a second per GB of prepared data."""
    st = file.stat()
    key = (str(file.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _CHECKED:
        return
    if st.st_size > LOUD_BYTES:
        print(f"depthlab: checking {file} ({st.st_size / 1e9:.1f} GB) against its checksum", file=sys.stderr)
    h, top, worst = hashlib.sha256(), -1, None
    with open(file, "rb") as f:
        while block := f.read(BLOCK - BLOCK % dtype.itemsize):
            h.update(block)
            ids = np.frombuffer(block, dtype=dtype)
            if len(ids) and (most := int(ids.max())) > top:
                top, worst = most, f.tell() // dtype.itemsize - len(ids) + int(np.argmax(ids))
    if digest is not None and h.hexdigest() != digest:
        raise UserError(f"{file} does not match the sha256 in {INDEX}: the tokens were changed or damaged after "
                        "`depthlab data prepare` wrote them; prepare the data again")
    if top >= vocab_size:
        raise UserError(f"{file} holds token id {top} (at token {worst:,}), outside the tokenizer's {vocab_size:,} "
                        "ids: the file is damaged; prepare the data again")
    _CHECKED.add(key)


def _note_unsealed(path: Path) -> None:
    if not _NOTED:
        _NOTED.append(True)
        print(f"depthlab: note: {path} was prepared before token files carried checksums: its ids are checked, "
              "their integrity is not (prepare it again to add them; said once)", file=sys.stderr)
