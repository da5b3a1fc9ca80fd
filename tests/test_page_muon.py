"""The Muon section of the results page (issue 53), from real record files: no word below 3 paired seeds, the plan's
words on a complete synthetic study (LNS lower at one depth, inconclusive at the others; a best rate that falls with
depth and one that holds; N = 6's rate costing at one depth, not at another), the against-AdamW Welch test read only
with 3 seeds on both sides, and "holds its rate" only by a margin the plan declared before the records."""

import json
import re
import subprocess

import pytest

from depthlab.study import muon, own_rate as o, transfer as t
from depthlab.study.page import muon as page, own, rates
from depthlab.study.records import append_record, load_records
from depthlab.study.verdicts import compare
from tests.test_page import _commit

# each scheme's best lattice position by depth: the vertex of its validation loss's parabola in log(rate)
TARGET = {(o.PRE, 6): 6.9, (o.PRE, 12): 6.45, (o.PRE, 24): 4.9, (o.LNS, 6): 7.1, (o.LNS, 12): 7.1, (o.LNS, 24): 7.1}
SHIFT = {6: 0.0, 12: -0.05, 24: 0.0}  # LNS − Pre-LN test loss under Muon
VAL_NOISE, TEST_NOISE = {0: 0.0, 1: 0.002, 2: -0.002}, {0: 0.0, 1: 0.004, 2: -0.003}
ADAMW = {12: -0.05, 24: -0.034}  # LNS − Pre-LN test loss under AdamW (the own-rate study)


def _muon_record(c) -> dict:
    k = t.lattice(c.lr)
    bowl = 0.01 * (k - TARGET[(c.variant, c.layers)]) ** 2
    jitter = 0.001 * ((7 * c.seed + 3 * k) % 5 - 2)  # each run's own scatter on test
    test = 3.65 + bowl + jitter + (SHIFT[c.layers] + TEST_NOISE[c.seed] if c.variant == o.LNS else 0.0)
    return {"study": "muon", "variant": c.variant, "lr": c.lr, "seed": c.seed, "layers": c.layers, "status": "ok",
            "val_loss": 3.7 + bowl + VAL_NOISE[c.seed], "test_loss": test}


def _settings(out, d, command) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "settings.json").write_text(json.dumps({"command": command, "meta": {
        "design": d.describe(), "corpus": {"sha256": "c6ea0715" * 8, "val_tokens": 5000, "test_tokens": 6000}}}))


def _muon_study(out, wanted=lambda c: True) -> dict:
    """The Muon study run in the plan's order as far as `wanted` lets it, records in OUT/runs.jsonl."""
    d = muon.Design()
    _settings(out, d, "python -m benchmarks.muon_study run --jobs 2")
    records: dict = {}
    while cells := [c for c in o.next_cells(records, d) if wanted(c)]:
        for c in cells:
            records[c.key] = _muon_record(c)
            append_record(out / "runs.jsonl", records[c.key])
    return records


def _adamw_study(out, seeds=(0, 1, 2)) -> None:
    """The own-rate study at N = 12 and 24, each grid best at its centre, LNS lower by ADAMW."""
    d = o.Design(depths=(12, 24), seeds=seeds, deep=None)
    _settings(out, d, "python -m benchmarks.own_rate run --jobs 2")
    records: dict = {}
    while cells := o.next_cells(records, d):
        for c in cells:
            val = 3.7 + 0.01 * abs(t.lattice(c.lr) - o.CENTRES[(c.variant, c.layers)])
            lns = ADAMW[c.layers] + 0.001 * (-1) ** c.seed * c.seed if c.variant == o.LNS else 0.0
            records[c.key] = {"study": "own_rate", "variant": c.variant, "lr": c.lr, "seed": c.seed,
                              "layers": c.layers, "status": "ok", "val_loss": val, "test_loss": val - 0.05 + lns}
            append_record(out / "runs.jsonl", records[c.key])


def _section(lines: list[str]) -> dict[str, list[str]]:
    """The section's table rows by the bold lead of the paragraph above them ("grids" for the first table)."""
    out, name = {}, "grids"
    for x in lines:
        if x.startswith("**"):
            name = x[2:x.index("**", 2)]
        elif x.startswith("| ") and not x.startswith("| N |") and not x.startswith("| scheme |"):
            out.setdefault(name, []).append(x)
    return out


def test_the_section_on_a_partial_study_gives_no_word_below_three_seeds_and_names_what_is_missing(tmp_path):
    """Grids at N = 6 and 12 with seed 1 at their best rates and at N = 6's rate deeper; N = 24 not started. Every
    reading is a number with no word: 2 paired seeds, a grid missing for the exponent."""
    out, adamw = tmp_path / "muon", tmp_path / "own_rate"
    records = _muon_study(out, lambda c: c.layers != 24 and c.seed < 2)
    _adamw_study(adamw)
    lines = page.page_lines(out, adamw)
    text = "\n".join(lines)
    rows = _section(lines)
    assert lines[0] == page.HEAD and f"Cells done: {len(records)};" in text
    pair = rows["LNS − Pre-LN under Muon, beside AdamW."]
    assert [r.split(" | ")[2] for r in pair] == ["0, 1", "0, 1", "-"]
    assert all(f"*{own.FEW}*" in r.split(" | ")[3] for r in pair[:2]) and "not run yet" in pair[2]
    assert "no own-rate cell at this depth" in pair[0]
    assert "no verdict: 2 paired seeds under Muon, 3 under AdamW (3 each needed)" in pair[1]
    assert "no verdict: 0 paired seeds under Muon, 3 under AdamW" in pair[2]
    for row in rows["Does Muon's best rate move with depth?"]:
        assert row.endswith("| not run yet | no verdict: the grid at N = 24 has not finished |")
    costs = rows["What N = 6's rate costs deeper."]
    assert costs[0].startswith("| 12 | pre | 0.01131 | 0.008 | ") and f"(n = 2: *{own.FEW}*)" in costs[0]
    assert costs[1].endswith("not run yet: the N = 24 grid has not finished | 0, 1, 2 |")
    muon_words = "\n".join([*(r.rsplit(" | ", 2)[0] + r.rsplit(" | ", 1)[1] for r in pair), *rows["Does Muon's "
                            "best rate move with depth?"], *costs])  # the AdamW column has its own study's words
    for word in ("lower", "higher", "inconclusive", "costs", "no cost shown", "holds its rate", "falls with depth"):
        assert f"*{word}*" not in muon_words
    assert "| 24 | pre | 0 of 3 rates run; best not known yet | - | - | 0.004 (seed 0)" in text
    assert "| 6 | lns | 4 of 4 rates run, widened 1 step past its upper edge; best 0.01131 | 0, 1 |" in text


def test_a_complete_study_reads_the_plans_words_in_each_family(tmp_path):
    """The plan committed before the records. LNS lower at N = 12 only; Pre-LN's best rate falls with depth (its
    vertex one lattice step lower per doubling: slope -0.5), LNS's holds (the same vertex at every depth); N = 6's
    rate costs Pre-LN at 24 (two lattice steps off) and not at 12 (half a step); under AdamW LNS is lower by 0.05 at
    12 (as under Muon) and by 0.034 at 24 (where under Muon it is not): Muon − AdamW higher at 24 only."""
    out, adamw = tmp_path / "muon", tmp_path / "own_rate"
    out.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=out, check=True)
    _commit(out, "plan.json", json.dumps(muon.plan(muon.Design())), 1_700_000_000)
    records = _muon_study(out)
    _commit(out, "runs.jsonl", (out / "runs.jsonl").read_text(), 1_700_000_100)
    _adamw_study(adamw)
    d = muon.Design()
    cs = own.comparisons(records, d)
    assert {L: (c["n"], c["word"]) for L, c in cs.items()} == {6: (3, "inconclusive"), 12: (3, "lower"),
                                                                24: (3, "inconclusive")}
    assert cs[12]["rates"] == [t.rate(6), t.rate(7)] and cs[12]["noise"]["df"] == 6  # pooled over the 3 depths
    ex = page.exponents(records, d, out)
    assert ex["margin"]["declared"] and ex["margin"]["value"] == 0.25
    pre, lns = (ex["rows"][v]["reading"] for v in (o.PRE, o.LNS))
    assert pre["holm_word"] == "falls with depth" and pre["ci"][1] < 0 < pre["p_hold"]
    assert lns["holm_word"] == "holds its rate" and lns["ci"][0] <= 0 <= lns["ci"][1]
    assert [ex["rows"][o.PRE]["rates"][L]["best"] for L in (6, 12, 24)] == [t.rate(7), t.rate(6), t.rate(5)]
    costs = page.transfer_costs(records, d)
    assert costs[(o.PRE, 24)]["word"] == "costs" and costs[(o.PRE, 24)]["p_holm"] == pytest.approx(
        4 * costs[(o.PRE, 24)]["p"])  # Holm over the declared 4, the two same-rate members at p = 1
    assert costs[(o.PRE, 12)]["word"] == "no cost shown" and costs[(o.PRE, 12)]["n"] == 3
    assert all(costs[(o.LNS, L)]["word"].startswith("no cost: N = 6's rate is its own best") for L in (12, 24))
    vs = page.against_adamw(cs, own.comparisons(load_records(adamw / "runs.jsonl"), o.Design(
        depths=(12, 24), seeds=(0, 1, 2), deep=None)), [12, 24])
    assert (vs[12]["word"], vs[24]["word"]) == ("inconclusive", "higher") and vs[24]["sizes"] == [3, 3]
    text = "\n".join(page.page_lines(out, adamw))
    assert "plan.json beside the records (declared before the data" in text
    assert "*holds its rate*" in text and "*falls with depth*" in text and "*costs*" in text
    assert f"Cells done: {len(records)}; known and missing: 0; at least 0 more" in text


def test_the_against_adamw_difference_is_read_only_with_three_seeds_on_both_sides():
    three, two, four = compare([-0.05, -0.048, -0.052]), compare([-0.01, -0.012]), compare([-0.01, -0.012, -0.011,
                                                                                            -0.009])
    vs = page.against_adamw({12: three, 24: three}, {12: two, 24: four}, [12, 24])
    assert vs[12]["word"] == own.FEW and "p_holm" not in vs[12]  # Welch has an interval at 2 seeds; no word
    assert vs[12]["mean"] == pytest.approx(-0.039) and vs[12]["ci"][1] < 0
    assert vs[24]["word"] == "lower" and vs[24]["p_holm"] == pytest.approx(2 * vs[24]["p"])  # family of 2
    assert page.against_adamw({12: two}, {12: three}, [12])[12]["word"] == own.FEW
    assert page.against_adamw({}, {12: three}, [12])[12]["word"] == "no runs"
    from scipy import stats as st
    assert vs[24]["p"] == pytest.approx(st.ttest_ind(three["per_seed"], four["per_seed"], equal_var=False).pvalue)


@pytest.mark.parametrize("order", ["plan first", "records first", "margin narrowed first"])
def test_holds_its_rate_needs_the_margin_the_plan_declared_before_the_records(tmp_path, order):
    """LNS's best rate is the same at every depth: "holds its rate" under the plan's ±0.25 committed before the
    records; no word where the plan was committed after them, nor under a plan (committed first) whose margin is
    too narrow for the bootstrap's interval."""
    out = tmp_path / "muon"
    out.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=out, check=True)
    plan = muon.plan(muon.Design())
    if order == "margin narrowed first":
        plan["margins"]["holds_its_rate_slope"] = {"6-24": 0.001}
    first = 1_700_000_000 + (200 if order == "records first" else 0)
    _commit(out, "plan.json", json.dumps(plan), first)
    records = _muon_study(out)
    _commit(out, "runs.jsonl", (out / "runs.jsonl").read_text(), 1_700_000_100)
    ex = page.exponents(records, muon.Design(), out)
    lns = ex["rows"][o.LNS]["reading"]
    assert ex["margin"]["value"] == (0.001 if order == "margin narrowed first" else 0.25)
    assert lns["holm_word"] == ("holds its rate" if order == "plan first" else "inconclusive")
    assert ex["rows"][o.PRE]["reading"]["holm_word"] == "falls with depth"  # a direction needs no margin
    text = "\n".join(page.page_lines(out, tmp_path / "no_adamw"))
    assert ("set after the data" in text) == (order == "records first")


def test_the_rate_exponents_words_are_held_to_holm_over_the_two_schemes():
    """A bootstrap p of 0.03 falls alone, not beside the other scheme (Holm over 2: 0.06), nor while the other is
    not yet read (it counts at p = 1)."""
    def reading(p_move, p_hold=1.0, word="falls with depth"):
        return {"word": word, "p_move": p_move, "p_hold": p_hold}

    alone = [reading(0.03)]
    rates.exponent_family(alone, 1)
    assert alone[0]["holm_word"] == "falls with depth"
    for family, size in (([reading(0.03), reading(0.5, word="inconclusive")], 2), ([reading(0.03)], 2)):
        rates.exponent_family(family, size)
        assert family[0]["p_move_holm"] == pytest.approx(0.06) and family[0]["holm_word"] == "inconclusive"
    held = [reading(0.9, 0.02, "holds its rate"), reading(0.001)]
    rates.exponent_family(held, 2)
    assert [r["holm_word"] for r in held] == ["holds its rate", "falls with depth"]  # 0.04 and 0.002 after Holm
    held = [reading(0.9, 0.03, "holds its rate")]
    rates.exponent_family(held, 2)
    assert held[0]["holm_word"] == "inconclusive"


def test_the_results_line_says_the_sections_words_and_none_below_three_seeds(tmp_path):
    partial = _muon_study(tmp_path / "partial", lambda c: c.layers != 24 and c.seed < 2)
    line = page.screen_line(tmp_path / "partial")
    assert f"{len(partial)} cells done" in line and "*" not in line.replace("**Under Muon**", "")
    assert "N = 6 +0.002 (n = 2: no verdict); N = 12 -0.049 (n = 2: no verdict); N = 24 not run yet" in line
    assert line.endswith("Best rate against depth (`rate_exponent`): pre no verdict; lns no verdict.")
    _muon_study(tmp_path / "complete")
    line = page.screen_line(tmp_path / "complete")  # no git here: "holds its rate" is not verifiable, no word
    assert "N = 12 -0.052 [-0.060, -0.044] (Holm <0.001), n = 3: *lower*" in line
    assert re.search(r"pre N\^-0\.\d\d \[-[\d.]+, -[\d.]+\], p [^;]*: \*falls with depth\*; lns N\^", line)
    assert line.endswith(": *inconclusive*.")
    assert page.screen_line(tmp_path / "none") is None
