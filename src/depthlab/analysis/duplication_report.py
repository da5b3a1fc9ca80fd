"""The layer-duplication scan (depthlab.analysis.duplication) drawn as an (i, j) heat map,
`duplication_heatmap.png`: the loss change with blocks i..j run twice, start block down, end block across, the best
span starred; one panel more per task (its accuracy change). Its table, `duplication.csv`: one row per span.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.colors import SymLogNorm
from matplotlib.ticker import MaxNLocator

from depthlab.plots import pyplot, save_figure

plt = pyplot()


def _grid(rows: list[dict], n_layers: int, value) -> np.ndarray:
    grid = np.full((n_layers, n_layers), np.nan)
    for r in rows:
        grid[r["start_block"] - 1, r["end_block"] - 1] = value(r)
    return grid


def _panel(fig, ax, grid: np.ndarray, best: dict, title: str, label: str) -> None:
    """One heat map: blue lowers the loss (or raises accuracy), red the reverse; a symmetric log scale, so that
    a span costing nats does not wash out the ones changing it by hundredths."""
    top = float(np.nanmax(np.abs(grid))) or 1.0
    small = np.abs(grid[np.isfinite(grid) & (grid != 0)])
    linthresh = max(float(np.quantile(small, 0.1)) if small.size else top, top * 1e-4)
    n = grid.shape[0]
    im = ax.imshow(grid, cmap="RdBu_r", norm=SymLogNorm(linthresh, vmin=-top, vmax=top), origin="upper",
                   extent=(0.5, n + 0.5, n + 0.5, 0.5))
    ax.plot(best["end_block"], best["start_block"], marker="*", ms=14, color="gold", mec="k")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("last repeated block j")
    ax.set_ylabel("first repeated block i")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label=label)


def plot_duplication(res: dict, path: Path) -> Path:
    """Δ loss per (i, j); given tasks, each task's accuracy change (points; positive: the duplicate does better)."""
    d = res["duplication"]
    n_layers = len(d["delta_loss_table"])
    tasks = d.get("tasks", {})
    fig, axes = plt.subplots(1, 1 + len(tasks), figsize=(5.4 * (1 + len(tasks)), 4.4), squeeze=False)
    b = d["best"]
    _panel(fig, axes[0][0], _grid(d["spans"], n_layers, lambda r: r["delta_loss"]), b,
           f"Δ loss with blocks i..j run twice (spans of 1..{d['max_span']});\nbest {b['start_block']}-"
           f"{b['end_block']}: {b['delta_loss']:+.4f} [{b['delta_loss_ci'][0]:+.4f}, {b['delta_loss_ci'][1]:+.4f}]",
           "Δ loss (nats per token)")
    for ax, (name, t) in zip(axes[0][1:], tasks.items()):
        _panel(fig, ax, _grid(t["duplicate"], n_layers, lambda r: -100 * r["acc_drop"]), t["best"],
               f"{name}: accuracy change (points), base {100 * t['base_acc']:.1f}%", "accuracy change (points)")
    return save_figure(fig, path, dpi=90)


def duplication_rows(res: dict) -> list[dict]:
    """One row per span: blocks (1-based), `duplicate --span`, loss change; each task's accuracy and its drop."""
    d = res.get("duplication")
    if d is None:
        return []
    rows = [{k: r[k] for k in ("start_block", "end_block", "n", "span", "loss", "delta_loss") if k in r}
            for r in d["spans"]]
    for name, t in d.get("tasks", {}).items():
        for row, r in zip(rows, t["duplicate"]):
            row[f"{name}_acc"], row[f"{name}_acc_drop"] = r["acc"], r["acc_drop"]
    return rows
