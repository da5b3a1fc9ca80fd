"""A study's token streams: the data tokenized once into a folder (train.npy, val.npy, test.npy, tokenizer.json and
a content hash in corpus.json), so every cell trains on the same tokens and the hash goes into every record.

The documents first lose their exact and near-duplicate copies (depthlab.data.dedup: a corpus of generated tables
would otherwise fill the validation slice that selects rates), then the held-out documents are dealt alternately to
validation (which selects) and test (which reports, and no selection reads) by depthlab.data.dataset.held_out_split:
generated files (tables, dumps) are never held out, a held-out document keeps at most a few chunks spread over it,
and each held-out split must have Kish's effective number of documents >= 30 and no document over 10% of it, or
the corpus is refused. corpus.json records each held-out split's make-up:

    splits.val, splits.test   {"documents", "tokens", "effective", "max_share", "top": [[name, share], ...],
                               "names": [each document, in stream order], "doc_tokens": [its tokens, EOTs included]}
    generated                 the documents the generated-file rule kept out of the held-out splits

A record's per-document losses (depthlab.study.runner) follow `names` in the same order.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from depthlab.ownership import write_whole

# near-copy threshold of the study corpus: the built-in corpus's generated codec tables (encodings/*) share their
# structure but not their values; at 0.8 MinHash catches 16 of its 104, at 0.5 64 (and 5 shims that re-export others)
NEAR_COPY = 0.5


def build_corpus(cfg, folder: Path, held_out: str = "balanced") -> dict:
    """Tokenize cfg's raw data (a BPE trained on its training documents) into `folder` once; its corpus.json. A
    folder built before the test split (or the split composition) existed is read as it is. `held_out`: "balanced"
    (held_out_split, checked: the rule of every new study), or "alternate" (every val_period-th document whole,
    dealt to validation and test in turn: the rule the studies before issue 50 were built with, kept for their
    split; their dedup changed since, see docs/data.md)."""
    from depthlab.data.dataset import check_composition, held_out_split, load_text, split_documents
    from depthlab.data.dedup import dedup
    from depthlab.data.tokenizer import tokenizer_hash, train_bpe
    from depthlab.data.tokens import pack

    folder = Path(folder)
    if (folder / "corpus.json").exists():
        return json.loads((folder / "corpus.json").read_text())
    docs, source, _ = load_text(cfg)
    kept, report = dedup(docs, NEAR_COPY)
    if held_out == "balanced":
        train, held, skipped = held_out_split(kept, cfg.data.val_fraction)
    else:
        train, both = split_documents(kept, cfg.data.val_fraction)
        held, skipped = {"val": [(d.name, [d.text]) for d in both[0::2]],
                         "test": [(d.name, [d.text]) for d in both[1::2]]}, None
    tokenizer = train_bpe((d.text for d in train), cfg.model.vocab_size, False)
    streams, splits = {"train": np.asarray(pack(tokenizer, train))}, {}
    for name, part in held.items():
        streams[name], splits[name] = _held_stream(tokenizer, part)
    if held_out == "balanced":
        for name, comp in splits.items():
            check_composition(name, comp, "give more documents (data.builtin_mb) or a larger data.val_fraction")
    folder.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    for name, arr in streams.items():
        np.save(folder / f"{name}.npy", arr)
        h.update(np.ascontiguousarray(arr).tobytes())
    tokenizer.save(str(folder / "tokenizer.json"))
    info = {"source": source, "sha256": h.hexdigest(), "tokenizer_hash": tokenizer_hash(tokenizer),
            "dedup": {**report.summary(), "threshold": NEAR_COPY},
            **{f"{k}_tokens": int(len(v)) for k, v in streams.items()},
            "documents": {"train": len(train), **{k: len(v) for k, v in held.items()}},
            "held_out": held_out, "splits": splits, **({"generated": skipped} if skipped is not None else {})}
    write_whole(folder / "corpus.json", json.dumps(info, indent=2) + "\n")
    return info


def _held_stream(tokenizer, part: list[tuple[str, list[str]]]) -> tuple[np.ndarray, dict]:
    """A held-out split's packed stream (depthlab.data.tokens.held_stream) and its make-up (composition, with each
    document's name and tokens in stream order)."""
    from depthlab.data.tokens import composition, held_stream

    ids, doc_tokens = held_stream(tokenizer, part)
    names = [n for n, _ in part]
    return ids, {**composition(names, doc_tokens), "names": names, "doc_tokens": doc_tokens}


def unigram_loss(folder: Path, val_tokens: int | None = None) -> float:
    """The loss (nats per token) on the first val_tokens of a built corpus's validation split of predicting every token
    from the training tokens' frequencies alone (add-one smoothed): what a model that learned nothing from context
    reaches."""
    train = np.load(Path(folder) / "train.npy", mmap_mode="r")
    val = np.load(Path(folder) / "val.npy")[:val_tokens or None]
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


def held_out_units(folder: Path) -> dict[str, list[int]]:
    """Each held-out split's per-document token counts (in stream order) of a built corpus; {} for one built before
    splits recorded their make-up."""
    info = json.loads((Path(folder) / "corpus.json").read_text())
    return {name: s["doc_tokens"] for name, s in (info.get("splits") or {}).items()}


def document_losses(model, tokens: np.ndarray, doc_tokens: list[int], seq_len: int, batch_size: int, device,
                    dtype: str = "fp32") -> dict:
    """Mean loss (nats per token) on each document of a held-out stream, over the windows `evaluate` scores
    (non-overlapping windows of seq_len; a document's tokens past the last whole window are not scored), each token
    counted for the document its target belongs to: {"loss": [per document, None where none scored], "tokens":
    [scored targets per document]}. The token-weighted mean of "loss" is evaluate's val_loss."""
    import torch

    from depthlab.data.dataset import eval_batches
    from depthlab.device import autocast
    from depthlab.model.loss import lm_loss

    starts = np.cumsum([0, *doc_tokens])  # target at stream position p belongs to document searchsorted(p) - 1
    sums, counts, pos = np.zeros(len(doc_tokens)), np.zeros(len(doc_tokens), dtype=np.int64), 1
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for x, y in eval_batches(tokens, seq_len, batch_size):
            with autocast(device, dtype):
                per = lm_loss(model(x.to(device)), y.to(device), "none").double().cpu().numpy()
            doc = np.searchsorted(starts, np.arange(pos, pos + per.size), side="right") - 1
            np.add.at(sums, doc, per)
            np.add.at(counts, doc, 1)
            pos += per.size
    model.train(was_training)
    return {"loss": [float(s / c) if c else None for s, c in zip(sums, counts, strict=True)],
            "tokens": [int(c) for c in counts]}
