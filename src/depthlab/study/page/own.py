"""docs/results.md's own-rate section (depthlab.study.own_rate) as far as its records go: each scheme's seed-0 rate
grid at each depth with validation and test loss, the paired LNS − Pre-LN test loss at each one's own
validation-selected rate read with the rules plan.json declared before the first cell (pooled seed noise across
depths, Holm over the depths, at least 3 paired seeds for a word), and the cells not run yet."""

from __future__ import annotations

from pathlib import Path

from depthlab.study import declared, own_rate as o, transfer as t
from depthlab.study.page.text import composition_said, load, said, settings_of
from depthlab.study.records import load_records
from depthlab.study.runner import Cell
from depthlab.study.verdicts import compare, pooled_family

FEW = "fewer than 3 paired seeds: no verdict"


def comparisons(records: dict, d: o.Design, min_seeds: int = 3) -> dict[int, dict]:
    """LNS − Pre-LN test loss by depth, paired by seed, each scheme at its own best rate: compare() read as one
    family (pooled seed noise, Holm), with the word withheld below `min_seeds` paired seeds."""
    out = {}
    for L in [*d.depths, *([d.deep] if d.deep else [])]:
        rates = [o.best(records, d, v, L) for v in (o.PRE, o.LNS)]
        if None in rates:
            continue
        seeds = d.seeds if L in d.depths else d.deep_seeds
        pairs = {s: [records.get(Cell(v, lr, s, L).key) for v, lr in zip((o.PRE, o.LNS), rates, strict=True)]
                 for s in seeds}
        diffs = {s: b[t.ENDPOINT] - a[t.ENDPOINT] for s, (a, b) in pairs.items() if a and b}
        out[L] = {**compare(list(diffs.values())), "seeds": sorted(diffs), "rates": rates}
    pooled_family([c for c in out.values() if c["n"] >= min_seeds])
    for c in out.values():
        if c["n"] < min_seeds:
            c["word"] = FEW if c["n"] else "no runs"
    return out


def grid_row(records: dict, d: o.Design, v: str, L: int) -> str:
    g = o.grid(records, d, v, L)
    cells = []
    for k in g["ks"]:
        r = t.find(records, d.lattice, v, L, k, 0)
        if r is None:
            cells.append(f"{t.rate(k):g} not run yet")
            continue
        text = f"{t.rate(k):g} {r['val_loss']:.4f} / {r[t.ENDPOINT]:.4f}"
        cells.append(f"**{text}**" if k == g["best"] else text)
    best = "-" if g["best"] is None else f"{t.rate(g['best']):g}" + (" (at an edge)" if g["edge"] else "")
    return f"| {L} | {v} | {', '.join(cells)} | {best} |"


def page_lines(out: Path) -> list[str]:
    """The section, from OUT/runs.jsonl, OUT/settings.json and OUT/plan.json; a line saying it has not run where
    OUT has no records."""
    head = ["## The own-rate study: LNS against Pre-LN on balanced held-out splits", ""]
    records, settings = load_records(out / "runs.jsonl"), settings_of(out) or {}
    if not records:
        return head + ["Not run yet (`make study-own-rate`; docs/method.md section 5.3).", ""]
    d = o.Design.of(settings.get("design") or (load(out / "plan.json") or {}).get("design") or {})
    order = declared.plan_order(out, records)
    counts = o.counts(records, d)
    lines = head + [
        f"Made by `{settings.get('command', '?')}` on the corpus sha256 {settings['corpus']['sha256'][:8]}… "
        f"({composition_said(settings['corpus'])}). What decides the words is plan.json beside the records"
        + f" ({order['status']}: {order['why']})."
        + f" Cells done: {counts['done']}; known and missing: {counts['missing']}; at least "
          f"{counts['waiting_at_least']} more wait on those.", "",
        "Each scheme's seed-0 grid: rate, final validation loss / test loss (bold: the best by validation, the "
        "rate every seed of that scheme and depth runs at).", "",
        "| N | scheme | rate: val / test | best |", "|---|---|---|---|"]
    for L in [*d.depths, *([d.deep] if d.deep else [])]:
        lines += [grid_row(records, d, v, L) for v in (*d.pair, *(d.parts if L == d.deep else ()))
                  if o.grid(records, d, v, L)["ks"] and any(t.find(records, d.lattice, v, L, k, 0)
                                                            for k in o.grid(records, d, v, L)["ks"])]
    cs = comparisons(records, d)
    lines += ["", "LNS − Pre-LN test loss, paired by seed, each at its own best rate (pooled seed noise across "
              "depths, Holm over the depths; the plan asks 3 paired seeds before a word):", "",
              "| N | rates (pre, lns) | seeds | lns − pre |", "|---|---|---|---|"]
    for L, c in cs.items():
        shown = said(c, ".4f") if c["n"] >= 3 else (f"{c['mean']:+.4f} (n = {c['n']}: *{c['word']}*)" if c["n"]
                                                     else "no runs")
        lines.append(f"| {L} | {c['rates'][0]:g}, {c['rates'][1]:g} | {', '.join(map(str, c['seeds'])) or '-'} | "
                     f"{shown} |")
    return lines + [""]
