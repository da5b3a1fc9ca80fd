"""The depth coordinate check separates a depth-stable parameterization (CompleteP) from plain Pre-LN at a fixed
rate by a number computed from its records: the slope of log(last block's update since init) against log(depth)."""

import json

import pytest

from depthlab.cli import main
from depthlab.config import Config, apply_overrides
from depthlab.train.coordcheck import RECORDS, coord_check, depth_slope

TINY = ["model.dim=32", "model.n_heads=2", "model.ffn_dim=64", "model.vocab_size=300", "model.init_std=auto",
        "data.seq_len=32", "train.batch_size=4", "train.lr=1e-2", "train.threads=1"]


def records(corpus, *extra):
    cfg = apply_overrides(Config(), [*TINY, f"data.paths=[{corpus}]", "model.norm_scheme=pre", *extra])
    return coord_check(cfg, [2, 8], seeds=1, steps=3, name="x")


def test_slope_separates_completep_from_pre_ln_at_a_fixed_rate(corpus):
    pre = depth_slope(records(corpus))
    completep = depth_slope(records(corpus, "model.depth_alpha=1", "model.depth_base=2"))
    # Pre-LN: each added block moves the stream as much as the first, so the last block's update grows with L
    assert pre > 0.4
    assert abs(completep) < 0.25 < pre - completep


def test_records_hold_every_block_at_every_step(corpus):
    recs = records(corpus)
    assert len(recs) == 2 * 4  # two depths, steps 0..3
    for r in recs:
        assert len(r["update"]) == len(r["ratio"]) == len(r["rms"]) == r["depth"]
        assert (r["step"] == 0) == (max(r["update"]) == 0.0)  # no update before the first step


def test_depth_slope_reads_the_last_step():
    recs = [{"depth": d, "step": s, "update": [d ** 0.5 if s == 2 else 1.0]} for d in (2, 4, 8) for s in (0, 1, 2)]
    assert depth_slope(recs) == pytest.approx(0.5)


@pytest.mark.slow
def test_cli_writes_records_and_figures(corpus, tmp_path, capsys):
    out = tmp_path / "cc"
    args = ["coord-check", "--data", str(corpus), "--depths", "2", "4", "--seeds", "1", "--steps", "1", "--out",
            str(out), *[a for s in TINY for a in ("--set", s)]]
    assert main([*args, "--scheme", "pre", "--name", "pre"]) == 0
    assert main([*args, "--scheme", "lns"]) == 0
    assert "slope of log update against log depth" in capsys.readouterr().out
    names = {json.loads(line)["name"] for line in (out / RECORDS).read_text().splitlines()}
    assert names == {"pre", "lns " + " ".join(TINY)}
    assert (out / "coord_check.png").stat().st_size > 0 and (out / "coord_check_pre.png").is_file()
    assert main([*args, "--depths", "0"]) == 2  # a one-line refusal


@pytest.mark.parametrize("where, extra, msg", [
    ("file", [], "is a file; coord-check writes a directory there: choose another --out"),
    ("data", [], "is inside coord-check's own input"),
    ("foreign", [], "choose another --out, or pass --overwrite"),
    ("new", ["--depths", "4", "4"], "--depths: give at least two depths (got 4)"),
])
def test_cli_refuses_an_out_it_may_not_write_before_any_training(corpus, tmp_path, capsys, monkeypatch, where,
                                                                 extra, msg):
    """--out is checked by the ownership rule every writer follows, before the first step: not a file, not inside
    the data it reads, not a folder of other files (without --overwrite); a check of one depth draws no line."""
    import depthlab.train.coordcheck as cc

    monkeypatch.setattr(cc, "coord_check", lambda *a, **k: pytest.fail("trained before refusing"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus.txt").write_text(corpus.read_text())
    (tmp_path / "file").write_text("mine")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    out = {"file": tmp_path / "file", "data": data / "cc", "foreign": tmp_path / "foreign", "new": tmp_path / "new"}
    assert main(["coord-check", "--data", str(data), "--out", str(out[where]), "--seeds", "1", "--steps", "1",
                 *extra, *[a for s in TINY for a in ("--set", s)]]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1, err
    assert (tmp_path / "file").read_text() == "mine" and sorted(p.name for p in data.iterdir()) == ["corpus.txt"]
    assert not (tmp_path / "new").exists()


def test_cli_with_overwrite_writes_beside_other_files_and_keeps_them(corpus, tmp_path):
    out = tmp_path / "foreign"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["coord-check", "--data", str(corpus), "--depths", "2", "3", "--seeds", "1", "--steps", "1",
                 "--out", str(out), "--overwrite", *[a for s in TINY for a in ("--set", s)]]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / RECORDS).is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file or lock left behind


def _cli(corpus, out, *extra):
    return ["coord-check", "--data", str(corpus), "--depths", "2", "4", "--seeds", "1", "--steps", "2", "--out",
            str(out), "--no-progress", *[a for s in TINY for a in ("--set", s)], *extra]


def test_a_bad_records_line_is_one_line_naming_it_before_any_training(corpus, tmp_path, capsys, monkeypatch):
    """coord_check.jsonl is read by the one JSON-lines reader (depthlab.jsonl): a broken line that is not the last,
    or a record without its fields, is refused naming file:line before a step is trained."""
    import depthlab.train.coordcheck as cc

    out = tmp_path / "cc"
    out.mkdir()
    good = json.dumps({"name": "a", "depth": 2, "seed": 0, "step": 0, "update": [0.0], "ratio": [0.0], "rms": [1.0]})
    monkeypatch.setattr(cc, "coord_check", lambda *a, **k: pytest.fail("trained before refusing"))
    for text, where in (('{"name": "a", "dep\n' + good + "\n", ":1: not a JSON record"),
                        (good + '\n{"name": "b"}\n', ":2: a record without 'depth'")):
        (out / RECORDS).write_text(text)
        assert main(_cli(corpus, out)) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(str(out / RECORDS) + where) and len(err.splitlines()) == 1, err


def test_a_last_line_cut_short_is_skipped_with_a_warning(corpus, tmp_path, capsys):
    out = tmp_path / "cc"
    out.mkdir()
    good = json.dumps({"name": "a", "depth": 2, "seed": 0, "step": 1, "update": [0.1], "ratio": [0.1], "rms": [1.0]})
    (out / RECORDS).write_text(good + '\n{"name": "b", "dep')  # a writer killed mid-line
    assert main(_cli(corpus, out, "--name", "c")) == 0
    assert "its last line was cut short" in capsys.readouterr().err
    assert [json.loads(line)["name"] for line in (out / RECORDS).read_text().splitlines()][:1] == ["a"]
    assert {json.loads(line)["name"] for line in (out / RECORDS).read_text().splitlines()} == {"a", "c"}


def test_a_diverged_check_draws_its_figures_and_says_which_depths_diverged(corpus, tmp_path, capsys):
    """At a rate far too high every activation becomes inf: the figures are still drawn (no log scale of nothing)
    and the summary line names the depths left out of the slope."""
    out = tmp_path / "cc"
    assert main([*_cli(corpus, out), "--set", "train.lr=1e6", "--name", "hot"]) == 0
    said = capsys.readouterr().out
    assert "diverged (not finite), left out: depth 2, 4" in said, said
    assert (out / "coord_check.png").stat().st_size > 0 and (out / "coord_check_hot.png").stat().st_size > 0
