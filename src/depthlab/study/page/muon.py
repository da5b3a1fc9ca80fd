"""docs/results.md's Muon section (depthlab.study.muon, issue 53) as far as its records go, every word by the rules
its plan.json declared before the first cell (3 paired seeds before any word; Holm within each family, a member
not yet testable counted at p = 1):

    grids          each scheme's seed-0 grid at each depth, its best by validation (own.grid_lines)
    primary        LNS − Pre-LN test loss under Muon at each depth, paired by seed (own.comparisons: seed noise
                   pooled across depths), beside the own-rate study's AdamW reading at the same depth, and the
                   against_adamw family: Welch's t on the two studies' per-seed differences (verdicts.contrast),
                   read only where both have 3 paired seeds
    rate_exponent  each scheme's slope of log(best rate) on log(N), read from the depth-transfer study's bootstrap
                   over grid noise (page.rates), Holm over the two schemes, the plan's rule alone; "holds its rate" only
                   inside the plan's margin and only where the plan precedes the records (depthlab.study.declared)
    transfer       N = 6's best rate at each deeper depth minus that depth's own best (test loss, paired by seed):
                   "costs" where higher, else "no cost shown"
    missing        the cells the plan still lacks (own.progress_lines; the transfer cells in their own table)
"""

from __future__ import annotations

from pathlib import Path

from depthlab.stats import holm, interval, pvalue
from depthlab.study import muon as m, own_rate as o, transfer as t
from depthlab.study.page import own
from depthlab.study.page.rates import checks_said, exponent_lines, exponents
from depthlab.study.page.text import rate
from depthlab.study.runner import Cell
from depthlab.study.verdicts import FEW_DF, compare, contrast, contrast_pooled, permutation_p

HEAD = "## The Muon study: does LNS still help under Muon?"
MIN_SEEDS = own.MIN_SEEDS


def against_adamw(muon: dict[int, dict], adamw: dict[int, dict], depths: list[int]) -> dict[int, dict]:
    """(LNS − Pre-LN under Muon) − (LNS − Pre-LN under AdamW) at each of `depths` (the plan's against_adamw family):
    Welch's t on the two studies' per-seed differences (different runs: unpaired), Holm over the family, a word only
    where both studies have MIN_SEEDS paired seeds there. Where a word's Welch df is below FEW_DF, beside it: the
    reading under each study's pooled seed noise (Holm over the family alike, "pooled") and the exact permutation
    test's p ("permutation_p"); neither changes the word."""
    out = {L: contrast((muon.get(L) or {}).get("per_seed", []), (adamw.get(L) or {}).get("per_seed", []))
           for L in depths}
    own.plan_words(list(out.values()), len(depths), pool=False)
    few = [L for L, c in out.items() if "p_holm" in c and c["df"] < FEW_DF]
    if few:  # beside a word on few degrees of freedom: each study's pooled noise (Holm alike) and the exact test
        beside = {L: contrast_pooled(muon[L]["per_seed"], adamw[L]["per_seed"], muon[L].get("noise") or {},
                                     adamw[L].get("noise") or {}) for L, c in out.items() if "p_holm" in c}
        for (L, b), p in zip(beside.items(), holm([b["p"] for b in beside.values()]
                                                  + [1.0] * (len(depths) - len(beside))), strict=False):
            out[L]["pooled"] = {**b, "p_holm": p}
        for L in few:
            out[L]["permutation_p"] = permutation_p(muon[L]["per_seed"], adamw[L]["per_seed"])
    return out


def _losses(records: dict, v: str, lr: float, L: int, seeds) -> dict[int, float]:
    found = {s: records.get(Cell(v, lr, s, L).key) for s in seeds}
    return {s: r[t.ENDPOINT] for s, r in found.items() if r and r.get("status") == "ok" and t.ENDPOINT in r}


def transfer_costs(records: dict, d: m.Design) -> dict[tuple[str, int], dict]:
    """The transfer family: at each deeper depth, each scheme's test loss at N = transfer_from's best rate minus that
    at its own best, paired by seed (compare()), Holm over the family; "costs" where higher, "no cost shown"
    otherwise. Where the two rates are one the cells are the same runs (difference 0, counted at p = 1)."""
    base, out = d.transfer_from, {}
    for v in d.pair:
        lr0 = o.best(records, d, v, base)
        for L in [L for L in d.depths if L != base]:
            lr = o.best(records, d, v, L)
            row = {"from": lr0, "own": lr, "missing": [] if lr0 is None else
                   [s for s in d.seeds if Cell(v, lr0, s, L).key not in records]}
            if lr0 is None or lr is None:
                row.update(n=0, word=f"not run yet: the N = {base if lr0 is None else L} grid has not finished")
            elif lr0 == lr:
                row.update(n=0, word=f"no cost: N = {base}'s rate is its own best here (the same runs)")
            else:
                a, b = _losses(records, v, lr, L, d.seeds), _losses(records, v, lr0, L, d.seeds)
                seeds = sorted(set(a) & set(b))
                row.update(compare([b[s] - a[s] for s in seeds]), seeds=seeds)
            out[(v, L)] = row
    tested = [r for r in out.values() if "verdict" in r]
    own.plan_words(tested, len(out), pool=False)
    for r in tested:
        if r["n"] >= MIN_SEEDS:
            r["word"] = "costs" if r["word"] == "higher" else "no cost shown"
    return out


# ---------------------------------------------------------------------------------------------------- the page
def _welch_said(c: dict) -> str:
    if c["n"] < MIN_SEEDS:
        return (f"no verdict: {c['sizes'][0]} paired seeds under Muon, {c['sizes'][1]} under AdamW ({MIN_SEEDS} each "
                "needed)")
    return (f"{c['mean']:+.4f} {interval(c, '.4f')}, p {pvalue(c['p'])} (Holm {pvalue(c['p_holm'])}), "
            f"n = {c['sizes'][0]} and {c['sizes'][1]}: *{c['word']}*{few_df_said(c)}")


def few_df_said(c: dict) -> str:
    """Beside a Welch word on fewer than FEW_DF degrees of freedom: its df, the reading under each study's pooled
    seed noise and the exact permutation test (against_adamw); "" otherwise."""
    if "permutation_p" not in c:
        return ""
    b = c["pooled"]
    return (f" (Welch df {c['df']:.1f}; under each study's pooled seed noise p {pvalue(b['p'])}, Holm "
            f"{pvalue(b['p_holm'])}; exact permutation p {pvalue(c['permutation_p'])}; neither is the plan's test)")


def pair_lines(records: dict, d: m.Design, adamw: Path) -> list[str]:
    """LNS − Pre-LN under Muon at each depth (the primary family), beside AdamW's (the own-rate study's records in
    `adamw`) and the against_adamw family."""
    cs = own.comparisons(records, d, MIN_SEEDS)
    a_records, _, a_design = own.study(adamw) or ({}, {}, o.Design())
    acs = own.comparisons(a_records, a_design, MIN_SEEDS)
    common = [L for L in own.depths_of(d) if L in own.depths_of(a_design)]
    vs = against_adamw(cs, acs, common)
    lines = ["**LNS − Pre-LN under Muon, beside AdamW.** Test loss, paired by seed, each scheme at its own best rate "
             "under Muon, read by the plan's rule (its `primary` family: the t-interval with seed noise pooled "
             f"across depths, Holm over the plan's {len(own.depths_of(d))} depths, a depth not yet compared at p = "
             f"1, {MIN_SEEDS} paired seeds "
             "before a word); beside it the interval with test documents and seeds resampled (as in the own-rate "
             "section; no word), the own-rate study's AdamW reading at the same depth (its own plan's rule and "
             "family), and the difference of the two: Welch's t-test on the two studies' per-seed differences "
             f"(different runs, so unpaired), Holm over the plan's `against_adamw` family (N = "
             f"{', '.join(map(str, common))}), read only where both have {MIN_SEEDS} paired seeds (*higher*: LNS "
             "gains less under Muon than under AdamW).", "",
             "| N | rates under Muon (pre, lns) | seeds | lns − pre under Muon (the plan's reading) | documents and "
             "seeds resampled (95% bootstrap) | lns − pre under AdamW (the own-rate study) | Muon − AdamW (Welch) |",
             "|---|---|---|---|---|---|---|"]
    for L in own.depths_of(d):
        c, a = cs.get(L), acs.get(L)
        if c is None:
            muon_cells = "- | - | not run yet: a grid has not finished (see below) | -"
        else:
            muon_cells = (f"{c['rates'][0]:g}, {c['rates'][1]:g} | {', '.join(map(str, c['seeds'])) or '-'} | "
                          f"{own.pair_said(c)} | {own.boot_said(c['documents']) if c['n'] else '-'}")
        if L not in common:
            adamw_cell, welch_cell = "no own-rate cell at this depth (that study runs N = " + ", ".join(
                map(str, own.depths_of(a_design))) + ")", "not in the family"
        else:
            adamw_cell = (f"{own.pair_said(a)} (rates {a['rates'][0]:g}, {a['rates'][1]:g})" if a else
                          "not run yet: a grid has not finished" if a_records else "no own-rate records")
            welch_cell = _welch_said(vs[L])
        lines.append(f"| {L} | {muon_cells} | {adamw_cell} | {welch_cell} |")
    return lines + [""]


def _cost_said(r: dict) -> str:
    if "verdict" not in r:
        return r["word"]
    if r["n"] < MIN_SEEDS:
        return f"{r['mean']:+.4f} (n = {r['n']}: *{r['word']}*)" if r["n"] else "not run yet"
    return (f"{r['mean']:+.4f} {interval(r, '.4f')}, p {pvalue(r['p'])} (Holm {pvalue(r['p_holm'])}), "
            f"n = {r['n']}: *{r['word']}*")


def transfer_lines(costs: dict, d: m.Design) -> list[str]:
    base = d.transfer_from
    lines = [f"**What N = {base}'s rate costs deeper.** Each scheme at N = {base}'s best rate (every seed) minus at "
             "its own best there, test loss paired by seed; the plan's `transfer` family, Holm over its "
             f"{len(costs)} members (a member not yet testable at p = 1), {MIN_SEEDS} paired seeds before a word: "
             "*costs* where the transferred rate is higher, else *no cost shown*.", "",
             f"| N | scheme | N = {base}'s rate | its own best | transferred − own | seeds still missing at "
             f"N = {base}'s rate |", "|---|---|---|---|---|---|"]
    for (v, L), r in costs.items():
        missing = ("-" if r["from"] is None else
                   ", ".join(map(str, r["missing"])) if r["missing"] else "none")
        lines.append(f"| {L} | {v} | {rate(r['from'])} | {rate(r['own'])} | {_cost_said(r)} | {missing} |")
    return lines + [""]


def page_lines(out: Path, adamw: Path) -> list[str]:
    """The section, from OUT/runs.jsonl, OUT/settings.json and OUT/plan.json, beside the own-rate study's records in
    `adamw`; a line saying it has not run where OUT has no records."""
    head, found = [HEAD, ""], own.study(out, m)
    if not found:
        return head + ["Not run yet (`make study-muon`; docs/method.md section 5.4).", ""]
    records, settings, d = found
    rows = [(L, v) for L in own.depths_of(d) for v in d.pair]
    deep = f" and {d.deep}" if d.deep else ""
    lines = head + [
        "Pre-LN and LNS with the blocks' matrices trained by Muon (`train.optimizer=muon`, match-RMS-to-AdamW, one "
        "rate for both optimizers) on the own-rate study's model, corpus and splits, at N = "
        f"{', '.join(map(str, d.depths))}{deep} (docs/method.md section 5.4)"
        + ("" if d.deep else "; N = 48 is not in this run's design (`--deep 48`, as the cores allow)") + ". "
        + own.made_by(out, records, settings, d), ""]
    lines += own.grid_lines(records, d, rows)
    lines += pair_lines(records, d, adamw)
    lines += exponent_lines(exponents(records, d, out), "Muon's")
    costs = transfer_costs(records, d)
    lines += transfer_lines(costs, d)
    return lines + own.progress_lines(records, d, rows)


def _pair_short(c: dict | None) -> str:
    if c is None:
        return "not run yet"
    if c["n"] < MIN_SEEDS:
        return f"{c['mean']:+.3f} (n = {c['n']}: no verdict)" if c["n"] else "not run yet"
    return f"{c['mean']:+.3f} {interval(c)} (Holm {pvalue(c['p_holm'])}), n = {c['n']}: *{c['word']}*{own_seeds(c)}"


def own_seeds(c: dict) -> str:
    """Beside a pooled word its depth's own seeds do not carry (df = n − 1): that reading, which changes nothing."""
    cell = c.get("cell")
    if not cell or c["n"] < MIN_SEEDS or cell["verdict"] in (c["word"], c["verdict"]):
        return ""
    return f" ({cell['verdict']} on its own {c['n']} seeds, {interval(cell)})"


def readings(out: Path) -> dict | None:
    """What the first screen reads from the Muon study in `out`: its design, the cells done and missing, LNS − Pre-LN
    by depth (own.comparisons), the rate exponents (rates.exponents) and the against_adamw family beside the
    own-rate study in `adamw` (None there: not read); None before its first record."""
    found = own.study(out, m)
    if not found:
        return None
    records, _, d = found
    return {"design": d, "pair": own.comparisons(records, d, MIN_SEEDS), "exponents": exponents(records, d, out),
            "counts": o.counts(records, d)}


def screen_line(out: Path, adamw: Path | None = None) -> str | None:
    """The results' line on the Muon study (the section's own readings, shortened): LNS − Pre-LN under Muon by depth
    (with its own seeds' reading where it differs), Muon − AdamW (the `against_adamw` family, with `adamw`: the
    own-rate study's records) and each scheme's best rate against depth by the plan's rule, the checks it does not
    declare beside; None before its first record."""
    r = readings(out)
    if r is None:
        return None
    d, cs, ex, counts = r["design"], r["pair"], r["exponents"], r["counts"]
    rates = "; ".join(f"{v} N^{row['slope']:+.2f} [{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}], p {pvalue(r['p_move'])} "
                      f"(Holm {pvalue(r['p_move_holm'])}): *{r['holm_word']}*{checks_said(r)}" if r and r.get("checks")
                      else f"{v} no verdict" for v, row in ex["rows"].items() for r in [row["reading"]])
    vs = ""
    if adamw and (a := own.study(adamw)):
        acs = own.comparisons(a[0], a[2], MIN_SEEDS)
        common = [L for L in own.depths_of(d) if L in own.depths_of(a[2])]
        vs = "; Muon − AdamW (Welch, `against_adamw`): " + "; ".join(
            f"N = {L} {_welch_said(c)}" for L, c in against_adamw(cs, acs, common).items())
    return (f"- **Under Muon** (the Muon study, {counts['done']} cells done, {counts['missing']} known and missing; "
            "test split; its `primary` family): LNS − Pre-LN " + "; ".join(
                f"N = {L} {_pair_short(cs.get(L))}" for L in own.depths_of(d))
            + f"{vs}. Best rate against depth (`rate_exponent`): {rates}.")
