"""Layer-by-layer mode gives the numbers of whole-model mode while holding one block at a time."""

from pathlib import Path

import pytest
import torch

from depthlab.analysis.analyze import Options, analyze, analyze_layerwise
from depthlab.analysis.calibration import calibration_batches
from depthlab.analysis.layerwise import load_skeleton
from depthlab.analysis.run import load_layered
from tests.test_analysis_support import TEXT, save_depthlab_checkpoint, save_hf_model


def _close(a, b, tol=1e-4):
    return torch.allclose(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), rtol=tol,
                          atol=tol)


@pytest.mark.parametrize("kind", ["lns", "llama"])
def test_layerwise_equals_whole_model(tmp_path, kind):
    if kind == "lns":
        path = save_depthlab_checkpoint(tmp_path / "ck", "lns", 5)
    else:
        path = save_hf_model(tmp_path / "hf", kind)
    whole = load_layered(str(path))
    skel, tok, _, _ = load_skeleton(str(path))
    assert len(skel.lm.blocks) == 1 and skel.n_layers == whole.lm.n_layers
    n_params = sum(p.numel() for p in skel.lm.model.parameters())
    assert n_params < sum(p.numel() for p in whole.lm.model.parameters())
    batches = calibration_batches(whole.tokenizer, [TEXT], 96, 24, 2, 300)
    opts = Options(removal=False, probes=2)
    a = analyze(whole.lm, batches, opts)
    b = analyze_layerwise(skel, batches, opts)
    for key in ("variance", "rms", "max_abs"):
        assert _close([s[key] for s in a["states"]], [s[key] for s in b["states"]])
    for key in a["blocks"][0]:
        assert _close([r[key] for r in a["blocks"]], [r[key] for r in b["blocks"]]), key
    for key in ("last_token", "all_tokens"):
        assert _close(a["angular"][key], b["angular"][key])
    assert _close(a["lens"]["kl"], b["lens"]["kl"]) and _close(a["lens"]["ce"], b["lens"]["ce"])
    assert _close(a["jacobian"]["block_vs_identity"], b["jacobian"]["block_vs_identity"])
    assert [h["block"] for h in a["jacobian"]["heatmaps"]] == [h["block"] for h in b["jacobian"]["heatmaps"]]
    assert _close(a["jacobian"]["heatmaps"][-1]["matrix"], b["jacobian"]["heatmaps"][-1]["matrix"])


@pytest.mark.parametrize("layerwise", [False, True])
@pytest.mark.slow
def test_bfloat16_model_gives_fp32_accumulated_metrics_close_to_float32(tmp_path, layerwise):
    from depthlab.analysis.run import Request, run_request

    hf = save_hf_model(tmp_path / "hf", "qwen2")
    opts = Options(removal=False, probes=1)
    res = {dt: run_request(Request(str(hf), tokens=128, seq_len=32, batch_size=2, layerwise=layerwise, dtype=dt,
                                   options=opts)) for dt in ("float32", "bfloat16")}
    a, b = res["float32"], res["bfloat16"]
    assert b["run"]["dtype"] == "bfloat16" and b["tokens"] == a["tokens"]
    assert _close([s["variance"] for s in a["states"]], [s["variance"] for s in b["states"]], tol=0.05)
    assert _close(a["angular"]["last_token"], b["angular"]["last_token"], tol=0.03)
    assert _close(a["lens"]["ce"], b["lens"]["ce"], tol=0.02)


def test_unknown_dtype_is_a_user_error(tmp_path):
    from depthlab import UserError
    from depthlab.analysis.run import Request, run_request

    ck = save_depthlab_checkpoint(tmp_path / "ck")
    with pytest.raises(UserError, match="unknown dtype 'int8'"):
        run_request(Request(str(ck), tokens=64, dtype="int8"))


@pytest.mark.parametrize("kind,budget", [("lns", 0), ("llama", 1024)])
def test_layerwise_removal_equals_whole_model(tmp_path, kind, budget):
    """Every removal (blocks, sublayers, linear replacement, runs, the least useful together) streamed block by
    block, with the streams on disk (budget 0) or in memory, gives the whole-model numbers."""
    path = save_depthlab_checkpoint(tmp_path / "ck", "lns", 5) if kind == "lns" else save_hf_model(tmp_path / "hf",
                                                                                                    kind)
    whole = load_layered(str(path))
    skel, _, _, _ = load_skeleton(str(path))
    batches = calibration_batches(whole.tokenizer, [TEXT], 96, 24, 2, 300)
    fit = calibration_batches(whole.tokenizer, [TEXT[2000:]], 96, 24, 2, 300)
    opts = Options(jacobian=False, sublayers=True, linear=True, drop_lowest=2, activation_mb=budget)
    a = analyze(whole.lm, batches, opts, fit=fit)["removal"]
    b = analyze_layerwise(skel, batches, opts, fit=fit)["removal"]
    for key in ("single", "attn", "mlp", "linear", "runs"):
        assert _close([r["loss"] for r in a[key]], [r["loss"] for r in b[key]], 1e-5), key
    assert _close([r["fit_residual"] for r in a["linear"]], [r["fit_residual"] for r in b["linear"]], 1e-5)
    assert _close([d["loss"] for d in a["drop"]["loss"]], [d["loss"] for d in b["drop"]["loss"]], 1e-5)
    assert (b["streams"]["on_disk_mb"] > 0) == (budget == 0)


def test_layer_by_layer_reports_the_step_and_the_index_at_initialisation_as_whole_model_mode(tmp_path, monkeypatch):
    """Layer-by-layer mode used to leave out the model's step and its curse index at initialisation without a word.
    The initial model is drawn as whole-model mode draws it, into files (here every tensor over 4 KiB), and read
    block by block: the same index."""
    import numpy as np

    from depthlab.analysis import layerwise
    from depthlab.analysis.run import Request, run_request

    monkeypatch.setattr(layerwise, "IN_MEMORY_BYTES", 4096)
    drawn, open_memmap = [], np.lib.format.open_memmap
    monkeypatch.setattr(np.lib.format, "open_memmap", lambda path, *a, **k: drawn.append(path) or open_memmap(path,
                                                                                                              *a, **k))
    ck = save_depthlab_checkpoint(tmp_path / "ck", "lns", 5, step=7)
    (tmp_path / "t.txt").write_text(TEXT)
    whole, lw = [run_request(Request(str(ck), [str(tmp_path / "t.txt")], tokens=96, seq_len=24, layerwise=x,
                                     options=Options(probes=1, jacobian=False))) for x in (False, True)]
    assert whole["model"]["step"] == lw["model"]["step"] == 7
    a, b = whole["curse_index"]["at_init"], lw["curse_index"]["at_init"]
    assert a.keys() == b.keys() and a["inert_blocks"] == b["inert_blocks"]
    assert _close(a["removal_cost"], b["removal_cost"]) and _close(a["update_slope"], b["update_slope"])
    assert _close(a["adjacent_angular"]["last_token"], b["adjacent_angular"]["last_token"])
    assert not _close(a["removal_cost"], whole["curse_index"]["removal_cost"])  # not the trained model's
    assert sum(p.name.endswith(".npy") and p.stem.isdigit() for p in map(Path, drawn)) >= 5 * 7  # weights in files
