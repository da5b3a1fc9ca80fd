"""What never happens to a user's work (issue 34, items 1-3 and 13): a command writes nothing that is, holds or sits
inside one of its inputs, --overwrite or not; a symlink does not walk around the one-writer lock; runs started
together under a new folder do not trip over each other; SIGTERM unwinds like Ctrl-C, and what a killed writer
left is cleared by the next one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from depthlab import ownership
from depthlab.cli import main
from depthlab.paths import LOCK_SUFFIX
from tests.test_faults import ENV, spawn
from tests.test_hf_fixtures import WORDS, make_checkpoint
from tests.test_trainer import sets

TEXT = " ".join(WORDS * 30) + "\n"
TRAIN = ["--no-progress", "--max-steps", "2", *sets(train__warmup_steps=1)]


def files(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots for p in sorted(root.rglob("*")) if p.is_file()}


def refused(capsys, *argv) -> str:
    """Run the CLI, expecting one error line naming the command's own input; returns it."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "own input" in err, (argv, err)
    return err


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.fixture
def run(tmp_path) -> Path:
    """runs/only: a run directory with one checkpoint (its tokenizer too) and metrics."""
    home = tmp_path / "runs" / "only"
    make_checkpoint(home / "checkpoints" / "step_0000007", "lns")
    (home / "metrics.jsonl").write_text(json.dumps({"step": 7, "loss": 1.0}) + "\n")
    return home


# ---------------------------------------------------------------- item 1: an output that is or holds an input
def test_export_never_replaces_its_own_source(run, capsys):
    before = files(run.parent)
    for argv in ([run, run], [run, run, "--overwrite"], [run, run.parent, "--overwrite"],
                 [run.parent, run.parent, "--overwrite"], [run, run / "hf"],
                 [run, run, "--adapter-only", "--overwrite"]):
        refused(capsys, "export", *argv)
    assert files(run.parent) == before and not (run / "hf").exists()


def test_export_through_a_symlink_to_its_source_is_refused(run, tmp_path, capsys):
    (tmp_path / "link").symlink_to(run)
    before = files(run)
    refused(capsys, "export", run, tmp_path / "link", "--overwrite")
    assert files(run) == before


def test_data_prepare_never_writes_over_its_text(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"{i}.txt").write_text(TEXT)
    tok = tmp_path / "tok"
    tok.mkdir()
    before = files(corpus)
    flags = ["--vocab-size", 300, "--workers", 1, "--no-progress"]
    for inputs, out in (([corpus], corpus), ([corpus / "0.txt"], corpus), ([f"{corpus}/*.txt"], corpus),
                        ([corpus], corpus / "prepared"), ([corpus], tmp_path)):
        for overwrite in ([], ["--overwrite"]):
            refused(capsys, "data", "prepare", *inputs, "--out", out, *flags, *overwrite)
    (tok / "tokenizer.json").write_text("{}")
    refused(capsys, "data", "prepare", corpus / "0.txt", "--out", tok, "--tokenizer", tok / "tokenizer.json",
            "--overwrite", *flags)
    assert files(corpus) == before and not (corpus / "prepared").exists()


def test_train_never_writes_its_run_into_its_data(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(TEXT)
    before = files(corpus)
    for where in (["--run-dir", corpus], ["--run-dir", corpus, "--overwrite"], ["--out", corpus],
                  ["--run-dir", corpus / "run"], ["--run-dir", tmp_path, "--overwrite"]):
        refused(capsys, "train", "--data", corpus, *where, *TRAIN)
    assert files(corpus) == before and sorted(p.name for p in corpus.iterdir()) == ["a.txt"]


def test_train_and_finetune_from_a_run_into_it_delete_nothing(run, tmp_path, capsys):
    """--init-from / finetune's MODEL / a --resume source inside the run directory: refused before its checkpoints
    are deleted (they were deleted first, then the source was missing)."""
    (tmp_path / "text.txt").write_text(TEXT)
    records = tmp_path / "records.json"
    records.write_text(json.dumps([{"instruction": "say", "input": "", "output": "red"}] * 5))
    ckpt = run / "checkpoints" / "step_0000007"
    before = files(run)
    data = ["--data", tmp_path / "text.txt"]
    refused(capsys, "train", *data, "--init-from", ckpt, "--run-dir", run, "--overwrite", *TRAIN)
    refused(capsys, "train", *data, "--init-from", run, "--run-dir", run, "--overwrite", *TRAIN)
    refused(capsys, "train", *data, "--init-from", ckpt, "--run-dir", run.parent, "--overwrite", *TRAIN)
    refused(capsys, "finetune", run, "--data", records, "--run-dir", run, "--overwrite", "--no-progress")
    refused(capsys, "finetune", run, "--data", records, "--run-dir", run.parent, "--overwrite", "--no-progress")
    refused(capsys, "finetune", run, "--data", records, "--out", run, "--no-progress")
    assert files(run) == before


def test_analyze_and_compare_never_write_over_their_data(run, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(TEXT)
    before = files(corpus)
    flags = ["--tokens", 32, "--seq-len", 16, "--no-removal", "--no-jacobian", "--overwrite"]
    refused(capsys, "analyze", run, "--data", corpus, "--out", corpus, *flags)
    refused(capsys, "compare", run, run, "--data", corpus / "a.txt", "--out", corpus, *flags)
    assert files(corpus) == before


# ---------------------------------------------------------------- issue 48 items 1, 3, 5: every path a command reads
@pytest.mark.slow
def test_prune_never_deletes_the_analysis_it_ranks_by(tmp_path, monkeypatch, capsys):
    """`prune M DIR --drop-lowest K --analysis DIR --overwrite` read DIR's ranking, then replaced DIR with the pruned
    model: the analysis was gone. The analysis is prune's input, named with --analysis or by default."""
    from tests.test_analysis_support import TEXT as CODE, save_hf_model

    hf = save_hf_model(tmp_path / "hf", "llama")
    (tmp_path / "t.txt").write_text(CODE)
    analysis = tmp_path / "analysis" / "hf"  # analyze's default for a model named hf, from tmp_path
    assert main(["analyze", str(hf), "--data", str(tmp_path / "t.txt"), "--tokens", "64", "--seq-len", "32",
                 "--no-jacobian", "--no-progress", "--out", str(analysis)]) == 0
    before, _ = files(tmp_path / "analysis"), capsys.readouterr()
    for out in (analysis, analysis.parent):
        err = refused(capsys, "prune", hf, out, "--drop-lowest", 1, "--analysis", analysis, "--overwrite")
        assert f"OUT_DIR {out}" in err and "prune's own input --analysis" in err
    monkeypatch.chdir(tmp_path)
    refused(capsys, "prune", hf, "analysis/hf", "--drop-lowest", 1, "--overwrite")  # the default analysis
    assert files(tmp_path / "analysis") == before


def test_import_never_writes_over_the_tokenizer_it_reads(tmp_path, capsys):
    from tests.test_analysis_support import save_hf_model

    hf = save_hf_model(tmp_path / "hf", "llama")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tokenizer.json").write_bytes((hf / "tokenizer.json").read_bytes())
    before, _ = files(tmp_path / "out"), capsys.readouterr()
    err = refused(capsys, "import", hf, tmp_path / "out", "--tokenizer", tmp_path / "out" / "tokenizer.json",
                  "--overwrite")
    assert "import's own input --tokenizer" in err and files(tmp_path / "out") == before


@pytest.mark.parametrize("command", ["analyze", "eval ppl"])
def test_an_offload_folder_is_never_the_model_nor_inside_what_the_command_reads(run, tmp_path, capsys, command):
    """The weights a device map puts on disk are written into --offload-folder (and left there by a killed run):
    never into the model's directory or its data; one line names the option and what the path is to the command."""
    (tmp_path / "text.txt").write_text(TEXT)
    before = files(run)
    data = ["--data", tmp_path / "text.txt"]
    for folder, role in ((run, f"is {command}'s own input MODEL"), (run / "offload", f"is inside {command}'s own "
                         "input MODEL"), (tmp_path / "text.txt", f"is {command}'s own input --data")):
        err = refused(capsys, *command.split(), run, *data, "--device-map", "auto", "--offload-folder", folder)
        assert err.startswith(f"depthlab: error: --offload-folder {folder} {role}") and \
            err.endswith("choose another --offload-folder"), err
    assert files(run) == before and not (run / "offload").exists()


# ---------------------------------------------------------------- item 2: the lock is the resolved path's
@pytest.mark.slow
def test_a_second_trainer_through_a_symlink_is_refused(run, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(run)
    (tmp_path / "text.txt").write_text(TEXT)
    before = files(run)
    with ownership.locked(run, "test"):  # this process is the running trainer
        for overwrite in ([], ["--overwrite"]):
            res = subprocess.run([sys.executable, "-m", "depthlab", "train", "--run-dir", str(link), "--data",
                                  str(tmp_path / "text.txt"), *map(str, TRAIN), *overwrite], env=ENV,
                                 capture_output=True, text=True, timeout=300)
            assert res.returncode == 2 and "in use" in res.stderr and f"pid {os.getpid()}" in res.stderr, res.stderr
    assert files(run) == before and ownership._lock_file(link) == ownership._lock_file(run)


# ---------------------------------------------------------------- item 3: parents made at once
def test_writers_making_the_same_new_parents_at_once_all_succeed(tmp_path):
    n = 8
    for attempt in range(60):
        start, errors, made = threading.Barrier(n), [], []

        def make(i, attempt=attempt, start=start, errors=errors, made=made):
            start.wait()
            try:
                made.append(ownership._make_parents(tmp_path / f"try{attempt}" / "sweep" / "cells" / f"run{i}", ""))
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=make, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        created = [p for m in made for p in m]  # each parent created once, by one writer: only it removes it
        assert sorted(created) == sorted(tmp_path / f"try{attempt}" / p for p in ("", "sweep", "sweep/cells"))


@pytest.mark.slow
def test_runs_started_in_the_same_second_take_the_next_free_name(tmp_path):
    from depthlab.runfolder import _take_new

    name = tmp_path / "runs" / "cpu-tiny-lns-20260101-000000"
    with holding(name):  # another run took the name this second
        with contextlib.ExitStack() as held:
            assert _take_new(name, held) == name.with_name(name.name + "-1")


@contextlib.contextmanager
def holding(directory: Path):
    """Another process holding `directory`'s lock for the block, as a running writer does."""
    holder = spawn("""
        import sys, time
        from depthlab.ownership import locked
        with locked(sys.argv[1], "export"):
            print("held", flush=True)
            time.sleep(120)
    """, directory)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- item 13: SIGTERM, and a killed writer's leftovers
def start(argv: list, out: Path) -> tuple[subprocess.Popen, Path]:
    """A depthlab subprocess, once it is writing `out` (its temporary sibling exists)."""
    proc = subprocess.Popen([sys.executable, "-m", "depthlab", *map(str, argv)], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    tmp = out.parent / f".{out.name}.tmp-{proc.pid}"
    deadline = time.time() + 120
    while not tmp.exists():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"never saw {tmp}: {proc.communicate()[1]}")
        time.sleep(0.002)
    return proc, tmp


@pytest.mark.parametrize("command", ["analyze", "export"])
@pytest.mark.slow
def test_sigterm_leaves_nothing_and_the_next_writer_clears_a_killed_ones_leftovers(run, tmp_path, command):
    (tmp_path / "text.txt").write_text(TEXT * 4)
    out = tmp_path / "out"
    argv = {"analyze": ["analyze", run, "--data", tmp_path / "text.txt", "--tokens", 256, "--seq-len", 16, "--out",
                        out],
            "export": ["export", run, out]}[command]
    proc, tmp = start(argv, out)  # SIGKILL: nothing can tidy up
    proc.kill()
    proc.wait()
    assert tmp.exists() and (tmp_path / f".out{LOCK_SUFFIX}").exists()
    proc, mine = start(argv, out)  # the next writer has cleared them before it started writing
    assert not tmp.exists()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:  # it finished before the signal arrived: nothing was interrupted
        assert out.is_dir()
    else:
        assert proc.returncode == 128 + signal.SIGTERM and err.strip().splitlines()[-1] == "depthlab: interrupted", err
        assert not out.exists()
    assert hidden(tmp_path) == [], hidden(tmp_path)


@pytest.mark.slow
def test_a_writer_clears_the_leftovers_of_dead_writers_beside_it_and_no_living_ones(run, tmp_path, capsys):
    """Leftovers of other names in the same folder: a dead writer's temporary directory and lock go, an old copy
    whose directory is missing (killed between the two renames) is put back; a living writer's are kept."""
    (tmp_path / ".other.tmp-4000001").mkdir()
    (tmp_path / ".other.tmp-4000001" / "model.safetensors").write_text("half")
    (tmp_path / f".other{LOCK_SUFFIX}").write_text("pid 4000001, depthlab export")
    (tmp_path / ".gone.old-4000002").mkdir()
    (tmp_path / ".gone.old-4000002" / "config.json").write_text("{}")
    with holding(tmp_path / "busy"):
        (tmp_path / ".busy.tmp-4000003").mkdir()  # what the living writer is writing
        assert main(["export", str(run), str(tmp_path / "hf")]) == 0, capsys.readouterr().err
        assert hidden(tmp_path) == [f".busy{LOCK_SUFFIX}", ".busy.tmp-4000003"]
    assert (tmp_path / "gone" / "config.json").read_text() == "{}"


def test_main_in_a_thread_runs_without_a_signal_handler(capsys):
    """main() called from a thread (a notebook's worker, a test) cannot install the SIGTERM handler: it runs
    anyway, and leaves the process's handler as it was."""
    codes = []
    t = threading.Thread(target=lambda: codes.append(main(["schemes"])))
    t.start()
    t.join()
    assert codes == [0] and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_input_paths_stand_for_what_a_data_spec_can_read(tmp_path):
    (tmp_path / "local").mkdir()
    (tmp_path / "c" / "d").mkdir(parents=True)
    for name in ("a.txt", "b.md", "d/x1.json"):
        (tmp_path / "c" / name).write_text("text")
    assert ownership.input_paths([f"{tmp_path}/c/*.txt", f"{tmp_path}/c/**/x?.json", f"{tmp_path}/none*", "a.txt",
                              f"hf:{tmp_path}/local:cfg", "hf:allenai/c4"]) == \
        [f"{tmp_path}/c/a.txt", f"{tmp_path}/c/d/x1.json", "a.txt", f"{tmp_path}/local"]


def test_write_whole_leaves_the_old_file_when_the_write_dies(tmp_path, monkeypatch):
    from depthlab.ownership import write_whole

    target = tmp_path / "settings.json"
    write_whole(target, '{"old": 1}\n')
    real = Path.write_text

    def dies_halfway(self, text, *a, **k):  # a kill (or a full disk) mid-write: half the text, then gone
        real(self, text[: len(text) // 2], *a, **k)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", dies_halfway)
    with pytest.raises(OSError):
        write_whole(target, '{"new": 2, "longer": "text"}\n')
    monkeypatch.undo()
    assert target.read_text() == '{"old": 1}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]
    write_whole(target, '{"new": 2}\n')
    assert target.read_text() == '{"new": 2}\n'


def test_an_os_error_about_another_file_is_not_blamed_on_the_output_being_written(tmp_path):
    """`writing` reports an OS error inside its block as "cannot write OUT" only when it concerns the output (a file
    in it, its temporary folder, or no file at all); an error about another file (an input, a cache) names that
    file, and the new, writable output is left as it was: missing."""
    from depthlab import UserError

    (tmp_path / "a_file").write_text("not a folder\n")
    out = tmp_path / "new_out"
    with pytest.raises(UserError) as elsewhere, ownership.writing(out, lambda p: False, "test") as tmp:
        (tmp / "part.txt").write_text("half")
        (tmp_path / "a_file" / "cache").mkdir()  # NotADirectoryError about a_file/cache
    assert str(elsewhere.value).startswith(f"{tmp_path / 'a_file' / 'cache'}: Not a directory; nothing was written")
    assert not out.exists()
    with pytest.raises(UserError, match=r"^cannot write .*new_out: No such file or directory$"), \
            ownership.writing(out, lambda p: False, "test") as tmp:
        (tmp / "missing" / "part.txt").write_text("x")  # in the output itself
    with pytest.raises(UserError, match=r"^cannot write .*new_out: disk full$"), \
            ownership.writing(out, lambda p: False, "test"):
        raise OSError("disk full")  # no file named: the output's
    assert not out.exists()
