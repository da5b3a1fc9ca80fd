"""Write docs/results.md (the studies) and docs/benchmarks.md (the systems benchmarks) from the result files under
benchmarks/results/, so that no figure or word in them is typed by hand (depthlab.study.page renders both).

    python -m benchmarks.report        # or: make results
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import lns_study
from depthlab.study.page import science, systems

RESULTS = Path(__file__).resolve().parent / "results"
DOCS = RESULTS.parent.parent / "docs"


def main() -> Path:
    systems.write(RESULTS, DOCS)
    along = [(L, lr) for L in lns_study.ALONG["along_depths"] for lr in lns_study.ALONG["along_lrs"]]
    return science.write(RESULTS, DOCS, list(lns_study.PARTS), list(lns_study.UNSTABLE), along)


if __name__ == "__main__":
    main()
