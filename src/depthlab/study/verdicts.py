"""The one decision rule every study reports by: each word comes from an interval, and n and the interval are printed
beside it.

A comparison of two variants on one metric reads, from paired differences d = b - a (one per seed):

    "lower" / "higher"       the 95% t-interval of the mean difference (df = n - 1, scipy.stats) excludes 0
    "inconclusive"           the interval holds 0
    "one seed: no verdict"   n = 1: no spread is known, so no interval (the sign is still printed beside it)

At n = 2 the interval is mean ± 12.7 standard errors: two seeds rarely decide anything, and the page says so.

The results page reads every comparison once more with one noise model (`reread`, `pooled_family`): the seed noise
pooled over the comparable cells of its measure (stats.pooled_noise, plus the rerun variance) replaces each cell's
own df = n - 1 spread, so two seeds that agree by chance get the spread the other cells show; the per-cell reading
stays beside it ("cell"). Each section's comparisons are one family (`holm_words`): a direction word needs its
Holm-adjusted p below ALPHA.

A claim of the paper is read from a comparison, the direction the paper predicts and its precondition:

    "not testable"     the claim's precondition does not hold (Pre-LN's curse index is not "present": absent, or
                       the interior is too small to read)
    "supported"        the interval excludes 0 on the predicted side (with p Holm-adjusted over the claims' family,
                       when a family is given)
    "contradicted"     the interval excludes 0 on the other side, with at least MIN_CONTRADICT seeds
    "not reproduced"   otherwise: the interval holds 0 (or excludes it on the other side with fewer seeds)

Equivalence ("A matches B") is a TOST against a margin; it gives a word only for a margin declared before the data
(depthlab.study.declared: a committed plan.json older than the records), else NO_WORD beside its numbers.
EQUIVALENCE_MARGIN was written here after the LNS study's records, so it gives no word.
Divergence (claim 5) is the paper's: a run that ends within UNIGRAM_MARGIN of the unigram loss (token frequencies
alone; the paper's ~1,400 PPL) while Pre-LN trains at that rate.

The curse's precondition, from Pre-LN's final probe. Its two criteria, each per run (`run_criteria`):

    ratio       the deep/shallow removal cost ratio: mean cost over the deep interior over that over the shallow
                interior (depthlab.analysis.curse)
    inert       the inert fraction of the deep half of the interior (`deep_inert_fraction`): the share of the upper
                half of the interior's blocks whose removal changes the loss by less than the recorded delta (0.005
                nats). The curse of depth says deep blocks degrade towards the identity, so inert shallow blocks do
                not count: a run whose shallow interior is inert and whose deep blocks are active has no curse by
                this criterion. The whole interior's inert fraction stays in the records and on the page, as a
                description, never as a criterion.

One run reads (`precondition`):

    "present"   the deep half's inert fraction is at least PRESENT, or the deep/shallow removal cost ratio is below
                CURSE_RATIO
    "absent"    neither
    "unreadable"  the interior has fewer than MIN_INTERIOR blocks: a fraction of 3 blocks moves in steps of 1/3
    "unknown"   no probe

A deep half of fewer than MIN_DEEP blocks leaves the inert criterion unread (one inert block of 3 would already reach
PRESENT); the ratio still reads.

A (scheme, depth) cell of n seeds reads the same two criteria through their 95% t-intervals across seeds (df = n - 1,
scipy.stats; `curse_reading`). Each criterion's interval lies on the present side (ratio: the whole interval below
CURSE_RATIO; inert fraction: the whole interval at or above PRESENT), on the absent side (the whole interval on the
other side of its threshold), or holds its threshold. The inert fraction is a count (k of m deep blocks), so seeds
often agree exactly (two seeds at 8 of 22), and a t-interval of no spread is a point: certainty from two runs. Its
interval is therefore the wider envelope of the t-interval and the exact (Clopper-Pearson) interval of the pooled
count (sum of k over sum of m, `inert_counts`): at 8 of 22 twice, 16 of 44, [0.22, 0.52], not [0.36, 0.36]; at 0
inert blocks in every seed the pooled interval still lies below PRESENT once the seeds hold enough blocks (0 of 44:
[0, 0.08]). The ratio is continuous, its t-interval as it is. The cell is

    "present"       when either criterion's interval lies on the present side
    "absent"        when both lie on the absent side (a criterion no seed measured is left out)
    "inconclusive"  otherwise: an interval holds its threshold and the other criterion does not read present
    "one seed: no interval"  n = 1: the single run's reading is printed beside it, never as a verdict
    "unreadable" / "unknown"  as for one run

"present" is the union of two one-sided tests, each at 2.5% (a two-sided 95% interval wholly on one side), so a cell
whose curse is absent by both criteria reads "present" with probability at most 5% (Bonferroni); "absent" needs both
intervals, so it is the stricter word. A claim that needs the curse is "not testable" unless its cell reads
"present": absent, inconclusive, unreadable and unknown all leave the precondition unshown (docs/results.md, "The
paper's claims, one rule").
"""

from __future__ import annotations

import math

from depthlab.analysis.curse import CurseSpec, deep_half
from depthlab.stats import (
    LEVEL,
    finite,
    holm,
    mean_std,
    pooled_noise,
    proportion_ci,
    t_pooled,
    t_test,
    tost,
    tost_pooled,
    welch,
)

COMPARISONS = ("lower", "higher", "inconclusive", "one seed: no verdict", "no runs")
CLAIMS = ("supported", "not reproduced", "contradicted", "not testable", "one seed: no verdict")
PRECONDITION = ("present", "absent", "inconclusive", "one seed: no interval", "unreadable", "unknown")
ONE_SEED_INDEX = "one seed: no interval"
PRESENT = 1 / 3
CURSE_RATIO = 0.5
MIN_INTERIOR = 5  # interior blocks below which the index cannot be read (N = 6 has 3)
MIN_DEEP = 4  # deep-half blocks below which the inert criterion is not read: one inert block of 4 stays below PRESENT
MIN_CONTRADICT = 3  # seeds an interval on the other side needs before "contradicted"
EQUIVALENCE_MARGIN = 0.01  # nats: two variants "match" when the TOST puts their mean difference inside ± this
UNIGRAM_MARGIN = 0.1  # nats: a run ending this close to the unigram loss learned nothing beyond token frequencies
ALPHA = 1 - LEVEL
MIN_SEEDS = 3  # paired seeds before a word (plan.json's min_seeds_for_a_word)


def _word(t: dict) -> str:
    """The comparison's word from a t_test() / t_pooled() result (the module docstring)."""
    if t["n"] == 0:
        return "no runs"
    if t["n"] == 1:  # a pooled model gives one seed an interval; the rule still gives it no word
        return "one seed: no verdict"
    if not math.isfinite(t["ci"][0]):
        return "inconclusive"
    return "higher" if t["ci"][0] > 0 else "lower" if t["ci"][1] < 0 else "inconclusive"


def compare(diffs: list[float]) -> dict:
    """The reading of paired differences b - a: the word, n, mean ± std, the t-interval and p."""
    t = t_test(diffs)
    return {"verdict": _word(t), **t, "per_seed": list(diffs)}


def contrast(a: list[float], b: list[float]) -> dict:
    """The reading of two independent samples' mean difference mean(a) - mean(b) (stats.welch), with compare()'s
    word; "n" is the smaller sample's size (the rule's seeds), "sizes" both."""
    w = welch(a, b)
    t = {**w, "n": min(w["n"]), "sizes": list(w["n"])}
    return {"verdict": _word(t), **t}


FEW_DF = 5  # Welch degrees of freedom below which a contrast's line shows the pooled and exact readings beside it


def contrast_pooled(a: list[float], b: list[float], noise_a: dict, noise_b: dict) -> dict:
    """contrast() with each side's seed noise pooled over its study (stats.pooled_noise results): the standard error
    sqrt(sd_a²/n_a + sd_b²/n_b) at the Welch-Satterthwaite df of the two pooled variances (scipy.stats.t). A check
    printed beside a Welch reading that rests on few degrees of freedom; it gives no word."""
    from scipy import stats as st

    x, y = finite(a), finite(b)
    out = {"mean": mean_std(x)["mean"] - mean_std(y)["mean"], "p": math.nan, "df": math.nan}
    if not (x and y and noise_a.get("df") and noise_b.get("df")):
        return out
    va, vb = noise_a["sd"] ** 2 / len(x), noise_b["sd"] ** 2 / len(y)
    df = (va + vb) ** 2 / (va ** 2 / noise_a["df"] + vb ** 2 / noise_b["df"])
    return {**out, "df": df, "p": 2 * float(st.t.sf(abs(out["mean"]) / math.sqrt(va + vb), df))}


def permutation_p(a: list[float], b: list[float]) -> float:
    """The exact two-sided permutation test's p of mean(a) - mean(b) (scipy.stats.permutation_test over every split
    of the pooled values): a check beside a Welch reading; it gives no word."""
    import numpy as np
    from scipy import stats as st

    x, y = finite(a), finite(b)
    if len(x) < 2 or len(y) < 2:
        return math.nan
    res = st.permutation_test((x, y), lambda u, v, axis=-1: np.mean(u, axis=axis) - np.mean(v, axis=axis),
                              permutation_type="independent", n_resamples=math.inf, vectorized=True)
    return float(res.pvalue)


def noise_of(comparisons: list[dict], rerun_var: float = 0.0) -> dict:
    """The pooled noise model of a family of comparable compare() results (stats.pooled_noise of their per-seed
    differences, plus the rerun variance)."""
    return pooled_noise([c.get("per_seed", []) for c in comparisons if c], rerun_var)


def reread(comparisons: list[dict], noise: dict) -> list[dict]:
    """Each compare() result read again, in place, with the pooled noise model (stats.t_pooled): its word, interval
    and p become the pooled ones; the per-cell reading (df = n - 1) stays beside it as "cell". Returns them."""
    for c in comparisons:
        if not c or "cell" in c:
            continue
        cell = {k: c[k] for k in ("verdict", "ci", "p", "se") if k in c}
        t = t_pooled(c.get("per_seed", []), noise)
        c.update({**t, "std": c.get("std", t["std"]), "verdict": _word(t), "cell": cell, "noise": noise})
    return comparisons


def pooled_family(comparisons: list[dict], rerun_var: float = 0.0, family_size: int = 0) -> dict:
    """One section's family of comparable comparisons: read again with their pooled noise (reread), then each
    given its Holm-adjusted p over the family ("p_holm") and a word that survives it ("word": lower / higher only
    where the adjusted p is below ALPHA, else inconclusive). Returns the noise model. family_size: the family the
    plan declared, when some of its members are not yet testable (holm_words)."""
    cs = [c for c in comparisons if c]
    noise = noise_of(cs, rerun_var)
    holm_words(reread(cs, noise), family_size)
    return noise


def holm_words(comparisons: list[dict], family_size: int = 0) -> list[dict]:
    """A section's family: each comparison (in place) with its Holm-adjusted p over the family ("p_holm") and the
    word that survives it ("word": its lower / higher only where the adjusted p is below ALPHA, else
    inconclusive). A declared family larger than the comparisons at hand (a study still running) counts each
    member not yet tested at p = 1: the largest Holm p any outcome of theirs could give, so that a word given now
    is not undone by the members still to come."""
    cs = [c for c in comparisons if c]
    untested = [1.0] * max(0, family_size - len(cs))
    for c, p in zip(cs, holm([c.get("p", math.nan) for c in cs] + untested)[:len(cs)], strict=True):
        directed = c["verdict"] in ("lower", "higher")
        c["p_holm"] = p
        c["word"] = c["verdict"] if not directed else c["verdict"] if p < ALPHA else "inconclusive"
    return comparisons


def pooled(comparisons: list[dict]) -> dict:
    """compare() of every paired difference of `comparisons` pooled as one sample: each (group, seed) pair is one
    observation, groups weighted by their seed counts (how the page pools depths)."""
    return {**compare([d for c in comparisons for d in c.get("per_seed", [])]), "groups": len(comparisons)}


def claim(comparison: dict, predicted: str, condition: str = "present", p_adjusted: float | None = None) -> str:
    """The claim's word (module docstring) from a compare() result, the predicted direction ("lower"/"higher"), the
    precondition's reading and, inside a family, the Holm-adjusted p."""
    n = comparison.get("n", 0)
    if condition == ONE_SEED_INDEX and n == 1:
        return "one seed: no verdict"
    if condition != "present":
        return "not testable"
    if n < 2:
        return "one seed: no verdict" if n == 1 else "not testable"
    word = comparison["verdict"]
    if p_adjusted is not None and math.isfinite(p_adjusted) and p_adjusted >= ALPHA:
        word = "inconclusive"  # the interval excluded 0, but not after the family's adjustment
    if word == predicted:
        return "supported"
    if word in ("lower", "higher") and n >= MIN_CONTRADICT:
        return "contradicted"
    return "not reproduced"


def family(rows: list[dict]) -> list[dict]:
    """Each row (a "comparison", "predicted" and "condition") with its Holm-adjusted p over the rows that are
    testable, and its claim word."""
    testable = [r["condition"] == "present" for r in rows]
    adjusted = iter(holm([r["comparison"]["p"] for r, ok in zip(rows, testable, strict=True) if ok]))
    out = []
    for r, ok in zip(rows, testable, strict=True):
        p = next(adjusted) if ok else math.nan
        out.append({**r, "p_holm": p, "word": claim(r["comparison"], r["predicted"], r["condition"], p)})
    return out


NO_WORD = "no word: margin set after the data"


def equivalent(diffs: list[float], margin: float = EQUIVALENCE_MARGIN, noise: dict | None = None,
               declared: bool = False, p_adjusted: float | None = None) -> dict:
    """TOST of paired differences against ± margin (with the pooled noise model where `noise` is given):
    "equivalent" when both one-sided tests reject at ALPHA (the 90% interval inside the margin) and, inside a
    family, the Holm-adjusted p does too; "not shown equivalent" otherwise; one seed gives no verdict, none "no
    runs". A margin not `declared` before the data (depthlab.study.declared) gives NO_WORD: the numbers stand, the
    word does not."""
    t = tost_pooled(diffs, margin, noise) if noise else tost(diffs, margin)
    p = t["p"] if p_adjusted is None else p_adjusted
    word = ("no runs" if t["n"] == 0 else "one seed: no verdict" if t["n"] == 1 else
            NO_WORD if not declared else
            "equivalent" if math.isfinite(p) and p < ALPHA else "not shown equivalent")
    c = compare(diffs)
    if noise:
        reread([c], noise)
    return {**t, "verdict": word, "declared": declared, "comparison": c}


def diverged(loss: float | None, unigram: float) -> bool:
    """The paper's divergence: no finite loss, or a loss within UNIGRAM_MARGIN of the unigram loss."""
    return loss is None or not math.isfinite(loss) or loss >= unigram - UNIGRAM_MARGIN


def less_stable(losses: dict[float, float], pre_losses: dict[float, float], unigram: float) -> dict:
    """Claim 5 for one scheme: over the rates where both it and Pre-LN ran and Pre-LN trained, the share k / n at
    which the scheme diverged in the paper's sense, its Clopper-Pearson interval, and the word: "supported" when the
    interval excludes 0 (Pre-LN diverged at none of these rates by construction), "not reproduced" otherwise."""
    rates = sorted(lr for lr in losses if lr in pre_losses and not diverged(pre_losses[lr], unigram))
    bad = [lr for lr in rates if diverged(losses[lr], unigram)]
    ci = proportion_ci(len(bad), len(rates))
    word = "not testable" if not rates else "supported" if ci[0] > 0 else "not reproduced"
    return {"rates": rates, "diverged": bad, "n": len(rates), "share": len(bad) / len(rates) if rates else math.nan,
            "ci": ci, "word": word, "unigram": unigram,
            "gap": {lr: losses[lr] - pre_losses[lr] for lr in bad if math.isfinite(losses[lr])}}


def interior_size(curse: dict) -> int:
    """The number of interior blocks a probe's index names (0 when it names none)."""
    return curse["interior"][1] - curse["interior"][0] + 1 if curse.get("interior") else 0


def deep_inert_count(probe: dict) -> tuple[int, int] | None:
    """(inert blocks, blocks) of the deep half of one run's interior: the count behind deep_inert_fraction."""
    curse = probe.get("curse") or {}
    if not curse.get("interior") or probe.get("removal") is None:
        return None
    lo, hi = curse["interior"]
    deep = deep_half(list(range(lo, hi + 1)))
    if len(deep) < MIN_DEEP:
        return None
    delta = curse.get("delta", CurseSpec.delta)
    return sum(abs(probe["removal"][l - 1]) < delta for l in deep), len(deep)


def deep_inert_fraction(probe: dict) -> float | None:
    """The inert criterion of one run (the module docstring): the share of the deep half of the interior
    (depthlab.analysis.curse.deep_half of the blocks the probe's curse["interior"] names; the middle block of an odd
    count goes to the shallow half) whose removal cost (probe["removal"], nats, block 1 first) is below the recorded
    delta in absolute value. None where the probe names no interior or the deep half has fewer than MIN_DEEP blocks."""
    count = deep_inert_count(probe)
    return count[0] / count[1] if count else None


def run_criteria(probe: dict) -> dict:
    """One run's curse criteria from its final probe: "ratio" (deep/shallow removal ratio), "inert" (the deep half's
    inert fraction, `deep_inert_fraction`) and "interior" (the interior's size)."""
    curse = probe.get("curse") or {}
    return {"ratio": curse.get("removal_deep_over_shallow"), "inert": deep_inert_fraction(probe),
            "inert_count": deep_inert_count(probe), "interior": interior_size(curse)}


def cell_reading(probes: list[dict], ratio_noise: dict | None = None) -> dict:
    """curse_reading of one (scheme, depth) cell from its runs' final probes, each read by run_criteria; the cell's
    interior is its smallest run's."""
    runs = [run_criteria(p) for p in probes]
    return curse_reading([r["ratio"] for r in runs], [r["inert"] for r in runs],
                         min((r["interior"] for r in runs), default=None), [r["inert_count"] for r in runs],
                         ratio_noise)


def ratio_noise(cells: list[list[dict]]) -> dict:
    """The pooled seed noise of the deep/shallow removal ratio over comparable cells (each a list of final
    probes): the noise model curse_reading reads the ratio with."""
    return pooled_noise([[run_criteria(p)["ratio"] for p in probes] for probes in cells])


def precondition(inert_fraction: float | None, removal_ratio: float | None, interior: int | None = None) -> str:
    """Whether Pre-LN's interior is identity-like by the curse index (see the module docstring); `inert_fraction` is
    the deep half's (deep_inert_fraction)."""
    if interior is not None and interior < MIN_INTERIOR:
        return "unreadable"
    inert, ratio = finite([inert_fraction]), finite([removal_ratio])
    if not inert and not ratio:
        return "unknown"
    return "present" if (inert and inert[0] >= PRESENT) or (ratio and ratio[0] < CURSE_RATIO) else "absent"


def _side(t: dict, threshold: float, present_below: bool) -> str:
    """Where a criterion's interval lies against its threshold: "present", "absent" or "inconclusive"."""
    lo, hi = t["ci"]
    if present_below:
        return "present" if hi < threshold else "absent" if lo >= threshold else "inconclusive"
    return "present" if lo >= threshold else "absent" if hi < threshold else "inconclusive"


def _pooled(t: dict, counts) -> dict:
    """The inert criterion's t_test() widened to the exact interval of the pooled count where every value has its
    count (the module docstring); "pooled": [inert, blocks] beside it."""
    counts = [c for c in counts if c]
    if t["n"] < 2 or len(counts) != t["n"]:
        return t
    k, m = sum(c[0] for c in counts), sum(c[1] for c in counts)
    lo, hi = proportion_ci(k, m)
    return {**t, "ci": [min(t["ci"][0], lo), max(t["ci"][1], hi)], "pooled": [k, m]}


def curse_reading(ratios: list[float | None], inert_fractions: list[float | None] = (),
                  interior: int | None = None, inert_counts=(), ratio_noise: dict | None = None) -> dict:
    """The curse index of one (scheme, depth) cell across its seeds (the module docstring's rule): the word, n, and
    per criterion ("ratio": deep/shallow removal ratio against CURSE_RATIO, "inert": the deep half's inert fraction
    against PRESENT, one value per run from deep_inert_fraction; cell_reading builds both from the probes) its mean,
    std, 95% t-interval and side. A criterion with fewer than two finite values is left out when the other has two;
    with none having two, n = 1 gives the single run's reading ("single") and no word beyond "one seed: no
    interval". `inert_counts`: each run's (inert, blocks) of its deep half; the inert interval is widened to their
    pooled exact interval (the module docstring). `ratio_noise` (ratio_noise()): the ratio's interval from the seed
    noise pooled over comparable cells, so that two seeds agreeing by chance do not make a point."""
    ratio = t_pooled(ratios, ratio_noise) if ratio_noise and len(finite(ratios)) > 1 else t_test(ratios)
    crit = {"ratio": (ratio, CURSE_RATIO, True),
            "inert": (_pooled(t_test(inert_fractions), inert_counts), PRESENT, False)}
    out = {name: {"n": t["n"], "mean": t["mean"] if t["n"] else None, "std": t["std"] if t["n"] else None,
                  "ci": t["ci"] if t["n"] > 1 else None, "threshold": thr,  # no NaN in the results files
                  **({"pooled": t["pooled"]} if "pooled" in t else {})}
           for name, (t, thr, _) in crit.items()}
    out["n"] = max(t["n"] for t, _, _ in crit.values())
    if interior is not None and interior < MIN_INTERIOR:
        return {**out, "word": "unreadable"}
    if out["n"] == 0:
        return {**out, "word": "unknown"}
    read = {name: _side(t, thr, below) for name, (t, thr, below) in crit.items() if t["n"] >= 2}
    for name, side in read.items():
        out[name]["side"] = side
    if not read:
        single = precondition(mean_std(inert_fractions)["mean"], mean_std(ratios)["mean"], interior)
        return {**out, "word": ONE_SEED_INDEX, "single": single}
    sides = set(read.values())
    word = "present" if "present" in sides else "absent" if sides == {"absent"} else "inconclusive"
    return {**out, "word": word, "by": [name for name, side in read.items() if side == word]}


def at_edge(best: float | None, grid: list[float]) -> bool:
    """True when the chosen rate is the smallest or largest of its grid: the optimum may lie beyond it."""
    return best is not None and len(grid) > 1 and best in (min(grid), max(grid))


_CRITERION = {"ratio": "deep/shallow removal ratio", "inert": "deep-half inert fraction"}


def ci_cell(t: dict, f: str = ".2f") -> str:
    """A t_test() result as a table cell: "mean [lo, hi]", the mean alone for one value, "-" for none."""
    if not t or not t.get("n"):
        return "-"
    lo, hi = t["ci"] or [math.nan, math.nan]
    return f"{t['mean']:{f}} [{lo:{f}}, {hi:{f}}]" if math.isfinite(lo) else f"{t['mean']:{f}}"


def curse_word(r: dict | None) -> str:
    """A curse_reading() as a table cell: its word; for one seed the run's own reading beside "one seed: no
    interval"."""
    if not r:
        return "unknown"
    return f"{r['single']}, {ONE_SEED_INDEX}" if r["word"] == ONE_SEED_INDEX else r["word"]


def curse_said(r: dict | None, word: bool = True) -> str:
    """A curse_reading() in prose: the criteria its word rests on, each mean [95% t-interval] against its threshold,
    n, then (with `word`) the word; one seed: the run's values and reading with "one seed: no interval"."""
    if not r or r["word"] in ("unknown", "unreadable"):
        return f"*{r['word'] if r else 'unknown'}*" + (f" (interior under {MIN_INTERIOR} blocks)" if r and
                                                          r["word"] == "unreadable" else "")
    if r["word"] == ONE_SEED_INDEX:
        values = ", ".join(f"{_CRITERION[k]} {r[k]['mean']:.2f}" for k in _CRITERION if r[k]["n"])
        return f"{values}: reads {r['single']}" + (f" ({ONE_SEED_INDEX})" if word else "")
    sign = {"ratio": {"present": "<", "absent": "≥"}, "inert": {"present": "≥", "absent": "<"}}
    parts = [f"{_CRITERION[k]} {ci_cell(r[k])} {sign[k].get(r[k]['side'], 'holds')} {r[k]['threshold']:.2g}"
             for k in r["by"]]
    return f"{'; '.join(parts)}, n = {r['n']}" + (f": *{r['word']}*" if word else "")
