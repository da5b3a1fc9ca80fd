"""Are a model's deep blocks wasted? One word per objective, from a rule declared before the data (the real-model
panel's plan, benchmarks/results/real_model_panel/plan.json, states this rule and cites this module).

Inputs are raw outcomes, for the model itself and with each block l (1-based) removed alone, per unit of the
objective's data: per window the summed next-token loss and the tokens scored (loss), per question right or wrong
(multiple choice), per item right or wrong (generation). The cost of removing block l is

    loss         the mean loss increase per scored token (nats): sum_w (loss_l(w) - loss(w)) / sum_w tokens(w)
    choice       the accuracy drop: accuracy of the model itself - accuracy with block l removed
    generation   the success-rate drop, the same way, over the items of the families that count (where the model
                 itself succeeds on >= 30% of the items)

With N blocks, the early interior is E = [2, floor(N/4) + 1] and the deep interior D = (N/2, N - 2] (the same
windows as the curse index's deep/shallow ratio, depthlab.analysis.curse.shallow_deep). The statistic is

    R = median_{l in D} cost(l) / median_{l in E} cost(l)

medians, so that no one costly block (SmolLM2's block 2) decides it. Its interval is a paired percentile bootstrap
over the objective's units (windows, questions or items, drawn with replacement; every block's cost recomputed from
the same draw, so the blocks stay paired), seeded, at the level 1 - 0.05/3: the three objectives of one model are
one family, Bonferroni-corrected. A replicate whose median_E cost is <= 0 reads R = +inf (deep blocks are not shown
cheaper than an early interior that costs nothing). The word:

    "deep blocks wasted"   the interval's upper end < 0.5 (the curse of depth present)
    "not wasted"           its lower end > 0.5 (absent)
    "inconclusive"         otherwise
    "not testable"         the precondition fails: for a task, the model itself must be above chance (one-sided
                           exact binomial test, p < 0.05) and, for generation, succeed on >= 30% of the items; for
                           every objective, median_E cost > 0

No single block may decide it: R (point and interval) is recomputed with each block of E and D left out in turn
(`leave_one_out`, with its range). The word stands only if every one of those readings gives the same word; else
it reads "inconclusive (rests on block k)", k the blocks whose leaving out changes it.

`cheapest_blocks` names the blocks that could go: the k interior blocks (2 .. N-2) cheapest by loss; `joint_cost`
states the measured cost of removing them together in nats and in perplexity (exp(cost) - 1), with its interval.
The curse index's deep/shallow mean ratio (depthlab.analysis.curse) stays a reported quantity; the word is this
module's. Pure numpy/scipy: the panel's recompute script (benchmarks/panel_recompute.py) reads the records with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from depthlab.analysis.curse import CurseSpec, interior, resampled_costs, shallow_deep

OBJECTIVES = ("loss", "choice", "generation")
WASTED, NOT_WASTED, INCONCLUSIVE, NOT_TESTABLE = "deep blocks wasted", "not wasted", "inconclusive", "not testable"


@dataclass(frozen=True)
class Rule:
    threshold: float = 0.5  # R's interval wholly below: wasted; wholly above: not wasted
    family_alpha: float = 0.05
    family_size: int = 3  # the three objectives of one model
    replicates: int = 2000
    seed: int = 0
    chance_p: float = 0.05  # the model itself above chance on a task: one-sided exact binomial p below this
    min_generation: float = 0.30  # ... and, for generation, at least this success rate

    @property
    def level(self) -> float:
        return 1 - self.family_alpha / self.family_size


@dataclass(frozen=True)
class Outcomes:
    """One objective's raw outcomes as costs per unit: `delta` (L, W), block l's cost summed over unit w (loss:
    summed loss with l removed - the model's own; a task: right before - right after, so 1, 0 or -1), and `weight`
    (W,), what the cost is per (tokens scored; 1 per question). `right`, `chance`: for a task, the model's own
    outcome per unit and the chance success rate (the precondition)."""
    objective: str
    delta: np.ndarray
    weight: np.ndarray
    right: np.ndarray | None = None
    chance: float = 0.0

    @property
    def costs(self) -> np.ndarray:
        return self.delta.sum(1) / max(float(self.weight.sum()), 1e-300)


def loss_outcomes(base_loss, removed_loss, tokens) -> Outcomes:
    """From per-window summed losses: the model's own (W,), with each block removed (L, W), and tokens scored (W,)."""
    base = np.asarray(base_loss, dtype=np.float64)
    return Outcomes("loss", np.asarray(removed_loss, dtype=np.float64) - base, np.asarray(tokens, dtype=np.float64))


def window_outcomes(windows: dict) -> Outcomes:
    """The loss objective from `analyze`'s per-window removal sums (metrics.json's removal.windows: `count`, the
    tokens scored per window, and `single_delta`, per block the summed loss change per window)."""
    return Outcomes("loss", np.asarray(windows["single_delta"], dtype=np.float64),
                    np.asarray(windows["count"], dtype=np.float64))


def task_outcomes(objective: str, base_right, removed_right, chance: float) -> Outcomes:
    """From per-question (or per-item) outcomes: the model's own (W,) and with each block removed (L, W)."""
    base = np.asarray(base_right, dtype=np.float64)
    return Outcomes(objective, base - np.asarray(removed_right, dtype=np.float64), np.ones(len(base)),
                    base.astype(bool), chance)


def precondition(o: Outcomes, rule: Rule = Rule()) -> dict:
    """Whether a task's objective may be read at all: the model itself above chance (and, for generation, at
    rule.min_generation or more). The loss objective has none."""
    if o.right is None:
        return {"ok": True}
    from scipy.stats import binomtest

    k, n = int(o.right.sum()), len(o.right)
    p = float(binomtest(k, n, o.chance, alternative="greater").pvalue) if n else 1.0
    ok = p < rule.chance_p and (o.objective != "generation" or k >= rule.min_generation * n)
    return {"ok": bool(ok), "right": k, "n": n, "accuracy": k / n if n else math.nan, "chance": o.chance,
            "above_chance_p": p}


def ratio(costs: np.ndarray, early: list[int], deep: list[int]) -> np.ndarray:
    """R = median deep cost / median early cost along the last axis (1-based block lists); +inf where the early
    median is <= 0."""
    e = np.median(costs[..., [l - 1 for l in early]], axis=-1)
    d = np.median(costs[..., [l - 1 for l in deep]], axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(e > 0, d / np.where(e > 0, e, 1.0), math.inf)


def word_of(ci: list[float], rule: Rule = Rule()) -> str:
    if ci[1] < rule.threshold:
        return WASTED
    if ci[0] > rule.threshold:
        return NOT_WASTED
    return INCONCLUSIVE


def _reading(costs: np.ndarray, boot: np.ndarray, early: list[int], deep: list[int], rule: Rule) -> dict:
    point = float(ratio(costs, early, deep))
    a = 1 - rule.level
    # no interpolation between replicates: one may be +inf
    ci = [float(x) for x in np.quantile(ratio(boot, early, deep), [a / 2, 1 - a / 2], method="inverted_cdf")]
    median_e = float(np.median(costs[[l - 1 for l in early]]))
    return {"ratio": point, "ci": ci, "median_early": median_e,
            "median_deep": float(np.median(costs[[l - 1 for l in deep]])),
            "word": word_of(ci, rule) if median_e > 0 else NOT_TESTABLE}


def verdict(o: Outcomes, rule: Rule = Rule()) -> dict:
    """The declared rule's reading of one objective (module docstring): R with its family-level interval, the
    word, the precondition, and each leave-one-block-out reading with their range."""
    n = o.delta.shape[0]
    early, deep = shallow_deep(n)
    costs = o.costs
    boot = resampled_costs(o.delta, o.weight, CurseSpec(bootstrap=rule.replicates, seed=rule.seed))
    out = {"objective": o.objective, "blocks": n, "early": early, "deep": deep, "units": o.delta.shape[1],
           "cost": costs.tolist(), "level": rule.level, "replicates": rule.replicates, "seed": rule.seed,
           "threshold": rule.threshold, "precondition": precondition(o, rule),
           **_reading(costs, boot, early, deep, rule)}
    loo = [{"left_out": k, **_reading(costs, boot, [l for l in early if l != k], [l for l in deep if l != k], rule)}
           for k in early + deep if len(early if k in early else deep) > 1]  # a window of one block stays whole
    out["leave_one_out"] = loo
    readings = loo or [out]
    out["leave_one_out_range"] = {"ratio": [min(r["ratio"] for r in readings), max(r["ratio"] for r in readings)],
                                  "ci": [min(r["ci"][0] for r in readings), max(r["ci"][1] for r in readings)]}
    if not out["precondition"]["ok"]:
        out["word"] = NOT_TESTABLE
    elif out["word"] != NOT_TESTABLE:
        rests = [r["left_out"] for r in loo if r["word"] != out["word"]]
        out["rests_on"] = rests
        if rests:
            out["word"] = f"{INCONCLUSIVE} (rests on block{'s' if len(rests) > 1 else ''} " \
                          f"{', '.join(map(str, rests))})"
    return out


def panel_verdicts(outcomes: list[Outcomes], rule: Rule = Rule()) -> dict[str, dict]:
    """One model's words, one per objective given (the family: rule.family_size objectives, fixed in advance)."""
    return {o.objective: verdict(o, rule) for o in outcomes}


def cheapest_blocks(costs, k: int) -> list[int]:
    """The k interior blocks (1-based, 2 .. N-2) cheapest to remove alone, cheapest first."""
    costs = np.asarray(costs, dtype=np.float64)
    inner = interior(len(costs))
    return sorted(inner, key=lambda l: (costs[l - 1], l))[:k]


def joint_cost(delta, tokens, rule: Rule = Rule()) -> dict:
    """The measured cost of removing a set of blocks together, from its per-window summed loss change against the
    model's own (W,) and the tokens scored (W,): nats per token and perplexity change (exp(nats) - 1), with their
    95% bootstrap intervals over windows."""
    o = Outcomes("loss", np.asarray(delta, dtype=np.float64)[None], np.asarray(tokens, dtype=np.float64))
    boot = resampled_costs(o.delta, o.weight, CurseSpec(bootstrap=rule.replicates, seed=rule.seed))[:, 0]
    nats, ci = float(o.costs[0]), [float(x) for x in np.quantile(boot, [0.025, 0.975])]
    return {"nats": nats, "nats_ci": ci, "perplexity_change": math.expm1(nats),
            "perplexity_change_ci": [math.expm1(x) for x in ci]}
