import json
import math

import pytest
import torch

from depthlab import UserError
from depthlab.cli import main
from depthlab.config import Config
from depthlab.eval.multiple_choice import choice_logprobs, evaluate_tasks, load_scorer, read_tasks
from depthlab.hf.exporter import export
from depthlab.hf.importer import save_as_checkpoint
from depthlab.model import Transformer
from tests.conftest import tiny_model_config
from tests.test_hf_fixtures import make_checkpoint, word_tokenizer

# Hand-checked on a model whose next-token distribution is uniform over V = 97 tokens: every token costs
# ln 97 = L, one word is one token, so a choice of k words scores -k L; acc_norm divides that by the choice's
# characters (lm-eval's definition: the choice alone, without the joining space), acc_bytes by its UTF-8 bytes.
#   q1  "red" (1 tok, 3 chars) vs "yellow green" (2 tok, 12 chars): acc picks red (-1L > -2L); acc_norm picks
#       yellow green (-2L/12 = -L/6 > -L/3).  answer 0 -> acc right, acc_norm wrong
#   q2  the same choices, answer 1       -> acc wrong, acc_norm right
#   q3  "a b c" (3 tok, 5 chars) vs "sky" (1 tok, 3 chars): sky wins both (-L vs -3L; -L/3 vs -3L/5); answer 1
TASK = [
    {"question": "what color is the sky", "choices": ["red", "yellow green"], "answer": 0},
    {"question": "what color is the grass", "choices": ["red", "yellow green"], "answer": 1},
    {"question": "the", "choices": ["a b c", "sky"], "answer": 1},
]


def write_task(path, rows=TASK):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def uniform_checkpoint(tmp_path):
    """All weights zero: every hidden state is 0, every logit 0, the next-token distribution uniform."""
    mc = tiny_model_config(norm_scheme="lns")
    model = Transformer(mc)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return save_as_checkpoint(tmp_path / "uniform", model, Config(model=mc), {"step": 0}, word_tokenizer())


def test_hand_checked_task_on_a_uniform_model(uniform_checkpoint, tmp_path):
    res = evaluate_tasks(uniform_checkpoint, write_task(tmp_path / "t.jsonl"))
    L = math.log(97)
    assert res["n"] == 3 and res["acc"] == res["acc_norm"] == res["acc_bytes"] == pytest.approx(2 / 3)
    assert [p["acc"] for p in res["picks"]] == [0, 0, 1] and [p["acc_norm"] for p in res["picks"]] == [1, 1, 1]
    assert res["scores"] == [pytest.approx([-L, -2 * L], rel=1e-5)] * 2 + [pytest.approx([-3 * L, -L], rel=1e-5)]


def test_batched_scores_equal_token_by_token_log_probs(tmp_path):
    """Padding and offsets: the batched score of each choice equals the sum of log P(token | prefix) computed
    one prefix at a time."""
    model = make_checkpoint(tmp_path / "ckpt", "lns")
    scorer = load_scorer(tmp_path / "ckpt", "cpu")
    tok = word_tokenizer()
    question, choices = "what color is the sky", ["blue", "very dark blue", "a"]
    got = choice_logprobs(scorer, question, choices)
    eot = tok.token_to_id("<|endoftext|>")
    for score, choice in zip(got, choices):
        ids = [eot] + tok.encode(question).ids
        total = 0.0
        for t in tok.encode(choice).ids:
            with torch.no_grad():
                total += torch.log_softmax(model(torch.tensor([ids]))[0, -1], -1)[t].item()
            ids.append(t)
        assert score == pytest.approx(total, abs=1e-4)


def test_checkpoint_and_its_export_score_the_same(tmp_path):
    make_checkpoint(tmp_path / "ckpt", "lns")
    task = write_task(tmp_path / "t.jsonl")
    ours = evaluate_tasks(tmp_path / "ckpt", task, "cpu")
    theirs = evaluate_tasks(export(tmp_path / "ckpt", tmp_path / "hf"), task, "cpu")
    assert ours["acc"] == theirs["acc"] and ours["acc_norm"] == theirs["acc_norm"]
    for a, b in zip(ours["scores"], theirs["scores"]):
        assert a == pytest.approx(b, abs=1e-4)


def test_eval_cli_with_tasks_on_both_kinds_of_model(uniform_checkpoint, tmp_path, capsys):
    task = write_task(tmp_path / "t.jsonl")
    export(uniform_checkpoint, tmp_path / "hf")
    for model in (uniform_checkpoint, tmp_path / "hf"):
        assert main(["eval", "tasks", str(model), "--tasks", str(task), "--device", "cpu"]) == 0
        assert "3 questions  acc 0.6667  acc_norm 0.6667" in capsys.readouterr().out


@pytest.mark.parametrize("line,match", [
    ("not json", "not JSON"),
    ('{"question": "q", "choices": ["a"], "answer": 0}', "at least two"),
    ('{"question": "q", "choices": ["a", "b"], "answer": 2}', "0-based index"),
    ('{"choices": ["a", "b"], "answer": 0}', "string 'question'"),
])
def test_malformed_task_lines_are_reported_with_their_line_number(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(TASK[0]) + "\n" + line + "\n")
    with pytest.raises(UserError, match=rf"bad.jsonl:2: .*{match}"):
        read_tasks(path)


def test_missing_task_file_is_a_one_line_cli_error(uniform_checkpoint, tmp_path, capsys):
    assert main(["eval", "tasks", str(uniform_checkpoint), "--tasks", str(tmp_path / "nope.jsonl")]) == 2
    assert capsys.readouterr().err.startswith("depthlab: error: cannot read task file")


def test_a_choice_without_tokens_is_refused_not_scored_zero(uniform_checkpoint, tmp_path):
    task = write_task(tmp_path / "t.jsonl", [{"question": "the sky", "choices": ["red", "   "], "answer": 0}])
    with pytest.raises(UserError, match="encodes to no tokens"):
        evaluate_tasks(uniform_checkpoint, task)
