"""depthlab's multiple-choice evaluator against lm-evaluation-harness itself, question by question, on local files:
lm-eval's `hf` backend on an export, and lm-eval through depthlab's adapter (`--harness`) on the checkpoint."""

import gc
import json
import random
from types import SimpleNamespace

import pytest

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install 'depthlab[eval]')")
pytest.importorskip("accelerate", reason="lm-eval's hf backend needs accelerate (pip install 'depthlab[eval]')")
pytest.importorskip("transformers")

from depthlab.cli import main
from depthlab.config import Config, apply_overrides
from depthlab.eval.harness import DepthlabLM, run_harness
from depthlab.eval.multiple_choice import evaluate_tasks, load_scorer, score_pairs
from depthlab.hf.exporter import export
from depthlab.train.trainer import train
from tests.test_device_map import nothing_in
from tests.test_hf_fixtures import make_checkpoint

WORDS = "the quick brown fox jumps over lazy dog and cat sat on mat while birds sing in green trees".split()
# whitespace at every boundary lm-eval treats specially, choices of very different lengths, multi-byte characters
# (acc_norm counts characters, acc_bytes bytes), an empty question (the prefix token is the context)
QUESTIONS = [
    {"question": "the quick brown", "choices": ["fox", "dog jumps over", "cat"], "answer": 0},
    {"question": "the lazy dog ", "choices": ["sat on mat", "  birds", "sing"], "answer": 0},
    {"question": "birds sing in\n", "choices": ["green trees", " the mat", "a"], "answer": 0},
    {"question": "", "choices": ["the cat", "fox"], "answer": 1},
    {"question": "cat sat on", "choices": [" mat", "the mat while birds sing", "é"], "answer": 1},
    {"question": "jumps over the  ", "choices": ["lazy", "quick brown fox"], "answer": 0},
    {"question": "Q: what sat on the mat?\nA:", "choices": ["the cat", "green trees in the dog", "über"], "answer": 0},
    {"question": "the fox\t", "choices": ["\tjumps", "sings", "sat on the lazy mat while"], "answer": 1},
    {"question": "green", "choices": ["trees", "trees and birds", "ñandú çà"], "answer": 2},
    {"question": "  the dog", "choices": ["and the cat", "über grün", "on"], "answer": 0},
    {"question": "while birds", "choices": ["sing in green trees", "sing", " sing "], "answer": 2},
    {"question": "over", "choices": ["the", "the lazy dog and the quick brown fox"], "answer": 1},
]
TASK_YAML = """task: depthlab_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: question
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
  - metric: acc_bytes
"""
TINY = {"model.dim": 32, "model.n_layers": 3, "model.n_heads": 2, "model.ffn_dim": 64, "model.vocab_size": 300,
        "model.norm_scheme": "lns", "data.seq_len": 32, "train.max_steps": 20, "train.eval_every": 1000,
        "train.warmup_steps": 2, "train.monitor_every": 0, "train.batch_size": 4}


def write_task(folder, rows=QUESTIONS):
    """The questions in depthlab's JSONL format, and an lm-eval task over the same file."""
    folder.mkdir(parents=True, exist_ok=True)
    task = folder / "mc.jsonl"
    task.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    (folder / "depthlab_mc.yaml").write_text(TASK_YAML.format(path=task))
    return task, folder / "depthlab_mc.yaml"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny lns model (byte-level BPE trained on its corpus) trained 20 steps, its export and the task files."""
    tmp = tmp_path_factory.mktemp("agree")
    rng = random.Random(0)
    (tmp / "corpus.txt").write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(600)))
    cfg = apply_overrides(Config(), [f"{k}={v}" for k, v in {**TINY, "data.paths": f"[{tmp / 'corpus.txt'}]"}.items()])
    train(cfg, run_dir=tmp / "run", progress=False)
    task, yaml = write_task(tmp / "tasks")
    return SimpleNamespace(run=tmp / "run", hf=export(tmp / "run", tmp / "hf"), task=task, yaml=yaml)


def by_doc(results: dict, name: str = "depthlab_mc") -> list[dict]:
    return sorted(results["samples"][name], key=lambda s: s["doc_id"])


def assert_agree(ours: dict, theirs: dict) -> float:
    """Every question's per-choice log-likelihoods within 1e-4, every pick and every metric identical; returns the
    largest log-likelihood difference."""
    samples = by_doc(theirs)
    assert len(samples) == ours["n"] == len(QUESTIONS)
    worst = 0.0
    for s, lls, picks, q in zip(samples, ours["scores"], ours["picks"], QUESTIONS):
        their_lls = [r[0][0] for r in s["resps"]]
        worst = max(worst, *(abs(a - b) for a, b in zip(lls, their_lls)))
        assert lls == pytest.approx(their_lls, abs=1e-4), q
        assert {m: float(picks[m] == q["answer"]) for m in ("acc", "acc_norm", "acc_bytes")} == \
            {m: s[m] for m in ("acc", "acc_norm", "acc_bytes")}, q
    for m in ("acc", "acc_norm", "acc_bytes"):
        assert ours[m] == theirs["results"]["depthlab_mc"][f"{m},none"]
    return worst


@pytest.mark.slow
def test_lm_eval_hf_backend_on_the_export_agrees_with_depthlab_question_by_question(trained):
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(trained.yaml.parent), include_defaults=False)
    theirs = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(trained.hf), "dtype": "float32"},
                                     tasks=["depthlab_mc"], task_manager=manager, device="cpu", batch_size=4,
                                     bootstrap_iters=0)
    assert assert_agree(evaluate_tasks(trained.hf, trained.task, "cpu"), theirs) < 1e-4
    assert assert_agree(evaluate_tasks(trained.run, trained.task, "cpu"), theirs) < 1e-4  # the checkpoint itself


@pytest.mark.slow
def test_harness_adapter_agrees_with_depthlab_and_runs_from_the_cli(trained, capsys):
    scorer = load_scorer(trained.run, "cpu")
    theirs = run_harness(scorer, [str(trained.yaml)], batch_size=5, log_samples=True)
    assert assert_agree(evaluate_tasks(scorer, trained.task), theirs) < 1e-4
    assert main(["eval", "harness", str(trained.run), "--harness", str(trained.yaml.parent), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "depthlab_mc" in out and "acc_norm" in out


@pytest.mark.slow
def test_harness_adapter_runs_a_scheme_that_does_not_export(tmp_path):
    make_checkpoint(tmp_path / "post", "post")
    rows = [{"question": "what color is the sky", "choices": ["blue", "very dark green"], "answer": 0},
            {"question": "the grass is ", "choices": ["green", "a b c"], "answer": 0}]
    task, yaml = write_task(tmp_path / "tasks", rows)
    scorer = load_scorer(tmp_path / "post", "cpu")
    theirs = run_harness(scorer, [str(yaml)], log_samples=True)["results"]["depthlab_mc"]
    ours = evaluate_tasks(scorer, task)
    assert {m: ours[m] for m in ("acc", "acc_norm")} == {m: theirs[f"{m},none"] for m in ("acc", "acc_norm")}


def test_rolling_loglikelihood_is_the_sum_over_lm_evals_windows(tmp_path):
    make_checkpoint(tmp_path / "ckpt", "lns")  # max_seq_len 32
    scorer = load_scorer(tmp_path / "ckpt", "cpu")
    lm = DepthlabLM(scorer, batch_size=3)
    text = " ".join(["the sky is red"] * 20)
    t = scorer.encode(text, False)
    assert len(t) == 80  # lm-eval's windows: 32 tokens predicted, seeing only their own window; the last 16
    windows = [([scorer.prefix_id], t[:32]), (t[31:32], t[32:64]), (t[47:64], t[64:])]  # after the 17 before them
    expected = sum(score_pairs(scorer, [w])[0][0] for w in windows)
    (rolling,) = lm.loglikelihood_rolling([SimpleNamespace(args=(text,))])
    assert rolling == pytest.approx(expected, abs=1e-4)


def test_greedy_generation_stops_at_until(trained):
    lm = DepthlabLM(load_scorer(trained.run, "cpu"))
    (free,) = lm.generate_until([SimpleNamespace(args=("the quick brown", {"max_gen_toks": 8}))])
    assert free
    (cut,) = lm.generate_until([SimpleNamespace(args=("the quick brown", {"until": [free[-1]], "max_gen_toks": 8}))])
    assert free.startswith(cut) and len(cut) < len(free)


def test_harness_input_errors_are_one_line(tmp_path, capsys):
    make_checkpoint(tmp_path / "ckpt", "lns")
    (tmp_path / "empty").mkdir()
    for args, msg in [(["--harness", str(tmp_path / "missing.yaml")], "missing.yaml does not exist"),
                      (["--harness", str(tmp_path / "empty")], "no lm-eval task definition"),
                      (["--harness", "x", "--tasks", "t.jsonl"], "unrecognized arguments: --tasks")]:
        try:
            code = main(["eval", "harness", str(tmp_path / "ckpt"), *args, "--device", "cpu"])
        except SystemExit as e:  # argparse's refusal of an option the kind does not take
            code = e.code
        assert code == 2
        err = capsys.readouterr().err
        assert err.startswith("depthlab: error:") and msg in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_harness_on_a_model_placed_by_a_device_map_prints_the_one_device_table(trained, tmp_path, capsys):
    """`eval harness` loads through the same map as `eval ppl`: half the blocks on cpu, the rest offloaded to disk
    and streamed in by accelerate's hooks; lm-eval's table is the one-device table, digit for digit."""
    layout = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
              "model.layers.1": "disk", "model.layers.2": "disk", "model.norm": "disk", "lm_head": "disk"}
    (tmp_path / "map.json").write_text(json.dumps(layout))
    placed = ["--device-map", str(tmp_path / "map.json"), "--offload-folder", str(tmp_path / "offload")]
    tables = []
    for where in (["--device", "cpu"], placed):
        argv = ["eval", "harness", str(trained.hf), "--harness", str(trained.yaml), "--batch-size", "4", *where]
        assert main(argv) == 0
        tables.append(capsys.readouterr().out)
    assert "depthlab_mc" in tables[0] and "acc_bytes" in tables[0]
    assert tables[0] == tables[1]
    gc.collect()
    assert nothing_in(tmp_path / "offload")  # its disk half went with the model


@pytest.mark.parametrize("progress", [[], ["--no-progress"]])
@pytest.mark.slow
def test_harness_prints_its_table_without_git_errors_or_bars_off_a_terminal(tmp_path, capfd, monkeypatch, progress):
    """lm-eval records the working directory's git commit by running `git describe`, which outside a repository
    printed "fatal: not a git repository" after a good run; its progress bars were drawn into logs and under
    --no-progress. Now stderr holds neither (lm-eval's own log lines about the task file aside)."""
    import subprocess

    make_checkpoint(tmp_path / "ckpt", "lns")
    _, yaml = write_task(tmp_path / "tasks")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above it either
    assert subprocess.run(["git", "describe", "--always"], capture_output=True).returncode != 0
    capfd.readouterr()
    assert main(["eval", "harness", str(tmp_path / "ckpt"), "--harness", str(yaml), "--device", "cpu", *progress]) == 0
    out, err = capfd.readouterr()
    assert "depthlab_mc" in out and "acc_norm" in out
    assert "fatal" not in err and "it/s" not in err and "Tokenizing" not in err, err
