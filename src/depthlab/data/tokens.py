"""The primitives every path shares: the held-out rule, the token dtype, and batch encoding with EOT packing.

Kept free of torch so that `data prepare` worker processes start fast.
"""

from __future__ import annotations

import re

import numpy as np
from tokenizers import Tokenizer

from depthlab import UserError
from depthlab.data.sources import Document
from depthlab.data.tokenizer import eot_id
from depthlab.progress import progress_bar

MIN_EFFECTIVE = 30.0  # Kish's effective number of documents every held-out split must reach (study corpora)
MAX_SHARE = 0.10  # the largest share of a held-out split's tokens one document may hold


def token_dtype(vocab_size: int) -> type:
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def val_period(val_fraction: float) -> int:
    """Every `val_period`-th document is held out for validation (by document, never a crop of the stream)."""
    return max(2, round(1 / val_fraction))


def is_val(doc_index: int, period: int) -> bool:
    return doc_index % period == period // 2


def encode_texts(tok: Tokenizer, texts: list[str], eot: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """One batch-API call: the documents' ids concatenated, an EOT token after every document; and each
    document's length including its EOT (a document's own text may contain the EOT token)."""
    flat: list[int] = []
    lengths = []
    for enc in tok.encode_batch_fast(texts, add_special_tokens=False):
        flat += enc.ids
        flat.append(eot)
        lengths.append(len(enc.ids) + 1)
    return np.array(flat, dtype=dtype), np.array(lengths, dtype=np.int64)


def pack(tok: Tokenizer, docs, batch: int = 256, progress: bool = False, desc: str = "tokenize") -> np.ndarray:
    """Tokenize documents with the batch API into one packed stream, documents separated by EOT (with
    `progress`, a bar of documents on a terminal)."""
    dtype, eot = token_dtype(tok.get_vocab_size()), eot_id(tok)
    texts = [d.text for d in docs]
    parts = []
    with progress_bar(total=len(texts), enabled=progress, desc=desc, unit="doc") as bar:
        for i in range(0, len(texts), batch):
            parts.append(encode_texts(tok, texts[i:i + batch], eot, dtype)[0])
            bar.update(len(texts[i:i + batch]))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def composition(names: list[str], sizes: list[int], top: int = 3) -> dict:
    """A held-out split's make-up: documents, tokens, Kish's effective number of documents (sum w)^2 / sum w^2
    with w each document's tokens, the largest share and the `top` largest documents with their shares."""
    total = sum(sizes)
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    effective = total ** 2 / sum(s * s for s in sizes) if total else 0.0
    return {"documents": len(sizes), "tokens": int(total), "effective": round(effective, 1),
            "max_share": round(sizes[order[0]] / total, 4) if total else 0.0,
            "top": [[names[i], round(sizes[i] / total, 4)] for i in order[:top]]}


def describe_composition(split: str, comp: dict) -> str:
    """One line: documents, tokens, effective number and the largest documents."""
    top = ", ".join(f"{name} {share:.1%}" for name, share in comp["top"])
    return (f"{split}: {comp['documents']} documents, {comp['tokens']:,} tokens, Kish effective "
            f"{comp['effective']:g}; largest {top}")


# ---------------------------------------------------------------- held-out splits a reader can trust
# A held-out split is a sample of documents: no generated file in it, no document filling it, enough documents.
# The rule of the study corpora (depthlab.data.dataset.held_out_split) and of `data prepare --held-out balanced`.
GENERATED_SHARE = 0.5  # a document at least this share of whose code lines are data lines is generated
HELD_CHUNK_BYTES = 2000  # a held-out document is cut at line breaks into chunks of at most this many characters
HELD_CHUNKS = 4  # and keeps at most this many of them, spread evenly from its first to its last
HELD_CAP_SHARE = 0.05  # and fewer where it would otherwise hold more than this share of its split's characters
_LITERAL = "|".join((r"""[rbuRBU]{0,2}'(?:[^'\\]|\\.)*'""", r'[rbuRBU]{0,2}"(?:[^"\\]|\\.)*"', r"0[xX][0-9a-fA-F]+",
                     r"[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?", "None", "True", "False"))  # one literal
_DATA_LINE = re.compile(rf"\s*(?:(?:{_LITERAL})\s*[,:;()\[\]{{}}]*\s*)+(?:#.*)?")


def data_line_share(text: str) -> float:
    """The share of a document's code lines (not blank, not a whole-line # comment) that are data lines: nothing
    but literals (numbers, hex, quoted strings, None/True/False) and punctuation, a trailing # comment allowed."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return sum(bool(_DATA_LINE.fullmatch(line)) for line in lines) / len(lines) if lines else 0.0


def generated(doc: Document) -> bool:
    """A generated file (a codec table, a data dump): at least GENERATED_SHARE of its code lines are data lines."""
    return data_line_share(doc.text) >= GENERATED_SHARE


def chunks(text: str, limit: int = HELD_CHUNK_BYTES) -> list[str]:
    """The text cut at line breaks into pieces of at most `limit` characters (a longer line cut at `limit`)."""
    out, current = [], ""
    for line in text.splitlines(keepends=True):
        while len(line) > limit:
            line, head = line[limit:], line[:limit]
            out += [current] if current else []
            out.append(head)
            current = ""
        if len(current) + len(line) > limit:
            out.append(current)
            current = ""
        current += line
    return [c for c in [*out, current] if c.strip()]


def spread(items: list, keep: int) -> list:
    """At most `keep` of the items, spread evenly from the first to the last."""
    if len(items) <= keep:
        return items
    if keep == 1:
        return items[:1]
    return [items[i] for i in sorted({round(j * (len(items) - 1) / (keep - 1)) for j in range(keep)})]


def held_chunks(doc: Document, limit: int = HELD_CHUNK_BYTES, keep: int = HELD_CHUNKS) -> list[str]:
    """What a held-out document contributes: its chunks, at most `keep` of them spread evenly over it (first and
    last included); the chunks left out are used nowhere."""
    return spread(chunks(doc.text, limit), keep)


def rebalance(part: list[tuple[str, list[str]]], cap: float = HELD_CAP_SHARE) -> list[tuple[str, list[str]]]:
    """A held-out split whose documents each hold at most `cap` of its characters: a larger one keeps fewer of its
    chunks (spread evenly), one at the least, until none is over."""
    part = list(part)
    while True:
        total = sum(len(c) for _, cs in part for c in cs)
        over = [i for i, (_, cs) in enumerate(part) if len(cs) > 1 and sum(map(len, cs)) > cap * total]
        if not over:
            return part
        for i in over:
            name, cs = part[i]
            part[i] = (name, spread(cs, len(cs) - 1))




def held_out_mask(is_generated: np.ndarray, period: int, first_eligible: int = 0) -> np.ndarray:
    """Which documents (in order; `is_generated`: each one's flag) are held out: every `period`-th of those that
    are not generated, counting from `first_eligible` (the number of non-generated documents before the first)."""
    eligible = ~np.asarray(is_generated, dtype=bool)
    return eligible & is_val(first_eligible + np.cumsum(eligible) - eligible, period)


def held_stream(tok: Tokenizer, part: list[tuple[str, list[str]]]) -> tuple[np.ndarray, list[int]]:
    """A held-out split's packed stream (every chunk followed by EOT) and each document's tokens, in order."""
    ids, lengths = encode_texts(tok, [c for _, cs in part for c in cs], eot_id(tok), token_dtype(tok.get_vocab_size()))
    ends = np.cumsum([len(cs) for _, cs in part])
    return ids, [int(x) for x in np.add.reduceat(lengths, np.r_[0, ends[:-1]])] if part else []


def check_composition(split: str, comp: dict, remedy: str) -> None:
    """Refuse a held-out split too few documents make, or one document fills (MIN_EFFECTIVE, MAX_SHARE)."""
    if comp["effective"] < MIN_EFFECTIVE:
        raise UserError(f"the {split} split has {comp['effective']:g} effective documents (Kish), fewer than "
                        f"{MIN_EFFECTIVE:g}: {remedy}")
    if comp["max_share"] > MAX_SHARE:
        name, share = comp["top"][0]
        raise UserError(f"{name} is {share:.0%} of the {split} split, more than {MAX_SHARE:.0%}: {remedy}")
