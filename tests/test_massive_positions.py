"""Massive activations set apart inside analyze (depthlab.metrics.massive_positions): a token whose embedding is
planted a thousand times too large is found at each of its positions, named with its text by the CLI, and the
rest's variance is the variance of the stream without those positions, in both analysis modes."""

from __future__ import annotations

import json

import pytest
import torch

from depthlab.analysis.analyze import Options, analyze, summary_lines
from depthlab.analysis.calibration import Batch
from depthlab.analysis.layers import from_hf
from depthlab.cli import main
from tests.test_analysis_support import TEXT, random_batches, save_hf_model, tiny_hf_model

transformers = pytest.importorskip("transformers")
PLANTED = 299  # the token id whose embedding row is scaled up


def plant(model, token: int = PLANTED, scale: float = 1000.0):
    with torch.no_grad():
        model.get_input_embeddings().weight[token] *= scale
    return model


def test_a_planted_massive_token_is_set_apart_and_the_rest_is_the_stream_without_it():
    model = plant(tiny_hf_model("llama"))
    b = random_batches(300, n=1)[0]
    ids = torch.where(b.ids == PLANTED, 7, b.ids)
    ids[1, 5] = PLANTED
    b = Batch(ids, b.mask)
    lm = from_hf(model, "llama")
    res = analyze(lm, [b], Options(jacobian=False, removal=False))
    m = res["massive"]
    assert m["count"] == 1 and m["positions"] == [{"batch": 0, "sequence": 1, "position": 5, "token_id": PLANTED}]
    assert m["rest_tokens"] == res["tokens"] - 1
    rest = b.mask.clone()
    rest[1, 5] = False
    states = lm.trace(b.ids, b.mask).hidden
    for s, h in enumerate(states):
        assert res["states"][s]["variance_rest"] == pytest.approx(float(h[rest].double().var(unbiased=False)),
                                                                  rel=1e-5)
        assert res["states"][s]["rms_rest"] == pytest.approx(float(h[rest].double().pow(2).mean().sqrt()), rel=1e-5)
    assert res["states"][0]["variance"] > 100 * res["states"][0]["variance_rest"]
    assert res["states"][0]["massive_norm_over_median"] > 100
    assert len(m["angular_adjacent_rest"]) == lm.n_layers
    assert any(line.startswith("massive positions (stream norm > 10 x") for line in summary_lines(res))


def test_no_massive_position_in_a_plain_model_and_the_rule_can_be_turned_off():
    lm = from_hf(tiny_hf_model("llama"), "llama")
    b = random_batches(300, n=1)
    res = analyze(lm, b, Options(jacobian=False, removal=False))
    assert res["massive"]["count"] == 0
    assert res["states"][2]["variance_rest"] == pytest.approx(res["states"][2]["variance"], rel=1e-6)
    assert "massive" not in analyze(lm, b, Options(jacobian=False, removal=False, massive_factor=None))


@pytest.mark.slow
def test_the_cli_names_the_massive_token_in_both_modes(tmp_path, capsys):
    model_dir = save_hf_model(tmp_path / "m", "llama")
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    text = TEXT[:3000]
    token = tok(text).input_ids[3]
    plant(transformers.AutoModelForCausalLM.from_pretrained(model_dir), token).save_pretrained(model_dir)
    (tmp_path / "text.txt").write_text(text)
    got = {}
    for mode in ("whole", "layerwise"):
        out = tmp_path / mode
        extra = ["--layer-by-layer"] if mode == "layerwise" else []
        main(["analyze", str(model_dir), "--data", str(tmp_path / "text.txt"), "--tokens", "256", "--seq-len", "64",
              "--no-removal", "--no-jacobian", "--out", str(out), *extra])
        got[mode] = json.loads((out / "metrics.json").read_text())
    m = got["whole"]["massive"]
    assert m["count"] >= 1 and {p["token_id"] for p in m["positions"]} == {token}
    assert all(p["token"] == tok.decode([token]) for p in m["positions"])
    assert got["layerwise"]["massive"] == m
    for a, b in zip(got["whole"]["states"], got["layerwise"]["states"]):
        assert a["variance_rest"] == pytest.approx(b["variance_rest"], rel=1e-4)
    assert f"{tok.decode([token])!r}" in capsys.readouterr().out
