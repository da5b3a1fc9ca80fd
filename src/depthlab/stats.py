"""The statistics depthlab uses, written once, each from a statistics library (scipy.stats, statsmodels): no
hand-written quantile, bootstrap or multiple-testing code. The studies' (depthlab.study: t-tests, equivalence,
pooled noise, Holm, a bootstrap over held-out documents and seeds) and the task-removal analysis's
(depthlab.analysis.tasks: an accuracy's Wilson interval, a paired accuracy drop with its exact McNemar test)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

import numpy as np
from scipy import stats as st

LEVEL = 0.95  # every interval on the page


def finite(xs: Iterable[float | None]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(x)]


def mean_std(xs: Iterable[float]) -> dict:
    """{"mean", "std", "n"} of the finite values (std is the sample std, 0 for one value; mean nan for none)."""
    v = finite(xs)
    if not v:
        return {"mean": math.nan, "std": math.nan, "n": 0}
    return {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0, "n": len(v)}


def t_test(diffs: Sequence[float], level: float = LEVEL) -> dict:
    """One-sample t-test of the mean of paired differences against 0: n, mean, std, standard error, the
    `level` t-interval of the mean (df = n - 1) and the two-sided p. Interval and p are nan below two values."""
    v = finite(diffs)
    out = {**mean_std(v), "se": math.nan, "ci": [math.nan, math.nan], "p": math.nan}
    if len(v) < 2:
        return out
    if statistics.pstdev(v) == 0:  # no spread: scipy's t is undefined; the interval is the point itself
        return {**out, "se": 0.0, "ci": [v[0], v[0]], "p": 0.0 if v[0] else 1.0}
    res = st.ttest_1samp(v, 0.0)
    ci = res.confidence_interval(level)
    return {**out, "se": out["std"] / math.sqrt(len(v)), "ci": [float(ci.low), float(ci.high)],
            "p": float(res.pvalue)}


def tost(diffs: Sequence[float], margin: float, level: float = LEVEL) -> dict:
    """Two one-sided t-tests that the mean difference lies inside (-margin, +margin): the p of each side, the larger
    of the two (the equivalence p), and the (2 * level - 1) t-interval that lies inside the margin exactly when that
    p is below 1 - level (90% for tests at 5%). nan below two values."""
    v = finite(diffs)
    out = {"margin": margin, "n": len(v), "mean": mean_std(v)["mean"], "ci": [math.nan, math.nan],
           "p_lower": math.nan, "p_upper": math.nan, "p": math.nan}
    if len(v) < 2 or statistics.pstdev(v) == 0:
        return out
    lower = float(st.ttest_1samp(v, -margin, alternative="greater").pvalue)
    upper = float(st.ttest_1samp(v, margin, alternative="less").pvalue)
    ci = st.ttest_1samp(v, 0.0).confidence_interval(2 * level - 1)
    return {**out, "ci": [float(ci.low), float(ci.high)], "p_lower": lower, "p_upper": upper, "p": max(lower, upper)}


def welch(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> dict:
    """Welch's t-test of mean(a) - mean(b) for two independent samples of unequal variances (scipy.stats.ttest_ind,
    equal_var=False): "n" (n_a, n_b), the difference "mean", its `level` interval (Welch-Satterthwaite df) and the
    two-sided p. Interval and p are nan below two values on either side."""
    x, y = finite(a), finite(b)
    out = {"n": (len(x), len(y)), "mean": mean_std(x)["mean"] - mean_std(y)["mean"], "ci": [math.nan, math.nan],
           "p": math.nan, "df": math.nan}
    if min(len(x), len(y)) < 2 or statistics.pstdev(x) == statistics.pstdev(y) == 0:
        return out
    res = st.ttest_ind(x, y, equal_var=False)
    ci = res.confidence_interval(level)
    return {**out, "ci": [float(ci.low), float(ci.high)], "p": float(res.pvalue), "df": float(res.df)}


def pooled_noise(samples: Iterable[Sequence[float]], extra_var: float = 0.0) -> dict:
    """Seed noise pooled across comparable cells: each cell's values (one per seed: paired differences, or one
    variant's losses) deviate from their own cell mean; the pooled variance is the sum of squared deviations over the
    summed degrees of freedom (sum of n - 1), as a one-way ANOVA's residual. `extra_var` (the rerun variance) is added
    on top. {"sd", "df", "cells", "extra_var"}; sd nan where no cell has two values."""
    cells = [v for v in (finite(x) for x in samples) if len(v) > 1]
    df = sum(len(v) - 1 for v in cells)
    ss = sum((x - statistics.fmean(v)) ** 2 for v in cells for x in v)
    sd = math.sqrt(ss / df + extra_var) if df else math.nan
    return {"sd": sd, "df": df, "cells": len(cells), "extra_var": extra_var}


def rerun_variance(diffs: Sequence[float], arms: int = 2) -> float:
    """The run-to-run variance that cells trained twice alike show (|differences| of one cell's two runs, each with
    variance 2 s^2), scaled to a quantity of `arms` runs: a paired difference has 2, one loss 1."""
    v = finite(diffs)
    return arms * statistics.fmean(x * x for x in v) / 2 if v else 0.0


def t_pooled(values: Sequence[float], noise: dict, level: float = LEVEL, null: float = 0.0) -> dict:
    """t_test() of the mean of `values` against `null` with the pooled noise model (pooled_noise): standard error
    sd / sqrt(n) and the t distribution at the pooled df (scipy.stats.t), so two seeds that happen to agree get the
    spread every comparable cell shows. Interval and p nan for no values or no pooled df."""
    v = finite(values)
    out = {**mean_std(v), "se": math.nan, "ci": [math.nan, math.nan], "p": math.nan, "df": noise.get("df", 0)}
    if not v or not noise.get("df") or not math.isfinite(noise["sd"]) or noise["sd"] == 0:
        return out
    se = noise["sd"] / math.sqrt(len(v))
    dist = st.t(noise["df"], loc=out["mean"], scale=se)
    lo, hi = dist.interval(level)
    p = 2 * float(st.t.sf(abs(out["mean"] - null) / se, noise["df"]))
    return {**out, "se": se, "ci": [float(lo), float(hi)], "p": p}


def tost_pooled(values: Sequence[float], margin: float, noise: dict, level: float = LEVEL) -> dict:
    """tost() with the pooled noise model: both one-sided t-tests at the pooled df, and the (2 level - 1)
    interval."""
    t = t_pooled(values, noise, 2 * level - 1)
    out = {"margin": margin, "n": t["n"], "mean": t["mean"], "ci": t["ci"], "p_lower": math.nan,
           "p_upper": math.nan, "p": math.nan, "df": t["df"]}
    if not math.isfinite(t["se"]):
        return out
    lower = float(st.t.sf((t["mean"] + margin) / t["se"], t["df"]))
    upper = float(st.t.cdf((t["mean"] - margin) / t["se"], t["df"]))
    return {**out, "p_lower": lower, "p_upper": upper, "p": max(lower, upper)}


DOC_REPLICATES = 2000  # replicates of document_bootstrap


def document_bootstrap(values, weights, replicates: int = DOC_REPLICATES, seed: int = 0, level: float = LEVEL) -> dict:
    """The percentile bootstrap interval (scipy.stats.bootstrap) of a held-out split's token-weighted mean over its
    documents of a per-document quantity measured in several seeds: `values` has a row per seed and a column per
    document (a run's per-document losses, or paired per-document differences), `weights` the tokens scored in each
    document. Each replicate draws documents with replacement (one draw for every seed's row, so a paired
    difference stays paired) and, where there are two or more seeds, seeds with replacement, independently of the
    documents; the statistic is the weighted mean over the drawn documents of the mean over the drawn seeds. A
    document with no scored token (weight 0, value None or nan) counts for nothing. {"mean": the statistic on the
    data (the seed mean of the runs' weighted means), "ci", "seeds", "documents", "replicates", "level"}."""
    v = np.asarray([[math.nan if x is None else x for x in row] for row in values], dtype=float)
    w = np.asarray(weights, dtype=float)
    w = np.where(np.isnan(v).any(axis=0), 0.0, w)
    v = np.nan_to_num(v)

    def mean(*idx, axis=-1):  # idx: (seeds, documents) or (documents,), each (..., n) indices drawn by scipy
        seeds, docs = idx if len(idx) == 2 else (np.arange(len(v)), idx[0])
        drawn = v[seeds[..., :, None], docs[..., None, :]].mean(axis=-2)
        return (drawn * w[docs]).sum(axis=-1) / w[docs].sum(axis=-1)

    data = ((np.arange(len(v)),) if len(v) > 1 else ()) + (np.arange(v.shape[1]),)
    out = {"mean": float(mean(*data)), "seeds": len(v), "documents": int((w > 0).sum()), "replicates": replicates,
           "level": level}
    if (v == v[:1, :1]).all():  # no spread at all: every replicate is the point (scipy would warn of a degenerate set)
        return {**out, "ci": [out["mean"], out["mean"]]}
    res = st.bootstrap(data, mean, n_resamples=replicates, confidence_level=level, method="percentile",
                       vectorized=True, paired=False, rng=np.random.default_rng(seed))
    return {**out, "ci": [float(res.confidence_interval.low), float(res.confidence_interval.high)]}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (statsmodels' multipletests); a nan p stays nan and is left out of the family."""
    from statsmodels.stats.multitest import multipletests

    idx = [i for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    out = [math.nan] * len(pvalues)
    if idx:
        adjusted = multipletests([pvalues[i] for i in idx], method="holm")[1]
        for i, p in zip(idx, adjusted, strict=True):
            out[i] = float(p)
    return out


def proportion_ci(k: int, n: int, level: float = LEVEL) -> list[float]:
    """Clopper-Pearson interval of a proportion k / n (scipy's binomtest); [nan, nan] for n = 0."""
    if n == 0:
        return [math.nan, math.nan]
    ci = st.binomtest(k, n).proportion_ci(level, method="exact")
    return [float(ci.low), float(ci.high)]


def wilson(k: int, n: int, level: float = LEVEL) -> list[float]:
    """Wilson score interval of a proportion k / n (scipy's binomtest)."""
    ci = st.binomtest(k, n).proportion_ci(level, method="wilson")
    return [float(ci.low), float(ci.high)]


def paired_drop(base: list[bool], other: list[bool]) -> dict:
    """The accuracy drop on the same questions, read from the discordant ones: lost (right before, wrong after) and
    gained. Its 95% interval is conditional on their number m: lost ~ Binomial(m, π), drop = m (2π - 1) / n, π's
    exact (Clopper-Pearson) interval carried over; drop_p is the exact McNemar test (binomtest(lost, m, 0.5)). The
    exact interval is the inversion of that test (two one-sided tails at 2.5%; the null π = 0.5 is symmetric), so
    the interval excludes 0 exactly when drop_p < 0.05: a Wilson interval here excluded 0 at 4 lost of 4 (p 0.125)."""
    n = len(base)
    lost = sum(a and not b for a, b in zip(base, other))
    m = lost + sum(b and not a for a, b in zip(base, other))
    if m == 0:
        return {"lost": 0, "gained": 0, "drop_ci": [0.0, 0.0], "drop_p": 1.0}
    lo, hi = proportion_ci(lost, m)
    return {"lost": lost, "gained": m - lost, "drop_ci": [m * (2 * lo - 1) / n, m * (2 * hi - 1) / n],
            "drop_p": float(st.binomtest(lost, m).pvalue)}


def binomial_se(p: float, n: int) -> float:
    """Standard error of an accuracy p measured on n independent items: sqrt(p (1 - p) / n)."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n > 0 else math.nan


def spread(ms: dict, f: str = ".4f", signed: bool = False) -> str:
    """"mean ± std" as text; the sign (when asked) goes on the mean only, never on the spread."""
    if not ms or not ms.get("n"):
        return "-"
    mean = f"{ms['mean']:{'+' if signed else ''}{f}}"
    return mean if ms["n"] < 2 else f"{mean} ± {ms['std']:{f}}"


def interval(c: dict, f: str = ".3f") -> str:
    """"[lo, hi]" of a t_test() result, or "no interval (n = 1)"."""
    lo, hi = c.get("ci") or [math.nan, math.nan]
    return f"[{lo:+{f}}, {hi:+{f}}]" if math.isfinite(lo) else f"no interval (n = {c.get('n', 0)})"


def pvalue(p: float) -> str:
    if p is None or not math.isfinite(p):
        return "-"
    return f"{p:.2g}" if p >= 1e-3 else "<0.001"
