"""The report reads a result's kind, not its keys: each analysis writes it, a result from before the field is read
the same way; and the per-block figure has one panel per metric, however many there are."""

import matplotlib.pyplot as plt
import torch

from depthlab.analysis import report
from depthlab.analysis.analyze import Options, analyze
from depthlab.analysis.calibration import ImageBatch
from depthlab.analysis.layers import from_depthlab
from depthlab.analysis.results import IMAGE_CLASSIFICATION, LANGUAGE_MODELLING, is_classifier, kind_of
from depthlab.config import ModelConfig
from depthlab.model import ViT
from tests.test_analysis import tiny_lm
from tests.test_analysis_support import random_batches

OPTS = Options(jacobian=False)


def lm_result() -> dict:
    torch.manual_seed(0)
    return analyze(tiny_lm(n_layers=3), random_batches(97, n=1), OPTS)


def vit_result() -> dict:
    torch.manual_seed(0)
    cfg = ModelConfig(family="vit", dim=16, n_layers=3, n_heads=2, ffn_dim=32, image_size=8, patch_size=4, channels=3,
                      num_classes=5, norm_scheme="pre")
    batch = ImageBatch(torch.randn(6, 3, 8, 8), torch.randint(0, 5, (6,)), torch.ones(6, 5, dtype=torch.bool))
    return analyze(from_depthlab(ViT(cfg).eval(), "vit"), [batch], OPTS)


def test_each_analysis_writes_its_kind_and_old_results_read_the_same():
    lm, vit = lm_result(), vit_result()
    assert lm["kind"] == LANGUAGE_MODELLING and vit["kind"] == IMAGE_CLASSIFICATION
    assert not is_classifier(lm) and is_classifier(vit)
    for res in (lm, vit):  # a metrics.json written before "kind" existed
        old = {k: v for k, v in res.items() if k != "kind"}
        assert kind_of(old) == res["kind"]
        assert report.report_intro(old, "m") == report.report_intro(res, "m")
        assert report.block_rows(old) == report.block_rows(res)
        assert report.removal_metrics(old) == report.removal_metrics(res)
    assert report.removal_metrics(vit) == [("delta_loss", "Δ loss (nats)"), ("acc_drop", "top-1 accuracy drop")]
    assert report.removal_metrics(lm) == [("delta_loss", "Δ loss (nats per token)")]  # one unit: nats
    assert "removal_acc_drop" in report.block_rows(vit)[0] and "removal_ppl_change_pct" in report.block_rows(lm)[0]
    assert any("images" in line for line in report.report_intro(vit, "m"))


def test_the_block_figure_has_one_panel_per_metric():
    runs = [("tiny", lm_result())]
    fig = report.draw_blocks(runs)
    assert [ax.get_title() for ax in fig.axes] == [t for _, t in report.BLOCK_PLOTS]
    seven = report.BLOCK_PLOTS + [("block_influence", "a seventh metric")]
    fig = report.draw_blocks(runs, metrics=seven)
    assert len(fig.axes) == 7 and fig.axes[-1].get_title() == "a seventh metric"
    assert len(fig.axes[-1].lines) == 1  # drawn, not dropped
    assert len(report.draw_blocks(runs, metrics=seven[:2]).axes) == 2
    plt.close("all")
