"""docs/results.md's opening and the LNS study's sections 1-4: the first screen, the claims table, each depth at its
own rate, the index at matched rates, the mechanisms and LNS taken apart. Every word comes from depthlab.study.claims
and verdicts."""

from __future__ import annotations

from pathlib import Path

from depthlab.stats import interval, proportion_ci, pvalue, spread
from depthlab.study import figures
from depthlab.study.claims import CLAIM_TEXT, against_paper, claims_table, decomposition
from depthlab.study.page import screen
from depthlab.study.page.text import composition_said, grid, mechanism_table, said
from depthlab.study.verdicts import (
    CURSE_RATIO,
    EQUIVALENCE_MARGIN,
    MIN_CONTRADICT,
    MIN_DEEP,
    MIN_INTERIOR,
    PRESENT,
    UNIGRAM_MARGIN,
    ci_cell,
    curse_said,
    curse_word,
)


def _Ns(xs) -> str:
    return ", ".join(str(x) for x in xs) or "none"


def tost_said(eq: dict) -> str:
    """An equivalence test (its margin said beside it) as the page prints it: mean, its 90% interval (inside the
    margin exactly when TOST's p < 0.05), p and n, then the word."""
    return f"{eq['mean']:+.3f}, 90% CI {interval(eq)}, p {pvalue(eq['p'])}, n = {eq['n']}: *{eq['verdict']}*"


def share_said(k: int, n: int, what: str) -> str:
    """A count k of n `what` with the exact 95% interval of its share."""
    lo, hi = proportion_ci(k, n)
    return f"{k} of {n} {what} (exact 95% interval of the share [{lo:.2f}, {hi:.2f}])"


CLAIMS_HEAD = "## The paper's claims, one rule"


def claims_lines(table: dict) -> list[str]:
    """The claims table: the paper's claim, where, our measurement, n, interval, p (and Holm's), the word."""
    out = [CLAIMS_HEAD, "",
           "| # | the paper's claim | where | our measurement | n | 95% interval | p (Holm) | word |",
           "|---|---|---|---|---|---|---|---|"]
    for r in table["family"]:
        c = r["comparison"]
        cond = "" if r["condition"] == "present" else f" (Pre-LN's curse index {r['condition']})"
        if against_paper(r):
            cond += f"; measured *{against_paper(r)}*, against the paper"
        out.append(f"| {r['claim'][0]} | {CLAIM_TEXT[r['claim']]} | {r['where']} | {r['measure']}: "
                   f"{spread(c, '.3g', signed=True)} | {c['n']} | {interval(c, '.3g')} | {pvalue(c['p'])} "
                   f"({pvalue(r['p_holm'])}) | **{r['word']}**{cond} |")
    for r in table["stability"]:
        runs = ", ".join(f"{lr:g} ({r['losses'][lr]:.2f} vs Pre-LN {r['pre_losses'][lr]:.2f})" for lr in r["diverged"])
        out.append(f"| 5 | {CLAIM_TEXT['5'].format(v=r['scheme'])} | {r['where']} | share of rates ending within "
                   f"{UNIGRAM_MARGIN} nats of the unigram loss {r['unigram']:.2f}: {len(r['diverged'])} of {r['n']}"
                   f"{': ' + runs if runs else ''} | {r['n']} | [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] (exact) | - | "
                   f"**{r['word']}** |")
    out += ["", f"*The rule* (depthlab/study/verdicts.py): every difference is paired by seed. *One noise model:* "
            "its 95% t-interval and p (scipy.stats) use the seed noise pooled over the comparable cells of its "
            "measure (every validation-loss difference of the study, with the rerun spread added; each mechanism "
            "quantity over depths; Pre-LN's deep/shallow removal ratio over its cells), not df = n − 1 per cell, "
            "which rewards two seeds that happen to agree; sections print the per-cell reading beside it where the "
            "two differ. *The family* of this table is its testable t-test rows, Holm-adjusted (statsmodels). A "
            "comparison reads *lower*/*higher* only when the interval "
            "excludes 0, *inconclusive* when it holds 0, and one seed gives no verdict. A claim is *supported* when "
            "the interval excludes 0 on the predicted side and its Holm-adjusted p (over the table's testable t-test "
            f"rows) is below 0.05; *contradicted* needs the other side with ≥ {MIN_CONTRADICT} seeds; *not "
            "reproduced* otherwise; *not testable* where the claim needs Pre-LN's curse and its index does not read "
            f"present. The index reads *present* when the 95% t-interval across seeds of the deep/shallow removal "
            f"ratio lies wholly below {CURSE_RATIO}, or that of the deep half's inert fraction (the share of the "
            "upper half of the interior's blocks whose removal changes the loss by less than 0.005 nats; inert "
            "shallow blocks do not count; a count, so its interval is widened to the exact interval of the count "
            "pooled over seeds, lest seeds that agree exactly make a point) wholly at or above "
            f"{PRESENT:.2f}; *absent* when both lie wholly on the "
            "other side; *inconclusive* otherwise, and an inconclusive index leaves the claim *not testable* like an "
            "absent one (its precondition is not shown). One seed gives the run's reading and no interval; an "
            f"interior of fewer than {MIN_INTERIOR} blocks is unreadable, and a deep half of fewer than {MIN_DEEP} "
            "leaves the inert criterion unread. Claim 5 is the paper's divergence (Table 1's ~1,400 PPL): a run "
            "ending at the unigram loss while Pre-LN trains at that rate; its interval is the exact binomial interval "
            "of that share, and Pre-LN diverged at none of those rates. Where a row is not testable or not "
            "reproduced but its interval lies on the side the paper does not predict, the row says so.", ""]
    return out


def own_best_lines(res: dict) -> list[str]:
    out = ["## 1. Each depth at its own rate", "",
           "Each scheme's seed-0 grid at that depth (best rate in bold), then both at their own best rate over every "
           "seed. Δ = lns − pre paired by seed: on the validation slice that selected the rates, and on the test "
           "split (where a record has none: the whole validation split, the probe's loss). The curse index is Pre-LN's "
           "final models': the deep half's inert fraction (absolute threshold 0.005 nats) and the deep/shallow "
           "removal ratio, each with its 95% t-interval across seeds; the reading comes from those two intervals (the "
           "rule under the claims table). The whole interior's inert fraction, absolute and relative (5% of block "
           "2's cost), mean ± std, describes the models and decides nothing. Held-out text: "
           + composition_said(res.get("corpus") or {}, "the LNS study's") + ".", "",
           "| N | pre grid | lns grid | Δ val loss | Δ test loss | Pre-LN inert, deep half | Pre-LN inert, whole "
           "interior (abs / rel) | Pre-LN deep/shallow | interior blocks | Pre-LN curse |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for d in res["depths"]:
        idx = d["pre"].get("index", {})
        cur, size = idx.get("curse") or {}, idx.get("interior_blocks")
        flag = f"{size}" + (" (too few to read)" if size is not None and size < MIN_INTERIOR else "")
        old = " (earlier 64-window probe)" if d["pre"].get("old_probe") else ""
        out.append(f"| {d['layers']} | {grid(d['grids']['pre'])} | {grid(d['grids']['lns'])} | "
                   f"{said(d['delta_val_loss'])} | {said(d.get('delta_test_loss') or d.get('delta_probe_loss', {}))}"
                   f"{'' if d.get('delta_test_loss') else ' (whole split)'} | "
                   f"{ci_cell(cur.get('inert'))} | {spread(idx.get('inert_fraction'), '.2f')} / "
                   f"{spread(idx.get('inert_fraction_rel'), '.2f')} | "
                   f"{ci_cell(cur.get('ratio'))} | {flag} | {curse_word(idx.get('curse'))}{old} |")
    return out + ["", "![Δ at each scheme's own best rate, by depth, with 95% t-intervals](img/lns_own_best.png)", ""]


def matched_lines(matched: list[dict]) -> list[str]:
    lower = sum(bool(m["b_ratio_lower"]) for m in matched)
    out = ["## 2. The curse index at matched rates", "",
           "Both schemes at the same rate (seed 0, n = 1 per cell: read as a count, not a verdict; Pre-LN's curse is "
           "each run's own reading, with no interval; its inert criterion is the deep half's, the whole interior's "
           "fractions are descriptive). LNS's "
           f"deep/shallow removal ratio is below Pre-LN's in **{share_said(lower, len(matched), 'cells')}**; "
           "Pre-LN's own reading moves with the rate, so an index read only at each scheme's best rate mixes the rate "
           "into the curse.", "",
           "| N | lr | interior blocks | inert deep half pre / lns | inert whole interior, abs pre / lns | "
           "inert whole interior, rel pre / lns | deep/shallow pre / lns | Pre-LN curse | val loss pre / lns |",
           "|---|---|---|---|---|---|---|---|---|"]
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    for m in matched:
        pair = lambda k, m=m: f"{f(m[k]['pre'])} / {f(m[k]['lns'])}"  # noqa: E731
        out.append(f"| {m['layers']} | {m['lr']:g} | {m['interior_blocks']} | {pair('inert_fraction_deep')} | "
                   f"{pair('inert_fraction')} | "
                   f"{pair('inert_fraction_rel')} | {pair('removal_deep_over_shallow')} | {curse_word(m['curse'])}"
                   f"{' (64-window probe)' if m['old_probe'] else ''} | {m['val_loss']['pre']:.3f} / "
                   f"{m['val_loss']['lns']:.3f} |")
    return out + [""]


def mechanism_lines(res: dict) -> list[str]:
    return ["## 3. What the blocks do, each depth at its own rate", "",
            "lns − pre seed by seed on the final models (the Jacobian and the n-block angular distance only where the "
            "records hold them: the earlier probe at N = 24 kept neither). The comparison's word is the interval's; "
            "the claims it bears on (2: variance, 3: deep blocks less identity-like, 4: removal cost) are read once, "
            "Holm-adjusted, in the claims table.", ""] + mechanism_table(res, claims=True) + [""]


def decomposition_lines(res: dict, parts: list[dict]) -> list[str]:
    if not parts:
        return []
    out = ["## 4. LNS taken apart", "",
           "Pre-LN with one part of LNS at a time, at the same rate as Pre-LN and LNS, Δ against Pre-LN paired by "
           "seed; the variance after the last block is the final models' (mean ± std), the deep/shallow removal "
           "ratio their mean with its 95% t-interval and the curse index's reading.", "",
           "| N | lr | variant | Δ val loss vs pre | deep/shallow removal | curse index | variance after the last "
           "block |",
           "|---|---|---|---|---|---|---|"]
    for g, p in zip(res["parts"], parts, strict=True):
        for v, r in g["variants"].items():
            c = p["against_pre"].get(v, {})
            out.append(f"| {g['layers']} | {g['lr']:g} | {v} | {said(c) if c else '-'} | "
                       f"{ci_cell(r.get('index', {}).get('curse', {}).get('ratio'))} | "
                       f"{curse_word(r.get('index', {}).get('curse'))} | "
                       f"{spread(r.get('quantities', {}).get('last_var'), '.1f')} |")
    out.append("")
    for p in parts:
        if p["gain_init_vs_lns"]:
            eq = p["gain_init_vs_lns"]
            out += [f"N = {p['layers']}, lr {p['lr']:g}: gain-init − LNS {said(eq['comparison'])}; equivalence "
                    f"within ± {EQUIVALENCE_MARGIN} nats (TOST; the margin declared in code before the numbers): "
                    f"{tost_said(eq)}. Pre-LN's curse index here: {curse_said(p.get('pre_curse'))}.", ""]
    return out + ["![Each part of LNS against Pre-LN, with 95% t-intervals](img/lns_decomposition.png)", ""]


def science(res: dict, unigram: float | None, matched: list[dict], equal_rate: list[dict], rerun: dict,
            tpp: dict[int, float], val_tokens: int, img: Path, transfer: tuple | None = None,
            results: Path | None = None) -> list[str]:
    """The first screen (from this study, the depth-transfer study's summary, `transfer`: (result, settings), and the
    own-rate and Muon studies' records under `results`),
    the claims table and sections 1-4 (figures written into img)."""
    table, parts = claims_table(res, unigram), decomposition(res)
    img.mkdir(parents=True, exist_ok=True)
    figures.plot_own_best(res, img / "lns_own_best.png")
    figures.plot_decomposition(res, parts, img / "lns_decomposition.png")
    tres, tsettings = transfer or (None, None)
    return (screen.first_screen(res, table, tres, tsettings, equal_rate, rerun, tpp, val_tokens, results, img,
                                img.parent)
            + claims_lines(table) + own_best_lines(res) + matched_lines(matched) + mechanism_lines(res)
            + decomposition_lines(res, parts))
