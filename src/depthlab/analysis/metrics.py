"""The metric definitions' old import path: they live in depthlab.metrics, shared by `analyze` and the training
monitor; kept for the code that still imports them from here."""

from depthlab.metrics import (  # noqa: F401
    EPS,
    Accumulator,
    angular_distance,
    cosine,
    init_update_ratios,
    pairwise_angular,
    token_update_ratio,
    unit,
    update_ratios,
)
