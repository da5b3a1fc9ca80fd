"""docs/results.md's first screen and the answer in detail below it, drawn from the studies (own-rate, Muon,
rate-transfer and the first LNS study), and the README's results block, the first screen word for word
(`readme_block`, its links made relative to the repository's root; tests/test_page.py checks it).

The first screen (screen_lines), for a person: at most MAX_LINES lines of at most MAX_CHARS characters: the question
and its answer in nats and % perplexity under AdamW (the own-rate study) and Muon, the scale and what it cannot say,
one figure (LNS − Pre-LN by depth under both optimizers, figures.plot_answer), why in one sentence (LNS taken apart
at N = 48), the curse, the cost, and the real-model panel's answer and figure once its section is in
docs/analysis.md. Below it (detail_lines): every family each plan.json declares, read by that plan's rule alone (the
checks it does not declare beside the word), the rate-transfer study's split named by its make-up, the first LNS
study on the slice that also selected its rates (numbers, no word), the curse index, the margins, the held-out text
and the noise. Every word is the one its section prints.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from depthlab.data.tokens import MAX_SHARE, MIN_EFFECTIVE
from depthlab.stats import interval, pvalue
from depthlab.study import declared, figures
from depthlab.study.claims import LNS, PAPER_PPL, against_paper
from depthlab.study.page import muon, own, rates
from depthlab.study.page.text import composition_said, load
from depthlab.study.records import load_records
from depthlab.study.transfer import GAIN_INIT, UNIFORM, exponent_reading
from depthlab.study.verdicts import ALPHA, ONE_SEED_INDEX, curse_said

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


MAX_LINES, MAX_CHARS = 12, 200  # the first screen, for a person: what a 30-second read can take in
DETAIL_HEAD = "## The answer in detail: every declared test, and how each word is decided"
FIGURE = "results_lns_minus_pre.png"
ADAMW, MUON = "AdamW", "Muon"
STUDIES = ("Studies, by what they ask: *the own-rate study* (does LNS lower the test loss when each scheme runs at its "
           "own best rate? `benchmarks/results/own_rate`), *the Muon study* (the same under the Muon optimizer), *the "
           "rate-transfer study* (does a rate tuned at one depth carry to others? `depth_transfer`) and *the first "
           "LNS study* (N = 6–48 on the slice that also selected its rates; `lns_study`). A *cell* is one training "
           "run (scheme, rate, seed, depth).")
RULE = ("How a word is decided: each study's *plan.json*, committed before its first record (git dates both), "
        "declares its endpoint, seeds, margins and *families* of tests; a difference reads *lower*/*higher* when "
        "its 95% t-interval (seed noise pooled over the family's cells) excludes 0, with 3 or more paired seeds, "
        "and its p adjusted by *Holm*'s method over the family (the step-down correction for testing several "
        "hypotheses at once) is below 0.05; *inconclusive* otherwise. A check a plan did not declare is printed "
        "beside the word and never changes it.")


def first_screen(res: dict, table: dict, tres: dict | None, tsettings: dict | None, equal_rate: list[dict],
                 rerun: dict, tpp: dict[int, float], val_tokens: int, results: Path | None = None,
                 img: Path | None = None, docs: Path | None = None) -> list[str]:
    """The page's opening: the first screen (screen_lines: at most MAX_LINES lines of at most MAX_CHARS characters,
    the figure written into `img`), then DETAIL_HEAD and everything else: every family each plan declares, read by
    its rule, the older studies, the held-out text, the noise (detail_lines)."""
    done = [d for d in res["depths"] if d["delta_val_loss"].get("n")]
    own_res = own_screen(results / "own_rate" if results else None)
    muon_res = muon.readings(results / "muon") if results else None
    head = screen_lines(own_res, muon_res, study_scale(results, own_res, muon_res) if results else None, done,
                        results, img, docs)
    body = detail_lines(res, table, tres, tsettings, equal_rate, rerun, tpp, val_tokens, results, own_res, done)
    return head + ["", DETAIL_HEAD, ""] + body + [""]


def screen_lines(own_res: dict | None, muon_res: dict | None, scale: dict | None, done: list[dict],
                 results: Path | None, img: Path | None, docs: Path | None) -> list[str]:
    """The first screen: the question and its answer in nats and % perplexity by optimizer and depth, the scale and
    what it cannot say, the figure, why (LNS taken apart), the curse, the cost, the real-model panel."""
    pairs = {ADAMW: (own_res or {}).get("pair") or {}, MUON: (muon_res or {}).get("pair") or {}}
    lines = [question_line(pairs)] + [optimizer_line(name, cs) for name, cs in pairs.items() if cs]
    if scale:
        lines += scale_lines(scale)
    if img and figures.plot_answer(pairs, img / FIGURE):
        lines.append(f"![LNS − Pre-LN test loss by depth, under AdamW and under Muon, each scheme at its own rate, "
                     f"95% intervals](img/{FIGURE})")
    lines += [x for x in (why_line(own_res), curse_line(done), cost_line(results)) if x]
    lines += panel_lines(docs, results)
    assert len(lines) <= MAX_LINES, f"the first screen has {len(lines)} lines, more than {MAX_LINES}"
    long = [x for x in lines if len(x) > MAX_CHARS]
    assert not long, f"first-screen lines over {MAX_CHARS} characters: {long}"
    return lines


def question_line(pairs: dict[str, dict[int, dict]]) -> str:
    """The question, and the answer in one word per optimizer: its study's words at every depth."""
    q = "**Does LayerNorm Scaling (LNS) lower the loss of a Pre-LN transformer?**"
    if not pairs[ADAMW]:
        return q + " The study that answers it has not run yet (`make study-own-rate`)."
    words = {name: {c.get("word") for c in cs.values()} for name, cs in pairs.items() if cs}
    if all(w == {"lower"} for w in words.values()):
        return (q + " In the small models trained here, yes: the test loss is lower at every depth tried, with "
                + " and with ".join(words) + ".")
    return q + " In the small models trained here: " + "; ".join(
        f"with {name}, " + ", ".join(f"{w} at N = {_Ns(L for L, c in pairs[name].items() if c.get('word') == w)}"
                                     for w in sorted(ws, key=str)) for name, ws in words.items()) + "."


def optimizer_line(name: str, cs: dict[int, dict]) -> str:
    """LNS − Pre-LN test loss under one optimizer, depth by depth: nats, the plan's 95% interval, % perplexity (and
    the word where it is not *lower*, and the depth's own seeds' reading where it differs from the word)."""
    ns = sorted({c["n"] for c in cs.values() if c.get("n")})
    out = []
    for i, (L, c) in enumerate(sorted((L, c) for L, c in cs.items() if c.get("n"))):
        ci = f" {interval(c)}" if c["n"] >= own.MIN_SEEDS else ""
        word = "" if c.get("word") == "lower" else f", {c.get('word')}"
        cell = c.get("cell")
        alone = (f"; {cell['verdict']} on its own seeds" if cell and c["n"] >= own.MIN_SEEDS
                 and cell["verdict"] not in (c.get("word"), c["verdict"]) else "")
        out.append(f"{c['mean']:+.3f}{ci}{' nats' * (i == 0)} at {'N = ' * (i == 0)}{L} "
                   f"({math.expm1(c['mean']):+.1%}{' perplexity' * (i == 0)}{word}{alone})")
    return f"- {name}, {'/'.join(map(str, ns))} seeds: " + ", ".join(out) + "."


def study_scale(results: Path, own_res: dict | None, muon_res: dict | None) -> dict | None:
    """The models the answer rests on: depths (the own-rate and Muon studies'), width, parameters and training
    tokens per parameter at each depth (runner.tokens_per_parameter), the data."""
    from depthlab.study.runner import tokens_per_parameter

    settings = results / "own_rate" / "settings.json"
    if own_res is None or not settings.exists():
        return None
    depths = sorted({*own.depths_of(own_res["design"]), *(own.depths_of(muon_res["design"]) if muon_res else ())})
    meta = json.loads(settings.read_text())["meta"]
    if not {"steps", "batch", "seq", "dim"} <= set(meta):
        return None
    tokens = meta["steps"] * meta["batch"] * meta["seq"]
    tpp = tokens_per_parameter(settings, depths)
    return {"depths": depths, "dim": meta["dim"], "tokens": tokens, "tpp": tpp,
            "params": {L: tokens / x for L, x in tpp.items()},
            "source": (meta.get("corpus") or {}).get("source", "?").split(": ", 1)[-1]}


def scale_lines(s: dict) -> list[str]:
    """The scale beside the answer, and what it cannot say (the paper's sizes and gains, claims.PAPER_PPL)."""
    p, tpp = s["params"].values(), s["tpp"].values()
    paper = " to ".join(f"{b / a - 1:+.1%} ({size})" for size, (a, b) in PAPER_PPL.items())
    return [f"- Scale: N = {min(s['depths'])}–{max(s['depths'])} blocks (N: the depth; a block is an attention and an "
            f"MLP sublayer), width {s['dim']}, {min(p) / 1e6:.1f}M–{max(p) / 1e6:.1f}M parameters, "
            f"{s['tokens'] / 1e6:.1f}M training tokens ({min(tpp):.1f}–{max(tpp):.1f} per parameter), {s['source']}.",
            f"- What this scale cannot say: what LNS does at the paper's 130M–1B parameters (width ≥ 768, ~20 tokens "
            f"per parameter, C4 web text), where it reports {paper} in perplexity."]


def why_line(s: dict | None) -> str | None:
    """Why, in one sentence: LNS taken apart at the own-rate study's deep depth (own.parts), once every part has
    MIN_SEEDS paired seeds: how much of LNS's gain starting the gains smaller recovers (uniform and 1/√l), whether
    the depth profile of that start is shown to matter, and what it leaves behind LNS; every clause by its word."""
    p = (s or {}).get("parts")
    pair = (s or {}).get("pair", {}).get(p["layers"]) if p else None
    if not p or not pair or min([c["n"] for c in p["tests"].values()] + [pair["n"]]) < own.MIN_SEEDS:
        return None
    t, gap = p["tests"], p["tost"]["comparison"]
    gi, un, ug = t["gain-init − Pre-LN"], t["uniform gain − Pre-LN"], t["uniform gain − gain-init"]
    if {gi["word"], un["word"], pair["word"]} != {"lower"}:
        return (f"- Why: LNS taken apart at N = {p['layers']} (below) gives no single reading: gain-init − Pre-LN "
                f"*{gi['word']}*, uniform gain − Pre-LN *{un['word']}*.")
    profile = {"inconclusive": "the start's depth profile is not shown to matter",
               "lower": "the uniform start recovers more", "higher": "the 1/√l start recovers more"}[ug["word"]]
    behind = (f"it stays {gap['mean']:.3f} behind LNS" if gap["word"] == "higher" else
              f"it is not shown behind LNS ({gap['word']})")
    return (f"- Why: at N = {p['layers']}, Pre-LN with its norm gains starting smaller recovers {-un['mean']:.3f} "
            f"(uniform) to {-gi['mean']:.3f} (1/√l) of LNS's {-pair['mean']:.3f} nats; {profile}; {behind}.")


def curse_line(done: list[dict]) -> str:
    """Whether LNS is shown to work by lifting the curse: Pre-LN's curse index by depth, grouped by word."""
    words: dict[str, list[int]] = {}
    for d in done:
        r = d["pre"].get("index", {}).get("curse")
        words.setdefault(r["word"] if r else "unknown", []).append(d["layers"])
    order = sorted(words, key=lambda w: ("present", "inconclusive", "absent").index(w) if w in (
        "present", "inconclusive", "absent") else 3)
    said = ", ".join(f"{w} at {'N = ' * (i == 0)}{_Ns(words[w])}" for i, w in enumerate(order))
    if "present" in words:
        return f"- The curse (Pre-LN's deep blocks near-idle): Pre-LN's curse index reads {said} (the first LNS study)."
    return (f"- Not shown: that LNS works by lifting the curse (Pre-LN's deep blocks near-idle): Pre-LN's curse index "
            f"reads {said} (the first LNS study).")


def cost_line(results: Path | None) -> str | None:
    """What LNS costs: its extra multiplies' share of a training step (benchmarks/results/lns_cost.json)."""
    cost = load(results / "lns_cost.json") if results else None
    shares = [t["scale_ops"]["share_of_pre_step"] for t in (cost or {}).get("training", [])]
    if not shares:
        return None
    return (f"- Cost: LNS's extra multiplies take {min(shares):.2%}–{max(shares):.2%} of a Pre-LN training step "
            "([benchmarks](benchmarks.md)).")


PANEL_MARK = "<!-- panel-first-line -->"  # docs/analysis.md's real-model panel section holds its answer here
PANEL_MODELS = 3  # the panel's models (benchmarks/results/real_model_panel/plan.json)


def panel_lines(docs: Path | None, results: Path | None = None) -> list[str]:
    """The real-model panel's one-line answer and figure: its words by model and objective from its records'
    recomputation (RESULTS/real_model_panel/panel.json, `python -m benchmarks.panel_recompute`), a link to its section
    of docs/analysis.md (the one holding PANEL_MARK) and its figure (docs/img/panel*.png); a line saying it is in
    progress where any of the three is not there yet. The line drops detail until it fits MAX_CHARS."""
    text = (docs / "analysis.md").read_text() if docs and (docs / "analysis.md").exists() else ""
    panel = load(results / "real_model_panel" / "panel.json") if results else None
    figs = sorted((docs / "img").glob("panel*.png")) if docs and (docs / "img").is_dir() else []
    head = next((b.partition("\n")[0][3:].strip() for b in re.split(r"\n(?=## )", text) if PANEL_MARK in b), None)
    words = {m: v["words"] for m, v in (panel or {}).items() if v.get("words")}
    if not (words and figs and head):
        return ["- **Real pretrained models:** the panel that asks the same of pretrained models (are their deep "
                "blocks wasted?) is in progress; its one-line answer and figure will stand here."]
    link = f" ([deep blocks wasted?](analysis.md#{_anchor(head)}))."
    left = PANEL_MODELS - len(words)
    rest = f"; {left} of {PANEL_MODELS} models to run" if left > 0 else ""
    full = "; ".join(f"{m} by {o}: {v['word']}, R {v['ratio']:.2f} [{v['ci'][0]:.2f}, {v['ci'][1]:.2f}]"
                     for m, ws in words.items() for o, v in ws.items())
    short = "; ".join(f"{m} by {o}: {v['word']}" for m, ws in words.items() for o, v in ws.items())
    grouped: dict[tuple[str, str], list[str]] = {}  # (objective, word without what it rests on): models
    for m, ws in words.items():
        for o, v in ws.items():
            grouped.setdefault((o, v["word"].split(" (")[0]), []).append(m)
    brief = "; ".join(f"{', '.join(ms)} by {o}: {w}" for (o, w), ms in grouped.items())
    lines = [f"- **Real pretrained models:** {body}{rest}{link}" for body in (full, short, brief,
                                                                              "words in its section")]
    line = next((x for x in lines if len(x) <= MAX_CHARS), lines[-1])
    return [line, f"![The real-model panel: each block's removal cost]({figs[0].relative_to(docs).as_posix()})"]


def _anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


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
            "exponents": rates.exponents(records, d, out),
            "corpus": settings.get("corpus") or {}, "noise": next((c["noise"] for c in pair.values() if "noise" in c),
                                                                  None)}


def _docs(c: dict) -> str:
    b = c.get("documents")
    return f" (documents and seeds resampled: [{b['ci'][0]:+.4f}, {b['ci'][1]:+.4f}])" if b and c["n"] else ""


def own_lines(s: dict | None, tres: dict | None, split: dict | None = None) -> list[str]:
    """The AdamW answer in full (the own-rate study `s`, own_screen(), read by its plan's `primary` family), how its
    plan reads it, its `rate_exponent` family, the rate-transfer study's test split (`split`, transfer_split()) and
    the N = 48 decomposition: the own-rate study's once its parts have own.MIN_SEEDS paired seeds, else the
    rate-transfer study's."""
    lines = []
    if s is None:
        lines.append("- **Under AdamW:** the own-rate study, which answers on balanced held-out splits, has not run "
                     "yet (`make study-own-rate`).")
    else:
        d, cs = s["design"], s["pair"]
        by_depth = "; ".join(f"N = {L} " + (f"{own.pair_said(cs[L])}{_docs(cs[L])}" if cs.get(L, {}).get("n") else
                                            "not run yet") for L in own.depths_of(d))
        rates = "; ".join(f"N = {L} {c['rates'][0]:g}, {c['rates'][1]:g}" for L, c in cs.items())
        noise = s["noise"]
        pooled = f" (sd {noise['sd']:.4f} nats, df = {noise['df']})" if noise and noise["df"] else ""
        lines += [f"- **LNS − Pre-LN under AdamW** (the own-rate study's `primary` family: test loss on held-out "
                  f"text no selection read, each scheme at its own validation-selected rate): {by_depth}.",
                  f"- Read by the own-rate study's plan.json ({s['order']['status']}): seed noise pooled across "
                  f"depths{pooled}, Holm over the plan's depths {_Ns(own.depths_of(d))} (a depth not yet run counts "
                  f"at p = 1), at least {own.MIN_SEEDS} paired seeds for a word. Rates (pre, lns) chosen on its "
                  f"validation split: {rates or 'none yet'}. The bracketed interval also resamples the test "
                  "documents and gives no word."]
        if line := exponent_line(s["exponents"]):
            lines.append(line)
    dec = (tres or {}).get("decomposition")
    if dec:
        lines.append(transfer_pair_line(dec, tres, split))
    ready = s and s["parts"] and all(c["n"] >= own.MIN_SEEDS for c in s["parts"]["tests"].values())
    gain = ("*gain-init* is Pre-LN whose block-l norm gains start at 1/√l, where LNS's effective gains start, but "
            "learn at the common rate (LNS's also learn 1/√l slower, docs/method.md); *uniform gain* starts every "
            "gain at the mean of those; *TOST* (two one-sided tests) reads \"matches\" only when the 90% interval "
            "lies inside a margin declared before the data")
    if ready:
        p = s["parts"]
        lines.append(f"- **N = {p['layers']} taken apart** (the own-rate study, test split, each at its own best rate; "
                     f"its `parts_at_deep` family, Holm, and its `equivalence` family; {gain}): {own.parts_said(p)}.")
    elif dec:
        lines.append(f"- **N = {dec['layers']} taken apart** (the rate-transfer study's test split and family, until "
                     f"the own-rate study's N = {dec['layers']} parts have {own.MIN_SEEDS} paired seeds; {gain}): "
                     f"{own.parts_said(_transfer_parts(dec, tres['margins']['equivalence']), '.3f')}.")
    return lines


def exponent_line(ex: dict | None) -> str | None:
    """The own-rate study's `rate_exponent` family in one line: each scheme's slope of log(best rate) on log(N), its
    bootstrap intervals, p and Holm's, the plan's word (rates.exponents) and the checks it does not declare."""
    rows = {v: row for v, row in (ex or {}).get("rows", {}).items() if row["reading"] and row["reading"].get("checks")}
    if not rows:
        return None
    m = ex["margin"]
    said = "; ".join(
        f"{v} N^{row['slope']:+.2f}, n = {len(row['rates'])} depths, 95% [{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}], "
        f"90% [{r['tost_ci'][0]:+.2f}, "
        f"{r['tost_ci'][1]:+.2f}], p {pvalue(r['p_move'])} (Holm {pvalue(r['p_move_holm'])}): *{r['holm_word']}*"
        + (f", not \"{rates.HOLDS}\" (90% not inside ±{m['value']:g})" if r["holm_word"] == "inconclusive" and not
           r["inside"] else "") + rates.checks_said(r) for v, row in rows.items() for r in [row["reading"]])
    return (f"- **Does each scheme's best rate move with depth?** (the own-rate study's `rate_exponent` family: "
            f"the slope of log(best rate) on log(N) over N = {_Ns(ex['depths'])}, a bootstrap over grid noise, Holm "
            f"over the two schemes; \"{rates.HOLDS}\" needs the 90% interval inside ±{m['value']:g}, "
            f"{m['status']}): {said}.")


def transfer_split(results: Path | None, tsettings: dict | None) -> dict | None:
    """The rate-transfer study's held-out splits: its corpus record, with each split's make-up from its
    composition.json (benchmarks.report composition) where that rebuilt the corpus its records name; the
    validation-to-test gap of its runs (mean test − validation loss) and whether the test split passes the
    held-out rule (Kish effective >= MIN_EFFECTIVE, no document over MAX_SHARE)."""
    if not tsettings:
        return None
    corpus = dict(tsettings["meta"].get("corpus") or {})
    comp = load(results / "depth_transfer" / "composition.json") if results else None
    if comp and comp.get("matches_records") and comp["sha256"] == corpus.get("sha256"):
        corpus["splits"] = comp["splits"]
    test = (corpus.get("splits") or {}).get("test")
    records = load_records(results / "depth_transfer" / "runs.jsonl") if results else {}
    gaps = [r["test_loss"] - r["val_loss"] for r in records.values() if r.get("status") == "ok" and "test_loss" in r]
    return {"corpus": corpus, "test": test, "gap": statistics.fmean(gaps) if gaps else None,
            "passes": bool(test) and test["effective"] >= MIN_EFFECTIVE and test["max_share"] <= MAX_SHARE}


def transfer_pair_line(dec: dict, tres: dict, split: dict | None) -> str:
    """LNS − Pre-LN on the rate-transfer study's test split: "replicated" only where that split passes the
    held-out rule; otherwise the line names the split's make-up and the validation-to-test gap."""
    pair = own.pair_said(dec["variants"][LNS]["vs_pre"], ".3f")
    where = (f"N = {dec['layers']}, each scheme at its own best rate; its family: its "
             f"{tres['noise']['cells']} paired test-loss comparisons, Holm; no plan declared before its data")
    if split and split["passes"]:
        return f"- **Replicated on another test split** (the rate-transfer study: {where}): LNS − Pre-LN {pair}."
    test = (split or {}).get("test")
    made = (f"{test['documents']} documents, Kish effective {test['effective']:g}, "
            f"{test['top'][0][0]} {test['top'][0][1]:.0%} of it" if test else "its make-up not recorded")
    gap = f", validation-to-test gap {split['gap']:.2f} nats" if split and split["gap"] is not None else ""
    return (f"- **On another test split, not a replication** (the rate-transfer study's: {made}{gap}, below the "
            f"held-out rule of Kish ≥ {MIN_EFFECTIVE:g} and no document over {MAX_SHARE:.0%}; {where}): "
            f"LNS − Pre-LN {pair}.")


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
    return (f"- The first LNS study (N = {_Ns(d['layers'] for d in done)}), on the {val_tokens:,}-token validation "
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
    return [f"- **At whose rate?** Each scheme's own. At one shared rate (the first LNS study, N = "
            f"{behind[0]['layers']}, seed 0, n = 1 each: no verdict) LNS trails at {at(behind)} and leads at "
            f"{at(ahead)}; the paper shares 1e-3."]


def detail_lines(res: dict, table: dict, tres: dict | None, tsettings: dict | None, equal_rate: list[dict],
                 rerun: dict, tpp: dict[int, float], val_tokens: int, results: Path | None, own_res: dict | None,
                 done: list[dict]) -> list[str]:
    """Below the first screen: the studies and the rule defined, every family each plan declares read by its rule
    (own_lines, the Muon study's line), the rate-transfer study's split, the first LNS study on its selection slice,
    why (the curse index), what goes against the paper, the rate across depth, the margins, the held-out text and
    the noise (_limits)."""
    split = transfer_split(results, tsettings)
    under_muon = muon.screen_line(results / "muon", results / "own_rate") if results else None
    lines = [f"- {STUDIES}", f"- {RULE}"] + own_lines(own_res, tres, split) + ([under_muon] if under_muon else [])
    lines += [_older(table, done, val_tokens)] + _shared_rate(equal_rate)
    lines.append(f"- **Why? Not shown to be the curse.** Pre-LN's curse index (its deep/shallow removal ratio read "
                 f"with the seed noise pooled over Pre-LN's cells) {index_by_depth(done)}.")
    if against := _against(table):
        lines.append(f"- **Measured against the paper** (directions, not verdicts: pooled intervals on the other side "
                     f"of 0, printed whatever the gate or word; LNS − Pre-LN, the first LNS study): {against}.")
    if tres:
        hold = tres["margins"]["hold"]
        lines.append(f"- **The best rate against depth in the rate-transfer study** (no plan; {_rates(tres)}. "
                     "\"Holds its rate\" needs a margin declared before the data; "
                     f"±{hold['value']:.3f} was {hold['status']}: no such word.")
    if eq := res.get("margins", {}).get("equivalence"):
        planned = "".join(f"; the {p['study']} study's plan ({', '.join(map(_margin, p['margins'].items()))}) was "
                          f"{p['status']} ({p['why']})" for p in res["margins"].get("plans", []) if p["margins"])
        lines.append(f"- Margins: gain-init ≈ LNS within ±{eq['value']:g} nats (the first LNS study) was "
                     f"{eq['status']} ({eq['why']}){planned}; a margin set after the data prints its numbers, never a "
                     "word.")
    return lines + _limits(res, own_res, split, rerun, tpp, val_tokens)


def _limits(res: dict, own_res: dict | None, split: dict | None, rerun: dict, tpp: dict[int, float],
            val_tokens: int) -> list[str]:
    """What this scale cannot say: the models' size, the held-out text, the noise."""
    noise = res["noise"]["val_loss"]
    own_noise = (own_res or {}).get("noise") or {}
    held = [composition_said(own_res["corpus"], "the own-rate study's") + " (the answer reads its test split)"
            ] if own_res else []
    held.append(f"the first LNS study selects rates and measures Δ on one {val_tokens:,}-token validation slice, "
                + composition_said(res.get("corpus") or {}, "its"))
    if split:
        held.append(composition_said(split["corpus"], "the rate-transfer study's")
                    + ("" if split["passes"] else " (below the held-out rule)"))
    pooled = (f"; the own-rate study's LNS − Pre-LN test loss sd {own_noise['sd']:.4f} nats, df = {own_noise['df']}"
              if own_noise.get("df") else "")
    return [f"- **What this scale cannot say.** Width {res.get('dim', 64)}, {min(tpp.values()):.1f}–"
            f"{max(tpp.values()):.1f} training tokens per parameter in the first LNS study, Python source (the "
            "paper: width ≥ 768, ~20 tokens per parameter, C4): nothing here speaks for 130M–1B models.",
            f"- Held-out text (*Kish*'s effective number of documents, (Σw)²/Σw² with w each document's tokens: how "
            f"many equal documents a split is worth; the held-out rule asks ≥ {MIN_EFFECTIVE:g} and no document over "
            f"{MAX_SHARE:.0%}): " + "; ".join(held) + ".",
            f"- One noise model: seed spread pooled over comparable cells (the first LNS study's validation loss: sd "
            f"{noise['sd']:.4f} nats, df = {noise['df']}, plus the spread of cells trained twice, up to "
            f"{rerun['max']:.4f} nats over {rerun['n'] + rerun['again']['n']} pairs{pooled}); per-cell readings "
            "(df = n − 1) beside it where they differ."]


def readme_block(lines: list[str]) -> list[str]:
    """The README's results block: the first screen's lines, word for word, between the START and END markers, each
    link into docs/ made relative to the repository's root (the README sits one folder above the page)."""
    return [START, "", *[from_root(x) for x in lines if x], "", END]


def from_root(line: str) -> str:
    """A page line's relative links (img/..., analysis.md#...) as the README reaches them (docs/img/...)."""
    return re.sub(r"\]\((?!https?:|#|/)([^)]+)\)", r"](docs/\1)", line)


def write_readme(readme: Path, lines: list[str]) -> bool:
    """Replace the README's block between START and END with readme_block(lines); False where it has no block."""
    text = Path(readme).read_text() if Path(readme).exists() else ""
    if START not in text or END not in text:
        return False
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    Path(readme).write_text(head + "\n".join(readme_block(lines)) + tail)
    return True
