"""The depth-transfer study (depthlab.study.transfer, benchmarks/depth_transfer.py): the rate lattice and the
exponent fit on known numbers, the plan walked to the end on records made up with a known optimum, and a tiny real
study (and the GPU command on the CPU) run end to end, resumed and written up."""

import json
import math
import shutil

import pytest

from depthlab.study import transfer as t
from depthlab.study.records import cell_key, load_records


def test_the_rate_lattice_and_the_exponent_fit_on_known_numbers():
    assert [t.rate(k) for k in (0, 4, 5, 7, 8, 10)] == [1e-3, 4e-3, 5.657e-3, 1.131e-2, 1.6e-2, 3.2e-2]
    assert t.lattice(1.131e-2) == 7 and t.lattice(4e-3) == 4 and t.lattice(1e-2) is None
    depths = [6, 12, 24, 48]
    exact = t.exponent(depths, [0.016 * (L / 6) ** -0.5 for L in depths])
    assert exact["slope"] == pytest.approx(-0.5) and exact["se"] < 1e-7
    # noisy numbers: slope and standard error by hand (least squares on log-log), interval with t(0.975, df = 2)
    rates = [0.016, 0.009, 0.007, 0.004]
    x = [math.log(L) for L in depths]
    y = [math.log(r) for r in rates]
    mx, my = sum(x) / 4, sum(y) / 4
    sxx = sum((a - mx) ** 2 for a in x)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sxx
    resid = [b - my - slope * (a - mx) for a, b in zip(x, y, strict=True)]
    se = math.sqrt(sum(r * r for r in resid) / 2 / sxx)
    fit = t.exponent(depths, rates)
    assert fit["slope"] == pytest.approx(slope) and fit["se"] == pytest.approx(se)
    assert fit["ci"] == pytest.approx([slope - 4.302653 * se, slope + 4.302653 * se], rel=1e-5)
    assert fit["word"] == "falls with depth" and fit["n"] == 4
    assert t.exponent(depths, [0.016, 0.02, 0.012, 0.016])["word"] == "inconclusive"
    # "holds its rate": a TOST against the slope that moves the rate one sqrt(2) step across 6-48 blocks (1/6), read
    # as the 90% interval (t(0.95, df = 2) = 2.919986) inside the margin; a wide interval holds nothing
    assert t.hold_margin(depths) == pytest.approx(1 / 6) and fit["tost_p"] > 0.05
    flat = t.exponent(depths, [0.0127, 0.0131, 0.014, 0.0134])
    lo, hi = flat["slope"] - 2.919986 * flat["se"], flat["slope"] + 2.919986 * flat["se"]
    assert flat["tost_ci"] == pytest.approx([lo, hi], rel=1e-5) and -1 / 6 < lo < 0 < hi < 1 / 6
    assert flat["ci"][0] < 0 < flat["ci"][1] and flat["tost_p"] < 0.05 and flat["word"] == "holds its rate"
    wide = t.exponent(depths, [0.0127, 0.0101, 0.018, 0.0134])
    assert wide["tost_ci"][0] < -1 / 6 and wide["tost_p"] > 0.05 and wide["word"] == "inconclusive"
    small = t.exponent(depths, [0.016 * (L / 6) ** -0.05 for L in depths])
    assert small["word"] == "falls with depth, within one grid step"
    two = t.exponent([6, 48], [0.016, 0.004])
    assert two["slope"] == pytest.approx(-2 / 3) and two["word"] == "two depths: no interval"
    # the vertex of a parabola in lattice units through the best rate and its neighbours
    recs = {k: {"status": "ok", "val_loss": 2 + 0.01 * (k - 6.3) ** 2} for k in (5, 6, 7)}
    assert t.vertex(recs, 6) == pytest.approx(6.3)
    recs[7] = {"status": "diverged", "val_loss": math.inf}
    assert t.vertex(recs, 6) == 6.0


def _made_up(cell, optimum) -> dict:
    """A record whose validation loss is a parabola in the lattice index around optimum(variant, layers)."""
    k = t.lattice(cell.lr)
    loss = 2 + 0.01 * (k - optimum(cell.variant, cell.layers)) ** 2 + 0.001 * cell.seed
    return {"key": cell.key, "variant": cell.variant, "lr": cell.lr, "seed": cell.seed, "layers": cell.layers,
            "status": "ok", "val_loss": loss, "test_loss": loss + 0.1}


def test_run_reads_the_plan_again_whenever_a_cell_finishes(monkeypatch):
    """A cell made known by a finished grid (pre's transferred cells) runs before deeper cells known earlier: run
    hands the runner the plan, which a freed worker reads again for the cheapest cell not yet running (the
    runner's training and its pool are tests/test_study.py's; here a pool of `jobs` workers is played out in order,
    the oldest running cell finishing first, with made-up records)."""
    records, started, most = {}, [], []

    class Study:
        def records(self):
            return dict(records)

    def run_cells(study, cells, jobs, more, **kw):
        running = []
        while True:
            running += [c for c in more(dict(records)) if c not in running][:jobs - len(running)]
            started.extend(c for c in running if c not in started)
            most.append(len(running))
            if not running:
                return
            c = running.pop(0)
            records[c.key] = _made_up(c, lambda v, L: 8)

    monkeypatch.setattr(t, "run_cells", run_cells)
    d = t.Design()
    base = t.next_cells({}, d)  # the two base grids
    records.update({c.key: _made_up(c, lambda v, L: 8) for c in base if c.variant == "lns"})
    t.run(Study(), d, jobs=2)
    assert max(most) == 2 and not t.next_cells(records, d)
    first_pre = next(i for i, c in enumerate(started) if c.variant == "pre" and c.layers == 12)
    first_48 = next(i for i, c in enumerate(started) if c.layers == 48)
    assert first_pre < first_48  # pre's N = 12 cells did not wait behind every lns cell down to N = 48


def test_the_plan_walked_to_the_end_on_made_up_records():
    """Pre-LN's optimum falls one lattice step per doubling of depth (rate ∝ N^-1/2), CompleteP's holds: the plan
    trains the base grids of the two schemes only, transfers, widens pre's N = 48 grid to its optimum, centres the
    decomposition on it, and the summary recovers both exponents."""
    import numpy as np

    def optimum(v, L):
        return 8 - np.log2(L / 6) if v in (t.PRE, t.GAIN_INIT, t.UNIFORM) else 8

    d = t.Design()
    records, rounds = {}, []
    assert t.summarize({}, d)["transfer"]["pre"]["transferred"] is None
    while cells := t.next_cells(records, d):
        rounds.append(cells)
        assert [c.layers for c in cells] == sorted(c.layers for c in cells)  # cheapest first
        records.update({c.key: _made_up(c, optimum) for c in cells})
    assert {c.variant for c in rounds[0]} == {"pre", "lns"} and len(rounds[0]) == 12  # the twins share them
    assert not any(r["layers"] == 6 and r["variant"] in t.TWIN for r in records.values())
    res = t.summarize(records, d)
    pre, cp = res["transfer"]["pre"], res["transfer"]["pre+completep"]
    assert pre["transferred"] == cp["transferred"] == 1.6e-2
    assert {L: r["best"] for L, r in pre["rates"].items()} == {6: 1.6e-2, 12: 1.131e-2, 24: 8e-3, 48: 5.657e-3}
    assert sorted(pre["rates"][48]["grid"]) == [t.rate(k) for k in range(4, 10)]  # widened 3 steps, then interior
    assert pre["exponent"]["slope"] == pytest.approx(-0.5) and pre["exponent"]["word"] == "falls with depth"
    assert cp["exponent"]["slope"] == pytest.approx(0, abs=1e-9) and not cp["rates"][48]["edge"]
    assert cp["loss"][48]["n"] == 2 and 6 not in cp["vs_pre"] and cp["vs_pre"][48]["mean"] < 0
    dec = res["decomposition"]
    assert dec["variants"]["pre+gain_init"]["lr"] == 5.657e-3 and dec["variants"]["pre"]["n"] == 3
    assert dec["tost"]["n"] == 3 and dec["variants"]["lns"]["lr"] == 1.6e-2
    assert records[cell_key("pre+gain_init", 4e-3, 0, 48)]  # its grid centred on pre's best at N = 48
    lines = t.not_run_lines(records, d)
    assert lines[0] == "Every cell of the plan has run."
    part = {k: r for k, r in records.items() if r["layers"] <= 12}
    waiting = "\n".join(t.not_run_lines(part, d))
    assert "pre rate grid at N = 24: 3 of 3 cells not run" in waiting
    assert "the rate grid of pre+gain_init, pre+uniform_gain at N = 48: waits for pre's rate grid at N = 48" in waiting
    nothing = t.not_run_lines({}, d)  # two grids to run, three groups waiting, one line each
    assert len(nothing) == 8 and nothing[4] == "- the transferred rate (and the grids around it) of pre, lns, " \
        "pre+completep, pre+depth_mup, lns+completep at N = 6, 12, 24, 48: waits for the N = 6 rate grids"


TINY = ["--steps", "4", "--eval-every", "2", "--dim", "16", "--heads", "2", "--ffn", "32", "--vocab", "300",
        "--seq", "16", "--batch", "8", "--val-tokens", "512", "--probe-windows", "4",
        "--base-depth", "2", "--depths", "2", "3", "--grid-depths", "3", "--lrs", "8e-3", "1.131e-2", "--widen", "0"]


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    """A study corpus built once for TINY: 60 documents of random words and one planted copy (dedup removes it),
    three held out (validation 2, test 1), so that each cell's test loss costs a few batches."""
    import random

    from depthlab.config import apply_overrides
    from depthlab.model.families import preset
    from depthlab.study.corpus import build_corpus

    rng, root = random.Random(0), tmp_path_factory.mktemp("transfer")
    words = [f"w{i}" for i in range(200)]
    (root / "docs").mkdir()
    for i in range(60):
        (root / "docs" / f"doc{i:02d}.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(10))
                                                                for _ in range(30)))
    shutil.copy(root / "docs" / "doc07.txt", root / "docs" / "doc07_copy.txt")
    build_corpus(apply_overrides(preset("cpu-tiny"), ["model.vocab_size=300", f"data.paths=[{root / 'docs'}]"]),
                 root / "corpus", held_out="alternate")
    return root / "corpus"


def _runs(tmp_path, corpus):
    """--runs-dir holding the built corpus: the study reads a corpus folder that is there instead of building one."""
    shutil.copytree(corpus, tmp_path / "runs" / "corpus")
    return ["--runs-dir", str(tmp_path / "runs")]


@pytest.mark.slow
def test_a_tiny_study_end_to_end_resumes_and_writes_its_page_section(tmp_path, tiny_corpus, capsys):
    from benchmarks import depth_transfer

    out = tmp_path / "out"
    argv = ["run", *TINY, "--seeds", "0", "--variants", "pre", "lns", "pre+completep", "--parts", "pre", "lns",
            "pre+gain_init", "--parts-depth", "3", "--parts-seeds", "0", "1", "--jobs", "1", "--out", str(out),
            *_runs(tmp_path, tiny_corpus)]
    depth_transfer.main(argv)
    records = load_records(out / "runs.jsonl")
    assert {(r["variant"], r["layers"]) for r in records.values()} >= {
        ("pre", 2), ("lns", 2), ("pre", 3), ("lns", 3), ("pre+completep", 3), ("pre+gain_init", 3)}
    assert ("pre+completep", 2) not in {(r["variant"], r["layers"]) for r in records.values()}
    assert all(math.isfinite(r["test_loss"]) and r["probes"] and r["status"] == "ok" for r in records.values())
    assert {r["seed"] for r in records.values() if r["variant"] == "pre+gain_init"} == {0, 1}
    settings = json.loads((out / "settings.json").read_text())
    meta = settings["meta"]
    assert meta["test_tokens"] > 16 and meta["dedup_removed"] == 1 and meta["corpus"]["dedup"]["threshold"] == 0.5
    assert meta["design"]["base_depth"] == 2 and settings["ckpt_every"] == 2  # a killed cell resumes
    assert settings["probe"]["jacobian"] is False and settings["variants"]["pre+completep"] == [
        "model.norm_scheme=pre", "model.depth_alpha=1", "model.depth_base=2"]
    printed = capsys.readouterr().out
    assert printed.startswith("## Depth transfer") and "Every cell of the plan has run." in printed
    # run again: nothing to train; lose the last record: exactly that cell is trained again
    lines = (out / "runs.jsonl").read_text().splitlines()
    depth_transfer.main(argv)
    assert (out / "runs.jsonl").read_text().splitlines() == lines
    (out / "runs.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    depth_transfer.main(argv)
    again = (out / "runs.jsonl").read_text().splitlines()
    assert again[:-1] == lines[:-1] and json.loads(again[-1])["key"] == json.loads(lines[-1])["key"]
    capsys.readouterr()
    depth_transfer.main(["summarize", "--out", str(out), "--img", str(tmp_path / "img" / "depth_transfer.png")])
    text = capsys.readouterr().out
    assert "| pre+completep | 0.0" in text and "same model" in text
    assert "TOST against ±0.01 nats (set after the data" in text and "no word: margin set after the data" in text
    assert "slope (fit's 95% t)" in text and "no bootstrap (under 3 depths)" in text
    assert (tmp_path / "img" / "depth_transfer.png").stat().st_size > 10_000
    assert t.page_lines(tmp_path / "nothing", None) == []


@pytest.mark.slow
def test_a_depth_alpha_variant_at_its_base_depth_is_its_schemes_model(tmp_path, corpus):
    """m = 1: CompleteP and depth-muP at L = depth_base train to the same loss as their scheme (why the study
    trains the base grid once per scheme)."""
    from depthlab.study.runner import Study, run_cells, seed_cells
    from tests.test_study import TINY as BASE

    study = Study("twin", str(tmp_path / "out"), t.variants(2), base=[*BASE, f"data.paths=[{corpus}]"])
    run_cells(study, seed_cells(study, dict.fromkeys(("pre", "pre+completep", "pre+depth_mup"), 1e-2), [0], 2),
              log=lambda m: None)
    loss = {r["variant"]: r["val_loss"] for r in load_records(study.runs_file).values()}
    assert loss["pre"] == loss["pre+completep"] == loss["pre+depth_mup"]


@pytest.mark.slow
def test_the_gpu_command_on_the_cpu_with_tiny_overrides(tmp_path, tiny_corpus, capsys):
    from benchmarks import depth_transfer

    out = tmp_path / "gpu"
    depth_transfer.main(["prepare", "--gpu", *TINY, "--corpus-mb", "0.05", "--out", str(out), "--runs-dir",
                         str(tmp_path / "prepared")])  # the corpus alone, tokenized before the device is lent
    assert (tmp_path / "prepared" / "corpus" / "test.npy").exists() and not out.exists()
    assert capsys.readouterr().out == "no records yet\n"
    depth_transfer.main(["run", "--gpu", "--device", "cpu", "--dtype", "fp32", "--no-compile", *TINY, "--seeds", "0",
                         "--grid-depths", "2", "--variants", "pre", "pre+completep", "--out", str(out),
                         *_runs(tmp_path, tiny_corpus)])
    records = load_records(out / "runs.jsonl")
    assert {(r["variant"], r["layers"]) for r in records.values()} == {("pre", 2), ("pre", 3), ("pre+completep", 3)}
    settings = json.loads((out / "settings.json").read_text())
    assert settings["meta"]["design"]["parts_depth"] is None and settings["meta"]["dim"] == 16
    assert "train.compile=true" not in settings["base"] and settings["command"].startswith(
        "python -m benchmarks.depth_transfer run --gpu")
    assert depth_transfer.GPU["dim"] == 256 and depth_transfer.GPU["device"] == "cuda"
    assert capsys.readouterr().out.startswith("## Depth transfer")
