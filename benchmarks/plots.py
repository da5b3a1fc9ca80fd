"""Plots from run directories' metrics.jsonl: loss curves and the residual stream's variance by depth."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator


def curve(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in records if key in r]
    return [s for s, _ in pts], [v for _, v in pts]


def last_depth_stat(records: list[dict], key: str = "depth/var") -> list[float] | None:
    rows = [r[key] for r in records if key in r]
    return rows[-1] if rows else None


def _axes(n_groups: int):
    """A figure for n_groups lines: 20 distinguishable colours and a wider figure when there are many."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2) if n_groups <= 6 else (8.0, 5.0))
    if n_groups > 10:
        colors = plt.get_cmap("tab20").colors  # ten dark hues first, then their light partners
        ax.set_prop_cycle(color=colors[::2] + colors[1::2])
    return fig, ax


def _finish(fig, ax, path) -> None:
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()[0]
    if handles:
        ax.legend(fontsize="small" if len(handles) > 6 else None, ncol=2 if len(handles) > 6 else 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(groups: dict[str, list[list[dict]]], key: str, path: str | Path, title: str, ylabel: str,
                ylim: tuple[float, float] | None = None) -> None:
    """One line per group: the mean over its runs (seeds), shaded between min and max."""
    fig, ax = _axes(len(groups))
    for label, runs in groups.items():
        curves = [curve(r, key) for r in runs]
        n = min(len(s) for s, _ in curves)
        if n == 0:
            continue
        steps = curves[0][0][:n]
        vals = np.array([v[:n] for _, v in curves], dtype=float)
        line, = ax.plot(steps, vals.mean(0), label=f"{label} (n={len(runs)})")
        if len(runs) > 1:
            ax.fill_between(steps, vals.min(0), vals.max(0), color=line.get_color(), alpha=0.2)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    if ylim:
        ax.set_ylim(*ylim)
    _finish(fig, ax, path)


def plot_by_depth(groups: dict[str, list[list[float]]], path: str | Path, title: str, ylabel: str,
                  log: bool = True) -> None:
    """One line per group over block index 1..N: mean over runs, shaded between min and max."""
    fig, ax = _axes(len(groups))
    for label, rows in groups.items():
        rows = [r for r in rows if r]
        if not rows:
            continue
        vals = np.array(rows, dtype=float)
        layers = np.arange(1, vals.shape[1] + 1)
        line, = ax.plot(layers, vals.mean(0), marker=".", label=f"{label} (n={len(rows)})")
        if len(rows) > 1:
            ax.fill_between(layers, vals.min(0), vals.max(0), color=line.get_color(), alpha=0.2)
    ax.set(xlabel="block l (output of block l)", ylabel=ylabel, title=title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if log:
        ax.set_yscale("log")
    _finish(fig, ax, path)
