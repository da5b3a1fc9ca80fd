"""Counters that move inside a long step (issue 62 item 4): a block pass over every removal's stream (layer-by-layer
mode), the scoring of every stream at the end, and a plan's replay (whole-model mode) each say how far they have
gone, through `depthlab.progress.detail`, which the innermost open bar shows beside its count."""

from __future__ import annotations

import re

from depthlab import progress
from depthlab.analysis import removal, streaming
from depthlab.analysis.analyze import Options, analyze, analyze_layerwise
from depthlab.analysis.layerwise import load_skeleton
from tests.test_analysis_support import random_batches
from tests.test_hf_fixtures import tiny_hf, word_tokenizer


def test_a_plain_line_carries_the_detail_of_its_bar(monkeypatch, capsys):
    monkeypatch.setattr(progress, "START_S", 3600.0)  # no timer line: the test says them itself
    with progress.progress_bar(None, False, total=30, desc="analyze: blocks", unit="block") as bar:
        bar.update(29)
        progress.detail("scoring 12/31 streams")
        bar._say("")
    progress.detail("after the bar closed: said nowhere")
    assert "depthlab: analyze: blocks: 0 s, 29/30 block (scoring 12/31 streams)" in capsys.readouterr().err
    assert not progress._OPEN


def said(monkeypatch, module) -> list[str]:
    texts: list[str] = []
    monkeypatch.setattr(module, "detail", texts.append)
    return texts


def test_layer_by_layer_counts_every_stream_of_every_block_and_every_score(monkeypatch, tmp_path):
    import transformers

    tiny_hf("llama", n_layers=3).save_pretrained(tmp_path / "m")
    transformers.PreTrainedTokenizerFast(tokenizer_object=word_tokenizer()).save_pretrained(tmp_path / "m")
    skel = load_skeleton(str(tmp_path / "m"))[0]
    texts = said(monkeypatch, streaming)
    analyze_layerwise(skel, random_batches(97, n=2, T=12), Options(jacobian=False, runs=False))
    plans = 1 + 3  # the model and each block removed
    for j in range(3):  # at block j + 1, the plans started there or before, and the model's own, per batch
        n = 2 * (j + 2)
        assert [t for t in texts if t.startswith(f"block {j + 1}:")] == [
            f"block {j + 1}: {i}/{n} streams" for i in range(1, n + 1) if i % (j + 2)]  # the model's own: no line
    assert [t for t in texts if t.startswith("scoring")] == [f"scoring {i}/{2 * plans} streams"
                                                              for i in range(1, 2 * plans + 1)]


def test_whole_model_replay_says_each_block(monkeypatch):
    texts = said(monkeypatch, removal)
    analyze(from_hf_tiny(), random_batches(97, n=1, T=12), Options(jacobian=False, runs=False))
    # block l removed: blocks l + 1 .. 4 replayed (the removed block itself is passed by, and said)
    assert len(texts) == sum(4 - l for l in range(4)) and all(re.fullmatch(r"block \d of 4", t) for t in texts)


def test_a_traced_pass_says_each_block(monkeypatch):
    from depthlab.analysis import layers

    texts = said(monkeypatch, layers)
    lm, b = from_hf_tiny(), random_batches(97, n=1, T=12)[0]
    lm.trace(b.inputs, b.mask)
    assert texts == [f"traced pass: block {i} of 4" for i in range(1, 5)]


def from_hf_tiny():
    from depthlab.analysis.layers import from_hf

    return from_hf(tiny_hf("llama", n_layers=4), "tiny")
