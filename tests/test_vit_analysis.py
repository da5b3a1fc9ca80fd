"""`depthlab analyze | compare` on real trained tiny ViT runs (scikit-learn's digits): the report's per-block numbers,
layer removal against running the model without the block by hand, compare of two ViTs, refusals in one line."""

import csv
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from depthlab.cli import main
from depthlab.config import apply_overrides
from depthlab.data.images import build_image_data, hold_out
from depthlab.loading import load_model
from depthlab.metrics import angular_distance
from depthlab.model.families import preset
from depthlab.train.trainer import train
from tests.test_analysis_support import save_depthlab_checkpoint

TINY = ["model.dim=32", "model.n_layers=4", "model.n_heads=2", "model.ffn_dim=64", "train.max_steps=40",
        "train.batch_size=32", "train.eval_every=40", "train.warmup_steps=5", "train.lr=3e-3"]
VAL_IMAGES, TOKENS = 359, 17  # digits' held-out images; 16 patches of 2x2 and the class token


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vit")
    out = {}
    for scheme, pool in (("pre", "cls"), ("lns", "mean")):
        cfg = apply_overrides(preset("vit-digits"), [*TINY, f"model.norm_scheme={scheme}", f"model.pool={pool}"])
        out[scheme] = train(cfg, run_dir=root / scheme, progress=False)
    return root, out


@pytest.fixture(scope="module")
def analysed(runs):
    root, _ = runs
    assert main(["analyze", str(root / "pre"), "--probes", "1", "--out", str(root / "a_pre")]) == 0
    return root / "a_pre", json.loads((root / "a_pre" / "metrics.json").read_text())


def by_hand(model, x, y, skip: range) -> tuple[float, float]:
    """Mean cross-entropy and top-1 accuracy with the blocks in `skip` left out of the model's own forward."""
    with torch.no_grad():
        h = model.embed(x)
        for j, layer in enumerate(model.layers):
            if j not in skip:
                h = layer(h, None)
        logits = model.head(model.pool(model.norm(h)))
    return F.cross_entropy(logits, y).item(), (logits.argmax(-1) == y).sum().item() / len(y)


def loaded(run):
    """The trained model and its validation images, rebuilt from its config as the trainer built them."""
    got = load_model(run.checkpoint)
    m = got.cfg.model
    d = build_image_data(got.cfg.data.paths, m.image_size, m.channels, got.cfg.data.val_fraction)
    return got.model, torch.from_numpy(d.val_x), torch.from_numpy(d.val_y)


@pytest.mark.slow
def test_analyze_vit_writes_per_block_report(runs, analysed):
    out, res = analysed
    _, trained = runs
    files = {p.name for p in out.iterdir()}
    assert {"report.html", "metrics.json", "states.csv", "blocks.csv", "removal_runs.csv", "variance.png",
            "angular_heatmap.png", "angular_adjacent.png", "removal.png", "jacobian.png"} <= files
    assert "logit_lens.png" not in files and "lens" not in res and res["task"] == "image classification" == res["kind"]
    assert res["sequences"] == VAL_IMAGES and res["tokens"] == VAL_IMAGES * TOKENS
    assert len(res["blocks"]) == 4 and len(res["states"]) == 5 and len(res["angular"]["last_token"]) == 5
    rows = list(csv.DictReader((out / "blocks.csv").open()))
    assert len(rows) == 4 and {"update_ratio", "removal_delta_loss", "removal_acc_drop",
                               "angular_adjacent_last"} <= set(rows[0])
    assert "logit lens skipped" in (out / "report.html").read_text()
    # nothing removed: the trainer's own validation numbers on the same images
    r = res["removal"]
    assert r["base_loss"] == pytest.approx(trained["pre"].val["val_loss"], abs=1e-5)
    assert r["base_acc"] == pytest.approx(trained["pre"].val["val_acc"], abs=1e-9)
    # the stream read by hand: update ratio over all tokens, adjacent angular distance at the class token
    model, x, _ = loaded(trained["pre"])
    with torch.no_grad():
        hs = model(x, return_hidden=True)[1]
    for l in range(4):
        ratio = ((hs[l + 1] - hs[l]).norm(dim=-1) / hs[l].norm(dim=-1)).mean().item()
        assert res["blocks"][l]["update_ratio"] == pytest.approx(ratio, rel=1e-4)
        ang = angular_distance(hs[l][:, 0], hs[l + 1][:, 0]).mean().item()
        assert res["angular"]["last_token"][l][l + 1] == pytest.approx(ang, rel=1e-4)
        assert res["states"][l]["variance"] == pytest.approx(hs[l].double().var(unbiased=False).item(), rel=1e-4)


@pytest.mark.slow
def test_removal_matches_running_without_the_block_by_hand(runs, analysed):
    _, res = analysed
    run = runs[1]["pre"]
    model, x, y = loaded(run)
    base_loss, base_acc = by_hand(model, x, y, range(0))
    for s in res["removal"]["single"]:
        loss, acc = by_hand(model, x, y, range(s["block"] - 1, s["block"]))
        assert s["loss"] == pytest.approx(loss, abs=1e-5) and s["acc"] == pytest.approx(acc, abs=1e-9)
        assert s["delta_loss"] == pytest.approx(loss - base_loss, abs=1e-5)
        assert s["acc_drop"] == pytest.approx(base_acc - acc, abs=1e-9)
    assert any(s["delta_loss"] != 0 for s in res["removal"]["single"])
    for r in res["removal"]["runs"]:  # the best run of n blocks (chosen by angular distance) removed
        loss, acc = by_hand(model, x, y, range(r["start_block"] - 1, r["start_block"] - 1 + r["n"]))
        assert r["loss"] == pytest.approx(loss, abs=1e-5) and r["acc"] == pytest.approx(acc, abs=1e-9)


@pytest.mark.slow
def test_other_image_source_is_normalised_as_the_run_was(runs, tmp_path):
    """An .npz whose training split differs (other pixel statistics) but whose validation images are the run's:
    renormalised with the run's statistics, the scores are the run's own."""
    from sklearn.datasets import load_digits

    root, trained = runs
    d = load_digits()
    (tx, ty), (vx, vy), _ = hold_out(d.images / 16.0, d.target, 0.2)
    np.savez(tmp_path / "d.npz", x=tx[:300] ** 2, y=ty[:300], x_val=vx, y_val=vy)
    assert main(["analyze", str(root / "lns"), "--data", str(tmp_path / "d.npz"), "--images", "200",
                 "--no-jacobian", "--out", str(tmp_path / "o")]) == 0
    res = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert res["sequences"] == 200 and "d.npz" in res["data"]["source"] and res["readout"].startswith("mean")
    model, x, y = loaded(trained["lns"])
    loss, acc = by_hand(model, x[:200], y[:200], range(0))
    assert res["removal"]["base_loss"] == pytest.approx(loss, abs=1e-4)
    assert res["removal"]["base_acc"] == pytest.approx(acc, abs=1e-9)


@pytest.mark.slow
def test_compare_two_vits(runs, analysed, tmp_path):
    root, _ = runs
    assert main(["compare", str(analysed[0]), str(root / "lns"), "--labels", "pre", "lns", "--no-jacobian",
                 "--out", str(tmp_path / "cmp")]) == 0
    names = {p.name for p in (tmp_path / "cmp").iterdir()}
    assert {"report.html", "compare.csv", "variance.png", "angular_adjacent.png", "removal.png"} <= names
    assert "logit_lens.png" not in names
    rows = list(csv.DictReader((tmp_path / "cmp" / "compare.csv").open()))
    assert [r["model"] for r in rows] == ["pre", "lns"] and all(0 < float(r["acc"]) <= 1 for r in rows)


@pytest.mark.parametrize("argv,msg", [
    (["compare", "{vit}", "{lm}"], "compare needs models of one kind"),
    (["analyze", "{vit}", "--layer-by-layer"], "layer-by-layer mode is for language models"),
    (["analyze", "{vit}", "--seq-len", "8"], "--seq-len does not apply to a ViT"),
    (["analyze", "{lm}", "--images", "5", "--no-removal", "--no-jacobian"], "--images is for a ViT"),
])
def test_refusals_are_one_line(runs, tmp_path, capsys, argv, msg):
    root, _ = runs
    lm = save_depthlab_checkpoint(tmp_path / "lm", "pre", 2)
    args = [a.replace("{vit}", str(root / "pre")).replace("{lm}", str(lm)) for a in argv]
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err and err.count("\n") == 1
