import copy
import json

import pytest
import torch
from torch import nn

from depthlab import UserError
from depthlab.cli import main
from depthlab.hf import prune, prune_layers
from depthlab.hf.pruning import parse_span
from tests.test_hf_fixtures import make_checkpoint, tiny_hf


def skip_layers(model, removed):
    """The original model with the removed layers swapped for identities: what the pruned model must compute."""
    class Skip(nn.Module):
        def forward(self, hidden_states, *args, **kwargs):
            return hidden_states

    layers = model.model.layers
    for i in removed:
        layers[i] = Skip()
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2", "olmo2"])
def test_pruned_model_computes_the_model_without_those_layers_and_generates(family, tmp_path):
    hf = tiny_hf(family, n_layers=6)
    hf.save_pretrained(tmp_path / "src")
    out = prune(tmp_path / "src", 2, 4, tmp_path / "out")
    from transformers import AutoModelForCausalLM

    small = AutoModelForCausalLM.from_pretrained(out).eval()
    assert small.config.num_hidden_layers == 4 and len(small.model.layers) == 4
    assert [layer.self_attn.layer_idx for layer in small.model.layers] == [0, 1, 2, 3]
    ids = torch.randint(1, 97, (2, 12))
    with torch.no_grad():
        want = skip_layers(hf, [2, 3])(ids).logits
        assert (small(ids).logits - want).abs().max() < 1e-5
    # greedy decoding with the KV cache (indexed by layer_idx) must equal decoding without it
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    cached = small.generate(ids[:1], use_cache=True, **kw)
    uncached = small.generate(ids[:1], use_cache=False, **kw)
    assert cached.shape == (1, 18) and torch.equal(cached, uncached)


def test_in_memory_pruning_renumbers_the_kv_cache_index():
    hf = tiny_hf("llama", n_layers=6)
    ids = torch.randint(1, 97, (1, 12))
    with torch.no_grad():
        want = skip_layers(copy.deepcopy(hf), [1, 2])(ids).logits
    prune_layers(hf, 1, 3)
    assert [layer.self_attn.layer_idx for layer in hf.model.layers] == [0, 1, 2, 3]
    with torch.no_grad():
        assert (hf(ids).logits - want).abs().max() < 1e-5
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(hf.generate(ids, use_cache=True, **kw), hf.generate(ids, use_cache=False, **kw))


def test_per_layer_config_fields_follow_the_kept_layers():
    types = ["full_attention", "sliding_attention"] * 3
    hf = tiny_hf("qwen2", n_layers=6, use_sliding_window=True, sliding_window=8, max_window_layers=3,
                 layer_types=types)
    prune_layers(hf, 1, 3)  # keep 0, 3, 4, 5
    assert hf.config.layer_types == [types[i] for i in (0, 3, 4, 5)]
    assert hf.config.max_window_layers == 1  # of the kept layers only layer 0 was below 3
    assert hf.config.num_hidden_layers == 4


def test_prune_a_depthlab_checkpoint_through_export(tmp_path, capsys):
    make_checkpoint(tmp_path / "ckpt", "lns")
    assert main(["prune", str(tmp_path / "ckpt"), "--remove", "3:4", str(tmp_path / "out")]) == 0
    assert "model.layers.3..3" in capsys.readouterr().out
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3 and (tmp_path / "out" / "tokenizer.json").is_file()


@pytest.mark.parametrize("span", ["2:2", "0:4", "3:9", "-1:2", "-5:", ":", "-4:"])
def test_bad_spans_are_refused(span):
    with pytest.raises(UserError, match="cannot remove"):
        prune_layers(tiny_hf("llama"), *parse_span(span))


@pytest.mark.parametrize("spelled, removed", [(["--remove", "-1:"], [3]), (["--remove=-1:"], [3]),
                                              (["--remove", "-3:-1"], [1, 2]), (["--remove", ":1"], [0])])
def test_spans_counted_from_the_end_or_left_open_prune_those_layers(tmp_path, capsys, spelled, removed):
    """START:END is a Python slice of the layers: `--remove -1:` drops the last one (argparse read -1: as an option
    and said "expected one argument"), `:1` the first."""
    tiny_hf("llama", n_layers=4).save_pretrained(tmp_path / "src")
    assert main(["prune", str(tmp_path / "src"), *spelled, str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert f"removed model.layers.{removed[0]}..{removed[-1]} " in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "depthlab_export.json").read_text())["removed_layers"] == removed
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_hidden_layers"] == 4 - len(removed)


def test_bad_span_syntax_on_the_cli(tmp_path, capsys):
    assert main(["prune", str(tmp_path / "model"), "--remove", "3-4", str(tmp_path / "out")]) == 2
    assert "START:END" in capsys.readouterr().err


def test_pruned_lns_model_keeps_each_kept_layer_its_own_scale(tmp_path):
    from depthlab.hf import apply_scheme, load_pretrained

    hf = apply_scheme(tiny_hf("llama", n_layers=6), "lns")
    hf.save_pretrained(tmp_path / "src")
    raw_last = hf.model.layers[5].input_layernorm.weight.detach().clone()
    prune(tmp_path / "src", 1, 3, tmp_path / "out")
    back = load_pretrained(tmp_path / "out").eval()
    assert back.config.depthlab_layer_scales == pytest.approx([1, 4 ** -0.5, 5 ** -0.5, 6 ** -0.5])
    assert torch.allclose(back.model.layers[3].input_layernorm.weight, raw_last, rtol=1e-6)  # unfolded with 1/sqrt(6)
    ids = torch.randint(1, 97, (2, 12))
    with torch.no_grad():
        want = skip_layers(hf.eval(), [1, 2])(ids).logits
        assert (back(ids).logits - want).abs().max() < 1e-5


@pytest.mark.slow
def test_drop_lowest_prunes_the_analysis_choice_and_says_what_it_measured(tmp_path, capsys):
    """analyze ranks the blocks and scores the model without its k least useful; prune --drop-lowest writes that
    model, whose own loss and task accuracy are the ones the analysis measured."""
    from depthlab.eval.multiple_choice import evaluate_tasks, load_scorer
    from tests.test_analysis_support import hf_model_text_and_tasks

    hf, common, _ = hf_model_text_and_tasks(tmp_path)
    assert main(["analyze", str(hf), *common, "--removal-tasks", str(tmp_path / "mc.jsonl"), "--drop-lowest", "2",
                 "--out", str(tmp_path / "a")]) == 0
    res = json.loads((tmp_path / "a" / "metrics.json").read_text())
    for by in ("loss", "tasks"):
        out = tmp_path / f"pruned_{by}"
        capsys.readouterr()
        assert main(["prune", str(hf), str(out), "--drop-lowest", "2", "--by", by, "--analysis",
                     str(tmp_path / "a")]) == 0
        printed = capsys.readouterr().out
        dropped = sorted(res["usefulness"][by][:2])
        assert f"removed blocks {dropped[0]} {dropped[1]}" in printed and "the analysis measured" in printed
        assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
        measured = res["removal"]["drop"][by][1]
        assert measured["k"] == 2 and f"loss {measured['loss']:.4f}" in printed
        assert main(["analyze", str(out), *common, "--out", str(tmp_path / f"b_{by}")]) == 0
        # the pruned model's own loss on the same windows, and its accuracy on the questions, are the measured ones
        own = json.loads((tmp_path / f"b_{by}" / "metrics.json").read_text())["removal"]["base_loss"]
        assert own == pytest.approx(measured["loss"], rel=1e-5)
        task = res["task_removal"]["tasks"]["mc"]["drop"][by][1]
        assert evaluate_tasks(load_scorer(out, "cpu"), tmp_path / "mc.jsonl")["acc"] == task["acc"]


def test_drop_lowest_refuses_a_missing_or_foreign_analysis(tmp_path, capsys):
    from tests.test_analysis_support import save_hf_model

    hf = save_hf_model(tmp_path / "hf", "llama")
    (tmp_path / "notes").mkdir()
    assert main(["prune", str(hf), str(tmp_path / "o"), "--drop-lowest", "1", "--analysis", str(tmp_path / "notes")]) \
        == 2
    assert "holds no analysis" in capsys.readouterr().err
    assert main(["prune", str(hf), str(tmp_path / "o"), "--remove", "1:2", "--by", "loss"]) == 2
    assert "--by goes with --drop-lowest" in capsys.readouterr().err
    assert main(["prune", str(hf), str(tmp_path / "o")]) == 2
    assert "one of --remove START:END and --drop-lowest K" in capsys.readouterr().err
    assert main(["prune", str(tmp_path / "typo"), str(tmp_path / "o"), "--drop-lowest", "1"]) == 2
    assert "model path" in (err := capsys.readouterr().err) and "does not exist" in err  # not its missing analysis
