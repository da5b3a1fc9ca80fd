"""The eight-task commonsense evaluation: LLM-Adapters' answer extraction, both forms, the table for two models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from depthlab.config import Config
from depthlab.eval.commonsense import TASKS, extract_answer, offered, task_files
from depthlab.hf.importer import save_as_checkpoint
from depthlab.model import Transformer
from tests.conftest import tiny_model_config
from tests.test_finetune import bpe_for_tests

EVAL = Path(__file__).parent / "data" / "commonsense" / "eval"


def test_answer_extraction_follows_llm_adapters():
    assert extract_answer("boolq", "  the correct answer is false. true") == "false"
    assert extract_answer("piqa", "solution3 then solution2") == "solution2"
    assert extract_answer("hellaswag", "ending4") == "ending4"
    assert extract_answer("winogrande", "option 1") == ""  # no match: counted wrong
    assert extract_answer("ARC-Challenge", "answer5") == "answer5"
    assert offered("social_i_qa", "Q\n\nAnswer1: a Answer2: b Answer3: c\n\nAnswer format: answer1/answer2/answer3") \
        == ["answer1", "answer2", "answer3"]
    assert set(task_files(EVAL)) == set(TASKS)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    root, tok = tmp_path_factory.mktemp("models"), bpe_for_tests()
    out = []
    for i, scheme in enumerate(("pre", "lns")):
        mc = tiny_model_config(vocab_size=400, n_layers=2, max_seq_len=256, norm_scheme=scheme)
        torch.manual_seed(i)
        save_as_checkpoint(root / scheme, Transformer(mc), Config(model=mc), {"step": 0}, tokenizer=tok)
        out.append(root / scheme)
    return out


def test_eval_commonsense_writes_the_table_for_two_models(two_models, tmp_path, capsys):
    from depthlab.cli import main

    prefix = tmp_path / "table"
    code = main(["eval", "commonsense", *map(str, two_models), "--commonsense", str(EVAL), "--table", str(prefix),
                 "--max-new-tokens", "4", "--device", "cpu"])
    out = capsys.readouterr()
    assert code == 0, out.err
    md = (tmp_path / "table.md").read_text()
    assert "| Model | BoolQ | PIQA | SIQA | HellaSwag | WinoGrande | ARC-e | ARC-c | OBQA | Avg. |" in md
    assert md.count(str(two_models[0])) == 2 and md.count(str(two_models[1])) == 2
    data = json.loads((tmp_path / "table.json").read_text())
    for form in ("generation", "loglik"):
        row = data["tables"][form][str(two_models[1])]
        accs = [row[TASKS[t][0]] for t in TASKS]
        assert all(0 <= a <= 100 for a in accs) and row["Avg."] == pytest.approx(sum(accs) / 8, abs=0.06)
    assert len(data["results"][str(two_models[0])]["boolq"]["outputs"]) == 4
    assert oct((tmp_path / "table.md").stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    code = main(["eval", "commonsense", str(two_models[0]), "--commonsense", str(EVAL), "--table",
                 str(prefix), "--max-new-tokens", "4", "--device", "cpu"])  # its own table
    assert code == 0 and str(two_models[1]) not in (tmp_path / "table.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.json", "table.md"]


def _umask() -> int:
    import os

    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_bad_commonsense_inputs_are_one_line(two_models, tmp_path, capsys):
    from depthlab.cli import main

    (tmp_path / "boolq").mkdir()
    rec = {"instruction": "q", "input": "", "output": "the correct answer is maybe", "answer": "maybe"}
    (tmp_path / "boolq" / "test.json").write_text(json.dumps([rec]))
    assert main(["eval", "commonsense", str(two_models[0]), "--commonsense", str(tmp_path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "test.json:1:" in err[0] and "true/false" in err[0], err
    with pytest.raises(SystemExit) as e:  # argparse's own refusal: one line, exit status 2
        main(["eval", "commonsense", *map(str, two_models), "--device", "cpu"])
    assert e.value.code == 2 and "required: --commonsense" in capsys.readouterr().err


def test_a_checkpoint_and_its_export_answer_alike(two_models, tmp_path, capsys):
    """The same prompt encoding, start token and greedy decoding through depthlab and through transformers."""
    pytest.importorskip("transformers")
    from depthlab.cli import main
    from depthlab.eval.commonsense import evaluate_models

    assert main(["export", str(two_models[1]), str(tmp_path / "exported")]) == 0
    res = evaluate_models([str(two_models[1]), str(tmp_path / "exported")], EVAL, "cpu", 4, log=lambda m: None)
    a, b = res.values()
    for task in ("boolq", "piqa", "hellaswag"):
        assert a[task]["outputs"] == b[task]["outputs"] and a[task]["loglik"] == b[task]["loglik"]
