"""The paper's claims read from the LNS study's results (depthlab.study.summary.lns_study), each by the one rule of
depthlab.study.verdicts, and the findings the results page opens with.

    1   LNS trains to a lower loss than Pre-LN (pooled over depths, each scheme at its own best rate), and it does
        so by lifting the curse of depth (per depth; testable only where Pre-LN's curse index reads present)
    2   LNS lowers the variance after the last block
    3   LNS's deep blocks are less identity-like: larger adjacent angular distance
    4   removing a deep block costs more under LNS: a larger deep/shallow removal cost ratio
    5   Post-LN, DeepNorm and Mix-LN diverge at depth where Pre-LN trains (the paper's ~1,400 PPL)
    6   LNS with scaled initialisation is worse than LNS

Claims 1-4 and 6 form one family, Holm-adjusted (testable rows only); claim 5 is a share of rates with its exact
binomial interval.
"""

from __future__ import annotations

from depthlab.study.declared import AFTER, BEFORE
from depthlab.study.summary import MECHANISMS
from depthlab.study.verdicts import EQUIVALENCE_MARGIN, equivalent, family, less_stable, pooled, reread

# The paper's C4 validation perplexity, Pre-LN then LNS (its Table 1, arXiv 2502.05795; docs/method.md): its claim,
# quoted beside ours, never a measurement of this project
PAPER_PPL = {"130M": (26.73, 25.76), "1B": (17.02, 15.71)}

CLAIM_TEXT = {
    "1": "LNS trains to a lower loss than Pre-LN",
    "1c": "LNS lowers the loss by lifting the curse (Pre-LN's deep blocks identity-like)",
    "2": "LNS lowers the variance after the last block",
    "3": "LNS's deep blocks are less identity-like (larger adjacent angular distance)",
    "4": "removing a deep block costs more under LNS (deep/shallow removal ratio higher)",
    "5": "{v} diverges at depth where Pre-LN trains",
    "6": "LNS with scaled init is worse than LNS",
}
# the decomposition's variants (study variant names, not a list of schemes: the registry owns that)
PRE = "pre"
LNS = "lns"
GAIN_INIT = "pre+gain_init"
MECHANISM_OF = {"2": "last_var", "3": "angular_deep", "4": "removal_deep_over_shallow"}


def _done(res: dict) -> list[dict]:
    return [d for d in res["depths"] if d["delta_val_loss"].get("n")]


def loss_rows(res: dict) -> list[dict]:
    """Claim 1: pooled over depths (the loss, no precondition), then per depth (curse-lifting, gated)."""
    done = _done(res)
    both = pooled([d["delta_val_loss"] for d in done])
    if "val_loss" in res.get("noise", {}):
        reread([both], res["noise"]["val_loss"])
    rows = [{"claim": "1", "where": "pooled, N = " + ", ".join(str(d["layers"]) for d in done) + ", own best rates",
             "measure": "val loss, lns − pre (nats)", "comparison": both,
             "predicted": "lower", "condition": "present"}] if done else []
    for d in done:
        rows.append({"claim": "1c", "where": f"N = {d['layers']}", "measure": "val loss, lns − pre (nats)",
                     "comparison": d["delta_val_loss"], "predicted": "lower",
                     "condition": d["pre"].get("index", {}).get("reading", "unknown")})
    return rows


def mechanism_rows(res: dict) -> list[dict]:
    """Claims 2-4 per depth from the per-seed mechanism comparisons, each scheme at its own best rate."""
    rows = []
    for d in res["depths"]:
        for number, name in MECHANISM_OF.items():
            m = d.get("mechanisms", {}).get(name)
            if m:
                rows.append({"claim": number, "where": f"N = {d['layers']}", "measure": MECHANISMS[name][0],
                             "comparison": m, "predicted": m["predicted"], "condition": m["condition"]})
    return rows


def scaled_rows(res: dict) -> list[dict]:
    """Claim 6: lns+scaled - lns, each at its own best rate at the reference depth, paired by seed."""
    vs = res.get("stability", {}).get("lns+scaled", {}).get("against", {}).get("lns")
    return [{"claim": "6", "where": f"N = {res['ref_depth']}, own best rates", "measure": "val loss, "
             "lns+scaled − lns (nats)", "comparison": vs, "predicted": "higher", "condition": "present"}] if vs else []


def stability_rows(res: dict, unigram: float | None) -> list[dict]:
    """Claim 5 per scheme (verdicts.less_stable) on the seed-0 grids at the reference depth."""
    pre = next((d["grids"]["pre"] for d in res["depths"] if d["layers"] == res["ref_depth"]), None)
    if pre is None or unigram is None:
        return []
    pre_loss = {float(lr): x for lr, x in pre["grid"].items()}
    out = []
    for v, s in res.get("stability", {}).items():
        if v.startswith("lns+"):
            continue
        r = less_stable({float(lr): x for lr, x in s["grid"].items()}, pre_loss, unigram)
        out.append({"claim": "5", "scheme": v, "where": f"N = {res['ref_depth']}, seed 0, every rate Pre-LN trained "
                    "at", **r, "losses": {lr: s["grid"][f"{lr:g}"] for lr in r["diverged"]},
                    "pre_losses": {lr: pre_loss[lr] for lr in r["diverged"]}})
    return out


def claims_table(res: dict, unigram: float | None) -> dict:
    """{"family": claims 1-4 and 6 with Holm-adjusted p and their words, "stability": claim 5's rows}."""
    rows = loss_rows(res) + mechanism_rows(res) + scaled_rows(res)
    return {"family": family(rows), "stability": stability_rows(res, unigram)}


def equivalence_margin(res: dict) -> dict:
    """The equivalence margin the study's page uses (depthlab.study.declared.margin), or the code's with no plan."""
    return res.get("margins", {}).get("equivalence") or {
        "name": "equivalence_nats", "value": EQUIVALENCE_MARGIN, "status": AFTER, "declared": False,
        "why": "set in code; no plan.json declares it before the records"}


def decomposition(res: dict) -> list[dict]:
    """LNS taken apart, per (depth, rate): each part against pre (compare) and, for the gain initialisation alone,
    a TOST against LNS itself (verdicts.equivalent) with the study's equivalence margin (res["margins"], else the
    code's, set after the data: no word)."""
    out, margin = [], equivalence_margin(res)
    for g in res.get("parts", []):
        v = g["variants"]
        lns, gi = (v.get(k, {}).get("delta_val_loss", {}) for k in (LNS, GAIN_INIT))
        seeds = sorted(set(lns.get("b", {})) & set(gi.get("b", {})))
        eq = equivalent([gi["b"][s] - lns["b"][s] for s in seeds], margin["value"], res.get("noise", {}).get(
            "val_loss"), margin["status"] == BEFORE) if seeds else None
        profile = {k: {"removal_deep_over_shallow": v[k].get("index", {}).get("removal_deep_over_shallow", {})
                       .get("mean"), "last_var": v[k].get("quantities", {}).get("last_var", {}).get("mean")}
                   for k in (PRE, LNS, GAIN_INIT) if k in v}
        x = {k: q["removal_deep_over_shallow"] for k, q in profile.items()}
        nearer = len(x) == 3 and None not in x.values() and \
            abs(x["pre+gain_init"] - x["lns"]) < abs(x["pre+gain_init"] - x["pre"])  # its index sits by LNS's
        out.append({"profile": profile, "gain_init_nearer_lns": nearer,
                    "layers": g["layers"], "lr": g["lr"], "pre_reading": v.get("pre", {}).get("index", {})
                    .get("reading", "unknown"), "pre_curse": v.get("pre", {}).get("index", {}).get("curse"),
                    "against_pre": {k: r["delta_val_loss"] for k, r in v.items()
                                                                if r.get("delta_val_loss", {}).get("n")},
                    "gain_init_vs_lns": eq})
    return out


def against_paper(row: dict) -> str | None:
    """The measured direction of a claims-table row where it contradicts the paper and the row's word does not say
    so (not testable, not reproduced): the pooled interval lies on the other side of 0. None otherwise: gating never
    hides a measurement that goes against the paper."""
    c, opposite = row["comparison"], {"lower": "higher", "higher": "lower"}[row["predicted"]]
    return opposite if c.get("verdict") == opposite and row["word"] != "contradicted" else None
