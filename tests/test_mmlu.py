"""MMLU from local files against lm-evaluation-harness's own scoring, question by question (0- and 5-shot), both
on-disk layouts, and the paper's table for two fine-tuned tiny models."""

import csv
import json
import random

import pytest

from depthlab.cli import main
from depthlab.eval.mmlu import LETTERS, evaluate_mmlu, read_mmlu
from depthlab.eval.multiple_choice import load_scorer
from tests.test_lm_eval_agreement import trained  # noqa: F401 - the tiny trained model and its export

pa = pytest.importorskip("pyarrow")
WORDS = "the quick brown fox jumps over lazy dog and cat sat on mat while birds sing in green trees".split()
SUBJECTS = ("high_school_biology", "anatomy", "college_physics")


def make_mmlu(root, n_dev=5, n_test=6, seed=0):
    """A hand-made MMLU in cais/mmlu's parquet layout and the original CSV layout, same questions."""
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    text = lambda k: " ".join(rng.choice(WORDS) for _ in range(k))  # noqa: E731
    data = {}
    for s in SUBJECTS:
        for split, n in (("dev", n_dev), ("test", n_test)):
            rows = [{"question": text(6) + "?" + (" " if i % 2 else "\n"), "subject": s,
                     "choices": [text(rng.randint(1, 4)) for _ in range(4)], "answer": rng.randrange(4)}
                    for i in range(n)]
            data[s, split] = rows
            (root / "parquet" / s).mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(rows), root / "parquet" / s / f"{split}-00000-of-00001.parquet")
            (root / "csv" / split).mkdir(parents=True, exist_ok=True)
            with open(root / "csv" / split / f"{s}_{split}.csv", "w", newline="") as f:
                csv.writer(f).writerows([r["question"], *r["choices"], LETTERS[r["answer"]]] for r in rows)
    return data


PROMPT = "{{question.strip()}}" + "".join(f"\\n{c}. {{{{choices[{i}]}}}}" for i, c in enumerate("ABCD"))
TASK = """task: dl_mmlu_{s}
dataset_path: parquet
dataset_kwargs:
  data_files:
    test: {root}/{s}/test-00000-of-00001.parquet
    dev: {root}/{s}/dev-00000-of-00001.parquet
test_split: test
fewshot_split: dev
fewshot_config:
  sampler: first_n
output_type: multiple_choice
doc_to_text: "{prompt}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: answer
description: "The following are multiple choice questions (with answers) about {name}.\\n\\n"
metric_list:
  - metric: acc
"""
GROUP = """group: dl_mmlu
task: [{tasks}]
aggregate_metric_list:
  - metric: acc
    weight_by_size: True
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mmlu")
    data = make_mmlu(tmp)
    tasks = tmp / "tasks"
    tasks.mkdir()
    for s in SUBJECTS:
        (tasks / f"{s}.yaml").write_text(TASK.format(s=s, root=tmp / "parquet", name=s.replace("_", " "),
                                                        prompt=PROMPT))
    (tasks / "group.yaml").write_text(GROUP.format(tasks=", ".join(f"dl_mmlu_{s}" for s in SUBJECTS)))
    return tmp, data, tasks


def test_both_layouts_read_the_same_questions(world):
    tmp, data, _ = world
    a, b = read_mmlu(tmp / "parquet"), read_mmlu(tmp / "csv")
    assert sorted(a) == sorted(b) == sorted(SUBJECTS)
    for s in SUBJECTS:
        for split in ("dev", "test"):
            assert a[s][split] == b[s][split]
            assert [q.answer for q in a[s][split]] == [r["answer"] for r in data[s, split]]


@pytest.mark.parametrize("shots", [0, 5])
@pytest.mark.slow
def test_mmlu_agrees_with_lm_eval_question_by_question(world, trained, shots):  # noqa: F811
    lm_eval = pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate")
    from lm_eval.tasks import TaskManager

    tmp, _, tasks = world
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    theirs = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(trained.hf), "dtype": "float32"},
                                     tasks=["dl_mmlu"], task_manager=manager, device="cpu", batch_size=4,
                                     num_fewshot=shots, bootstrap_iters=0, log_samples=True)
    subjects = read_mmlu(tmp / "parquet")
    for model in (trained.hf, trained.run):  # the export, and the checkpoint it came from
        ours = evaluate_mmlu(load_scorer(model, "cpu"), subjects, shots)
        worst = 0.0
        for s in SUBJECTS:
            samples = sorted(theirs["samples"][f"dl_mmlu_{s}"], key=lambda x: x["doc_id"])
            mine = ours["subjects"][s]
            assert len(samples) == mine["n"] == 6
            for sample, lls, pick in zip(samples, mine["scores"], mine["picks"]):
                their = [r[0][0] for r in sample["resps"]]
                worst = max(worst, *(abs(x - y) for x, y in zip(lls, their)))
                assert sample["acc"] == float(pick == sample["doc"]["answer"])
            assert mine["acc"] == pytest.approx(theirs["results"][f"dl_mmlu_{s}"]["acc,none"], abs=1e-12)
        assert worst < 1e-4, worst
        assert ours["micro"] == pytest.approx(theirs["results"]["dl_mmlu"]["acc,none"], abs=1e-12)
        assert ours["macro"] == pytest.approx(sum(ours["subjects"][s]["acc"] for s in SUBJECTS) / 3)


def test_the_paper_table_for_two_models(world, trained, tmp_path, capsys):  # noqa: F811
    from depthlab.hf.exporter import export
    from tests.test_commonsense import EVAL

    tmp, _, _ = world
    other = export(trained.run, tmp_path / "export")
    prefix = tmp_path / "paper"
    code = main(["eval", "commonsense", str(trained.run), str(other), "--commonsense", str(EVAL), "--mmlu",
                 str(tmp / "csv"), "--mmlu-shots", "5", "--table", str(prefix), "--max-new-tokens", "4", "--device",
                 "cpu"])
    out = capsys.readouterr()
    assert code == 0, out.err
    md = (tmp_path / "paper.md").read_text()
    assert "| Model | MMLU | BoolQ | ARC-e | PIQA | HellaSwag | OBQA | WinoGrande | Avg. |" in md
    assert "MMLU by log-likelihood (5-shot, micro average over 18 questions)" in md
    tables = json.loads((tmp_path / "paper.json").read_text())["tables"]
    assert set(tables) == {"generation", "loglik", "paper_generation", "paper_loglik"}
    for form in ("generation", "loglik"):
        rows = tables[f"paper_{form}"]
        assert rows[str(trained.run)]["MMLU"] == rows[str(other)]["MMLU"]  # a checkpoint and its export agree
        row = rows[str(trained.run)]
        cols = ["MMLU", "BoolQ", "ARC-e", "PIQA", "HellaSwag", "OBQA", "WinoGrande"]
        assert row["Avg."] == pytest.approx(sum(row[c] for c in cols) / 7, abs=0.06)


def test_mmlu_input_errors_are_one_line(world, tmp_path, capsys):
    from tests.test_hf_fixtures import make_checkpoint

    make_checkpoint(tmp_path / "ckpt", "lns")
    (tmp_path / "empty").mkdir()
    bad = tmp_path / "bad" / "test"
    bad.mkdir(parents=True)
    (bad / "x_test.csv").write_text("q,a,b,c,d,E\n")
    for args, msg in [(["--mmlu", str(tmp_path / "missing")], "not a directory"),
                      (["--mmlu", str(tmp_path / "empty")], "no subject with test questions"),
                      (["--mmlu", str(tmp_path / "bad")], "the answer must be 0-3 or A-D"),
                      (["--mmlu", str(world[0] / "csv"), "--mmlu-shots", "6"], "needs 6 dev questions")]:
        argv = ["eval", "mmlu", str(tmp_path / "ckpt"), *args, "--table", str(tmp_path / "t"), "--device", "cpu"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("depthlab: error:") and msg in err and err.count("\n") == 1, err
        assert not (tmp_path / "t.md").exists()


@pytest.mark.slow
def test_the_recipe_from_pretraining_to_the_paper_table(world, tmp_path, capsys):
    """docs/downstream.md's recipe on tiny models: pretrain pre and lns, fine-tune both (full and LoRA), one
    table."""
    from depthlab.data.instructions import prompt_of, read_records
    from tests.test_commonsense import EVAL
    from tests.test_finetune import TRAIN

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(prompt_of(r["instruction"], r["input"]) + r["output"]
                                for r in read_records(TRAIN)) * 4)
    tiny = [f"--set={k}={v}" for k, v in {"model.dim": 32, "model.n_layers": 2, "model.n_heads": 2,
                                           "model.ffn_dim": 64, "model.vocab_size": 400, "model.max_seq_len": 256,
                                           "data.seq_len": 64, "train.batch_size": 4, "train.eval_every": 1000,
                                           "train.warmup_steps": 2, "train.monitor_every": 0}.items()]
    for scheme in ("pre", "lns"):
        assert main(["train", "--scheme", scheme, "--data", str(corpus), "--run-dir", str(tmp_path / scheme),
                     "--max-steps", "10", "--no-progress", *tiny]) == 0
        for run, lora in ((f"{scheme}-ft", []), (f"{scheme}-lora", ["--lora", "--lora-rank", "4"])):
            assert main(["finetune", str(tmp_path / scheme), "--data", str(TRAIN), "--run-dir", str(tmp_path / run),
                         "--seq-len", "200", "--no-progress", "--set", "train.max_steps=3", "--set",
                         "train.batch_size=2", *lora]) == 0
    capsys.readouterr()
    models = [str(tmp_path / f"{s}-{kind}") for kind in ("ft", "lora") for s in ("pre", "lns")]
    assert main(["eval", "commonsense", *models, "--commonsense", str(EVAL), "--mmlu", str(world[0] / "parquet"),
                 "--table", str(tmp_path / "paper"), "--max-new-tokens", "4", "--device", "cpu"]) == 0
    rows = json.loads((tmp_path / "paper.json").read_text())["tables"]["paper_generation"]
    assert list(rows) == models and all(set(r) == {"MMLU", "BoolQ", "ARC-e", "PIQA", "HellaSwag", "OBQA",
                                                   "WinoGrande", "Avg."} for r in rows.values())
