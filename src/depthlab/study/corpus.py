"""A study's token streams: the data tokenized once into a folder (train.npy, val.npy, test.npy, tokenizer.json and
a content hash in corpus.json), so every cell trains on the same tokens and the hash goes into every record.

The documents first lose their exact and near-duplicate copies (depthlab.data.dedup: a corpus of generated tables
would otherwise fill the validation slice that selects rates), then the held-out documents are dealt alternately to
validation (which selects) and test (which reports, and no selection reads).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from depthlab.owned import write_whole

# near-copy threshold of the study corpus: the built-in corpus's generated codec tables (encodings/*) share their
# structure but not their values; at 0.8 MinHash catches 16 of its 104, at 0.5 64 (and 5 shims that re-export others)
NEAR_COPY = 0.5


def build_corpus(cfg, folder: Path) -> dict:
    """Tokenize cfg's raw data (a BPE trained on its training documents) into `folder` once; its corpus.json. A
    folder built before the test split existed is read as it is (no test.npy, no dedup entry)."""
    from depthlab.data.dataset import load_text, split_documents
    from depthlab.data.dedup import dedup
    from depthlab.data.tokenizer import tokenizer_hash, train_bpe
    from depthlab.data.tokens import pack

    folder = Path(folder)
    if (folder / "corpus.json").exists():
        return json.loads((folder / "corpus.json").read_text())
    docs, source, _ = load_text(cfg)
    kept, report = dedup(docs, NEAR_COPY)
    train, held = split_documents(kept, cfg.data.val_fraction)
    val, test = held[0::2], held[1::2]
    tokenizer = train_bpe((d.text for d in train), cfg.model.vocab_size, False)
    streams = {name: np.asarray(pack(tokenizer, part)) for name, part in (("train", train), ("val", val),
                                                                          ("test", test))}
    folder.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    for name, arr in streams.items():
        np.save(folder / f"{name}.npy", arr)
        h.update(np.ascontiguousarray(arr).tobytes())
    tokenizer.save(str(folder / "tokenizer.json"))
    info = {"source": source, "sha256": h.hexdigest(), "tokenizer_hash": tokenizer_hash(tokenizer),
            "dedup": {**report.summary(), "threshold": NEAR_COPY},
            **{f"{k}_tokens": int(len(v)) for k, v in streams.items()},
            "documents": {"train": len(train), "val": len(val), "test": len(test)}}
    write_whole(folder / "corpus.json", json.dumps(info, indent=2) + "\n")
    return info


def unigram_loss(folder: Path, val_tokens: int | None = None) -> float:
    """The loss (nats per token) on the first val_tokens of a built corpus's validation split of predicting every token
    from the training tokens' frequencies alone (add-one smoothed): what a model that learned nothing from context
    reaches."""
    train, val = np.load(Path(folder) / "train.npy", mmap_mode="r"), np.load(Path(folder) / "val.npy")[:val_tokens]
    counts = np.bincount(train, minlength=int(max(train.max(), val.max())) + 1).astype(np.float64) + 1.0
    return float(-np.log(counts[val] / counts.sum()).mean())


def test_tokens(folder: Path) -> np.ndarray | None:
    """The test split of a built corpus; None for a corpus built before it had one."""
    path = Path(folder) / "test.npy"
    return np.load(path) if path.exists() else None


def load_corpus(folder: Path, val_tokens: int | None = None):
    """(TokenData whose validation is the first val_tokens of the split, the whole validation stream)."""
    from depthlab.data.dataset import TokenData
    from depthlab.data.tokenizer import load_tokenizer

    folder = Path(folder)
    info = json.loads((folder / "corpus.json").read_text())
    val = np.load(folder / "val.npy")
    data = TokenData(load_tokenizer(folder / "tokenizer.json"), np.load(folder / "train.npy", mmap_mode="r"),
                     val[:val_tokens] if val_tokens else val, info["source"])
    return data, val
