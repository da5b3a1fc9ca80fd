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
