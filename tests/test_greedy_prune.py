"""`prune --drop-lowest K --greedy`: blocks removed one at a time, every remaining block scored again after each
removal (depthlab.analysis.greedy), beside the one-shot ranking's choice at each k; on tiny random HF Llamas."""

import copy
import json

import pytest
import torch

from depthlab.cli import main
from tests.test_analysis_support import TEXT, save_hf_model

WINDOWS = ["--tokens", "64", "--seq-len", "32"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A 6-block HF Llama, a text to score on, a multiple-choice task file, and analyze's ranking of its blocks."""
    tmp = tmp_path_factory.mktemp("greedy")
    hf = save_hf_model(tmp / "hf", "llama", n_layers=6)
    (tmp / "t.txt").write_text(TEXT)
    lines = [{"question": f"def f{i}(x):\n    return x *", "choices": [str(i), "x", "line"], "answer": i % 3}
             for i in range(6)]
    (tmp / "mc.jsonl").write_text("\n".join(json.dumps(q) for q in lines) + "\n")
    assert main(["analyze", str(hf), "--data", str(tmp / "t.txt"), *WINDOWS, "--no-jacobian", "--no-progress",
                 "--removal-tasks", str(tmp / "mc.jsonl"), "--out", str(tmp / "a")]) == 0
    return tmp, hf, json.loads((tmp / "a" / "metrics.json").read_text())


def greedy(tmp, hf, out: str, by: str, *scoring: str) -> dict:
    assert main(["prune", str(hf), str(tmp / out), "--drop-lowest", "3", "--greedy", "--by", by, *scoring]) == 0
    return json.loads((tmp / out / "greedy_pruning.json").read_text())


@pytest.mark.slow
def test_greedy_by_loss_starts_with_the_one_shot_best_block_and_writes_the_model_of_its_steps(world, capsys):
    tmp, hf, res = world
    record = greedy(tmp, hf, "by_loss", "loss", "--data", str(tmp / "t.txt"), *WINDOWS)
    printed = capsys.readouterr().out
    order = res["usefulness"]["loss"]
    assert record["one_shot_order"] == order and record["by"] == "loss" and len(record["steps"]) == 3
    first = record["steps"][0]
    assert first["greedy"]["blocks"] == first["one_shot"]["blocks"] == [order[0]]
    assert first["greedy"]["loss"] == pytest.approx(res["removal"]["single"][order[0] - 1]["loss"], rel=1e-6)
    assert record["base"]["loss"] == pytest.approx(res["removal"]["base_loss"], rel=1e-6)
    for k, step in enumerate(record["steps"], 1):
        assert step["one_shot"]["blocks"] == sorted(order[:k]) and len(step["greedy"]["blocks"]) == k
        assert set(record["steps"][k - 2]["greedy"]["blocks"]) < set(step["greedy"]["blocks"]) or k == 1
    removed = record["removed"]
    assert removed == record["steps"][-1]["greedy"]["blocks"]
    assert f"removed blocks {' '.join(map(str, removed))} " in printed and "one-shot loss" in printed
    assert json.loads((tmp / "by_loss" / "depthlab_export.json").read_text())["removed_layers"] == \
        [b - 1 for b in removed]
    # the written model: loads in transformers, computes the model with those blocks pruned directly, and its own
    # loss on the same windows is the last step's
    from transformers import AutoModelForCausalLM

    from depthlab.hf import load_pretrained
    from depthlab.hf.pruning import drop_layers

    small = AutoModelForCausalLM.from_pretrained(tmp / "by_loss").eval()
    direct = drop_layers(load_pretrained(hf).eval(), [b - 1 for b in removed])
    ids = torch.randint(1, 200, (2, 16))
    with torch.no_grad():
        assert torch.equal(small(ids).logits, direct(ids).logits)
    assert main(["analyze", str(tmp / "by_loss"), "--data", str(tmp / "t.txt"), *WINDOWS, "--no-jacobian",
                 "--no-progress", "--out", str(tmp / "b")]) == 0
    own = json.loads((tmp / "b" / "metrics.json").read_text())["removal"]["base_loss"]
    assert own == pytest.approx(record["steps"][-1]["greedy"]["loss"], rel=1e-5)


def test_greedy_by_tasks_starts_with_the_one_shot_best_block_and_scores_as_eval(world, capsys):
    from depthlab.eval.multiple_choice import evaluate_tasks, load_scorer

    tmp, hf, res = world
    record = greedy(tmp, hf, "by_tasks", "tasks", "--tasks", str(tmp / "mc.jsonl"))
    order = res["usefulness"]["tasks"]
    assert record["one_shot_order"] == order and len(record["steps"]) == 3
    assert record["steps"][0]["greedy"]["blocks"] == record["steps"][0]["one_shot"]["blocks"] == [order[0]]
    assert record["base"]["acc"] == res["task_removal"]["tasks"]["mc"]["base_acc"]
    assert "one-shot acc" in capsys.readouterr().out
    last = record["steps"][-1]["greedy"]
    assert evaluate_tasks(load_scorer(tmp / "by_tasks", "cpu"), tmp / "mc.jsonl")["acc"] == last["acc"]


def test_every_candidate_of_a_later_step_is_scored_as_the_model_without_those_blocks():
    """The replay from the stream of the model without the blocks already removed equals running the smaller model:
    each of step 2's candidates against the model with both blocks dropped, on the same windows."""
    from depthlab.analysis.calibration import Batch
    from depthlab.analysis.greedy import LossScorer, greedy_removal, key_of
    from depthlab.analysis.layers import from_hf
    from depthlab.analysis.removal import next_token_nll
    from depthlab.hf.pruning import drop_layers
    from tests.test_analysis_support import tiny_hf_model

    hf = tiny_hf_model("llama", n_layers=5)
    torch.manual_seed(1)
    batches = [Batch(torch.randint(1, 300, (2, 12)), torch.ones(2, 12, dtype=torch.bool)) for _ in range(2)]
    lm = from_hf(copy.deepcopy(hf), "tiny")
    lm.discover(batches[0].inputs, batches[0].mask)
    scorer = LossScorer(lm, batches)
    record = greedy_removal(scorer, 2)
    first = record["steps"][0]["greedy"]["blocks"][0] - 1
    for b in set(range(5)) - {first}:
        small = drop_layers(copy.deepcopy(hf), [first, b])
        with torch.no_grad():
            nll = [next_token_nll(small(input_ids=x.inputs).logits, x) for x in batches]
        want = sum(s for s, _ in nll) / sum(c for _, c in nll)
        assert scorer.metrics(frozenset({first, b}))["loss"] == pytest.approx(want, rel=1e-5), b
    best = min(set(range(5)) - {first}, key=lambda b: scorer.sums.loss[key_of(frozenset({first, b}))])
    assert record["removed"] == sorted([first + 1, best + 1])


def test_greedy_by_generation_starts_with_the_one_shot_best_block_and_scores_as_decoding_the_pruned_model(world):
    """By exact match of greedy decoding, on answers the model itself gives (so its own accuracy is 1): the first
    step is the single removal `analyze --removal-generate` finds cheapest, and the written model, decoded by
    depthlab.eval.generate from scratch, scores the last step's accuracy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from depthlab.eval.generate import Greedy, encode_pair, eos_of, score_generation

    tmp, hf, _ = world
    model, tok = AutoModelForCausalLM.from_pretrained(hf).eval(), AutoTokenizer.from_pretrained(hf)
    encode = lambda s: tok(s)["input_ids"]  # noqa: E731
    prompts = [f"def f{i}(x):\n    return x *" for i in range(24)]
    own = {p: Greedy(model, eos_of(model)).generate(encode(p), 2) for p in prompts}
    pairs = [(p, tok.decode(a)) for p, a in own.items() if encode_pair(encode, p, tok.decode(a)).answer == tuple(a)]
    assert len(pairs) >= 4  # answers that survive the round trip through the tokenizer
    (tmp / "own.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in pairs))
    assert main(["analyze", str(hf), "--data", str(tmp / "t.txt"), *WINDOWS, "--no-jacobian", "--no-progress",
                 "--removal-generate", str(tmp / "own.jsonl"), "--out", str(tmp / "a_gen")]) == 0
    scored = json.loads((tmp / "a_gen" / "metrics.json").read_text())["generate_removal"]["tasks"]["own"]
    best = min(scored["single"], key=lambda r: (r["acc_drop"], r["block"]))["block"]
    record = greedy(tmp, hf, "by_generate", "generate", "--generate", str(tmp / "own.jsonl"))
    assert record["base"]["acc"] == scored["base_acc"] == 1.0 and record["one_shot_order"][0] == best
    assert max(r["acc_drop"] for r in scored["single"]) > 0  # some removal changes answers
    assert record["steps"][0]["greedy"]["blocks"] == record["steps"][0]["one_shot"]["blocks"] == [best]
    small = AutoModelForCausalLM.from_pretrained(tmp / "by_generate").eval()
    right = score_generation(small, [encode_pair(encode, p, a) for p, a in pairs], eos=eos_of(small))
    assert sum(right) / len(right) == record["steps"][-1]["greedy"]["acc"]
