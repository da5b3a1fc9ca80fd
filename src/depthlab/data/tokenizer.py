"""Tokenizers: byte-level BPE trained on the data with `tokenizers`, or any tokenizer.json."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from depthlab import UserError

EOT = "<|endoftext|>"


def train_bpe(texts, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exceptions with its parse errors
        raise UserError(f"cannot load tokenizer {path}: {e}") from None


def eot_id(tok: Tokenizer) -> int:
    """The document separator: <|endoftext|>, or the tokenizer's own end-of-sequence token."""
    for name in (EOT, "</s>", "<eos>", "<|end_of_text|>", "[SEP]"):
        i = tok.token_to_id(name)
        if i is not None:
            return i
    raise UserError("the tokenizer has no end-of-text token (looked for <|endoftext|>, </s>, <eos>)")


def tokenizer_hash(tok: Tokenizer) -> str:
    return hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]
