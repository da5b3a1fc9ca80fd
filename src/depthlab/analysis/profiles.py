"""The removal profiles side by side. Per block, what removing it alone costs, read three ways:
- loss: the next-token loss increase on the calibration windows;
- choice: the log-likelihood of the right multiple-choice answer lost, over every task's questions;
- generation: the exact-match answers lost, over every generation task's questions.
Whichever are present are compared by Spearman's rank correlation (scipy.stats.spearmanr) between each pair,
with a 95% percentile bootstrap interval: each replicate resamples the windows, and the questions of each
profile, with replacement (seeded), recomputes the profiles and their correlations. A profile that is the same
for every block (no answer changed, say) has no rank order: its correlations are None.
"""

from __future__ import annotations

import warnings

import numpy as np

PROFILES = {"loss": "loss increase", "choice": "choice log-likelihood lost", "generation": "exact-match answers lost"}
BOOTSTRAP = 1000


def _costs(res: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per profile: the cost of removing each block, per unit (windows x blocks, or questions x blocks), and each
    unit's weight (its scored tokens; 1 a question): a profile is costs.sum(0) / weights.sum()."""
    out = {}
    windows = res.get("removal", {}).get("windows")
    if windows and windows["single_delta"] and windows["count"]:
        out["loss"] = (np.array(windows["single_delta"], dtype=float).T, np.array(windows["count"], dtype=float))
    for name, key, field in (("choice", "task_removal", "ll"), ("generation", "generate_removal", "right")):
        per = [t["per_question"][field] for t in res.get(key, {}).get("tasks", {}).values()
               if field in t.get("per_question", {})]
        if per:
            got = np.concatenate([np.array(p, dtype=float).T for p in per])  # questions x (model itself, blocks)
            cost = got[:, :1] - got[:, 1:]
            out[name] = (cost, np.ones(len(cost)))
    return out


def _rho(a: np.ndarray, b: np.ndarray) -> float | None:
    from scipy.stats import spearmanr

    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b).statistic)


def removal_profiles(res: dict, bootstrap: int = BOOTSTRAP, seed: int = 0) -> dict | None:
    """The profiles present (each a value per block) and, given two or more, their rank correlations with the
    bootstrap interval; None when there is no removal profile."""
    costs = _costs(res)
    if not costs:
        return None
    profile = {k: c.sum(0) / w.sum() for k, (c, w) in costs.items()}
    out: dict = {"profiles": {k: v.tolist() for k, v in profile.items()},
                 "units": {k: len(w) for k, (_, w) in costs.items()}, "bootstrap": bootstrap, "correlations": []}
    names = list(profile)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    if not pairs:
        return out
    rng = np.random.default_rng(seed)
    reps: dict = {p: [] for p in pairs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(bootstrap):
            drawn = {}
            for k, (c, w) in costs.items():
                i = rng.integers(0, len(w), len(w))
                drawn[k] = c[i].sum(0) / w[i].sum()
            for a, b in pairs:
                rho = _rho(drawn[a], drawn[b])
                if rho is not None:
                    reps[a, b].append(rho)
    for a, b in pairs:
        r = reps[a, b]
        ci = [float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))] if r else None
        out["correlations"].append({"a": a, "b": b, "rho": _rho(profile[a], profile[b]), "ci": ci,
                                    "replicates": len(r)})
    return out


def profile_lines(prof: dict | None) -> list[str]:
    """The terminal's lines: each pair's correlation and interval."""
    if not prof or not prof["correlations"]:
        return []
    fmt = lambda c: ("no rank order (a flat profile)" if c["rho"] is None else  # noqa: E731
                     f"{c['rho']:+.2f} [{c['ci'][0]:+.2f}, {c['ci'][1]:+.2f}]" if c["ci"] else f"{c['rho']:+.2f}")
    return ["removal profiles, Spearman rank correlation [95% bootstrap]: "
            + "; ".join(f"{c['a']} ~ {c['b']} {fmt(c)}" for c in prof["correlations"])]
