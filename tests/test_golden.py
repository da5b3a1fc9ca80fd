"""Golden losses (depthlab.golden): today's code trains as tests/golden/losses.json says, a one-line change to the
forward is caught, and the compare tool names the first differing step and the largest difference.

CI compares the first 30 of the 100 steps of every case within check's default tolerance (each case's spread
under other CPUs' kernels times 10, at least 1e-5: CI's CPU may round differently from the machine that made the
file; 30 steps keep this under a minute on 2 cores); `python -m depthlab.golden check` compares all 100."""

from __future__ import annotations

import pytest

from depthlab import UserError, golden
from depthlab.model import parts

CI_STEPS, CI_ATOL = 30, 1e-5


@pytest.mark.slow
def test_every_case_trains_like_the_golden_losses():
    assert set(golden.load_golden()["cases"]) == set(golden.cases())  # every registered scheme and the FSDP run
    problems = golden.check(steps=CI_STEPS)
    assert not problems, "\n".join(["the losses moved (python -m depthlab.golden regen, if on purpose):", *problems])


def test_a_one_line_change_to_the_forward_fails_the_check(monkeypatch):
    plain = parts.Residual.forward  # the residual stream times 1.0001: the norms undo most of it, not all
    monkeypatch.setattr(parts.Residual, "forward", lambda self, h, update: plain(self, h, update) * 1.0001)
    problems = golden.check(["lns"], steps=CI_STEPS, atol=CI_ATOL)
    assert len(problems) == 1 and problems[0].startswith("lns: first differing step "), problems
    assert golden.check(["lns"], steps=1, atol=0)[0].startswith("lns: first differing step 1 ")  # bitwise: at once


def test_differences_name_the_first_differing_step_and_the_largest_difference():
    want = [3.0, 2.5, 2.0, 1.5]
    assert golden.differences("x", list(want), want) is None  # bitwise
    got = [3.0, 2.5 + 1e-7, 2.0 + 3e-3, 1.5 - 1e-3]
    assert golden.differences("x", got, want) == (f"x: first differing step 2 ({got[1]!r} vs 2.5), largest "
                                                  "difference 0.003 at step 3; 3 of 4 steps differ")
    assert golden.differences("x", got, want, atol=1e-5).startswith("x: first differing step 3 ")
    assert golden.differences("x", got, want, atol=1e-5, rtol=2e-3) is None
    assert golden.differences("x", want[:2], want) == "x: 2 steps logged, expected 4"
    assert golden.compare_runs({"a": want}, {"a": want, "b": want}) == ["b: not run by the first"]


@pytest.mark.slow
def test_compare_two_configs_in_child_processes():
    lines = golden.compare(".", ".", ["lns"], [], ["train.lr=0.004"], steps=3)
    assert len(lines) == 1 and lines[0].startswith("lns: first differing step 2 "), lines  # step 1: no update yet


def test_a_commit_is_read_from_git_and_a_bad_one_is_one_line():
    with golden.source_of("HEAD") as src:
        assert (src / "depthlab" / "model" / "schemes.py").is_file()
    with pytest.raises(UserError, match="'no-such-commit' is not a commit of "):
        with golden.source_of("no-such-commit"):
            pass


def _fail_if_trained(monkeypatch):
    monkeypatch.setattr(golden, "run_case", lambda *a, **k: pytest.fail("trained before refusing"))


@pytest.mark.parametrize("argv", [["check", "--cases", "nosuch"], ["check", "--cases", "pre", "nosuch"],
                                  ["regen", "--cases", "nosuch"], ["compare", ".", ".", "--cases", "nosuch"]])
def test_an_unknown_case_is_refused_in_one_line_naming_the_cases(monkeypatch, capsys, argv):
    """Not "no golden losses ... regen --cases nosuch" (a regen that then fails): every command refuses the name."""
    _fail_if_trained(monkeypatch)
    assert golden.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("depthlab: error: unknown golden case(s) nosuch; the cases are " + ", ".join(golden.cases())), err


@pytest.mark.parametrize("flags, says", [(["--atol", "nan"], "--atol must be a finite number, got 'nan'"),
                                         (["--atol", "-1"], "--atol must be a number >= 0, got '-1'"),
                                         (["--rtol", "inf"], "--rtol must be a finite number, got 'inf'"),
                                         (["--bitwise", "--atol", "1e-5"], "--bitwise is atol 0 and rtol 0")])
def test_a_tolerance_must_be_finite_and_not_negative(monkeypatch, capsys, flags, says):
    _fail_if_trained(monkeypatch)
    assert golden.main(["check", "--cases", "pre", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


def test_a_golden_file_cut_short_or_edited_is_one_line(tmp_path, monkeypatch, capsys):
    _fail_if_trained(monkeypatch)
    text = golden.FILE.read_text()
    cut, edited = tmp_path / "cut.json", tmp_path / "edited.json"
    cut.write_text(text[: len(text) // 2])
    edited.write_text(text.replace('"losses": [', '"losses": ["x", ', 1))
    for path, why in ((cut, "not JSON"), (edited, "not the layout regen writes")):
        with pytest.raises(UserError, match=f"is not a golden losses file \\({why}"):
            golden.check(path=path)
        assert golden.main(["check", "--file", str(path)]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_default_tolerance_is_the_measured_spread_and_fails_a_one_line_change(monkeypatch, capsys):
    """check's default tolerance of a case is 10 x the largest difference other CPUs' kernels made in it
    (benchmarks/results/golden_spread.json), at least 1e-5; RMSNorm with twice its eps, a one-line change, moves
    lns by 2e-3 and fails it, while --bitwise is still exact."""
    atol = golden.default_atol()
    assert set(atol) == set(golden.cases()) and min(atol.values()) == golden.FLOOR
    assert atol["lns"] < 1e-4 and atol["sandwich"] < 0.07  # 2 x eps moves lns by 2.2e-3, sandwich by 0.074
    assert golden.main(["check", "--cases", "lns", "--steps", str(CI_STEPS)]) == 0
    assert "each case's atol: 10 x its measured spread, at least 1e-05; rtol 0): the same" in capsys.readouterr().out
    monkeypatch.setattr(parts.RMSNorm, "forward", lambda self, x: parts._RMSNormFn.apply(x, self.weight,
                                                                                         2 * self.eps, self.scale))
    assert golden.main(["check", "--cases", "lns", "--steps", str(CI_STEPS)]) == 1
    assert "lns: first differing step 1 " in capsys.readouterr().out
    assert golden.main(["check", "--cases", "lns", "--steps", "1", "--bitwise"]) == 1


def test_the_spread_benchmark_adds_a_case_beside_those_measured_before(tmp_path, monkeypatch):
    """`python -m benchmarks.golden_spread --cases muon-lns` measures a new case under every variant and keeps the
    cases each variant measured before (it replaced them: the other cases' tolerances fell to the floor). The
    training is the golden file's own losses here (a spread of 0); the benchmark's part is the record."""
    import json

    from benchmarks import golden_spread

    want = golden.load_golden()["cases"]
    monkeypatch.setattr(golden_spread, "run_variant", lambda env, sets, cases: {c: want[c]["losses"] for c in cases})
    out = tmp_path / "spread.json"
    before = {"cases": {"sandwich": {"max_abs_diff": 0.5, "first_differing_step": 3, "steps_differing": 9}}}
    out.write_text(json.dumps({"variants": {"ATen AVX2": before}}))
    golden_spread.main(["--variants", "ATen AVX2", "--cases", "lns", "--out", str(out)])
    variant = json.loads(out.read_text())["variants"]["ATen AVX2"]
    assert variant["cases"]["sandwich"] == before["cases"]["sandwich"] and variant["cases"]["lns"]["max_abs_diff"] == 0
    assert variant["max_abs_diff"] == 0.5
