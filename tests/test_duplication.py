"""Layer duplication (issue 52 item 3): `analyze --duplicate MAX_SPAN` scores every span i..j run twice from the
cached stream after block j, and `depthlab duplicate MODEL --span START:END OUT` writes that model as a stock HF
directory. Both must compute the same thing, and the cached scan the same as evaluating each duplicated model."""

from __future__ import annotations

import json

import pytest
import torch

from depthlab import UserError
from depthlab.analysis.calibration import Batch
from depthlab.analysis.duplication import duplicate_plans, duplication_scan, naive_scan
from depthlab.analysis.layers import from_hf
from depthlab.analysis.removal import Plan, replay
from depthlab.cli import main
from depthlab.hf.pruning import duplicate, duplicate_layers, layer_span, parse_span
from tests.test_hf_fixtures import tiny_hf


def batch(n: int = 2, T: int = 12, pad: int = 3, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 97, (n, T), generator=g)
    mask = torch.ones(n, T, dtype=torch.bool)
    mask[-1, T - pad:] = False  # a right-padded window: the mask goes to the model
    return Batch(ids, mask)


def traced(model, b: Batch):
    lm = from_hf(model, "tiny")
    lm.discover(b.inputs, b.mask)
    return lm, lm.trace(b.inputs, b.mask)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_duplicated_span_in_analysis_equals_the_exported_model_in_transformers(family, tmp_path):
    from transformers import AutoModelForCausalLM

    tiny_hf(family, n_layers=6).save_pretrained(tmp_path / "src")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "src").eval()
    b = batch()
    lm, tr = traced(model, b)
    want = replay(lm, tr, Plan(("dup", 2, 4), repeat=(2, 4)))  # blocks 0..4, 2..4 again, 5
    out, layers = duplicate(tmp_path / "src", 2, 5, tmp_path / "out")
    assert layers == [2, 3, 4]
    deep = AutoModelForCausalLM.from_pretrained(out).eval()
    assert deep.config.num_hidden_layers == 9 and len(deep.model.layers) == 9
    assert [layer.self_attn.layer_idx for layer in deep.model.layers] == list(range(9))
    with torch.no_grad():
        got = deep(input_ids=b.ids, attention_mask=b.mask.long()).logits
    keep = b.mask  # the padded positions' logits are not read by anything
    assert ((got - want)[keep].abs().max() / want[keep].abs().max()).item() < 1e-5
    # the copy is weights of its own, equal to its source's
    w = [deep.model.layers[k].mlp.down_proj.weight for k in (2, 5)]
    assert torch.equal(w[0], w[1]) and w[0].data_ptr() != w[1].data_ptr()
    # greedy decoding with the KV cache (indexed by layer_idx) equals decoding without it
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    ids = b.ids[:1]
    assert torch.equal(deep.generate(ids, use_cache=True, **kw), deep.generate(ids, use_cache=False, **kw))
    assert json.loads((out / "depthlab_export.json").read_text())["duplicated_layers"] == [2, 3, 4]


def test_the_cached_scan_equals_evaluating_each_duplicated_model_whole():
    model = tiny_hf("llama", n_layers=5)
    batches = [batch(seed=0), batch(seed=1, pad=5)]
    lm = traced(model, batches[0])[0]
    res = duplication_scan(lm, batches, 3)
    naive = naive_scan(lm, batches, 3)
    assert len(res["spans"]) == len(naive) == 5 + 4 + 3
    for r in res["spans"]:
        assert r["loss"] == pytest.approx(naive[("dup", r["start_block"] - 1, r["end_block"] - 1)], rel=1e-5)
    table = res["delta_loss_table"]
    assert len(table) == 5 and all(len(row) == 5 for row in table)
    for i in range(5):
        for j in range(5):
            assert (table[i][j] is not None) == (0 <= j - i < 3), (i, j)
    best = res["best"]
    assert best["delta_loss"] == min(r["delta_loss"] for r in res["spans"])
    lo, hi = best["delta_loss_ci"]
    assert lo <= best["delta_loss"] <= hi and best["windows"] == 4
    assert best["span"] == f"{best['start_block'] - 1}:{best['end_block']}"
    assert [p.repeat for p in duplicate_plans(5, 1)] == [(i, i) for i in range(5)]
    assert [type(m).__name__ for m in lm.model.model.layers] == ["LlamaDecoderLayer"] * 5  # restored
    assert lm.model.config.num_hidden_layers == 5


@pytest.mark.parametrize("text, span", [("4:8", range(4, 8)), ("-2:", range(6, 8)), (":1", range(0, 1)),
                                        ("0:8", range(0, 8))])
def test_span_specs_name_a_python_slice_of_the_layers(text, span):
    assert layer_span(*parse_span(text, "--span"), 8, "repeat") == span


@pytest.mark.parametrize("text", ["5:5", "3:2", "0:9", "-9:", "8:"])
def test_empty_or_out_of_range_spans_are_refused(text):
    with pytest.raises(UserError, match=f"cannot repeat layers {text} of a 8-layer model"):
        duplicate_layers(tiny_hf("llama", n_layers=8), *parse_span(text, "--span"))


@pytest.mark.parametrize("text", ["4", "4-8", "a:b", "1:2:3"])
def test_span_syntax_is_refused_naming_the_flag(text):
    with pytest.raises(UserError, match="--span expects START:END"):
        parse_span(text, "--span")


def test_a_duplicated_lns_model_keeps_each_layer_its_own_scale(tmp_path):
    from depthlab.hf import apply_scheme, load_pretrained

    hf = apply_scheme(tiny_hf("llama", n_layers=4), "lns").eval()
    hf.save_pretrained(tmp_path / "src")
    b = batch(pad=0)
    lm, tr = traced(hf, b)
    want = replay(lm, tr, Plan(("dup", 1, 2), repeat=(1, 2)))
    duplicate(tmp_path / "src", 1, 3, tmp_path / "out")
    back = load_pretrained(tmp_path / "out").eval()
    s = [1, 2 ** -0.5, 3 ** -0.5, 4 ** -0.5]
    assert back.config.depthlab_layer_scales == pytest.approx([s[0], s[1], s[2], s[1], s[2], s[3]])
    with torch.no_grad():
        assert (back(b.ids).logits - want).abs().max() / want.abs().max() < 1e-5


@pytest.mark.slow
def test_analyze_duplicate_draws_the_heat_map_and_duplicate_writes_the_best_span(tmp_path, capsys):
    """The scan in the report (table, heat map, CSV, tasks); the best span written by `depthlab duplicate` scores,
    analysed on its own, the loss the scan measured for it."""
    from tests.test_analysis_support import hf_model_text_and_tasks

    hf, common, _ = hf_model_text_and_tasks(tmp_path)
    assert main(["analyze", str(hf), *common, "--duplicate", "2", "--removal-tasks", str(tmp_path / "mc.jsonl"),
                 "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    assert "duplication (spans of 1..2 blocks): the lowest loss repeats blocks" in printed
    assert "duplication_heatmap.png" in printed
    res = json.loads((tmp_path / "a" / "metrics.json").read_text())
    d = res["duplication"]
    assert len(d["delta_loss_table"]) == 4 and len(d["spans"]) == 4 + 3
    assert (tmp_path / "a" / "duplication_heatmap.png").stat().st_size > 0
    assert (tmp_path / "a" / "duplication.csv").read_text().count("\n") == 1 + 7
    assert "Layer duplication" in (tmp_path / "a" / "report.html").read_text()
    task = d["tasks"]["mc"]
    assert len(task["duplicate"]) == 7 and {"acc", "acc_ci", "drop_ci", "drop_p"} <= set(task["best"])
    best = d["best"]
    assert main(["duplicate", str(hf), "--span", best["span"], str(tmp_path / "deep")]) == 0
    assert f"repeated model.layers.{best['start_block'] - 1}..{best['end_block'] - 1} " in capsys.readouterr().out
    assert main(["analyze", str(tmp_path / "deep"), *common, "--out", str(tmp_path / "b")]) == 0
    own = json.loads((tmp_path / "b" / "metrics.json").read_text())["removal"]["base_loss"]
    assert own == pytest.approx(best["loss"], rel=1e-5)


def test_a_vit_is_scanned_as_well_and_the_cached_scan_equals_running_it_whole():
    """A depthlab ViT (no HF config): its blocks are called as block(h, None), its loss is against the labels."""
    from depthlab.analysis.calibration import ImageBatch
    from depthlab.analysis.layers import from_vit
    from depthlab.config import apply_overrides
    from depthlab.model import build_model
    from depthlab.model.families import preset

    cfg = apply_overrides(preset("vit-digits"), ["model.dim=32", "model.n_layers=4", "model.n_heads=2",
                                                 "model.ffn_dim=64"]).model
    torch.manual_seed(0)
    lm = from_vit(build_model(cfg).eval(), "vit")
    x = torch.randn(6, cfg.channels, cfg.image_size, cfg.image_size)
    b = ImageBatch(x, torch.randint(0, 10, (6,)), torch.ones(6, 17, dtype=torch.bool))
    lm.discover(b.inputs, b.mask)
    res, naive = duplication_scan(lm, [b], 2), naive_scan(lm, [b], 2)
    assert len(res["spans"]) == 7 and {"acc", "acc_drop"} <= set(res["spans"][0])
    for r in res["spans"]:
        assert r["loss"] == pytest.approx(naive[("dup", r["start_block"] - 1, r["end_block"] - 1)], rel=1e-5)
