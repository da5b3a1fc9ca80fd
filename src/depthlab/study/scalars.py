"""The scalars study (issue 65): does LNS add anything once the model has learnable per-block stream scalars, and do
the scalars add anything under LNS? A 2 x 2 under Muon at N = 12, 24 and 48:

    {pre, lns} x {no scalars, scalars (model.resid_lambda and model.x0_lambda: before block l,
                                       h = r_l h + a_l x0; docs/method.md section 5.5)}

Each arm at each depth: its own 3-rate grid on the sqrt(2) lattice (seed 0), centred on its scheme's best under
Muon at that depth (the Muon study's; N = 48 at N = 24's), widened past an edge holding the best, selected on the
whole validation split; then seeds 1 and 2 at each best. The cells run depth by depth (every grid at 12, its seeds,
then 24, then 48), so a study stopped early leaves whole depths. Model, corpus, balanced held-out splits, training,
probe and Muon settings are the Muon study's (depthlab.study.muon, on depthlab.study.own_rate's machinery); no
record of another study counts here. What decides the words is `plan()` (OUT/plan.json, committed before the first
record).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from depthlab.study import muon as mu, own_rate as o
from depthlab.study.runner import Cell

PRE, LNS = o.PRE, o.LNS
PRE_S, LNS_S = "pre+scalars", "lns+scalars"
ARMS = (PRE, LNS, PRE_S, LNS_S)
SCHEME = {PRE: PRE, LNS: LNS, PRE_S: PRE, LNS_S: LNS}
SCALARS = ["model.resid_lambda=true", "model.x0_lambda=true"]
RATE_KEYS = mu.RATE_KEYS
# lattice index each grid starts around: its scheme's best under Muon (the Muon study's seed-0 grids: pre 8e-3 at
# N = 12 and 24, lns 1.6e-2 at both); N = 48, which that study did not run, starts at N = 24's
CENTRES = {(PRE, 12): 6, (PRE, 24): 6, (LNS, 12): 8, (LNS, 24): 8}
# CPU minutes a full cell takes at each depth on one core of this 2-core machine, shared by seven engineers (`python -m
# benchmarks.scalars_study measure --runs-dir /tmp/depthlab_scalars_runs`, nice 10, 2026-12-06: short lns+scalars
# cells at N = 12 and 24 at 40 and 120 steps, N = 48's fixed part at 40 steps and its step on the line through them;
# wall time ran 4.5x (N = 12) to 9.7x (N = 48) the CPU time)
CELL_MINUTES: dict[int, float] = {12: 9.4, 24: 15.8, 48: 29.5}
BUDGET_CORE_HOURS = 30.0


@dataclass(frozen=True)
class Design(o.Design):
    depths: tuple[int, ...] = (12, 24, 48)
    seeds: tuple[int, ...] = (0, 1, 2)
    deep: int | None = None  # every depth is in `depths`: no deep stage of the own-rate kind
    deep_seeds: tuple[int, ...] = (0, 1, 2)
    pair: tuple[str, ...] = ARMS
    parts: tuple[str, ...] = ()
    deep_scalars: bool = True  # False: the budget rule dropped the scalar arms at the deepest depth

    def centres(self) -> dict[tuple[str, int], int]:
        return {(v, L): CENTRES[(SCHEME[v], min(L, 24))] for v in ARMS for L in (12, 24, 48)}

    def arms(self, L: int) -> tuple[str, ...]:
        return self.pair if self.deep_scalars or L < max(self.depths) else (PRE, LNS)

    def stages(self, records: dict) -> list[tuple[str, list[Cell] | None, list[str]]]:
        """The own-rate stages one depth at a time: its grids, then its seeds, before the next depth's."""
        return [st for L in self.depths for st in o.stages(records, replace(self, depths=(L,), pair=self.arms(L)))]

    def describe(self) -> dict:
        return {**super().describe(), "centres": {f"{v}@{L}": o.t.rate(self.centre(v, L)) for L in self.depths
                                                  for v in self.arms(L)}}


def variants(d: Design) -> dict[str, list[str]]:
    return {v: [*mu.VARIANTS[SCHEME[v]], *(SCALARS if v in (PRE_S, LNS_S) else [])] for v in d.pair}


def budget(d: Design, minutes: dict[int, float] | None = None) -> dict:
    """Core-hours of the smallest plan (3 grid cells and the extra seeds per arm and depth) and with every grid
    widened once, from the measured cell minutes."""
    minutes = minutes or CELL_MINUTES
    cells = {L: len(d.arms(L)) * (3 + len(d.seeds) - 1) for L in d.depths}
    least = sum(n * minutes[L] for L, n in cells.items()) / 60
    widened = sum((n + len(d.arms(L))) * minutes[L] for L, n in cells.items()) / 60
    return {"cell_minutes": {str(L): round(minutes[L], 1) for L in d.depths}, "cells_at_least": sum(cells.values()),
            "core_hours_at_least": round(least, 1), "core_hours_with_one_widening_per_grid": round(widened, 1),
            "limit_core_hours": BUDGET_CORE_HOURS, "deep_scalar_arms": "kept" if d.deep_scalars else
            f"dropped at N = {max(d.depths)} (the budget rule: the full design does not fit the limit)"}


# -------------------------------------------------------------------------------------------- what they learned
def learned(records: dict, d: Design, arm: str, L: int) -> dict | None:
    """What `arm`'s scalars learned at depth L, every seed at its best rate, read by the plan's rule: per block the
    mean final r_l and a_l beside 1/sqrt(l), and the depth slope of the effective branch multiplier
    m_l = 1 / prod_{k <= l} r_k (least squares of log m_l on log l, one per seed) with its 95% t-interval and word.
    None until the arm's grid has finished or while no seed's record holds its scalars."""
    import numpy as np

    from depthlab.stats import t_test

    best = o.best(records, d, arm, L)
    runs = [records.get(Cell(arm, best, s, L).key) for s in d.seeds] if best is not None else []
    seen = [r["probes"][-1]["stream_scalars"] for r in runs
            if r and (r.get("probes") or [{}])[-1].get("stream_scalars")]
    if not seen:
        return None
    ls = np.arange(1, L + 1)
    r = np.array([x["resid_lambda"] for x in seen], dtype=float)
    slopes = [float(np.polyfit(np.log(ls), -np.cumsum(np.log(row)), 1)[0]) for row in r]
    c = t_test(slopes)
    lo, hi = c["ci"]
    word = ("no verdict" if c["n"] < 3 else "learns LNS's profile" if -0.5 - PROFILE_MARGIN <= lo and hi <= -0.5 +
            PROFILE_MARGIN else "damps with depth" if hi < 0 else "amplifies with depth" if lo > 0 else
            "no depth profile")
    return {"seeds": len(seen), "resid_lambda": r.mean(0).tolist(),
            "x0_lambda": np.array([x["x0_lambda"] for x in seen], dtype=float).mean(0).tolist(),
            "inv_sqrt_l": (ls ** -0.5).tolist(), "m": np.exp(-np.cumsum(np.log(r), 1)).mean(0).tolist(),
            "slope": c, "word": word}


# ---------------------------------------------------------------------------------------------------- the plan
EFFECTS = {  # name -> (arm a, arm b) of a - b, or the interaction (two such pairs)
    "lns - pre without scalars": (LNS, PRE),
    "lns - pre with scalars": (LNS_S, PRE_S),
    "scalars - none under pre": (PRE_S, PRE),
    "scalars - none under lns": (LNS_S, LNS),
}
INTERACTION = "interaction: (lns+scalars - pre+scalars) - (lns - pre)"
PROFILE_MARGIN = 0.15  # |slope of log m_l on log l - (-1/2)| within which the scalars "learn LNS's profile"


def families(d: Design, full: list[int]) -> dict:
    """The plan's families of tests (`full`: the depths that run all four arms)."""
    effects = {L: [e for e, (a, b) in EFFECTS.items() if {a, b} <= set(d.arms(L))] for L in d.depths}
    trend = [*EFFECTS, INTERACTION]
    return {
        "lns_effect": {"tests": [f"{e} at N = {L}" for L in d.depths for e in effects[L] if e.startswith("lns")],
                       "correction": "Holm over the family (a depth without 3 paired seeds leaves it)"},
        "scalars_effect": {"tests": [f"{e} at N = {L}" for L in d.depths for e in effects[L]
                                     if e.startswith("scalars")],
                           "correction": "Holm over the family"},
        "interaction": {"tests": [f"{INTERACTION} at N = {L}" for L in full],
                        "correction": "Holm over the family; per seed the difference of the two paired "
                                      "differences (all four arms share the seed)"},
        "depth_trend": {"tests": [f"slope of ({e}) on log2 N" for e in trend],
                        "method": "least squares of the per-seed effect on log2 N over every depth where the "
                                  "effect has 3 paired seeds (at least 2 depths), t-test on the slope with "
                                  "df = points - 2",
                        "correction": "Holm over the family"},
        "equivalence": {"tests": [f"lns - pre with scalars at N = {L}" for L in d.depths if L in full],
                        "correction": "none per test (each its own question: does LNS add nothing once "
                                      "scalars exist, at this depth); TOST at alpha 0.05"},
    }


def plan(d: Design) -> dict:
    """What decides this study's words, declared before its first cell (OUT/plan.json, committed first)."""
    full = [L for L in d.depths if len(d.arms(L)) == 4]
    base = mu.plan(mu.Design(depths=tuple(d.depths), seeds=d.seeds, transfer_from=None))
    return {
        "study": "scalars",
        "question": "Under Muon, does LNS lower the test loss once the model has learnable per-block stream scalars "
                    "(h = r_l h + a_l x0 before block l), do the scalars lower it under Pre-LN and under LNS, does "
                    "one change the other's effect, and does each effect grow with depth?",
        "arms": {v: variants(d)[v] for v in d.pair},
        "optimizer": base["optimizer"] + "; the scalars in AdamW groups of their own, a_l at 25 x the rate "
                                         "(train.scalar_lr_mult) and r_l at 1/100 of that, starting at r = 1, a = 0",
        "primary_endpoint": "paired by seed: test loss (token-weighted mean over the whole test split) of one arm "
                            "minus another, each at its own rate selected on the validation split, at each depth",
        "selection": base["selection"].replace("AdamW's best at that depth (N = 6: 8e-3)",
                                               "its scheme's best under Muon (the Muon study; N = 48: N = 24's)"),
        "splits": base["splits"],
        "depths": list(d.depths), "seeds": {str(L): list(d.seeds) for L in d.depths},
        "arms_at_depth": {str(L): list(d.arms(L)) for L in d.depths},
        "alpha": 0.05, "interval": "95% two-sided t-interval", "min_seeds_for_a_word": 3,
        "families": families(d, full),
        "words": {"lower/higher": "Holm-adjusted p < 0.05 and the 95% interval excludes 0",
                  "inconclusive": "otherwise, with >= 3 paired seeds",
                  "no verdict": "fewer than 3 paired seeds",
                  "grows with depth": "the trend's Holm-adjusted p < 0.05 and its slope has the sign of the effect "
                                      "at the deepest depth read (the effect's size increases with N)",
                  "shrinks with depth": "the same with the opposite sign",
                  "no trend shown": "otherwise",
                  "matches (adds nothing within the margin)": "both one-sided tests of the equivalence family "
                                                              "reject at alpha 0.05 against +-0.01 nats"},
        "margins": {"equivalence_nats": 0.01, "profile_slope": PROFILE_MARGIN},
        "learned_scalars": {
            "report": "per block l, each scalar arm's final r_l and a_l (every seed at its best rate, at every "
                      "depth), beside 1/sqrt(l)",
            "profile": "the effective branch multiplier m_l = 1 / prod_{k <= l} r_k (a norm ignores its input's "
                       "scale, so h_l / prod r is Pre-LN's stream with block l's branch times m_l, what LNS fixes "
                       "at about l^(-1/2)); its depth slope is the least-squares slope of log m_l on log l, one per "
                       "seed",
            "words": {"learns LNS's profile": f"the 95% t-interval of the seeds' slopes lies inside -0.5 +- "
                                              f"{PROFILE_MARGIN}",
                      "damps with depth": "the interval lies below 0 but not inside that margin",
                      "no depth profile": "the interval contains 0",
                      "amplifies with depth": "the interval lies above 0"},
        },
        "noise_model": base["noise_model"],
        "budget": budget(d) if CELL_MINUTES else None,
        "budget_rule": f"the plan with every grid widened once must fit {BUDGET_CORE_HOURS:g} core-hours (CPU time of "
                       "one-thread cells, measured before this plan); if it does not, N = "
                       f"{max(d.depths)}'s scalar arms are dropped first (Design.deep_scalars) and the page says so",
        "declared_before": "this file's commit precedes every record of runs.jsonl beside it",
    }
