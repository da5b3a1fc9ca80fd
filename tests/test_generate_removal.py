"""Layer removal scored by generation (depthlab.eval.generate, depthlab.analysis.generation) on tiny random HF
Llamas: the tokens are those of `prune` and transformers' greedy `generate`, an identity block changes no
generation, a real block does; the task families and their specs."""

import copy
import json

import numpy as np
import pytest
import torch

from depthlab import UserError
from depthlab.cli import main
from depthlab.eval.gen_tasks import read_task
from depthlab.eval.generate import GenQuestion, Greedy, Removal, encode_pair, generation_sweep, score_generation
from tests.test_analysis_support import TEXT, save_hf_model, tiny_hf_model

transformers = pytest.importorskip("transformers")


def prompts(n: int = 4, length: int = 10, seed: int = 1) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(1, 300, (length,), generator=g).tolist()) for _ in range(n)]


def identity_block(model, l: int) -> None:
    """HF block l adds nothing: both residual branches end in a zeroed projection."""
    blk = model.model.layers[l]
    torch.nn.init.zeros_(blk.self_attn.o_proj.weight)
    torch.nn.init.zeros_(blk.mlp.down_proj.weight)


def hf_greedy(model, prompt, n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def from_record(g, prompt, removal, want, answer) -> list[int]:
    """The removal's tokens from the model's own record of (prompt, answer), checked against `want`, its tokens
    decoded from scratch: they are want's up to its first that is not the answer's (all of want when none is)."""
    q = GenQuestion(prompt, tuple(answer))
    got = g.generate_from(g.record(q), q, removal)
    parts = next((i for i, (a, b) in enumerate(zip(want, answer)) if a != b), len(want) - 1)
    assert got == want[:parts + 1]
    return got


def test_generation_with_a_block_removed_is_prune_then_transformers_generate():
    from depthlab.hf.pruning import drop_layers

    model = tiny_hf_model("llama", n_layers=5)
    g = Greedy(model, eos={model.generation_config.eos_token_id})
    for prompt in prompts():
        own = hf_greedy(model, prompt, 8)
        assert own == g.generate(prompt, 8) == g.record(GenQuestion(prompt, tuple(own))).tokens
        for removed in ({0}, {1}, {2}, {3}, {4}, {1, 2}):
            pruned = drop_layers(copy.deepcopy(model), sorted(removed))
            want = hf_greedy(pruned, prompt, 8)
            removal = Removal(frozenset(removed))
            assert g.generate(prompt, 8, removal) == want  # from scratch
            assert from_record(g, prompt, removal, want, want) == want  # the answer is the pruned model's own
            from_record(g, prompt, removal, want, own)  # the model's own: up to where the removal parts from it
    assert hf_greedy(model, prompts()[0], 8) == g.generate(prompts()[0], 8)  # the model is left as it was


def test_an_eos_token_before_the_answers_end_loses_it():
    """Generation stops at an eos token, as `generate` does: an answer that holds one before its last token is
    never matched, one that ends with it is."""
    model = tiny_hf_model("llama", n_layers=4)
    prompt = prompts(1)[0]
    own = Greedy(model).generate(prompt, 6)
    eos = [own[2]]
    qs = [GenQuestion(prompt, tuple(own)), GenQuestion(prompt, tuple(own[:3]))]
    removals = {l: Removal(frozenset({l})) for l in range(4)}
    base, outcomes = generation_sweep(model, qs, removals, eos)
    assert base == [False, True] == score_generation(model, qs, eos=eos)
    assert all(outcomes[l] == score_generation(model, qs, [l], eos) for l in range(4))


def test_an_identity_block_changes_no_generation_and_a_real_block_does():
    """... and the sweep runs the model once a question and once a removal, with no decode steps."""
    model = tiny_hf_model("llama", n_layers=4)
    identity_block(model, 2)
    g = Greedy(model)
    questions = [GenQuestion(p, tuple(g.generate(p, 6))) for p in prompts(6)]  # the model's own answers
    removals = {l: Removal(frozenset({l})) for l in range(4)}
    calls = []
    hook = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    base, outcomes = generation_sweep(model, questions, removals)
    hook.remove()
    assert len(calls) == len(questions) * (1 + len(removals))
    assert all(base) and outcomes[2] == base
    assert not all(outcomes[1])
    assert score_generation(model, questions, [2]) == base and score_generation(model, questions, [1]) == outcomes[1]


def test_a_zeroed_sublayer_is_generated_with_its_hook():
    """A sublayer zeroed by a patch (analysis's LayeredLM.without) over the record equals it from scratch."""
    from depthlab.analysis.layers import from_hf

    model = tiny_hf_model("llama", n_layers=4)
    lm = from_hf(model, "llama")
    g = Greedy(model)
    for prompt in prompts(3):
        own = g.generate(prompt, 6)
        for part in ("attn", "mlp"):
            removal = Removal(first=2, patch=lambda part=part: lm.without(2, part))
            want = g.generate(prompt, 6, removal)
            assert from_record(g, prompt, removal, want, want) == want
            from_record(g, prompt, removal, want, own)


@pytest.mark.slow
def test_analyze_scores_removal_by_generation(tmp_path):
    """The CLI on an HF directory: the model's own greedy answers (those that survive a round trip through the
    tokenizer) are all right; removing the planted identity block loses none, a real block loses some, with the
    paired test of task removal; every plan kind is scored, and the per-question outcomes are kept."""
    hf = save_hf_model(tmp_path / "hf", "llama")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf)
    identity_block(model, 2)
    model.save_pretrained(hf)
    tok = transformers.AutoTokenizer.from_pretrained(hf)
    g = Greedy(model)
    pairs = []
    for i in range(40):
        prompt = f"def f{i}(x):\n    return x *"
        own = g.generate(tok(prompt)["input_ids"], 2)
        q = encode_pair(lambda s: tok(s)["input_ids"], prompt, tok.decode(own))
        if q == GenQuestion(tuple(tok(prompt)["input_ids"]), tuple(own)):
            pairs.append({"prompt": prompt, "answer": tok.decode(own)})
    assert len(pairs) >= 4
    (tmp_path / "own.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    (tmp_path / "t.txt").write_text(TEXT)
    mc = [{"question": f"def f{i}(x):\n    return x *", "choices": [str(i), "x", "line"], "answer": i % 3}
          for i in range(6)]
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(q) + "\n" for q in mc))
    assert main(["analyze", str(hf), "--data", str(tmp_path / "t.txt"), "--tokens", "64", "--seq-len", "32",
                 "--no-jacobian", "--no-progress", "--sublayers", "--out", str(tmp_path / "a"),
                 "--removal-tasks", str(tmp_path / "mc.jsonl"),
                 "--removal-generate", str(tmp_path / "own.jsonl"), "add:n=3,digits=2"]) == 0
    res = json.loads((tmp_path / "a" / "metrics.json").read_text())
    own = res["generate_removal"]["tasks"]["own"]
    assert own["n"] == len(pairs) and own["base_acc"] == 1.0
    single = {r["block"]: r for r in own["single"]}
    assert single[3]["acc"] == 1.0 and single[3]["lost"] == 0 and single[3]["drop_p"] == 1.0
    assert single[2]["lost"] > 0 and single[2]["acc"] < 1.0 and 0 < single[2]["drop_ci"][1]
    assert {"attn", "mlp", "runs"} <= set(own) and "ll" not in single[1]
    assert own["per_question"]["right"][0] == [1] * len(pairs) and len(own["per_question"]["right"]) == 5
    assert res["data"]["generate"] == {"own": len(pairs), "add:n=3,digits=2": 3}
    # the three profiles side by side: per block, their rank correlations with bootstrap intervals, and a figure
    prof = res["profiles"]
    assert set(prof["profiles"]) == {"loss", "choice", "generation"} and prof["units"]["generation"] == len(pairs) + 3
    assert prof["profiles"]["loss"] == pytest.approx([r["delta_loss"] for r in res["removal"]["single"]], abs=1e-5)
    mc_single = res["task_removal"]["tasks"]["mc"]["single"]
    assert prof["profiles"]["choice"] == pytest.approx([r["ll_drop"] for r in mc_single], abs=1e-5)
    assert [(c["a"], c["b"]) for c in prof["correlations"]] == [("loss", "choice"), ("loss", "generation"),
                                                                ("choice", "generation")]
    assert (tmp_path / "a" / "removal_profiles.png").stat().st_size > 1000
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "removal_profiles.png").stat().st_size > 1000
    assert (tmp_path / "c" / "generate_removal.png").stat().st_size > 1000


def test_profile_correlations_and_their_bootstrap():
    from scipy.stats import spearmanr

    from depthlab.analysis.profiles import removal_profiles

    g = np.random.default_rng(0)
    loss = g.normal(size=(30, 6)) + np.arange(6)  # windows x blocks: cost rising with depth
    right = (g.random((40, 7)) < np.r_[0.9, np.linspace(0.9, 0.1, 6)]).astype(int)  # model itself, then blocks
    res = {"removal": {"windows": {"single_delta": loss.T.tolist(), "count": [1] * 30}},
           "generate_removal": {"tasks": {"t": {"per_question": {"right": right.T.tolist()}}}}}
    prof = removal_profiles(res, bootstrap=200)
    gen = (right[:, :1] - right[:, 1:]).mean(0)
    assert prof["profiles"]["generation"] == pytest.approx(gen.tolist())
    (c,) = prof["correlations"]
    assert c["rho"] == pytest.approx(spearmanr(loss.mean(0), gen).statistic)
    assert c["ci"][0] <= c["rho"] <= c["ci"][1] and c["replicates"] == 200
    res["generate_removal"]["tasks"]["t"]["per_question"]["right"] = [[1] * 40] * 7  # no answer changes
    (c,) = removal_profiles(res, bootstrap=20)["correlations"]
    assert c["rho"] is None and c["ci"] is None


def test_task_families_are_seeded_and_sized(tmp_path):
    a, b = read_task("add:digits=4,n=7,seed=3"), read_task("add:digits=4,n=7,seed=3")
    assert a.pairs == b.pairs and len(a.pairs) == 7 and a.pairs != read_task("add:digits=4,n=7,seed=4").pairs
    prompt, answer = a.pairs[0]
    x, y = prompt.splitlines()[-1].rstrip("=").split("+")
    assert len(x) == len(y) == 4 and int(answer) == int(x) + int(y) and prompt.count("\n") == 3  # 3 shots
    prompt, answer = read_task("copy:len=5,n=2,shots=0").pairs[0]
    assert prompt == f"copy:{answer} ->" and len(answer) == 6
    prompt, answer = read_task("brackets:depth=3,n=2,shots=0").pairs[0]
    assert len(prompt.split()) == 4 and len(answer.split()) == 3
    (tmp_path / "t.txt").write_text("one two  three\nfour five six seven")
    pairs = read_task(f"continue:{tmp_path}/t.txt,words=2,answer=2,n=3").pairs
    assert ("one two", "  three\nfour") in pairs and len(set(pairs)) == 3
    (tmp_path / "p.jsonl").write_text('{"prompt": "a", "answer": "b"}\n\n{"prompt": "", "answer": " c"}\n')
    task = read_task(str(tmp_path / "p.jsonl"))
    assert task.name == "p" and task.pairs == [("a", "b"), ("", " c")]


@pytest.mark.parametrize("spec,msg", [
    ("mul:n=3", "unknown generation task 'mul:n=3'"),
    ("add:n=0", "n must be a whole number of at least 1"),
    ("copy:width=3", "'width=3' is not one of len=N, n=N, seed=N, shots=N"),
    ("continue:", "continue needs a text file"),
    ("continue:{tmp}/missing.txt", "cannot read generation task file"),
    ("continue:{tmp}/short.txt,n=5", "too few for 5 places"),
    ("{tmp}/bad.jsonl", "bad.jsonl:2: expected"),
])
def test_bad_task_specs_are_one_line(tmp_path, spec, msg):
    (tmp_path / "short.txt").write_text("a b c")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "a"}\n')
    with pytest.raises(UserError, match=msg.replace("(", r"\(")):
        read_task(spec.replace("{tmp}", str(tmp_path)))


def test_encode_pair_splits_where_the_prompt_ends():
    codes = {"ab": [1], "abc": [1, 2], "abcd": [1, 3]}  # "cd" is one token: the prompt "abc" ends before it
    assert encode_pair(codes.get, "abc", "d") == GenQuestion((1,), (3,))
    assert encode_pair(codes.get, "ab", "c") == GenQuestion((1,), (2,))


def test_questions_past_the_models_context_are_warned_in_one_line():
    """Issue 60: a 2,414-token prompt on a 128-token model was scored without a word. tiny_hf_model's context is
    64 tokens: a task whose question needs more positions is named in one warning; one that fits says nothing."""
    import warnings

    from depthlab.analysis.generation import generation_removal
    from depthlab.analysis.layers import from_hf

    lm = from_hf(tiny_hf_model("llama", n_layers=2), "llama")
    fits, long = GenQuestion(tuple(range(1, 60)), (5, 6)), GenQuestion(tuple(range(1, 70)), (5, 6))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generation_removal(lm, {"short": [fits], "long": [fits, long]}, [])
    said = [str(w.message) for w in caught]
    assert said == ["--removal-generate task long: 1 of its 2 questions run past the model's context of 64 tokens "
                    "(prompt and answer up to 70 tokens); their scores are of positions the model was not trained "
                    "at: fewer shots or words keep them in"], said
