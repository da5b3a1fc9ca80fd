"""Into a log file (or with --no-progress) nothing is a bar: the training loop writes one plain line per logged
step instead of carriage-return redraws, and a long phase (tokenizing, evaluating, analyzing) prints a plain line
when it has run a few seconds, then every ten, and when it ends; a short one prints nothing."""

from __future__ import annotations

import contextlib
import io
import json
import re
import time

import pytest

from depthlab import progress
from depthlab.cli import main
from depthlab.progress import progress_bar

STEPS = ["--set", "train.log_every=2", "--set", "train.eval_every=1000", "--max-steps", "6"]


def cli(argv: list, stderr) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(stderr):
        assert main([str(a) for a in argv]) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus):
    """A 6-step run trained with its stderr into a file (not a terminal), and that file's text."""
    from tests.test_long_phases import TINY

    root = tmp_path_factory.mktemp("logs")
    with open(root / "train.log", "w") as log:
        cli(["train", "--data", corpus, "--run-dir", root / "run", *TINY, *STEPS], log)
    return root / "run", (root / "train.log").read_text()


def test_a_training_run_into_a_log_writes_a_line_per_logged_step(run):
    run_dir, log = run
    assert "\r" not in log, log  # no bar redraws
    steps = re.findall(r"^depthlab train: step (\d+)/6: loss \S+ lr \S+ \S+ tok/s mfu \S+%", log, re.M)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == ["2", "4", "6"] and [r["step"] for r in records] == [2, 4, 6], log
    assert f"val_loss {records[-1]['val_loss']:.4f}" in log.splitlines()[-1]  # the final record's validation


def test_a_long_phase_without_a_bar_prints_plain_lines_a_short_one_nothing(monkeypatch, capsys):
    monkeypatch.setattr(progress, "START_S", 0.2)
    monkeypatch.setattr(progress, "EVERY_S", 0.3)
    with progress_bar(total=3, desc="slow", unit="step") as bar:  # stderr is captured: not a terminal
        for _ in range(3):
            time.sleep(0.4)
            bar.update()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3 and all(line.startswith("depthlab: slow: ") for line in lines), lines
    assert re.fullmatch(r"depthlab: slow: \d+ s, [0-3]/3 step", lines[0]), lines
    assert re.fullmatch(r"depthlab: slow: \d+ s, 3/3 step, done", lines[-1]), lines

    monkeypatch.setattr(progress, "START_S", 5.0)
    assert sum(progress_bar(range(1000), desc="quick")) == 499500
    assert capsys.readouterr().err == ""

    monkeypatch.setattr(progress, "START_S", 0.0)  # every phase announces itself at once, but not on rank 1
    monkeypatch.setenv("RANK", "1")
    list(progress_bar(range(3), desc="elsewhere"))
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_eval_and_analyze_phases_print_plain_lines_without_bars(run, monkeypatch, tmp_path):
    """With --no-progress (or into a log), each phase of eval and analyze says it runs and when it is done."""
    monkeypatch.setattr(progress, "START_S", 0.0)  # every phase counts as long
    run_dir, _ = run
    err = io.StringIO()
    cli(["eval", "ppl", run_dir, "--batch-size", 4, "--device", "cpu", "--no-progress"], err)
    assert re.search(r"^depthlab: eval: \d+ s, \d+/\d+ batch, done$", err.getvalue(), re.M), err.getvalue()
    err = io.StringIO()
    cli(["analyze", run_dir, "--tokens", 128, "--no-removal", "--probes", 1, "--device", "cpu", "--no-progress",
         "--out", tmp_path / "a"], err)
    for phase in ("analyze: metrics", "analyze: jacobians"):
        assert re.search(rf"^depthlab: {phase}: \d+ s, .*, done$", err.getvalue(), re.M), err.getvalue()
    assert "\r" not in err.getvalue()
