"""benchmarks/figure_one_run.py end to end at toy size: two 2-block runs, the continuation task from the test split,
both analyses, the comparison and the record."""

import json
from pathlib import Path

import pytest

from benchmarks import figure_one_run as f1
from depthlab.eval.multiple_choice import read_tasks

TINY = ["--corpus-mb", "3", "--vocab", "512", "--steps", "4", "--eval-every", "2", "--batch", "4", "--layers", "2",
        "--val-tokens", "1024", "--questions", "6", "--analyze-tokens", "256", "--drop-lowest", "1"]


@pytest.mark.slow
def test_figure_one_run_end_to_end(tmp_path):
    runs, record = tmp_path / "runs", tmp_path / "record.json"
    f1.main(["--runs-dir", str(runs), "--record", str(record), *TINY])
    out = runs / "figure_one"
    task = [json.loads(line) for line in (out / "continuation.jsonl").read_text().splitlines()]
    assert len(read_tasks(out / "continuation.jsonl")) == len(task) == 6  # what eval tasks reads

    # the documents no training or selection read: the test half of the held-out documents
    from depthlab.data.dataset import load_text, split_documents
    from depthlab.data.dedup import dedup
    from depthlab.study.corpus import NEAR_COPY

    cfg = f1.study(f1.parser().parse_args(["--runs-dir", str(runs), *TINY]), "", "fig1").config(f1.Cell("pre", 1e-3, 0))
    train, held = split_documents(dedup(load_text(cfg)[0], NEAR_COPY)[0], cfg.data.val_fraction)
    test = {d.name: d.text for d in held[1::2]}
    assert not set(test) & ({d.name for d in train} | {d.name for d in held[0::2]})
    for q in task:
        choices = q["choices"]
        assert len(choices) == 4 == len(set(choices)) and all(c.strip() for c in choices)
        assert q["question"] + " " + choices[q["answer"]] in test[q["document"]]  # the true continuation
        wrong = [c for i, c in enumerate(choices) if i != q["answer"]]
        assert all(any(c in text for name, text in test.items() if name != q["document"]) for c in wrong)

    rec = json.loads(record.read_text())
    assert set(rec["models"]) == {"pre", "lns"} and rec["task"]["questions"] == 6
    assert rec["environment"]["threads"] == 1 and rec["environment"]["processes"] == 4  # the analyses', not ours
    for m in rec["models"].values():
        assert m["questions"] == 6 and len(m["acc_drop"]) == 2 == len(m["delta_loss_linear"])
        assert 0 <= m["base_acc"] <= 1 and m["train"]["test_loss"] > 0
        assert [d["k"] for d in m["drop_lowest"]["tasks"]] == [1]
    assert (out / "compare" / "figure_one.png").is_file() and (out / "pre" / "report.html").is_file()

    # run again: nothing is trained or analysed again, the record is rewritten
    stamp = (out / "pre" / "metrics.json").stat().st_mtime
    record.unlink()
    f1.main(["--runs-dir", str(runs), "--record", str(record), *TINY])
    assert record.is_file() and (out / "pre" / "metrics.json").stat().st_mtime == stamp
    assert len((runs / "runs.jsonl").read_text().splitlines()) == 2
    assert Path(f1.RECORD).name == "figure_one_run.json"
