"""The run-directory layer: what a path is, one loader for every model path, and writers that replace only
their own kind of output."""

from __future__ import annotations

import json
import shutil

import pytest

from depthlab.cli import main
from depthlab.loading import load_model
from depthlab.paths import Kind, model_path, what_is
from tests.test_hf_fixtures import WORDS, make_checkpoint

TEXT = " ".join(WORDS * 30) + "\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A run inside runs/, its export, and a text in the checkpoint's (word-level) vocabulary."""
    root = tmp_path_factory.mktemp("rundir")
    make_checkpoint(root / "runs" / "only" / "checkpoints" / "step_0000007", "lns")
    assert main(["export", str(root / "runs" / "only"), str(root / "hf")]) == 0
    (root / "text.txt").write_text(TEXT)
    return root


def test_what_is_names_every_kind(world, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    (tmp_path / "prep").mkdir()
    (tmp_path / "prep" / "index.json").write_text(json.dumps({"format": "depthlab-tokens"}))
    (tmp_path / "report").mkdir()
    for name in ("report.html", "metrics.json"):
        (tmp_path / "report" / name).write_text("{}")
    expected = {world / "runs": Kind.RUNS, world / "runs" / "only": Kind.RUN,
                world / "runs" / "only" / "checkpoints" / "step_0000007": Kind.CHECKPOINT, world / "hf": Kind.HF,
                world / "text.txt": Kind.FILE, world / "missing": Kind.MISSING, tmp_path / "empty": Kind.EMPTY,
                tmp_path / "other": Kind.OTHER, tmp_path / "prep": Kind.PREPARED, tmp_path / "report": Kind.ANALYSIS}
    assert {p: what_is(p) for p in expected} == expected


def test_one_loader_for_every_model_path(world):
    for path in (world / "runs", world / "runs" / "only", world / "runs" / "only" / "checkpoints" / "step_0000007"):
        loaded = load_model(path)
        assert loaded.kind is Kind.CHECKPOINT and loaded.path.name == "step_0000007"
        assert loaded.cfg.model.norm_scheme == "lns" and loaded.meta.step == 7
    hf = load_model(world / "hf")
    assert hf.kind is Kind.HF and hf.cfg is None and hf.context == 32 and hf.seq_len == 32
    assert model_path(world / "runs")[1] == world / "runs" / "only" / "checkpoints" / "step_0000007"


def eval_loss(capsys, *argv) -> float:
    assert main(["eval", "ppl", *map(str, argv)]) == 0, capsys.readouterr().err
    return float(capsys.readouterr().out.split("loss ")[1].split()[0])


def test_eval_on_an_exported_hf_directory_gives_the_checkpoints_perplexity(world, capsys):
    data = ["--data", world / "text.txt", "--seq-len", 16]
    ours = eval_loss(capsys, world / "runs" / "only", *data)
    theirs = eval_loss(capsys, world / "hf", *data)
    assert theirs == pytest.approx(ours, abs=1e-4)  # the export computes the same function on the same tokens
    assert eval_loss(capsys, world / "runs", *data) == ours  # the parent of one run means that run


@pytest.mark.slow
def test_export_and_analyze_take_the_parent_of_one_run(world, tmp_path, capsys):
    assert main(["export", str(world / "runs"), str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "depthlab_export.json").read_text())["step"] == 7
    assert main(["analyze", str(world / "runs"), "--data", str(world / "text.txt"), "--tokens", "32", "--seq-len",
                 "16", "--no-removal", "--no-jacobian", "--out", str(tmp_path / "report")]) == 0
    assert what_is(tmp_path / "report") is Kind.ANALYSIS
    assert main(["compare", str(tmp_path / "report"), str(tmp_path / "report"), "--out", str(tmp_path / "cmp")]) == 0


def test_writers_replace_their_own_output_and_others_only_with_overwrite(world, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", str(world / "runs"), str(out)]) == 0
    (out / "stale.txt").write_text("from an earlier export")
    assert main(["export", str(world / "runs"), str(out)]) == 0  # an earlier export is replaced whole
    assert not (out / "stale.txt").exists() and what_is(out) is Kind.HF
    assert main(["prune", str(out), "--remove", "0:1", str(out)]) == 2  # never over its own input
    assert "own input" in capsys.readouterr().err
    assert main(["prune", str(out), "--remove", "0:1", str(out), "--overwrite"]) == 2  # not even with --overwrite
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 4
    assert main(["prune", str(out), "--remove", "0:1", str(tmp_path / "pruned")]) == 0
    assert json.loads((tmp_path / "pruned" / "config.json").read_text())["num_hidden_layers"] == 3
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    assert main(["export", str(world / "runs"), str(mine)]) == 2
    assert (mine / "notes.txt").read_text() == "my notes"
    assert main(["export", str(world / "runs"), str(mine), "--overwrite"]) == 0
    assert what_is(mine) is Kind.HF and not (mine / "notes.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary or lock file left


def test_import_replaces_an_earlier_import_but_not_a_run(world, tmp_path, capsys):
    shutil.copytree(world / "runs" / "only", tmp_path / "run")
    tok = tmp_path / "hf"
    shutil.copytree(world / "hf", tok)
    assert main(["import", str(tok), str(tmp_path / "ckpt")]) == 0
    assert main(["import", str(tok), str(tmp_path / "ckpt"), "--scheme", "lns"]) == 2  # an lns export: the scale
    assert "a second time" in capsys.readouterr().err                                 # is in its weights already
    (tok / "depthlab_export.json").unlink()  # a stock model: the scale is applied once
    assert main(["import", str(tok), str(tmp_path / "ckpt"), "--scheme", "lns"]) == 0
    assert load_model(tmp_path / "ckpt").cfg.model.norm_scheme == "lns"
    assert main(["import", str(tok), str(tmp_path / "run" / "checkpoints" / "step_0000007")]) == 2
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [[], ["--overwrite"]])
def test_train_prepare_and_export_refuse_with_one_rule(world, tmp_path, capsys, flags):
    """train's run directory, `data prepare --out` and export's OUT_DIR are claimed by one rule (ownership.claim): a
    file is refused even with --overwrite, another directory is refused in the same words unless --overwrite."""
    (tmp_path / "a-file").write_text("mine")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    text = str(world / "text.txt")
    commands = {  # the command's name in the error, the flag it names, its command line
        "train": ("--run-dir", lambda out: ["train", "--preset", "cpu-tiny", "--data", text, "--set",
                                            "train.max_steps=1", "--run-dir", str(out), "--no-progress"]),
        "data prepare": ("--out", lambda out: ["data", "prepare", text, "--out", str(out), "--vocab-size", "300",
                                               "--workers", "1", "--no-progress"]),
        "export": ("path", lambda out: ["export", str(world / "runs"), str(out)]),
    }
    for what, (choose, argv) in commands.items():
        assert main(argv(tmp_path / "a-file") + flags) == 2
        err = capsys.readouterr().err
        assert f"a-file is a file; {what} writes a directory there: choose another {choose}" in err, err
        assert (tmp_path / "a-file").read_text() == "mine"
        if not flags:
            assert main(argv(mine)) == 2
            err = capsys.readouterr().err
            assert "mine is a directory of other files, not " in err and " or pass --overwrite " in err, err
            assert (mine / "notes.txt").read_text() == "my notes"


# ---------------------------------------------------------------- the run folder's format
def test_the_step_directory_name_is_one_pair_and_checkpoints_sort_by_step(tmp_path):
    from depthlab.checkpoint import list_checkpoints, prune_checkpoints, step_dir, step_of, tidy_after_kill

    assert [step_of(step_dir(n)) for n in (0, 7, 10_000_003)] == [0, 7, 10_000_003]
    assert step_dir(7) == "step_0000007" and step_of("step_12") == 12  # any padding reads
    assert {step_of(n) for n in ("step_7.tmp", "step_7.old", "step_", "steps_7", "step_x")} == {None}
    ckpts = tmp_path / "run" / "checkpoints"
    for step in (10_000_000, 2, 9_999_999):  # past seven digits the names no longer sort as the steps do
        (ckpts / step_dir(step)).mkdir(parents=True)
    (ckpts / f"{step_dir(10_000_001)}.tmp").mkdir()  # a save killed half-way is no checkpoint
    assert [step_of(p.name) for p in list_checkpoints(tmp_path / "run")] == [2, 9_999_999, 10_000_000]
    doomed = prune_checkpoints(tmp_path / "run", 2, {p.name: True for p in list_checkpoints(tmp_path / "run")})
    assert [p.name for p in doomed] == [step_dir(2)]
    tidy_after_kill(tmp_path / "run")
    assert sorted(p.name for p in ckpts.iterdir()) == [step_dir(10_000_000), step_dir(9_999_999)]


def _rewrite_meta(ckpt, fields: dict) -> None:
    """meta.json holding `fields`, sealed with a fresh checksum (as a depthlab that wrote them would)."""
    from depthlab.checkpoint import META_DIGEST, meta_digest

    (ckpt / "meta.json").write_text(json.dumps({**fields, META_DIGEST: meta_digest(fields)}, indent=2) + "\n")


def test_checkpoint_meta_is_typed_and_reads_the_older_flat_layout(tmp_path, capsys):
    from depthlab.checkpoint import CheckpointMeta, verify_checkpoint

    ckpt = tmp_path / "ckpt"
    make_checkpoint(ckpt, "lns")
    meta = verify_checkpoint(ckpt)
    assert isinstance(meta, CheckpointMeta) and meta.step == 7 and "model.safetensors" in meta.files
    written = json.loads((ckpt / "meta.json").read_text())
    assert {"step", "data", "val", "files", "meta_sha256"} <= set(written)
    # as depthlab wrote it before the typed layout: the data's entries and the metrics beside the rest
    flat = {"step": 9, "skipped": 1, "loader": {"epoch": 0, "cursor": 3}, "world_size": 2, "cwd": "/x",
            "tokenizer_hash": "ab", "train_tokens": 100, "val_tokens": 10, "val_digest": "cd", "task": "finetune",
            "val_loss": 2.5, "val_ppl": 12.2, "files": meta.files}
    _rewrite_meta(ckpt, flat)
    old = verify_checkpoint(ckpt)
    assert (old.step, old.skipped, old.loader, old.world_size, old.cwd, old.tokenizer_hash) == \
        (9, 1, {"epoch": 0, "cursor": 3}, 2, "/x", "ab")
    assert old.data == {"train_tokens": 100, "val_tokens": 10, "val_digest": "cd", "task": "finetune"}
    assert old.val == {"val_loss": 2.5, "val_ppl": 12.2}
    assert capsys.readouterr().err == ""


def test_an_unknown_or_missing_meta_field_is_one_line(world, tmp_path, capsys):
    from depthlab.checkpoint import verify_checkpoint

    ckpt = tmp_path / "ckpt"
    shutil.copytree(world / "runs" / "only" / "checkpoints" / "step_0000007", ckpt)
    fields = json.loads((ckpt / "meta.json").read_text())
    del fields["meta_sha256"]
    _rewrite_meta(ckpt, {**fields, "shape_hint": 3, "zeta": "new"})  # from a newer depthlab
    assert verify_checkpoint(ckpt).step == 7 and verify_checkpoint(ckpt).data == fields["data"]
    err = capsys.readouterr().err.strip()
    assert err == (f"depthlab: warning: {ckpt}: meta.json has fields this depthlab does not know (shape_hint, zeta), "
                   "written by a newer version? They are ignored")  # once, one line
    del fields["step"]
    _rewrite_meta(ckpt, fields)
    assert main(["eval", "ppl", str(ckpt), "--data", str(world / "text.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"depthlab: error: corrupted checkpoint {ckpt}: its meta.json records no step;") and \
        len(err.splitlines()) == 1
