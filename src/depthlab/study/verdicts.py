"""One verdict vocabulary for every study, and the rules that pick the word.

A comparison of two variants on one metric reads, from paired differences d (b - a, one per seed):

    "lower"          every rule says b is below a: mean < 0 by more than two standard errors, and the bootstrap
                     interval of the mean excludes 0
    "higher"         the same, above
    "inconclusive"   otherwise: the difference is within two standard errors, or its interval contains 0, or there is
                     a single seed (no spread is known; the sign is still printed beside the word)

A claim is then read from a comparison and the direction it predicts:

    "supported"      the comparison went the predicted way
    "contradicted"   it went the other way
    "inconclusive"   the comparison was inconclusive

The curse's precondition is read but never gates what is printed: every comparison appears with its per-seed
numbers whatever the precondition says ("reported, not hidden").

    "present"        Pre-LN's interior inert fraction is at least PRESENT (a third of the interior), or its removal
                     deep/shallow ratio is below CURSE_RATIO
    "absent"         otherwise
"""

from __future__ import annotations

import math

from depthlab.study.stats import bootstrap_ci, mean_std, standard_error

COMPARISONS = ("lower", "higher", "inconclusive")
CLAIMS = ("supported", "contradicted", "inconclusive")
PRECONDITION = ("present", "absent", "unknown")
PRESENT = 1 / 3
CURSE_RATIO = 0.5


def compare(diffs: list[float]) -> dict:
    """The reading of paired differences b - a: the word, the mean ± std, the standard error and the interval."""
    ms = mean_std(diffs)
    se = standard_error(ms)
    ci = bootstrap_ci(diffs)
    word = "inconclusive"
    if ms["n"] > 1 and math.isfinite(se) and abs(ms["mean"]) > 2 * se and not ci[0] <= 0 <= ci[1]:
        word = "lower" if ms["mean"] < 0 else "higher"
    return {"verdict": word, **ms, "se": se, "ci": ci, "per_seed": diffs}


def claim(comparison: dict, predicted: str) -> str:
    """"supported" if the comparison went the `predicted` way ("lower" or "higher"), "contradicted" if the other."""
    if comparison["verdict"] == "inconclusive":
        return "inconclusive"
    return "supported" if comparison["verdict"] == predicted else "contradicted"


def precondition(inert_fraction: float | None, removal_ratio: float | None) -> str:
    """Whether Pre-LN's interior is identity-like by the curse index (see the module docstring)."""
    known = [x for x in (inert_fraction, removal_ratio) if x is not None and math.isfinite(x)]
    if not known:
        return "unknown"
    inert = inert_fraction is not None and math.isfinite(inert_fraction) and inert_fraction >= PRESENT
    cheap = removal_ratio is not None and math.isfinite(removal_ratio) and removal_ratio < CURSE_RATIO
    return "present" if inert or cheap else "absent"


def at_edge(best: float | None, grid: list[float]) -> bool:
    """True when the chosen rate is the smallest or largest of its grid: the optimum may lie beyond it."""
    return best is not None and len(grid) > 1 and best in (min(grid), max(grid))
