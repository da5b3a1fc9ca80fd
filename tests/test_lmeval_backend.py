"""lm-evaluation-harness's own command line and Python API on a depthlab run (`--model depthlab`,
depthlab.eval.lmeval): per question, the log-likelihoods lm-eval records equal `depthlab eval tasks`' on the
same local task, and so do its metrics."""

import json
import os
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install 'depthlab[eval]')")

from depthlab.config import Config, apply_overrides
from depthlab.eval.lmeval import DepthlabModel
from depthlab.eval.multiple_choice import evaluate_tasks
from depthlab.paths import find_checkpoint
from depthlab.train.trainer import train
from tests.test_lm_eval_agreement import TINY, WORDS, assert_agree, write_task

pytestmark = pytest.mark.slow  # trains a run; lm-eval's command line is a process of its own


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny lns run (its own byte-level BPE) trained 4 steps, and the questions as a depthlab task file and an
    lm-eval task over it."""
    tmp = tmp_path_factory.mktemp("lmeval")
    rng = random.Random(0)
    (tmp / "corpus.txt").write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(300)))
    sets = {**TINY, "train.max_steps": 4, "data.paths": f"[{tmp / 'corpus.txt'}]"}
    train(apply_overrides(Config(), [f"{k}={v}" for k, v in sets.items()]), run_dir=tmp / "run", progress=False)
    task, yaml = write_task(tmp / "tasks")
    return SimpleNamespace(dir=tmp / "run", task=task, yaml=yaml, ours=evaluate_tasks(tmp / "run", task, "cpu"))


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """The task's data is a local file: `datasets` must not ask a hub about it."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_lm_eval_command_line_scores_a_run_as_depthlab_eval_does(run, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "depthlab.eval.lmeval", "--model", "depthlab", "--model_args",
                           f"path={run.dir}", "--tasks", "depthlab_mc", "--include_path", str(run.yaml.parent),
                           "--device", "cpu", "--batch_size", "4", "--output_path", str(out), "--log_samples"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "depthlab_mc" in done.stdout and "acc_norm" in done.stdout  # lm-eval's table
    (samples,) = out.rglob("samples_depthlab_mc_*.jsonl")
    (results,) = out.rglob("results_*.json")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    for row in rows:  # the file holds each (log-likelihood, greedy) response as strings
        row["resps"] = [[(float(ll), greedy == "True")] for ((ll, greedy),) in row["resps"]]
    theirs = {"samples": {"depthlab_mc": rows}, "results": json.loads(results.read_text())["results"]}
    assert assert_agree(run.ours, theirs) < 1e-4


def test_simple_evaluate_scores_a_checkpoint_by_the_registered_name(run):
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(run.yaml.parent), include_defaults=False)
    theirs = lm_eval.simple_evaluate(model="depthlab", model_args=f"path={find_checkpoint(run.dir)},dtype=float32",
                                     tasks=["depthlab_mc"], task_manager=manager, device="cpu", batch_size="auto",
                                     log_samples=True, bootstrap_iters=0)
    assert assert_agree(run.ours, theirs) < 1e-4
    assert theirs["config"]["model"] == "depthlab"


def test_model_args_reach_the_model(run):
    lm = DepthlabModel.create_from_arg_string(f"path={run.dir},max_gen_toks=5,dtype=bfloat16",
                                              {"batch_size": "3", "device": "cpu"})
    assert (lm.batch_size, lm.max_gen_toks, lm.max_length) == (3, 5, 256)  # the run's context (model.max_seq_len)
    assert next(lm.scorer.logits.parameters()).dtype == torch.bfloat16
    (text,) = lm.generate_until([SimpleNamespace(args=("the quick brown", {}))])
    assert len(lm.tok_encode(text, add_special_tokens=False)) <= 5


def test_registering_depthlab_keeps_lm_evals_own_models():
    """Importing the backend must not hide lm-eval's built-in models (hf, ...) from the rest of the process: lm-eval
    loads them only while its registry is empty."""
    from lm_eval.api.registry import get_model

    import depthlab.eval.lmeval  # noqa: F401

    assert get_model("depthlab").__name__ == "DepthlabModel" and get_model("hf") is not None


def test_a_mistake_at_the_entry_is_one_line_before_anything_is_built(run):
    """Issue 60: every mistake printed lm-eval's traceback. A real process: one `depthlab: error:` line, status 2;
    from Python, one UserError."""
    from depthlab import UserError

    done = subprocess.run([sys.executable, "-m", "depthlab.eval.lmeval", "--model", "depthlab", "--model_args",
                           f"path={run.dir}", "--tasks", "depthlab_mc", "--include_path", str(run.yaml.parent),
                           "--batch_size", "abc"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2 and done.stderr == "depthlab: error: --batch_size abc: give a whole number of at " \
        "least 1, or auto\n", done.stderr
    with pytest.raises(UserError, match="named by path=, not pretrained="):
        DepthlabModel.create_from_arg_string(f"pretrained={run.dir}", {"device": "cpu"})
