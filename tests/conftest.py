import multiprocessing.process
import os
import random
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from depthlab.config import ModelConfig

# Caches that libraries would put in the home directory (datasets, transformers, matplotlib, torch) go to a
# directory of this session instead, for this process and every subprocess a test starts.
_CACHE = tempfile.mkdtemp(prefix="depthlab-test-cache-")
for _var in ("HF_HOME", "MPLCONFIGDIR", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
    os.environ[_var] = os.path.join(_CACHE, _var.lower())

# One intra-op thread, here and (through OMP_NUM_THREADS) in every process a test starts: the suite's models are tiny,
# a second thread gains them nothing, and on a shared machine its spin-waits cost more CPU than the work itself.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


def outside_state() -> dict:
    """What the suite must leave as it found it: /dev/null (a character device, as a regular file it breaks every
    other user's processes), the names in the home directory and one level below it, and the working directory."""
    null = os.stat(os.devnull)
    home = Path.home()
    names = {p.name: sorted(c.name for c in p.iterdir()) if p.is_dir() and os.access(p, os.R_OK) else None
             for p in home.iterdir()} if home.is_dir() else {}
    cwd = sorted(n for n in os.listdir() if n not in (".pytest_cache", "__pycache__"))
    return {"devnull": (stat.S_ISCHR(null.st_mode), stat.S_IMODE(null.st_mode)), "home": names, "cwd": cwd}


@pytest.fixture(scope="session", autouse=True)
def _nothing_outside_the_tests():
    """Fail the run if any test wrote outside its temporary directories."""
    before = outside_state()
    yield
    after = outside_state()
    assert after["devnull"][0], f"{os.devnull} is no longer a character device: a test wrote over it"
    changed = {k: (before[k], after[k]) for k in ("devnull", "cwd") if before[k] != after[k]}
    changed.update({f"~/{n}": (before["home"].get(n), after["home"].get(n))
                    for n in set(before["home"]) | set(after["home"]) if before["home"].get(n) != after["home"].get(n)})
    assert not changed, f"the test suite changed what is not its own (before, after): {changed}"


# The fast tier (`make test-fast`: pytest -m "not slow") leaves out the tests marked slow. Every Python process a
# test starts (a Python subprocess, torchrun, a multiprocessing worker) imports torch again, so a test that starts one
# must carry the marker: one that does not fails at the start, naming the marker (tests/test_tiers.py).
_running = {"slow": False}


def runs_python(args) -> bool:
    """Whether a subprocess' command line runs Python: the interpreter, or a script that names it (console scripts
    such as depthlab and torchrun)."""
    argv = shlex.split(args) if isinstance(args, str) else [args] if isinstance(args, (bytes, os.PathLike)) \
        else list(args)
    program = shutil.which(os.fsdecode(argv[0])) if argv else None
    if program is None:
        return False
    if os.path.basename(program).startswith("python") or os.path.samefile(program, sys.executable):
        return True
    try:
        with open(program, "rb") as f:
            return f.read(2) == b"#!" and b"python" in f.readline()
    except OSError:
        return False


def _refuse_unmarked(what: str) -> None:
    if not _running["slow"]:
        pytest.fail(f"this test starts {what}: mark it @pytest.mark.slow (the fast tier leaves those out)",
                    pytrace=False)


def _guarded_popen(self, args, *a, _start=subprocess.Popen.__init__, **k):
    if runs_python(args):
        _refuse_unmarked("a Python process")
    _start(self, args, *a, **k)


def _guarded_start(self, _start=multiprocessing.process.BaseProcess.start):
    _refuse_unmarked("a multiprocessing worker")
    _start(self)


def pytest_configure(config):  # in the test run only, not in a worker that imports this module
    subprocess.Popen.__init__ = _guarded_popen
    multiprocessing.process.BaseProcess.start = _guarded_start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running["slow"] = item.get_closest_marker("slow") is not None
    yield


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tiny_model_config(**kw) -> ModelConfig:
    base = dict(vocab_size=97, dim=32, n_layers=4, n_heads=4, ffn_dim=64, max_seq_len=32)
    base.update(kw)
    return ModelConfig(**base)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small real-text file (random sentences over a tiny vocabulary) for trainer and fault tests."""
    rng = random.Random(1)
    words = "the quick brown fox jumps over lazy dog and cat sat on mat while birds sing in green trees".split()
    f = tmp_path_factory.mktemp("data") / "corpus.txt"
    f.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(3000)))
    return f
