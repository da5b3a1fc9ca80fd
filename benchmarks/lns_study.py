"""The study that can tell why LNS wins: each depth at its own rate, LNS taken apart, the curse along training and
the old stability claims, as thin phases over depthlab.study (the depth study's model, data and probe settings).

    python -m benchmarks.lns_study run --phases depths       # resumable; records go to OUT/runs.jsonl
    python -m benchmarks.lns_study run --phases along        # alone: 15M tokens of a 64 MB corpus, its own OUT
    python -m benchmarks.lns_study run --gpu                 # `along` sized for one GPU (below)
    python -m benchmarks.lns_study summarize [--phases along | --gpu]

    depths     pre and lns at each of --grid-depths, each scheme on its own rate grid (pre 2e-3 4e-3 8e-3, lns 4e-3
               8e-3 1.6e-2), widened by a factor 2 where the best rate is at an edge (--widen times at most), seed 0;
               then --seeds at each depth's best rates
    parts      at --parts-depth, rates --parts-lrs, --seeds: pre, lns, pre with block-l norm gains starting at
               l^-p, pre with those gains learning at lr*l^-p, pre with every block-l parameter at lr*l^-p
    along      pre and lns at each of --along-depths and --along-lrs, seed 0, probed every --probe-every tokens;
               run alone: its defaults are 14,648 steps of 16 x 64 tokens (15M, under one epoch of the 64 MB
               built-in corpus), its records go to lns_study_along/
    stability  post, deepnorm, mixln and lns with scaled init at --ref-depth, each on pre's grid widened as above,
               seed 0; then --seeds at each best rate; divergence (non-finite, or loss above ln V) is recorded

Every phase's cells checkpoint at each evaluation, so a killed study run again resumes each unfinished cell where it
stopped (keep --runs-dir). Cells the depth study trained alike (its N = 24 grid, 8e-3 at 6-48 blocks; its probe) are
not trained again unless --no-reuse. Selection is by the final validation loss. `--gpu` is `along` where it means
more, prepared for one lent H100/H200 (about 8 minutes in all, not yet measured): width 128, 12 and 24 blocks, pre
and lns at 1e-3 (the paper's shared rate) and 3e-3, 3,662 steps of 64 x 256 tokens (60M), bf16, compiled, ten probes
per run, records in lns_study_gpu/. `prepare --gpu` tokenizes its corpus beforehand into --runs-dir (uint16, about
40 MB).
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.depth_study import add_arguments, study
from depthlab.study.records import recorded_command, trained_alike
from depthlab.study.runner import Study, grid_cells, run_cells, seed_cells, widened_grids
from depthlab.study.script import parse, parser

OUT = Path(__file__).parent / "results" / "lns_study"
PHASES = ("depths", "parts", "along", "stability")
DEPTH = OUT.with_name("depth_study")  # its cells (the N = 24 grid, 8e-3 at 6-48 blocks) are reused where settings agree
ALONG = {"steps": 14648, "eval_every": 1465, "corpus_mb": 64.0, "phases": ["along"], "along_depths": [12],
         "along_lrs": [2e-3, 8e-3], "out": str(OUT.with_name("lns_study_along"))}
VARIANTS = {
    "pre": ["model.norm_scheme=pre"],
    "lns": ["model.norm_scheme=lns"],
    "pre+gain_init": ["model.norm_scheme=pre", "model.norm_gain_init=depth"],
    "pre+gain_lr": ["model.norm_scheme=pre", "train.norm_gain_lr=depth"],
    "pre+block_lr": ["model.norm_scheme=pre", "train.block_lr=depth"],
    "post": ["model.norm_scheme=post"],
    "deepnorm": ["model.norm_scheme=deepnorm"],
    "mixln": ["model.norm_scheme=mixln"],
    "lns+scaled": ["model.norm_scheme=lns", "model.init=scaled"],
}
GRIDS = {"pre": [2e-3, 4e-3, 8e-3], "lns": [4e-3, 8e-3, 1.6e-2]}  # the stability schemes use pre's
PARTS = ("pre", "lns", "pre+gain_init", "pre+gain_lr", "pre+block_lr")
UNSTABLE = ("post", "deepnorm", "mixln", "lns+scaled")
# --gpu: the `along` question where it means more (one H100/H200): about 60M tokens per cell at 64 x 256
GPU = {"dim": 128, "heads": 4, "ffn": 344, "seq": 256, "batch": 64, "steps": 3662, "eval_every": 366,
       "vocab": 8192, "corpus_mb": 64.0, "device": "cuda", "dtype": "bf16", "compile": True, "jobs": 1,
       "along_lrs": [1e-3, 3e-3], "along_depths": [12, 24], "probe_every": 6_000_000, "phases": ["along"],
       "out": str(OUT.with_name("lns_study_gpu"))}


def run_phase(s: Study, name: str, a) -> None:
    if name in ("depths", "stability"):
        depths = a.grid_depths if name == "depths" else [a.ref_depth]
        variants = ("pre", "lns") if name == "depths" else UNSTABLE
        for L in depths:
            best = widened_grids(s, {v: GRIDS.get(v, GRIDS["pre"]) for v in variants}, L, a.widen, a.jobs)
            run_cells(s, seed_cells(s, best, a.seeds, L), a.jobs)
    elif name == "parts":
        run_cells(s, [c for lr in a.parts_lrs for c in seed_cells(s, dict.fromkeys(PARTS, lr), a.seeds,
                                                                  a.parts_depth)], a.jobs)
    else:  # along: the budgets are every --probe-every tokens of the run
        s.budgets = sorted({0, *range(a.probe_every, a.steps * a.batch * a.seq, a.probe_every)})
        run_cells(s, [c for L in a.along_depths for c in grid_cells(s, a.along_lrs, L, ["pre", "lns"])], a.jobs)


def main(argv=None) -> None:
    p = parser("benchmarks.lns_study", __doc__)
    p.add_argument("cmd", choices=("run", "prepare", "summarize"))
    p.add_argument("--phases", nargs="+", choices=PHASES, default=["depths", "parts", "stability"])
    p.add_argument("--grid-depths", nargs="+", type=int, default=[6, 48])
    p.add_argument("--parts-depth", type=int, default=12)
    p.add_argument("--parts-lrs", nargs="+", type=float, default=[2e-3, 8e-3])
    p.add_argument("--along-depths", nargs="+", type=int, default=ALONG["along_depths"])
    p.add_argument("--along-lrs", nargs="+", type=float, default=ALONG["along_lrs"])
    p.add_argument("--widen", type=int, default=2, help="times a grid is widened past an edge (default 2)")
    p.add_argument("--probe-every", type=int, default=1_500_000, help="along: tokens between probes")
    p.add_argument("--gpu", action="store_true", help="the GPU settings of `along` (see the module docstring)")
    p.add_argument("--no-reuse", dest="reuse_depth_study", action="store_false", help="retrain the depth study's cells")
    add_arguments(p)
    p.set_defaults(out=str(OUT))
    a = parse(p, argv)
    if a.gpu or "along" in a.phases:  # a longer run on a larger corpus, in its own folder: its own defaults
        if not a.gpu and a.phases != ["along"]:
            p.error("run the along phase alone (--phases along), or with --gpu")
        p.set_defaults(**(GPU if a.gpu else ALONG))
        a = parse(p, argv)  # those settings, under anything given on the command line
    if a.cmd in ("run", "prepare"):
        s = study(a, recorded_command("benchmarks.lns_study", argv), "lns", VARIANTS)
        if a.reuse_depth_study and trained_alike(s.meta, DEPTH / "settings.json"):
            s.reuse, s.meta["reuses"] = [str(DEPTH / "runs.jsonl")], DEPTH.name  # its cells are not trained again
        for name in a.phases if a.cmd == "run" else []:
            run_phase(s, name, a)
    from depthlab.study.page import depth, lns
    from depthlab.study.records import load_records
    from depthlab.study.summary import lns_study

    records = load_records(Path(a.out) / "runs.jsonl")
    tables = depth.along_table(records) if "along" in a.phases else lns.own_best_lines(
        lns_study(records, list(PARTS), list(UNSTABLE), a.ref_depth))
    print("\n".join(tables + depth.cell_tables(Path(a.out))))


if __name__ == "__main__":
    from depthlab.cli import run_script
    sys.exit(run_script(main))
