"""`depthlab analyze | compare | theory` end to end on tiny models: the files a person opens exist and hold data."""

import json

import pytest

from depthlab.cli import main
from tests.test_analysis_support import TEXT, save_depthlab_checkpoint, save_hf_model, tiny_hf_model

PLOTS = {"variance.png", "angular_heatmap.png", "angular_adjacent.png", "block_metrics.png", "logit_lens.png",
         "removal.png", "removal_cost.png", "jacobian.png", "jacobian_heatmaps.png"}


@pytest.mark.slow
def test_analyze_depthlab_run_and_hf_model_then_compare(tmp_path, capsys):
    run = tmp_path / "run"
    save_depthlab_checkpoint(run / "checkpoints" / "step_0000010", "lns", 4)
    (run / "config.json").write_text("{}")  # a run directory: found through its checkpoints/ folder
    hf = save_hf_model(tmp_path / "tiny-gpt2", "gpt2")
    for model, out in ((run, tmp_path / "a_run"), (hf, tmp_path / "a_hf")):
        assert main(["analyze", str(model), "--tokens", "200", "--seq-len", "32", "--probes", "1",
                     "--out", str(out)]) == 0
        names = {p.name for p in out.iterdir()}
        assert PLOTS <= names and {"report.html", "metrics.json", "states.csv", "blocks.csv"} <= names
        html = (out / "report.html").read_text()
        assert html.count("data:image/png;base64,") == len(PLOTS) and "src=\"http" not in html
        for metric in ("variance(l)", "update_ratio(l)", "angular distance", "block influence", "logit lens"):
            assert metric in html.split("<h2>Definitions</h2>")[1]  # the definitions themselves, not a redirect
        res = json.loads((out / "metrics.json").read_text())
        assert len(res["blocks"]) == 4 and res["tokens"] >= 200 and res["removal"]["base_ppl"] > 1
    out = capsys.readouterr().out
    assert "transformer.ln_f" in out and "report:" in out
    # compare: the two analyses, overlaid (a model path instead of a folder goes through the analyze path above)
    assert main(["compare", str(tmp_path / "a_run"), str(tmp_path / "a_hf"), "--labels", "lns", "gpt2",
                 "--out", str(tmp_path / "cmp")]) == 0
    names = {p.name for p in (tmp_path / "cmp").iterdir()}
    assert {"report.html", "compare.csv", "variance.png", "removal.png"} <= names
    assert "lns" in (tmp_path / "cmp" / "compare.csv").read_text()


@pytest.mark.slow
def test_layer_by_layer_cli_on_own_data(tmp_path):
    ck = save_depthlab_checkpoint(tmp_path / "ck", "pre", 4)
    (tmp_path / "text.txt").write_text(TEXT)
    assert main(["analyze", str(ck), "--layer-by-layer", "--data", str(tmp_path / "text.txt"), "--tokens", "100",
                 "--seq-len", "32", "--probes", "1", "--out", str(tmp_path / "o")]) == 0
    res = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert res["mode"] == "layer-by-layer" and "one at a time" in res["model"]["blocks"]
    assert len(res["removal"]["single"]) == 4 and res["removal"]["base_ppl"] > 1  # removal streams block by block
    # 4 packed windows of 32 inputs, each with the token after it (scored as `eval ppl` scores it), no padding
    assert "text.txt" in res["data"]["source"] and res["tokens"] == 4 * 33


def test_hf_model_without_tokenizer_is_a_clear_error(tmp_path, capsys):
    tiny_hf_model("llama").save_pretrained(tmp_path / "m")
    assert main(["analyze", str(tmp_path / "m"), "--tokens", "50"]) == 2
    assert "no usable tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["analyze", "/nonexistent/model"], "does not exist"),
    (["analyze", "{tmp}"], "neither a checkpoint nor a run directory"),
    (["analyze", "{tmp}", "--tokens", "0"], "--tokens must be at least 1"),
    (["compare", "{tmp}"], "at least two models"),
    (["analyze", "{tmp}", "--device", "cuda:0" if not __import__("torch").cuda.is_available() else "bogus"],
     "--device"),
    (["theory", "--depth", "1"], "--depth must be between 2"),
    (["analyze", "{tmp}", "--task-limit", "3"], "--task-limit has no effect without --removal-tasks"),
    (["analyze", "{tmp}", "--removal-tasks", "{tmp}/none.jsonl", "--no-removal"], "has no effect with --no-removal"),
    (["analyze", "{tmp}", "--sublayers", "--no-removal"], "--sublayers has no effect with --no-removal"),
    (["analyze", "{tmp}", "--linear-fit-tokens", "64"], "--linear-fit-tokens"),
    (["analyze", "{tmp}", "--mmlu-shots", "5"], "--mmlu-shots"),
    (["analyze", "{tmp}", "--activation-memory", "0"], "--activation-memory"),
    (["analyze", "{tmp}", "--removal-tasks", "{tmp}/none.jsonl"], "cannot read task file"),
    (["analyze", "{tmp}", "--removal-mmlu", "{tmp}/none"], "--mmlu"),
])
def test_user_errors_are_one_line(tmp_path, capsys, argv, msg):
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err and err.count("\n") == 1


def test_theory_cli(tmp_path, capsys):
    assert main(["theory", "--depth", "200", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "variance_recursion.png").stat().st_size > 1000
    assert "growth exponent" in capsys.readouterr().out


def test_too_few_calibration_tokens_warn(tmp_path):
    ck = save_depthlab_checkpoint(tmp_path / "ck", "pre", 2)
    (tmp_path / "tiny.txt").write_text("def f(x):\n    return x\n")
    with pytest.warns(UserWarning, match=r"only \d+ calibration tokens .*asked for 4096.*noisy"):
        assert main(["analyze", str(ck), "--data", str(tmp_path / "tiny.txt"), "--seq-len", "8", "--no-removal",
                     "--no-jacobian", "--out", str(tmp_path / "o")]) == 0
