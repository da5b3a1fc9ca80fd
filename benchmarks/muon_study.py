"""The Muon study (issue 53): Pre-LN and LNS with the blocks' matrices trained by Muon, each at its own
validation-selected rate at N = 6, 12 and 24, 3 seeds at each best, and N = 6's best rate carried to 12 and 24. A
thin entry over depthlab.study.muon (the design and the plan), run like the own-rate study (benchmarks.own_rate):

    python -m benchmarks.muon_study plan                              # OUT/plan.json (commit it before any cell)
    python -m benchmarks.muon_study run --jobs 2 --runs-dir DIR       # resumable; records in OUT/runs.jsonl
    python -m benchmarks.muon_study run --deep 48 --runs-dir DIR      # then the N = 48 pair, as the cores allow
    python -m benchmarks.muon_study run --gpu --runs-dir DIR          # width 256 on one GPU (records in OUT/gpu)
    python -m benchmarks.muon_study status                            # cells done / missing

Same model, corpus, balanced held-out splits, training length and probe as the own-rate study: 42 cells or more (6
grids of 3 rates, more where a grid widens; 2 more seeds at each of the 6 best rates; 12 transfer cells, fewer where
N = 6's rate is a depth's own best).
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.own_rate import main as study_main
from depthlab.study import muon

OUT = Path(__file__).parent / "results" / "muon"


def main(argv=None) -> None:
    d = muon.Design()
    study_main(argv, muon, OUT, depths=list(d.depths), seeds=list(d.seeds), deep=0, deep_seeds=list(d.deep_seeds))


if __name__ == "__main__":
    from depthlab.cli import run_script
    sys.exit(run_script(main))
