"""What an analysis result (a metrics.json) is: its kind, written by each analysis run (`res["kind"]`) and read by
the report, the terminal summary and `compare`.

    language modelling      perplexity-scored removal, a logit lens, "last token" distances at the last token
    image classification    a ViT's: removal scored by loss and top-1 accuracy, no lens, "last token" distances
                            read at the pooled readout (res["readout"])

and the one notation every reader of a result writes a set of blocks in (`blocks_text`).
"""

from __future__ import annotations

LANGUAGE_MODELLING, IMAGE_CLASSIFICATION = "language modelling", "image classification"


def kind_of(res: dict) -> str:
    """The kind of a result. One written before the field existed: a classifier's carried its "task" (set with
    its readout and notes), a language model's nothing."""
    return res.get("kind") or res.get("task", LANGUAGE_MODELLING)


def is_classifier(res: dict) -> bool:
    return kind_of(res) == IMAGE_CLASSIFICATION


def blocks_text(blocks) -> str:
    """A set of 1-based blocks as the report writes it everywhere: ascending, runs of three or more as a range:
    "13, 15, 18, 19", "14-16"."""
    bs = sorted(set(int(b) for b in blocks))
    parts, i = [], 0
    while i < len(bs):
        j = i
        while j + 1 < len(bs) and bs[j + 1] == bs[j] + 1:
            j += 1
        parts += [f"{bs[i]}-{bs[j]}"] if j - i >= 2 else [str(b) for b in bs[i:j + 1]]
        i = j + 1
    return ", ".join(parts)


def span_text(first_last) -> str:
    """A contiguous run stored as [first, last] (1-based, both included), in blocks_text's notation."""
    first, last = first_last
    return blocks_text(range(first, last + 1))
