"""`analyze` answers first: its terminal summary and its report open with the verdict by the declared rule and the
blocks that could go, before any per-block number; costs are in nats with % perplexity beside, every perplexity
states its window and tokens, and a set of blocks is written one way."""

import json
import math
import re

import pytest

from depthlab.analysis.answer import pct_ppl
from depthlab.analysis.results import blocks_text, span_text
from depthlab.cli import main
from tests.test_analysis_support import TEXT
from tests.test_curse_index import save_llama


def test_one_notation_for_a_set_of_blocks():
    assert blocks_text([18, 13, 15, 19]) == "13, 15, 18, 19"
    assert blocks_text([16, 14, 15]) == span_text([14, 16]) == "14-16"
    assert blocks_text([2, 3, 4, 9]) == "2-4, 9"
    assert pct_ppl(math.log(1.5)) == pytest.approx(50.0)


@pytest.mark.slow
def test_summary_and_report_lead_with_the_answer(tmp_path, capsys):
    model = save_llama(tmp_path / "llama", 8, [5, 6])
    (tmp_path / "text.txt").write_text(TEXT)
    out = tmp_path / "report"
    assert main(["analyze", str(model), "--data", str(tmp_path / "text.txt"), "--tokens", "512", "--seq-len", "32",
                 "--no-jacobian", "--lens-tokens", "64", "--out", str(out)]) == 0
    res = json.loads((out / "metrics.json").read_text())
    lines = [x.strip() for x in capsys.readouterr().out.splitlines()]
    first_number_per_block = min(i for i, x in enumerate(lines) if x.startswith(("curse index", "adjacent angular")))
    verdict = next(i for i, x in enumerate(lines) if x.startswith("verdict (loss): "))
    go = [i for i, x in enumerate(lines) if x.startswith("remove ")]
    assert verdict < go[0] and go[-1] < lines.index("details:") < first_number_per_block
    assert re.search(r"R = ([\d.e+-]+|inf) \[([\d.e+-]+|inf), ([\d.e+-]+|inf)\]", lines[verdict])  # R, its interval
    assert any(x.startswith("rule: R = median removal cost") for x in lines[:go[0]])
    # 1, 2 and 4 blocks removed together, as the drop rows scored them, in nats with % perplexity beside
    drops = {d["k"]: d for d in res["removal"]["drop"]["loss"]}
    for i, k in zip(go, (1, 2, 4)):
        blocks = blocks_text(res["usefulness"]["loss"][:k])
        d = drops[k]["delta_loss"]
        assert lines[i] == f"remove {k}: block{'s' if k > 1 else ''} {blocks}: {d:+.3f} nats ({pct_ppl(d):+.1f}% " \
                           "perplexity)"
    ppl = next(x for x in lines if x.startswith("perplexity "))
    scored = sum(res["removal"]["windows"]["count"])
    assert f"{scored:,} tokens scored in {res['sequences']} windows of 32" in ppl
    assert "costs least: " in "\n".join(lines) and "Δ perplexity" not in "\n".join(lines)

    page = (out / "report.html").read_text()
    answer = page.index("The answer")
    first_table = page.index("Per block:")  # the caption of the first per-block table
    assert answer < page.index("verdict (loss): ") < page.index("The blocks that could go") < first_table
    assert page.index("removal_cost.png") < first_table  # the Figure 1 form, on the first screen
    assert page.count("<table>") == page.count("<caption>") > 0
    assert page.count("<div class='scroll'><table>") == page.count("<table>")
    assert "delta_ppl" not in page and "Δ perplexity" not in page
    assert f"<td>{blocks_text(res['usefulness']['loss'][:4])}</td>" in page


def test_compare_says_when_its_models_were_measured_on_different_texts_or_windows():
    from depthlab.analysis.answer import measured_alike

    def res(source, seq_len, count):
        return {"data": {"source": source, "seq_len": seq_len}, "removal": {"windows": {"count": count}}}

    same = [("a", res("t.txt", 32, [31, 31])), ("b", res("t.txt", 32, [31, 31]))]
    assert measured_alike(same) == []
    other = [("a", res("t.txt", 32, [31, 31])), ("b", res("u.txt", 64, [63]))]
    said = measured_alike(other)
    assert len(said) == 3 and all(x.startswith("warning: the models were measured on different ") for x in said)
    assert "a: t.txt; b: u.txt" in said[0] and "a: 32; b: 64" in said[1] and "a: 62; b: 63" in said[2]
