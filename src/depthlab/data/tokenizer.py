"""Tokenizers: any tokenizer.json, any `transformers` tokenizer directory, or byte-level BPE trained on the data.

Everything is a `tokenizers.Tokenizer` (the fast Rust tokenizer, with a batch API). A transformers directory is
loaded through its tokenizer.json when it has one (fast tokenizers ship it); a directory with only a slow
tokenizer (e.g. T5's spiece.model) is converted by transformers. The hash identifies a tokenizer by content, so
prepared data and runs can check that they agree.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from depthlab import UserError
from depthlab.progress import on_terminal, phase

EOT = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"


def train_bpe(texts, vocab_size: int, progress: bool = False) -> Tokenizer:
    """Byte-level BPE trained on `texts` (with `progress`, the tokenizers library's own bars on a terminal)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=on_terminal(progress),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    with phase("train tokenizer", progress):  # off a terminal: a plain line every ~10 s, not silence
        tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _from_file(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exceptions with its parse errors
        raise UserError(f"cannot load tokenizer {path}: {e}") from None


def _from_transformers(path: Path) -> Tokenizer:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UserError(f"{path} has no {TOKENIZER_FILE}; converting a slow tokenizer needs `transformers` "
                        f"(pip install transformers sentencepiece)") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers raises OSError / ValueError / ImportError (missing sentencepiece)
        raise UserError(f"cannot load tokenizer directory {path}: {str(e).splitlines()[0]}") from None
    if not getattr(tok, "is_fast", False):
        raise UserError(f"{path}: transformers could not build a fast tokenizer; save one with "
                        f"tokenizer.save_pretrained() from a PreTrainedTokenizerFast")
    return tok.backend_tokenizer


def load_tokenizer(spec: str | Path) -> Tokenizer:
    """A tokenizer.json file, or a directory holding one (a transformers tokenizer directory)."""
    path = Path(spec)
    if path.is_dir():
        return _from_file(path / TOKENIZER_FILE) if (path / TOKENIZER_FILE).is_file() else _from_transformers(path)
    if path.is_file():
        return _from_file(path)
    raise UserError(f"tokenizer {str(spec)!r}: no such file or directory (give a tokenizer.json or a transformers "
                    f"tokenizer directory)")


def eot_id(tok: Tokenizer) -> int:
    """The document separator: <|endoftext|>, or the tokenizer's own end-of-sequence token."""
    for name in (EOT, "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "[SEP]"):
        i = tok.token_to_id(name)
        if i is not None:
            return i
    raise UserError("the tokenizer has no end-of-text token (looked for <|endoftext|>, </s>, <eos>)")


def tokenizer_hash(tok: Tokenizer) -> str:
    """Content hash of the tokenizer's canonical JSON (key order and formatting do not matter)."""
    canonical = json.dumps(json.loads(tok.to_str()), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
