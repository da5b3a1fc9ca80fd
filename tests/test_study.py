"""The study library: statistics and verdicts by hand, and a tiny real study (grid -> best rate -> seeds,
resumable, probes along training) on a tiny corpus."""

import json
import math
from pathlib import Path

import pytest

from depthlab import stats
from depthlab.study import verdicts
from depthlab.study.probe import ProbeSpec
from depthlab.study.records import load_records, upgrade
from depthlab.study.runner import Study, best_rates, grid_cells, run_cells, seed_cells


def test_statistics_by_hand():
    ms = stats.mean_std([1.0, 2.0, 3.0])
    assert ms == {"mean": 2.0, "std": 1.0, "n": 3}
    assert stats.mean_std([]) ["n"] == 0 and stats.mean_std([5.0])["std"] == 0.0
    t = stats.t_test([1.0, 2.0, 3.0])
    assert t["se"] == pytest.approx(1 / math.sqrt(3)) and t["ci"][0] < 2 < t["ci"][1]
    assert stats.binomial_se(0.5, 100) == pytest.approx(0.05)
    assert stats.spread({"mean": -0.0123, "std": 0.004, "n": 2}, ".3f", signed=True) == "-0.012 ± 0.004"
    assert stats.spread({"mean": 0.0123, "std": 0.0, "n": 1}, ".3f", signed=True) == "+0.012"
    assert verdicts.at_edge(1.6e-2, [4e-3, 8e-3, 1.6e-2]) and not verdicts.at_edge(8e-3, [4e-3, 8e-3, 1.6e-2])


def test_old_record_is_read_in_the_new_schema():
    old = {"layers": 6, "variant": "pre", "lr": 8e-3, "seed": 0, "val_loss": 2.5, "probe_loss": 3.6,
           "update_ratio": [0.5, 0.4, 0.3, 0.3, 0.2, 0.4], "var": [1.0] * 6, "angular": [0.1] * 6,
           "removal": [2.0, 0.1, 0.001, 0.002, 0.05, 0.3], "val_curve": [[2000, 2.5]], "tokens": 2_048_000}
    r = upgrade(old)
    assert r["key"] == "pre-L6-lr0.008-seed0" and r["probe"]["old"]
    idx = r["probes"][-1]["curse"]
    assert idx["interior"] == [2, 4] and idx["inert_blocks"] == [3, 4] and idx["inert_fraction"] == pytest.approx(2 / 3)
    assert idx["removal_deep_over_shallow"] == pytest.approx(0.002 / 0.1)


def test_a_last_line_cut_short_by_a_killed_writer_is_skipped_and_cut_before_the_next_record(tmp_path, capsys):
    """A study killed mid-append leaves half a JSON line: the study still loads (that cell runs again), the next
    record starts on a line of its own, and a broken line elsewhere is a one-line error, never silently dropped."""
    from depthlab import UserError
    from depthlab.study.records import append_record

    runs = tmp_path / "runs.jsonl"
    one, two = ({"key": f"pre-L6-lr0.008-seed{s}", "variant": "pre", "layers": 6, "lr": 8e-3, "seed": s,
                 "val_loss": 2.5 + s} for s in (0, 1))
    append_record(runs, one)
    runs.write_text(runs.read_text() + '{"key": "pre-L6-lr0.008-seed1", "val_lo')  # killed mid-write
    assert set(load_records(runs)) == {one["key"]} and "cut short" in capsys.readouterr().err
    append_record(runs, two)
    assert runs.read_text().splitlines() == [json.dumps(one), json.dumps(two)]
    assert load_records(runs)[two["key"]]["val_loss"] == 3.5
    runs.write_text('{"key": "x", "val_lo\n' + runs.read_text())  # broken, and not the last line: corruption
    with pytest.raises(UserError, match="runs.jsonl:1: not a JSON record"):
        load_records(runs)
    # a resumable cell's probes.jsonl is read and appended the same way (its cut probe is made again on resume)
    from depthlab.study.runner import load_probes

    probes = tmp_path / "probes.jsonl"
    assert load_probes(probes) == []
    append_record(probes, {"step": 0, "loss": 3.0})
    probes.write_text(probes.read_text() + '{"step": 4, "lo')
    assert load_probes(probes) == [{"step": 0, "loss": 3.0}] and "that probe runs again" in capsys.readouterr().err
    append_record(probes, {"step": 4, "loss": 2.0})
    assert [p["step"] for p in load_probes(probes)] == [0, 4]


TINY = ["model.dim=32", "model.n_heads=2", "model.ffn_dim=64", "model.vocab_size=300", "model.max_seq_len=32",
        "model.init_std=auto", "data.seq_len=32", "train.batch_size=4", "train.max_steps=12", "train.warmup_steps=2",
        "train.eval_every=6", "train.log_every=2", "train.monitor_every=6", "train.device=cpu", "train.threads=1"]


@pytest.mark.slow
def test_a_tiny_study_grid_best_rate_seeds_and_resume(tmp_path, corpus):
    study = Study("tiny", str(tmp_path / "out"), {"pre": ["model.norm_scheme=pre"], "lns": ["model.norm_scheme=lns"]},
                  base=[*TINY, f"data.paths=[{corpus}]"], probe=ProbeSpec(windows=8, seq_len=16, jacobian=False),
                  budgets=[0, 4 * 4 * 32])
    lrs = [1e-3, 1e-2]
    assert best_rates(study, {}, lrs, layers=4) == {"pre": None, "lns": None}
    assert len(run_cells(study, grid_cells(study, lrs, layers=4), jobs=2, log=lambda m: None)) == 4
    records = load_records(study.runs_file)
    best = best_rates(study, records, lrs, layers=4)
    assert all(best[v] == min(lrs, key=lambda lr: records[f"{v}-L4-lr{lr:g}-seed0"]["val_loss"]) for v in best)
    run_cells(study, seed_cells(study, best, [0, 1], layers=4), log=lambda m: None)
    records = load_records(study.runs_file)
    assert len(records) == 6  # seed 0 at the best rate was already there
    assert run_cells(study, grid_cells(study, lrs, layers=4) + seed_cells(study, best, [0, 1], layers=4)) == []
    r = records["pre-L4-lr0.01-seed0"]
    assert r["status"] == "ok" and r["val_curve"][-1][0] == 12 and r["monitor_update_ratio"]
    assert [p["step"] for p in r["probes"]] == [0, 4, 12] and [p["tokens"] for p in r["probes"]] == [0, 512, 1536]
    assert set(r["probes"][-1]["curse"]) >= {"inert_fraction", "inert_fraction_ci", "removal_deep_over_shallow"}
    assert r["probes"][-1]["curse"]["windows"] == 8 and math.isfinite(r["probes"][-1]["probe_loss"])
    assert not (tmp_path / "out" / "runs").exists() or not any((tmp_path / "out" / "runs").iterdir())
    assert json.loads((tmp_path / "out" / "settings.json").read_text())["name"] == "tiny"
    # probing along training leaves the training itself untouched: the same cell without probes ends the same
    plain = Study("plain", str(tmp_path / "plain"), study.variants, study.base)
    run_cells(plain, seed_cells(plain, {"pre": 1e-2}, [0], layers=4), log=lambda m: None)
    assert load_records(plain.runs_file)["pre-L4-lr0.01-seed0"]["val_loss"] == r["val_loss"]
    # a study that reuses this one's records trains only the cells it lacks, and counts the others as its own
    again = Study("again", str(tmp_path / "again"), study.variants, study.base, reuse=[str(study.runs_file)])
    assert run_cells(again, grid_cells(again, lrs, layers=4)) == [] and not again.runs_file.exists()
    assert set(again.records()) == set(records) and "reuse" not in again.settings()


@pytest.mark.slow
def test_a_freed_worker_takes_the_cell_the_plan_asks_for_next_while_a_slow_cell_trains(tmp_path, corpus):
    """With a plan (`more`), the runner reads it again whenever a cell finishes: the worker that trained the quick
    cell takes the cell the plan has just made known while the slow cell still trains, so the records land quick,
    later, slow (a batch-at-a-time runner waits for the slow cell before it plans again: quick, slow, later)."""
    from depthlab.study.runner import Cell

    slow_steps = ["train.max_steps=1500", "train.eval_every=1500", "train.monitor_every=1500"]
    study = Study("refill", str(tmp_path / "out"), {"slow": ["model.norm_scheme=pre", *slow_steps],
                                                    "quick": ["model.norm_scheme=pre"]},
                  base=[*TINY, f"data.paths=[{corpus}]"])
    slow, quick, later = Cell("slow", 1e-2, 0, 2), Cell("quick", 1e-2, 0, 2), Cell("quick", 1e-2, 1, 2)
    asked = []

    def plan(records: dict) -> list:
        asked.append(sorted(records))
        return [slow, quick, *([later] if quick.key in records else [])]

    assert len(run_cells(study, [], jobs=2, log=lambda m: None, more=plan)) == 3
    assert [json.loads(line)["key"] for line in study.runs_file.read_text().splitlines()] == [
        quick.key, later.key, slow.key]
    assert asked[-1] == sorted([slow.key, quick.key, later.key])  # read to the end: nothing left to ask for
    assert run_cells(study, [], jobs=2, more=plan) == []  # all recorded: nothing trains again


def _train_one(study, cell):  # a spawned process: train one cell in this process (the test kills it)
    from depthlab.study.runner import train_cell

    train_cell(study, cell)


@pytest.mark.slow
def test_a_killed_resumable_cell_continues_where_it_stopped(tmp_path, corpus):
    """With ckpt_every, a cell killed mid-run resumes from its checkpoint and keeps the probes it had made: its
    record equals an uninterrupted run's."""
    import multiprocessing
    import os
    import signal
    import time

    from depthlab.study.runner import Cell

    base = [*TINY[:-6], "train.max_steps=300", "train.warmup_steps=2", "train.eval_every=100", "train.log_every=10",
            "train.monitor_every=0", "train.device=cpu", "train.threads=1", f"data.paths=[{corpus}]"]
    probe = ProbeSpec(windows=4, seq_len=16, jacobian=False)

    def make(name):
        return Study(name, str(tmp_path / name), {"pre": ["model.norm_scheme=pre"]}, base=base, probe=probe,
                     budgets=[0, 10 * 4 * 32, 250 * 4 * 32], ckpt_every=20)

    cell = Cell("pre", 1e-2, 0, 2)
    killed = make("killed")
    proc = multiprocessing.get_context("spawn").Process(target=_train_one, args=(killed, cell))
    proc.start()
    ckpts = tmp_path / "killed" / "runs" / f"killed-{cell.key}" / "checkpoints"
    deadline = time.time() + 120
    while time.time() < deadline and proc.is_alive() and not any(ckpts.glob("step_*[0-9]")):
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert not killed.runs_file.exists()  # killed before the cell finished
    run_cells(killed, [cell], log=lambda m: None)
    after = load_records(killed.runs_file)[cell.key]
    whole = make("whole")
    run_cells(whole, [cell], log=lambda m: None)
    ref = load_records(whole.runs_file)[cell.key]
    assert 0 < after["resumed_at_step"] < 300 and "resumed_at_step" not in ref
    assert after["val_loss"] == ref["val_loss"] and after["val_curve"] == ref["val_curve"]
    assert [p["step"] for p in after["probes"]] == [0, 10, 250, 300]
    assert [p["probe_loss"] for p in after["probes"]] == [p["probe_loss"] for p in ref["probes"]]


def test_the_unigram_loss_is_the_cross_entropy_of_smoothed_training_frequencies(tmp_path):
    """What a model that learned nothing from context reaches: add-one smoothed train frequencies scored on the
    first val_tokens of the validation split."""
    import math

    import numpy as np

    from depthlab.study.corpus import unigram_loss

    np.save(tmp_path / "train.npy", np.array([0, 0, 1], dtype=np.uint16))
    np.save(tmp_path / "val.npy", np.array([0, 1, 1], dtype=np.uint16))
    assert unigram_loss(tmp_path, 2) == pytest.approx(-(math.log(3 / 5) + math.log(2 / 5)) / 2)
    assert unigram_loss(tmp_path) == pytest.approx(-(math.log(3 / 5) + 2 * math.log(2 / 5)) / 3)


@pytest.mark.slow
def test_a_cell_that_cannot_run_does_not_cost_the_records_of_the_others(tmp_path, corpus, capsys):
    """A run directory held by another process fails its cell in one line, after the other cells are recorded."""
    from depthlab import UserError
    from depthlab.cli import one_line_errors
    from depthlab.ownership import locked
    from depthlab.study.runner import Cell

    study = Study("held", str(tmp_path / "out"), {"pre": ["model.norm_scheme=pre"]},
                  base=[*TINY, "train.max_steps=4", f"data.paths=[{corpus}]"])
    free, held = Cell("pre", 1e-2, 0, 2), Cell("pre", 1e-3, 0, 2)
    with locked(tmp_path / "out" / "runs" / f"held-{held.key}", "test"):
        with pytest.raises(UserError, match=r"1 of 2 runs of held failed \(pre-L2-lr0.001-seed0: .*in use by"):
            run_cells(study, [held, free], log=lambda m: None)
    assert set(load_records(study.runs_file)) == {free.key}
    assert one_line_errors(run_cells, study, [held, free]) == 0  # free now: only the held cell runs
    assert one_line_errors(lambda: (_ for _ in ()).throw(UserError("bad\n  flag"))) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "depthlab: error: bad flag"


@pytest.mark.slow
def test_the_study_corpus_drops_planted_copies_and_holds_out_a_test_split_its_cells_report(tmp_path):
    """build_corpus removes exact and near copies (recorded in corpus.json), deals held-out documents to validation
    and test, and a cell trained on it records its loss on the test split."""
    import random

    from depthlab.study.corpus import build_corpus, test_tokens

    rng, src = random.Random(0), tmp_path / "docs"
    src.mkdir()
    words = [f"w{i}" for i in range(300)]
    texts = ["\n".join(" ".join(rng.choice(words) for _ in range(10)) for _ in range(40)) for _ in range(40)]
    for i, t in enumerate(texts):
        (src / f"doc{i:02d}.txt").write_text(t)
    (src / "doc00_copy.txt").write_text(texts[0])
    (src / "doc01_near.txt").write_text(texts[1].replace(texts[1].split()[5], "edited", 1))
    study = Study("c", str(tmp_path / "out"), {"pre": ["model.norm_scheme=pre"]},
                  base=[*TINY, f"data.paths=[{src}]"], corpus=str(tmp_path / "corpus"))
    info = build_corpus(study.config(grid_cells(study, [1e-2], layers=2)[0]), tmp_path / "corpus", "alternate")
    assert info["dedup"]["removed"] == 2
    assert {Path(n).name for n in info["dedup"]["removed_names"]} == {"doc00_copy.txt", "doc01_near.txt"}
    assert info["test_tokens"] > 0 and len(test_tokens(tmp_path / "corpus")) == info["test_tokens"]
    assert info["documents"]["train"] + info["documents"]["val"] + info["documents"]["test"] == 40
    study.meta["corpus"] = info
    run_cells(study, seed_cells(study, {"pre": 1e-2}, [0], layers=2), log=lambda m: None)
    r = next(iter(load_records(study.runs_file).values()))
    assert math.isfinite(r["test_loss"]) and r["test_loss"] != r["val_loss"]


def _curse_by_hand(ratios: list[float], counts: list[tuple[int, int]], interior: int, noise=None) -> str:
    """The across-seed curse rule written out with scipy: each criterion's 95% t-interval (df = n - 1; the ratio's
    from the pooled noise (sd, df) where given) against its threshold, the inert fraction's widened to the exact
    binomial interval of its count pooled over seeds; present if either lies on the present side, absent if both lie
    on the other."""
    from scipy import stats as st

    if interior < verdicts.MIN_INTERIOR:
        return "unreadable"

    def ci(xs):
        if len(set(xs)) == 1:
            return xs[0], xs[0]
        c = st.ttest_1samp(xs, 0).confidence_interval(0.95)
        return c.low, c.high

    def pooled_ci(xs):
        half = st.t.ppf(0.975, noise[1]) * noise[0] / math.sqrt(len(xs))
        return sum(xs) / len(xs) - half, sum(xs) / len(xs) + half

    (rlo, rhi), (ilo, ihi) = (pooled_ci if noise else ci)(ratios), ci([k / m for k, m in counts])
    pooled = st.binomtest(sum(k for k, _ in counts), sum(m for _, m in counts)).proportion_ci(0.95, "exact")
    ilo, ihi = min(ilo, pooled.low), max(ihi, pooled.high)
    sides = {"present" if rhi < 0.5 else "absent" if rlo >= 0.5 else "inconclusive",
             "present" if ilo >= 1 / 3 else "absent" if ihi < 1 / 3 else "inconclusive"}
    return "present" if "present" in sides else "absent" if sides == {"absent"} else "inconclusive"


def _deep_by_hand(c: dict) -> tuple[int, int] | None:
    """The deep half's inert count from a recorded index alone: the upper floor(k/2) of the k interior blocks
    (None under 4 of them), and how many of those the record names inert."""
    lo, hi = c["interior"]
    deep = list(range(hi - (hi - lo + 1) // 2 + 1, hi + 1))
    return (sum(b in c["inert_blocks"] for b in deep), len(deep)) if len(deep) >= 4 else None


@pytest.mark.slow
def test_the_results_page_prints_pre_lns_curse_index_as_the_rule_reads_it():
    """On the page built from the committed records: the first screen, the own-best table and the claims table name,
    at each depth, the word the across-seed rule gives for Pre-LN's per-seed index (recomputed here with scipy, its
    inert criterion on the deep half of the interior, its ratio with the seed noise pooled over Pre-LN's cells)."""
    import re
    import statistics

    from benchmarks import lns_study, report
    from depthlab.study.claims import claims_table
    from depthlab.study.page import lns, science, screen

    res = science.lns_summary(report.RESULTS, lns_study.PARTS, lns_study.UNSTABLE)
    done = [d for d in res["depths"] if d["delta_val_loss"].get("n")]
    rows, first = lns.own_best_lines(res), screen.index_by_depth(done)
    claims = lns.claims_lines(claims_table(res, res["unigram_loss"]))
    groups = {seg.split(" at N = ")[0]: [int(x) for x in seg.split(" at N = ")[1].removesuffix(" only").split(", ")]
              for seg in re.sub(r" \([^()]*\)", "", first.removeprefix("reads ")).split("; ")}
    cells = {}  # Pre-LN's ratio in every (depth, rate) cell of the records, pooled over those of two seeds or more
    for r in map(upgrade, science.lns_records(report.RESULTS).values()):
        if r["variant"] == "pre" and r["status"] == "ok" and r.get("probes"):
            cells.setdefault((r["layers"], r["lr"]), []).append(r["probes"][-1]["curse"]["removal_deep_over_shallow"])
    cells = [c for c in cells.values() if len(c) > 1]
    df = sum(len(c) - 1 for c in cells)
    sd = math.sqrt(sum((x - statistics.fmean(c)) ** 2 for c in cells for x in c) / df)
    assert res["ratio_noise"]["df"] == df and res["ratio_noise"]["sd"] == pytest.approx(sd)
    words = {}
    for d in done:
        idx, L = d["pre"]["index"], d["layers"]
        per = list(idx["per_seed"].values())
        word = words[L] = _curse_by_hand([c["removal_deep_over_shallow"] for c in per],
                                         [_deep_by_hand(c) for c in per], idx["interior_blocks"], (sd, df))
        assert L in groups[word]
        row = next(x for x in rows if x.startswith(f"| {L} |"))
        assert row.removesuffix(" |").split(" | ")[-1].startswith(word)
        for claim in (x for x in claims if x.startswith("| 1 |") and f"| N = {L} |" in x):
            assert claim.endswith("| **not testable** (Pre-LN's curse index " + word + ") |") == (word != "present")
    # N = 48: two seeds at 0.393 and 0.400 read "present" with df = 1; with the ratio's seed noise pooled over
    # Pre-LN's cells, 0.40 [0.14, 0.65] holds 0.5
    assert words[48] == "inconclusive" and "48 (deep/shallow removal ratio 0.40 [0.14, 0.65] holds 0.5" in first
    # N = 24: the whole interior's inert fraction 0.14 [-0.06, 0.35] held 1/3 (inconclusive); its deep half reads
    # 0.07 [-0.08, 0.22] (the t-interval [-0.08, 0.21] widened by the pooled count's exact interval) and the ratio
    # 1.10 [0.78, 1.43]: absent
    assert words[24] == "absent" and "| 0.07 [-0.08, 0.22] | 0.14 ± 0.08 / 0.05 ± 0.05 |" in next(
        x for x in rows if x.startswith("| 24 |"))


def test_the_first_screen_and_part_b_say_the_curse_words_with_their_intervals():
    from depthlab.study import transfer
    from depthlab.study.page import screen

    read = lambda ratios: {"index": {"curse": verdicts.curse_reading(ratios, [0.0] * len(ratios), 45)}}  # noqa: E731
    done = [{"layers": 12, "pre": read([0.35, 0.75])}, {"layers": 48, "pre": read([0.39, 0.40])},
            {"layers": 24, "pre": read([0.9])}]
    said = screen.index_by_depth(done)
    assert said.startswith("reads present at N = 48 (deep/shallow removal ratio 0.40 [")
    assert "< 0.5, n = 2) only; inconclusive at N = 12 (deep/shallow removal ratio 0.55 [" in said
    assert said.endswith("; one seed: no interval at N = 24 (deep/shallow removal ratio 0.90, deep-half inert "
                           "fraction 0.00: reads absent)")
    held = transfer._precondition(read([0.35, 0.70])["index"]["curse"])
    assert "holds 0.5, n = 2: *inconclusive*" in held and "*not testable*" in held
    assert "*not testable*" not in transfer._precondition(read([0.39, 0.40])["index"]["curse"])
    assert "*not testable*" in transfer._precondition(None) and "*unknown*" in transfer._precondition(None)


def _study_until_terminated(study, cells, terminal=False):  # a spawned process: a study script, to be stopped
    import os
    import signal
    import sys

    from depthlab.cli import run_script
    from depthlab.study import runner

    if terminal:  # a process group of its own, which gets Ctrl-C as a terminal sends it: study and workers at once
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # CI runs us in the background, SIGINT ignored
    runner.STOP_GRACE_S = 600.0 if terminal else 1.0  # a terminal's Ctrl-C: the cells must stop by themselves
    sys.exit(run_script(runner.run_cells, study, cells, 2))


def _two_cells_training(tmp_path, corpus, terminal=False):
    """A study of four long cells, two at a time, in a spawned process; returns once two cells are training."""
    import multiprocessing
    import time

    from depthlab.study.runner import Cell

    base = [*TINY[:-6], "train.max_steps=4000", "train.warmup_steps=2", "train.eval_every=1000", "train.log_every=5",
            "train.monitor_every=0", "train.device=cpu", "train.threads=1", f"data.paths=[{corpus}]"]
    study = Study("stop", str(tmp_path / "stop"), {"pre": ["model.norm_scheme=pre"]}, base=base, ckpt_every=1000)
    cells = [Cell("pre", lr, 0, 2) for lr in (1e-3, 2e-3, 4e-3, 8e-3)]
    proc = multiprocessing.get_context("spawn").Process(target=_study_until_terminated,
                                                        args=(study, cells, terminal))
    proc.start()
    logs = [tmp_path / "stop" / "runs" / f"stop-{c.key}" / "metrics.jsonl" for c in cells]
    deadline = time.time() + 120
    while sum(f.exists() and f.stat().st_size > 0 for f in logs) < 2:  # two cells are training
        assert time.time() < deadline and proc.is_alive()
        time.sleep(0.05)
    return proc, study, logs


def _stopped_where_they_were(study, logs) -> None:
    """The two started cells each saved the step it was at, and nothing trains on behind our back."""
    import time

    runs = Path(study.out) / "runs"
    started = sorted(p.name for p in runs.iterdir())
    assert len(started) == 2 and not study.runs_file.exists()  # the queued two never started
    for name in started:
        (ckpt,) = (runs / name / "checkpoints").iterdir()  # saved where it stopped, not at a scheduled step
        assert 0 < int(ckpt.name.split("_")[1]) < 1000
    sizes = [f.stat().st_size for f in logs if f.exists()]
    time.sleep(1.0)
    assert [f.stat().st_size for f in logs if f.exists()] == sizes


@pytest.mark.slow
def test_sigterm_to_a_study_stops_its_running_cells_where_they_are_and_starts_no_other(tmp_path, corpus):
    """SIGTERM to the study's process alone (`kill PID`): the pool's own way out would have waited for every
    queued cell and appended none of their records. Now the two running cells are sent SIGTERM, each saves the
    step it was at and stops, the two queued cells never start, the study exits 143 at once, and the next run
    resumes the two (tests above: a resumed cell's record is the uninterrupted one's)."""
    import os
    import signal

    proc, study, logs = _two_cells_training(tmp_path, corpus)
    os.kill(proc.pid, signal.SIGTERM)
    proc.join(timeout=120)
    assert proc.exitcode == 128 + signal.SIGTERM
    _stopped_where_they_were(study, logs)


@pytest.mark.slow
def test_ctrl_c_at_a_terminal_stops_a_study_and_its_cells_where_they_are(tmp_path, corpus):
    """Ctrl-C at a terminal reaches the study and its workers at once: each running cell saves its step and stops by
    itself (here well before the study would send SIGTERM), the queued cells never start, and the study exits 130."""
    import os
    import signal

    proc, study, logs = _two_cells_training(tmp_path, corpus, terminal=True)
    os.killpg(proc.pid, signal.SIGINT)
    proc.join(timeout=300)  # well before the study's grace of 600 s runs out and it sends SIGTERM
    assert proc.exitcode == 130
    _stopped_where_they_were(study, logs)


@pytest.mark.slow
def test_sigkill_to_a_study_still_stops_its_cells_where_they_are(tmp_path, corpus):
    """SIGKILL to the study's process (the OOM killer, `kill -9`, a session torn down) gives it no chance to stop its
    workers: each gets one SIGTERM when it sees its parent gone (depthlab.workers), so each running cell saves its
    step and exits instead of training on alone, unrecorded, holding its run directory's lock from the rerun."""
    import os
    import signal

    from tests.test_faults import alive, wait_for

    proc, study, logs = _two_cells_training(tmp_path, corpus)
    workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=10)
    wait_for(lambda: not any(alive(w) for w in workers), timeout=120)  # no worker outlives its study
    _stopped_where_they_were(study, logs)


@pytest.mark.slow
def test_a_study_whose_worker_is_killed_says_so_in_one_line(tmp_path, corpus, capfd):
    """A worker killed on its own (SIGTERM to its pid, as the OOM killer's SIGKILL would be) breaks the pool: the study
    stops its other cell, which saves its step, and ends in one line and exit status 2, not a traceback."""
    import os
    import signal

    proc, study, logs = _two_cells_training(tmp_path, corpus)
    workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
               if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
    os.kill(workers[0], signal.SIGTERM)
    proc.join(timeout=120)
    err = capfd.readouterr().err
    assert proc.exitcode == 2 and "Traceback" not in err, err
    assert "depthlab: error: a worker process of stop died" in err and "rerun the same command" in err
    _stopped_where_they_were(study, logs)


@pytest.mark.parametrize("change", [
    {"base": [x.replace("max_steps=12", "max_steps=24") for x in TINY]},  # --steps 24 over 12-step records
    {"base": [x.replace("dim=32", "dim=24") for x in TINY]},  # --dim 24 over width-32 records
    {"variants": {"pre": ["model.norm_scheme=pre", "model.init=scaled"]}},
    {"probe": ProbeSpec(windows=16, seq_len=16, jacobian=False)},
    {"meta": {"corpus": {"sha256": "f" * 64}}},
], ids=["steps", "dim", "variant", "probe", "corpus"])
def test_records_made_under_other_settings_do_not_count_and_their_settings_stay(tmp_path, change):
    """A rerun in the same folder with other settings (steps, width, a variant's overrides, the probe, the corpus)
    would count the old records as its own cells and train nothing; it is refused in one line, and settings.json
    still says how the records were made. What only picks cells (the seeds, another variant) may change."""
    from dataclasses import replace

    from depthlab import UserError
    from depthlab.study.records import append_record
    from depthlab.study.runner import Cell

    assert "train.max_steps=12" in TINY and "model.dim=32" in TINY
    made = Study("s", str(tmp_path), {"pre": ["model.norm_scheme=pre"]}, base=list(TINY),
                 probe=ProbeSpec(windows=8, seq_len=16, jacobian=False), meta={"corpus": {"sha256": "a" * 64}})
    cell = Cell("pre", 1e-2, 0, 2)
    (tmp_path / "settings.json").write_text(json.dumps(made.settings(), indent=2) + "\n")
    append_record(made.runs_file, {"study": "s", "key": cell.key, "variant": "pre", "lr": 1e-2, "seed": 0,
                                   "layers": 2, "status": "ok", "val_loss": 5.0, "val": {}})
    before = (tmp_path / "settings.json").read_text()
    other = replace(made, **change)
    with pytest.raises(UserError, match=r"holds records made under other settings \(.*\); they do not count"):
        run_cells(other, [cell], log=lambda m: None)
    assert (tmp_path / "settings.json").read_text() == before
    # more seeds, another variant, another command: the same records, nothing to train
    more = replace(made, variants={**made.variants, "lns": ["model.norm_scheme=lns"]}, command="again",
                   meta={**made.meta, "seeds": [0, 1, 2]})
    assert run_cells(more, [cell], log=lambda m: None) == []
