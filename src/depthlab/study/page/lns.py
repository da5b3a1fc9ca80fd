"""docs/results.md's opening and the LNS study's sections 1-4: the first screen, the claims table, each depth at its
own rate, the index at matched rates, the mechanisms and LNS taken apart. Every word comes from depthlab.study.claims
and verdicts."""

from __future__ import annotations

from pathlib import Path

from depthlab.study import figures
from depthlab.study.claims import CLAIM_TEXT, claims_table, decomposition
from depthlab.study.page.text import grid, said
from depthlab.study.stats import interval, pvalue, spread
from depthlab.study.summary import MECHANISMS
from depthlab.study.verdicts import (
    CURSE_RATIO,
    EQUIVALENCE_MARGIN,
    MIN_CONTRADICT,
    MIN_INTERIOR,
    PRESENT,
    UNIGRAM_MARGIN,
    pooled,
)


def _Ns(xs) -> str:
    return ", ".join(str(x) for x in xs) or "none"


def _profile(p: dict) -> str:
    """Deep/shallow removal ratio and last-block variance of pre, lns and gain-init at one decomposition cell."""
    q = p["profile"]
    return (f"lr {p['lr']:g}: deep/shallow removal " + ", ".join(
        f"{v} {x['removal_deep_over_shallow']:.2f}" for v, x in q.items()) + "; last-block variance "
        + ", ".join(f"{v} {x['last_var']:.0f}" for v, x in q.items()))


def first_screen(res: dict, table: dict, matched: list[dict], parts: list[dict], equal_rate: list[dict],
                 rerun: dict, tpp: dict[int, float], val_tokens: int) -> list[str]:
    """At most ten lines: does LNS help (at whose rate, by how much, over how many seeds), what the data say about
    why, and what this scale cannot say."""
    loss = next(r for r in table["family"] if r["claim"] == "1")
    c = loss["comparison"]
    done = [d for d in res["depths"] if d["delta_val_loss"].get("n")]
    per = "; ".join(f"N = {d['layers']} {d['delta_val_loss']['mean']:+.3f} (pre {d['grids']['pre']['best_lr']:g}, "
                    f"lns {d['grids']['lns']['best_lr']:g})" for d in done)
    tested = [d["delta_test_loss"] for d in done if d.get("delta_test_loss")]
    probe = pooled(tested or [d["delta_probe_loss"] for d in done if d.get("delta_probe_loss")])
    where = (f"On the test split no selection read ({len(tested)} of {len(done)} depths), the pooled Δ is" if tested
             else "These records have no separate test split: on the whole validation split (the probe's seeded "
                  "windows) the pooled Δ is")
    lines = [f"**Does LNS help?** Yes, at each scheme's own best rate: LNS − Pre-LN validation loss "
             f"**{c['mean']:+.3f} nats, 95% CI {interval(c)}, p {pvalue(c['p'])}, n = {c['n']}** (depth, seed) pairs "
             f"pooled over N = {_Ns(d['layers'] for d in done)} (every pair one observation, df = n − 1; Holm p "
             f"{pvalue(loss['p_holm'])}): claim 1's loss part *{loss['word']}*, the best-supported finding here. "
             f"By depth (each at its own rates): {per}."]
    ahead, behind = ([r for r in equal_rate if (r["delta"] < 0) == s] for s in (True, False))
    if behind:
        rows = lambda rs: ", ".join(f"{r['lr']:g} ({r['delta']:+.3f})" for r in rs)  # noqa: E731
        lines.append(f"**At whose rate?** Each scheme's own. At one shared rate the sign turns with the rate: at "
                     f"N = 24, LNS trails at {rows(behind)} (the paper shares 1e-3) and leads at {rows(ahead)} "
                     "(seed 0, n = 1 each: one seed, no verdict, no interval).")
    present = [d["layers"] for d in done if d["pre"].get("index", {}).get("reading") == "present"]
    lower = [m for m in matched if m["b_ratio_lower"]]
    why = (f"**Why?** Not shown to be the curse. Pre-LN's curse index reads present at N = {_Ns(present)} only, "
           f"and at matched rates LNS's deep/shallow removal ratio is *below* Pre-LN's in {len(lower)} of "
           f"{len(matched)} (depth, rate) cells: LNS's deep blocks end the cheaper to remove, not the busier.")
    eq = [p for p in parts if p["gain_init_vs_lns"]]
    if eq:
        why += " Pre-LN with gains initialised at l^-p alone against LNS: " + "; ".join(
            f"N = {p['layers']}, lr {p['lr']:g}: {said(p['gain_init_vs_lns']['comparison'])}, TOST ±"
            f"{EQUIVALENCE_MARGIN} nats p {pvalue(p['gain_init_vs_lns']['p'])}: "
            f"*{p['gain_init_vs_lns']['verdict']}*" for p in eq) + "."
        near = all(p["gain_init_nearer_lns"] for p in eq)
        why += (" Its final models sit nearer LNS's than Pre-LN's (" if near else " Its final models (") + "; ".join(
            _profile(p) for p in eq) + (") - so matching LNS's loss cannot separate an optimisation effect from "
                                             "curse-lifting." if near else ").")
    lines.append(why)
    ratio = ", ".join(f"{tpp[L]:.1f}" for L in sorted(tpp))
    lines.append(f"**What this scale cannot say.** Width 64, {ratio} training tokens per parameter at N = "
                 f"{_Ns(sorted(tpp))}, Python source (the paper: width ≥ 768, ~20 tokens per parameter, C4), so "
                 "nothing here speaks for 130M-1B models. Rates were selected, and the loss above is measured, on the "
                 f"same first {val_tokens:,} validation tokens. {where} {said(probe)}. Cells "
                 f"trained twice with identical settings differ by up to {rerun['max']:.4f} nats ({rerun['n']} "
                 "reruns); each cell enters the page once, and that noise sits inside the seed-to-seed spread every "
                 "interval counts" + (f"; back to back on one machine {rerun['again']['n']} cells came out bitwise "
                                      "equal (section 9)." if rerun.get("again", {}).get("n") and
                                      rerun["again"]["max"] == 0 else "."))
    return lines + [""]


def claims_lines(table: dict) -> list[str]:
    """The claims table: the paper's claim, where, our measurement, n, interval, p (and Holm's), the word."""
    out = ["## The paper's claims, one rule", "",
           "| # | the paper's claim | where | our measurement | n | 95% interval | p (Holm) | word |",
           "|---|---|---|---|---|---|---|---|"]
    for r in table["family"]:
        c = r["comparison"]
        cond = "" if r["condition"] == "present" else f" (Pre-LN's curse index {r['condition']})"
        out.append(f"| {r['claim'][0]} | {CLAIM_TEXT[r['claim']]} | {r['where']} | {r['measure']}: "
                   f"{spread(c, '.3g', signed=True)} | {c['n']} | {interval(c, '.3g')} | {pvalue(c['p'])} "
                   f"({pvalue(r['p_holm'])}) | **{r['word']}**{cond} |")
    for r in table["stability"]:
        runs = ", ".join(f"{lr:g} ({r['losses'][lr]:.2f} vs Pre-LN {r['pre_losses'][lr]:.2f})" for lr in r["diverged"])
        out.append(f"| 5 | {CLAIM_TEXT['5'].format(v=r['scheme'])} | {r['where']} | share of rates ending within "
                   f"{UNIGRAM_MARGIN} nats of the unigram loss {r['unigram']:.2f}: {len(r['diverged'])} of {r['n']}"
                   f"{': ' + runs if runs else ''} | {r['n']} | [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] (exact) | - | "
                   f"**{r['word']}** |")
    out += ["", f"*The rule* (depthlab/study/verdicts.py): every difference is paired by seed, with its 95% "
            "t-interval (df = n − 1) and p from scipy.stats. A comparison reads *lower*/*higher* only when the "
            "interval "
            "excludes 0, *inconclusive* when it holds 0, and one seed gives no verdict. A claim is *supported* when "
            "the interval excludes 0 on the predicted side and its Holm-adjusted p (over the table's testable t-test "
            f"rows) is below 0.05; *contradicted* needs the other side with ≥ {MIN_CONTRADICT} seeds; *not "
            "reproduced* otherwise; *not testable* where the claim needs Pre-LN's curse and its index does not read "
            f"present (interior inert fraction ≥ {PRESENT:.2f} or deep/shallow removal ratio < {CURSE_RATIO}; an "
            f"interior of fewer than {MIN_INTERIOR} blocks is unreadable). Claim 5 is the paper's divergence (Table "
            "1's ~1,400 PPL): a run ending at the unigram loss while Pre-LN trains at that rate; its interval is the "
            "exact binomial interval of that share, and Pre-LN diverged at none of those rates.", ""]
    return out


def own_best_lines(res: dict) -> list[str]:
    out = ["## 1. Each depth at its own rate", "",
           "Each scheme's seed-0 grid at that depth (best rate in bold), then both at their own best rate over every "
           "seed. Δ = lns − pre paired by seed: on the validation slice that selected the rates, and on the test "
           "split (where a record has none: the whole validation split, the probe's loss). The curse index is Pre-LN's "
           "final models' (absolute threshold 0.005 nats beside the relative one, 5% of block 2's cost).", "",
           "| N | pre grid | lns grid | Δ val loss | Δ test loss | Pre-LN inert (abs / rel) | "
           "Pre-LN deep/shallow "
           "| interior blocks | Pre-LN curse |", "|---|---|---|---|---|---|---|---|---|"]
    for d in res["depths"]:
        idx = d["pre"].get("index", {})
        size = idx.get("interior_blocks")
        flag = f"{size}" + (" (too few to read)" if size is not None and size < MIN_INTERIOR else "")
        old = " (earlier 64-window probe)" if d["pre"].get("old_probe") else ""
        out.append(f"| {d['layers']} | {grid(d['grids']['pre'])} | {grid(d['grids']['lns'])} | "
                   f"{said(d['delta_val_loss'])} | {said(d.get('delta_test_loss') or d.get('delta_probe_loss', {}))}"
                   f"{'' if d.get('delta_test_loss') else ' (whole split)'} | "
                   f"{spread(idx.get('inert_fraction'), '.2f')} / {spread(idx.get('inert_fraction_rel'), '.2f')} | "
                   f"{spread(idx.get('removal_deep_over_shallow'), '.2f')} | {flag} | {idx.get('reading', '-')}{old} |")
    return out + ["", "![Δ at each scheme's own best rate, by depth, with 95% t-intervals](img/lns_own_best.png)", ""]


def matched_lines(matched: list[dict]) -> list[str]:
    lower = sum(bool(m["b_ratio_lower"]) for m in matched)
    out = ["## 2. The curse index at matched rates", "",
           "Both schemes at the same rate (seed 0, n = 1 per cell: read as a count, not a verdict). LNS's "
           f"deep/shallow removal ratio is below Pre-LN's in **{lower} of {len(matched)}** cells; Pre-LN's own "
           "reading moves with the "
           "rate, so an index read only at each scheme's best rate mixes the rate into the curse.", "",
           "| N | lr | interior blocks | inert abs pre / lns | inert rel pre / lns | deep/shallow pre / lns | "
           "Pre-LN curse | val loss pre / lns |", "|---|---|---|---|---|---|---|---|"]
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    for m in matched:
        pair = lambda k, m=m: f"{f(m[k]['pre'])} / {f(m[k]['lns'])}"  # noqa: E731
        out.append(f"| {m['layers']} | {m['lr']:g} | {m['interior_blocks']} | {pair('inert_fraction')} | "
                   f"{pair('inert_fraction_rel')} | {pair('removal_deep_over_shallow')} | {m['reading']}"
                   f"{' (64-window probe)' if m['old_probe'] else ''} | {m['val_loss']['pre']:.3f} / "
                   f"{m['val_loss']['lns']:.3f} |")
    return out + [""]


def mechanism_lines(res: dict) -> list[str]:
    out = ["## 3. What the blocks do, each depth at its own rate", "",
           "lns − pre seed by seed on the final models (the Jacobian and the n-block angular distance only where the "
           "records hold them: the earlier probe at N = 24 kept neither). The comparison's word is the interval's; "
           "the claims it bears on (2: variance, 3: deep blocks less identity-like, 4: removal cost) are read once, "
           "Holm-adjusted, in the claims table.", "",
           "| N | quantity | pre | lns | lns − pre | paper predicts | claim |", "|---|---|---|---|---|---|---|"]
    for d in res["depths"]:
        for name, m in d.get("mechanisms", {}).items():
            vals = lambda side, m=m: ", ".join(f"{x:.3g}" for x in m[side].values())  # noqa: E731
            out.append(f"| {d['layers']} | {MECHANISMS[name][0]} | {vals('a')} | {vals('b')} | {said(m, '.3g')} | "
                       f"lns {m['predicted']} | {m['paper_claim']} |")
    return out + [""]


def decomposition_lines(res: dict, parts: list[dict]) -> list[str]:
    if not parts:
        return []
    out = ["## 4. LNS taken apart", "",
           "Pre-LN with one part of LNS at a time, at the same rate as Pre-LN and LNS, Δ against Pre-LN paired by "
           "seed; the index and the variance after the last block are the final models' (mean ± std).", "",
           "| N | lr | variant | Δ val loss vs pre | deep/shallow removal | variance after the last block |",
           "|---|---|---|---|---|---|"]
    for g, p in zip(res["parts"], parts, strict=True):
        for v, r in g["variants"].items():
            c = p["against_pre"].get(v, {})
            out.append(f"| {g['layers']} | {g['lr']:g} | {v} | {said(c) if c else '-'} | "
                       f"{spread(r.get('index', {}).get('removal_deep_over_shallow'), '.2f')} | "
                       f"{spread(r.get('quantities', {}).get('last_var'), '.1f')} |")
    out.append("")
    for p in parts:
        if p["gain_init_vs_lns"]:
            eq = p["gain_init_vs_lns"]
            out += [f"N = {p['layers']}, lr {p['lr']:g}: gain-init − LNS {said(eq['comparison'])}; TOST against "
                    f"± {EQUIVALENCE_MARGIN} nats (declared in code before the numbers): p {pvalue(eq['p'])}, "
                    f"*{eq['verdict']}*. Pre-LN's curse index here: {p['pre_reading']}.", ""]
    return out + ["![Each part of LNS against Pre-LN, with 95% t-intervals](img/lns_decomposition.png)", ""]


def science(res: dict, unigram: float | None, matched: list[dict], equal_rate: list[dict], rerun: dict,
            tpp: dict[int, float], val_tokens: int, img: Path) -> list[str]:
    """The first screen, the claims table and sections 1-4 (figures written into img)."""
    table, parts = claims_table(res, unigram), decomposition(res)
    figures.plot_own_best(res, img / "lns_own_best.png")
    figures.plot_decomposition(res, parts, img / "lns_decomposition.png")
    return (first_screen(res, table, matched, parts, equal_rate, rerun, tpp, val_tokens) + claims_lines(table)
            + own_best_lines(res) + matched_lines(matched) + mechanism_lines(res) + decomposition_lines(res, parts))
