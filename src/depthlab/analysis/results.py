"""What an analysis result (a metrics.json) is: its kind, written by each analysis run (`res["kind"]`) and read by
the report, the terminal summary and `compare`.

    language modelling      perplexity-scored removal, a logit lens, "last token" distances at the last token
    image classification    a ViT's: removal scored by loss and top-1 accuracy, no lens, "last token" distances
                            read at the pooled readout (res["readout"])
"""

from __future__ import annotations

LANGUAGE_MODELLING, IMAGE_CLASSIFICATION = "language modelling", "image classification"


def kind_of(res: dict) -> str:
    """The kind of a result. One written before the field existed: a classifier's carried its "task" (set with
    its readout and notes), a language model's nothing."""
    return res.get("kind") or res.get("task", LANGUAGE_MODELLING)


def is_classifier(res: dict) -> bool:
    return kind_of(res) == IMAGE_CLASSIFICATION
