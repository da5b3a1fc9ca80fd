"""What the analysis computes, counted (issue 61 item 6): discovery on one sequence, each batch traced once (the
plans chosen after the first pass replay from the kept trace), and no number changed by either."""

from __future__ import annotations

import json

import pytest
import torch

from depthlab.analysis.analyze import Options, analyze
from depthlab.analysis.layers import LayeredLM, from_hf
from tests.test_analysis_support import random_batches
from tests.test_gemma3_analysis import tiny_gemma3
from tests.test_hf_fixtures import tiny_hf, transformers

OPTIONS = Options(probes=1, heatmap_channels=4, sublayers=True, drop_lowest=2, duplicate=2)


def model_of(family: str):
    torch.manual_seed(0)
    return tiny_gemma3() if family == "gemma3" else tiny_hf(family, n_layers=5)


def results(family: str, keep: int, monkeypatch) -> str:
    monkeypatch.setattr(LayeredLM, "KEEP_BYTES", keep)
    lm = from_hf(model_of(family), "tiny")
    return json.dumps(analyze(lm, random_batches(97, n=2, B=2, T=13), OPTIONS), sort_keys=True)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_kept_traces_change_no_number(family, monkeypatch):
    """Every number of an analysis with every kind of removal, the duplication scan and the Jacobians is the same,
    to the last bit, whether each batch's trace is kept for its second use or traced again."""
    assert results(family, LayeredLM.KEEP_BYTES, monkeypatch) == results(family, 0, monkeypatch)


def test_the_default_analysis_traces_each_batch_once():
    """Counted on SmolLM2's shape: one traced pass per batch, and discovery on the first sequence alone (its trace
    and its check of the block chain), whatever the number of batches."""
    from benchmarks.analysis_cost import PANEL, count_passes

    shape = PANEL["SmolLM2-135M"]
    L, tokens, seq_len = shape["num_hidden_layers"], 512, 32
    got = count_passes(shape, tokens=tokens, seq_len=seq_len, batch_size=4)
    assert got["block_tokens"]["traced passes"] == L * (tokens + seq_len)
    assert got["block_tokens"]["discovery"] == L * seq_len
    assert got["head_tokens"]["traced passes"] == tokens + seq_len


def test_a_kept_trace_is_not_handed_out_after_the_model_changed():
    lm = from_hf(model_of("llama"), "tiny")
    b = random_batches(97, n=1, B=2, T=13)[0]
    lm.discover(b.inputs, b.mask)
    first = lm.trace(b.inputs, b.mask)
    second = lm.trace(b.inputs, b.mask)  # the kept one: the same states, without the logits
    assert second.hidden is first.hidden and second.logits is None and first.logits is not None
    assert lm.trace(b.inputs, b.mask).logits is not None  # handed out once only: traced again (and kept)
    with torch.no_grad():
        lm.blocks[2].mlp.down_proj.weight.mul_(2.0)
    again = lm.trace(b.inputs, b.mask)
    assert again.logits is not None and not torch.equal(again.hidden[-1], first.hidden[-1])
    with lm.without(1, "attn"):
        zeroed = lm.trace(b.inputs, b.mask)
    assert zeroed.logits is not None and not torch.equal(zeroed.hidden[2], again.hidden[2])


def test_layer_by_layer_mode_keeps_no_trace(tmp_path):
    """The skeleton's traces are never replayed (each block is streamed as it is loaded): none is held."""
    from depthlab.analysis.analyze import analyze_layerwise
    from depthlab.analysis.layerwise import load_skeleton
    from tests.test_hf_fixtures import word_tokenizer

    tiny_hf("llama", n_layers=3).save_pretrained(tmp_path / "m")
    transformers.PreTrainedTokenizerFast(tokenizer_object=word_tokenizer()).save_pretrained(tmp_path / "m")
    skel = load_skeleton(str(tmp_path / "m"))[0]
    analyze_layerwise(skel, random_batches(97, n=2, T=12), Options(jacobian=False))
    assert not skel.lm._kept


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_batch_traced_before_the_analysis_changes_no_number(family, monkeypatch):
    """The analysis's first pass then finds the batch's kept trace, logits not kept: the model's own loss is read
    off the last state, as the model itself reads it, to the last bit."""
    batches = random_batches(97, n=2, B=2, T=13)
    lm = from_hf(model_of(family), "tiny")
    lm.discover(batches[0].inputs, batches[0].mask)  # before it, a trace reads no mid-block state: not kept for it
    for b in batches:
        lm.trace(b.inputs, b.mask)
    got = json.dumps(analyze(lm, batches, OPTIONS), sort_keys=True)
    monkeypatch.setattr(LayeredLM, "KEEP_BYTES", 0)
    assert got == json.dumps(analyze(from_hf(model_of(family), "tiny"), batches, OPTIONS), sort_keys=True)
