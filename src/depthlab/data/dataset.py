"""Text -> tokens -> packed batches.

Documents are split into train and validation *by document* (never a random crop of the stream), tokenized
with the batch API, and packed into one stream with an end-of-text token between documents: no padding.
Training samples are non-overlapping windows of the train stream visited in a seeded random order; the
sampler's position is plain data, so a resumed run sees exactly the tokens it would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from depthlab import UserError
from depthlab.config import Config
from depthlab.data.sources import Document, ReadReport, builtin_documents, read_documents
from depthlab.data.tokenizer import eot_id, load_tokenizer, tokenizer_hash, train_bpe

MIN_DOCUMENTS = 20  # fewer documents are cut into pieces at line boundaries so a held-out set exists


@dataclass
class TokenData:
    tokenizer: Tokenizer
    train: np.ndarray  # packed token ids, documents separated by EOT
    val: np.ndarray
    source: str  # a one-line description of where the text came from

    @property
    def tokenizer_hash(self) -> str:
        return tokenizer_hash(self.tokenizer)


def split_lines(doc: Document, pieces: int) -> list[Document]:
    lines = doc.text.splitlines(keepends=True)
    step = max(1, -(-len(lines) // pieces))
    return [Document(f"{doc.name}#{i}", "".join(lines[i:i + step])) for i in range(0, len(lines), step)]


def split_documents(docs: list[Document], val_fraction: float) -> tuple[list[Document], list[Document]]:
    """Deterministic split by document: evenly spaced documents (at least one) go to validation."""
    if len(docs) < MIN_DOCUMENTS:
        per_doc = -(-MIN_DOCUMENTS // len(docs))
        docs = [piece for d in docs for piece in split_lines(d, per_doc)]
    if len(docs) < 2:
        raise UserError("the data is too small to hold out a validation set (need at least 2 lines of text)")
    n_val = max(1, round(len(docs) * val_fraction))
    val_idx = set(np.linspace(0, len(docs) - 1, n_val + 2)[1:-1].round().astype(int).tolist())
    train = [d for i, d in enumerate(docs) if i not in val_idx]
    val = [d for i, d in enumerate(docs) if i in val_idx]
    return train, val


def pack(tok: Tokenizer, docs: list[Document], batch: int = 256) -> np.ndarray:
    """Tokenize with the batch API and concatenate, an EOT token after every document."""
    eot = eot_id(tok)
    dtype = np.uint16 if tok.get_vocab_size() <= 2**16 else np.uint32
    parts = []
    for i in range(0, len(docs), batch):
        for enc in tok.encode_batch([d.text for d in docs[i:i + batch]], add_special_tokens=False):
            parts.append(np.asarray(enc.ids, dtype=dtype))
            parts.append(np.asarray([eot], dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def load_text(cfg: Config) -> tuple[list[Document], str, ReadReport | None]:
    if cfg.data.paths:
        docs, report = read_documents(cfg.data.paths, cfg.data.fatal_bad_files)
        return docs, f"{', '.join(cfg.data.paths)} ({report.summary()})", report
    docs = builtin_documents(cfg.data.builtin_mb)
    return docs, f"built-in corpus: {len(docs)} Python standard-library files", None


def build_token_data(cfg: Config, tokenizer: Tokenizer | None = None) -> TokenData:
    """Read the configured text, get a tokenizer (given, from data.tokenizer, or trained), pack train/val."""
    docs, source, _ = load_text(cfg)
    train_docs, val_docs = split_documents(docs, cfg.data.val_fraction)
    if tokenizer is None:
        if cfg.data.tokenizer:
            tokenizer = load_tokenizer(cfg.data.tokenizer)
        else:  # trained on the training documents only, so validation text stays unseen
            tokenizer = train_bpe((d.text for d in train_docs), cfg.model.vocab_size)
    if tokenizer.get_vocab_size() > cfg.model.vocab_size:
        raise UserError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens but model.vocab_size is "
                        f"{cfg.model.vocab_size}; raise model.vocab_size")
    data = TokenData(tokenizer, pack(tokenizer, train_docs), pack(tokenizer, val_docs), source)
    need = cfg.data.seq_len + 1
    if len(data.val) < need or len(data.train) < need:
        raise UserError(f"not enough text: {len(data.train)} train / {len(data.val)} validation tokens, need at "
                        f"least {need} each for data.seq_len={cfg.data.seq_len}; give more data or a shorter seq_len")
    return data


def windows(tokens: np.ndarray, seq_len: int) -> int:
    """Number of non-overlapping (input, target) windows of seq_len in a stream."""
    return (len(tokens) - 1) // seq_len


def get_window(tokens: np.ndarray, i: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    chunk = tokens[i * seq_len: i * seq_len + seq_len + 1].astype(np.int64)
    return chunk[:-1], chunk[1:]


class PackedSampler:
    """Yields batches of windows in a seeded random order, epoch after epoch.

    The state (epoch, cursor) is the whole position. With world_size > 1 every step draws one global batch of
    batch_size * world_size windows and rank r takes its r-th slice: disjoint, and together complete.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1):
        self.tokens, self.seq_len, self.batch_size = tokens, seq_len, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.n = windows(tokens, seq_len)
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation(self.epoch)

    def _take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.cursor == self.n:
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            j = min(self.n, self.cursor + k - len(out))
            out += self._order[self.cursor:j].tolist()
            self.cursor = j
        return out

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._take(self.batch_size * self.world_size)
        mine = idx[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        xs, ys = zip(*(get_window(self.tokens, i, self.seq_len) for i in mine))
        return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


def eval_batches(tokens: np.ndarray, seq_len: int, batch_size: int):
    """Every non-overlapping window of the validation stream, in order, in batches."""
    n = windows(tokens, seq_len)
    for start in range(0, n, batch_size):
        xs, ys = zip(*(get_window(tokens, i, seq_len) for i in range(start, min(n, start + batch_size))))
        yield torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))
