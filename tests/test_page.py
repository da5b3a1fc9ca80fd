"""The results page's words survive a second look (issue 50): one noise model (seed noise pooled over comparable cells,
per-cell reading beside), Holm within each section's family, margins that give a word only when a committed plan
declared them before the records (checked with git), the rate exponent's word from a bootstrap over grid noise, gated
rows that still say when a measurement goes against the paper, and a README whose results bullets are the page's
first screen word for word."""

import math
import subprocess
from pathlib import Path

import pytest
from scipy import stats as st

from depthlab import stats
from depthlab.study import declared, transfer as t, verdicts

NOISY = [[-0.01, -0.05], [-0.02, -0.07, -0.03], [0.01, -0.04], [-0.06, -0.01]]  # seeds disagree by ~0.04 nats


def test_two_seeds_that_agree_closely_give_no_word_under_the_pooled_noise():
    close = verdicts.compare([-0.0400, -0.0402])  # df = 1: a tiny spread makes a tight interval
    assert close["verdict"] == "lower"
    others = [verdicts.compare(x) for x in NOISY]
    noise = verdicts.pooled_family([close, *others])
    # the pooled sd: every cell's deviations from its own mean over the summed df (a one-way ANOVA's residual)
    devs = [x - sum(c) / len(c) for c in [[-0.0400, -0.0402], *NOISY] for x in c]
    df = 1 + 1 + 2 + 1 + 1
    assert noise["df"] == df and noise["sd"] == pytest.approx(math.sqrt(sum(d * d for d in devs) / df))
    se = noise["sd"] / math.sqrt(2)
    assert close["ci"] == pytest.approx([-0.0401 - st.t.ppf(0.975, df) * se, -0.0401 + st.t.ppf(0.975, df) * se])
    assert close["verdict"] == "inconclusive" and close["cell"]["verdict"] == "lower"
    # the page prints the per-cell reading beside the pooled one where they differ
    from depthlab.study.page.text import said

    assert "*inconclusive*" in said(close) and "per cell (df = 1)" in said(close) and "*lower*" in said(close)
    # the curse index: two seeds at 0.39 and 0.40 read "present" alone, not with the ratio's pooled seed noise
    alone = verdicts.curse_reading([0.39, 0.40], [0.0, 0.0], 45)
    pooled = verdicts.curse_reading([0.39, 0.40], [0.0, 0.0], 45,
                                    ratio_noise=stats.pooled_noise([[0.39, 0.40], [1.1, 1.3], [0.9, 1.2, 1.0]]))
    assert alone["word"] == "present" and pooled["word"] == "inconclusive"


def test_a_holm_adjusted_p_above_alpha_gives_no_word():
    from depthlab.study.page.text import said

    weak, strong = verdicts.compare([-0.10, -0.20, -0.12]), verdicts.compare([-0.30, -0.31, -0.29])
    assert weak["verdict"] == "lower" and 0.025 < weak["p"] < 0.05  # alone, a word
    verdicts.holm_words([weak, verdicts.compare([0.01, -0.02, 0.015]), strong])
    assert weak["p_holm"] == pytest.approx(min(1, 2 * weak["p"])) and weak["p_holm"] > 0.05
    assert weak["word"] == "inconclusive" and strong["word"] == "lower"
    text = said(weak)
    assert f"p {stats.pvalue(weak['p'])} (Holm {stats.pvalue(weak['p_holm'])})" in text
    assert "*inconclusive* (unadjusted: lower)" in text
    # a claim inside its family: the interval excludes 0, the adjusted p does not
    assert verdicts.claim(weak, "lower", p_adjusted=weak["p_holm"]) == "not reproduced"


def test_a_margin_set_after_the_data_gives_no_word():
    d = [0.002, -0.003, 0.001, 0.004, -0.001]
    assert verdicts.equivalent(d, 0.01, declared=True)["verdict"] == "equivalent"
    after = verdicts.equivalent(d, 0.01)  # a margin is not declared unless shown to be
    assert after["verdict"] == verdicts.NO_WORD and after["p"] < 0.05  # the numbers stay
    # the rate exponent: flat grids whose bootstrap interval lies inside ±1/6 hold their rate only under a margin
    # declared before the data
    grids = {L: {k: 2 + 0.01 * (k - 7.2) ** 2 for k in (6, 7, 8)} for L in (6, 12, 24, 48)}
    before = {"value": 1 / 6, "declared": True}
    assert t.exponent_reading(grids, 0.0005, before)["word"] == "holds its rate"
    late = t.exponent_reading(grids, 0.0005, {"value": 1 / 6, "declared": False})
    assert late["word"] == "inconclusive" and late["inside"]


def _commit(repo, name: str, text: str, when: int) -> None:
    """Commit `name` with `text` at unix time `when` (author and committer dates)."""
    (repo / name).write_text(text)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_AUTHOR_DATE": f"@{when} +0000", "GIT_COMMITTER_DATE": f"@{when} +0000", "PATH": "/usr/bin:/bin",
           "HOME": str(repo)}
    for args in (["add", name], ["commit", "-q", "-m", name]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env=env)


@pytest.mark.parametrize("order", ["plan first", "records first", "plan edited after"])
def test_a_margin_is_declared_before_only_when_its_plan_commit_precedes_the_records(tmp_path, order):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    plan = '{"margins": {"holds_its_rate_slope": {"12-48": 0.1}}}\n'
    steps = {"plan first": [("plan.json", plan), ("runs.jsonl", "{}\n")],
             "records first": [("runs.jsonl", "{}\n"), ("plan.json", plan)],
             "plan edited after": [("plan.json", plan), ("runs.jsonl", "{}\n"),
                                   ("plan.json", '{"margins": {"holds_its_rate_slope": {"12-48": 0.2}}}\n')]}[order]
    for i, (name, text) in enumerate(steps):
        _commit(repo, name, text, 1_700_000_000 + 100 * i)
    m = declared.margin(repo, "holds_its_rate_slope", 1 / 6, key="12-48")
    assert m["status"] == (declared.BEFORE if order == "plan first" else declared.AFTER)
    assert m["declared"] == (order == "plan first") and m["value"] in (0.1, 0.2)
    # not in the plan (or not for these depths): the code's value, set after the data
    assert declared.margin(repo, "equivalence_nats", 0.01)["status"] == declared.AFTER
    assert declared.margin(repo, "holds_its_rate_slope", 1 / 6, key="6-48")["value"] == 1 / 6
    # the plan edited in the working tree is not the committed one
    if order == "plan first":
        (repo / "plan.json").write_text('{"margins": {"holds_its_rate_slope": {"12-48": 0.3}}}\n')
        assert declared.margin(repo, "holds_its_rate_slope", 1 / 6, key="12-48")["status"] == declared.AFTER


def test_the_page_names_each_plans_margins_and_whether_they_precede_its_records(tmp_path):
    from depthlab.study.page import screen

    study = tmp_path / "s"
    study.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=study, check=True)
    _commit(study, "plan.json", '{"margins": {"equivalence_nats": 0.01, "equivalence_rule": "TOST", '
            '"holds_its_rate_slope": {"12-48": 0.25}}}\n', 1_700_000_000)
    (plan,) = declared.plans(tmp_path)
    assert plan["study"] == "s" and plan["status"] == declared.BEFORE and "equivalence_rule" not in plan["margins"]
    assert [screen._margin(m) for m in plan["margins"].items()] == ["equivalence_nats ±0.01",
                                                                     "holds_its_rate_slope ±0.25 over 12-48"]


def test_without_git_the_order_is_not_verifiable_and_gives_no_word(tmp_path, monkeypatch):
    (tmp_path / "plan.json").write_text('{"margins": {"equivalence_nats": 0.01}}\n')
    monkeypatch.setattr(declared, "_git", lambda *a: None)
    m = declared.margin(tmp_path, "equivalence_nats", 0.02)
    assert m["status"] == declared.UNKNOWN and not m["declared"] and m["value"] == 0.01
    assert declared.said(m).startswith("±0.01 (not verifiable")


def test_the_exponent_reads_from_a_bootstrap_over_grid_noise_and_its_sensitivity():
    depths = (6, 12, 24, 48)
    # the optimum moves half a lattice step per doubling of depth: rate ∝ N^(-1/4)... in lattice units k = 2 log2
    grids = {L: {k: 2 + 0.02 * (k - (9 - 0.5 * i)) ** 2 for k in range(5, 11)} for i, L in enumerate(depths)}
    quiet = t.exponent_reading(grids, 0.0005, {"value": 1 / 6, "declared": True})
    assert quiet["word"] == "falls with depth" and quiet["ci"][1] < 0 and set(quiet["checks"]) == {
        "argmin", "without N = 6", "without N = 12", "without N = 24", "without N = 48"}
    slopes = t.grid_bootstrap(grids, 0.0005)
    assert len(slopes) == t.BOOTSTRAP and float(slopes.mean()) == pytest.approx(-0.25, abs=0.02)
    loud = t.exponent_reading(grids, 0.05, {"value": 1 / 6, "declared": True})
    assert loud["word"] == "inconclusive" and loud["ci"][0] < -0.25 < loud["ci"][1]
    # the vertex of one grid, as vertex() reads it, is what the bootstrap reads with no noise
    recs = {k: {"status": "ok", "val_loss": v} for k, v in grids[6].items()}
    assert t.vertex(recs, 9) == pytest.approx(9.0)


def test_a_gated_row_still_says_when_its_measurement_goes_against_the_paper():
    from depthlab.study.claims import against_paper

    lower = verdicts.compare([-0.010, -0.011, -0.012])
    row = {"comparison": lower, "predicted": "higher", "condition": "absent"}
    (read,) = verdicts.family([row])
    assert read["word"] == "not testable" and against_paper(read) == "lower"
    assert against_paper({**read, "predicted": "lower"}) is None


def test_the_first_screen_on_the_committed_records_has_no_word_the_audit_fails():
    """On the committed records: no margin set after the data gives a word (no "holds its rate"; an equivalence
    word only where its margin was declared before the data), Pre-LN's N = 48 index is not "present" on two closely
    agreeing seeds, every word in the depth-transfer section's family survives Holm, and every direction word of
    the first screen has 3 or more paired seeds and a Holm p below 0.05 (a per-cell reading beside a pooled one is
    the only other place such a word appears)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "results.md").read_text()
    first = page.split("## The paper's claims, one rule")[0]
    import re

    assert "holds its rate*" not in first and "reads present at N = 48" not in first
    # an equivalence test's word needs its margin declared before the data; one set after prints no word
    tosts = re.findall(r"TOST ±[\d.]+ nats (declared before|set after) the data: \*([^*]+)\*", first)
    assert tosts and all(when == "declared before" or word == "no word: margin set after the data"
                         for when, word in tosts), tosts
    assert first.count("*equivalent*") == tosts.count(("declared before", "equivalent"))  # no other way to the word
    # every direction word of the first screen rests on 3 or more paired seeds and carries its Holm p
    words = re.findall(r"\(Holm ([^)]+)\), n = (\d+)(?: and \d+)?: \*(lower|higher)\*", first)
    assert words and all(int(n) >= 3 and (p.startswith("<") or float(p) < 0.05) for p, n, _ in words)
    assert len(re.findall(r": \*(lower|higher)\*", first)) == len(words) + first.count("per cell (df = ")
    assert "Bonferroni over its 5 parameterizations" in first  # the rate exponents' family
    res = t.study_summary(root / "benchmarks" / "results" / "depth_transfer")[0]
    family = [c for row in res["transfer"].values() for c in row.get("vs_pre", {}).values()]
    assert family and all(c["word"] == "inconclusive" or c["p_holm"] < 0.05 for c in family)
    assert res["transfer"]["lns"]["bootstrap"]["word"] != "holds its rate"


def test_the_own_rate_section_reads_the_pair_at_each_schemes_own_rate_and_withholds_a_word_below_three_seeds(
        tmp_path):
    import json

    from depthlab.study import own_rate as o
    from depthlab.study.page import own
    from depthlab.study.records import append_record

    d = o.Design(depths=(12, 24), deep=None)
    (tmp_path / "settings.json").write_text(json.dumps({"command": "python -m benchmarks.own_rate run", "meta": {
        "design": d.describe(), "corpus": {"sha256": "c6ea0715" * 8}}}))
    records: dict = {}
    noise = {0: 0.0, 1: 0.004, 2: -0.003, 3: 0.002}

    def finish(cells):
        for c in cells:  # each grid's best at its centre; LNS 0.05 nats lower on test, seeds scattered alike
            val = abs(t.lattice(c.lr) - o.CENTRES[(c.variant, c.layers)]) * 0.01 + 3.7 + noise[c.seed]
            r = {"study": "own_rate", "variant": c.variant, "lr": c.lr, "seed": c.seed, "layers": c.layers,
                 "status": "ok", "val_loss": val, "test_loss": val - (0.05 if c.variant == o.LNS else 0.0)
                 + (0.001 * c.seed if c.variant == o.LNS else 0.0)}
            records[c.key] = r
            append_record(tmp_path / "runs.jsonl", r)

    finish([c for c in o.next_cells(records, d) if c.seed == 0])
    lines = "\n".join(own.page_lines(tmp_path))
    assert "| 12 | pre | 0.005657 3.7100 / 3.7100, **0.008 3.7000 / 3.7000**, 0.01131 3.7100 / 3.7100 | 0.008 |" \
        in lines
    assert "-0.0500 (n = 1: *fewer than 3 paired seeds: no verdict*)" in lines
    while cells := o.next_cells(records, d):
        finish(cells)
    cs = own.comparisons(records, d)
    assert [cs[L]["n"] for L in (12, 24)] == [4, 4] and all(c["word"] == "lower" for c in cs.values())
    assert cs[12]["rates"] == [t.rate(o.CENTRES[(o.PRE, 12)]), t.rate(o.CENTRES[(o.LNS, 12)])]
    assert "p_holm" in cs[12] and cs[12]["mean"] == pytest.approx(-0.0485)
    assert "*lower*" in "\n".join(own.page_lines(tmp_path))


# ------------------------------------------------------------------ the first screen (screen.py) on own-rate records
DOC_SPREAD = [-0.3, 0.1, 0.25, -0.05, 0.0]  # per-document test losses around the record's mean (equal weights)


def _own_study(out, test_loss, keep=lambda c: True, d=None):
    """An own-rate study in `out` run as far as `keep` lets its plan go: every grid best at its centre (validation
    loss), test loss test_loss(cell), per-document test losses that average to it, and settings.json with the
    held-out splits' composition."""
    import json

    from depthlab.study import own_rate as o
    from depthlab.study.records import append_record

    d = d or o.Design()
    out.mkdir(parents=True, exist_ok=True)
    splits = {s: {"documents": 50, "effective": 38.5, "top": [["a.py", 0.04]]} for s in ("val", "test")}
    (out / "settings.json").write_text(json.dumps({"command": "python -m benchmarks.own_rate run", "meta": {
        "design": d.describe(), "corpus": {"sha256": "ab" * 32, "splits": splits}}}))
    records: dict = {}
    while cells := [c for c in o.next_cells(records, d) if keep(c)]:
        for c in cells:
            test = test_loss(c)
            records[c.key] = r = {
                "study": "own_rate", "variant": c.variant, "lr": c.lr, "seed": c.seed, "layers": c.layers,
                "status": "ok", "val_loss": 3.7 + 0.01 * abs(t.lattice(c.lr) - o.CENTRES[(c.variant, c.layers)]),
                "test_loss": test, "doc_losses": {"test": [test + x for x in DOC_SPREAD]},
                "doc_scored": {"test": [100] * len(DOC_SPREAD)}}
            append_record(out / "runs.jsonl", r)
    return records


def _answer(out) -> str:
    from depthlab.study.page import screen

    return screen.own_lines(screen.own_screen(out), None)[0]


def test_two_paired_seeds_give_no_word_on_the_first_screen_even_where_their_interval_excludes_zero(tmp_path):
    """The plan asks 3 paired seeds for a word: at N = 12 with two seeds that agree (LNS 0.050 and 0.051 lower) the
    per-cell t-interval and the document bootstrap both exclude 0, yet the answer gives no word."""
    from depthlab.study import own_rate as o
    from depthlab.study.page import own

    shift = {0: -0.050, 1: -0.051}
    _own_study(tmp_path, lambda c: 3.7 + (shift[c.seed] if c.variant == o.LNS else 0.0),
               keep=lambda c: c.layers == 12 and c.seed < 2)
    assert verdicts.compare([-0.050, -0.051])["ci"][1] < 0  # alone, two seeds would read "lower"
    s = own.study(tmp_path)
    c = own.comparisons(s[0], s[2])[12]
    assert c["n"] == 2 and c["documents"]["ci"][1] < 0
    line = _answer(tmp_path)
    assert f"N = 12 -0.0505 (n = 2: *{own.FEW}*) (documents and seeds resampled: [-0.0510, -0.0500])" in line
    assert "*lower*" not in line and "unadjusted" not in line and "Holm" not in line
    assert "N = 24 not run yet; N = 48 not run yet" in line


def test_a_raw_p_below_alpha_whose_holm_p_over_the_plans_depths_is_not_gives_no_lower(tmp_path):
    """Four seeds at N = 12 only: p 0.03 alone, but Holm over the plan's three depths (24 and 48 not yet run, counted
    at p = 1) gives 0.09: the answer reads inconclusive, not lower."""
    from depthlab.study import own_rate as o

    diffs = [-0.012, -0.024, -0.006, -0.018]
    _own_study(tmp_path, lambda c: 3.7 + (diffs[c.seed] if c.variant == o.LNS else 0.0),
               keep=lambda c: c.layers == 12)
    raw = verdicts.compare(diffs)
    assert raw["verdict"] == "lower" and 0.0167 < raw["p"] < 0.05
    line = _answer(tmp_path)
    assert f"p {stats.pvalue(raw['p'])} (Holm {stats.pvalue(3 * raw['p'])}), n = 4: *inconclusive* (unadjusted: " \
           "lower)" in line
    assert "*lower*" not in line


def _parts_study(out, plan_first: bool) -> None:
    """Every cell of the plan, gain-init within 0.002 nats of LNS at N = 48; plan.json committed before the records
    (`plan_first`) or after them."""
    import json

    from depthlab.study import own_rate as o

    subprocess.run(["git", "init", "-q", str(out)], check=True)
    loss = {o.PRE: 3.70, o.LNS: 3.65, o.GAIN_INIT: 3.65, o.UNIFORM: 3.68}
    _own_study(out, lambda c: loss[c.variant] + 0.0005 * ((3 * c.seed + list(loss).index(c.variant)) % 4))
    plan, runs = ("plan.json", json.dumps(o.plan(o.Design()))), ("runs.jsonl", (out / "runs.jsonl").read_text())
    for i, (name, text) in enumerate([plan, runs] if plan_first else [runs, plan]):
        _commit(out, name, text, 1_700_000_000 + 100 * i)


@pytest.mark.parametrize("plan_first", [True, False])
def test_a_margin_set_after_the_data_gives_no_word_on_the_first_screen(tmp_path, plan_first):
    """The N = 48 decomposition from the own-rate study's parts (once they have 3 paired seeds it replaces the
    depth-transfer study's): gain-init − LNS inside ±0.01 nats reads "equivalent" only where plan.json's commit
    precedes the records; committed after them, the margin gives its numbers and no word."""
    from depthlab.study.page import own, screen

    _parts_study(tmp_path, plan_first)
    tres = t.study_summary(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "depth_transfer")[0]
    lines = screen.own_lines(screen.own_screen(tmp_path), tres)
    (parts,) = [x for x in lines if "taken apart" in x]
    assert parts.startswith("- **N = 48 taken apart** (the own-rate study, test split")
    assert "gain-init − Pre-LN -0.0500 [-0.0512, -0.0488], p <0.001 (Holm <0.001), n = 4: *lower*" in parts
    if plan_first:
        assert parts.endswith("TOST ±0.01 nats declared before the data: *equivalent*.")
    else:
        assert parts.endswith(f"TOST ±0.01 nats set after the data: *{verdicts.NO_WORD}*.")
        assert "*equivalent*" not in "\n".join(lines)
    assert "the plan's `parts_at_deep` family" in "\n".join(own.page_lines(tmp_path))


def test_the_decomposition_stays_the_depth_transfer_studys_until_the_own_rate_parts_have_three_seeds(tmp_path):
    from depthlab.study import own_rate as o
    from depthlab.study.page import screen

    _own_study(tmp_path, lambda c: 3.7 - 0.01 * (c.variant != o.PRE), keep=lambda c: c.layers != 48 or c.seed < 2)
    s = screen.own_screen(tmp_path)
    assert s["parts"]["tests"]["gain-init − Pre-LN"]["n"] == 2
    tres = t.study_summary(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "depth_transfer")[0]
    (parts,) = [x for x in screen.own_lines(s, tres) if "taken apart" in x]
    assert "(the rate-transfer study's test split and family, until the own-rate study's N = 48 parts have 3 " \
           "paired seeds;" in parts


@pytest.mark.slow
def test_the_page_written_from_the_records_opens_with_a_first_screen_the_readme_repeats(tmp_path):
    """The page written (science.write) from the committed records with the own-rate study complete (every depth
    and the N = 48 parts): a first screen of at most MAX_LINES lines of MAX_CHARS characters with its figure and why
    (LNS taken apart), the detail below it, and the README's block those lines with their links from the root."""
    import shutil

    from benchmarks import lns_study
    from depthlab.study.page import science, screen

    results = tmp_path / "results"
    shutil.copytree(Path(__file__).resolve().parents[1] / "benchmarks" / "results", results,
                    ignore=shutil.ignore_patterns("own_rate"))
    _parts_study(results / "own_rate", plan_first=True)
    (tmp_path / "README.md").write_text(f"# x\n\nbefore\n{screen.START}\nstale bullets\n{screen.END}\nafter\n")
    page = science.write(results, tmp_path / "docs", list(lns_study.PARTS), list(lns_study.UNSTABLE), []).read_text()
    top = page.split("## The paper's claims, one rule")[0].splitlines()[4:]
    first = [x for x in top[:top.index(screen.DETAIL_HEAD)] if x]
    assert len(first) <= screen.MAX_LINES and max(map(len, first)) <= screen.MAX_CHARS
    assert first[0].startswith("**Does LayerNorm Scaling (LNS) lower the loss of a Pre-LN transformer?**")
    (adamw,) = [x for x in first if x.startswith("- AdamW, 4 seeds: -0.050 [")]
    assert "at N = 12 (-4.9% perplexity)" in adamw and "not run yet" not in adamw
    assert any(x.startswith("- Why: at N = 48, Pre-LN with its norm gains starting smaller recovers") for x in first)
    assert f"](img/{screen.FIGURE})" in "\n".join(first) and (tmp_path / "docs" / "img" / screen.FIGURE).exists()
    assert any(x.startswith("- **N = 48 taken apart** (the own-rate study") for x in top)
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# x\n\nbefore\n") and readme.endswith("\nafter\n") and "stale" not in readme
    block = readme.split(screen.START, 1)[1].split(screen.END, 1)[0]
    assert [x for x in block.splitlines() if x] == [screen.from_root(x) for x in first]
