"""Exact and near-duplicate document removal: a corpus that repeats generated tables (codec maps, say) teaches and
scores the same text many times over, and a validation slice drawn from them measures that text, not the model.

    exact   documents whose whitespace-normalised text hashes the same (sha256): every copy after the first goes
    near    MinHash over word 5-gram shingles, candidates from LSH (datasketch), kept as duplicates when their
            estimated Jaccard similarity is at least `threshold`: every document after the first of a group goes

dedup() returns the kept documents and a report naming what it removed and why.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from datasketch import MinHash, MinHashLSH

SHINGLE = 5  # words per shingle
PERMUTATIONS = 128


@dataclass
class DedupReport:
    kept: int = 0
    exact: list[tuple[str, str]] = field(default_factory=list)  # (removed, the kept document it copies)
    near: list[tuple[str, str]] = field(default_factory=list)

    @property
    def removed(self) -> int:
        return len(self.exact) + len(self.near)

    def summary(self) -> dict:
        return {"kept": self.kept, "removed": self.removed, "exact": len(self.exact), "near": len(self.near),
                "removed_names": [name for name, _ in self.exact + self.near]}


def _words(text: str) -> list[str]:
    return re.findall(r"\S+", text)


def _minhash(words: list[str]) -> MinHash:
    m = MinHash(num_perm=PERMUTATIONS, seed=1)
    grams = {" ".join(words[i:i + SHINGLE]) for i in range(max(1, len(words) - SHINGLE + 1))}
    for g in grams:
        m.update(g.encode())
    return m


def dedup(docs: list, threshold: float = 0.8, name=lambda d: d.name, text=lambda d: d.text) -> tuple[list, DedupReport]:
    """`docs` without exact and near-duplicate copies (the first of each group is kept, order preserved)."""
    report, kept, seen = DedupReport(), [], {}
    lsh = MinHashLSH(threshold=threshold, num_perm=PERMUTATIONS)
    for i, d in enumerate(docs):
        words = _words(text(d))
        digest = hashlib.sha256(" ".join(words).encode()).hexdigest()
        if digest in seen:
            report.exact.append((name(d), seen[digest]))
            continue
        m = _minhash(words)
        near = lsh.query(m)
        if near:
            report.near.append((name(d), near[0].split("\0", 1)[1]))
            continue
        seen[digest] = name(d)
        lsh.insert(f"{i}\0{name(d)}", m)
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
