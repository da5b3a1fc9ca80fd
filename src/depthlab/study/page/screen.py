"""docs/results.md's first screen, drawn from the studies (own-rate, depth-transfer, Muon and LNS), and the README's
results bullets, which are the same lines word for word (`readme_block`; tests/test_page.py checks it).

At most MAX_LINES lines: the answer (the own-rate study: held-out test split, each scheme at its own rate, read by the
plan.json committed before its records), the depth-transfer study's test-split replication, the N = 48 decomposition
(the own-rate study's once its parts have 3 paired seeds, else the depth-transfer study's), the Muon study's line
(page.muon.screen_line), the LNS study on the slice that also selected its rates (numbers, no word), why (and what
goes against the paper's mechanism), the rate across depth, the margins and what this scale cannot say (the held-out
text, the noise). Every word is the one its section prints: one noise model, Holm within a stated family, no word
below 3 paired seeds, and a margin set after the data gives a number and no word.
"""

from __future__ import annotations

from pathlib import Path

from depthlab.stats import interval, pvalue
from depthlab.study import declared
from depthlab.study.claims import LNS, against_paper
from depthlab.study.page import muon, own
from depthlab.study.page.text import composition_said
from depthlab.study.transfer import GAIN_INIT, UNIFORM, exponent_reading
from depthlab.study.verdicts import ALPHA, ONE_SEED_INDEX, curse_said

MAX_LINES = 16
START, END = "<!-- results: the first screen of docs/results.md (make results writes it) -->", "<!-- end results -->"


def _Ns(xs) -> str:
    return ", ".join(str(x) for x in xs)


def index_by_depth(done: list[dict]) -> str:
    """Pre-LN's curse reading at each depth, grouped by word ("present" first), each depth with the interval its
    word rests on (verdicts.curse_reading)."""
    order = ["present", "inconclusive", "absent", ONE_SEED_INDEX, "unreadable", "unknown"]
    words: dict[str, list[dict]] = {}
    for d in done:
        r = d["pre"].get("index", {}).get("curse")
        words.setdefault(r["word"] if r else "unknown", []).append({"layers": d["layers"], "curse": r})
    said_at = lambda w, ds: (f"{w} at N = " + ", ".join(  # noqa: E731
        str(x["layers"]) + ("" if w in ("unreadable", "unknown") else f" ({curse_said(x['curse'], word=False)})")
        for x in ds) + (" only" if w == "present" else ""))
    return "reads " + ("; ".join(said_at(w, words[w]) for w in order if w in words) or "nothing: no depth ran")


def _against(table: dict) -> str:
    """Every claims-table row whose measurement goes against the paper while its word does not say so."""
    rows: dict[tuple, list[str]] = {}
    for r in table["family"]:
        if (side := against_paper(r)):
            rows.setdefault((r["claim"], r["measure"].split(":")[0].removesuffix(" (nats)"), side,
                             r["predicted"]), []).append(r["where"].split(",")[0].removeprefix("N = "))
    return "; ".join(f"{what} {side} at N = {', '.join(Ls)} (claim {claim[0]} predicts {predicted})"
                     for (claim, what, side, predicted), Ls in rows.items())


def _margin(item: tuple[str, float | dict]) -> str:
    """A plan's margin: "name ±value", or "name ±value over min-max, ..." where it gives one per range of depths."""
    name, value = item
    if isinstance(value, dict):
        return f"{name} " + ", ".join(f"±{v:g} over {k}" for k, v in value.items())
    return f"{name} ±{value:g}"


def _rates(tres: dict) -> str:
    """Each parameterization's best rate against depth: the fitted exponent and the bootstrap interval over grid
    noise its word comes from, at the Bonferroni level over the parameterizations read (one family)."""
    rows = {v: row for v, row in tres["transfer"].items() if row["bootstrap"].get("checks")}
    level, out = 1 - ALPHA / max(1, len(rows)), []
    for v, row in rows.items():
        b = exponent_reading({L: r["losses"] for L, r in row["rates"].items()}, tres["loss_noise"]["sd"],
                             tres["margins"]["hold"], level)
        out.append(f"{v} N^{row['exponent']['slope']:+.2f} [{b['ci'][0]:+.2f}, {b['ci'][1]:+.2f}], "
                   f"n = {row['exponent']['n']} depths *{b['word']}*")
    return (f"{level:.0%} bootstrap intervals over grid noise, Bonferroni over its {len(rows)} parameterizations): "
            + "; ".join(out))


def first_screen(res: dict, table: dict, tres: dict | None, tsettings: dict | None, equal_rate: list[dict],
                 rerun: dict, tpp: dict[int, float], val_tokens: int, results: Path | None = None) -> list[str]:
    """The page's first lines (at most MAX_LINES): the answer from the own-rate study under `results` (own_screen),
    the depth-transfer study's test-split replication and the N = 48 decomposition (`tres`, transfer.summarize();
    None before it ran), the Muon study's line (muon.screen_line), the LNS study (`res`, its claims `table`) as one
    line on its selection slice, then why, the rate across depth and the margins, and what this scale cannot say."""
    done = [d for d in res["depths"] if d["delta_val_loss"].get("n")]
    own_res = own_screen(results / "own_rate" if results else None)
    under_muon = muon.screen_line(results / "muon") if results else None
    lines = (own_lines(own_res, tres) + ([under_muon] if under_muon else []) + [_older(table, done, val_tokens)]
             + _shared_rate(equal_rate))
    lines.append(f"- **Why? Not shown to be the curse.** Pre-LN's curse index (its deep/shallow removal ratio read "
                 f"with the seed noise pooled over Pre-LN's cells) {index_by_depth(done)}.")
    if against := _against(table):
        lines.append(f"- **Measured against the paper** (directions, not verdicts: pooled intervals on the other side "
                     f"of 0, printed whatever the gate or word; LNS − Pre-LN, LNS study): {against}.")
    if tres:
        hold = tres["margins"]["hold"]
        lines.append(f"- **The best rate against depth** (depth-transfer study; {_rates(tres)}. \"Holds its rate\" "
                     "needs a margin declared before the data; "
                     f"±{hold['value']:.3f} was {hold['status']}: no such word.")
    if eq := res.get("margins", {}).get("equivalence"):
        planned = "".join(f"; the {p['study']} study's plan ({', '.join(map(_margin, p['margins'].items()))}) was "
                          f"{p['status']} ({p['why']})" for p in res["margins"].get("plans", []))
        lines.append(f"- Margins: gain-init ≈ LNS within ±{eq['value']:g} nats (LNS study) was {eq['status']} "
                     f"({eq['why']}){planned}; a margin set after the data prints its numbers, never a word.")
    lines = lines + _limits(res, own_res, tsettings, rerun, tpp, val_tokens)
    assert len(lines) <= MAX_LINES, f"the first screen has {len(lines)} lines, more than {MAX_LINES}"
    return lines + [""]


def own_screen(out: Path | None) -> dict | None:
    """What the first screen reads from the own-rate study in `out`: its design, the pair by depth
    (own.comparisons), the N = 48 parts (own.parts), whether its plan precedes its records, its corpus and the
    pooled noise; None before it ran."""
    found = own.study(out) if out else None
    if not found:
        return None
    records, settings, d = found
    pair = own.comparisons(records, d)
    return {"design": d, "pair": pair, "parts": own.parts(records, d, out), "order": declared.plan_order(out, records),
            "corpus": settings.get("corpus") or {}, "noise": next((c["noise"] for c in pair.values() if "noise" in c),
                                                                  None)}


def _docs(c: dict) -> str:
    b = c.get("documents")
    return f" (documents and seeds resampled: [{b['ci'][0]:+.4f}, {b['ci'][1]:+.4f}])" if b and c["n"] else ""


def own_lines(s: dict | None, tres: dict | None) -> list[str]:
    """The answer (the own-rate study `s`, own_screen(), depth by depth, read by its plan), how its plan reads it,
    the depth-transfer study's test-split replication and the N = 48 decomposition: the own-rate study's once its
    parts have own.MIN_SEEDS paired seeds, else the depth-transfer study's."""
    lines = []
    if s is None:
        lines.append("**Does LNS help? The own-rate study, which answers on balanced held-out splits, has not run yet "
                     "(`make study-own-rate`).**")
    else:
        d, cs = s["design"], s["pair"]
        by_depth = "; ".join(f"N = {L} " + (f"{own.pair_said(cs[L])}{_docs(cs[L])}" if cs.get(L, {}).get("n") else
                                            "not run yet") for L in own.depths_of(d))
        rates = "; ".join(f"N = {L} {c['rates'][0]:g}, {c['rates'][1]:g}" for L, c in cs.items())
        noise = s["noise"]
        pooled = f" (sd {noise['sd']:.4f} nats, df = {noise['df']})" if noise and noise["df"] else ""
        lines += [f"**Does LNS help? LNS − Pre-LN test loss on held-out text no selection read, each scheme at its "
                  f"own validation-selected rate (the own-rate study):** {by_depth}.",
                  f"- Read by the own-rate study's plan.json ({s['order']['status']}): seed noise pooled across "
                  f"depths{pooled}, Holm over the plan's depths {_Ns(own.depths_of(d))} (a depth not yet run counts "
                  f"at p = 1), at least {own.MIN_SEEDS} paired seeds for a word. Rates (pre, lns) chosen on its "
                  f"validation split: {rates or 'none yet'}. The bracketed interval also resamples the test "
                  "documents and gives no word."]
    dec = (tres or {}).get("decomposition")
    if dec:
        lines.append(f"- **Replicated on another test split** (the depth-transfer study: its own corpus, no plan "
                     f"declared before its data; N = {dec['layers']}, each scheme at its own best rate; family: its "
                     f"{tres['noise']['cells']} paired test-loss comparisons, Holm): LNS − Pre-LN "
                     f"{own.pair_said(dec['variants'][LNS]['vs_pre'], '.3f')}.")
    ready = s and s["parts"] and all(c["n"] >= own.MIN_SEEDS for c in s["parts"]["tests"].values())
    if ready:
        p = s["parts"]
        lines.append(f"- **N = {p['layers']} taken apart** (the own-rate study, test split, each at its own best rate; "
                     f"family: the plan's {len(p['tests'])} part comparisons, Holm): {own.parts_said(p)}.")
    elif dec:
        lines.append(f"- **N = {dec['layers']} taken apart** (the depth-transfer study's test split and family, until "
                     f"the own-rate study's N = {dec['layers']} parts have {own.MIN_SEEDS} paired seeds): "
                     f"{own.parts_said(_transfer_parts(dec, tres['margins']['equivalence']), '.3f')}.")
    return lines


def _transfer_parts(dec: dict, margin: dict) -> dict:
    """The depth-transfer study's decomposition in own.parts()'s shape."""
    rows = dec["variants"]
    tests = {"gain-init − Pre-LN": rows[GAIN_INIT]["vs_pre"], "uniform gain − Pre-LN": rows[UNIFORM]["vs_pre"]}
    if dec.get("uniform_vs_gain_init"):
        tests["uniform gain − gain-init"] = dec["uniform_vs_gain_init"]
    return {"layers": dec["layers"], "tests": tests, "tost": dec["tost"], "margin": margin}


def _older(table: dict, done: list[dict], val_tokens: int) -> str:
    """The LNS study's pooled answer, on the slice that also selected its rates: numbers, no word."""
    loss = next(r for r in table["family"] if r["claim"] == "1")
    c = loss["comparison"]
    return (f"- The older LNS study (N = {_Ns(d['layers'] for d in done)}), on the {val_tokens:,}-token validation "
            f"slice that also selected its rates (its composition not recorded): LNS − Pre-LN validation loss "
            f"{c['mean']:+.3f} {interval(c)}, p {pvalue(c['p'])} (Holm {pvalue(loss['p_holm'])}), n = {c['n']} "
            "(depth, seed) pairs; no word here: a slice that chose the rates is not held out (its claims table "
            "reads it).")


def _shared_rate(equal_rate: list[dict]) -> list[str]:
    """At whose rate: LNS against Pre-LN at one shared rate (the LNS study, one seed)."""
    ahead, behind = ([r for r in equal_rate if (r["delta"] < 0) == s] for s in (True, False))
    if not behind:
        return []
    at = lambda rs: ", ".join(f"{r['lr']:g} ({r['delta']:+.3f})" for r in rs)  # noqa: E731
    return [f"- **At whose rate?** Each scheme's own. At one shared rate (LNS study, N = {behind[0]['layers']}, seed "
            f"0, n = 1 each: no verdict) LNS trails at {at(behind)} and leads at {at(ahead)}; the paper shares 1e-3."]


def _limits(res: dict, own_res: dict | None, tsettings: dict | None, rerun: dict, tpp: dict[int, float],
            val_tokens: int) -> list[str]:
    """What this scale cannot say: the models' size, the held-out text, the noise."""
    noise = res["noise"]["val_loss"]
    own_noise = (own_res or {}).get("noise") or {}
    held = [composition_said(own_res["corpus"], "the own-rate study's") + " (the answer reads its test split)"
            ] if own_res else []
    held.append(f"the LNS study selects rates and measures Δ on one {val_tokens:,}-token validation slice, "
                + composition_said(res.get("corpus") or {}, "its"))
    if tsettings:
        held.append(composition_said(tsettings["meta"].get("corpus") or {}, "the depth-transfer study's"))
    pooled = (f"; the own-rate study's LNS − Pre-LN test loss sd {own_noise['sd']:.4f} nats, df = {own_noise['df']}"
              if own_noise.get("df") else "")
    return [f"- **What this scale cannot say.** Width {res.get('dim', 64)}, {min(tpp.values()):.1f}–"
            f"{max(tpp.values()):.1f} training tokens per parameter, Python source (the paper: width ≥ 768, ~20 "
            "tokens per parameter, C4): nothing here speaks for 130M–1B models.",
            "- Held-out text: " + "; ".join(held) + ".",
            f"- One noise model: seed spread pooled over comparable cells (the LNS study's validation loss: sd "
            f"{noise['sd']:.4f} nats, df = {noise['df']}, plus the spread of cells trained twice, up to "
            f"{rerun['max']:.4f} nats over {rerun['n'] + rerun['again']['n']} pairs{pooled}); per-cell readings "
            "(df = n − 1) beside it where they differ."]


def readme_block(lines: list[str]) -> list[str]:
    """The README's results bullets: the first screen's lines, word for word, between the START and END markers."""
    return [START, "", *[x for x in lines if x], "", END]


def write_readme(readme: Path, lines: list[str]) -> bool:
    """Replace the README's block between START and END with readme_block(lines); False where it has no block."""
    text = Path(readme).read_text() if Path(readme).exists() else ""
    if START not in text or END not in text:
        return False
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    Path(readme).write_text(head + "\n".join(readme_block(lines)) + tail)
    return True
