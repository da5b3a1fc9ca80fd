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
             "print(json.dumps({'runs': S.get_runs('depthlab'), 'logs': S.get_logs('depthlab', 'trackio_run')}))")


@pytest.mark.slow  # two training processes and a reader
def test_trackio_logs_what_tensorboard_gets_and_a_resume_goes_on_in_its_run(tmp_path, corpus):
    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "store"), "OMP_NUM_THREADS": "1"}
    run = tmp_path / "trackio_run"
    for resume in ([], ["--resume", str(run / "checkpoints" / "step_0000002")]):  # steps 3 and 4 again
        done = subprocess.run([sys.executable, "-m", "depthlab", "train", "--data", str(corpus), "--run-dir", str(run),
                               "--max-steps", "4", "--set", "train.ckpt_every=2", *resume, *TINY], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "Trackio" not in done.stdout  # its lines go to stderr
    stored = json.loads(subprocess.run([sys.executable, "-c", READ_BACK], env=env, capture_output=True, text=True,
                                       timeout=120, check=True).stdout)

    assert stored["runs"] == ["trackio_run"]  # the resume went on in the first run
    # the replayed steps are logged again, as TensorBoard gets them again: the newest last
    assert [r["step"] for r in stored["logs"]] == [1, 2, 3, 4, 3, 4]
    logged = {r["step"]: {k: v for k, v in r.items() if k not in ("step", "timestamp")} for r in stored["logs"]}
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
