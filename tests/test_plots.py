"""depthlab.plots.save_figure is the one way a figure is written: its folder made, the file whole, the figure
closed; and no other module calls savefig or picks a matplotlib backend itself."""

import re
from pathlib import Path

import pytest

from depthlab.plots import pyplot, save_figure

ROOT = Path(__file__).resolve().parent.parent


def test_a_figure_is_written_into_a_new_folder_and_closed(tmp_path):
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    out = save_figure(fig, tmp_path / "new" / "deeper" / "f.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)
    assert [p.name for p in out.parent.iterdir()] == ["f.png"]  # no temporary file left beside it


def test_a_failed_save_leaves_the_old_figure_whole_and_closes_the_new_one(tmp_path):
    plt = pyplot()
    out = save_figure(plt.subplots()[0], tmp_path / "f.png")
    old = out.read_bytes()
    fig, ax = plt.subplots()
    ax.set_title(r"$\frac{$")  # mathtext that cannot be parsed: drawing it raises
    with pytest.raises(ValueError):
        save_figure(fig, out)
    assert out.read_bytes() == old and [p.name for p in tmp_path.iterdir()] == ["f.png"]
    assert not plt.fignum_exists(fig.number)


def test_no_module_saves_a_figure_or_picks_a_backend_on_its_own():
    own = [f"{p.relative_to(ROOT)}:{i}" for p in [*(ROOT / "src").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
           if p.name != "plots.py"
           for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\.savefig\(|matplotlib\.use\(", line)]
    assert own == []
