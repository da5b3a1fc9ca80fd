"""Flags that would change nothing are refused (issue 34): every float flag of every command is finite, every
numeric flag in its range, a flag without the flag it acts with is an error; and what traced back (a pickle that
torch.load's weights_only refuses, a full disk under prune, a harness task's answer beyond its choices) ends in
one line. The bad-input table (test_bad_inputs.py) runs each listed command; these test the rules behind them."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import pickle
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from depthlab import UserError
from depthlab.cli import main, make_parser
from depthlab.config import Config, LoraConfig, apply_overrides
from depthlab.model.validate import validate


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthlab: error:"), err
    return err[0]


def option_actions():
    """(command, action) for every option of every subcommand, nested ones (data prepare) included."""
    def walk(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{prefix} {name}".strip())
            elif action.option_strings:
                yield prefix, action

    yield from walk(make_parser(), "")


def test_no_float_flag_of_any_command_takes_nan_or_inf():
    floats = []
    for command, action in option_actions():
        try:
            value = action.type("0.5") if action.type else None
        except (argparse.ArgumentTypeError, ValueError):  # an integer flag
            continue
        if isinstance(value, float):
            floats.append(f"{command} {action.option_strings[0]}")
            for bad in ("nan", "inf", "-inf"):
                assert "finite" in action.type(bad).problem
    # the family this rule covers, whichever module adds the flag
    assert {"train --gpu-memory", "finetune --lora-alpha", "analyze --inert-delta", "theory --c",
            "data prepare --val-fraction", "data prepare --unit-mb"} <= set(floats)


@pytest.mark.parametrize("argv, message", [
    (["train", "--dry-run", "--world-size", "0"], "--world-size must be at least 1, got 0"),
    (["train", "--dry-run", "--gpu-memory", "nan"], "--gpu-memory must be a finite number"),
    (["train", "--dry-run", "--gpu-memory", "0"], "--gpu-memory must be positive"),
    (["train", "--world-size", "2"], "--world-size has no effect without --dry-run"),
    (["train", "--gpu-memory", "80"], "--gpu-memory has no effect without --dry-run"),
    (["train", "--measure"], "--measure has no effect without --dry-run"),
    (["analyze", "x", "--window-seed", "-1", "--windows", "2"], "--window-seed must be between 0 and 4,294,967,295"),
    (["analyze", "x", "--window-seed", "5"], "--window-seed has no effect without --windows"),
    (["analyze", "x", "--interior", "-1", "0"], "--interior must be at least 0"),
    (["theory", "--depth", "1"], "--depth must be between 2 and 1,000,000"),
    (["theory", "--c", "inf"], "--c must be a finite number"),
    (["finetune", "m", "--data", "d", "--lora", "--lora-dropout", "1"], "--lora-dropout must be in [0, 1)"),
    (["eval", "ppl", "m", "--batch-size", "0"], "--batch-size must be at least 1"),
])
def test_a_value_a_flag_cannot_use_is_refused_before_the_command_reads_anything(argv, message, capsys):
    assert main(argv) == 2  # the paths named do not exist: the flag is what is refused
    assert message in one_error_line(capsys)


def test_text_that_is_not_a_number_stays_argparse_s_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["eval", "ppl", "m", "--batch-size", "x"])
    assert e.value.code == 2 and "invalid int value: 'x'" in one_error_line(capsys)


def test_dry_run_takes_the_plan_flags(capsys):
    assert main(["train", "--dry-run", "--world-size", "2", "--gpu-memory", "80"]) == 0
    assert "layout: 2 rank(s)" in capsys.readouterr().out


def test_a_model_beyond_int64_bytes_is_refused_by_validation_not_by_pytorch():
    cfg = apply_overrides(Config(), ["model.dim=1000000000000", "model.n_heads=1"])
    with pytest.raises(UserError, match="more fp32 bytes than any machine addresses"):
        validate(cfg)


def test_the_fsdp_mesh_fields_have_no_effect_under_ddp():
    for field in ("dp_replicate=2", "dp_shard=2"):
        with pytest.raises(UserError, match="has no effect with train.parallel=ddp"):
            validate(apply_overrides(Config(), [f"train.{field}"]))
        validate(apply_overrides(Config(), [f"train.{field}", "train.parallel=fsdp"]))


def lora_config(rank: int, targets=("q", "k", "v", "up", "down")) -> Config:
    cfg = apply_overrides(Config(), ["model.dim=32", "model.n_heads=4", "model.n_kv_heads=1", "model.ffn_dim=64"])
    cfg.train.lora = LoraConfig(rank=rank, targets=list(targets))
    return cfg


def test_a_lora_rank_above_the_narrowest_adapted_layer_is_refused():
    validate(lora_config(8))  # k and v project 32 -> 8 (one KV head of 8): rank 8 is their full width
    with pytest.raises(UserError, match=r"LoRA rank 9 is above the width of layers\.0\.attn\.k_proj \(8 x 32\)"):
        validate(lora_config(9))
    validate(lora_config(32, ["q", "up"]))  # 32 x 32 and 64 x 32
    with pytest.raises(UserError, match="at most 32"):
        validate(lora_config(33, ["q", "up"]))


def test_a_lora_alpha_must_be_finite():
    from depthlab.model.lora import check_lora

    with pytest.raises(UserError, match="positive finite"):
        check_lora(LoraConfig(rank=4, alpha=float("inf")))


def test_analyze_refuses_an_interior_that_leaves_no_block_and_says_when_the_default_does():
    from depthlab.analysis.curse import CurseSpec
    from depthlab.analysis.run import check_interior

    check_interior(4, CurseSpec(skip_first=1, skip_last=2))
    with pytest.raises(UserError, match="--interior 2 2 leaves no interior block of this 4-block model"):
        check_interior(4, CurseSpec(skip_first=2, skip_last=2))
    with pytest.warns(UserWarning, match="the default"):
        check_interior(3, CurseSpec())


def test_compare_refuses_one_label_for_two_models(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--labels", "x", "x"]) == 2
    assert "--labels names two models 'x'" in one_error_line(capsys)


def test_a_pickle_that_weights_only_refuses_is_one_line_naming_the_file_and_what_it_holds(tmp_path):
    from depthlab.pickled import load_tensors

    path = tmp_path / "trainer.pt"
    torch.save({"step": torch.tensor(3), "note": pathlib.PurePosixPath("x")}, path)
    with pytest.raises(UserError) as e:
        load_tensors(path)
    line = str(e.value)
    assert "\n" not in line and str(path) in line and "pathlib.PurePosixPath" in line
    torch.save({"step": torch.tensor(3)}, path)
    assert load_tensors(path)["step"] == 3


def test_the_refusal_names_the_pickle_of_a_model_directory(tmp_path):
    from depthlab.pickled import refusal

    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")
    line = str(refusal(tmp_path, pickle.UnpicklingError("Unsupported global: GLOBAL os.system was not allowed")))
    assert line.startswith(f"{tmp_path / 'pytorch_model.bin'} is a pickle") and "os.system" in line


def test_task_yaml_that_does_not_parse_is_named_with_its_line(tmp_path):
    pytest.importorskip("lm_eval")
    from depthlab.eval.harness import task_names_and_paths

    good = tmp_path / "good"
    good.mkdir()
    (good / "t.yaml").write_text("task: mine\nprocess_docs: !function utils.process\n")  # lm-eval's own tag
    assert task_names_and_paths([str(good / "t.yaml")])[0] == ["mine"]
    (tmp_path / "bad.yaml").write_text("task: mine\ndoc_to_choice: [a\nx: 1\n")
    with pytest.raises(UserError, match=r"bad\.yaml is not valid YAML: .* at line \d+"):
        task_names_and_paths([str(tmp_path / "bad.yaml")])


def test_every_multiple_choice_answer_is_checked_against_its_choices():
    pytest.importorskip("lm_eval")
    from depthlab.eval.harness import _check_answers

    docs = [{"c": ["a", "b"], "t": 1}, {"c": ["a", "b"], "t": "b"}, {"c": ["a", "b"], "t": 2}]
    task = SimpleNamespace(config=SimpleNamespace(output_type="multiple_choice"), multiple_input=0, eval_docs=docs,
                           doc_to_choice=lambda d: d["c"], doc_to_target=lambda d: d["t"])
    with pytest.raises(UserError, match="document 2: the answer 2 is not one of its 2 choices"):
        _check_answers(task, "task t")
    task.eval_docs = docs[:2]
    _check_answers(task, "task t")


@pytest.mark.slow
def test_prune_onto_a_disk_that_refuses_the_write_ends_in_one_line(tmp_path):
    """A file-size limit makes the weights' write fail as a full disk does (EFBIG for ENOSPC): safetensors'
    own error becomes the OSError it wraps, one line, exit 2."""
    from tests.test_hf_fixtures import tiny_hf

    tiny_hf("llama").save_pretrained(tmp_path / "hf")

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing the process
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    res = subprocess.run([sys.executable, "-m", "depthlab", "prune", str(tmp_path / "hf"), "--remove", "0:1",
                          str(tmp_path / "out")], capture_output=True, text=True, preexec_fn=limit,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("depthlab: error:") and "File too large" in res.stderr
    assert not (tmp_path / "out").exists()


def test_prune_of_a_vit_names_the_model_not_a_temporary_export(tmp_path, capsys):
    (tmp_path / "vit").mkdir()
    (tmp_path / "vit" / "config.json").write_text(json.dumps({"model_type": "vit"}))
    (tmp_path / "vit" / "model.safetensors").write_bytes(b"")
    assert main(["prune", str(tmp_path / "vit"), "--remove", "0:1", str(tmp_path / "o")]) == 2
    line = one_error_line(capsys)
    assert f"{tmp_path / 'vit'} is a ViT (an image classifier)" in line and "tmp" not in line.replace(
        str(tmp_path), "")


@pytest.mark.parametrize("scheme", ["pre", "lns", "mixln", "layerscale", "deepnorm"])
def test_the_plan_counts_every_parameter_from_two_blocks(scheme):
    from depthlab.model import build_model
    from depthlab.train.plan import memory_plan

    cfg = apply_overrides(Config(), [f"model.norm_scheme={scheme}", "model.n_layers=7"])
    with torch.device("meta"):
        exact = sum(p.numel() for p in build_model(cfg.model, init=False).parameters())
    assert memory_plan(cfg, 1)["layout"]["params"] == exact


def test_a_dry_run_of_a_million_blocks_is_a_plan_not_a_hang(capsys):
    assert main(["train", "--dry-run", "--set", "model.n_layers=1000000"]) == 0
    assert "1 rank(s)" in capsys.readouterr().out
