"""The depth-transfer study (issue 37): which parameterization carries a rate tuned at N = 6 to 12, 24 and 48
blocks, and LNS taken apart at N = 48. A thin entry over depthlab.study.transfer (the plan and the page).

    python -m benchmarks.depth_transfer run --jobs 2 --runs-dir DIR    # resumable; records in OUT/runs.jsonl
    python -m benchmarks.depth_transfer summarize                     # the page section; draws its figure
    python -m benchmarks.depth_transfer prepare --gpu --runs-dir DIR   # its corpus, tokenized here (about 40 MB)
    python -m benchmarks.depth_transfer run --gpu --runs-dir DIR       # part (A) at width 256 on one GPU

Model, data and training are the LNS study's (width 64, 2,000 steps of 16 x 64 tokens), on the deduplicated study
corpus with its test split; each cell is probed at its end (256 windows, no Jacobians) and checkpoints at every
evaluation, so a killed study run again resumes each unfinished cell (keep --runs-dir). `--gpu`: part (A) alone at
width 256, 4,000 steps of 32 x 256 tokens (33M), bf16, compiled, records in OUT/gpu/ (not yet run or timed).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.depth_study import add_arguments, study
from depthlab import UserError
from depthlab.flags import SEED, at_least
from depthlab.study import transfer as t
from depthlab.study.records import recorded_command
from depthlab.study.script import parse, parser

GPU = {"dim": 256, "heads": 4, "ffn": 688, "seq": 256, "batch": 32, "steps": 4000, "eval_every": 500, "vocab": 8192,
       "corpus_mb": 64.0, "device": "cuda", "dtype": "bf16", "compile": True, "jobs": 1, "parts_depth": 0,
       "probe_windows": 64, "out": str(t.OUT / "gpu")}


def design(a) -> t.Design:
    ks = [t.lattice(lr) for lr in a.lrs]
    if None in ks:
        raise UserError(f"--lrs must lie on the sqrt(2) lattice 1e-3 * sqrt(2)^k (e.g. {t.rate(7):g}), got {a.lrs}")
    return t.Design(a.base_depth, tuple(a.depths), tuple(a.grid_depths), tuple(ks), tuple(a.seeds),
                    a.parts_depth or None, tuple(a.parts_seeds), a.widen, tuple(a.variants), tuple(a.parts))


def main(argv=None) -> None:
    p = parser("benchmarks.depth_transfer", __doc__)
    p.add_argument("cmd", choices=("run", "prepare", "summarize"))
    p.add_argument("--gpu", action="store_true", help="part (A) at width 256 on one GPU (see the docstring)")
    p.add_argument("--base-depth", type=at_least(1), default=6, help="L_base: the depth the rate is tuned at")
    p.add_argument("--grid-depths", nargs="+", type=at_least(1), default=[12, 24, 48])
    p.add_argument("--parts-depth", type=at_least(0), default=48, help="part (B)'s depth (0: no part B)")
    p.add_argument("--parts-seeds", nargs="+", type=SEED, default=[0, 1, 2])
    p.add_argument("--widen", type=at_least(0), default=4, help="lattice steps a grid may grow past an edge")
    p.add_argument("--variants", nargs="+", choices=t.TRANSFER, default=list(t.TRANSFER))
    p.add_argument("--parts", nargs="+", choices=t.PARTS, default=list(t.PARTS))
    p.add_argument("--img", help="summarize: the figure's path (default docs/img/depth_transfer.png)")
    add_arguments(p)
    p.set_defaults(out=str(t.OUT), budgets=[], lrs=[t.rate(k) for k in t.Design().base_grid])
    a = parse(p, argv)
    if a.gpu:  # its own defaults, under anything given on the command line
        p.set_defaults(**GPU)
        a = parse(p, argv)
    d = design(a)
    if a.cmd in ("run", "prepare"):  # the study's corpus is built (once) with it
        s = study(a, recorded_command("benchmarks.depth_transfer", argv), "transfer", t.variants(d.base_depth))
        s.probe = replace(s.probe, jacobian=False)
        corpus = s.meta["corpus"]
        s.meta.update(design=d.describe(), dedup_removed=(corpus.get("dedup") or {}).get("removed"),
                      test_tokens=corpus.get("test_tokens"))
        if a.cmd == "run":
            t.run(s, d, a.jobs)
    img = (Path(a.img) if a.img else t.IMG.with_name("depth_transfer_gpu.png") if a.gpu else t.IMG)
    print("\n".join(t.page_lines(Path(a.out), img if a.cmd == "summarize" else None) or ["no records yet"]))


if __name__ == "__main__":
    from depthlab.cli import run_script
    sys.exit(run_script(main))
