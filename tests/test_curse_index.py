"""The curse index: planted identity blocks are found, named and counted; a model without them reads 0; the
bootstrap interval brackets the estimate; a depthlab run is read beside its initialisation."""

import json

import numpy as np
import pytest
import torch

from depthlab.analysis.curse import CurseSpec, angular_rows, interior, removal_index, shallow_deep, update_slope
from depthlab.cli import main
from tests.test_analysis_support import TEXT, save_depthlab_checkpoint, tiny_hf_model, tiny_tokenizer

transformers = pytest.importorskip("transformers")


def save_llama(path, n_layers: int, planted: list[int]):
    """A random tiny HF Llama whose 1-based blocks `planted` are exact identities (zero o_proj and down_proj)."""
    from depthlab.data.tokenizer import EOT

    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer(), eos_token=EOT, pad_token=EOT)
    model = tiny_hf_model("llama", vocab=len(tok), n_layers=n_layers)
    with torch.no_grad():
        for l in planted:
            layer = model.model.layers[l - 1]
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("planted", [[3, 5], []])
@pytest.mark.slow
def test_analyze_finds_planted_identity_blocks(tmp_path, capsys, planted):
    model = save_llama(tmp_path / "llama", 8, planted)
    (tmp_path / "text.txt").write_text(TEXT)
    out = tmp_path / "report"
    assert main(["analyze", str(model), "--data", str(tmp_path / "text.txt"), "--tokens", "2048", "--seq-len", "32",
                 "--probes", "1", "--out", str(out)]) == 0
    idx = json.loads((out / "metrics.json").read_text())["curse_index"]
    assert idx["interior"] == [2, 6]  # 8 blocks: the first and the last two left out
    assert idx["inert_blocks"] == planted
    assert idx["inert_fraction"] == pytest.approx(len(planted) / 5)
    lo, hi = idx["inert_fraction_ci"]
    assert lo <= idx["inert_fraction"] <= hi
    assert idx["windows"] >= 64
    printed = capsys.readouterr().out
    printed = [x.strip() for x in printed.splitlines()]
    assert printed[printed.index("details:") + 1].startswith("curse index: interior inert fraction")  # details first
    assert "Curse index" in (out / "report.html").read_text().split("Residual stream")[0]


@pytest.mark.slow
def test_depthlab_run_is_indexed_beside_its_initialisation(tmp_path):
    ck = save_depthlab_checkpoint(tmp_path / "ck", "pre", 6, zero=2)  # 0-based 2: block 3
    (tmp_path / "text.txt").write_text(TEXT)
    assert main(["analyze", str(ck), "--data", str(tmp_path / "text.txt"), "--tokens", "512", "--probes", "1",
                 "--out", str(tmp_path / "r")]) == 0
    idx = json.loads((tmp_path / "r" / "metrics.json").read_text())["curse_index"]
    assert idx["inert_blocks"] == [3]
    assert 3 not in idx["at_init"]["inert_blocks"]  # the rebuilt initialisation has no planted block
    assert set(idx["at_init"]) >= {"inert_fraction", "removal_deep_over_shallow", "update_slope"}


def test_definitions_by_hand():
    assert interior(8) == [2, 3, 4, 5, 6] and interior(4) == [2]
    assert shallow_deep(48) == (list(range(2, 14)), list(range(25, 47)))
    assert shallow_deep(6) == ([2], [4])
    assert update_slope([1.0, 2.0, 4.0, 8.0], [1, 2, 3, 4]) == pytest.approx(0.6931, abs=1e-4)
    rows = angular_rows([[0, 0.2, 0.4], [0.2, 0, 0.1], [0.4, 0.1, 0]])
    assert rows == [[1.0, 0.5], [1.0]]
    # two windows of 10 tokens; block costs (nats per token): 0.0, 0.1, 0.002, 0.3 -> interior of 4 blocks = [2]
    w = {"count": [10, 10], "single_delta": [[0.0, 0.0], [1.0, 1.0], [0.02, 0.02], [3.0, 3.0]]}
    idx = removal_index(w, 4, CurseSpec(bootstrap=50))
    assert idx["removal_cost"] == pytest.approx([0.0, 0.1, 0.002, 0.3])
    assert idx["inert_fraction"] == 0.0 and idx["inert_fraction_rel"] == 0.0
    idx5 = removal_index({"count": [10, 10], "single_delta": [[1.0] * 2, [1.0] * 2, [0.02] * 2, [0.0] * 2,
                                                              [2.0] * 2]}, 5, CurseSpec(bootstrap=50))
    assert idx5["inert_blocks"] == [3] and idx5["inert_fraction"] == 0.5  # interior 2..3: block 2 costs 0.1


def test_probe_windows_are_seeded_and_spread_over_the_whole_stream():
    from depthlab.analysis.calibration import probe_batches, sample_windows

    stream = np.arange(100_000)
    w = sample_windows(stream, 256, 64, seed=3)
    assert w.shape == (256, 64) and (w[:, 0] % 64 == 0).all() and len(set(w[:, 0])) == 256
    assert w[:, 0].min() < 10_000 and w[:, 0].max() > 90_000  # not the head of the stream
    assert (sample_windows(stream, 256, 64, seed=3) == w).all() and not (sample_windows(stream, 256, 64, 4) == w).all()
    assert len(sample_windows(stream[:640], 256, 64)) == 10  # fewer windows than asked: all of them
    b = probe_batches(stream, 40, 64, batch_size=16)
    assert [x.ids.shape[0] for x in b] == [16, 16, 8] and all(x.mask.all() for x in b)


@pytest.mark.slow
def test_index_thresholds_from_the_command_line(tmp_path, capsys):
    model = save_llama(tmp_path / "llama", 8, [3, 5])
    (tmp_path / "text.txt").write_text(TEXT)
    common = ["analyze", str(model), "--data", str(tmp_path / "text.txt"), "--tokens", "512", "--seq-len", "32",
              "--no-jacobian"]
    assert main([*common, "--interior", "3", "2", "--out", str(tmp_path / "r")]) == 0
    idx = json.loads((tmp_path / "r" / "metrics.json").read_text())["curse_index"]
    assert idx["interior"] == [4, 6] and idx["inert_blocks"] == [5]
    capsys.readouterr()  # the first analysis's progress lines (a loaded machine prints some) are not the refusal's
    assert main([*common, "--inert-delta", "0", "--out", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--inert-delta" in err[0]


@pytest.mark.slow
def test_compare_lists_each_model_index(tmp_path):
    (tmp_path / "text.txt").write_text(TEXT)
    outs = []
    for planted in ([3, 5], []):
        out = tmp_path / f"a{len(planted)}"
        assert main(["analyze", str(save_llama(tmp_path / f"m{len(planted)}", 8, planted)), "--data",
                     str(tmp_path / "text.txt"), "--tokens", "512", "--seq-len", "32", "--no-jacobian",
                     "--out", str(out)]) == 0
        outs.append(str(out))
    assert main(["compare", *outs, "--labels", "planted", "random", "--out", str(tmp_path / "cmp")]) == 0
    rows = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()
    head = rows[0].split(",")
    frac = [float(r.split(",")[head.index("inert_fraction")]) for r in rows[1:]]
    assert frac == [pytest.approx(0.4), 0.0]
    html = (tmp_path / "cmp" / "report.html").read_text()
    assert "inert_fraction" in html


@pytest.mark.parametrize("kind", ["depthlab", "hf"])
@pytest.mark.slow
def test_analyze_samples_windows_over_the_whole_text(tmp_path, kind):
    model = save_depthlab_checkpoint(tmp_path / "ck", "pre", 4) if kind == "depthlab" else \
        save_llama(tmp_path / "llama", 4, [])
    (tmp_path / "text.txt").write_text(TEXT)
    common = ["analyze", str(model), "--data", str(tmp_path / "text.txt"), "--seq-len", "16", "--no-jacobian",
              "--no-init"]
    assert main([*common, "--windows", "8", "--out", str(tmp_path / "s")]) == 0
    assert main([*common, "--tokens", "128", "--out", str(tmp_path / "h")]) == 0
    sampled, head = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("s", "h"))
    assert sampled["sequences"] == 8 and "8 windows sampled over all of it (seed 0)" in sampled["data"]["source"]
    assert sampled["removal"]["base_loss"] != head["removal"]["base_loss"]  # other text than the first windows


@pytest.mark.slow
def test_each_window_is_counted_once_when_no_later_removal_is_planned(tmp_path):
    """A 2-block model has no run of 2..L-1 blocks and, without --drop-lowest, no later plan: the second removal
    pass then fell back to every single block and scored each window again (the bootstrap saw each twice)."""
    model = save_llama(tmp_path / "llama", 2, [])
    (tmp_path / "text.txt").write_text(TEXT)
    out = tmp_path / "report"
    assert main(["analyze", str(model), "--data", str(tmp_path / "text.txt"), "--tokens", "128", "--seq-len", "32",
                 "--no-jacobian", "--no-progress", "--out", str(out)]) == 0
    res = json.loads((out / "metrics.json").read_text())
    assert len(res["removal"]["windows"]["count"]) == res["sequences"] == res["curse_index"]["windows"]
