"""The fast tier (`make test-fast`: pytest -m "not slow"): a test that starts a Python process without the slow
marker fails at the start, naming the marker (tests/conftest.py); the marker is registered under strict markers."""

import multiprocessing
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import runs_python

ROOT = Path(__file__).resolve().parent.parent
UNMARKED = "this test starts a {}: mark it @pytest.mark.slow"


def test_an_unmarked_test_starting_python_fails_naming_the_marker():
    script = Path(sys.executable).parent / "depthlab"  # a console script: Python by its first line
    for argv in ([sys.executable, "-c", "pass"], f"{sys.executable} -c pass", [script, "--help"]):
        with pytest.raises(pytest.fail.Exception, match=UNMARKED.format("Python process")):
            subprocess.run(argv)
    with pytest.raises(pytest.fail.Exception, match=UNMARKED.format("multiprocessing worker")):
        multiprocessing.get_context("spawn").Process(target=print).start()


def test_other_programs_start_in_the_fast_tier():
    assert subprocess.run(["git", "--version"], capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_marked_test_starts_python():
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


def test_python_is_known_by_its_interpreter_or_its_scripts_first_line():
    bin_dir = Path(sys.executable).parent
    assert runs_python([sys.executable]) and runs_python(["python3", "-V"]) and runs_python(bin_dir / "torchrun")
    assert not runs_python(["git", "status"]) and not runs_python(["no-such-program"]) and not runs_python([])
    if (bin_dir / "ruff").exists():  # a compiled program in the same folder
        assert not runs_python([bin_dir / "ruff", "check"])


def test_the_marker_is_registered_strictly_and_make_test_fast_leaves_it_out():
    pytest_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in pytest_cfg["addopts"].split()
    assert any(m.startswith("slow:") for m in pytest_cfg["markers"])
    assert '-m pytest -m "not slow"' in (ROOT / "Makefile").read_text().split("\ntest-fast:")[1].split("\n\n")[0]
