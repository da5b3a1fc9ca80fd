"""What `eval --card` and the task readers keep (issue 60 items 2-3): a card keeps every section depthlab did not
write, a card whose metadata does not parse is one line naming it, and results keyed by a task's name never let
one file hide another of the same file name (`arc/test.jsonl` and `piqa/test.jsonl`), on a card or in a removal
sweep. A tiny random HF model marked as a depthlab export, real files, the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from depthlab import UserError
from depthlab.cli import main
from depthlab.eval.gen_tasks import read_tasks
from depthlab.eval.suite import TaskSuite
from depthlab.paths import EXPORT_INFO, short_names
from tests.test_analysis_support import save_hf_model

hub = pytest.importorskip("huggingface_hub")
pytest.importorskip("transformers")

USERS = "## Notes of the user\n\nTrained for the demo; ask before reuse.\n"


def questions(path: Path, n: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"question": f"the {i} quick", "choices": ["fox", "dog"], "answer": i % 2})
                            + "\n" for i in range(n)))
    return str(path)


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A tiny HF Llama marked as `depthlab export` output, with a card holding a result and a user's section after
    its Evaluation section."""
    from depthlab.card import Scores, _results

    d = save_hf_model(tmp_path_factory.mktemp("card") / "hf", "llama", n_layers=2)
    (d / EXPORT_INFO).write_text(json.dumps({"source": "nowhere", "step": 0}))
    old = Scores("mc", "c/mc.jsonl", {"acc": 0.25}).results()
    data = hub.ModelCardData(library_name="transformers", eval_results=old, model_name="hf")
    text = f"# hf\n\nAbout it.\n\n{_results(old)}\n\n{USERS}"
    hub.ModelCard(f"---\n{data.to_yaml()}\n---\n\n{text}").save(d / "README.md")
    return d


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_eval_card_keeps_the_users_sections_and_every_result_it_says(export, tmp_path, capsys):
    a, b = questions(tmp_path / "a" / "mc.jsonl", 4), questions(tmp_path / "b" / "mc.jsonl", 6)
    code, out, err = run(["eval", "tasks", str(export), "--tasks", a, b, "--card", str(export)], capsys)
    assert code == 0, err
    assert f"added 4 results to {export / 'README.md'}" in out
    card = hub.ModelCard.load(export / "README.md")
    got = {(r.task_name, r.dataset_name, r.metric_type) for r in card.data.eval_results}
    assert got == {("mc", "c/mc.jsonl", "acc"), *((name, path, m) for name, path in (("a/mc", a), ("b/mc", b))
                                                  for m in ("acc", "acc_norm"))}  # 1 earlier + the 4 said
    assert card.text.rstrip().endswith(USERS.rstrip()) and card.text.count("## Evaluation") == 1
    assert f"| a/mc | {a} | acc |" in card.text and "| mc | c/mc.jsonl | acc | 0.2500 |" in card.text


def test_a_task_file_given_twice_is_refused_before_the_model_loads(export, tmp_path, capsys):
    a = questions(tmp_path / "mc.jsonl", 4)
    before = (export / "README.md").read_text()
    code, _, err = run(["eval", "tasks", str(export), "--tasks", a, str(tmp_path / "." / "mc.jsonl"), "--card",
                        str(export)], capsys)
    assert code == 2 and err.count("\n") == 1 and f"--tasks names {a} twice" in err, err
    assert (export / "README.md").read_text() == before


def test_a_card_whose_metadata_does_not_parse_is_one_line_naming_it(export, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(export, bad)
    text = (bad / "README.md").read_text()
    (bad / "README.md").write_text(text.replace("library_name: transformers", "library_name: [transformers", 1))
    code, _, err = run(["eval", "tasks", str(bad), "--tasks", questions(tmp_path / "q.jsonl", 2), "--card",
                        str(bad)], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--card {bad}: cannot read its README.md: its metadata (the YAML between the --- lines) does not " \
           "parse at line" in err


def test_names_tell_apart_files_of_the_same_name():
    assert short_names(["x/arc/test.jsonl", "x/piqa/test.jsonl", "y/o.jsonl"], "--tasks") == \
        ["arc/test", "piqa/test", "o"]
    assert short_names(["a/b/t.jsonl", "c/b/t.jsonl"], "--tasks") == ["a/b/t", "c/b/t"]
    with pytest.raises(UserError, match="would be named 'mmlu', as another task's are"):
        short_names(["d/mmlu.jsonl"], "--removal-tasks", taken={"mmlu"})


def test_a_removal_sweep_keeps_both_tasks_of_one_file_name(tmp_path):
    """analyze --removal-generate: a 12-question task and a 4-question one in files of the same name are two
    tasks; one given twice is refused."""
    pairs = {"a": 12, "b": 4}
    for folder, n in pairs.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "t.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)})
                                                           + "\n" for i in range(n)))
    specs = [str(tmp_path / f / "t.jsonl") for f in pairs]
    tasks = read_tasks([*specs, "add:n=3"], "--removal-generate")
    assert [(t.name, len(t.pairs)) for t in tasks] == [("a/t", 12), ("b/t", 4), ("add:n=3", 3)]
    for twice in ([specs[0], specs[0]], ["add:n=3", "add:n=3"]):
        with pytest.raises(UserError, match="--removal-generate names .* twice"):
            read_tasks(twice, "--removal-generate")
    suite = TaskSuite.read([questions(tmp_path / "c" / "t.jsonl", 3), questions(tmp_path / "d" / "t.jsonl", 5)])
    assert {n: len(q) for n, q in suite.files.items()} == {"c/t": 3, "d/t": 5}
