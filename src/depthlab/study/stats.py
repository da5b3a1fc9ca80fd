"""The statistics every study uses, written once."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

import numpy as np


def mean_std(xs: Iterable[float]) -> dict:
    """{"mean", "std", "n"} of the finite values (std is the sample std, 0 for one value; mean nan for none)."""
    v = [x for x in xs if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": math.nan, "std": math.nan, "n": 0}
    return {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0, "n": len(v)}


def standard_error(ms: dict) -> float:
    """std / sqrt(n) of a mean_std result; nan for fewer than two values (no spread is known)."""
    return ms["std"] / math.sqrt(ms["n"]) if ms["n"] > 1 else math.nan


def paired_differences(a: dict, b: dict) -> list[float]:
    """b[k] - a[k] for every key in both (e.g. seed -> value), in key order."""
    return [b[k] - a[k] for k in sorted(set(a) & set(b))]


def bootstrap_ci(xs: Sequence[float], stat=np.mean, draws: int = 2000, seed: int = 0,
                 level: float = 0.95) -> list[float]:
    """Percentile bootstrap interval of stat(xs); [x, x] for a single value, [nan, nan] for none."""
    v = np.asarray([x for x in xs if math.isfinite(x)], dtype=np.float64)
    if len(v) == 0:
        return [math.nan, math.nan]
    idx = np.random.default_rng(seed).integers(0, len(v), size=(draws, len(v)))
    s = np.apply_along_axis(stat, 1, v[idx])
    tail = (1 - level) / 2
    return [float(np.quantile(s, tail)), float(np.quantile(s, 1 - tail))]


def binomial_se(p: float, n: int) -> float:
    """Standard error of an accuracy p measured on n independent items: sqrt(p (1 - p) / n)."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n > 0 else math.nan


def spread(ms: dict, f: str = ".4f", signed: bool = False) -> str:
    """"mean ± std (n)" as text; the sign (when asked) goes on the mean only, never on the spread."""
    if not ms or not ms.get("n"):
        return "-"
    mean = f"{ms['mean']:{'+' if signed else ''}{f}}"
    return mean if ms["n"] < 2 else f"{mean} ± {ms['std']:{f}}"


def linear_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys against xs; nan for fewer than two points."""
    if len(xs) < 2:
        return math.nan
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])
