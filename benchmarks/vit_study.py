"""The paper's ViT row at CPU scale: does LNS on the branch outputs beat Pre-LN, and LNS after the norm lose?

    python -m benchmarks.vit_study run          # the grid, then the other seeds at each variant's best rate
    python -m benchmarks.vit_study summarize    # results.json and the plot from what has finished

The paper (ViT-S, ImageNet, no LayerScale) reports top-1 67.91 for Pre-LN, 68.75 with LNS after the attention and
MLP outputs (`model.lns_placement=branch`) and 66.43 with LNS after the LayerNorm, as for LLMs (`norm`). Here:
the `vit-digits` preset (a deep-thin 12 x 64 ViT, patch 2, on scikit-learn's 1,797 real 8 x 8 handwritten digits,
1 in 5 held out), each variant trained at every rate of --lrs with seed 0, then at its best rate (lowest validation
loss) with every seed of --seeds. Same data, same order and same init draw per seed across variants, so
differences are paired seed by seed. Each finished run is appended to OUT/runs.jsonl at once; `run` continues
where an interrupted study stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

from benchmarks.depth_study_report import mean_std

OUT = Path(__file__).parent / "results" / "vit_study"
VARIANTS = {"pre": ["model.norm_scheme=pre"],
            "lns-norm": ["model.norm_scheme=lns", "model.lns_placement=norm"],
            "lns-branch": ["model.norm_scheme=lns", "model.lns_placement=branch"]}
PAPER = {"pre": 67.91, "lns-norm": 66.43, "lns-branch": 68.75}  # ViT-S top-1 on ImageNet, the paper's table


def key(variant: str, lr: float, seed: int) -> str:
    return f"{variant}-lr{lr:g}-seed{seed}"


def run_cell(s: dict, variant: str, lr: float, seed: int) -> dict:
    import torch

    from depthlab.config import apply_overrides, preset
    from depthlab.train.trainer import train

    torch.set_num_threads(1)
    cfg = apply_overrides(preset("vit-digits"), [*VARIANTS[variant], f"train.lr={lr}", f"train.seed={seed}",
                                                 f"train.max_steps={s['steps']}", f"train.batch_size={s['batch']}",
                                                 f"train.warmup_steps={s['steps'] // 10}",
                                                 f"train.eval_every={s['steps'] // 4}",
                                                 f"train.monitor_every={s['steps'] // 4}", "train.threads=1"])
    t0 = time.time()
    res = train(cfg, run_dir=Path(s["runs_dir"]) / key(variant, lr, seed), progress=False, overwrite=True)
    rows = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val_acc" in r]
    return {"variant": variant, "lr": lr, "seed": seed, "val_loss": res.val_loss, "val_acc": res.val["val_acc"],
            "val_images": res.val["val_images"], "wall_s": time.time() - t0, "steps": s["steps"],
            "images_seen": s["steps"] * s["batch"], "curve": [(r["step"], r["val_loss"], r["val_acc"]) for r in evals],
            "update_ratio": evals[-1].get("depth/update_ratio")}


def load_runs(out: Path) -> dict[str, dict]:
    path = out / "runs.jsonl"
    runs = [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []
    return {key(r["variant"], r["lr"], r["seed"]): r for r in runs}


def best_lr(runs: dict, variant: str, lrs: list[float]) -> float | None:
    grid = [runs.get(key(variant, lr, 0)) for lr in lrs]
    return min(grid, key=lambda r: r["val_loss"])["lr"] if all(grid) else None


def todo(s: dict, runs: dict) -> list[tuple]:
    cells = [(v, lr, 0) for v in VARIANTS for lr in s["lrs"]]
    for v in VARIANTS:
        if (b := best_lr(runs, v, s["lrs"])) is not None:
            cells += [(v, b, seed) for seed in s["seeds"]]
    return [c for c in dict.fromkeys(cells) if key(*c) not in runs]


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = {"lrs": args.lrs, "seeds": args.seeds, "steps": args.steps, "batch": args.batch,
         "runs_dir": args.runs_dir or str(out / "runs")}
    saved = {k: v for k, v in s.items() if k != "runs_dir"}  # where files go is not a setting
    argv = [a for i, a in enumerate(args.argv) if not (a in ("--out", "--runs-dir") or
                                                       (i and args.argv[i - 1] in ("--out", "--runs-dir")))]
    saved["command"] = " ".join(["python -m benchmarks.vit_study", *argv])
    (out / "settings.json").write_text(json.dumps(saved, indent=2) + "\n")
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        for _ in range(2):  # the seeds are known once the grid has finished
            cells = todo(s, load_runs(out))
            futures = {pool.submit(run_cell, s, *c): c for c in cells}
            for f in as_completed(futures):
                rec = f.result()
                with open(out / "runs.jsonl", "a") as fh:
                    fh.write(json.dumps(rec) + "\n")
                print(f"  {key(*futures[f])}: acc {rec['val_acc']:.4f} loss {rec['val_loss']:.4f} "
                      f"({rec['wall_s']:.0f} s)", file=sys.stderr)
    summarize(args)


# ---------------------------------------------------------------------------------------------------- summary
def verdict(diffs: list[float], want_positive: bool) -> str:
    """Paired accuracy differences (variant - pre): every seed in the paper's direction, every seed against it,
    or the seeds disagree (a one-seed result is called inconclusive)."""
    if len(diffs) < 2:
        return "inconclusive (fewer than 2 seeds)"
    signs = [d > 0 if want_positive else d < 0 for d in diffs]
    return "reproduces" if all(signs) else "contradicted" if not any(signs) and all(diffs) else "inconclusive"


def summarize(args) -> dict | None:
    out = Path(args.out)
    if not (out / "settings.json").exists():
        return None
    s, runs = json.loads((out / "settings.json").read_text()), load_runs(out)
    best = {v: best_lr(runs, v, s["lrs"]) for v in VARIANTS}
    at_best = {v: {r["seed"]: r for r in runs.values() if r["variant"] == v and r["lr"] == best[v]} for v in VARIANTS}
    res = {"settings": s, "best_lr": best, "paper": PAPER,
           "grid": {v: {f"{lr:g}": runs[key(v, lr, 0)]["val_acc"] for lr in s["lrs"] if key(v, lr, 0) in runs}
                    for v in VARIANTS},
           "variants": {v: {"seeds": sorted(at_best[v]), "acc": mean_std([r["val_acc"] for r in at_best[v].values()]),
                            "loss": mean_std([r["val_loss"] for r in at_best[v].values()]),
                            "wall_s": mean_std([r["wall_s"] for r in at_best[v].values()])} for v in VARIANTS},
           "runs": len(runs), "train_s": sum(r["wall_s"] for r in runs.values())}
    for v, want_positive in (("lns-branch", True), ("lns-norm", False)):
        diffs = [at_best[v][k]["val_acc"] - r["val_acc"] for k, r in at_best["pre"].items() if k in at_best[v]]
        res[f"{v}_minus_pre"] = {"paired": diffs, "acc": mean_std(diffs), "paper": PAPER[v] - PAPER["pre"],
                                 "verdict": verdict(diffs, want_positive)}
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(res, runs, out)
    print(f"wrote {out / 'results.json'}")
    return res


def plot(res: dict, runs: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    for v, style in zip(VARIANTS, ("o-", "s--", "^:"), strict=True):
        g = res["grid"][v]
        if g:
            a.plot([float(x) for x in g], list(g.values()), style, label=v)
        r = runs.get(key(v, res["best_lr"][v], 0)) if res["best_lr"][v] else None
        if r and r.get("update_ratio"):
            b.plot(range(1, len(r["update_ratio"]) + 1), r["update_ratio"], style, label=v)
    a.set(xscale="log", xlabel="learning rate", ylabel="top-1 validation accuracy (seed 0)", title="rate grid")
    b.set(xlabel="block", ylabel="||dh|| / ||h|| at the end (seed 0)", title="per-block update ratio")
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "vit_study.png", dpi=110)
    plt.close(fig)


def section(out: Path, img: str) -> list[str]:
    """docs/results.md's ViT section, from OUT/results.json."""
    if not (out / "results.json").exists():
        return ["Not run yet (`make study-vit`).", ""]
    res = json.loads((out / "results.json").read_text())
    s = res["settings"]
    lines = [f"Command: `make study-vit` (`{s['command']}`). The `vit-digits` preset: a 12 x 64 ViT (patch 2, class "
             f"token, learned positions, GELU MLP 256, LayerNorm), scikit-learn's 1,797 real 8 x 8 handwritten digits "
             f"(1,438 train / 359 validation), {s['steps']} steps of {s['batch']} images, AdamW, weight decay 0.05, "
             f"warmup 10%, cosine, fp32, one thread per run. Rates {', '.join(f'{x:g}' for x in s['lrs'])} with seed "
             f"0; each variant's best rate (lowest validation loss) then with seeds {s['seeds']}. {res['runs']} runs, "
             f"{res['train_s'] / 60:.0f} min of one-thread training.", "",
             "| variant | best lr | top-1 accuracy (mean ± std) | seeds | val loss | wall s per run | paper ViT-S |",
             "|---|---|---|---|---|---|---|"]
    for v, d in res["variants"].items():
        acc, loss, wall = d["acc"], d["loss"], d["wall_s"]
        cell = "-" if acc["mean"] is None else f"{acc['mean']:.4f} ± {acc['std']:.4f}"
        lines.append(f"| {v} | {res['best_lr'][v] or '-'} | {cell} | {acc['n']} | "
                     f"{'-' if loss['mean'] is None else format(loss['mean'], '.4f')} | "
                     f"{'-' if wall['mean'] is None else format(wall['mean'], '.0f')} | {res['paper'][v]} |")
    lines += ["", "| claim (paper) | paired accuracy difference per seed | mean | paper | verdict |",
              "|---|---|---|---|---|"]
    for v, claim in (("lns-branch", "LNS on the branch outputs beats Pre-LN"),
                     ("lns-norm", "LNS after the norm (the LLM placement) loses to Pre-LN")):
        d = res[f"{v}_minus_pre"]
        mean = "-" if d["acc"]["mean"] is None else f"{d['acc']['mean']:+.4f}"
        lines.append(f"| {claim} | {', '.join(f'{x:+.4f}' for x in d['paired']) or '-'} | {mean} | "
                     f"{d['paper'] / 100:+.4f} | {d['verdict']} |")
    return lines + ["", f"![ViT study]({img})", ""]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vit_study", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train what is missing, then summarise")
    r.add_argument("--lrs", nargs="+", type=float, default=[5e-4, 1e-3, 2e-3, 4e-3], help="the grid, spaced x2")
    r.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    r.add_argument("--steps", type=int, default=600)
    r.add_argument("--batch", type=int, default=64)
    r.add_argument("--jobs", type=int, default=2, help="worker processes (one thread each)")
    r.add_argument("--out", default=str(OUT))
    r.add_argument("--runs-dir", help="where run directories go (default OUT/runs, git-ignored)")
    sm = sub.add_parser("summarize")
    sm.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    (run if args.cmd == "run" else summarize)(args)


if __name__ == "__main__":
    main()
