"""Layer-by-layer mode on a model whose blocks alternate sliding-window and full attention (Gemma-2, window 4, 16
tokens): the Jacobians, the sublayer removals and the linear replacements equal whole-model mode's, block by block,
so every block runs with its own kind's attention call in those paths too."""

import pytest
import torch

from depthlab.analysis.analyze import Options
from depthlab.analysis.jacobian import block_jacobian
from depthlab.analysis.layers import from_hf
from tests.test_analysis_softcap import save_gemma2, write_mc
from tests.test_analysis_support import TEXT, random_batches

transformers = pytest.importorskip("transformers")

PARTS = ("single", "attn", "mlp", "linear", "runs", "drop")  # every removal kind the options below produce


def rows(res: dict, part: str) -> list[dict]:
    """A removal kind's rows; "drop" is {what usefulness is read from: rows}."""
    got = res[part]
    return [r for by in sorted(got) for r in got[by]] if part == "drop" else got


@pytest.fixture(scope="module")
def modes(tmp_path_factory):
    """(whole-model, layer-by-layer) results with Jacobians, --sublayers, --linear-replacement and --drop-lowest 2,
    removal also scored by an MC file; and the saved model's folder."""
    from depthlab.analysis.run import Request, run_request
    from depthlab.eval.suite import TaskSuite

    tmp = tmp_path_factory.mktemp("mixed")
    hf, mc = save_gemma2(tmp / "hf", sliding_window=4), write_mc(tmp / "mc.jsonl")
    (tmp / "t.txt").write_text(TEXT)
    opts = Options(sublayers=True, linear=True, drop_lowest=2, activation_mb=0)
    whole, layerwise = [run_request(Request(str(hf), [str(tmp / "t.txt")], tokens=64, seq_len=16, layerwise=lw,
                                            options=opts, linear_fit_tokens=64, tasks=TaskSuite.read([mc], None, 0)))
                        for lw in (False, True)]
    assert (whole["mode"], layerwise["mode"]) == ("whole-model", "layer-by-layer")
    return whole, layerwise, hf


def test_the_fixture_mixes_kinds_that_matter(modes):
    """Sliding layers 1 and 3 (1-based) see 4 keys, full ones all 16: the model's logits are not all-full
    attention's, and a full block's Jacobian moves when it is given the sliding block's call."""
    _, _, hf = modes
    b = random_batches(300, n=1, T=16)[0]
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, attn_implementation="eager").eval()
    assert model.config.layer_types == ["sliding_attention", "full_attention"] * 2
    full = transformers.AutoModelForCausalLM.from_pretrained(hf, attn_implementation="eager",
                                                             layer_types=["full_attention"] * 4).eval()
    with torch.no_grad():
        assert (model(input_ids=b.ids).logits - full(input_ids=b.ids).logits).abs().max() > 1
    lm = from_hf(model, "mixed")
    tr = lm.trace(b.ids, b.mask)
    own, other = (block_jacobian(lm, 1, tr.hidden[1], tr.calls[c], b.mask, probes=4) for c in (1, 0))
    assert abs(own[1] - other[1]) > 1e-2 * own[1]


def test_jacobians_equal_whole_model_mode(modes):
    """Block gain and distance from the identity of every block (the full-attention ones run in the skeleton's
    second slot) with the same probes, and the one-token heatmaps. dy/dh_l needs the whole suffix of the network:
    layer-by-layer mode leaves it out rather than refusing the Jacobians."""
    whole, layerwise, _ = modes
    w, lw = whole["jacobian"], layerwise["jacobian"]
    for key in ("block_gain", "block_vs_identity"):
        assert len(lw[key]) == 4 and lw[key] == pytest.approx(w[key], rel=1e-5), key
    assert "output_gain" in w and "output_gain" not in lw
    assert [h["block"] for h in lw["heatmaps"]] == [h["block"] for h in w["heatmaps"]] == [1, 3, 4]
    for a, b in zip(w["heatmaps"], lw["heatmaps"], strict=True):
        assert a["token_position"] == b["token_position"] and a["channels"] == b["channels"]
        assert torch.tensor(b["matrix"]) == pytest.approx(torch.tensor(a["matrix"]), rel=1e-5, abs=1e-6)
        assert b["identity_distance"] == pytest.approx(a["identity_distance"], rel=1e-5)


def test_sublayer_and_linear_removal_equal_whole_model_mode(modes):
    """Each block without attention, without MLP, replaced by its linear map (fitted on the same windows: the same
    fit residual), the runs and the least useful blocks removed together: the same losses and task scores."""
    whole, layerwise, _ = modes
    w, lw = whole["removal"], layerwise["removal"]
    assert lw["base_loss"] == pytest.approx(w["base_loss"], rel=1e-5)
    assert lw["linear_fit_tokens"] == w["linear_fit_tokens"] == 64
    for part in PARTS:
        assert len(rows(lw, part)) == len(rows(w, part)) > 0, part
        for a, b in zip(rows(w, part), rows(lw, part), strict=True):
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), (part, a)
            if part == "linear":
                assert b["fit_residual"] == pytest.approx(a["fit_residual"], rel=1e-5), a["block"]
    wt, lt = whole["task_removal"]["tasks"]["mc"], layerwise["task_removal"]["tasks"]["mc"]
    for part in PARTS:
        for a, b in zip(rows(wt, part), rows(lt, part), strict=True):
            assert a["acc"] == b["acc"] and b["ll"] == pytest.approx(a["ll"], abs=1e-4), (part, a)
