"""The paper's ViT row at CPU scale: does LNS on the branch outputs beat Pre-LN, and LNS after the norm lose? A thin
script over depthlab.study.

    python -m benchmarks.vit_study run          # the grid, then the other seeds at each variant's best rate
    python -m benchmarks.vit_study summarize    # results.json and the plot from what has finished

The paper (ViT-S, ImageNet) reports top-1 67.91 for Pre-LN, 68.75 with LNS after the attention and MLP outputs
(`model.lns_placement=branch`) and 66.43 with LNS after the norm (`norm`). Here: the `vit-digits` preset (12 x 64,
patch 2, scikit-learn's 1,797 8 x 8 digits, 1 in 5 held out), each variant at every rate of --lrs with seed 0,
then at its best rate by validation loss (the selection metric) with every seed of --seeds. The same data, order
and init draw per seed across variants, so differences are paired seed by seed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from depthlab.study.records import load_records, recorded_command
from depthlab.study.runner import Study, best_rates, grid_cells, run_cells, seed_cells

OUT = Path(__file__).parent / "results" / "vit_study"
VARIANTS = {"pre": ["model.norm_scheme=pre"],
            "lns-norm": ["model.norm_scheme=lns", "model.lns_placement=norm"],
            "lns-branch": ["model.norm_scheme=lns", "model.lns_placement=branch"]}
PAPER = {"pre": 67.91, "lns-norm": 66.43, "lns-branch": 68.75}  # ViT-S top-1 on ImageNet, the paper's table
DIRECTION = {"lns-norm": "worse", "lns-branch": "better"}  # than pre, as the paper found


def study(a, command: str) -> Study:
    base = [f"train.max_steps={a.steps}", f"train.batch_size={a.batch}", f"train.warmup_steps={a.steps // 10}",
            f"train.eval_every={a.steps // 4}", f"train.monitor_every={a.steps // 4}", "train.threads=1"]
    return Study("vit", a.out, VARIANTS, base, "vit-digits", a.runs_dir, command=command,
                 meta={"lrs": a.lrs, "seeds": a.seeds, "steps": a.steps, "batch": a.batch, "paper": PAPER,
                       "direction": DIRECTION})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vit_study", description=__doc__.split("\n")[0])
    p.add_argument("cmd", choices=("run", "summarize"))
    p.add_argument("--lrs", nargs="+", type=float, default=[5e-4, 1e-3, 2e-3, 4e-3], help="the grid, spaced x2")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--jobs", type=int, default=2, help="worker processes (one thread each)")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--runs-dir", help="where run directories go (default OUT/runs, git-ignored)")
    a = p.parse_args(argv)
    from depthlab.study.page.depth import write_vit

    if a.cmd == "run":
        s = study(a, recorded_command("benchmarks.vit_study", argv))
        run_cells(s, grid_cells(s, a.lrs), a.jobs)
        run_cells(s, seed_cells(s, best_rates(s, load_records(s.runs_file), a.lrs), a.seeds), a.jobs)
    write_vit(Path(a.out))


if __name__ == "__main__":
    from depthlab.cli import run_script
    sys.exit(run_script(main))
