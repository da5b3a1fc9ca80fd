"""docs/results.md's first screen, drawn from both studies (the LNS study and the depth-transfer study), and the
README's results bullets, which are the same lines word for word (`readme_block`; tests/test_page.py checks it).

At most MAX_LINES lines: the answer, the test-split replication, the N = 48 decomposition, why (and what goes against
the paper's mechanism), the rate across depth, the margins and what this scale cannot say. Every word is the one its
section prints (one noise model, Holm within the section's family); a margin set after the data gives a number and
no word.
"""

from __future__ import annotations

from pathlib import Path

from depthlab.stats import interval, pvalue
from depthlab.study.claims import LNS, against_paper
from depthlab.study.page.text import composition_said, said
from depthlab.study.transfer import GAIN_INIT, UNIFORM
from depthlab.study.verdicts import ONE_SEED_INDEX, curse_said

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
    out = []
    for v, row in tres["transfer"].items():
        b, e = row["bootstrap"], row["exponent"]
        if b.get("checks"):
            out.append(f"{v} N^{e['slope']:+.2f} [{b['ci'][0]:+.2f}, {b['ci'][1]:+.2f}], n = {e['n']} depths "
                       f"*{b['word']}*")
    return "; ".join(out)


def first_screen(res: dict, table: dict, tres: dict | None, tsettings: dict | None, equal_rate: list[dict],
                 rerun: dict, tpp: dict[int, float], val_tokens: int) -> list[str]:
    """The page's first lines (at most MAX_LINES) from the LNS study's results (`res`, its claims `table`) and the
    depth-transfer study's (`tres`, summarize(); None before it ran): the answer, the test-split replication and the
    N = 48 decomposition, why, the rate across depth and the margins, then what this scale cannot say."""
    done = [d for d in res["depths"] if d["delta_val_loss"].get("n")]
    lines = _answer(table, done, equal_rate) + (_transfer(tres) if tres else [])
    lines.append(f"- **Why? Not shown to be the curse.** Pre-LN's curse index (its deep/shallow removal ratio read "
                 f"with the seed noise pooled over Pre-LN's cells) {index_by_depth(done)}.")
    if against := _against(table):
        lines.append(f"- **Measured against the paper** (pooled intervals on the other side of 0, printed whatever the "
                     f"gate or word; LNS − Pre-LN): {against}.")
    if tres:
        hold = tres["margins"]["hold"]
        lines.append(f"- **The best rate against depth** (depth-transfer study; 95% bootstrap over grid noise): "
                     f"{_rates(tres)}. \"Holds its rate\" needs a margin declared before the data; "
                     f"±{hold['value']:.3f} was {hold['status']}: no such word.")
    if eq := res.get("margins", {}).get("equivalence"):
        planned = "".join(f"; the {p['study']} study's plan ({', '.join(map(_margin, p['margins'].items()))}) was "
                          f"{p['status']} ({p['why']})" for p in res["margins"].get("plans", []))
        lines.append(f"- Margins: gain-init ≈ LNS within ±{eq['value']:g} nats (LNS study) was {eq['status']} "
                     f"({eq['why']}){planned}; a margin set after the data prints its numbers, never a word.")
    lines = lines + _stability(res, table) + _limits(res, done, tsettings, rerun, tpp, val_tokens)
    assert len(lines) <= MAX_LINES, f"the first screen has {len(lines)} lines, more than {MAX_LINES}"
    return lines + [""]


def _answer(table: dict, done: list[dict], equal_rate: list[dict]) -> list[str]:
    """Does LNS help (the LNS study, pooled over depths, then by depth), and at whose rate."""
    loss = next(r for r in table["family"] if r["claim"] == "1")
    c = loss["comparison"]
    lines = [f"**Does LNS help? At each scheme's own best rate, LNS − Pre-LN validation loss {c['mean']:+.3f} nats, "
             f"95% CI {interval(c)}, p {pvalue(c['p'])} (Holm {pvalue(loss['p_holm'])}), n = {c['n']} (depth, seed) "
             f"pairs over N = {_Ns(d['layers'] for d in done)} (the LNS study): *{loss['word']}*,** on the slice "
             "that also selected the rates.",
             "- By depth (LNS study, validation): " + "; ".join(
                 f"N = {d['layers']} {said(d['delta_val_loss'])}" for d in done) + "."]
    ahead, behind = ([r for r in equal_rate if (r["delta"] < 0) == s] for s in (True, False))
    if behind:
        at = lambda rs: ", ".join(f"{r['lr']:g} ({r['delta']:+.3f})" for r in rs)  # noqa: E731
        lines.append(f"- **At whose rate?** Each scheme's own. At one shared rate (N = {behind[0]['layers']}, seed 0, "
                     f"n = 1 each: no verdict) LNS trails at {at(behind)} and leads at {at(ahead)}; the paper "
                     "shares 1e-3.")
    return lines


def _transfer(tres: dict) -> list[str]:
    """The depth-transfer study on its test split: LNS at its own best rate at the parts depth, the parts, and LNS
    against Pre-LN by depth at the transferred rate."""
    lines, vs = [], {v: row["vs_pre"] for v, row in tres["transfer"].items() if "vs_pre" in row}
    if dec := tres.get("decomposition"):
        P, rows, t, m = dec["layers"], dec["variants"], dec["tost"], tres["margins"]["equivalence"]
        lines += [f"- **On a test split no selection read** (depth-transfer study, N = {P}, each at its own best "
                  f"rate): LNS − Pre-LN {said(rows[LNS]['vs_pre'])}.",
                  f"- **N = {P} taken apart** (test split): gain-init − Pre-LN {said(rows[GAIN_INIT]['vs_pre'])}; "
                  f"uniform gain − Pre-LN {said(rows[UNIFORM]['vs_pre'])}; gain-init − LNS "
                  f"{said(t['comparison'])}, TOST ±{m['value']:g} nats {m['status']}: *{t['verdict']}*."]
    if LNS in vs:
        lines.append(f"- At the rate tuned at {tres['design']['base_depth']} blocks (test split), LNS − Pre-LN by "
                     "depth: " + "; ".join(f"N = {L} {c['mean']:+.3f} {interval(c)} n = {c['n']} "
                                           f"*{c.get('word', c['verdict'])}*" for L, c in vs[LNS].items())
                     + " (Holm over the section's family of paired tests).")
    return lines


def _stability(res: dict, table: dict) -> list[str]:
    stable = [f"{r['scheme']} {r['word']} ({len(r['diverged'])} of {r['n']} rates)" for r in table["stability"]]
    scaled = next((r for r in table["family"] if r["claim"] == "6"), None)
    if not (stable or scaled):
        return []
    return [f"- Stability at N = {res['ref_depth']} (claim 5, a run left at the unigram loss where Pre-LN trains): "
            + "; ".join(stable) + (f". LNS with scaled init − LNS (claim 6): {said(scaled['comparison'])}; claim 6 "
                                   f"*{scaled['word']}*" if scaled else "") + "."]


def _limits(res: dict, done: list[dict], tsettings: dict | None, rerun: dict, tpp: dict[int, float],
            val_tokens: int) -> list[str]:
    """What this scale cannot say: the models' size, the held-out text, the noise."""
    noise, tested = res["noise"]["val_loss"], [d for d in done if d.get("delta_test_loss")]
    return [f"- **What this scale cannot say.** Width {res.get('dim', 64)}, {min(tpp.values()):.1f}–"
            f"{max(tpp.values()):.1f} training tokens per parameter, Python source (the paper: width ≥ 768, ~20 "
            "tokens per parameter, C4): nothing here speaks for 130M–1B models.",
            f"- Held-out text: the LNS study selects rates and measures Δ on one {val_tokens:,}-token validation "
            + ("slice; " if not tested else "slice and reports a test split; ")
            + composition_said(res.get("corpus") or {}, "the LNS study's")
            + ("; " + composition_said(tsettings["meta"].get("corpus") or {}, "the depth-transfer study's")
               if tsettings else "") + ".",
            f"- One noise model: seed spread pooled over comparable cells (validation loss: sd {noise['sd']:.4f} "
            f"nats, df = {noise['df']}) plus the spread of cells trained twice (up to {rerun['max']:.4f} nats, "
            f"{rerun['n'] + rerun['again']['n']} pairs); per-cell readings (df = n − 1) beside it where they differ."]


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
