"""The long phases around training: `eval RUN` reads the validation tokens the run kept instead of reading and
tokenizing the corpus again, and validation, evaluation, tokenization and analysis show progress bars on a
terminal (never in captured output, never with --no-progress: there a long phase prints plain lines instead,
tests/test_logs.py)."""

import contextlib
import io
import json
import shutil

import numpy as np
import pytest
import torch

from depthlab.cli import main
from depthlab.config import Config
from depthlab.data.dataset import build_token_data, saved_val_tokens
from depthlab.data.tokenizer import load_tokenizer
from depthlab.eval.perplexity import evaluate
from depthlab.loading import load_model

TINY = ["--set", "model.dim=32", "--set", "model.n_layers=2", "--set", "model.n_heads=2", "--set", "model.ffn_dim=64",
        "--set", "model.vocab_size=300", "--set", "data.seq_len=32", "--set", "train.batch_size=4",
        "--set", "train.eval_every=2", "--set", "train.log_every=1", "--set", "train.warmup_steps=1",
        "--set", "train.monitor_every=0", "--max-steps", "2"]
ANALYZE = ["--tokens", "128", "--no-removal", "--probes", "1", "--device", "cpu"]


class Terminal(io.StringIO):
    """stderr as a terminal: where the bars are drawn."""

    def isatty(self) -> bool:
        return True


def run_cli(argv: list[str], stderr: io.StringIO | None = None) -> tuple[str, str]:
    """main(argv) in this process: (stdout, stderr); fails unless it exits 0."""
    out, err = io.StringIO(), stderr if stderr is not None else io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    assert code == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus):
    """A tiny run on a copy of the corpus (the tests move that copy away)."""
    root = tmp_path_factory.mktemp("long")
    shutil.copy(corpus, root / "c.txt")
    run_cli(["train", "--data", root / "c.txt", "--run-dir", root / "run", "--no-progress", *TINY])
    return root / "run"


def test_eval_run_reads_the_validation_tokens_the_run_kept(run, tmp_path):
    cfg = Config.load(run / "config.json")
    kept = np.load(run / "val_tokens.npy")
    again = build_token_data(cfg, tokenizer=load_tokenizer(run / "tokenizer.json")).val
    assert kept.dtype == again.dtype and np.array_equal(kept, again)  # what tokenizing again would give
    final = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["val_loss"]

    loaded = load_model(run)  # the kept tokens, memory-mapped, give the loss the tokens made again give
    fresh, reused = (evaluate(loaded.lm(), tokens, 32, 4, torch.device("cpu"))["val_loss"]
                     for tokens in (again, saved_val_tokens(run, loaded.meta.data["val_digest"])))
    assert reused == pytest.approx(fresh, abs=1e-6) and reused == pytest.approx(final, abs=1e-6)

    out, _ = run_cli(["eval", "ppl", run, "--batch-size", 4, "--device", "cpu"])
    assert "the tokens it kept in val_tokens.npy" in out
    assert f"loss {final:.4f}" in out and f"tokens {(len(kept) - 1) // 32 * 32}" in out
    # without its corpus: eval RUN needs nothing but the run
    corpus = run.parent / "c.txt"
    shutil.move(corpus, tmp_path / "away.txt")
    try:
        out, _ = run_cli(["eval", "ppl", run, "--batch-size", 4, "--device", "cpu", "--no-progress"])
    finally:
        shutil.move(tmp_path / "away.txt", corpus)
    assert f"loss {final:.4f}" in out
    # a file that is not the run's validation tokens (another run's, a damaged one) is not used: tokenized again
    shutil.copy(run / "val_tokens.npy", tmp_path / "kept.npy")
    try:
        np.save(run / "val_tokens.npy", kept[:-1])
        out, _ = run_cli(["eval", "ppl", run, "--batch-size", 4, "--device", "cpu"])
    finally:
        shutil.copy(tmp_path / "kept.npy", run / "val_tokens.npy")
    assert "val_tokens.npy" not in out and "the run's validation split (" in out
    assert f"loss {final:.4f}" in out


def no_bar(err: str) -> bool:
    """No bar was drawn: no carriage-return redraws, only plain lines (a long phase's: depthlab.progress)."""
    return "\r" not in err and all(line.startswith("depthlab") for line in err.splitlines())


def test_bars_are_drawn_on_a_terminal_only(run, tmp_path):
    argv = ["eval", "ppl", run, "--data", run.parent / "c.txt", "--device", "cpu"]
    _, err = run_cli(argv, Terminal())
    assert "tokenize:" in err and "eval:" in err and "\r" in err  # the --data tokenization, then the evaluation
    _, err = run_cli([*argv, "--no-progress"], Terminal())
    assert no_bar(err), err
    _, err = run_cli(argv)  # captured output, a pipe, a log file: no bar
    assert no_bar(err), err


def test_training_draws_its_tokenization_and_validation_bars(run, tmp_path):
    _, err = run_cli(["train", "--data", run.parent / "c.txt", "--run-dir", tmp_path / "r", *TINY], Terminal())
    assert "tokenize train" in err and "tokenize validation" in err and "validation:" in err
    _, err = run_cli(["train", "--data", run.parent / "c.txt", "--run-dir", tmp_path / "q", "--no-progress", *TINY],
                     Terminal())
    assert no_bar(err), err


@pytest.mark.slow
def test_analyze_draws_a_bar_per_pass(run, tmp_path):
    argv = ["analyze", run, "--data", run.parent / "c.txt", *ANALYZE]
    _, err = run_cli([*argv, "--out", tmp_path / "a"], Terminal())
    assert "tokenize calibration text" in err and "analyze: metrics" in err and "analyze: jacobians" in err
    _, err = run_cli([*argv, "--out", tmp_path / "b", "--no-progress"], Terminal())
    assert no_bar(err), err
