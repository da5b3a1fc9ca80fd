"""The own-rate section of the results page (issue 50): an interval over test documents as well as seeds
(stats.document_bootstrap over the records' per-document losses) that never gives a word the plan withholds, the
cells a partial study still lacks, and each held-out split's composition, or that it is not recorded."""

import json

import numpy as np
import pytest

from depthlab.stats import document_bootstrap
from depthlab.study import own_rate as o, transfer as t
from depthlab.study.page import own
from depthlab.study.page.text import composition_said
from depthlab.study.records import append_record, load_records

DOCS = 40
WEIGHTS = list(np.random.default_rng(7).integers(50, 2000, DOCS))
SPREAD = list(np.random.default_rng(8).normal(0.0, 0.4, DOCS))  # documents differ in difficulty, as code files do


def test_identical_per_document_losses_give_a_zero_width_interval():
    losses = [[3.5 + x for x in SPREAD]] * 3
    diff = [[a - b for a, b in zip(r, r, strict=True)] for r in losses]
    b = document_bootstrap(diff, WEIGHTS)
    assert b["ci"] == [0.0, 0.0] and b["mean"] == 0.0 and (b["seeds"], b["documents"]) == (3, DOCS)


def test_a_difference_carried_by_one_document_gives_a_wide_interval_that_holds_zero():
    one = [[-1.0 if i == 7 else 0.0 for i in range(DOCS)]] * 2
    b = document_bootstrap(one, WEIGHTS)
    assert b["mean"] == pytest.approx(-WEIGHTS[7] / sum(WEIGHTS))
    # a draw of 40 documents misses document 7 with probability (39/40)^40 = 0.36: the upper end is 0
    assert b["ci"][1] == 0.0 and b["ci"][0] < 2 * b["mean"]
    even = document_bootstrap([[b["mean"]] * DOCS] * 2, WEIGHTS)  # the same mean spread over every document
    assert even["ci"] == pytest.approx([b["mean"]] * 2)


def test_the_interval_resamples_seeds_as_well_as_documents_and_its_point_is_the_records_mean():
    by_seed = [-0.05, -0.01, -0.03, 0.02]
    rows = [[s] * DOCS for s in by_seed]  # every document agrees: only the seeds spread it
    b = document_bootstrap(rows, WEIGHTS)
    assert b["mean"] == pytest.approx(np.mean(by_seed))
    assert min(by_seed) <= b["ci"][0] < b["mean"] < b["ci"][1] <= max(by_seed)
    assert document_bootstrap(rows, WEIGHTS) == b  # seeded: the same interval every time
    with_docs = document_bootstrap([[s + x for x in SPREAD] for s in by_seed], WEIGHTS)
    assert with_docs["ci"][1] - with_docs["ci"][0] > b["ci"][1] - b["ci"][0]  # document sampling widens it


def test_a_document_with_no_scored_token_counts_for_nothing():
    rows = [[None if i == 3 else 0.1 for i in range(DOCS)]]
    b = document_bootstrap(rows, WEIGHTS)
    assert b["documents"] == DOCS - 1 and b["ci"] == pytest.approx([0.1, 0.1])


def _record(c, val: float, shift: float) -> dict:
    """A record with per-document test losses whose scored-token mean is its test loss."""
    losses = [3.6 + x + shift + 0.002 * c.seed * (-1) ** i for i, x in enumerate(SPREAD)]
    test = float(np.average(losses, weights=WEIGHTS))
    return {"study": "own_rate", "variant": c.variant, "lr": c.lr, "seed": c.seed, "layers": c.layers, "status": "ok",
            "val_loss": val, "test_loss": test, "doc_losses": {"test": losses},
            "doc_scored": {"test": [int(w) for w in WEIGHTS]}}


def test_the_section_on_a_partial_study_names_what_is_missing_and_gives_no_word_the_plan_withholds(tmp_path):
    """The plan's N = 12 and 24 with N = 48 not started: N = 12 at two paired seeds, LNS's N = 24 grid widening at its
    lower edge with the widened rate not run. LNS is 0.05 nats lower on every document, so the document bootstrap
    excludes 0, yet the plan (3 paired seeds) gives no word."""
    d = o.Design()
    (tmp_path / "settings.json").write_text(json.dumps({"command": "python -m benchmarks.own_rate run", "meta": {
        "design": d.describe(), "corpus": {"sha256": "ab" * 32, "val_tokens": 5000, "test_tokens": 6000}}}))
    records: dict = {}
    lower = t.rate(o.CENTRES[(o.LNS, 24)] - 2)

    def wanted(c) -> bool:
        if c.layers == 48 or (c.variant, c.layers, c.lr) == (o.LNS, 24, lower):
            return False
        return c.seed == 0 or (c.layers == 12 and c.seed == 1)

    while cells := [c for c in o.next_cells(records, d) if wanted(c)]:
        for c in cells:
            k, centre = t.lattice(c.lr), o.CENTRES[(c.variant, c.layers)]
            # LNS at 24 is best at its lowest rate (the grid widens down); every other grid at its centre
            val = 3.7 + 0.01 * ((k - centre) if (c.variant, c.layers) == (o.LNS, 24) else abs(k - centre))
            r = _record(c, val, -0.05 + 0.003 * c.seed if c.variant == o.LNS else 0.0)
            records[c.key] = r
            append_record(tmp_path / "runs.jsonl", r)
    lines = own.page_lines(tmp_path)
    text = "\n".join(lines)
    cs = own.comparisons(load_records(tmp_path / "runs.jsonl"), d)
    assert list(cs) == [12] and cs[12]["n"] == 2 and cs[12]["word"] == own.FEW
    docs = cs[12]["documents"]
    assert docs["seeds"] == 2 and docs["ci"][1] < 0 and docs["mean"] == pytest.approx(cs[12]["mean"])
    row = next(x for x in lines if x.startswith("| 12 | 0.008, 0.01131 |"))
    assert f"*{own.FEW}*" in row and "(40 documents × 2 seeds)" in row
    for word in ("*lower*", "*higher*", "*inconclusive*"):
        assert word not in text
    assert "| 24 | - | - | not run yet: a grid has not finished" in text
    assert "| 48 | - | - | not run yet" in text
    assert f"{lower:g} not run yet" in text
    assert (f"| 24 | lns | 3 of 4 rates run, widened 1 step past its lower edge; best not known yet | - | - | "
            f"{lower:g} (seed 0); then seeds 1, 2, 3 at the grid's best |") in text
    assert "| 12 | pre | 3 of 3 rates run; best 0.008 | 0, 1 |" in text and "| seeds 2, 3 at 0.008 |" in text
    assert "| 24 | pre | 3 of 3 rates run; best 0.005657 | 0 |" in text
    assert "| 48 | pre | 0 of 3 rates run; best not known yet | - | - | 0.004 (seed 0)" in text
    assert "not recorded; the records hold only: val split 5,000 tokens (documents not counted), test split 6,000" \
        in text


def test_a_held_out_split_whose_composition_was_not_recorded_says_so_and_what_the_records_hold():
    old = {"val_tokens": 42572, "test_tokens": 100165, "documents": {"train": 503, "val": 13, "test": 13}}
    assert composition_said(old, "the depth-transfer study's") == (
        "the depth-transfer study's held-out splits' composition (each document's share, Kish's effective number "
        "of documents) is not recorded; the records hold only: val split 13 documents (42,572 tokens), test split "
        "13 documents (100,165 tokens)")
    assert composition_said({"val_tokens": 112834}).endswith(
        "val split 112,834 tokens (documents not counted), no test split")
    new = {"splits": {"test": {"documents": 50, "effective": 37.0, "top": [["hashlib.py", 0.0377]]}}}
    assert composition_said(new) == "its test split 50 documents, Kish effective 37, largest hashlib.py 4%"
    empty = {"splits": {"test": {"documents": 0, "effective": 0.0, "top": []}}}  # a tiny corpus's empty split
    assert composition_said(empty) == "its test split 0 documents, Kish effective 0"


def test_every_text_section_of_the_committed_page_prints_its_held_out_composition():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "results.md").read_text()
    sections = {s.split("\n", 1)[0]: s for s in page.split("\n## ")[1:]}
    for head in ("1. Each depth at its own rate", "6. The curse along training", "8. One rate per scheme",
                 "Depth transfer:", "The own-rate study:"):
        body = next(s for h, s in sections.items() if h.startswith(head))
        assert "Kish effective" in body or "Kish's effective number of documents) is not recorded" in body, head


def test_a_running_studys_word_is_held_to_the_whole_declared_family():
    """One depth of the plan's three has its seeds: its Holm p is bounded by counting the two depths still to come
    at p = 1 (3 x p here), so p 0.02 gives no word now; and no later outcome of those two can give a larger p."""
    from depthlab.study.verdicts import holm_words

    def one(p):
        return {"p": p, "verdict": "lower"}

    alone = holm_words([one(0.02)], family_size=3)[0]
    assert alone["p_holm"] == pytest.approx(0.06) and alone["word"] == "inconclusive"
    assert holm_words([one(0.02)])[0]["word"] == "lower"  # what the page said when the family was what had run
    for later in ([0.5, 0.9], [0.001, 0.9], [0.001, 0.002]):
        full = holm_words([one(0.02), *map(one, later)])[0]
        assert full["p_holm"] <= alone["p_holm"] + 1e-12
    assert holm_words([one(0.01)], family_size=3)[0]["word"] == "lower"
