"""The studies' figures, drawn from depthlab.study.summary results and records (the results page places them)."""

from __future__ import annotations

import math
from pathlib import Path

from depthlab.plots import pyplot, save_figure
from depthlab.study.records import final_probe
from depthlab.study.verdicts import CURSE_RATIO, PRESENT, pooled


def plot_depth(res: dict, records: dict, out: Path) -> None:
    depths = [d for d in res["depths"] if d["seeds"]]
    if not depths:
        return
    plt = pyplot()
    Ls = [d["layers"] for d in depths]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    a, b, c = axes
    for d in depths:
        a.scatter([d["layers"]] * len(d["delta_val_loss"]["per_seed"]), d["delta_val_loss"]["per_seed"], color="0.6",
                  s=12, zorder=2)
    ci = [d["delta_val_loss"]["ci"] for d in depths]
    means = [d["delta_val_loss"]["mean"] for d in depths]
    a.errorbar(Ls, means, yerr=[[m - lo if math.isfinite(lo) else 0 for m, (lo, _) in zip(means, ci, strict=True)],
                                [hi - m if math.isfinite(hi) else 0 for m, (_, hi) in zip(means, ci, strict=True)]],
               marker="o", capsize=4, zorder=3)
    a.axhline(0, color="k", lw=0.8)
    a.set(title="val loss, lns − pre at one shared rate per scheme\n(seeds grey, 95% t-interval)", ylabel="nats")
    for v, style in (("pre", "o-"), ("lns", "s--")):
        # the criteria the verdict reads, with the intervals it reads
        line = _criterion(b, Ls, [d[v]["index"]["curse"]["inert"] for d in depths], style, f"{v}, deep half")
        _criterion(c, Ls, [d[v]["index"]["curse"]["ratio"] for d in depths], style, v)
        b.plot(Ls, [d[v]["index"]["inert_fraction"]["mean"] for d in depths], style[0], mfc="none", alpha=0.6,
               color=line.get_color(), label=f"{v}, whole interior (mean; decides nothing)")
    b.axhline(PRESENT, color="tab:red", ls=":", lw=1, label=f"present at or above {PRESENT:.2f}")
    c.axhline(CURSE_RATIO, color="tab:red", ls=":", lw=1, label=f"present below {CURSE_RATIO}")
    b.set(title="curse index: inert fraction of the deep half\n(mean, 95% t-interval across seeds)",
          ylim=(-0.05, 1.05))
    c.set(title="removal cost, deep / shallow interior\n(mean, 95% t-interval across seeds)")
    c.axhline(1, color="k", lw=0.8)
    for ax in axes:
        ax.set(xscale="log", xlabel="blocks N")
        ax.set_xticks(Ls, [str(x) for x in Ls])
        ax.xaxis.set_minor_locator(plt.NullLocator())  # minor log labels overlapped the depth ticks
    b.legend(fontsize=6)
    c.legend(fontsize=6)
    save_figure(fig, out / "delta_and_index_by_depth.png")
    plot_profiles(res, records, out, plt)


def _criterion(ax, Ls: list[int], cells: list[dict], style: str, label: str):
    """One curse criterion by depth as verdicts.curse_reading holds it: the mean with its 95% t-interval across
    seeds (no bar where one seed gives no interval); returns the line."""
    means = [c["mean"] if c["n"] else math.nan for c in cells]
    err = [[m - c["ci"][0] if c["ci"] else 0 for m, c in zip(means, cells, strict=True)],
           [c["ci"][1] - m if c["ci"] else 0 for m, c in zip(means, cells, strict=True)]]
    return ax.errorbar(Ls, means, yerr=err, fmt=style, capsize=3, label=label).lines[0]


def plot_profiles(res: dict, records: dict, out: Path, plt) -> None:
    """Per-block update ratio, removal cost and angular distance of seed 0's final models, by relative depth."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for d in res["depths"]:
        L = d["layers"]
        for v, style in (("pre", "-"), ("lns", "--")):
            r = records.get(f"{v}-L{L}-lr{res['best_lr'][v]:g}-seed0") if res["best_lr"][v] else None
            p = final_probe(r) if r else None
            if not p:
                continue
            x = [(i + 1) / L for i in range(L)]
            for ax, key in zip(axes, ("update_ratio", "removal", "angular_last" if "angular_last" in p
                                      else "angular_all"), strict=True):
                ax.plot(x, p[key], style, label=f"{v} N={L}")
    for ax, title in zip(axes, ("update ratio ||dh|| / ||h||", "loss increase when the block is removed",
                                "adjacent angular distance"), strict=True):
        ax.set(xlabel="block l / N", title=title, yscale="log")
    axes[1].set_yscale("symlog", linthresh=1e-3)  # a removal can lower the loss: log where positive, linear near 0
    axes[0].legend(fontsize=6, ncol=2)
    save_figure(fig, out / "profiles_by_depth.png")


def plot_along(records: dict, path: Path) -> bool:
    """Δ probe loss and both schemes' curse index against training tokens, one column per (depth, rate)."""
    from depthlab.study.summary import along_pairs

    pairs = along_pairs(records)
    if not pairs:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(2, len(pairs), figsize=(4.2 * len(pairs), 6), squeeze=False)
    for col, a in enumerate(pairs):
        t = [p["tokens"] / 1e6 for p in a["probes"]]
        top, bottom = axes[0][col], axes[1][col]
        top.plot(t, [p["delta"] for p in a["probes"]], "o-", color="k")
        top.axhline(0, color="grey", lw=0.5)
        top.set(title=f"N={a['layers']}, lr {a['lr']:g}", ylabel="Δ probe loss (lns − pre)")
        for v, c in (("pre", "tab:blue"), ("lns", "tab:orange")):
            bottom.plot(t, [p[f"{v}_inert_fraction"] for p in a["probes"]], "o-", color=c, label=f"{v} inert fraction")
            bottom.plot(t, [p[f"{v}_removal_deep_over_shallow"] for p in a["probes"]], "s--", color=c,
                        label=f"{v} removal deep/shallow")
        bottom.set(xlabel="training tokens (M)", ylabel="curse index")
        bottom.legend(fontsize=7)
    save_figure(fig, path)
    return True


def plot_rates(res: dict, path: Path, vocab: int) -> bool:
    """Final validation loss against learning rate (seed 0): pre and lns at each depth, one panel per depth, and
    every stability scheme at the reference depth beside pre and lns, with the unigram loss (res["unigram_loss"],
    the paper's divergence) dotted and ln V dashed. The best rate of each curve is the filled marker.
    res: depthlab.study.summary.lns_study()."""
    if not res["depths"]:
        return False
    plt = pyplot()
    panels = [(f"N = {d['layers']}", d["grids"]) for d in res["depths"]]
    ref = {d["layers"]: d["grids"] for d in res["depths"]}.get(res["ref_depth"], {})
    if res["stability"]:
        panels.append((f"N = {res['ref_depth']}, every scheme", {**ref, **res["stability"]}))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), squeeze=False)
    for ax, (title, grids) in zip(axes[0], panels):
        rates = sorted({float(lr) for g in grids.values() for lr in g["grid"]})
        for v, g in grids.items():
            lrs = [float(lr) for lr in g["grid"]]
            line, = ax.plot(lrs, [min(x, 1.1 * math.log(vocab)) for x in g["grid"].values()], "o-", label=v, ms=4)
            if g.get("best_lr") is not None:
                ax.plot([g["best_lr"]], [g["grid"][f"{g['best_lr']:g}"]], "o", color=line.get_color(), ms=9)
        if any(x > math.log(vocab) - 1 for g in grids.values() for x in g["grid"].values()):
            ax.axhline(math.log(vocab), color="grey", ls="--", lw=0.8)  # only where a run came near it
        if res.get("unigram_loss"):
            ax.axhline(res["unigram_loss"], color="tab:red", ls=":", lw=1, label="unigram loss")
        ax.set(xscale="log", title=title, xlabel="learning rate")
        ax.set_xticks(rates, [f"{lr:g}" for lr in rates], minor=False, fontsize=7, rotation=45)
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("final validation loss (seed 0)")
    save_figure(fig, path)
    return True


def plot_own_best(res: dict, path: Path) -> bool:
    """Own-best Δ by depth: each seed grey, the mean with its 95% t-interval, the pooled mean as a band."""
    done = [d for d in res["depths"] if d["delta_val_loss"].get("n")]
    if not done:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    Ls = [d["layers"] for d in done]
    for d in done:
        ax.scatter([d["layers"]] * d["delta_val_loss"]["n"], d["delta_val_loss"]["per_seed"], color="0.6", s=12)
    ms = [d["delta_val_loss"]["mean"] for d in done]
    err = [[m - (d["delta_val_loss"]["ci"][0] if math.isfinite(d["delta_val_loss"]["ci"][0]) else m) for m, d in
            zip(ms, done, strict=True)], [(d["delta_val_loss"]["ci"][1] if math.isfinite(d["delta_val_loss"]["ci"][1])
                                           else m) - m for m, d in zip(ms, done, strict=True)]]
    ax.errorbar(Ls, ms, yerr=err, fmt="o", capsize=4, color="k", label="mean, 95% interval (pooled seed noise)")
    p = pooled([d["delta_val_loss"] for d in done])
    ax.axhspan(*p["ci"], color="tab:orange", alpha=0.25, label=f"pooled {p['mean']:+.3f}, n = {p['n']}")
    ax.set(ylabel="val loss, lns − pre (nats)", title="each scheme at its own best rate")
    _by_depth(ax, plt, Ls, 7)
    save_figure(fig, path)
    return True


def _by_depth(ax, plt, depths: list[int], legend_size: int) -> None:
    """A Δ-by-depth panel's frame: the zero line, depth on a log axis with one tick per depth, the legend."""
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="blocks N")
    ax.set_xticks(depths, [str(x) for x in depths])
    ax.xaxis.set_minor_locator(plt.NullLocator())  # minor log labels overlapped the depth ticks
    ax.legend(fontsize=legend_size)


def plot_decomposition(res: dict, parts: list[dict], path: Path) -> bool:
    if not parts:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, len(parts), figsize=(4.5 * len(parts), 3.4), squeeze=False)
    for ax, p in zip(axes[0], parts, strict=True):
        names = list(p["against_pre"])
        cs = [p["against_pre"][v] for v in names]
        lo = [c["mean"] - c["ci"][0] if math.isfinite(c["ci"][0]) else 0 for c in cs]
        hi = [c["ci"][1] - c["mean"] if math.isfinite(c["ci"][1]) else 0 for c in cs]
        ax.bar(range(len(names)), [c["mean"] for c in cs], yerr=[lo, hi], capsize=4, color="tab:blue")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=8)
        ax.set(title=f"N = {p['layers']}, lr {p['lr']:g}", ylabel="val loss, variant − pre (nats)")
    save_figure(fig, path)
    return True


def plot_vit(res: dict, path: Path) -> None:
    """The ViT study's seed-0 rate grid: validation loss against rate, per variant."""
    plt = pyplot()
    fig, a = plt.subplots(1, 1, figsize=(6, 3.8))
    for v, g in res["grid"].items():
        a.plot([float(x) for x in g], [c["loss"] for c in g.values()], "o-", label=v)
    a.set(xscale="log", xlabel="learning rate", ylabel="validation loss (seed 0)", title="ViT rate grid")
    a.legend(fontsize=8)
    save_figure(fig, path)


def curve(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one key over a run's metrics records."""
    pts = [(r["step"], r[key]) for r in records if key in r]
    return [s for s, _ in pts], [v for _, v in pts]


def plot_runs(runs: dict[str, list[dict]], out: Path) -> None:
    """One run per label from its metrics records: out/loss.png (training loss by step) and out/var_by_depth.png (the
    residual stream's variance after each block at the last monitor step, log scale)."""
    plt = pyplot()
    for name, key in (("loss.png", "loss"), ("var_by_depth.png", "depth/var")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for label, records in runs.items():
            if key == "loss":
                ax.plot(*curve(records, key), label=label)
            elif last := [r[key] for r in records if key in r]:
                ax.plot(range(1, len(last[-1]) + 1), last[-1], marker=".", label=label)
        if key == "loss":
            ax.set(xlabel="step", ylabel="train loss", title="training loss")
        else:
            ax.set(xlabel="block l (output of block l)", ylabel="variance", yscale="log",
                   title="residual-stream variance after each block (last monitor step)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        save_figure(fig, out / name)


def plot_answer(by_optimizer: dict[str, dict[int, dict]], path: Path) -> bool:
    """The first screen's figure: LNS − Pre-LN test loss by depth, one series per optimizer (its study's paired
    comparisons by depth, each scheme at its own rate: the plan's reading and its 95% interval), each seed grey
    beside it; False (nothing written) where no comparison has a paired seed."""
    series = {name: {L: c for L, c in cs.items() if c.get("n")} for name, cs in by_optimizer.items()}
    if not any(series.values()):
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    shift = {name: 1 + 0.04 * (i - (len(series) - 1) / 2) for i, name in enumerate(series)}  # side by side
    for (name, cs), marker in zip(series.items(), "os^D", strict=False):
        Ls = sorted(cs)
        xs = [L * shift[name] for L in Ls]
        for x, L in zip(xs, Ls, strict=True):
            ax.scatter([x] * len(cs[L]["per_seed"]), cs[L]["per_seed"], color="0.65", s=10, zorder=2)
        means = [cs[L]["mean"] for L in Ls]
        err = [[m - cs[L]["ci"][0] for m, L in zip(means, Ls, strict=True)],
               [cs[L]["ci"][1] - m for m, L in zip(means, Ls, strict=True)]]
        ax.errorbar(xs, means, yerr=err, fmt=f"{marker}-", capsize=4, zorder=3,
                    label=f"{name} ({'/'.join(str(n) for n in sorted({cs[L]['n'] for L in Ls}))} seeds)")
    ax.set(ylabel="LNS − Pre-LN test loss (nats)",
           title="LNS − Pre-LN, each at its own rate (mean, 95% interval; seeds grey)")
    _by_depth(ax, plt, sorted({L for cs in series.values() for L in cs}), 8)
    save_figure(fig, path)
    return True
