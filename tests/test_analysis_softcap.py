"""Analysis of models whose logits are not head(final_norm(h)): Gemma-2's soft cap (logits = cap * tanh(z / cap)),
Cohere's and Granite's logit scales, a depthlab Gemma-2. The logit lens, removal's loss and task removal read the
stream through the model's own transform, and equal the model's own numbers; anything else is still refused."""

import copy
import json

import pytest
import torch

from depthlab import UserError
from depthlab.analysis.analyze import Options, analyze
from depthlab.analysis.layers import from_depthlab, from_hf
from depthlab.analysis.removal import next_token_nll
from depthlab.cli import main
from depthlab.hf.pruning import drop_layers
from tests.test_analysis_support import TEXT, random_batches, tiny_tokenizer
from tests.test_hf_fixtures import tiny_hf

transformers = pytest.importorskip("transformers")

CAP = 2.0  # tests/families.py's Gemma-2: final_logit_softcapping 2.0


def spread(model):
    """Matrices N(0, 0.2): logits large enough for a cap of 2 to act, blocks that do visible work."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    return model


def gemma2(vocab: int = 300, **kw):
    """The tiny random Gemma-2 of tests/families.py with N(0, 0.2) matrices: logits of std ~2.3, which a cap of 2
    saturates."""
    torch.manual_seed(0)
    return spread(tiny_hf("gemma2", vocab_size=vocab, **kw))


def scaled(family: str):
    """A tiny random Cohere (logits * logit_scale) or Granite (logits / logits_scaling)."""
    common = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    config = (transformers.CohereConfig(**common, logit_scale=4.0) if family == "cohere" else
              transformers.GraniteConfig(**common, logits_scaling=0.25))
    torch.manual_seed(0)
    return spread(transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval())


def own_loss(model, batches) -> float:
    """The HF model's own mean next-token loss over the batches."""
    tot = cnt = 0
    with torch.no_grad():
        for b in batches:
            s, c = next_token_nll(model(input_ids=b.ids).logits, b)
            tot, cnt = tot + s, cnt + c
    return tot / cnt


def test_the_cap_changes_the_random_models_logits_materially():
    model, b = gemma2(), random_batches(300, n=1)[0]
    with torch.no_grad():
        capped = model(input_ids=b.ids).logits
        model.config.final_logit_softcapping = None
        raw = model(input_ids=b.ids).logits
    assert raw.abs().max() > 3 * CAP and capped.abs().max() <= CAP
    shift = (raw.log_softmax(-1) - capped.log_softmax(-1)).abs().mean()
    assert shift > 0.5  # nats per vocabulary entry: the lens or a loss without the cap would be far off


@pytest.mark.parametrize("family", ["gemma2", "cohere", "granite"])
def test_lens_and_removal_read_the_models_own_logits(family):
    model = gemma2() if family == "gemma2" else scaled(family)
    batches = random_batches(300)
    lm = from_hf(model, family)
    res = analyze(lm, batches, Options(jacobian=False))
    want = {"gemma2": "soft-capped at 2", "cohere": "logits * 4", "granite": "logits / 0.25"}[family]
    assert lm.describe()["logits"] == want
    L = lm.n_layers
    # the lens at the last layer is the model's own prediction; at every layer, its head and transform on h_l
    assert res["lens"]["ce"][L] == pytest.approx(own_loss(model, batches), rel=1e-5)
    assert res["lens"]["kl"][L] == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        ce, n = [0.0] * L, 0
        for b in batches:
            n += next_token_nll(model(input_ids=b.ids).logits, b)[1]
            hs = model(input_ids=b.ids, output_hidden_states=True).hidden_states
            for l in range(L):
                z = model.lm_head(model.model.norm(hs[l]))
                z = {"gemma2": lambda z: torch.tanh(z / CAP) * CAP, "cohere": lambda z: z * 4.0,
                     "granite": lambda z: z / 0.25}[family](z)
                ce[l] += next_token_nll(z, b)[0]
    assert res["lens"]["ce"][:L] == pytest.approx([c / n for c in ce], rel=1e-5)
    # removing block l is the model without block l
    assert res["removal"]["base_loss"] == pytest.approx(own_loss(model, batches), rel=1e-5)
    for l in range(L):
        pruned = drop_layers(copy.deepcopy(model), [l])
        assert res["removal"]["single"][l]["loss"] == pytest.approx(own_loss(pruned, batches), rel=1e-5), l


def test_depthlab_gemma2_with_a_logit_cap():
    from depthlab.model import Transformer
    from tests.conftest import tiny_model_config

    torch.manual_seed(0)
    cfg = tiny_model_config(family="gemma2", norm_scheme="sandwich", logit_softcap=CAP, vocab_size=300)
    model = spread(Transformer(cfg).eval())
    batches = random_batches(300)
    lm = from_depthlab(model, "g2")
    res = analyze(lm, batches, Options(jacobian=False))
    assert lm.describe()["logits"] == "soft-capped at 2"

    def loss(m):
        with torch.no_grad():
            return sum(next_token_nll(m(b.ids), b)[0] for b in batches) / sum(
                next_token_nll(m(b.ids), b)[1] for b in batches)

    assert res["lens"]["ce"][-1] == pytest.approx(loss(model), rel=1e-5)
    for l in range(cfg.n_layers):
        pruned = copy.deepcopy(model)
        del pruned.layers[l]
        assert res["removal"]["single"][l]["loss"] == pytest.approx(loss(pruned), rel=1e-5), l


def save_gemma2(path, **kw):
    from depthlab.data.tokenizer import EOT

    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer(), eos_token=EOT, pad_token=EOT)
    gemma2(vocab=len(tok), **kw).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_mc(path):
    lines = [{"question": f"def f{i}(x):\n    return x * {i} +", "choices": [str(i % 7), "x", "line"], "answer": 0}
             for i in range(4)]
    path.write_text("\n".join(json.dumps(q) for q in lines) + "\n")
    return path


@pytest.mark.slow
def test_task_removal_equals_prune_then_eval_on_a_soft_capped_gemma2(tmp_path, capsys):
    from depthlab.eval.multiple_choice import evaluate_tasks, load_scorer
    from depthlab.hf import prune

    hf, mc = save_gemma2(tmp_path / "hf"), write_mc(tmp_path / "mc.jsonl")
    (tmp_path / "text.txt").write_text(TEXT)
    out = tmp_path / "out"
    assert main(["analyze", str(hf), "--data", str(tmp_path / "text.txt"), "--tokens", "64", "--seq-len", "32",
                 "--no-jacobian", "--no-progress", "--out", str(out), "--removal-tasks", str(mc)]) == 0
    res = json.loads((out / "metrics.json").read_text())
    assert res["model"]["logits"] == "soft-capped at 2"
    assert "logits soft-capped at 2" in capsys.readouterr().out  # said where a person reads it, and in the report
    assert "logits soft-capped at 2" in (out / "report.html").read_text()
    got = res["task_removal"]["tasks"]["mc"]
    base = evaluate_tasks(load_scorer(hf, "cpu"), mc)
    assert got["base_acc"] == base["acc"] and got["base_ll"] == pytest.approx(
        sum(s[0] for s in base["scores"]) / 4, abs=1e-4)
    for l in range(4):
        t = evaluate_tasks(load_scorer(prune(hf, l, l + 1, tmp_path / f"pruned{l}"), "cpu"), mc)
        row = got["single"][l]
        assert row["acc"] == t["acc"] and row["ll"] == pytest.approx(sum(s[0] for s in t["scores"]) / 4, abs=1e-4)


def both_modes(tmp_path, seq_len: int, **kw) -> tuple[dict, dict]:
    """Whole-model and layer-by-layer analyses of a saved Gemma-2 (kw: its config), with task removal on an MC file."""
    from depthlab.analysis.run import Request, run_request
    from depthlab.eval.suite import TaskSuite

    hf = save_gemma2(tmp_path / "hf", **kw)
    mc = write_mc(tmp_path / "mc.jsonl")
    (tmp_path / "t.txt").write_text(TEXT)
    opts = Options(jacobian=False, activation_mb=0)
    whole, layerwise = [run_request(Request(str(hf), [str(tmp_path / "t.txt")], tokens=64, seq_len=seq_len,
                                            layerwise=lw, options=opts, tasks=TaskSuite.read([mc], None, 0)))
                        for lw in (False, True)]
    assert layerwise["mode"] == "layer-by-layer"
    assert layerwise["lens"]["ce"] == pytest.approx(whole["lens"]["ce"], rel=1e-5)
    for a, b in zip(whole["removal"]["single"], layerwise["removal"]["single"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for a, b in zip(whole["task_removal"]["tasks"]["mc"]["single"],
                    layerwise["task_removal"]["tasks"]["mc"]["single"], strict=True):
        assert a["acc"] == b["acc"] and a["ll"] == pytest.approx(b["ll"], abs=1e-4)
    return whole, layerwise


def test_layer_by_layer_applies_the_cap_too(tmp_path):
    """Layer-by-layer mode on a Gemma-2 with full attention in every layer, capped: whole-model mode's numbers."""
    whole, layerwise = both_modes(tmp_path, 32, layer_types=["full_attention"] * 4)
    assert layerwise["model"]["logits"] == "soft-capped at 2"


def test_sliding_and_full_attention_differ_on_the_mixed_fixture():
    """The alternating Gemma-2 below (window 4, 16 tokens): its sliding layers really see fewer keys, so replaying
    every block with one kind's mask would move the logits."""
    b = random_batches(300, n=1, T=16)[0]
    with torch.no_grad():
        mixed = gemma2(sliding_window=4)(input_ids=b.ids).logits
        full = gemma2(sliding_window=4, layer_types=["full_attention"] * 4)(input_ids=b.ids).logits
        sliding = gemma2(sliding_window=4, layer_types=["sliding_attention"] * 4)(input_ids=b.ids).logits
    assert (mixed - full).abs().max() > 1 and (mixed - sliding).abs().max() > 1  # ~3.9 and ~4.0
    assert (mixed[:, :4] - full[:, :4]).abs().max() < 1e-5  # the first 4 positions see the same keys in both


def test_layer_by_layer_equals_whole_model_on_alternating_sliding_and_full_attention(tmp_path):
    """Gemma-2's layer_types alternate sliding_attention and full_attention: layer-by-layer mode runs each block
    with its own kind's mask and gives whole-model mode's lens, removal losses and task removal (both_modes), and
    its states and base loss."""
    whole, layerwise = both_modes(tmp_path, 16, sliding_window=4)
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert config.layer_types[:2] == ["sliding_attention", "full_attention"] and config.sliding_window == 4
    assert layerwise["lens"]["kl"] == pytest.approx(whole["lens"]["kl"], rel=1e-4, abs=1e-6)
    assert [s["variance"] for s in layerwise["states"]] == pytest.approx([s["variance"] for s in whole["states"]],
                                                                          rel=1e-5)
    assert layerwise["removal"]["base_loss"] == pytest.approx(whole["removal"]["base_loss"], rel=1e-5)


def test_other_mixes_of_block_kinds_are_refused_in_layer_by_layer_mode(tmp_path):
    from depthlab.analysis.run import Request, run_request

    hf = save_gemma2(tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    config["layer_types"] = ["linear_attention", "full_attention"] * 2  # blocks of another make, not just a mask
    (hf / "config.json").write_text(json.dumps(config))
    (tmp_path / "t.txt").write_text(TEXT)
    with pytest.raises(UserError, match=r"blocks of different kinds \(full_attention, linear_attention\); "
                                        "layer-by-layer mode takes a mix of full_attention and sliding_attention "
                                        "only, use whole-model mode"):
        run_request(Request(str(hf), [str(tmp_path / "t.txt")], tokens=64, seq_len=32, layerwise=True))


def test_logits_the_analysis_cannot_reproduce_are_refused_in_one_line():
    lm = from_hf(gemma2(), "shifted")
    inner = lm.forward_fn
    lm.forward_fn = lambda ids, mask: inner(ids, mask) + 0.1  # something the config does not say
    b = random_batches(300, n=1)[0]
    with pytest.raises(UserError) as e:
        lm.discover(b.ids, b.mask)
    msg = str(e.value)
    assert "\n" not in msg and "does not reproduce the model's logits" in msg
    assert "logit transforms tried: soft-capped at 2; none" in msg
