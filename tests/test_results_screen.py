"""The results a researcher reads in 30 seconds (issue 63), checked on the committed page (README's results block and
docs/results.md, which `make results` writes from the records) and on the functions that write it:

- the first screen fits MAX_LINES lines of MAX_CHARS characters, with its one figure, and the README repeats it;
- "replicated" only for a split that passes the held-out rule; the rate-transfer study's split named by its make-up;
- every family a plan.json declares is read in that study's section, the own-rate rate exponent by its plan's rule;
- the Muon section's words by its plan's rule alone, a Welch word on few degrees of freedom with its df and the
  pooled and exact readings beside it, N = 6's reading on its own seeds said;
- no "fixes", "proves" or "shows" in the project's own voice;
- why, in one sentence on the first screen: LNS taken apart at N = 48, recomputed from the records.
"""

import json
import re
from pathlib import Path

import pytest
from scipy import stats as st

from depthlab.study import muon as m
from depthlab.study.page import muon, own, rates, screen
from depthlab.study.verdicts import contrast_pooled, permutation_p

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _page() -> str:
    return (ROOT / "docs" / "results.md").read_text()


def _first_screen() -> list[str]:
    """docs/results.md's first screen: the lines after the page's heading and preamble, up to DETAIL_HEAD."""
    lines = _page().splitlines()[4:]
    assert screen.DETAIL_HEAD in lines, "the page has no first screen above its detail"
    return [x for x in lines[:lines.index(screen.DETAIL_HEAD)] if x]


def _above_the_claims() -> str:
    return _page().split("## The paper's claims, one rule")[0]


def _section(heading: str) -> str:
    page = _page()
    assert heading in page, f"no section {heading!r}"
    return page.split(heading, 1)[1].split("\n## ", 1)[0]


def _readme_block() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return [x for x in readme.split(screen.START, 1)[1].split(screen.END, 1)[0].splitlines() if x]


# ------------------------------------------------------------------------------------------------ the first screen
def test_the_first_screen_fits_twelve_lines_of_200_characters_with_its_one_figure_and_the_readme_repeats_it():
    first = _first_screen()
    assert 0 < len(first) <= screen.MAX_LINES == 12
    assert max(map(len, first)) <= screen.MAX_CHARS == 200
    figures = [x for x in first if x.startswith("![")]
    answer = [x for x in figures if f"(img/{screen.FIGURE})" in x]
    assert len(answer) == 1 and "AdamW" in answer[0] and "Muon" in answer[0]
    assert all("(img/panel" in x for x in figures if x not in answer)  # the real-model panel's, once it lands
    assert len(figures) <= 2
    assert (ROOT / "docs" / "img" / screen.FIGURE).exists()
    assert first[0].startswith("**Does LayerNorm Scaling (LNS) lower the loss")
    assert any("perplexity" in x and "nats" in x for x in first)  # the answer in its units
    assert any(x.startswith("- Scale:") and "parameters" in x and "N: " in x and "per parameter" in x for x in first)
    assert any(x.startswith("- What this scale cannot say") for x in first)
    assert any("Real pretrained models" in x for x in first)
    assert _readme_block() == [screen.from_root(x) for x in first]


def test_the_readme_reaches_the_pages_links_from_the_repositorys_root():
    assert screen.from_root("![a](img/x.png) [b](analysis.md#c) [d](https://e) [f](#g)") == \
        "![a](docs/img/x.png) [b](docs/analysis.md#c) [d](https://e) [f](#g)"


def test_the_panels_answer_and_figure_stand_on_the_first_screen_once_its_records_and_section_land(tmp_path):
    docs, results = tmp_path / "docs", tmp_path / "results"
    assert "in progress" in screen.panel_lines(docs, results)[0]
    docs.mkdir()
    (docs / "analysis.md").write_text(f"# A\n\n## Three real models, one rule\n\n{screen.PANEL_MARK}\nIts answer.\n\n"
                                      "## Next\n")
    (results / "real_model_panel").mkdir(parents=True)
    word = {"word": "inconclusive (rests on blocks 5, 6, 7)", "ratio": 0.88, "ci": [0.55, 1.1]}
    (results / "real_model_panel" / "panel.json").write_text(json.dumps({"smollm2": {"words": {"loss": word}}}))
    assert "in progress" in screen.panel_lines(docs, results)[0]  # its figure is not written yet
    (docs / "img").mkdir()
    (docs / "img" / "panel_removal.png").write_bytes(b"png")
    line, fig = screen.panel_lines(docs, results)
    assert line == ("- **Real pretrained models:** smollm2 by loss: inconclusive (rests on blocks 5, 6, 7), R 0.88 "
                    "[0.55, 1.10]; 2 of 3 models to run ([deep blocks wasted?](analysis.md#three-real-models-one-"
                    "rule)).")
    assert fig.endswith("(img/panel_removal.png)")
    many = {m: {"words": {o: word for o in ("loss", "choice", "generation")}} for m in ("a", "b", "c")}
    (results / "real_model_panel" / "panel.json").write_text(json.dumps(many))
    line = screen.panel_lines(docs, results)[0]
    assert len(line) <= screen.MAX_CHARS and "** a, b, c by loss: inconclusive; a, b, c by choice: inconclusive" in line


# --------------------------------------------------------------------------------- audit 1: "replicated", the split
def test_replicated_only_for_a_split_that_passes_the_held_out_rule_and_the_transfer_split_is_named():
    settings = json.loads((RESULTS / "depth_transfer" / "settings.json").read_text())
    split = screen.transfer_split(RESULTS, settings)
    test = split["test"]
    assert not split["passes"] and test["effective"] < 30 and test["max_share"] > 0.10  # rebuilt, sha256 checked
    text = _above_the_claims() + "\n".join(_readme_block())
    assert "eplicated" not in text
    (line,) = [x for x in text.splitlines() if x.startswith("- **On another test split")]
    name, share = test["top"][0]
    assert f"Kish effective {test['effective']:g}, {name} {share:.0%}" in line
    assert f"{test['documents']} documents" in line and f"gap {split['gap']:.2f} nats" in line
    assert "the rate-transfer study's val split 13 documents, Kish effective 4.6" in text  # its composition printed
    assert "rate-transfer study's held-out splits' composition" not in text  # no longer "not recorded"
    passing = {**split, "passes": True}
    tres = {"noise": {"cells": 18}}
    dec = {"layers": 48, "variants": {"lns": {"vs_pre": {"n": 3, "mean": -0.05, "ci": [-0.06, -0.04], "p": 1e-4,
                                                         "p_holm": 1e-3, "verdict": "lower", "word": "lower"}}}}
    assert screen.transfer_pair_line(dec, tres, passing).startswith("- **Replicated on another test split**")
    assert "not a replication" in screen.transfer_pair_line(dec, tres, split)


# ------------------------------------------------------------------------------ audit 2: every declared endpoint
SECTIONS = {"own_rate": own.HEAD, "muon": muon.HEAD}  # each study's section of docs/results.md
ELSEWHERE = {"real_model_panel": ("analysis.md", screen.PANEL_MARK)}  # a study another page reads (its own words)


@pytest.mark.parametrize("plan", sorted(RESULTS.glob("*/plan.json")), ids=lambda p: p.parent.name)
def test_every_family_a_plan_declares_is_read_in_its_studys_section(plan):
    declared = json.loads(plan.read_text())
    if not (plan.parent / "runs.jsonl").exists() and not (plan.parent / "panel.json").exists():
        pytest.skip(f"{plan.parent.name}: no records yet, nothing to report")
    if declared["study"] in ELSEWHERE:
        page, mark = ELSEWHERE[declared["study"]]
        assert mark in (ROOT / "docs" / page).read_text(), f"{plan}: no page reads this study"
        return
    assert declared["study"] in SECTIONS, f"{plan}: no page section reads this study"
    section = _section(SECTIONS[declared["study"]])
    unread = [f for f in declared["families"] if f"`{f}`" not in section]
    assert not unread, f"{plan.parent.name}: families no page reads: {unread}"


def test_the_own_rate_rate_exponent_reads_by_its_plan_and_no_longer_holds_by_the_unplanned_study():
    records, _, d = own.study(RESULTS / "own_rate")
    ex = rates.exponents(records, d, RESULTS / "own_rate")
    pre, lns = (ex["rows"][v]["reading"] for v in ("pre", "lns"))
    assert ex["margin"]["declared"] and ex["margin"]["value"] == 0.25
    assert pre["holm_word"] == "falls with depth" and pre["ci"][1] < 0 and pre["moved_by"] == ["argmin"]
    assert lns["holm_word"] == "inconclusive" and not lns["inside"]
    (line,) = [x for x in _above_the_claims().splitlines() if "the own-rate study's `rate_exponent` family" in x]
    slope = ex["rows"]["pre"]["slope"]
    assert f"pre N^{slope:+.2f}, n = 3 depths, 95% [{pre['ci'][0]:+.2f}, {pre['ci'][1]:+.2f}]" in line
    assert "*falls with depth*" in line and "argmin reads inconclusive" in line
    assert 'lns N^' in line and '*inconclusive*, not "holds its rate"' in line
    assert not re.search(r"\*holds its rate\*(?! where)", _page())  # the word nowhere; its rule is printed


# ------------------------------------------------------------------------------------- audit 3: the Muon section
def test_the_muon_rate_exponent_is_the_plans_word_with_the_undeclared_check_beside_it():
    section = _section(muon.HEAD)
    records, _, d = own.study(RESULTS / "muon", m)
    pre = rates.exponents(records, d, RESULTS / "muon")["rows"]["pre"]["reading"]
    assert pre["bootstrap_word"] == "falls with depth" and pre["p_move_holm"] < 0.05 and pre["word"] == "inconclusive"
    (row,) = [x for x in section.splitlines() if x.startswith("| pre | ") and "N^" in x]
    assert "*falls with depth* (checks the plan does not declare, printed beside the word: argmin reads " \
           "inconclusive)" in row


def test_a_welch_word_on_few_degrees_of_freedom_shows_its_df_and_the_pooled_and_exact_readings():
    muon_cs = own.comparisons(*own.study(RESULTS / "muon", m)[::2])
    adamw_cs = own.comparisons(*own.study(RESULTS / "own_rate")[::2])
    a, b = muon_cs[24]["per_seed"], adamw_cs[24]["per_seed"]
    welch = st.ttest_ind(a, b, equal_var=False)
    assert welch.df < 5
    vs = muon.against_adamw(muon_cs, adamw_cs, [12, 24])
    assert vs[24]["word"] == "lower"  # the plan's test decides; the checks beside it do not
    pooled = vs[24]["pooled"]
    assert pooled == {**contrast_pooled(a, b, muon_cs[24]["noise"], adamw_cs[24]["noise"]), "p_holm": pooled["p_holm"]}
    assert vs[24]["permutation_p"] == pytest.approx(2 / 35)  # 3 and 4 seeds: the most extreme of 35 splits
    (row,) = [x for x in _section(muon.HEAD).splitlines() if x.startswith("| 24 | ") and "Welch" in x]
    assert f"*lower* (Welch df {welch.df:.1f}; under each study's pooled seed noise p " in row
    assert f"Holm {pooled['p_holm']:.2g}; exact permutation p {2 / 35:.2g}" in row


def test_muons_n6_word_says_its_own_seeds_do_not_carry_it():
    c = own.comparisons(*own.study(RESULTS / "muon", m)[::2])[6]
    own_seeds = st.ttest_1samp(c["per_seed"], 0.0)
    assert c["word"] == "lower" and own_seeds.pvalue > 0.05
    ci = own_seeds.confidence_interval(0.95)
    (line,) = [x for x in _first_screen() if x.startswith("- Muon")]
    assert re.search(r"at N = 6 \([^)]*inconclusive on its own seeds\)", line)
    assert f"(inconclusive on its own 3 seeds, [{ci.low:+.3f}, {ci.high:+.3f}])" in _above_the_claims()


def test_the_pooled_contrast_and_the_permutation_test_are_scipys():
    a, b = [-0.05, -0.06, -0.055], [-0.03, -0.031, -0.029, -0.032]
    p = contrast_pooled(a, b, {"sd": 0.01, "df": 6}, {"sd": 0.005, "df": 9})
    va, vb = 0.01 ** 2 / 3, 0.005 ** 2 / 4
    df = (va + vb) ** 2 / (va ** 2 / 6 + vb ** 2 / 9)
    assert p["df"] == pytest.approx(df) and p["p"] == pytest.approx(2 * st.t.sf(abs(p["mean"]) / (va + vb) ** 0.5,
                                                                                 df))
    assert permutation_p(a, b) == pytest.approx(2 / 35)


# --------------------------------------------------------------------------------- audit 4: the project's own voice
STRONG = re.compile(r"\b(fixes|proves|shows)\b", re.I)


def _own_voice(text: str) -> str:
    """The text in the project's own voice: quoted spans and the claims table's column of the paper's claims
    dropped."""
    text = re.sub(r"\"[^\"\n]*\"|“[^”\n]*”", "", text)
    return "\n".join("|".join(x.split("|")[:2] + x.split("|")[3:]) if x.startswith("| ") else x
                     for x in text.splitlines())


@pytest.mark.parametrize("doc", ["README.md", "docs/results.md"])
def test_no_fixes_proves_or_shows_in_the_projects_voice(doc):
    found = [m.group(0) + ": " + line[max(0, m.start() - 60):m.end() + 40]
             for line in _own_voice((ROOT / doc).read_text()).splitlines() for m in STRONG.finditer(line)]
    assert not found, found


def test_the_voice_check_flags_what_it_should():
    assert STRONG.search(_own_voice("LNS fixes it at zero cost."))
    assert not STRONG.search(_own_voice('The paper says LNS "fixes the curse"; it is not shown here.'))
    assert not STRONG.search(_own_voice("| 1 | LNS shows a lower loss | N = 6 | -0.02 |"))  # the paper's claim


# ------------------------------------------------------------------------------------------ audit 5: why, up front
def test_why_is_one_sentence_on_the_first_screen_recomputed_from_the_records():
    records, _, d = own.study(RESULTS / "own_rate")
    p, pair = own.parts(records, d, RESULTS / "own_rate"), own.comparisons(records, d)[48]
    gi, un = p["tests"]["gain-init − Pre-LN"], p["tests"]["uniform gain − Pre-LN"]
    assert p["tests"]["uniform gain − gain-init"]["word"] == "inconclusive" and p["tost"]["comparison"]["word"] == \
        "higher"
    (why,) = [x for x in _first_screen() if x.startswith("- Why:")]
    assert (f"recovers {-un['mean']:.3f} (uniform) to {-gi['mean']:.3f} (1/√l) of LNS's {-pair['mean']:.3f} nats"
            in why)
    assert "depth profile is not shown to matter" in why
    assert f"stays {p['tost']['comparison']['mean']:.3f} behind LNS" in why
