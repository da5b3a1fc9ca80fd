"""What a study's records say: every comparison un-gated, with per-seed numbers, beside the precondition's reading.

Language-model studies (pre against lns, by depth): the rate grid, each variant's best rate (flagged at a grid
edge), the same-rate comparisons of the grid, and per depth the validation loss and every mechanism quantity of
the final probe, compared seed by seed (depthlab.study.verdicts). ViT studies: the same, on validation loss (the
selection metric) and on top-1 accuracy with its binomial standard error.
"""

from __future__ import annotations

import math

from depthlab.analysis.curse import interior, shallow_deep
from depthlab.stats import binomial_se, mean_std
from depthlab.study.records import cell_key, final_probe, upgrade
from depthlab.study.runner import best_rates
from depthlab.study.verdicts import (
    at_edge,
    cell_reading,
    claim,
    compare,
    deep_inert_fraction,
    holm_words,
    interior_size,
    noise_of,
    ratio_noise,
    reread,
)


def _mean_at(values: list[float], blocks: list[int]) -> float:
    return sum(values[l - 1] for l in blocks) / len(blocks) if blocks else math.nan


def deep_blocks(L: int) -> list[int]:
    return shallow_deep(L)[1]


def middle_blocks(L: int) -> list[int]:
    """Interior blocks in neither the shallow nor the deep interior."""
    shallow, deep = shallow_deep(L)
    return [l for l in interior(L) if l not in shallow and l not in deep]


def _angular(p: dict) -> list[float]:
    return p.get("angular_last") or p["angular_all"]


def _deep_mean(key: str):
    return lambda p, L: _mean_at(p[key], deep_blocks(L))


def _jacobian_deep(p: dict, L: int) -> float | None:
    j = p["curse"].get("jacobian_vs_identity")
    return _mean_at(j, deep_blocks(L)) if j else None


def _nblock_angular(p: dict, L: int) -> float | None:
    """Gromov's n-block angular distance at the largest n probed (about N/2): the closest-ended run of n blocks."""
    runs = p["curse"].get("contiguous")
    return max(runs, key=lambda r: r["n"])["distance"] if runs else None


# name -> (what it is, its value on a final probe of L blocks, the direction the paper predicts for lns - pre, the
# paper's claim it tests, whether that claim needs Pre-LN's curse present)
MECHANISMS = {
    "inert_fraction": ("interior inert fraction (removal < 0.005 nats)", lambda p, L: p["curse"]["inert_fraction"],
                       "lower", 4, True),
    "inert_fraction_rel": ("interior inert fraction (removal < 5% of block 2's)",
                           lambda p, L: p["curse"].get("inert_fraction_rel"), "lower", 4, True),
    "removal_deep_over_shallow": ("removal cost, deep / shallow interior",
                                  lambda p, L: p["curse"]["removal_deep_over_shallow"], "higher", 4, True),
    "update_deep": ("update ratio, deep interior mean", _deep_mean("update_ratio"), "higher", 3, True),
    "angular_deep": ("adjacent angular distance, deep interior mean",
                     lambda p, L: _mean_at(_angular(p), deep_blocks(L)), "higher", 3, True),
    "nblock_angular": ("n-block angular distance (Gromov, largest n)", _nblock_angular, "higher", 3, True),
    "jacobian_deep": ("‖J − I‖, deep interior mean", _jacobian_deep, "higher", 3, True),
    "removal_deep": ("removal cost, deep interior mean (nats)", _deep_mean("removal"), "higher", 4, True),
    "removal_middle": ("removal cost, middle interior mean (nats)",
                       lambda p, L: _mean_at(p["removal"], middle_blocks(L)), "higher", 4, True),
    "last_var": ("variance after the last block", lambda p, L: p["var"][-1], "lower", 2, False),
}


def _runs(records: dict, variant: str, layers: int, lr: float | None, seeds: list[int]) -> dict[int, dict]:
    if lr is None:
        return {}
    found = {s: records.get(cell_key(variant, lr, s, layers)) for s in seeds}
    return {s: r for s, r in found.items() if r and r.get("status") == "ok"}


def index_reading(runs: dict[int, dict], ratio_noise: dict | None = None) -> dict:
    """The curse index of each seed's final model, its mean ± std, and the cell's reading across seeds
    (verdicts.cell_reading: "curse" holds both criteria's t-intervals, the inert one on the deep half, "reading" the
    word; with `ratio_noise`, the ratio read with the seed noise pooled over comparable cells)."""
    probes = [final_probe(r) for r in runs.values() if final_probe(r)]
    per = {s: final_probe(r)["curse"] for s, r in runs.items() if final_probe(r)}
    out = {"per_seed": per}
    for k in ("inert_fraction", "removal_deep_over_shallow", "update_slope"):
        out[k] = mean_std(c.get(k) for c in per.values())
    out["interior_blocks"] = min((interior_size(c) for c in per.values()), default=None)
    out["inert_fraction_rel"] = mean_std(c.get("inert_fraction_rel") for c in per.values())
    out["curse"] = cell_reading(probes, ratio_noise)  # the deep half's inert fraction and the ratio, per run
    out["reading"] = out["curse"]["word"]
    init = [r["probes"][0]["curse"] for r in runs.values() if r.get("probes") and r["probes"][0]["tokens"] == 0]
    if init:  # the same models at initialisation (a probe at 0 tokens)
        out["at_init"] = {k: mean_std(c.get(k) for c in init) for k in ("inert_fraction", "removal_deep_over_shallow",
                                                                        "update_slope")}
    return out


def paired(a: dict[int, dict], b: dict[int, dict], value) -> dict:
    """compare() of value(b) - value(a) seed by seed, with both sides' per-seed values."""
    seeds = sorted(set(a) & set(b))
    va, vb = {s: value(a[s]) for s in seeds}, {s: value(b[s]) for s in seeds}
    known = [s for s in seeds if va[s] is not None and vb[s] is not None]
    return {**compare([vb[s] - va[s] for s in known]), "seeds": seeds, "a": va, "b": vb}


def mechanisms(pre: dict[int, dict], lns: dict[int, dict], L: int, ratio_noise: dict | None = None) -> dict:
    """Every mechanism quantity lns - pre seed by seed, with its claim's word (gated claims read "not testable"
    unless Pre-LN's curse index is present)."""
    reading = index_reading(pre, ratio_noise)["reading"] if all(final_probe(r) for r in pre.values()) else "unknown"
    out = {}
    for name, (what, fn, predicted, number, gated) in MECHANISMS.items():
        c = paired(pre, lns, lambda r, fn=fn: _quantity(fn, r, L))
        if None in c["a"].values() or None in c["b"].values():
            continue  # not in these records (the earlier probe kept no Jacobian)
        cond = reading if gated else "present"
        out[name] = {"what": what, "predicted": predicted, "paper_claim": number, "condition": cond,
                     "claim": claim(c, predicted, cond), **c}
    return out


def along(runs: dict[int, dict]) -> dict[int, list[dict]]:
    """Per seed, the index at every probe along training: does the curse form, and when."""
    keep = ("inert_fraction", "inert_fraction_ci", "removal_deep_over_shallow", "removal_deep_over_shallow_ci",
            "update_slope")
    return {s: [{"step": p["step"], "tokens": p["tokens"], "probe_loss": p["probe_loss"],
                 **{k: p["curse"].get(k) for k in keep}} for p in r.get("probes", [])] for s, r in runs.items()}


def lm_depth(records: dict, L: int, best: dict, seeds: list[int], a: str = "pre", b: str = "lns") -> dict:
    ra, rb = _runs(records, a, L, best[a], seeds), _runs(records, b, L, best[b], seeds)
    loss = paired(ra, rb, lambda r: r["val_loss"])
    probe_loss = paired(ra, rb, lambda r: final_probe(r)["probe_loss"]) if ra and final_probe(next(iter(ra.values()))) \
        else None
    side = lambda rs: {"val_loss": mean_std(r["val_loss"] for r in rs.values()), "index": index_reading(rs),  # noqa: E731
                       "probe_loss": mean_std(final_probe(r)["probe_loss"] for r in rs.values() if final_probe(r)),
                       "along": along(rs)}
    return {"layers": L, "seeds": loss["seeds"], a: side(ra), b: side(rb),
            "delta_val_loss": {**loss, "claim": claim(loss, "lower")}, "delta_probe_loss": probe_loss,
            "mechanisms": mechanisms(ra, rb, L) if ra and rb else {},
            "probe": next(iter(ra.values())).get("probe") if ra else None}


def equal_rate(records: dict, L: int, lrs: list[float], a: str = "pre", b: str = "lns") -> list[dict]:
    """b - a at each rate of the grid both ran (seed 0, the grid's seed)."""
    rows = []
    for lr in lrs:
        ra, rb = records.get(cell_key(a, lr, 0, L)), records.get(cell_key(b, lr, 0, L))
        if ra and rb and ra.get("status") == rb.get("status") == "ok":
            rows.append({"lr": lr, a: ra["val_loss"], b: rb["val_loss"], "delta": rb["val_loss"] - ra["val_loss"]})
    return rows


def lm_study(raw: dict, settings: dict, a: str = "pre", b: str = "lns") -> dict:
    """The depth study's results: grid, best rates (edges flagged), same-rate rows (a sign that differs from the
    best-rate comparison flagged), and every depth's comparisons."""
    records = {k: upgrade(r) for k, r in raw.items()}
    variants = [a, b]
    ref, lrs = settings["ref_depth"], settings["lrs"]
    best = best_rates(None, records, lrs, ref, variants, select="val_loss", minimize=True)
    grid = {v: {f"{lr:g}": r["val_loss"] for lr in lrs if (r := records.get(cell_key(v, lr, 0, ref)))}
            for v in variants}
    seeds = sorted({r["seed"] for r in records.values()})
    depths = [lm_depth(records, L, best, seeds, a, b) for L in sorted(settings["depths"])]
    same = equal_rate(records, ref, lrs, a, b)
    groups = {"val_loss": ([d["delta_val_loss"] for d in depths], 0.0)}
    groups.update({name: ([d["mechanisms"][name] for d in depths if name in d["mechanisms"]], 0.0)
                   for name in MECHANISMS})
    noise = read_pooled(groups)  # one noise model, and the section's comparisons one Holm family
    holm_words([c for d in depths for c in (d["delta_val_loss"], *d["mechanisms"].values()) if c.get("n", 0) > 1])
    for d in depths:
        d["delta_val_loss"]["claim"] = claim(d["delta_val_loss"], "lower")
    at_ref = next((d for d in depths if d["layers"] == ref), None)
    sign = math.copysign(1, at_ref["delta_val_loss"]["mean"]) if at_ref and at_ref["seeds"] else 0
    for row in same:
        row["sign_differs"] = sign != 0 and math.copysign(1, row["delta"]) != sign
    return {"settings": settings, "best_lr": best, "edge": {v: at_edge(best[v], lrs) for v in variants},
            "grid": grid, "equal_rate": same, "depths": depths, "runs": len(records), "noise": noise,
            "train_s": sum(r.get("wall_s", 0.0) for r in records.values())}


# ---------------------------------------------------------------------------------------------------- ViT
def accuracy_comparison(a: dict[int, dict], b: dict[int, dict]) -> dict:
    """Paired accuracy differences b - a, read "inconclusive" also when the mean difference is within two binomial
    standard errors of the difference. Every seed is scored on the same images, so n is one seed's image count,
    not the sum over seeds."""
    c = paired(a, b, lambda r: r["val"]["val_acc"])
    if not c["seeds"]:
        return c
    n = a[c["seeds"][0]]["val"].get("val_images") or 0
    pa, pb = (sum(x.values()) / len(x) for x in (c["a"], c["b"]))
    se = math.hypot(binomial_se(pa, n), binomial_se(pb, n))
    c["binomial_se"] = se
    if abs(c["mean"]) <= 2 * se:
        c["verdict"] = "inconclusive"
    return c


def vit_study(raw: dict, settings: dict, base: str = "pre", paper_direction: dict | None = None) -> dict:
    """Each variant at its best rate by validation loss (the selection metric; accuracy reported beside it, with the
    rate accuracy would have picked), compared with `base` seed by seed."""
    records = {k: {"status": "ok", **r, "val": r.get("val") or {"val_acc": r.get("val_acc"),
                                                                  "val_images": r.get("val_images")}}
               for k, r in raw.items()}
    variants = sorted({r["variant"] for r in records.values()}, key=lambda v: (v != base, v))
    lrs, seeds = settings["lrs"], settings["seeds"]
    best = best_rates(None, records, lrs, None, variants, select="val_loss", minimize=True)
    by_acc = best_rates(None, records, lrs, None, variants, select="val_acc", minimize=False)
    runs = {v: _runs(records, v, None, best[v], seeds) for v in variants}
    out = {"settings": settings, "best_lr": best, "best_lr_by_accuracy": by_acc,
           "edge": {v: at_edge(best[v], lrs) for v in variants},
           "grid": {v: {f"{lr:g}": {"loss": r["val_loss"], "acc": r["val"]["val_acc"]} for lr in lrs
                        if (r := records.get(cell_key(v, lr, 0)))} for v in variants},
           "variants": {v: {"seeds": sorted(rs), "loss": mean_std(r["val_loss"] for r in rs.values()),
                            "acc": mean_std(r["val"]["val_acc"] for r in rs.values())} for v, rs in runs.items()},
           "comparisons": {}}
    for v in variants:
        if v == base:
            continue
        loss, acc = paired(runs[base], runs[v], lambda r: r["val_loss"]), accuracy_comparison(runs[base], runs[v])
        # "better" or "worse" than base, as the paper found
        out["comparisons"][v] = {"loss": loss, "acc": acc, "paper": (paper_direction or {}).get(v)}
    cs = out["comparisons"].values()  # one noise model per metric, and the section's four tests one Holm family
    out["noise"] = read_pooled({m: ([c[m] for c in cs], 0.0) for m in ("loss", "acc")})
    for c in cs:
        if abs(c["acc"].get("mean", 0.0)) <= 2 * c["acc"].get("binomial_se", 0.0):
            c["acc"]["verdict"] = "inconclusive"
    holm_words([c[m] for c in cs for m in ("loss", "acc") if c[m].get("n", 0) > 1])
    for c in cs:
        better = c["paper"] == "better"
        for m, predicted in (("loss", "lower" if better else "higher"), ("acc", "higher" if better else "lower")):
            c[m]["claim"] = claim(c[m], predicted, p_adjusted=c[m].get("p_holm"))
    return out


# ---------------------------------------------------------------------------------------------------- LNS apart
def _rates(records: dict, variant: str, layers: int | None, seed: int = 0) -> dict[float, dict]:
    """Every rate `variant` ran at `layers` with `seed`, and its record (a widened grid is just more rates)."""
    return {r["lr"]: r for r in records.values()
            if r["variant"] == variant and r.get("layers") == layers and r["seed"] == seed}


def own_rate_grid(records: dict, variant: str, layers: int | None) -> dict:
    """A variant's seed-0 grid at one depth, its best rate by final validation loss (diverged runs worst), whether
    that rate is at an edge of what ran, and the rates that diverged."""
    from depthlab.study.runner import selection_value

    grid = _rates(records, variant, layers)
    best = min(grid, key=lambda lr: (selection_value(grid[lr]), lr)) if grid else None
    if best is not None and not math.isfinite(selection_value(grid[best])):
        best = None  # every rate diverged
    return {"grid": {f"{lr:g}": grid[lr]["val_loss"] for lr in sorted(grid)}, "best_lr": best,
            "edge": at_edge(best, sorted(grid)), "diverged": [lr for lr in sorted(grid) if grid[lr]["status"] != "ok"]}


def _quantity(fn, record: dict, layers: int) -> float | None:
    """A mechanism quantity of a record's final probe; None where the model is too shallow to have it."""
    try:
        x = fn(final_probe(record), layers)
    except (KeyError, ZeroDivisionError):
        return None
    return x if x is not None and math.isfinite(x) else None


def variant_reading(records: dict, variant: str, layers: int | None, lr: float | None,
                    ratio_noise: dict | None = None) -> dict:
    """One variant at one depth and rate over every seed that ran: loss, curse index and the final probe's
    mechanism quantities (mean ± std), and how many of its runs diverged."""
    seeds = sorted({r["seed"] for r in records.values()})
    cells = [records[k] for s in seeds if lr is not None and (k := cell_key(variant, lr, s, layers)) in records]
    runs = _runs(records, variant, layers, lr, seeds)
    out = {"lr": lr, "seeds": sorted(runs), "diverged": len(cells) - len(runs),
           "val_loss": mean_std(r["val_loss"] for r in runs.values()),
           "old_probe": any(r.get("probe", {}).get("old") for r in runs.values())}  # the earlier 64-window probe
    if runs and all(final_probe(r) for r in runs.values()):
        out["index"] = index_reading(runs, ratio_noise)
        out["quantities"] = {name: mean_std(x for r in runs.values() if (x := _quantity(fn, r, layers)) is not None)
                             for name, (_, fn, *_) in MECHANISMS.items()}
    return out


def against(records: dict, base: tuple[str, float | None], other: tuple[str, float | None], layers: int | None) -> dict:
    """other - base validation loss seed by seed (each at its own rate)."""
    seeds = sorted({r["seed"] for r in records.values()})
    return paired(_runs(records, base[0], layers, base[1], seeds), _runs(records, other[0], layers, other[1], seeds),
                  lambda r: r["val_loss"])


def ratio_noise_of(records: dict, variant: str) -> dict:
    """The seed noise of `variant`'s deep/shallow removal ratio pooled over its probed cells of two or more seeds
    (every depth and rate of the records): the noise model its curse index is read with."""
    cells: dict[tuple, list[dict]] = {}
    for r in records.values():
        if r["variant"] == variant and r.get("status") == "ok" and final_probe(r):
            cells.setdefault((r.get("layers"), r["lr"]), []).append(final_probe(r))
    return ratio_noise(list(cells.values()))


def pool(res: dict, rerun_var: float = 0.0) -> dict:
    """The LNS study's one noise model: every comparison read again (verdicts.reread) with the seed noise pooled
    over the comparable cells of its measure: validation-loss differences (each depth's, each part's against pre,
    each stability scheme's; plus the rerun variance), the whole-split and test-split differences, and each
    mechanism quantity over depths. Returns {measure: noise}."""
    val = [d["delta_val_loss"] for d in res["depths"]]
    val += [v["delta_val_loss"] for g in res["parts"] for v in g["variants"].values() if "delta_val_loss" in v]
    val += [c for s in res["stability"].values() for c in s["against"].values()]
    groups = {"val_loss": (val, rerun_var),
              "probe_loss": ([d["delta_probe_loss"] for d in res["depths"]], rerun_var),
              "test_loss": ([d["delta_test_loss"] for d in res["depths"]], rerun_var)}
    for name in MECHANISMS:
        groups[name] = ([d["mechanisms"][name] for d in res["depths"] if name in d["mechanisms"]], 0.0)
    noise = read_pooled(groups)
    sections = {"1": [d[k] for d in res["depths"] for k in ("delta_val_loss", "delta_test_loss", "delta_probe_loss")],
                "3": [m for d in res["depths"] for m in d["mechanisms"].values()],
                "4": [v["delta_val_loss"] for g in res["parts"] for v in g["variants"].values()
                      if "delta_val_loss" in v],
                "5": [c for s in res["stability"].values() for c in s["against"].values()]}
    for family in sections.values():  # each section's family, Holm-adjusted within it
        holm_words([c for c in family if c and c.get("n", 0) > 1])
    return noise


def read_pooled(groups: dict[str, tuple[list[dict], float]]) -> dict:
    """Each measure's comparisons (measure -> (compare() results, extra variance)) read again with the seed noise
    pooled over them (verdicts.reread); {measure: its noise}."""
    noise = {}
    for measure, (cs, extra) in groups.items():
        cs = [c for c in cs if c and c.get("n")]
        if cs:
            noise[measure] = noise_of(cs, extra)
            reread(cs, noise[measure])
    return noise


def lns_study(records: dict, parts: list[str], unstable: list[str], ref_depth: int, a: str = "pre",
              b: str = "lns", rerun_var: float = 0.0) -> dict:
    """The LNS study's results from its records (merged with the depth study's, whose N = 24 grid it shares):
    depths  per depth, pre and lns each at its own best rate: loss, Δ seed by seed, the curse index
    parts   per (depth, rate) where LNS's parts ran: each part beside pre, Δ seed by seed, index and quantities
    stability  per scheme at ref_depth: its grid (diverged rates listed) and its best rate over seeds.
    (a and b: the pair compared by depth, pre and lns.)"""
    records = {k: upgrade(r) for k, r in records.items()}
    depths, ratio = [], ratio_noise_of(records, a)
    for L in sorted({r["layers"] for r in records.values() if r["variant"] in (a, b) and r.get("layers")}):
        grids = {v: own_rate_grid(records, v, L) for v in (a, b)}
        best = {v: g["best_lr"] for v, g in grids.items()}
        row = {"layers": L, "grids": grids, **{v: variant_reading(records, v, L, best[v], ratio) for v in best}}
        row["delta_val_loss"] = against(records, (a, best[a]), (b, best[b]), L)
        seeds = sorted({r["seed"] for r in records.values()})
        ra, rb = (_runs(records, v, L, best[v], seeds) for v in (a, b))
        probed = ra and rb and all(final_probe(r) for r in [*ra.values(), *rb.values()])
        row["delta_probe_loss"] = paired(ra, rb, lambda r: final_probe(r)["probe_loss"]) if probed else {}
        tested = ra and rb and all("test_loss" in r for r in [*ra.values(), *rb.values()])
        row["delta_test_loss"] = paired(ra, rb, lambda r: r["test_loss"]) if tested else {}  # the unselected split
        row["mechanisms"] = mechanisms(ra, rb, L, ratio) if probed else {}
        depths.append(row)
    groups = sorted({(r["layers"], r["lr"]) for r in records.values() if r["variant"] in parts[2:]})
    decomposition = [{"layers": L, "lr": lr, "variants": {
        v: {**variant_reading(records, v, L, lr, ratio),
            **({"delta_val_loss": against(records, ("pre", lr), (v, lr), L)} if v != "pre" else {})}
        for v in parts}} for L, lr in groups]
    stability, ref = {}, {d_["layers"]: d_["grids"] for d_ in depths}.get(ref_depth, {})
    for v in unstable:
        g = own_rate_grid(records, v, ref_depth)
        if g["grid"]:  # against pre, and a variant of lns (lns+scaled) against lns, each at its own best rate
            base = {w: against(records, (w, ref[w]["best_lr"]), (v, g["best_lr"]), ref_depth)
                    for w in (a, b) if w in ref and (w == a or v.startswith(f"{b}+"))}
            stability[v] = {**g, "at_best": variant_reading(records, v, ref_depth, g["best_lr"], ratio),
                            "against": base}
    res = {"depths": depths, "parts": decomposition, "stability": stability, "ref_depth": ref_depth,
           "runs": len(records), "train_s": sum(r.get("wall_s", 0.0) for r in records.values()), "ratio_noise": ratio}
    return {**res, "noise": pool(res, rerun_var)}


def along_pairs(records: dict, a: str = "pre", b: str = "lns") -> list[dict]:
    """The curse along training: for each (depth, rate) where pre and lns ran with probes along, at every probe
    both schemes' probe loss, their difference and both curse indices."""
    records = {k: upgrade(r) for k, r in records.items()}
    out = []
    for L, lr in sorted({(r["layers"], r["lr"]) for r in records.values()}):
        pre, lns = (records.get(cell_key(v, lr, 0, L)) for v in (a, b))
        if not (pre and lns and pre.get("probes") and lns.get("probes")):
            continue
        by_step = {p["step"]: p for p in lns["probes"]}
        rows = [{"step": p["step"], "tokens": p["tokens"], f"{a}_loss": p["probe_loss"], f"{b}_loss": q["probe_loss"],
                 "delta": q["probe_loss"] - p["probe_loss"],
                 **{f"{v}_{k}": x["curse"].get(k) for v, x in ((a, p), (b, q))
                    for k in ("inert_fraction", "inert_fraction_ci", "removal_deep_over_shallow",
                              "removal_deep_over_shallow_ci", "update_slope")}}
                for p in pre["probes"] if (q := by_step.get(p["step"]))]
        out.append({"layers": L, "lr": lr, "status": {a: pre["status"], b: lns["status"]},
                    "val_loss": {a: pre["val_loss"], b: lns["val_loss"]}, "probes": rows})
    return out


def matched_rates(records: dict, a: str = "pre", b: str = "lns") -> list[dict]:
    """Every (depth, rate) where a and b both trained seed 0 and were probed: both final models' curse index side
    by side (absolute and relative inert fractions, the deep half's inert fraction, deep/shallow removal ratio), and
    whether b's ratio is below a's (b's deep blocks the cheaper to remove). The index at one rate, not at each
    scheme's best."""
    records = {k: upgrade(r) for k, r in records.items()}
    rows = []
    for L, lr in sorted({(r["layers"], r["lr"]) for r in records.values() if r["variant"] == a and r.get("layers")}):
        ra, rb = (records.get(cell_key(v, lr, 0, L)) for v in (a, b))
        if not (ra and rb and ra.get("status") == rb.get("status") == "ok" and final_probe(ra) and final_probe(rb)):
            continue
        ca, cb = final_probe(ra)["curse"], final_probe(rb)["curse"]
        old = ra.get("probe", {}).get("old") or rb.get("probe", {}).get("old")
        row = {"layers": L, "lr": lr, "old_probe": bool(old),
               "interior_blocks": ca["interior"][1] - ca["interior"][0] + 1 if ca.get("interior") else 0,
               "val_loss": {a: ra["val_loss"], b: rb["val_loss"]}}
        for k in ("inert_fraction", "inert_fraction_rel", "removal_deep_over_shallow"):
            row[k] = {a: ca.get(k), b: cb.get(k)}
        row["inert_fraction_deep"] = {a: deep_inert_fraction(final_probe(ra)), b: deep_inert_fraction(final_probe(rb))}
        x, y = row["removal_deep_over_shallow"][a], row["removal_deep_over_shallow"][b]
        row["b_ratio_lower"] = None if x is None or y is None else y < x
        row["curse"] = cell_reading([final_probe(ra)])  # one seed
        row["reading"] = row["curse"]["word"]
        rows.append(row)
    return rows


def rerun_spread(*runs_files: dict) -> dict:
    """Run-to-run non-determinism: cells (same key) trained again with the same settings in different runs files,
    and the largest |difference| of their final validation losses."""
    pairs = []
    for i, x in enumerate(runs_files):
        for y in runs_files[i + 1:]:
            for k in sorted(set(x) & set(y)):
                if x[k].get("status") == y[k].get("status") == "ok":
                    pairs.append({"key": k, "diff": abs(x[k]["val_loss"] - y[k]["val_loss"])})
    return {"pairs": pairs, "n": len(pairs), "max": max((p["diff"] for p in pairs), default=None)}


def reruns(results) -> dict:
    """The cells trained twice under `results` (a folder of studies): the depth study's and the LNS study's copies,
    "again": the back-to-back check (rerun_a, rerun_b), and "variance": the run-to-run variance of a paired
    difference they show (stats.rerun_variance over every pair), which the page's noise model adds."""
    from pathlib import Path

    from depthlab.stats import rerun_variance
    from depthlab.study.records import load_records

    of = lambda name: load_records(Path(results) / name / "runs.jsonl")  # noqa: E731
    out = {**rerun_spread(of("depth_study"), of("lns_study")), "again": rerun_spread(of("rerun_a"), of("rerun_b"))}
    return {**out, "variance": rerun_variance([p["diff"] for p in out["pairs"] + out["again"]["pairs"]])}
