"""The primitives every path shares: the held-out rule, the token dtype, and batch encoding with EOT packing.

Kept free of torch so that `data prepare` worker processes start fast.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

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


def held_out_count(n_docs: int, period: int) -> int:
    """How many of documents 0..n_docs-1 `is_val` holds out."""
    return max(0, (n_docs - period // 2 + period - 1) // period)


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
