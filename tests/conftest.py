import os
import random
import stat
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
