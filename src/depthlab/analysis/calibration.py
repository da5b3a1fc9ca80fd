"""Calibration data -> batches: token ids with a mask of real tokens (language models), or images with their labels
(a ViT).

depthlab tokenizers: the documents are packed into one stream (EOT between documents) and cut into full windows,
so there is no padding at all. HF tokenizers: each document is tokenized on its own and cut into windows of at
most seq_len tokens (each starting with BOS when the tokenizer adds one); short windows are right-padded and the
attention mask marks the real tokens. Every metric reads the mask, so a pad is never taken as "the last token".

Images (a depthlab ViT): the validation split rebuilt from the run's config (or of another image source), normalised
with the run's training statistics; the mask is all True over the tokens each image becomes (patches and the class
token), so the stream metrics read a ViT's tokens as they read text tokens.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import torch

from depthlab import UserError
from depthlab.checkpoint import CheckpointMeta


@dataclass
class Batch:
    ids: torch.Tensor  # (B, T) long
    mask: torch.Tensor  # (B, T) bool, True on real tokens

    @property
    def inputs(self) -> torch.Tensor:
        """What the model is called on."""
        return self.ids

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())


@dataclass
class ImageBatch:
    images: torch.Tensor  # (B, C, H, W) float32, normalised as in training
    labels: torch.Tensor  # (B,) long class ids
    mask: torch.Tensor  # (B, T) bool, all True: every patch token (and the class token) is real
    ids = None  # no token ids (a class attribute, not a field): the stream statistics report no token_id

    @property
    def inputs(self) -> torch.Tensor:
        return self.images

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())


def last_real_index(mask: torch.Tensor) -> torch.Tensor:
    """(B,) position of the last real token of each row; right or left padding alike."""
    T = mask.shape[1]
    return T - 1 - mask.flip(1).float().argmax(1)


# Where a Project Gutenberg play's text begins, after the licence header: the line naming its persons, or its first act
GUTENBERG_START = re.compile(r"^(Dramatis Personae|DRAMATIS PERSONAE|ACT I|Actus Primus)", re.M)


def gutenberg_body(text: str) -> str:
    """A Project Gutenberg play without its licence header (`analyze --gutenberg`): from the first line naming its
    persons or its first act (else from a tenth of the way in), lines ended by \\n as Python reads text files."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    m = GUTENBERG_START.search(text)
    return text[m.start():] if m else text[len(text) // 10:]


def read_calibration_text(paths: list[str] | None, n_tokens: int, gutenberg: bool = False) -> tuple[list[str], str]:
    """The calibration documents' texts and a description; `gutenberg`: each file a Project Gutenberg play, read
    without its licence header (gutenberg_body)."""
    from depthlab.data.sources import builtin_documents, read_documents
    from depthlab.paths import Kind, what_is

    if paths:
        prepared = [p for p in paths if what_is(p) is Kind.PREPARED]
        if prepared:  # its token files hold no text to calibrate on, whatever else is given
            raise UserError(f"{prepared[0]} is a prepared-data directory (token files); analyze calibrates on "
                            "text: give --data the text files it was prepared from")
        docs, report = read_documents(paths)
        if gutenberg:
            return [gutenberg_body(d.text) for d in docs], (f"{', '.join(paths)} ({report.summary()}; Project "
                                                            "Gutenberg licence headers left out)")
        return [d.text for d in docs], f"{', '.join(paths)} ({report.summary()})"
    # Python source tokenizes at roughly 3-4 bytes a token; read a little more than needed.
    docs = builtin_documents(max(0.02, n_tokens * 8 / 1e6))
    return [d.text for d in docs], f"built-in corpus ({len(docs)} Python source files)"


def pack_windows(stream: np.ndarray, n_tokens: int, seq_len: int, targets_after: bool = False) -> list[np.ndarray]:
    """ceil(n_tokens / seq_len) windows from the start of a packed stream (as many as it holds), seq_len apart.
    `targets_after`: each window also holds the token after it, so that its seq_len inputs are scored on the
    seq_len tokens that follow each of them, as `depthlab eval ppl` and a run's validation read the same stream
    (depthlab.eval.perplexity.evaluate): the same loss on the same tokens."""
    extra = int(targets_after)
    n_windows = max(1, min(-(-n_tokens // seq_len), (len(stream) - extra) // seq_len))
    if len(stream) < seq_len + extra:
        return [stream]
    return [stream[i * seq_len:(i + 1) * seq_len + extra] for i in range(n_windows)]


def sample_windows(stream: np.ndarray, n_windows: int, seq_len: int, seed: int = 0) -> np.ndarray:
    """A seeded sample of n_windows non-overlapping windows spread over the whole stream (all of them when it holds
    fewer), in stream order, as an (n, seq_len) array: a probe that reads the whole split, not its first files."""
    total = len(stream) // seq_len
    if total < 1:
        raise UserError(f"{len(stream)} tokens cannot fill one window of {seq_len}")
    starts = np.sort(np.random.default_rng(seed).choice(total, min(n_windows, total), replace=False)) * seq_len
    return np.stack([np.asarray(stream[s:s + seq_len], dtype=np.int64) for s in starts])


def probe_batches(stream: np.ndarray, n_windows: int, seq_len: int, batch_size: int = 16, seed: int = 0,
                  device: str = "cpu") -> list[Batch]:
    """Full (unpadded) windows of a packed token stream, sampled by `sample_windows`, as analysis batches."""
    ids = torch.from_numpy(sample_windows(stream, n_windows, seq_len, seed)).to(device)
    return [Batch(ids[i:i + batch_size], torch.ones_like(ids[i:i + batch_size], dtype=torch.bool))
            for i in range(0, len(ids), batch_size)]


def padded_windows(docs_ids: list[list[int]], n_tokens: int, seq_len: int,
                   bos: int | None = None) -> list[np.ndarray]:
    """Windows of at most seq_len tokens cut from each document; each starts with `bos` when given."""
    windows, total = [], 0
    prefix = [] if bos is None else [bos]
    step = seq_len - len(prefix)
    for ids in docs_ids:
        for i in range(0, len(ids), step):
            w = np.asarray(prefix + ids[i:i + step], dtype=np.int64)
            if len(w) < 2:
                continue
            windows.append(w)
            total += len(w)
            if total >= n_tokens:
                return windows
    return windows


def to_batches(windows: list[np.ndarray], pad_id: int, batch_size: int) -> list[Batch]:
    batches = []
    for i in range(0, len(windows), batch_size):
        group = windows[i:i + batch_size]
        T = max(len(w) for w in group)
        ids = torch.full((len(group), T), pad_id, dtype=torch.long)
        mask = torch.zeros((len(group), T), dtype=torch.bool)
        for r, w in enumerate(group):
            ids[r, :len(w)] = torch.from_numpy(w.astype(np.int64))
            mask[r, :len(w)] = True
        batches.append(Batch(ids, mask))
    return batches


def calibration_batches(tokenizer, texts: list[str], n_tokens: int, seq_len: int, batch_size: int,
                        vocab_size: int, sample: int | None = None, seed: int = 0,
                        progress: bool = False) -> list[Batch]:
    """The first n_tokens of the text as batches; or, with `sample`, that many windows drawn (seeded) from all of
    it, in text order."""
    return to_batches(*calibration_windows(tokenizer, texts, n_tokens, seq_len, vocab_size, sample, seed, progress),
                      batch_size)


def split_windows(windows: list[np.ndarray], n_tokens: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(the first windows holding n_tokens, the rest)."""
    total = np.cumsum([len(w) for w in windows])
    n = int(np.searchsorted(total, n_tokens)) + 1
    return windows[:n], windows[n:]


def calibration_windows(tokenizer, texts: list[str], n_tokens: int, seq_len: int, vocab_size: int,
                        sample: int | None = None, seed: int = 0, progress: bool = False,
                        targets_after: bool = False) -> tuple[list[np.ndarray], int]:
    """(windows, pad id) of calibration_batches; `targets_after`: a packed stream's windows as pack_windows cuts
    them with it (a depthlab tokenizer's)."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        from depthlab.data.dataset import pack
        from depthlab.data.sources import Document

        stream = pack(tokenizer, [Document(str(i), t) for i, t in enumerate(texts)], progress=progress,
                      desc="tokenize calibration text")
        pad_id = 0
        windows = (list(sample_windows(stream, sample, seq_len, seed)) if sample and len(stream) >= seq_len
                   else pack_windows(stream, n_tokens, seq_len, targets_after))
    else:
        enc = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
        # Models trained with a BOS token (Llama, Mistral, OLMo-2) see one at the start of every window.
        bos = tokenizer.bos_token_id
        adds_bos = bos is not None and tokenizer("a")["input_ids"][:1] == [bos]
        windows = padded_windows(enc, math.inf if sample else n_tokens, seq_len, bos if adds_bos else None)
        if sample:
            pick = np.random.default_rng(seed).choice(len(windows), min(sample, len(windows)), replace=False)
            windows = [windows[i] for i in sorted(pick)]
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if not windows or sum(len(w) for w in windows) < 2:
        raise UserError("the calibration text is too short (need at least 2 tokens)")
    top = max(int(w.max()) for w in windows)
    if top >= vocab_size:
        raise UserError(f"the tokenizer produced id {top}, beyond the model's vocabulary of {vocab_size}")
    return windows, pad_id


def image_batches(cfg, meta: CheckpointMeta, paths: list[str] | None, n_images: int | None, batch_size: int,
                  device: str = "cpu") -> tuple[list[ImageBatch], str]:
    """The validation split of the run's images (or of the one image source in `paths`), at most n_images of them,
    normalised with the run's own training statistics (meta's pixel_mean / pixel_std) as the model saw them."""
    from depthlab.data.images import build_image_data, eval_image_batches

    m = cfg.model
    data = build_image_data(paths or cfg.data.paths, m.image_size, m.channels, cfg.data.val_fraction)
    x, y = data.val_x[:n_images], data.val_y[:n_images]
    if int(y.max()) >= m.num_classes:
        raise UserError(f"the calibration images have class {int(y.max())}, beyond the model's {m.num_classes} classes")
    mean, std = meta.data.get("pixel_mean", data.mean), meta.data.get("pixel_std", data.std)
    if (list(mean), list(std)) != (data.mean, data.std):  # another source: undo its statistics, apply the run's
        shape = (1, -1, 1, 1)
        raw = x * np.asarray(data.std, np.float32).reshape(shape) + np.asarray(data.mean, np.float32).reshape(shape)
        x = (raw - np.asarray(mean, np.float32).reshape(shape)) / np.asarray(std, np.float32).reshape(shape)
    T = m.n_patches + (m.pool == "cls")
    batches = [ImageBatch(im.to(device), lab.to(device), torch.ones(len(lab), T, dtype=torch.bool, device=device))
               for im, lab in eval_image_batches(x, y, batch_size)]
    return batches, f"validation split of {data.source} ({len(y)} images used)"
