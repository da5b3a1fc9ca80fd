"""A study's token streams: the data tokenized once into a folder (train.npy, val.npy, tokenizer.json and a
content hash in corpus.json), so every cell trains on the same tokens and the hash goes into every record."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np


def build_corpus(cfg, folder: Path) -> dict:
    """Tokenize cfg's data (a BPE trained on its training documents) into `folder` once; its corpus.json."""
    from depthlab.data.dataset import build_token_data

    folder = Path(folder)
    if (folder / "corpus.json").exists():
        return json.loads((folder / "corpus.json").read_text())
    data = build_token_data(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "train.npy", np.asarray(data.train))
    np.save(folder / "val.npy", np.asarray(data.val))
    data.tokenizer.save(str(folder / "tokenizer.json"))
    h = hashlib.sha256()
    for arr in (data.train, data.val):
        h.update(np.ascontiguousarray(arr).tobytes())
    info = {"source": data.source, "sha256": h.hexdigest(), "tokenizer_hash": data.tokenizer_hash,
            "train_tokens": int(len(data.train)), "val_tokens": int(len(data.val))}
    (folder / "corpus.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def unigram_loss(folder: Path, val_tokens: int | None = None) -> float:
    """The loss (nats per token) on the first val_tokens of a built corpus's validation split of predicting every token
    from the training tokens' frequencies alone (add-one smoothed): what a model that learned nothing from context
    reaches."""
    train, val = np.load(Path(folder) / "train.npy", mmap_mode="r"), np.load(Path(folder) / "val.npy")[:val_tokens]
    counts = np.bincount(train, minlength=int(max(train.max(), val.max())) + 1).astype(np.float64) + 1.0
    return float(-np.log(counts[val] / counts.sum()).mean())


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
