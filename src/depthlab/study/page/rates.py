"""The best rate against depth, read by a study plan's `rate_exponent` family (the own-rate and Muon studies): each
scheme's best rate at every depth (grid best and the vertex through it), the slope of log(best rate) on log(N) and its
bootstrap over grid noise (transfer.exponent_reading), Holm over the schemes, the plan's rule alone deciding the word
(the checks no plan declares printed beside it), and the table the page prints."""

from __future__ import annotations

import math
from pathlib import Path

from depthlab.stats import holm, pvalue
from depthlab.study import declared, own_rate as o, transfer as t
from depthlab.study.runner import selection_value
from depthlab.study.verdicts import ALPHA, MIN_SEEDS

FALLS, RISES, HOLDS = "falls with depth", "rises with depth", "holds its rate"


def exponent_family(readings: list[dict], size: int) -> None:
    """Holm over the rate_exponent family (in place): each bootstrap p ("p_move": slope 0; "p_hold": outside the
    margin) adjusted over `size` schemes; a direction or "holds its rate" the adjusted p does not carry reads
    inconclusive ("holm_word"). The word is the plan's rule alone (the bootstrap's, "bootstrap_word"): the checks
    exponent_reading adds (argmin, each depth left out), which no plan declares, are printed beside it
    (checks_said) and never change it."""
    for key in ("p_move", "p_hold"):
        adjusted = holm([r[key] for r in readings] + [1.0] * (size - len(readings)))
        for r, p in zip(readings, adjusted, strict=False):
            r[f"{key}_holm"] = p
    for r in readings:
        word = r.get("bootstrap_word", r["word"])  # the plan's rule: the bootstrap alone, not the extra checks
        lost = (word in (FALLS, RISES) and r["p_move_holm"] >= ALPHA) or (word == HOLDS and r["p_hold_holm"] >= ALPHA)
        r["holm_word"] = "inconclusive" if lost else word


def exponents(records: dict, d: o.Design, out: Path) -> dict[str, dict]:
    """Each scheme's best rate at every depth (the grid's best and the vertex of the parabola through it,
    transfer.vertex) and, once every depth's grid has finished, the exponent's reading (transfer.exponent_reading:
    each grid point redrawn with one validation loss's seed noise pooled over the cells of 2 or more seeds,
    transfer.loss_noise; none below MIN_SEEDS - 1 degrees of freedom, what one cell's 3 seeds give), the plan's
    margin for the depths fitted, Holm over the schemes."""
    depths = o.depths_of(d)
    noise = t.loss_noise(records)
    margin = declared.margin(out, "holds_its_rate_slope", t.hold_margin(depths), records,
                             f"{min(depths)}-{max(depths)}")
    rows = {}
    for v in d.pair:
        gs = {L: o.grid(records, d, v, L) for L in depths}
        done = {L: g for L, g in gs.items() if g["best"] is not None}
        rates = {L: {"best": t.rate(g["best"]), "edge": g["edge"], "estimate": t.ANCHOR * 2 ** (
            (g["best"] if g["edge"] else t.vertex(g["records"], g["best"])) / 2)} for L, g in done.items()}
        waiting = [L for L in depths if L not in done]
        reading = None if waiting or noise["df"] < MIN_SEEDS - 1 else t.exponent_reading(
            {L: {k: selection_value(r) for k, r in g["records"].items()} for L, g in done.items()}, noise["sd"],
            margin)
        slope = t.exponent(sorted(rates), [rates[L]["estimate"] for L in sorted(rates)])["slope"]
        rows[v] = {"rates": rates, "waiting": waiting, "reading": reading, "slope": slope}
    exponent_family([r["reading"] for r in rows.values() if r["reading"] and r["reading"].get("checks")],
                     len(d.pair))
    return {"rows": rows, "margin": margin, "noise": noise, "depths": depths}


def _rate_cell(r: dict | None) -> str:
    if r is None:
        return "not run yet"
    return f"{r['best']:g}{' (at an edge)' if r['edge'] else ''} ({r['estimate']:.3g})"


def _reading_said(row: dict, res: dict) -> str:
    r = row["reading"]
    if row["waiting"]:
        return f"no verdict: the grid at N = {', '.join(map(str, row['waiting']))} has not finished"
    if r is None:
        return (f"no verdict: the seed noise the bootstrap draws has {res['noise']['df']} degrees of freedom "
                f"({MIN_SEEDS - 1} needed, as one cell's {MIN_SEEDS} seeds give)")
    if not r.get("checks"):
        return r["word"]
    return (f"N^{row['slope']:+.2f}, [{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}] ([{r['tost_ci'][0]:+.2f}, "
            f"{r['tost_ci'][1]:+.2f}]), p slope 0 {pvalue(r['p_move'])} (Holm {pvalue(r['p_move_holm'])}), p outside "
            f"±{res['margin']['value']:.3g} {pvalue(r['p_hold'])} (Holm {pvalue(r['p_hold_holm'])}): "
            f"*{r['holm_word']}*{checks_said(r)}")


def checks_said(r: dict) -> str:
    """Beside an exponent's word: the checks no plan declares (the grids' argmin, each depth left out) where they
    read otherwise; they never change the word."""
    moved = [name for name, c in r.get("checks", {}).items() if c["word"] != r["bootstrap_word"]]
    return (f" (checks the plan does not declare, printed beside the word: {', '.join(moved)} reads "
            f"{', '.join(sorted({r['checks'][name]['word'] for name in moved}))})" if moved else "")


def exponent_lines(res: dict, whose: str) -> list[str]:
    """The plan's rate_exponent family as a table: each scheme's best rate by depth and the exponent's reading."""
    hold, noise, depths = res["margin"], res["noise"], res["depths"]
    sd = f"sd {noise['sd']:.4f} nats over {noise['cells']} cells" if math.isfinite(noise["sd"]) else "none yet"
    lines = [f"**Does {whose} best rate move with depth?** (the plan's `rate_exponent` family) Each depth's grid best "
             "(seed 0, validation) and, in brackets, the vertex of the parabola through it and its neighbours in "
             "log(rate); best rate ∝ N^slope, the slope fitted to the vertices. The plan's rule: every grid point's "
             f"validation loss redrawn {t.BOOTSTRAP:,} times with one loss's seed noise pooled over the cells of 2 or "
             f"more seeds ({sd}), each depth's vertex found again and the slope refitted, the 95% (90%) percentile "
             "interval. *Falls*/*rises with depth* where the slope's bootstrap p (against 0) survives Holm over the "
             "two schemes; *holds its rate* where the p of lying outside "
             f"±{hold['value']:.3g} (the slope that moves the rate one √2 step across N = {min(depths)}-"
             f"{max(depths)}) survives it, and only by a margin declared before the data: this one is "
             f"{hold['status']} ({hold['why']}). Checks no plan declares (the grids' argmin in place of the vertex, "
             "each depth left out) are printed beside the word where they read otherwise, and never change it.", "",
             "| scheme | " + " | ".join(f"N = {L}" for L in depths) + " | bootstrap 95% (90%), p, reading |",
             "|---" * (len(depths) + 2) + "|"]
    for v, row in res["rows"].items():
        lines.append(f"| {v} | " + " | ".join(_rate_cell(row["rates"].get(L)) for L in depths)
                     + f" | {_reading_said(row, res)} |")
    return lines + [""]
