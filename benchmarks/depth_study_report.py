"""Tables, verdicts and plots of the depth study (benchmarks/depth_study.py), from OUT/runs.jsonl.

Writes OUT/results.json and OUT/*.png; `section(out)` returns the markdown that `python -m benchmarks.report`
puts at the top of docs/results.md. Every number comes from the runs; nothing here is typed by hand.

The precondition of the paper's claim 1 ("the curse of depth"): Pre-LN's deep blocks are identity-like relative
to its shallow ones. Measured on each final Pre-LN model with the quarters of `depth_study.quarters` (block 1
left out of the shallow quarter): the deep quarter's mean update ratio ||dh|| / ||h|| and its mean single-block
removal cost, each divided by the shallow quarter's. The curse is *present* when both ratios are below 1/2 for the
mean over seeds, *absent* when neither is, and *partial* otherwise. A claim about LNS fixing the curse is judged
only where it is present: "reproduces" (LNS better in every seed), "contradicted" (LNS worse in every seed),
"inconclusive" (the seeds disagree), or "not testable here" (the curse is partial or absent).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from benchmarks.depth_study import cell_key, load_runs, quarters

CURSE_THRESHOLD = 0.5


def mean_std(xs) -> dict:
    xs = [float(x) for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def fmt(d: dict, f: str = ".3f") -> str:
    if not d or d.get("mean") is None:
        return "-"
    return f"{d['mean']:{f}} ± {d['std']:{f}}" if d["n"] > 1 else f"{d['mean']:{f}}"


def part(values: list[float], which: str) -> float:
    shallow, deep = quarters(len(values))
    return statistics.fmean(values[shallow if which == "shallow" else deep])


def deep_over_shallow(values: list[float]) -> float:
    s = part(values, "shallow")
    return part(values, "deep") / s if s > 0 else math.inf


def normalised_deep_angular(r: dict) -> float:
    """The paper's reading of its angular-distance heatmaps: each model's distances relative to its own largest;
    here the deep quarter's adjacent-block distance over the model's largest adjacent-block distance."""
    return part(r["angular"], "deep") / max(r["angular"])


def cv(values: list[float]) -> float:
    m = statistics.fmean(values)
    return statistics.pstdev(values) / m if m > 0 else math.inf


def precondition(pre_runs: list[dict]) -> dict:
    upd = mean_std(deep_over_shallow(r["update_ratio"]) for r in pre_runs)
    rem = mean_std(deep_over_shallow(r["removal"]) for r in pre_runs)
    below = [d["mean"] is not None and d["mean"] < CURSE_THRESHOLD for d in (upd, rem)]
    state = "present" if all(below) else "absent" if not any(below) else "partial"
    return {"update_ratio_deep_over_shallow": upd, "removal_deep_over_shallow": rem, "curse": state}


def verdict(curse: str, diffs: list[float], better_if_negative: bool = True) -> str:
    if curse == "not run":
        return "not run"
    if curse != "present":
        return "not testable here"
    if not diffs:
        return "not run"
    good = [(d < 0) == better_if_negative for d in diffs]
    return "reproduces" if all(good) else "contradicted" if not any(good) else "inconclusive"


def seeds_at(s: dict, layers: int) -> list[int]:
    extra = s.get("ref_seeds", []) if layers == s["ref_depth"] else []
    return list(dict.fromkeys(s["seeds"] + extra))


def by_depth(runs: dict, s: dict, variant: str, layers: int, lr: float | None) -> list[dict]:
    if lr is None:
        return []
    return [r for seed in seeds_at(s, layers)
            if (r := runs.get(cell_key(layers, variant, lr, seed))) and r["status"] == "ok"]


def long_summary(out: Path, best: dict) -> dict | None:
    """The long pair (OUT/long.jsonl): final losses and lns - pre at every evaluation, so one sees whether the gap
    closes or opens as training goes on."""
    runs = load_runs(out, "long.jsonl")
    pre = next((r for r in runs.values() if r["variant"] == "pre" and r["lr"] == best["pre"]), None)
    lns = next((r for r in runs.values() if r["variant"] == "lns" and r["lr"] == best["lns"]), None)
    if not (pre and lns and pre["status"] == lns["status"] == "ok"):
        return None
    q = dict(map(tuple, lns["val_curve"]))
    curve = [(step, q[step] - v) for step, v in pre["val_curve"] if step in q]
    return {"layers": pre["layers"], "tokens": pre["tokens"], "epochs": pre["epochs"],
            "corpus_sha256": pre["corpus_sha256"], "wall_s": pre["wall_s"] + lns["wall_s"],
            "pre_val_loss": pre["val_loss"], "lns_val_loss": lns["val_loss"], "delta_curve": curve,
            "pre_update_deep_over_shallow": deep_over_shallow(pre["update_ratio"]),
            "pre_removal_deep_over_shallow": deep_over_shallow(pre["removal"]),
            "val_curves": {"pre": pre["val_curve"], "lns": lns["val_curve"]}}


def best_rates(runs: dict, s: dict) -> dict:
    from benchmarks.depth_study import best_lr

    return {v: best_lr(runs, v, s["ref_depth"], s["lrs"]) for v in ("pre", "lns", "mixln")}


def grid_summary(runs: dict, s: dict) -> dict:
    out = {}
    for v in ("pre", "lns", "mixln"):
        cells = {lr: runs.get(cell_key(s["ref_depth"], v, lr, 0)) for lr in s["lrs"]}
        out[v] = {f"{lr:g}": r["val_loss"] for lr, r in cells.items() if r}
    return out


def depth_summary(runs: dict, s: dict, best: dict, L: int) -> dict:
    pre, lns = by_depth(runs, s, "pre", L, best["pre"]), by_depth(runs, s, "lns", L, best["lns"])
    paired = {r["seed"]: r for r in pre}
    diffs = [r["val_loss"] - paired[r["seed"]]["val_loss"] for r in lns if r["seed"] in paired]
    d = {"layers": L, "seeds": sorted(paired), "pre_val_loss": mean_std(r["val_loss"] for r in pre),
         "lns_val_loss": mean_std(r["val_loss"] for r in lns), "delta_lns_minus_pre": mean_std(diffs),
         "paired_deltas": diffs, "tokens": (pre or lns or [{}])[0].get("tokens"),
         "epochs": (pre or lns or [{}])[0].get("epochs")}
    for name, rs in (("pre", pre), ("lns", lns)):
        d[name] = {"init_first": mean_std(r["init_update_ratio"][0] for r in rs),
                   "init_deep": mean_std(part(r["init_update_ratio"], "deep") for r in rs),
                   "update_deep_over_shallow": mean_std(deep_over_shallow(r["update_ratio"]) for r in rs),
                   "angular_deep": mean_std(part(r["angular"], "deep") for r in rs),
                   "angular_deep_normalised": mean_std(normalised_deep_angular(r) for r in rs),
                   "removal_deep": mean_std(part(r["removal"], "deep") for r in rs),
                   "removal_deep_over_shallow": mean_std(deep_over_shallow(r["removal"]) for r in rs),
                   "removal_cv": mean_std(cv(r["removal"]) for r in rs),
                   "removal_cv_without_block1": mean_std(cv(r["removal"][1:]) for r in rs),
                   "last_var": mean_std(r["var"][-1] for r in rs)}
    d["precondition"] = precondition(pre) if pre else {"curse": "not run"}
    d["claims"] = claims(pre, lns, d["precondition"]["curse"], diffs)
    return d


def claims(pre: list[dict], lns: list[dict], curse: str, diffs: list[float]) -> dict:
    pair = [(p, q) for p in pre for q in lns if p["seed"] == q["seed"]]
    var = [p["var"][-1] / q["var"][-1] for p, q in pair]
    ang_abs = [part(p["angular"], "deep") < 0.1 and part(q["angular"], "deep") > 2 * part(p["angular"], "deep")
               for p, q in pair]
    ang_norm = [normalised_deep_angular(q) - normalised_deep_angular(p) for p, q in pair]
    rem = [part(q["removal"], "deep") - part(p["removal"], "deep") for p, q in pair]
    even = [cv(q["removal"]) - cv(p["removal"]) for p, q in pair]
    even1 = [cv(q["removal"][1:]) - cv(p["removal"][1:]) for p, q in pair]
    yes_no = lambda ok: ("yes" if all(ok) else "no" if not any(ok) else "mixed") if ok else "not run"  # noqa: E731
    return {
        "1": {"claim": "LNS reaches a lower validation loss than Pre-LN", "verdict": verdict(curse, diffs),
              "numbers": diffs},
        "2": {"claim": "LNS has a much lower variance after the last block (pre / lns > 2)",
              "verdict": yes_no([v > 2 for v in var]), "numbers": var},
        "3a": {"claim": "deep adjacent angular distance: pre < 0.1 and lns > 2 x pre (absolute)",
               "verdict": yes_no(ang_abs), "numbers": ang_abs},
        "3b": {"claim": "deep adjacent angular distance, normalised by each model's largest: lns > pre",
               "verdict": verdict(curse, [-x for x in ang_norm]), "numbers": ang_norm},
        "4a": {"claim": "removing a deep block costs more with LNS than with Pre-LN",
               "verdict": verdict(curse, [-x for x in rem]), "numbers": rem},
        "4b": {"claim": "removal cost more even across blocks with LNS (lower CV), all blocks",
               "verdict": verdict(curse, even), "numbers": even},
        "4c": {"claim": "the same without block 1 (LNS leaves it unscaled)", "verdict": verdict(curse, even1),
               "numbers": even1},
    }


def llama_130m_init() -> dict:
    """The paper's LLaMA-130M block shape at initialisation (768 x 12, std 0.02, embedding std 0.632): the regime a
    small model should start in. The vocabulary does not change the blocks' ratios, so a small one keeps it cheap."""
    from depthlab.analysis.metrics import init_update_ratios
    from depthlab.config import ModelConfig

    cfg = ModelConfig(vocab_size=256, dim=768, n_layers=12, n_heads=12, ffn_dim=2048, norm_scheme="pre",
                      init_std=0.02, embed_std=(2 / 5) ** 0.5)
    r = init_update_ratios(cfg)
    return {"first": r[0], "deep": part(r, "deep"), "mean": statistics.fmean(r)}


def write_summary(out: Path) -> dict | None:
    if not (out / "settings.json").exists():
        return None
    s = json.loads((out / "settings.json").read_text())
    runs = load_runs(out)
    best = best_rates(runs, s)
    res = {"settings": s, "best_lr": best, "grid": grid_summary(runs, s), "llama_130m_init": llama_130m_init(),
           "depths": [depth_summary(runs, s, best, L) for L in sorted(s["depths"])],
           "mixln": {"val_loss": mean_std(r["val_loss"] for r in by_depth(runs, s, "mixln", s["ref_depth"],
                                                                           best["mixln"]))},
           "long": long_summary(out, best),
           "runs": len(runs), "train_s": sum(r["wall_s"] for r in runs.values())}
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(res, runs, out)
    print(f"wrote {out / 'results.json'}")
    return res


def plot(res: dict, runs: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = [d for d in res["depths"] if d["paired_deltas"]]
    if not depths:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for d in depths:
        a.scatter([d["layers"]] * len(d["paired_deltas"]), d["paired_deltas"], color="0.6", s=12, zorder=2)
    a.errorbar([d["layers"] for d in depths], [d["delta_lns_minus_pre"]["mean"] for d in depths],
               yerr=[d["delta_lns_minus_pre"]["std"] for d in depths], marker="o", capsize=4, zorder=3)
    a.axhline(0, color="k", lw=0.8)
    a.set(xscale="log", xlabel="blocks N", ylabel="val loss: lns - pre (nats)",
          title="LNS minus Pre-LN (each seed grey, mean ± std)")
    a.set_xticks([d["layers"] for d in depths], [str(d["layers"]) for d in depths])
    for name, style in (("pre", "o-"), ("lns", "s--")):
        for key, label in (("update_deep_over_shallow", "update ratio"), ("removal_deep_over_shallow", "removal cost")):
            ys = [d[name][key]["mean"] for d in depths]
            b.plot([d["layers"] for d in depths], ys, style, label=f"{name}: {label}")
    b.axhline(CURSE_THRESHOLD, color="r", lw=0.8, ls=":", label="curse threshold")
    b.set(xscale="log", xlabel="blocks N", ylabel="deep quarter / shallow quarter",
          title="Precondition: how identity-like the deep blocks are")
    b.set_xticks([d["layers"] for d in depths], [str(d["layers"]) for d in depths])
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "delta_and_precondition_by_depth.png", dpi=110)
    plt.close(fig)
    profiles(res, runs, out, plt)
    if res.get("long"):
        long_plot(res["long"], out, plt)


def long_plot(lg: dict, out: Path, plt) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    tokens_per_step = lg["tokens"] / lg["val_curves"]["pre"][-1][0]
    for v, style in (("pre", "o-"), ("lns", "s--")):
        xs, ys = zip(*lg["val_curves"][v], strict=True)
        a.plot([x * tokens_per_step / 1e6 for x in xs], ys, style, ms=3, label=v)
    a.set(xlabel="training tokens (M)", ylabel="validation loss", title=f"N={lg['layers']}, long pair", ylim=(None,
          max(lg["pre_val_loss"], lg["lns_val_loss"]) + 1.0))
    a.legend()
    xs, ys = zip(*lg["delta_curve"], strict=True)
    b.plot([x * tokens_per_step / 1e6 for x in xs], ys, "o-", ms=3)
    b.axhline(0, color="k", lw=0.8)
    b.set(xlabel="training tokens (M)", ylabel="lns - pre (nats)", title="the gap as training goes on")
    fig.tight_layout()
    fig.savefig(out / "long_pair.png", dpi=110)
    plt.close(fig)


def profiles(res: dict, runs: dict, out: Path, plt) -> None:
    """Per-block update ratio, removal cost and angular distance of seed 0's final models, by relative depth."""
    s, best = res["settings"], res["best_lr"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for L in s["depths"]:
        for v, style in (("pre", "-"), ("lns", "--")):
            r = runs.get(cell_key(L, v, best[v], 0)) if best[v] else None
            if not r or r["status"] != "ok":
                continue
            x = [(i + 1) / L for i in range(L)]
            for ax, key in zip(axes, ("update_ratio", "removal", "angular"), strict=True):
                ax.plot(x, r[key], style, label=f"{v} N={L}")
    for ax, title in zip(axes, ("update ratio ||dh|| / ||h||", "loss increase when the block is removed",
                                "angular distance, block input vs output"), strict=True):
        ax.set(xlabel="block l / N", title=title)
    axes[1].set_yscale("symlog", linthresh=1e-3)
    axes[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "profiles_by_depth.png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------- markdown
def section(out: Path, img_prefix: str) -> list[str]:
    """The depth study's part of docs/results.md: headline, precondition, Δloss by depth, grid, verdicts."""
    if not (out / "results.json").exists():
        return ["Not run yet (`make study`).", ""]
    res = json.loads((out / "results.json").read_text())
    s, best = res["settings"], res["best_lr"]
    lines = ["Commands: `make study` (all parts; `make study-grid`, `study-sweep`, `study-mixln` one part each), "
             f"which runs `{s['command']}`; `python -m benchmarks.depth_study summarize` rebuilds the tables.", "",
             f"Setup: width {s['dim']} ({s['heads']} heads, FFN {s['ffn']}), depths {s['depths']}, reference depth "
             f"{s['ref_depth']}, init std `{s['init_std']}` (width-matched: {(2 / (5 * s['dim'])) ** 0.5:.3f}), "
             f"embedding std {s['embed_std']:.3f}, {s['steps']} steps of {s['batch']} x {s['seq']} tokens = "
             f"{s['steps'] * s['batch'] * s['seq'] / 1e6:.2f}M tokens per run, warmup 10%, cosine to 10%, fp32. "
             f"Data: {s['corpus']['source']}, {s['corpus']['train_tokens']:,} training tokens "
             f"(so {s['steps'] * s['batch'] * s['seq'] / s['corpus']['train_tokens']:.2f} epochs), BPE vocabulary "
             f"{s['vocab']}, sha256 of the token streams `{s['corpus_sha256'][:16]}…`. Validation: the first "
             f"{s['val_tokens']:,} held-out tokens; probes on {s['probe_seqs']} held-out windows with "
             f"`depthlab.analysis.study.analyze`. {res['runs']} runs, "
             f"{res['train_s'] / 3600:.1f} h of one-thread training.", ""]
    lines += ["Learning-rate grid at the reference depth (seed 0, validation loss; **bold** = the rate used for that "
              "scheme everywhere else; the last row is the same-rate comparison):", "",
              "| scheme | " + " | ".join(f"lr {lr:g}" for lr in s["lrs"]) + " |", "|---|" + "---|" * len(s["lrs"])]
    for v, g in res["grid"].items():
        if g:
            cells = [(f"**{g[f'{lr:g}']:.4f}**" if best[v] == lr else f"{g[f'{lr:g}']:.4f}") if f"{lr:g}" in g
                     else "-" for lr in s["lrs"]]
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
    pre, lns = res["grid"]["pre"], res["grid"]["lns"]
    lines.append("| lns − pre | " + " | ".join(f"{lns[k] - pre[k]:+.4f}" if k in pre and k in lns else "-"
                                               for k in (f"{lr:g}" for lr in s["lrs"])) + " |")
    edge = [f"{v} ({best[v]:g})" for v in ("pre", "lns", "mixln") if best[v] in (min(s["lrs"]), max(s["lrs"]))]
    if edge:
        lines += ["", f"Best rate at the edge of the grid for {', '.join(edge)}: its optimum may lie beyond the grid."]
    ref = res["llama_130m_init"]
    lines += ["", "Each depth, each scheme at its best rate (mean ± std over seeds; Δ paired seed by seed; the "
              "precondition columns are deep-quarter / shallow-quarter ratios of the final Pre-LN model, "
              f"< {CURSE_THRESHOLD} = identity-like deep blocks). Update ratio at initialisation for comparison: "
              f"LLaMA-130M (768 x 12, std 0.02) {ref['first']:.2f} first block / {ref['deep']:.2f} deep quarter.", "",
              "| N | seeds | pre val loss | lns val loss | Δ lns − pre | init update ratio pre: first / deep "
              "(lns deep) | pre update deep/shallow | pre removal deep/shallow | curse | claim 1 |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for d in res["depths"]:
        if not d["seeds"]:
            lines.append(f"| {d['layers']} | not run | | | | | | | | |")
            continue
        p, q = d["pre"], d["lns"]
        lines.append(f"| {d['layers']} | {len(d['seeds'])} | {fmt(d['pre_val_loss'], '.4f')} | "
                     f"{fmt(d['lns_val_loss'], '.4f')} | {fmt(d['delta_lns_minus_pre'], '+.4f')} | "
                     f"{fmt(p['init_first'], '.2f')} / {fmt(p['init_deep'], '.2f')} ({fmt(q['init_deep'], '.3f')}) | "
                     f"{fmt(p['update_deep_over_shallow'], '.2f')} | {fmt(p['removal_deep_over_shallow'], '.2f')} | "
                     f"{d['precondition']['curse']} | {d['claims']['1']['verdict']} |")
    lines += ["", f"![Δ loss and precondition by depth](img/{img_prefix}delta_and_precondition_by_depth.png)", "",
              f"![per-block profiles](img/{img_prefix}profiles_by_depth.png)", "", "Every claim at every depth:", "",
              "| N | claim | verdict | per-seed numbers |", "|---|---|---|---|"]
    for d in res["depths"]:
        for c in d["claims"].values():
            nums = ", ".join(f"{x:+.3g}" if isinstance(x, float) else str(x) for x in c["numbers"])
            lines.append(f"| {d['layers']} | {c['claim']} | {c['verdict']} | {nums} |")
    return lines + [""] + long_section(res.get("long"), s, img_prefix)


def long_section(lg: dict | None, s: dict, img_prefix: str) -> list[str]:
    if not lg:
        return ["The long pair (`make study-long`: pre and lns at the reference depth and best rates, seed 0, "
                f"{s.get('long_tokens', 15.1e6) / 1e6:.1f}M tokens) has not finished.", ""]
    at = [lg["delta_curve"][i] for i in sorted({0, len(lg["delta_curve"]) // 4, len(lg["delta_curve"]) // 2,
                                                  len(lg["delta_curve"]) - 1})]
    return [f"The long pair (`make study-long`): N={lg['layers']}, seed 0, {lg['tokens'] / 1e6:.1f}M tokens "
            f"({lg['epochs']:.2f} epochs of a {s.get('long_corpus_mb', 64):g} MB built-in corpus, sha256 "
            f"`{lg['corpus_sha256'][:16]}…`), {lg['wall_s'] / 3600:.1f} h of one-thread training. Final validation "
            f"loss pre {lg['pre_val_loss']:.4f}, lns {lg['lns_val_loss']:.4f} "
            f"(Δ {lg['lns_val_loss'] - lg['pre_val_loss']:+.4f}); lns − pre at step "
            + ", ".join(f"{st}: {d:+.4f}" for st, d in at)
            + f". Pre-LN's final deep/shallow update ratio {lg['pre_update_deep_over_shallow']:.2f}, removal cost "
            f"{lg['pre_removal_deep_over_shallow']:.2f}. One seed: the direction of the curve, not its size, is "
            "the finding.", "", f"![long pair](img/{img_prefix}long_pair.png)", ""]


def headline(out: Path) -> list[str]:
    """What this scale can and cannot say, in a few sentences computed from the study's results."""
    if not (out / "results.json").exists():
        return ["The depth study (section 1) has not been run yet: this page cannot yet say whether LNS helps."]
    res = json.loads((out / "results.json").read_text())
    s = res["settings"]
    done = [d for d in res["depths"] if d["seeds"]]
    tokens = s["steps"] * s["batch"] * s["seq"] / 1e6
    lines = [f"**What this scale can say.** Width {s['dim']}, depths {', '.join(str(d['layers']) for d in done)}, "
             f"{tokens:.1f}M tokens per run, each scheme at its own best learning rate, width-matched init "
             f"(blocks start in the paper's regime). Per depth: "]
    parts = []
    for d in done:
        delta = d["delta_lns_minus_pre"]
        parts.append(f"N={d['layers']}: curse {d['precondition']['curse']} (Pre-LN deep/shallow update ratio "
                     f"{fmt(d['pre']['update_deep_over_shallow'], '.2f')}, removal cost "
                     f"{fmt(d['pre']['removal_deep_over_shallow'], '.2f')}), LNS − Pre-LN "
                     f"{fmt(delta, '+.3f')} nats over {delta['n']} seed(s): claim 1 {d['claims']['1']['verdict']}")
    lines[0] += "; ".join(parts) + "."
    present = [d for d in done if d["precondition"]["curse"] == "present"]
    if not present:
        lines.append("In no configuration run here did Pre-LN's deep blocks become identity-like by the criterion "
                     "below, so the paper's central claim (LNS helps *because* it lifts the curse) is **not testable "
                     "at this scale and budget**: a difference in loss here says nothing about that mechanism.")
    deltas = [x for d in done for x in d["paired_deltas"]]
    if deltas:
        lines.append(f"Apart from the mechanism, the outcome: LNS's validation loss was lower than Pre-LN's in "
                     f"{sum(x < 0 for x in deltas)} of {len(deltas)} paired runs (same seed, same data order), by "
                     f"{-max(deltas):.3f} to {-min(deltas):.3f} nats; with {max(len(d['seeds']) for d in done)} or "
                     "fewer seeds per depth this is a consistent sign, not a measured effect size.")
    missing = [L for L in s["depths"] if L not in {d["layers"] for d in done}]
    one_seed = [d["layers"] for d in done if len(d["seeds"]) < 2]
    lines.append("**What it cannot say.** Nothing about the paper's model sizes (71M-1B), its data (C4) or its "
                 f"budgets (billions of tokens); every run here saw {tokens:.1f}M tokens. "
                 + (f"Depths {missing} were not run. " if missing else "")
                 + (f"Depths {one_seed} have one seed only, so no spread. " if one_seed else "")
                 + ("`make study-sweep` continues the study where it stopped. " if missing or one_seed else "")
                 + ("" if res.get("long") else "The long pair (≥ 15M tokens at the reference depth), which would "
                    "show whether a gap opens or closes with training, has not finished."))
    return lines + [""]
