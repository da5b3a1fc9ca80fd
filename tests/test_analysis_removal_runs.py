"""`analyze --no-removal-runs` (Options.runs): the contiguous runs of 2..L-1 blocks chosen by angular distance are
removed by no window, question or generation; everything else is scored as without it, with fewer block passes."""

import json

import pytest

from depthlab.analysis.analyze import Options, analyze, analyze_layerwise
from depthlab.analysis.calibration import calibration_batches
from depthlab.analysis.layers import LayeredLM
from depthlab.analysis.layerwise import load_skeleton
from depthlab.analysis.run import load_layered
from depthlab.cli import main
from tests.test_analysis_support import TEXT, hf_model_text_and_tasks, save_depthlab_checkpoint, save_hf_model


@pytest.mark.slow
def test_no_removal_runs_leaves_out_the_runs_of_every_score_and_keeps_the_rest(tmp_path):
    hf, data, mc = hf_model_text_and_tasks(tmp_path)  # 4 blocks: runs of 2 and 3
    res = {}
    for name, extra in (("runs", []), ("no_runs", ["--no-removal-runs"])):
        assert main(["analyze", str(hf), *data, "--removal-tasks", str(mc), "--removal-generate", "add:n=2",
                     "--out", str(tmp_path / name), *extra]) == 0
        res[name] = json.loads((tmp_path / name / "metrics.json").read_text())
    a, b = res["runs"], res["no_runs"]
    assert [r["n"] for r in a["removal"]["runs"]] == [2, 3] and b["removal"]["runs"] == []
    for scores in ("task_removal", "generate_removal"):
        assert all(t["runs"] for t in a[scores]["tasks"].values()), scores
        assert all(t["runs"] == [] for t in b[scores]["tasks"].values()), scores
        assert [t["single"] for t in a[scores]["tasks"].values()] == [t["single"] for t in b[scores]["tasks"].values()]
    assert [r["loss"] for r in b["removal"]["single"]] == pytest.approx([r["loss"] for r in a["removal"]["single"]])
    assert len(b["removal"]["windows"]["count"]) == b["sequences"] == b["curse_index"]["windows"]
    assert [c["delta_loss"] is None for c in b["curse_index"]["contiguous"]] == [False, True]  # n = 1 is a block
    assert (tmp_path / "no_runs" / "report.html").is_file()


@pytest.mark.parametrize("layerwise", [False, True])
def test_without_runs_the_analysis_runs_fewer_blocks(tmp_path, monkeypatch, layerwise):
    """Counted: the model's traced forward passes (whole-model mode traces each batch again for the later plans) and
    every block loaded (layer-by-layer mode). With no later plan, layer-by-layer mode loads each block once: a
    second pass would load them all again and score nothing."""
    path = save_hf_model(tmp_path / "hf", "llama")
    whole = load_layered(str(path))
    batches = calibration_batches(whole.tokenizer, [TEXT], 96, 24, 2, 300)
    whole.lm.discover(batches[0].inputs, batches[0].mask)  # the first discovery traces once more (kept probes)
    count = {"traces": 0, "loads": 0}

    def counted(f, what):
        def wrapper(*args, **kwargs):
            count[what] += 1
            return f(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(LayeredLM, "trace", counted(LayeredLM.trace, "traces"))

    def analysis(runs: bool) -> tuple[dict, dict]:
        count.update(traces=0, loads=0)
        opts = Options(jacobian=False, runs=runs)
        if not layerwise:
            return analyze(whole.lm, batches, opts)["removal"], dict(count)
        skel = load_skeleton(str(path))[0]
        skel.load_block = counted(skel.load_block, "loads")
        return analyze_layerwise(skel, batches, opts)["removal"], dict(count)

    (a, full), (b, lean) = analysis(True), analysis(False)
    assert [r["n"] for r in a["runs"]] == [2, 3] and b["runs"] == []
    assert [r["loss"] for r in b["single"]] == pytest.approx([r["loss"] for r in a["single"]])
    if layerwise:
        assert (full["loads"], lean["loads"]) == (1 + 2 * 4, 1 + 4)  # block 0 to discover, then 4 blocks a pass
    else:
        assert full["traces"] - lean["traces"] == len(batches)  # each batch traced again for the runs


@pytest.mark.parametrize("layerwise", [False, True])
def test_the_index_at_initialisation_plans_no_run(tmp_path, monkeypatch, layerwise):
    """`curse_index.at_init` keeps no contiguous runs, so the analysis at initialisation removes none: it plans no
    later removal and makes no second pass."""
    import depthlab.analysis.analyze as analysis
    from depthlab.analysis.run import index_at_init

    loaded = load_layered(str(save_depthlab_checkpoint(tmp_path / "ck", "pre", 4)))
    batches = calibration_batches(loaded.tokenizer, [TEXT], 96, 24, 2, 300)
    planned, later = [], analysis.later_plans
    monkeypatch.setattr(analysis, "later_plans", lambda *args: planned.append(later(*args)) or planned[-1])
    idx = index_at_init(loaded.cfg, batches, Options(jacobian=False), "cpu", layerwise=layerwise)
    assert planned == [[]] and "contiguous" not in idx and "removal_deep_over_shallow" in idx
