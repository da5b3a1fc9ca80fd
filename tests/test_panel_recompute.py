"""benchmarks/panel_recompute.py on a tiny panel: records of a tiny random Gemma-3 made by the panel's own sweep,
written as the runner writes them, then read back by the recompute script alone."""

import json

import numpy as np
import pytest
import torch

from benchmarks import panel_recompute
from benchmarks.real_model_panel import GenerationObjective, LossObjective, Panel, sweep
from depthlab.analysis.verdict import loss_outcomes, verdict
from depthlab.eval.generate import GenQuestion
from tests.test_real_model_panel import KINDS, tiny


def own_answers(panel: Panel, n: int, seed: int) -> list[GenQuestion]:
    """Items whose answer is the model's own greedy continuation (so that the model itself gets them all right)."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(n):
        prompt = torch.randint(1, 97, (8,), generator=g).tolist()
        out = []
        for _ in range(2):
            out.append(int(panel.head(panel.hidden(torch.tensor([prompt + out])))[0, -1].argmax()))
        items.append(GenQuestion(tuple(prompt), tuple(out)))
    return items


def test_the_recompute_script_reads_the_words_and_the_table_from_raw_records(tmp_path, capsys):
    panel = Panel("gemma3", tiny("gemma3", KINDS * 2), None)  # 10 blocks: E = [2, 3], D = [6, 7, 8]
    loss = LossObjective(panel, torch.randint(1, 97, (12, 13), generator=torch.Generator().manual_seed(1)), 4)
    recs = {"loss": {"tokens": loss.tokens, **sweep(panel, loss, "loss")},
            "code": {"tokens": loss.tokens, **sweep(panel, loss, "code")},
            "choice": sweep(panel, GenerationObjective(panel, own_answers(panel, 40, 2), 8), "choice"),
            "generation": sweep(panel, GenerationObjective(panel, own_answers(panel, 40, 3), 8), "generation")}
    go = [2, 3, 6, 7]
    with panel.removed(go):
        recs["could_go"] = {"blocks": go, "tokens": loss.tokens, "base": recs["loss"]["base"],
                            "removed": loss.outcomes(panel)}
    (tmp_path / "gemma3").mkdir()
    for phase, r in recs.items():
        (tmp_path / "gemma3" / f"{phase}.json").write_text(json.dumps(r))
    panel_recompute.main([str(tmp_path)])
    got = json.loads((tmp_path / "panel.json").read_text())["gemma3"]
    assert set(got["words"]) == {"loss", "choice", "generation"}
    # the loss costs are those of the pruned model, read again from the raw per-window sums
    want = [(sum(r) - sum(recs["loss"]["base"])) / sum(loss.tokens) for r in recs["loss"]["removed"]]
    assert got["words"]["loss"]["cost"] == pytest.approx(want)
    with panel.removed([2]):
        assert want[1] == pytest.approx((sum(loss.outcomes(panel)) - sum(recs["loss"]["base"])) / sum(loss.tokens),
                                        abs=1e-5)
    assert got["words"]["loss"]["word"] == verdict(loss_outcomes(recs["loss"]["base"], recs["loss"]["removed"],
                                                                 loss.tokens))["word"]
    assert got["words"]["generation"]["precondition"]["accuracy"] == 1.0
    assert len(got["words"]["choice"]["leave_one_out"]) == len(got["words"]["choice"]["early"]) + \
        len(got["words"]["choice"]["deep"])
    assert set(got["rank_correlations"]) == {"loss ~ choice", "loss ~ generation", "choice ~ generation"}
    assert got["could_go"]["by_loss"] == sorted(range(2, 2 * len(KINDS) - 1), key=lambda l: (want[l - 1], l))[:4]
    joint = (sum(recs["could_go"]["removed"]) - sum(recs["loss"]["base"])) / sum(loss.tokens)
    assert got["could_go"]["measured"] == go and got["could_go"]["nats"] == pytest.approx(joint)
    assert got["could_go"]["perplexity_change"] == pytest.approx(np.expm1(joint))
    assert np.isfinite(got["curse_index_mean_ratio"]["ratio"]) or got["curse_index_mean_ratio"]["ratio"] is None
    assert "| gemma3 |" in capsys.readouterr().out
