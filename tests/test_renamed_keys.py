"""Configs saved before a key was renamed (depthlab.config.RENAMED: model.arch, now model.family): a run and its
checkpoints written under the old name load, resume exactly, evaluate, analyse, export and import as the same run
under the new name; the old name typed on the command line is refused in one line that names the new one."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from depthlab import UserError
from depthlab.analysis.analyze import Options
from depthlab.analysis.curse import CurseSpec
from depthlab.analysis.run import Request, run_request
from depthlab.checkpoint import CONFIG, META, META_DIGEST, list_checkpoints, meta_digest
from depthlab.cli import main
from depthlab.config import Config, apply_overrides
from tests.test_trainer import TINY, losses

TRAIN = [f"--set={k}={v}" for k, v in TINY.items()] + ["--no-progress", "--set=train.ckpt_every=2"]


def saved_before_the_rename(run):
    """Rewrite every config.json of `run` as depthlab wrote it when model.family was model.arch (the key in the same
    place), each checkpoint's manifest resealed as its writer would have sealed it."""
    for path in [run / CONFIG, *(c / CONFIG for c in list_checkpoints(run))]:
        cfg = json.loads(path.read_text())
        cfg["model"] = {("arch" if k == "family" else k): v for k, v in cfg["model"].items()}
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        if (path.parent / META).is_file():
            meta = json.loads((path.parent / META).read_text())
            meta["files"][CONFIG] = hashlib.sha256(path.read_bytes()).hexdigest()
            meta[META_DIGEST] = meta_digest(meta)
            (path.parent / META).write_text(json.dumps(meta, indent=2) + "\n")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """A 4-step run with checkpoints at 2 and 4 under today's key ("new") and the same files under the old ("old")."""
    root = tmp_path_factory.mktemp("renamed")
    assert main(["train", "--run-dir", str(root / "new"), "--data", str(corpus), "--max-steps", "4", *TRAIN]) == 0
    shutil.copytree(root / "new", root / "old")
    saved_before_the_rename(root / "old")
    assert '"arch": "llama"' in (root / "old" / "checkpoints" / "step_0000004" / CONFIG).read_text()
    return root / "new", root / "old"


def test_an_old_config_loads_as_the_new_one(runs):
    new, old = runs
    assert Config.load(old / CONFIG) == Config.load(new / CONFIG)
    assert Config.load(old / CONFIG).model.family == "llama"
    with pytest.raises(UserError, match="both model.arch and model.family"):
        Config.from_dict({"model": {"arch": "llama", "family": "qwen2"}})


def test_an_old_run_resumes_exactly(runs, corpus, tmp_path, capsys):
    new, old = runs
    branch = tmp_path / "branch"
    assert main(["train", "--resume", str(old / "checkpoints" / "step_0000002"), "--run-dir", str(branch),
                 "--data", str(corpus), "--max-steps", "4", *TRAIN]) == 0
    assert "resuming" in capsys.readouterr().err
    assert losses(branch) == losses(new)  # steps 3 and 4 again, bit for bit
    assert Config.load(branch / CONFIG) == Config.load(new / CONFIG)  # and saved under the new name


def test_an_old_checkpoint_evaluates_and_analyses_to_the_same_numbers(runs, capsys):
    """eval on the run's own validation split (read from its config), and the analysis with the curse index of the
    model rebuilt at initialisation from its config (the plots, which only draw these numbers, left out)."""
    out = {}
    for name, run in zip(("new", "old"), runs):
        ckpt = run / "checkpoints" / "step_0000004"
        assert main(["eval", "ppl", str(ckpt), "--no-progress"]) == 0
        out[name] = capsys.readouterr().out.splitlines()[-1]
        opts = Options(jacobian=False, curse=CurseSpec(skip_first=0, skip_last=0))
        res = run_request(Request(str(ckpt), tokens=64, seq_len=32, options=opts))
        out[name, "analysis"] = json.dumps([res["blocks"], res["removal"], res["curse_index"]])  # nan == nan
    assert out["old"].startswith("loss ") and out["old"] == out["new"]
    assert '"at_init"' in out["old", "analysis"] and out["old", "analysis"] == out["new", "analysis"]


def test_an_old_run_exports_and_imports_as_the_new_one(runs, tmp_path):
    new, old = runs
    for name, run in zip(("new", "old"), runs):
        assert main(["export", str(run), str(tmp_path / name)]) == 0
    for f in ("config.json", "model.safetensors"):
        assert (tmp_path / "old" / f).read_bytes() == (tmp_path / "new" / f).read_bytes()
    assert main(["import", str(tmp_path / "old"), str(tmp_path / "back")]) == 0
    assert Config.load(tmp_path / "back" / CONFIG).model.family == "llama"


def test_the_old_name_on_the_command_line_is_one_line_naming_the_new(tmp_path, capsys):
    with pytest.raises(UserError, match=r"^model.arch is now model.family: --set model.family=qwen2$"):
        apply_overrides(Config(), ["model.arch=qwen2"])
    assert main(["train", "--run-dir", str(tmp_path / "r"), "--dry-run", "--set", "model.arch=qwen2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == ["depthlab: error: model.arch is now model.family: --set model.family=qwen2"], err
