"""Tokens for training: prepared data memory-mapped, or small raw inputs tokenized on the fly; and the loader.

Documents are split into train and validation *by document* (every val_period-th document, never a random crop
of the stream) and packed into one stream with an end-of-text token after every document: no padding.
Training samples are non-overlapping windows of the train stream visited in a seeded random order; the
sampler's position is plain data, so a resumed run sees exactly the tokens it would have seen.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from depthlab import UserError
from depthlab.config import Config
from depthlab.data.prepare import bounded, check_line_lengths
from depthlab.data.prepared import is_prepared, load_prepared
from depthlab.data.sources import Document, ReadReport, builtin_documents, describe_inputs, expand, read_documents
from depthlab.data.tokenizer import load_tokenizer, tokenizer_hash, train_bpe
from depthlab.data.tokens import (  # noqa: F401 (the held-out rule, re-exported where it was first defined)
    GENERATED_SHARE,
    HELD_CAP_SHARE,
    HELD_CHUNK_BYTES,
    HELD_CHUNKS,
    MAX_SHARE,
    MIN_EFFECTIVE,
    check_composition,
    chunks,
    composition,
    data_line_share,
    generated,
    held_chunks,
    held_out_mask,
    is_val,
    pack,
    rebalance,
    spread,
    val_period,
)
from depthlab.paths import VAL_TOKENS

__all__ = ["TokenData", "build_token_data", "eval_tokens", "PackedSampler", "OrderedSampler", "SeededOrder",
           "eval_batches", "pack", "read_documents", "held_out_split", "composition"]

MIN_DOCUMENTS = 20  # fewer documents are cut into pieces at line boundaries so a held-out set exists
ON_THE_FLY_MAX_BYTES = 256e6  # more raw text than this must go through `depthlab data prepare`


@dataclass
class TokenData:
    tokenizer: Tokenizer
    train: np.ndarray  # packed token ids, documents separated by EOT (an np.memmap for prepared data)
    val: np.ndarray
    source: str  # a one-line description of where the text came from
    meta: dict = field(default_factory=dict)  # the prepared directory's index, if any

    @property
    def tokenizer_hash(self) -> str:
        return tokenizer_hash(self.tokenizer)


def split_lines(doc: Document, pieces: int) -> list[Document]:
    lines = doc.text.splitlines(keepends=True)
    step = max(1, -(-len(lines) // pieces))
    return [Document(f"{doc.name}#{i}", "".join(lines[i:i + step])) for i in range(0, len(lines), step)]


def split_documents(docs: list[Document], val_fraction: float) -> tuple[list[Document], list[Document]]:
    """The held-out rule of `data prepare`; fewer than MIN_DOCUMENTS are first cut into pieces at lines."""
    if len(docs) < MIN_DOCUMENTS:
        per_doc = -(-MIN_DOCUMENTS // len(docs))
        docs = [piece for d in docs for piece in split_lines(d, per_doc)]
    period = val_period(val_fraction)
    train = [d for i, d in enumerate(docs) if not is_val(i, period)]
    val = [d for i, d in enumerate(docs) if is_val(i, period)]
    if not train or not val:
        need = period // 2 + 1  # documents (or lines) up to the first held-out one
        raise UserError(f"the data is too small to hold out a validation set: one document (or line) in {period} is "
                        f"held out, the first being number {need}; need at least {need} lines of text")
    return train, val


# ---------------------------------------------------------------- held-out splits a reader can trust
def whole(docs: list[Document]) -> list[Document]:
    """The documents with the pieces `bounded` cut from one ("NAME#0", "NAME#1", ... in a row) joined again, so a
    document is held out whole or not at all."""
    out: list[Document] = []
    for d in docs:
        base, _, i = d.name.rpartition("#")
        if i.isdigit() and i != "0" and out and out[-1].name == base:
            out[-1] = Document(base, out[-1].text + d.text)
        else:
            out.append(Document(base, d.text) if i == "0" and base else d)
    return out


def held_out_split(docs: list[Document], val_fraction: float, splits: tuple[str, ...] = ("val", "test")
                   ) -> tuple[list[Document], dict[str, list[tuple[str, list[str]]]], list[str]]:
    """(training documents, each held-out split's documents as (name, the chunks it keeps), the generated files
    kept out of the held-out splits). The documents `held_out_mask` picks (every val_period-th that is not
    generated) are dealt to `splits` in turn; a held-out document is cut into chunks (held_chunks, then fewer by
    `rebalance`) and all of them go to its one split, and no part of it is trained on. Generated documents are
    trained on and never held out."""
    docs = whole(docs)
    gen = [generated(d) for d in docs]
    held_mask = held_out_mask(np.array(gen, dtype=bool), val_period(val_fraction))
    held: dict[str, list[tuple[str, list[str]]]] = {s: [] for s in splits}
    for k, d in enumerate(d for d, h in zip(docs, held_mask, strict=True) if h):
        held[splits[k % len(splits)]].append((d.name, held_chunks(d)))
    train = [d for d, h in zip(docs, held_mask, strict=True) if not h]
    skipped = [d.name for d, g in zip(docs, gen, strict=True) if g]
    return train, {s: rebalance(part) for s, part in held.items()}, skipped


def load_text(cfg: Config) -> tuple[list[Document], str, ReadReport | None]:
    d = cfg.data
    if d.paths:
        check_line_lengths(expand(d.paths))  # before reading: a giant line is refused, not tokenized for minutes
        docs, report = read_documents(d.paths, d.fatal_bad_files, d.text_field, d.hf_streaming, ON_THE_FLY_MAX_BYTES)
        docs = [piece for doc in docs for piece in bounded(doc)]  # as `data prepare` cuts them
        return docs, f"{describe_inputs(d.paths)} ({report.summary()})", report
    docs = builtin_documents(d.builtin_mb)
    return docs, f"built-in corpus: {len(docs)} Python source files ({d.builtin_mb:g} MB)", None


def _prepared_data(paths: list[str], wanted: Tokenizer | None, check: tuple[str, ...] | None = None) -> TokenData:
    """A prepared directory's memory-mapped splits; `wanted`, if given, must be the tokenizer it was made with;
    `check`: the splits the caller reads, checked against their checksums (None: all)."""
    if len(paths) != 1:
        raise UserError(f"give one prepared-data directory, or raw files only; got {describe_inputs(paths)}")
    path = paths[0]
    index, tok, arrays = load_prepared(path, check)
    if wanted is not None and tokenizer_hash(wanted) != index["tokenizer_hash"]:
        raise UserError(f"{path} was prepared with tokenizer {index['tokenizer_hash']}, not the requested "
                        f"{tokenizer_hash(wanted)}; prepare the data again with that tokenizer")
    return TokenData(tok, arrays["train"], arrays["val"], f"{path}: {index['source']}", index)


def _raw_data(cfg: Config, tokenizer: Tokenizer | None, progress: bool) -> TokenData:
    docs, source, _ = load_text(cfg)
    train_docs, val_docs = split_documents(docs, cfg.data.val_fraction)
    if tokenizer is None:
        if cfg.data.tokenizer:
            tokenizer = load_tokenizer(cfg.data.tokenizer)
        else:  # trained on the training documents only, so validation text stays unseen
            tokenizer = train_bpe((d.text for d in train_docs), cfg.model.vocab_size, progress)
    return TokenData(tokenizer, pack(tokenizer, train_docs, progress=progress, desc="tokenize train"),
                     pack(tokenizer, val_docs, progress=progress, desc="tokenize validation"), source)


def build_token_data(cfg: Config, tokenizer: Tokenizer | None = None, progress: bool = False) -> TokenData:
    """The configured data: a prepared directory (memory-mapped), or raw text tokenized now (given tokenizer,
    data.tokenizer, or byte-level BPE trained on the training documents); `progress`: bars on a terminal."""
    if any(is_prepared(p) for p in cfg.data.paths):
        wanted = tokenizer or (load_tokenizer(cfg.data.tokenizer) if cfg.data.tokenizer else None)
        data = _prepared_data(cfg.data.paths, wanted)
    else:
        data = _raw_data(cfg, tokenizer, progress)
    vocab = data.tokenizer.get_vocab_size()
    if vocab > cfg.model.vocab_size:
        raise UserError(f"the tokenizer has {vocab} tokens but model.vocab_size is {cfg.model.vocab_size}; "
                        f"raise model.vocab_size to at least {vocab}")
    need = cfg.data.seq_len + 1
    if len(data.val) < need or len(data.train) < need:
        raise UserError(f"not enough text: {len(data.train)} train / {len(data.val)} validation tokens, need at "
                        f"least {need} each for data.seq_len={cfg.data.seq_len}; give more data or a shorter seq_len")
    return data


def eval_tokens(paths: list[str], tokenizer: Tokenizer, text_field: str = "text",
                progress: bool = False) -> tuple[np.ndarray, str]:
    """Tokens to evaluate a model on: a prepared directory's validation split (made with `tokenizer`), or raw
    files packed now with `tokenizer`; and a one-line description."""
    if any(is_prepared(p) for p in paths):
        data = _prepared_data(paths, tokenizer, check=("val",))
        return data.val, f"the validation split of {data.source}"
    check_line_lengths(expand(paths))
    docs, report = read_documents(paths, text_field=text_field)
    return pack(tokenizer, docs, progress=progress), f"{describe_inputs(paths)} ({report.summary()})"


def tokens_digest(tokens: np.ndarray) -> str:
    """Content hash of a token stream (its dtype and ids)."""
    h = hashlib.sha256(np.dtype(tokens.dtype).str.encode())
    h.update(np.ascontiguousarray(tokens).tobytes())
    return h.hexdigest()[:16]


def save_val_tokens(run_dir: Path, tokens: np.ndarray) -> None:
    """Keep a run's validation tokens (raw text tokenized for the run), so `eval ppl RUN` need not tokenize again;
    written whole or not at all."""
    tmp = run_dir / (VAL_TOKENS + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, np.asarray(tokens), allow_pickle=False)
    os.replace(tmp, run_dir / VAL_TOKENS)


def saved_val_tokens(run_dir: Path | None, digest: str | None) -> np.ndarray | None:
    """The validation tokens `save_val_tokens` kept in a run, memory-mapped, if they are the ones `digest` (a
    checkpoint's val_digest) names; None otherwise (an older run, another run's file, a damaged file)."""
    path = run_dir / VAL_TOKENS if run_dir is not None else None
    if not digest or path is None or not path.is_file():
        return None
    try:
        tokens = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    return tokens if tokens.ndim == 1 and tokens_digest(tokens) == digest else None


def windows(tokens: np.ndarray, seq_len: int) -> int:
    """Number of non-overlapping (input, target) windows of seq_len in a stream."""
    return (len(tokens) - 1) // seq_len


def gather_windows(tokens: np.ndarray, idx: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows idx as int64 (inputs, targets); one vectorised read, so a memory map pages in only what it needs."""
    rows = np.asarray(tokens[idx[:, None] * seq_len + np.arange(seq_len + 1)], dtype=np.int64)
    return torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:])


def shuffled(idx: np.ndarray, n: int, seed: int, epoch: int, rounds: int = 4) -> np.ndarray:
    """Position idx of a seeded pseudo-random permutation of range(n), computed without storing it.

    A Feistel network is a bijection on [0, 4**half_bits); applying it again to values >= n ("cycle walking")
    keeps it a bijection on [0, n). Memory is O(len(idx)), so a corpus of a billion windows costs nothing.
    """
    half = max(1, -(-max(1, (n - 1).bit_length()) // 2))
    mask = np.uint64((1 << half) - 1)
    keys = np.random.default_rng([seed, epoch]).integers(0, 2**63, size=rounds, dtype=np.uint64)

    def feistel(x):
        left, right = x >> np.uint64(half), x & mask
        for key in keys:
            h = (right ^ key) * np.uint64(0x9E3779B97F4A7C15)  # splitmix64-style mixing
            h ^= h >> np.uint64(31)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            left, right = right, left ^ ((h ^ (h >> np.uint64(29))) & mask)
        return (left << np.uint64(half)) | right

    y = feistel(np.asarray(idx, dtype=np.uint64))
    while (out := y >= n).any():
        y[out] = feistel(y[out])
    return y.astype(np.int64)


class SeededOrder:
    """The one seeded, resumable order every sampler draws from: position idx of epoch e is
    `shuffled(idx, n, seed, e)`, epoch after epoch, never stored.

    Each `next()` takes one global batch of batch_size * world_size items and returns this rank's slice of it (the
    r-th): the ranks' slices are disjoint and together complete. The state (epoch, cursor) is the whole position,
    the same on every rank, and counts items of the global order, so a run may resume on another world size.
    `identity` (e.g. windows and seq_len) is what the state records besides the seed; a state that names another
    is refused as "the {name} loader state does not fit this data; resume with the same {same} and seed"."""

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1, *,
                 name: str = "data", same: str = "data", **identity):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.n, self.batch_size, self.seed, self.rank, self.world_size = n, batch_size, seed, rank, world_size
        self.name, self.same, self.identity = name, same, identity
        self.epoch, self.cursor = 0, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed, **self.identity}

    def load_state_dict(self, state: dict) -> None:
        mine = {"seed": self.seed, **self.identity}
        changed = [f"{k} {state[k]} -> {v}" for k, v in mine.items() if k in state and state[k] != v]
        if changed:  # the position would point at other items: refuse rather than silently resume elsewhere
            raise UserError(f"the {self.name} loader state does not fit this data ({', '.join(changed)}); resume "
                            f"with the same {self.same} and seed")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])

    def next(self) -> np.ndarray:
        """This rank's item indices of the next global batch."""
        k, out = self.batch_size * self.world_size, []
        while k:
            if self.cursor == self.n:
                self.epoch, self.cursor = self.epoch + 1, 0
            j = min(self.n, self.cursor + k)
            out.append(shuffled(np.arange(self.cursor, j), self.n, self.seed, self.epoch))
            k -= j - self.cursor
            self.cursor = j
        return np.concatenate(out)[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]


class OrderedSampler:
    """A sampler that draws its items in a SeededOrder (`self.order`): its state, saved in a checkpoint and loaded
    on resume, is that order's position. Every training sampler is one (windows, images, padded examples)."""

    order: SeededOrder

    def state_dict(self) -> dict:
        return self.order.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.order.load_state_dict(state)


class PackedSampler(OrderedSampler):
    """Yields batches of token windows in the SeededOrder of the windows (epoch after epoch, per rank, resumable):
    a resumed run sees exactly the tokens it would have seen, on any world size."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1):
        n = windows(tokens, seq_len)
        self.order = SeededOrder(n, batch_size, seed, rank, world_size, same="data, seq_len", windows=n,
                                 seq_len=seq_len)
        if n < 1:
            raise UserError(f"{len(tokens)} tokens hold no window of seq_len {seq_len}")
        self.tokens, self.seq_len = tokens, seq_len

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return gather_windows(self.tokens, self.order.next(), self.seq_len)


def eval_batches(tokens: np.ndarray, seq_len: int, batch_size: int):
    """Every non-overlapping window of the validation stream, in order, in batches."""
    n = windows(tokens, seq_len)
    for start in range(0, n, batch_size):
        yield gather_windows(tokens, np.arange(start, min(n, start + batch_size)), seq_len)
