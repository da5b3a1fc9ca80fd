"""The one way depthlab draws and saves a figure: pyplot on the Agg backend (no display needed, imported on first
use, so commands that draw nothing never load matplotlib), and save_figure, which lays the figure out, makes its
folder, writes the file whole (a temporary sibling renamed over it: a killed or failed save leaves the old figure,
never half a PNG for a results page to embed) and closes the figure (pyplot keeps every open one alive)."""

from __future__ import annotations

from pathlib import Path

from depthlab.ownership import write_whole


def pyplot():
    """matplotlib.pyplot, on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write `fig` to `path` (the format from its suffix) after tight_layout, whole, and close it; returns path."""
    path = Path(path)
    try:
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, write=lambda tmp: fig.savefig(tmp, dpi=dpi, format=path.suffix[1:] or None))
    finally:
        pyplot().close(fig)
    return path
