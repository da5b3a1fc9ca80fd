"""The removal figures and tables beyond whole-block perplexity: the paper's Figure 1 (task accuracy drop per
removed block, `figure_one.png`), sublayer removal and linear replacement (`sublayers.png`), and the model without
its k least useful blocks. Every function takes a list of (label, results), so `compare` overlays models on
relative depth with the same code.
"""

from __future__ import annotations

from pathlib import Path

from depthlab.analysis.answer import pct_ppl
from depthlab.analysis.removal import PART_NAMES, PARTS
from depthlab.analysis.results import blocks_text, span_text
from depthlab.plots import pyplot, save_figure

plt = pyplot()

Runs = list[tuple[str, dict]]
STYLE = {"single": ("o", "-"), "attn": ("^", "--"), "mlp": ("s", ":")}  # marker, line per kind of removal
KINDS = {"single": "whole block", "attn": PART_NAMES["attn"], "mlp": PART_NAMES["mlp"]}


def task_names(runs: Runs, key: str = "task_removal") -> list[str]:
    return list(dict.fromkeys(t for _, r in runs for t in r.get(key, {}).get("tasks", {})))


def plot_figure_one(runs: Runs, path: Path, normalise_depth: bool = False, key: str = "task_removal") -> Path:
    """One panel per task: the accuracy drop (points) when each block is removed, with its paired 95% interval
    (tasks.paired_drop); the attention-only and MLP-only drops dashed and dotted. `key`: task_removal (multiple
    choice) or generate_removal (generation, exact match)."""
    names = task_names(runs, key)
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for k, (label, res) in enumerate(runs):
            t = res.get(key, {}).get("tasks", {}).get(name)
            if t is None:
                continue
            for kind, (marker, ls) in STYLE.items():
                rows = t.get(kind)
                if not rows:
                    continue
                L = len(rows)
                x = [r["block"] / L if normalise_depth else r["block"] for r in rows]
                y = [100 * r["acc_drop"] for r in rows]
                err = [[max(0.0, 100 * (r["acc_drop"] - r["drop_ci"][0])) for r in rows],  # rounding at the ends
                       [max(0.0, 100 * (r["drop_ci"][1] - r["acc_drop"])) for r in rows]]
                ax.errorbar(x, y, yerr=err if kind == "single" else None, marker=marker, ls=ls, ms=4, capsize=2,
                            color=f"C{k}", label=f"{label}, {KINDS[kind]} (base {100 * t['base_acc']:.1f}%)"
                            if kind == "single" else f"{label}, {KINDS[kind]}")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_title(f"{name}: accuracy drop when one block is removed", fontsize=10)
        ax.set_xlabel("relative depth of the removed block" if normalise_depth else "removed block")
        ax.set_ylabel("accuracy drop (points); bars: paired 95% interval")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path, dpi=90)


def has_parts(res: dict) -> bool:
    return any(k in res.get("removal", {}) for k in (*PARTS, "linear"))


def plot_sublayers(runs: Runs, path: Path, normalise_depth: bool = False) -> Path:
    """Δ loss per block for each kind of removal present (whole block, attention only, MLP only, linear
    replacement), one panel each, a line per model."""
    kinds = [k for k in ("single", *PARTS, "linear") if any(k in r.get("removal", {}) for _, r in runs)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.5 * len(kinds), 3.6), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for label, res in runs:
            rows = res.get("removal", {}).get(kind)
            if rows:
                L = len(rows)
                ax.plot([r["block"] / L if normalise_depth else r["block"] for r in rows],
                        [r["delta_loss"] for r in rows], marker="o", ms=3, label=label)
        ax.set_title(f"Δ loss, {PART_NAMES['block' if kind == 'single' else kind]}", fontsize=10)
        ax.set_xlabel("relative depth" if normalise_depth else "block")
        ax.set_yscale("symlog", linthresh=0.01)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=90)


def task_rows(res: dict, key: str = "task_removal") -> list[dict]:
    """One row per task, kind of removal and block (or run, or k least useful): the CSV and the report's table
    (generation: no log-likelihood columns)."""
    rows = []
    for name, t in res.get(key, {}).get("tasks", {}).items():
        for kind in ("single", *PARTS, "runs"):
            for r in t.get(kind, []):
                blocks = span_text(r["blocks"]) if "blocks" in r else str(r["block"])
                rows.append({"task": name, "n": t["n"], "removal": KINDS.get(kind, "run"), "blocks": blocks,
                             "acc": r["acc"],
                             "acc_ci": f"{r['acc_ci'][0]:.3f}-{r['acc_ci'][1]:.3f}", "acc_drop": r["acc_drop"],
                             "drop_ci": f"{r['drop_ci'][0]:.3f}-{r['drop_ci'][1]:.3f}", "lost": r["lost"],
                             "gained": r["gained"], "drop_p": r["drop_p"],
                             **{k: r[k] for k in ("ll", "ll_drop") if k in r}, "base_acc": t["base_acc"]})
    return rows


def part_rows(res: dict) -> list[dict]:
    """Per block: Δ loss for each kind of removal, and the linear map's fit residual."""
    r = res.get("removal", {})
    rows = []
    for i, s in enumerate(r.get("single", [])):
        row = {"block": s["block"], "delta_loss_block": s["delta_loss"]}
        for kind in (*PARTS, "linear"):
            if kind in r:
                row[f"delta_loss_{kind}"] = r[kind][i]["delta_loss"]
        if "linear" in r:
            row["linear_fit_residual"] = r["linear"][i]["fit_residual"]
        rows.append(row)
    return rows


def drop_rows(res: dict) -> list[dict]:
    """The model without its k least useful blocks (by loss, and by tasks): which blocks, and what it scores."""
    rows = []
    for by, drops in res.get("removal", {}).get("drop", {}).items():
        for d in drops:
            row = {"by": by, "k": d["k"], "blocks": blocks_text(res["usefulness"][by][:d["k"]]),
                   "loss": d["loss"], "delta_loss": d["delta_loss"]}
            if "acc_drop" not in d:  # a language model: the same cost read as perplexity
                row["ppl_change_pct"] = pct_ppl(d["delta_loss"])
            for name, t in res.get("task_removal", {}).get("tasks", {}).items():
                task_drop = next(x for x in t["drop"][by] if x["k"] == d["k"])
                row[f"{name}_acc"], row[f"{name}_acc_drop"] = task_drop["acc"], task_drop["acc_drop"]
            rows.append(row)
    return rows


def plot_profiles(runs: Runs, path: Path) -> Path:
    """The removal profiles over relative depth, each divided by its largest cost (1: the costliest block): one
    model's profiles on one panel; several models, one panel per profile and a line per model."""
    from depthlab.analysis.profiles import PROFILES

    names = [k for k in PROFILES if any(k in r.get("profiles", {}).get("profiles", {}) for _, r in runs)]
    one = len(runs) == 1
    panels = [None] if one else names
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for k, (label, res) in enumerate(runs):
            prof = res.get("profiles", {}).get("profiles", {})
            for name in names if one else [panel]:
                if name not in prof:
                    continue
                y = prof[name]
                top = max(abs(v) for v in y) or 1.0
                ax.plot([(l + 1) / len(y) for l in range(len(y))], [v / top for v in y], marker="o", ms=3,
                        color=f"C{names.index(name) if one else k}", label=PROFILES[name] if one else label)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_title("removal profiles" if one else PROFILES[panel], fontsize=10)
        ax.set_xlabel("relative depth of the removed block")
        ax.set_ylabel("cost / largest cost")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=90)


def profile_rows(res: dict) -> list[dict]:
    """The profiles' rank correlations: the report's table."""
    return [{"profiles": f"{c['a']} ~ {c['b']}", "spearman": c["rho"], "ci": "-" if not c["ci"] else
             f"{c['ci'][0]:.3f}-{c['ci'][1]:.3f}", "replicates": c["replicates"]}
            for c in res.get("profiles", {}).get("correlations", [])]


PCT_TICKS = (-90, -50, -10, -1, 0, 1, 10, 100, 1000)  # % perplexity on the right (past 2.4 nats, read nats)


def ppl_axis(ax):
    """A right-hand axis reading the nats axis as % perplexity, 100 (e^x - 1): the same scale and limits, ticks
    at round percentages placed at their nats. Call it once the data are drawn (it reads the limits)."""
    import math

    lo, hi = ax.get_ylim()
    twin = ax.twinx()
    twin.set_yscale(ax.get_yscale(), **({"linthresh": ax.yaxis.get_transform().linthresh}
                                         if ax.get_yscale() == "symlog" else {}))
    twin.set_ylim(lo, hi)
    ticks = [(math.log1p(p / 100), p) for p in PCT_TICKS if lo <= math.log1p(p / 100) <= hi]
    twin.set_yticks([t for t, _ in ticks], [f"{p:+g}%" if p else "0%" for _, p in ticks])
    twin.minorticks_off()
    twin.set_ylabel("perplexity change", fontsize=8)
    return twin


def cost_intervals(res: dict):
    """Each block's removal cost with its 95% bootstrap interval over the calibration windows (paired: each window's
    loss change against the model's own on that window), as in the curse index."""
    import numpy as np

    from depthlab.analysis.curse import resampled_costs

    w = res["removal"]["windows"]
    delta, count = np.asarray(w["single_delta"], dtype=float), np.asarray(w["count"], dtype=float)
    boot = resampled_costs(delta, count)  # (R, L)
    return np.quantile(boot, 0.025, axis=0), np.quantile(boot, 0.975, axis=0)


def plot_removal_cost(res: dict, path: Path, cheapest: list[int] = ()) -> Path:
    """The paper's Figure 1 form for this model: what removing each block alone costs (nats per token, right axis:
    % perplexity), against the block (top axis: relative depth), with 95% bootstrap intervals over the windows; the
    early and deep interiors the verdict compares shaded, and the cheapest blocks (`cheapest`, 1-based) marked."""
    from depthlab.analysis.curse import shallow_deep

    single = res["removal"]["single"]
    L = len(single)
    x, y = [s["block"] for s in single], [s["delta_loss"] for s in single]
    fig, ax = plt.subplots(figsize=(9, 3.4))
    early, deep = shallow_deep(L)
    for blocks, colour, name in ((early, "C2", "early interior"), (deep, "C1", "deep interior")):
        if blocks:
            ax.axvspan(blocks[0] - 0.5, blocks[-1] + 0.5, color=colour, alpha=0.12, label=name)
    if "windows" in res["removal"]:
        lo, hi = cost_intervals(res)
        ax.errorbar(x, y, yerr=[[max(0.0, a - b) for a, b in zip(y, lo)], [max(0.0, b - a) for a, b in zip(y, hi)]],
                    fmt="o", ms=4, capsize=2, color="C0", label="removing the block alone (95% interval)")
    else:
        ax.plot(x, y, "o", ms=4, color="C0", label="removing the block alone")
    marked = [(b, y[b - 1]) for b in cheapest if 0 < b <= L]
    if marked:
        ax.plot(*zip(*marked), "s", ms=9, mfc="none", mec="C3", mew=1.5, label=f"cheapest: {blocks_text(cheapest)}")
    if min(y) > 0:  # every block costs something: a log axis spends no height on the negative side
        ax.set_yscale("log", nonpositive="clip")
        ax.set_ylim(min(y) / 2, max(y) * 2)
    else:
        ax.axhline(0, color="k", lw=0.8)
        ax.set_yscale("symlog", linthresh=0.01)
    ax.set_xlabel("removed block")
    ax.set_ylabel("loss increase (nats per token)", fontsize=9)
    top = ax.secondary_xaxis("top", functions=(lambda b: b / L, lambda d: d * L))
    top.set_xlabel("relative depth of the removed block", fontsize=8)
    ppl_axis(ax).set_xlim(0.5, L + 0.5)  # after the twin axis, which shares x
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, frameon=False)
    return save_figure(fig, path, dpi=90)
