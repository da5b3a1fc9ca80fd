"""The paper's claims, checked at CPU scale with several seeds on a deep-thin model.

    python -m benchmarks.reproduce run --data shakespeare --variants pre lns --seeds 0 1 2 --jobs 2
    python -m benchmarks.reproduce summarize            # tables, verdicts and plots from what has finished

`run` trains every (variant, seed) pair (in --jobs worker processes, one thread each) and appends each finished
run to OUT/runs.jsonl at once, so an interrupted reproduction keeps what it finished; then it summarises.
A variant is a scheme name, optionally with `+INIT` (e.g. `+scaled`, the scaled init) and/or `+gpas`.
After training, each model is probed on a fixed validation sample: the residual stream's variance after every
block (claim 2), the angular distance between each block's input and output, arccos(cos)/pi averaged over tokens
(claim 3), and the validation loss with each single block removed (claim 4). `summarize` writes
OUT/results.json (mean +- std over seeds per dataset and variant, the verdict of each claim with the criterion
used) and the plots in OUT/. One OUT holds one set of settings (steps, lr, model, ...); other settings need
another --out.

Claims (docs/method.md section 3): 1 lns reaches lower validation perplexity than pre; 2 much lower variance at the
deepest layers with lns; 3 adjacent deep layers' angular distance near 0 with pre, clearly above with lns;
4 removing a deep layer costs little with pre, the cost spread more evenly with lns; 5 post, deepnorm and mixln
less stable at depth under the same learning rate; 6 lns + scaled init worse than lns alone.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

# The Shakespeare text sits beside the repository in shared/ (see tests/); other machines pass --data builtin.
SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "shakespeare"
DATASETS = {"shakespeare": [str(SHAKESPEARE)], "builtin": []}
OUT = Path(__file__).parent / "results" / "reproduce"


# ---------------------------------------------------------------------------------------------------- training
def make_config(args: dict, variant: str, seed: int, run_dir: Path):
    from depthlab.config import Config, DataConfig, ModelConfig, TrainConfig
    from depthlab.model.validate import validate

    scheme, *mods = variant.split("+")
    inits = [m for m in mods if m != "gpas"]
    model = ModelConfig(vocab_size=args["vocab"], dim=args["dim"], n_layers=args["layers"], n_heads=args["heads"],
                        ffn_dim=args["ffn"], max_seq_len=args["seq"], norm_scheme=scheme,
                        init=inits[0] if inits else "auto", gpas="gpas" in mods, embed_std=args["embed_std"])
    data = DataConfig(paths=DATASETS[args["data"]], seq_len=args["seq"], builtin_mb=args["builtin_mb"])
    train = TrainConfig(out_dir=str(run_dir.parent), seed=seed, max_steps=args["steps"], batch_size=args["batch"],
                        lr=args["lr"], warmup_steps=max(1, args["steps"] // 10), eval_every=args["eval_every"],
                        log_every=10, monitor_every=args["eval_every"], threads=1, device="cpu")
    return validate(Config(model, data, train, preset=f"reproduce-{args['data']}"))


@functools.cache
def token_data(args_json: str):
    """Tokenizer and token streams, built once per worker process (they depend on the data and vocab only)."""
    from depthlab.data.dataset import build_token_data

    args = json.loads(args_json)
    data = build_token_data(make_config(args, "pre", 0, Path("/tmp/unused/x")))
    # The trainer evaluates on the whole validation stream; its head is plenty here and keeps evals cheap.
    data.val = data.val[:args["val_tokens"]]
    return data


def run_one(args: dict, variant: str, seed: int) -> dict:
    """Train one (variant, seed), probe the final model; a record for runs.jsonl."""
    import warnings

    from depthlab.train.checkpoint import load_checkpoint
    from depthlab.train.trainer import TrainingDiverged, train

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="lns with scaled init")
    run_dir = Path(args["runs_dir"]) / args["data"] / f"{variant}-seed{seed}"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    cfg = make_config(args, variant, seed, run_dir)
    data = token_data(json.dumps(args, sort_keys=True))
    t0 = time.time()
    record = {"data": args["data"], "variant": variant, "seed": seed}
    try:
        result = train(cfg, run_dir=run_dir, data=data, progress=False)
        record.update(status="ok", val_loss=result.val_loss, val_ppl=result.val_ppl)
    except TrainingDiverged as e:
        record.update(status="diverged", error=str(e), val_loss=math.inf, val_ppl=math.inf)
    record["wall_s"] = time.time() - t0
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    record["loss_curve"] = [(r["step"], r["loss"]) for r in metrics if "loss" in r]
    record["val_curve"] = [(r["step"], r["val_loss"]) for r in metrics if "val_loss" in r]
    record["grad_norm_max"] = max((r["grad_norm"] for r in metrics if "grad_norm" in r), default=None)
    record["monitor_var"] = [(r["step"], r["depth/var"]) for r in metrics if "depth/var" in r]
    record["monitor_update_ratio"] = [(r["step"], r["depth/update_ratio"]) for r in metrics
                                      if "depth/update_ratio" in r]
    if record["status"] == "ok":
        model, _, _ = load_checkpoint(result.checkpoint)
        record.update(probe(model, data.val, args["seq"], args["probe_batches"]))
    return record


# ---------------------------------------------------------------------------------------------------- probes
def probe(model, val_tokens: np.ndarray, seq_len: int, n_batches: int) -> dict:
    """Per block l = 1..N, from the library's analysis (`benchmarks.depth_study.probe`): the variance of the stream
    after it, the angular distance between its input and output, and the validation-loss increase when it alone
    is removed (the other blocks keep their LNS scales)."""
    from benchmarks.depth_study import probe as library_probe

    p = library_probe(model, val_tokens, seq_len, n_batches * 16)
    return {"probe_loss": p["probe_loss"], "var_by_layer": p["var"], "angular_by_layer": p["angular"],
            "removal_cost_by_layer": p["removal"]}


# ---------------------------------------------------------------------------------------------------- summary
def mean_std(xs) -> dict:
    xs = [float(x) for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def deep(values: list[float], frac: float = 0.25) -> float:
    """Mean over the deepest `frac` of the blocks."""
    k = max(1, round(len(values) * frac))
    return statistics.fmean(values[-k:])


def cv(values: list[float]) -> float:
    """Coefficient of variation across blocks: 0 = the cost is spread perfectly evenly."""
    m = statistics.fmean(values)
    return statistics.pstdev(values) / m if m > 0 else math.inf


def load_runs(out: Path) -> list[dict]:
    path = out / "runs.jsonl"
    if not path.exists():
        return []
    latest = {}
    for line in path.read_text().splitlines():
        if line:
            r = json.loads(line)
            latest[(r["data"], r["variant"], r["seed"])] = r  # a re-run replaces an older record
    return list(latest.values())


def group_summary(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["status"] == "ok"]
    s = {"seeds": sorted(r["seed"] for r in runs), "diverged": sum(r["status"] != "ok" for r in runs),
         "val_ppl": mean_std(r["val_ppl"] for r in runs), "val_loss": mean_std(r["val_loss"] for r in runs),
         "grad_norm_max": mean_std(r["grad_norm_max"] for r in runs), "wall_s": mean_std(r["wall_s"] for r in runs)}
    if ok:
        steps = [st for st, _ in ok[0]["val_curve"]]
        s["val_loss_by_step"] = {str(st): mean_std(dict(r["val_curve"]).get(st) for r in ok) for st in steps}
        s["last_layer_var"] = mean_std(r["var_by_layer"][-1] for r in ok)
        s["deep_quarter_var"] = mean_std(deep(r["var_by_layer"]) for r in ok)
        s["deep_quarter_angular"] = mean_std(deep(r["angular_by_layer"]) for r in ok)
        s["deep_quarter_removal_cost"] = mean_std(deep(r["removal_cost_by_layer"]) for r in ok)
        s["removal_cost_cv"] = mean_std(cv(r["removal_cost_by_layer"]) for r in ok)
    return s


def paired(runs: dict, a: str, b: str, key) -> list[float]:
    """key(run of a) - key(run of b), per seed both finished."""
    seeds = sorted(set(runs.get(a, {})) & set(runs.get(b, {})))
    return [key(runs[a][s]) - key(runs[b][s]) for s in seeds]


def verdicts(runs: dict) -> dict:
    """Each claim: the criterion, the per-seed numbers, and whether it reproduces. runs[variant][seed] = record."""
    out = {}
    ok = lambda v: {s: r for s, r in runs.get(v, {}).items() if r["status"] == "ok"}  # noqa: E731
    pre, lns = ok("pre"), ok("lns")
    if pre and lns:
        d = paired({"a": lns, "b": pre}, "a", "b", lambda r: r["val_ppl"])
        out["1_lns_lower_ppl"] = {
            "criterion": "val ppl(lns) - val ppl(pre) < 0 for every seed (same seed = same init draw and data order)",
            "paired_diff": d, "diff": mean_std(d), "reproduces": bool(d) and all(x < 0 for x in d)}
        r2 = paired({"a": pre, "b": lns}, "a", "b", lambda r: math.log(r["var_by_layer"][-1]))
        ratios = [math.exp(x) for x in r2]
        out["2_lns_lower_deep_variance"] = {
            "criterion": "variance after the last block, pre / lns > 2 for every seed", "ratio_pre_over_lns": ratios,
            "ratio": mean_std(ratios), "reproduces": bool(ratios) and all(x > 2 for x in ratios)}
        a_pre = [deep(r["angular_by_layer"]) for r in pre.values()]
        a_lns = [deep(r["angular_by_layer"]) for r in lns.values()]
        d3 = paired({"a": lns, "b": pre}, "a", "b", lambda r: deep(r["angular_by_layer"]))
        out["3_angular_distance"] = {
            "criterion": "deepest-quarter mean angular distance (arccos/pi): pre < 0.1 and lns > 2 x pre, every seed",
            "pre": mean_std(a_pre), "lns": mean_std(a_lns), "paired_diff_lns_minus_pre": d3,
            "reproduces": all(x < 0.1 for x in a_pre) and all(deep(lns[s]["angular_by_layer"]) >
                                                              2 * deep(pre[s]["angular_by_layer"])
                                                              for s in set(pre) & set(lns))}
        shared = sorted(set(pre) & set(lns))
        out["4_layer_removal"] = {
            "criterion": "removing a deepest-quarter block costs more with lns than with pre, and the cost across "
                         "blocks is more even with lns (lower coefficient of variation), every seed",
            "pre_deep_cost": mean_std(deep(pre[s]["removal_cost_by_layer"]) for s in shared),
            "lns_deep_cost": mean_std(deep(lns[s]["removal_cost_by_layer"]) for s in shared),
            "pre_cv": mean_std(cv(pre[s]["removal_cost_by_layer"]) for s in shared),
            "lns_cv": mean_std(cv(lns[s]["removal_cost_by_layer"]) for s in shared),
            "reproduces": bool(shared) and all(
                deep(lns[s]["removal_cost_by_layer"]) > deep(pre[s]["removal_cost_by_layer"]) and
                cv(lns[s]["removal_cost_by_layer"]) < cv(pre[s]["removal_cost_by_layer"]) for s in shared)}
    if pre:
        for v in ("post", "deepnorm", "mixln"):
            if v not in runs:
                continue
            d = paired({"a": runs[v], "b": pre}, "a", "b", lambda r: r["val_ppl"])
            out[f"5_{v}_less_stable"] = {
                "criterion": f"{v} diverges or ends with a higher val ppl than pre, every seed",
                "diverged": sum(r["status"] != "ok" for r in runs[v].values()), "paired_diff": d,
                "diff": mean_std(d), "reproduces": bool(d) and all(x > 0 for x in d)}
    if lns and "lns+scaled" in runs:
        d = paired({"a": runs["lns+scaled"], "b": lns}, "a", "b", lambda r: r["val_ppl"])
        out["6_lns_scaled_worse"] = {"criterion": "val ppl(lns+scaled) - val ppl(lns) > 0 for every seed",
                                     "paired_diff": d, "diff": mean_std(d),
                                     "reproduces": bool(d) and all(x > 0 for x in d)}
    return out


def summarize(out: Path, settings: dict | None = None, plots: bool = True) -> dict:
    runs = load_runs(out)
    by: dict = {}
    for r in runs:
        by.setdefault(r["data"], {}).setdefault(r["variant"], {})[r["seed"]] = r
    previous = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    result = {"benchmark": "reproduce", "settings": settings or previous.get("settings"), "datasets": {}}
    for data, variants in by.items():
        groups = {v: group_summary(list(s.values())) for v, s in variants.items()}
        for v, g in groups.items():  # claim 1 for every scheme: paired against pre, seed by seed
            if "pre" in variants and v != "pre":
                g["ppl_minus_pre"] = mean_std(paired(variants, v, "pre", lambda r: r["val_ppl"]))
        result["datasets"][data] = {"variants": groups, "claims": verdicts(variants)}
        if plots:
            plot_dataset(out, data, variants)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def plot_dataset(out: Path, data: str, variants: dict) -> None:
    from benchmarks.plots import plot_by_depth, plot_curves

    curves = {v: [[{"step": st, "loss": x} for st, x in r["loss_curve"]] for r in s.values()]
              for v, s in variants.items()}
    plot_curves(curves, "loss", out / f"{data}_train_loss.png", f"training loss, {data}", "train loss")
    vcurves = {v: [[{"step": st, "val_loss": x} for st, x in r["val_curve"]] for r in s.values() if r["status"] == "ok"]
               for v, s in variants.items()}
    plot_curves({v: c for v, c in vcurves.items() if c}, "val_loss", out / f"{data}_val_loss.png",
                f"validation loss, {data}", "val loss")
    ok = {v: [r for r in s.values() if r["status"] == "ok"] for v, s in variants.items()}
    last_var = {v: [[{"step": st, "last_var": var[-1]} for st, var in r["monitor_var"]] for r in rs]
                for v, rs in ok.items()}
    plot_curves({v: c for v, c in last_var.items() if c and all(c)}, "last_var", out / f"{data}_last_var_by_step.png",
                f"last block's variance in training (depth monitor), {data}", "variance")
    plot_by_depth({v: [r["var_by_layer"] for r in rs] for v, rs in ok.items()}, out / f"{data}_var_by_depth.png",
                  f"variance of the stream after each block (final model), {data}", "variance")
    plot_by_depth({v: [r["monitor_var"][-1][1] for r in rs if r["monitor_var"]] for v, rs in ok.items()},
                  out / f"{data}_monitor_var_by_depth.png",
                  f"depth monitor: variance after each block (last monitor step), {data}", "variance")
    plot_by_depth({v: [r["angular_by_layer"] for r in rs] for v, rs in ok.items()},
                  out / f"{data}_angular_by_depth.png", f"angular distance, block input vs output, {data}",
                  "arccos(cos) / pi", log=False)
    plot_by_depth({v: [r["removal_cost_by_layer"] for r in rs] for v, rs in ok.items()},
                  out / f"{data}_removal_by_depth.png", f"val loss increase when one block is removed, {data}",
                  "delta val loss", log=False)


def print_table(result: dict) -> None:
    for data, d in result["datasets"].items():
        print(f"== {data}")
        for v, s in d["variants"].items():
            p = s["val_ppl"]
            ppl = f"{p['mean']:.2f} +- {p['std']:.2f}" if p["mean"] is not None else "-"
            print(f"  {v:12s} seeds {s['seeds']} diverged {s['diverged']}  val ppl {ppl}")
        for name, c in d["claims"].items():
            print(f"  claim {name}: {'REPRODUCES' if c['reproduces'] else 'does not reproduce'}")


# ---------------------------------------------------------------------------------------------------- CLI
def finished_runs(args: dict, jobs: list[tuple[str, int]], workers: int):
    """Records of the (variant, seed) jobs as they finish: in this process, or in `workers` spawned ones."""
    if workers <= 1:
        for v, s in jobs:
            yield run_one(args, v, s)
        return
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        for f in as_completed([pool.submit(run_one, args, v, s) for v, s in jobs]):
            yield f.result()


SETTING_KEYS = ("layers", "dim", "heads", "ffn", "vocab", "seq", "batch", "steps", "lr", "embed_std", "eval_every",
                "builtin_mb", "probe_batches", "val_tokens")


def cmd_run(a, argv: list[str]) -> None:
    out = Path(a.out)
    settings = {k: getattr(a, k) for k in SETTING_KEYS}
    result_file = out / "results.json"
    previous = json.loads(result_file.read_text()).get("settings") if result_file.exists() else None
    if previous:  # one output directory = one set of settings, so that its tables compare like with like
        changed = [f"{k}: {previous.get(k)} -> {settings[k]}" for k in SETTING_KEYS if previous.get(k) != settings[k]]
        if changed:
            sys.exit(f"reproduce: {out} holds runs with other settings ({', '.join(changed)}); use another --out")
    for v in a.variants:
        try:
            make_config({**settings, "data": a.data}, v, 0, out / "x")
        except Exception as e:  # a bad variant fails here, in one line, not in a worker after minutes
            sys.exit(f"reproduce: variant {v!r}: {e}")
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.reproduce " + " ".join(argv)
    commands = (previous or {}).get("commands") or ([previous["command"]] if previous and "command" in previous else [])
    settings["commands"] = commands + [command] * (command not in commands)
    args = {**settings, "data": a.data, "runs_dir": a.runs_dir or str(out / "runs")}
    jobs = ([(v, s) for s in a.seeds for v in a.variants] if a.seed_major
            else [(v, s) for v in a.variants for s in a.seeds])
    t0 = time.time()
    with open(out / "runs.jsonl", "a") as log:
        for r in finished_runs(args, jobs, a.jobs):
            log.write(json.dumps(r) + "\n")
            log.flush()
            print(f"[{time.time() - t0:5.0f} s] {r['data']} {r['variant']} seed {r['seed']}: {r['status']}, val ppl "
                  f"{r['val_ppl']:.2f} ({r['wall_s']:.0f} s)", flush=True)
            summarize(out, settings, plots=False)  # results.json stays current; plots at the end
    print_table(summarize(out, settings))
    print(f"wrote {out / 'results.json'} ({time.time() - t0:.0f} s wall)")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train and probe (variant, seed) pairs, then summarise")
    r.add_argument("--data", choices=list(DATASETS), default="shakespeare")
    r.add_argument("--variants", nargs="+", default=["pre", "lns"],
                   help="schemes, optionally with +INIT (e.g. lns+scaled) and/or +gpas (pre+gpas, lns+gpas)")
    r.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    r.add_argument("--seed-major", action="store_true", help="all variants of seed 0 first, then seed 1, ...")
    r.add_argument("--layers", type=int, default=24)
    r.add_argument("--dim", type=int, default=64)
    r.add_argument("--heads", type=int, default=4)
    r.add_argument("--ffn", type=int, default=172)
    r.add_argument("--vocab", type=int, default=2048)
    r.add_argument("--seq", type=int, default=64)
    r.add_argument("--batch", type=int, default=16)
    r.add_argument("--steps", type=int, default=400)
    r.add_argument("--lr", type=float, default=2e-3)
    r.add_argument("--embed-std", type=float, default=(2 / 5) ** 0.5, help="the paper-era 0.632 by default")
    r.add_argument("--eval-every", type=int, default=100)
    r.add_argument("--builtin-mb", type=float, default=4.0)
    r.add_argument("--val-tokens", type=int, default=32768, help="validation tokens used (the head of the stream)")
    r.add_argument("--probe-batches", type=int, default=4, help="validation batches of 16 windows for the probes")
    r.add_argument("--jobs", type=int, default=2, help="worker processes (one thread each)")
    r.add_argument("--out", default=str(OUT))
    r.add_argument("--runs-dir", help="where run directories go (default OUT/runs, git-ignored)")
    s = sub.add_parser("summarize", help="tables, verdicts and plots from OUT/runs.jsonl")
    s.add_argument("--out", default=str(OUT))
    a = p.parse_args(argv)
    if a.cmd == "run":
        cmd_run(a, sys.argv[1:] if argv is None else argv)
    else:
        print_table(summarize(Path(a.out)))


if __name__ == "__main__":
    main()
