"""Exact and near-duplicate document removal: a corpus that repeats generated tables (codec maps, say) teaches and
scores the same text many times over, and a validation slice drawn from them measures that text, not the model.

    exact   documents whose whitespace-normalised text hashes the same (sha256): every copy after the first goes
    near    MinHash over word 5-gram shingles: a document whose estimated Jaccard similarity (the share of equal
            MinHash values) to a kept document is at least `threshold` goes, as a copy of the most similar one.
            Candidates come from LSH (datasketch) banded so that it misses no such pair (`bands`), and each is
            checked against the threshold: nothing below it is removed, nothing at or above it is kept.

`threshold` is in (0, 1]: 1 removes only documents whose 128 MinHash values all equal a kept one's (in practice the
same set of word 5-grams); 0 would make every document a copy of the first, and is refused.

dedup() returns the kept documents and a report naming what it removed and why.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

from datasketch import MinHash, MinHashLSH

SHINGLE = 5  # words per shingle
PERMUTATIONS = 128


@dataclass
class DedupReport:
    kept: int = 0
    exact: list[tuple[str, str]] = field(default_factory=list)  # (removed, the kept document it copies)
    near: list[tuple[str, str, float]] = field(default_factory=list)  # (removed, kept, estimated similarity)

    @property
    def removed(self) -> int:
        return len(self.exact) + len(self.near)

    def summary(self) -> dict:
        return {"kept": self.kept, "removed": self.removed, "exact": len(self.exact), "near": len(self.near),
                "removed_names": [name for name, *_ in self.exact + self.near]}


def _words(text: str) -> list[str]:
    return re.findall(r"\S+", text)


def _minhash(words: list[str]) -> MinHash:
    m = MinHash(num_perm=PERMUTATIONS, seed=1)
    grams = {" ".join(words[i:i + SHINGLE]) for i in range(max(1, len(words) - SHINGLE + 1))}
    for g in grams:
        m.update(g.encode())
    return m


def bands(threshold: float) -> tuple[int, int]:
    """(bands, rows per band) of an LSH index that returns every pair whose estimated similarity is at least
    `threshold`: such a pair differs in at most PERMUTATIONS - floor(threshold * PERMUTATIONS) MinHash values, so
    with one band more than that, some band holds none of them and the pair collides there."""
    b = max(2, PERMUTATIONS - math.floor(threshold * PERMUTATIONS) + 1)  # datasketch takes 2 bands at least
    return b, PERMUTATIONS // b


def dedup(docs: list, threshold: float = 0.8, name=lambda d: d.name, text=lambda d: d.text) -> tuple[list, DedupReport]:
    """`docs` without exact and near-duplicate copies (the first of each group is kept, order preserved); a near
    copy is reported against the kept document it is most similar to (the first of equals)."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be above 0 and at most 1, got {threshold}")
    report, kept, seen, hashes = DedupReport(), [], {}, {}
    lsh = MinHashLSH(num_perm=PERMUTATIONS, params=bands(threshold))
    for i, d in enumerate(docs):
        words = _words(text(d))
        digest = hashlib.sha256(" ".join(words).encode()).hexdigest()
        if digest in seen:
            report.exact.append((name(d), seen[digest]))
            continue
        m = _minhash(words)
        near = [(m.jaccard(hashes[k]), -k, k) for k in lsh.query(m)]
        best = max((x for x in near if x[0] >= threshold), default=None)
        if best is not None:
            report.near.append((name(d), name(docs[best[2]]), best[0]))
            continue
        seen[digest] = name(d)
        lsh.insert(i, m)
        hashes[i] = m
        kept.append(d)
    report.kept = len(kept)
    return kept, report


def is_dedup_output(path) -> bool:
    """A file `data dedup` wrote: JSON lines of exactly {"name", "text"} (the first line read)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            first = json.loads(f.readline())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(first, dict) and set(first) == {"name", "text"}


def dedup_files(inputs: list[str], out: str, threshold: float = 0.8, text_field: str = "text") -> DedupReport:
    """`depthlab data dedup`: read `inputs` (what `data prepare` reads; none: the built-in corpus), drop exact and
    near copies, and write the kept documents to `out` as JSON lines ({"name", "text"}), for `data prepare OUT`."""
    import json
    from pathlib import Path

    from depthlab.data.sources import builtin_documents, read_documents

    docs = read_documents(inputs, text_field=text_field)[0] if inputs else builtin_documents(10.0)
    kept, report = dedup(docs, threshold)
    with open(Path(out), "w") as f:
        for d in kept:
            f.write(json.dumps({"name": d.name, "text": d.text}) + "\n")
    return report
