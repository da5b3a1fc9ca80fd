"""One perplexity: `analyze RUN` reads the run's own held-out tokens when no --data is given, and on the same tokens
and window it reports the loss `eval ppl` reports, and the run's own validation loss when it reads all of them."""

import json
import re

import pytest

from tests.test_long_phases import TINY, run_cli


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("same")
    out, err = run_cli(["train", "--data", corpus, "--run-dir", root / "run", "--no-progress", *TINY])
    assert out.splitlines()[0] == f"depthlab train: run directory {root / 'run'}"  # where to look, first
    lines = err.splitlines()  # then time elapsed and left on every step line
    steps = [x for x in lines if x.startswith("depthlab train: step ")]
    assert steps and all(re.search(r", elapsed \d+ s, about \d+ s left$", x) for x in steps)
    return root / "run"


def _analyze(run, out, *args) -> tuple[dict, str]:
    printed, _ = run_cli(["analyze", run, "--no-jacobian", "--no-init", "--no-progress", "--out", out, *args])
    return json.loads((out / "metrics.json").read_text()), printed


@pytest.mark.slow
def test_analyze_and_eval_ppl_agree_on_the_same_tokens_and_window(run, tmp_path):
    res, printed = _analyze(run, tmp_path / "a", "--tokens", "100", "--seq-len", "16")
    assert res["data"]["source"].startswith("the run's own held-out tokens")
    scored = sum(res["removal"]["windows"]["count"])
    assert scored == 112  # ceil(100 / 16) = 7 windows, each scoring the 16 tokens after its inputs' first
    out, _ = run_cli(["eval", "ppl", run, "--tokens", "100", "--seq-len", "16", "--no-progress"])
    loss, tokens = re.search(r"loss (\S+) .* tokens (\d+)  window 16", out).groups()
    assert int(tokens) == scored and "(112 of the text's " in out
    assert float(loss) == pytest.approx(res["removal"]["base_loss"], abs=5e-5)
    assert f"{scored:,} tokens scored in 7 windows of 16" in printed


@pytest.mark.slow
def test_analyze_of_a_run_reads_its_validation_split(run, tmp_path):
    final = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["val_loss"]
    res, _ = _analyze(run, tmp_path / "all", "--tokens", "1000000")  # every window of the split, the run's window
    assert res["removal"]["base_loss"] == pytest.approx(final, abs=5e-5)
