"""A depth study that can tell: does LNS beat Pre-LN, at which depth, and was the curse there to fix?

    python -m benchmarks.depth_study run                 # every phase below, in order; resumable
    python -m benchmarks.depth_study run --phases grid   # one phase
    python -m benchmarks.depth_study summarize           # tables, verdicts and plots from what has finished

The model starts in the paper's regime (width-matched init, `model.init_std=auto`, embedding std sqrt(2/5)),
and every configuration's per-block update ratio at initialisation is recorded next to LLaMA-130M's. Phases:

    grid    pre, lns at the reference depth, every learning rate of --lrs, seed 0
    sweep   pre, lns at every depth of --depths and every seed of --seeds (at the reference depth every seed of
            --ref-seeds too), each at its best rate from the grid
    long    pre, lns at the reference depth and best rates, seed 0, for --long-tokens (>= 15M) on a larger built-in
            corpus (--long-corpus-mb, the standard library then the installed packages' sources): does the gap
            close or open as training goes on? Recorded in OUT/long.jsonl
    mixln   mixln at the reference depth: the grid, then the other seeds at its best rate

Every run trains on the same token streams (the built-in corpus, tokenized once into OUT/corpus and recorded by
content hash), for --steps steps of --batch x --seq tokens (under one epoch), then is probed with the library's
own analysis (`depthlab.analysis.study.analyze`): per block the update ratio, the variance of the stream, the
angular distance between its input and output, and the loss increase when it alone is removed. Each finished run
is appended to OUT/runs.jsonl at once, so an interrupted study keeps what it finished and `run` continues it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).parent / "results" / "depth_study"
PAPER_EMBED_STD = (2 / 5) ** 0.5
PHASES = ("grid", "sweep", "long", "mixln")


# ---------------------------------------------------------------------------------------------------- settings
def make_config(s: dict, layers: int, variant: str, lr: float, seed: int):
    from depthlab.config import Config, DataConfig, ModelConfig, TrainConfig

    model = ModelConfig(vocab_size=s["vocab"], dim=s["dim"], n_layers=layers, n_heads=s["heads"], ffn_dim=s["ffn"],
                        max_seq_len=s["seq"], norm_scheme=variant, init_std=s["init_std"], embed_std=s["embed_std"])
    data = DataConfig(seq_len=s["seq"], builtin_mb=s["corpus_mb"])
    train = TrainConfig(seed=seed, max_steps=s["steps"], batch_size=s["batch"], lr=lr,
                        warmup_steps=max(1, s["steps"] // 10), eval_every=s["eval_every"], log_every=10,
                        monitor_every=s["eval_every"], threads=1, device="cpu")
    return Config(model, data, train, preset="depth-study")  # the trainer validates it


def cell_key(layers: int, variant: str, lr: float, seed: int) -> str:
    return f"{variant}-L{layers}-lr{lr:g}-seed{seed}"


# ---------------------------------------------------------------------------------------------------- corpus
def build_corpus(s: dict) -> dict:
    """Tokenize the built-in corpus once (BPE trained on its training documents); record its content hash."""
    from depthlab.data.dataset import build_token_data

    d = Path(s["runs_dir"]) / s["corpus_dir"]
    if (d / "corpus.json").exists():
        return json.loads((d / "corpus.json").read_text())
    data = build_token_data(make_config(s, 2, "pre", 1e-3, 0))
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / "train.npy", np.asarray(data.train))
    np.save(d / "val.npy", np.asarray(data.val))
    data.tokenizer.save(str(d / "tokenizer.json"))
    h = hashlib.sha256()
    for arr in (data.train, data.val):
        h.update(np.ascontiguousarray(arr).tobytes())
    info = {"source": data.source, "sha256": h.hexdigest(), "tokenizer_hash": data.tokenizer_hash,
            "train_tokens": int(len(data.train)), "val_tokens": int(len(data.val))}
    (d / "corpus.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def load_corpus(s: dict):
    from depthlab.data.dataset import TokenData
    from depthlab.data.tokenizer import load_tokenizer

    d = Path(s["runs_dir"]) / s["corpus_dir"]
    info = json.loads((d / "corpus.json").read_text())
    val = np.load(d / "val.npy")[:s["val_tokens"]]  # the head of the validation stream keeps evaluations cheap
    return TokenData(load_tokenizer(d / "tokenizer.json"), np.load(d / "train.npy", mmap_mode="r"), val,
                     info["source"])


# ---------------------------------------------------------------------------------------------------- one run
def quarters(n: int) -> tuple[slice, slice]:
    """Shallow and deep quarter of n blocks (0-based). Block 1 is left out of the shallow quarter: it reads the
    raw embedding and LNS leaves it unscaled, so it is unlike every other block under both schemes."""
    k = max(1, round(n / 4))
    return slice(1, 1 + k), slice(n - k, n)


@torch.no_grad()
def probe(model, val: np.ndarray, seq: int, n_seqs: int) -> dict:
    """Per block, from the library's analysis: update ratio, stream variance after the block, angular distance
    between its input and output (all tokens), and the loss increase when it alone is removed."""
    from depthlab.analysis.calibration import Batch
    from depthlab.analysis.layers import from_depthlab
    from depthlab.analysis.study import Options, analyze

    n = min(n_seqs, (len(val) - 1) // seq)
    ids = torch.from_numpy(np.asarray(val[: n * seq]).astype(np.int64)).view(n, seq)
    batches = [Batch(ids[i:i + 16], torch.ones_like(ids[i:i + 16], dtype=torch.bool)) for i in range(0, n, 16)]
    res = analyze(from_depthlab(model.eval(), "study"), batches, Options(jacobian=False))
    L = len(model.layers)
    ang = res["angular"]["all_tokens"]
    return {"probe_loss": res["removal"]["base_loss"],
            "update_ratio": [b["update_ratio"] for b in res["blocks"]],
            "var": [res["states"][l + 1]["variance"] for l in range(L)],
            "angular": [ang[l][l + 1] for l in range(L)],
            "removal": [r["loss"] - res["removal"]["base_loss"] for r in res["removal"]["single"]]}


def run_cell(s: dict, layers: int, variant: str, lr: float, seed: int) -> dict:
    from depthlab.analysis.metrics import init_update_ratios
    from depthlab.train.checkpoint import load_checkpoint
    from depthlab.train.trainer import TrainingDiverged, train

    torch.set_num_threads(1)
    run_dir = Path(s["runs_dir"]) / (s["tag"] + cell_key(layers, variant, lr, seed))
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    cfg = make_config(s, layers, variant, lr, seed)
    data = load_corpus(s)
    rec = {"layers": layers, "variant": variant, "lr": lr, "seed": seed, "corpus_sha256": s["corpus_sha256"],
           "init_update_ratio": init_update_ratios(cfg.model, seed=seed)}
    t0 = time.time()
    try:
        result = train(cfg, run_dir=run_dir, data=data, progress=False)
        rec.update(status="ok", val_loss=result.val_loss)
    except TrainingDiverged as e:
        rec.update(status="diverged", error=str(e), val_loss=math.inf)
    rec["wall_s"] = time.time() - t0
    rec["tokens"] = s["steps"] * s["batch"] * s["seq"]
    rec["epochs"] = rec["tokens"] / s["train_tokens"]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    rec["val_curve"] = [(r["step"], r["val_loss"]) for r in metrics if "val_loss" in r]
    rec["loss_curve"] = [(r["step"], r["loss"]) for r in metrics if "loss" in r][::5]
    rec["monitor_update_ratio"] = [(r["step"], r["depth/update_ratio"]) for r in metrics if "depth/update_ratio" in r]
    if rec["status"] == "ok":
        model, _, _ = load_checkpoint(result.checkpoint)
        rec.update(probe(model, data.val, s["seq"], s["probe_seqs"]))
    return rec


# ---------------------------------------------------------------------------------------------------- bookkeeping
def load_runs(out: Path, name: str = "runs.jsonl") -> dict[str, dict]:
    path = out / name
    runs = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line:
                r = json.loads(line)
                runs[cell_key(r["layers"], r["variant"], r["lr"], r["seed"])] = r
    return runs


def best_lr(runs: dict, variant: str, layers: int, lrs: list[float]) -> float | None:
    """The grid's rate with the lowest validation loss (seed 0), once every rate of the grid has finished."""
    grid = [runs.get(cell_key(layers, variant, lr, 0)) for lr in lrs]
    if not all(grid):
        return None
    return min(grid, key=lambda r: r["val_loss"])["lr"]


def phase_cells(phase: str, s: dict, runs: dict) -> list[tuple]:
    ref, lrs = s["ref_depth"], s["lrs"]
    if phase == "grid":
        return [(ref, v, lr, 0) for v in ("pre", "lns") for lr in lrs]
    if phase == "sweep":
        best = {v: best_lr(runs, v, ref, lrs) for v in ("pre", "lns")}
        if None in best.values():
            sys.exit("the sweep needs the grid: run --phases grid first")
        # seed 0 at every depth first (deepest first: the thesis is about depth), then the other seeds
        cells = [(L, v, best[v], seed) for seed in s["seeds"]
                 for L in sorted(s["depths"], reverse=seed == s["seeds"][0]) for v in ("pre", "lns")]
        return cells + [(ref, v, best[v], seed) for seed in s["ref_seeds"] if seed not in s["seeds"]
                        for v in ("pre", "lns")]
    if phase == "long":
        best = {v: best_lr(runs, v, ref, lrs) for v in ("pre", "lns")}
        if None in best.values():
            sys.exit("the long pair needs the grid: run --phases grid first")
        return [(ref, v, best[v], 0) for v in ("pre", "lns")]
    if phase == "mixln":
        cells = [(ref, "mixln", lr, 0) for lr in lrs]
        b = best_lr(runs, "mixln", ref, lrs)
        return cells + ([(ref, "mixln", b, seed) for seed in s["seeds"]] if b else [])
    raise ValueError(phase)


def with_corpus(s: dict) -> dict:
    """s with its corpus built (or found in the cache) and recorded; refuses a budget over one epoch."""
    info = build_corpus(s)
    s = {**s, "corpus": info, "corpus_sha256": info["sha256"], "train_tokens": info["train_tokens"]}
    if s["steps"] * s["batch"] * s["seq"] > info["train_tokens"]:
        sys.exit(f"{s['steps']} steps would see more than one epoch of {info['train_tokens']:,} tokens: "
                 f"raise --{'long-' if s['tag'] else ''}corpus-mb")
    return s


def long_settings(s: dict) -> dict:
    steps = math.ceil(s["long_tokens"] / (s["batch"] * s["seq"]))
    return {**s, "steps": steps, "eval_every": s["long_eval_every"], "corpus_mb": s["long_corpus_mb"],
            "corpus_dir": "corpus-long", "tag": "long-"}


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = with_corpus(settings(args))
    saved = {k: v for k, v in s.items() if k not in ("out", "runs_dir")}  # where files go is not a setting
    (out / "settings.json").write_text(json.dumps(saved, indent=2) + "\n")
    ctx = get_context("spawn")  # fresh interpreters: no inherited thread pools
    with ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        for phase in [] if args.dry_run else args.phases:
            runs_file = "long.jsonl" if phase == "long" else "runs.jsonl"
            ps = with_corpus(long_settings(s)) if phase == "long" else s
            for _ in range(2):  # mixln's seeds are known only once its grid has finished
                runs, done = load_runs(out), load_runs(out, runs_file)
                todo = [c for c in phase_cells(phase, s, runs) if cell_key(*c) not in done]
                if not todo:
                    continue
                print(f"{phase}: {len(todo)} runs", file=sys.stderr)
                futures = {pool.submit(run_cell, ps, *c): c for c in todo}
                for f in as_completed(futures):
                    rec = f.result()
                    with open(out / runs_file, "a") as fh:
                        fh.write(json.dumps(rec) + "\n")
                    print(f"  {ps['tag']}{cell_key(*futures[f])}: val loss {rec['val_loss']:.4f} "
                          f"({rec['wall_s']:.0f} s)", file=sys.stderr)
    summarize(args)


def settings(args) -> dict:
    keys = ("dim", "heads", "ffn", "vocab", "seq", "batch", "steps", "eval_every", "corpus_mb", "val_tokens",
            "probe_seqs", "ref_depth", "depths", "seeds", "ref_seeds", "lrs", "init_std", "embed_std",
            "long_tokens", "long_corpus_mb", "long_eval_every", "out")
    s = {k: getattr(args, k) for k in keys}
    s.update(corpus_dir="corpus", tag="")
    s["runs_dir"] = args.runs_dir or str(Path(args.out) / "runs")
    argv, kept = list(args.argv), []
    while argv:  # the command as recorded: without --out / --runs-dir, so it names no machine path
        a = argv.pop(0)
        if a in ("--out", "--runs-dir"):
            argv = argv[1:]
        elif a != "--dry-run" and not a.startswith(("--out=", "--runs-dir=")):
            kept.append(a)
    s["command"] = "python -m benchmarks.depth_study " + " ".join(kept)
    return s


def summarize(args) -> None:
    from benchmarks.depth_study_report import write_summary

    write_summary(Path(args.out))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.depth_study", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train what is missing, then summarise")
    r.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    r.add_argument("--depths", nargs="+", type=int, default=[6, 12, 24, 48])
    r.add_argument("--ref-depth", type=int, default=24)
    r.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    r.add_argument("--ref-seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds at the reference depth")
    r.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2],
                   help="the grid, spaced x2")
    r.add_argument("--dim", type=int, default=64)
    r.add_argument("--heads", type=int, default=4)
    r.add_argument("--ffn", type=int, default=172)
    r.add_argument("--vocab", type=int, default=2048)
    r.add_argument("--seq", type=int, default=64)
    r.add_argument("--batch", type=int, default=16)
    r.add_argument("--steps", type=int, default=2000)
    r.add_argument("--eval-every", type=int, default=250)
    r.add_argument("--corpus-mb", type=float, default=10.0, help="MB of the built-in corpus")
    r.add_argument("--val-tokens", type=int, default=32768, help="validation tokens used (the head of the stream)")
    r.add_argument("--probe-seqs", type=int, default=64, help="validation windows for the probes")
    r.add_argument("--init-std", default="auto", help="auto (sqrt(2/(5 dim))) or a number")
    r.add_argument("--embed-std", type=float, default=PAPER_EMBED_STD)
    r.add_argument("--long-tokens", type=float, default=15.1e6, help="training tokens of the long pair")
    r.add_argument("--long-corpus-mb", type=float, default=64.0, help="MB of the built-in corpus for the long pair")
    r.add_argument("--long-eval-every", type=int, default=500)
    r.add_argument("--jobs", type=int, default=2, help="worker processes (one thread each)")
    r.add_argument("--out", default=str(OUT))
    r.add_argument("--runs-dir", help="where run directories go (default OUT/runs, git-ignored)")
    r.add_argument("--dry-run", action="store_true", help="train nothing: record these settings and summarise "
                   "what has finished (after a partial run with other --depths / --seeds)")
    sm = sub.add_parser("summarize", help="tables, verdicts, plots from OUT/runs.jsonl")
    sm.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if args.cmd == "run" and args.init_std != "auto":
        args.init_std = float(args.init_std)
    (run if args.cmd == "run" else summarize)(args)


if __name__ == "__main__":
    main()
