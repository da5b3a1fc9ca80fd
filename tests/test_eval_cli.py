"""`depthlab eval KIND`: each kind's --help lists its own options only, and the spelling before the subcommands
(`depthlab eval MODEL [--tasks | --mmlu | --commonsense | --harness ...]`) gives the same output as the new one,
with one line on stderr that names the new spelling."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from depthlab.cli import main
from tests.test_mmlu import make_mmlu

COMMONSENSE = Path(__file__).parent / "data" / "commonsense" / "eval"
TINY = ["--set", "model.dim=32", "--set", "model.n_layers=2", "--set", "model.n_heads=2", "--set", "model.ffn_dim=64",
        "--set", "model.vocab_size=300", "--set", "model.max_seq_len=64", "--set", "data.seq_len=32", "--set",
        "train.batch_size=4", "--set", "train.warmup_steps=1", "--no-progress", "--max-steps", "2"]
PLACED = {"--device", "--device-map", "--max-memory", "--offload-folder"}
OPTIONS = {  # each kind's options, and nothing else
    "ppl": {"--data", "--seq-len", "--tokens", "--batch-size", *PLACED},
    "images": {"--data", "--batch-size", *PLACED},
    "tasks": {"--tasks", *PLACED},
    "harness": {"--harness", "--batch-size", *PLACED},
    "mmlu": {"--mmlu", "--mmlu-shots", "--table", "--overwrite", "--device"},
    "commonsense": {"--commonsense", "--mmlu", "--mmlu-shots", "--max-new-tokens", "--table", "--overwrite",
                    "--device"},
}
for _kind in ("ppl", "images", "tasks", "mmlu", "commonsense"):  # whose numbers go on an export's model card
    OPTIONS[_kind].add("--card")
for _options in OPTIONS.values():  # every kind, as the docs say eval does (issue 60)
    _options.add("--no-progress")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("kind", OPTIONS)
def test_each_kind_lists_only_its_own_options(kind):
    code, text, _ = run("eval", kind, "--help")
    assert code == 0
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", text)) - {"--help"} == OPTIONS[kind]


@pytest.fixture(scope="module")
def world(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("eval_cli")
    assert run("train", "--data", str(corpus), "--run-dir", str(root / "lm"), *TINY)[0] == 0
    assert run("train", "--preset", "vit-digits", "--run-dir", str(root / "vit"), "--no-progress", "--max-steps", "2",
               "--set", "train.warmup_steps=1", "--set", "model.dim=32", "--set", "model.n_layers=2", "--set",
               "model.n_heads=2", "--set", "model.ffn_dim=64")[0] == 0
    task = root / "task.jsonl"
    task.write_text("\n".join(json.dumps({"question": q, "choices": ["the dog", "a cat sat", "green trees"],
                                          "answer": i % 3}) for i, q in enumerate(["the quick", "birds sing", ""])))
    make_mmlu(root / "mmlu", n_dev=1, n_test=2)
    return root, str(root / "lm"), str(root / "vit"), str(task), str(root / "mmlu" / "csv")


def cases(world, tmp) -> list[tuple[list[str], list[str]]]:
    """(old spelling, new spelling) of each kind but the harness (an optional dependency, tested in
    test_lm_eval_agreement)."""
    _, lm, vit, task, mmlu = world
    return [
        (["eval", lm], ["eval", "ppl", lm]),
        (["eval", lm, "--seq-len", "16", "--batch-size", "2"], ["eval", "ppl", lm, "--seq-len", "16", "--batch-size",
                                                                "2"]),
        (["eval", vit], ["eval", "images", vit]),
        (["eval", lm, "--tasks", task], ["eval", "tasks", lm, "--tasks", task]),
        (["eval", lm, "--mmlu", mmlu, "--table", f"{tmp}/a"], ["eval", "mmlu", lm, "--mmlu", mmlu, "--table",
                                                               f"{tmp}/b"]),
        (["eval", lm, "--commonsense", str(COMMONSENSE), "--max-new-tokens", "2", "--table", f"{tmp}/c"],
         ["eval", "commonsense", lm, "--commonsense", str(COMMONSENSE), "--max-new-tokens", "2", "--table",
          f"{tmp}/d"]),
    ]


def test_the_old_spelling_says_the_new_one_and_gives_the_same_numbers(world, tmp_path):
    """With --no-progress too (issue 60: the old spelling with it failed, and so did the command it named): the
    command the deprecation line names runs, and gives the same numbers."""
    for old, new in cases(world, tmp_path):
        code, old_out, old_err = run(*old, "--no-progress")
        assert code == 0, old_err
        lines = [line for line in old_err.splitlines() if "deprecated" in line]
        assert len(lines) == 1 and f"depthlab eval {new[1]} " in lines[0], old_err
        said = shlex.split(lines[0].split("`")[1])[1:]
        assert said[:2] == new[:2] and "--no-progress" in said, said
        if "--table" in new:  # the table the old one wrote, written again under a new name
            said[said.index("--table") + 1] = new[new.index("--table") + 1]
        code, new_out, new_err = run(*said)
        assert code == 0 and "deprecated" not in new_err, new_err
        numbers = re.compile(r"\d+\.\d+")
        assert numbers.findall(old_out) and numbers.findall(old_out) == numbers.findall(new_out), (old_out, new_out)


def test_old_mmlu_keeps_its_table_name(world, tmp_path, monkeypatch):
    """`eval MODEL --mmlu DIR` wrote commonsense.md: the spelling it stands for says --table commonsense."""
    _, lm, _, _, mmlu = world
    monkeypatch.chdir(tmp_path)
    code, _, err = run("eval", lm, "--mmlu", mmlu)
    assert code == 0 and "--table commonsense" in err and (tmp_path / "commonsense.md").is_file()


def test_a_mistyped_kind_is_not_taken_for_a_model(capsys):
    code, _, err = run("eval", "perplexity", "runs/x")
    assert code == 2 and "invalid choice: 'perplexity'" in err and "deprecated" not in err
