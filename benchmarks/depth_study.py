"""The depth study: does LNS beat Pre-LN, at which depth, and is the curse there? A thin script over depthlab.study.

    python -m benchmarks.depth_study run                  # grid, sweep, mixln in order; resumable
    python -m benchmarks.depth_study run --phases grid    # one phase
    python -m benchmarks.depth_study summarize            # results.json, plots (docs/results.md: make results)

    grid    pre, lns at --ref-depth, every rate of --lrs, seed 0
    sweep   pre, lns at every depth of --depths, each at its best rate from the grid, every seed of --seeds
            (and of --ref-seeds at the reference depth)
    mixln   mixln at --ref-depth: its grid, then --seeds at its best rate

Width-matched init (`model.init_std=auto`), embedding std sqrt(2/5); every cell trains on one token stream of the
built-in corpus (tokenized once, hash recorded), is probed at the end (and at each of --budgets tokens) on
--probe-windows seeded windows over the whole validation split with the Jacobians and the curse index.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from depthlab import UserError
from depthlab.flags import SEED, at_least, positive
from depthlab.study.corpus import build_corpus, unigram_loss
from depthlab.study.probe import ProbeSpec
from depthlab.study.records import load_records, recorded_command
from depthlab.study.runner import Study, best_rates, grid_cells, run_cells, seed_cells
from depthlab.study.script import parse, parser

OUT = Path(__file__).parent / "results" / "depth_study"
PHASES = ("grid", "sweep", "mixln")
VARIANTS = {"pre": ["model.norm_scheme=pre"], "lns": ["model.norm_scheme=lns"], "mixln": ["model.norm_scheme=mixln"]}


def study(a, command: str, name: str = "depth", variants: dict | None = None) -> Study:
    """The study of these arguments (add_arguments); other studies reuse it with their own variants."""
    warm = max(1, a.steps // 10)
    base = [f"model.dim={a.dim}", f"model.n_heads={a.heads}", f"model.ffn_dim={a.ffn}", f"model.vocab_size={a.vocab}",
            f"model.max_seq_len={a.seq}", "model.init_std=auto", f"model.embed_std={(2 / 5) ** 0.5}",
            f"data.seq_len={a.seq}", f"data.builtin_mb={a.corpus_mb}",
            *([f"data.val_fraction={a.val_fraction}"] if getattr(a, "val_fraction", None) else []),
            f"train.max_steps={a.steps}",
            f"train.batch_size={a.batch}", f"train.warmup_steps={warm}", f"train.eval_every={a.eval_every}",
            "train.log_every=10", f"train.monitor_every={a.eval_every}", "train.threads=1", f"train.device={a.device}",
            *([f"train.dtype={a.dtype}"] if a.dtype != "fp32" else []), *(["train.compile=true"] if a.compile else [])]
    runs = a.runs_dir or str(Path(a.out) / "runs")
    meta = {k: getattr(a, k) for k in ("dim", "heads", "ffn", "vocab", "seq", "batch", "steps", "eval_every",
                                       "corpus_mb", "val_tokens", "ref_depth", "depths", "seeds", "ref_seeds", "lrs")}
    s = Study(name, a.out, variants or VARIANTS, base, "cpu-tiny", runs, probe=ProbeSpec(a.probe_windows, a.seq),
              budgets=a.budgets, corpus=str(Path(runs) / "corpus"), val_tokens=a.val_tokens, command=command,
              ckpt_every=a.eval_every)  # 10 min to hours per cell: a killed cell resumes at its last evaluation
    s.meta.update({**meta, "init_std": "auto", "embed_std": (2 / 5) ** 0.5, "probe_windows": a.probe_windows,
              "corpus": build_corpus(s.config(grid_cells(s, [1e-3], 2)[0]), Path(s.corpus),
                                     getattr(a, "held_out", "alternate"))})  # the rule of the studies before #50
    s.meta["unigram_loss"] = unigram_loss(Path(s.corpus), a.val_tokens)  # the validation loss of no context at all
    return s


def phase(s: Study, name: str, a) -> list:
    records, ref = load_records(s.runs_file), a.ref_depth
    if name == "grid":
        return grid_cells(s, a.lrs, ref, ["pre", "lns"])
    best = best_rates(s, records, a.lrs, ref, ["mixln"] if name == "mixln" else ["pre", "lns"])
    if name == "mixln":
        return grid_cells(s, a.lrs, ref, ["mixln"]) + seed_cells(s, best, a.seeds, ref)
    if a.fixed_lr:  # one shared rate instead of the grid's best (the paper's protocol)
        best = dict.fromkeys(best, a.fixed_lr)
    if None in best.values():
        raise UserError("the sweep needs the grid: run --phases grid first (or give --fixed-lr)")
    return [c for seed in a.seeds for L in sorted(a.depths, reverse=True) for c in seed_cells(s, best, [seed], L)] \
        + seed_cells(s, best, [x for x in a.ref_seeds if x not in a.seeds], ref)


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The model, data, training and probe arguments every study script shares (and their defaults), each
    refused in one line out of its range (0 jobs, a negative seed, ...)."""
    for name, default in (("depths", [6, 12, 24, 48]), ("seeds", [0, 1]), ("ref-seeds", [0, 1, 2])):
        p.add_argument(f"--{name}", nargs="+", type=SEED if "seeds" in name else at_least(1), default=default)
    p.add_argument("--lrs", nargs="+", type=positive, default=[1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2])
    p.add_argument("--budgets", nargs="+", type=at_least(0), default=[0], help="training tokens at which to probe "
                   "too (default 0: at initialisation)")
    for name, default in (("ref-depth", 24), ("dim", 64), ("heads", 4), ("ffn", 172), ("vocab", 2048), ("seq", 64),
                          ("batch", 16), ("steps", 2000), ("eval-every", 250), ("val-tokens", 32768),
                          ("probe-windows", 256), ("jobs", 2)):
        p.add_argument(f"--{name}", type=at_least(0 if name == "val-tokens" else 1), default=default)
    p.add_argument("--corpus-mb", type=positive, default=10.0)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False, help="torch.compile every "
                   "cell's model")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--runs-dir", help="run directories and the tokenized corpus (default OUT/runs)")
    return p


def main(argv=None) -> None:
    p = parser("benchmarks.depth_study", __doc__)
    p.add_argument("cmd", choices=("run", "summarize"))
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    p.add_argument("--fixed-lr", type=float, help="sweep: this rate for every scheme instead of the grid's best")
    add_arguments(p)
    a = parse(p, argv)
    from depthlab.study.page.depth import write_depth

    if a.cmd == "run":
        s = study(a, recorded_command("benchmarks.depth_study", argv))
        for name in a.phases:
            for _ in range(2):  # mixln's seeds are known only once its grid has finished
                run_cells(s, phase(s, name, a), a.jobs)
    write_depth(Path(a.out))


if __name__ == "__main__":
    from depthlab.cli import run_script
    sys.exit(run_script(main))
