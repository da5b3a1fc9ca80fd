"""`--set train.trackio=true`: Trackio's local store gets what TensorBoard gets (callbacks.scalars of every logged
record: TensorBoardLogger writes exactly those), a resumed run goes on in the same Trackio run, and without the
package the run stops in one line.

Each command runs as its own process with TRACKIO_DIR in the test's folder: Trackio reads that variable once, at
import, so this is how its store is kept out of the home directory (and out of other tests' way)."""

import json
import os
import subprocess
import sys

import pytest

from depthlab.cli import main
from depthlab.runfolder import read_metrics
from depthlab.train.callbacks import scalars

TINY = ["--no-progress", "--set", "model.dim=32", "--set", "model.n_layers=2", "--set", "model.n_heads=2", "--set",
        "model.ffn_dim=64", "--set", "model.vocab_size=300", "--set", "data.seq_len=32", "--set", "train.batch_size=4",
        "--set", "train.log_every=1", "--set", "train.eval_every=2", "--set", "train.monitor_every=2", "--set",
        "train.warmup_steps=1", "--set", "train.trackio=true"]

READ_BACK = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; "
             "runs = S.get_run_records('depthlab'); "
             "print(json.dumps([{'name': r['name'], 'logs': S.get_logs('depthlab', run_id=r['id'])} for r in runs]))")


def _train(run, corpus, env, *flags):
    done = subprocess.run([sys.executable, "-m", "depthlab", "train", "--data", str(corpus), "--run-dir", str(run),
                           *flags, *TINY], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Trackio" not in done.stdout  # its lines go to stderr


def _stored(env) -> list[dict]:
    """The Trackio runs of project depthlab, oldest first: {"name", "logs": its logged records, in order}."""
    return json.loads(subprocess.run([sys.executable, "-c", READ_BACK], env=env, capture_output=True, text=True,
                                     timeout=120, check=True).stdout)


def _name(run) -> str:
    return json.loads((run / "trackio.json").read_text())["run"]


@pytest.mark.slow  # two training processes and a reader
def test_trackio_logs_what_tensorboard_gets_and_a_resume_goes_on_in_its_run(tmp_path, corpus):
    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "store"), "OMP_NUM_THREADS": "1"}
    run = tmp_path / "trackio_run"
    for resume in ([], ["--resume", str(run / "checkpoints" / "step_0000002")]):  # steps 3 and 4 again
        _train(run, corpus, env, "--max-steps", "4", "--set", "train.ckpt_every=2", *resume)
    [stored] = _stored(env)  # the resume went on in the first run
    assert stored["name"] == _name(run) and _name(run).startswith("trackio_run-")
    # the replayed steps are logged again, as TensorBoard gets them again: the newest last
    logs = stored["logs"]
    assert [r["step"] for r in logs] == [1, 2, 3, 4, 3, 4]
    logged = {r["step"]: {k: v for k, v in r.items() if k not in ("step", "timestamp")} for r in logs}
    records = read_metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert logged == {r["step"]: scalars(r) for r in records}
    assert "depth/var/layer_02" in logged[4] and "val_loss" in logged[2]  # per-block lists and validation
    assert (tmp_path / "store" / "depthlab.db").is_file()


def test_trackio_missing_is_one_line(tmp_path, corpus, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trackio", None)  # as if not installed: importing it raises ImportError
    code = main(["train", "--data", str(corpus), "--run-dir", str(tmp_path / "r"), "--max-steps", "1", *TINY])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1] == ("depthlab: error: train.trackio needs the `trackio` package: pip install 'depthlab[trackio]'")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow  # three training processes and a reader
def test_runs_of_one_name_in_two_folders_resume_each_into_its_own_trackio_run(tmp_path, corpus):
    """ta/exp and tb/exp: Trackio resumes a run by name, the newest of that name, so naming a Trackio run after its
    folder alone sent ta/exp's resumed steps into tb/exp's run."""
    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "store"), "OMP_NUM_THREADS": "1"}
    ta, tb = tmp_path / "ta" / "exp", tmp_path / "tb" / "exp"
    for run in (ta, tb):
        _train(run, corpus, env, "--max-steps", "4", "--set", "train.ckpt_every=2")
    _train(ta, corpus, env, "--max-steps", "4", "--set", "train.ckpt_every=2", "--resume",
           str(ta / "checkpoints" / "step_0000002"))  # steps 3 and 4 again, into ta/exp's Trackio run
    first, second = _stored(env)
    assert [r["step"] for r in first["logs"]] == [1, 2, 3, 4, 3, 4]  # ta/exp's
    assert [r["step"] for r in second["logs"]] == [1, 2, 3, 4]  # tb/exp's, untouched
    assert [first["name"], second["name"]] == [_name(ta), _name(tb)] and _name(ta) != _name(tb)


@pytest.mark.slow  # two training processes and a reader
def test_steps_a_kill_kept_from_trackio_are_sent_on_resume(tmp_path, corpus):
    """A run killed at step 8 after its checkpoint at step 6, while Trackio still held steps 5 to 8 (it sends every
    half second): the store ends at step 4, metrics.jsonl at 8. The resume from step 6 sends 5 and 6 again before
    training 7 and 8, so the Trackio run has every step once, with metrics.jsonl's values."""
    pytest.importorskip("trackio")
    import shutil
    import sqlite3

    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "store"), "OMP_NUM_THREADS": "1"}
    run = tmp_path / "r"
    _train(run, corpus, env, "--max-steps", "8", "--set", "train.ckpt_every=3")
    # what the kill left: no step-8 checkpoint, steps 5-8 never reached the store
    shutil.rmtree(run / "checkpoints" / "step_0000008")
    with sqlite3.connect(tmp_path / "store" / "depthlab.db") as db:
        assert db.execute("DELETE FROM metrics WHERE step > 4").rowcount == 4
    _train(run, corpus, env, "--max-steps", "8", "--set", "train.ckpt_every=3", "--resume", "auto")
    [stored] = _stored(env)
    logs = stored["logs"]
    assert sorted(r["step"] for r in logs) == list(range(1, 9))
    records = {r["step"]: scalars(r) for r in read_metrics(run)}
    assert all({k: v for k, v in r.items() if k not in ("step", "timestamp")} == records[r["step"]] for r in logs)
