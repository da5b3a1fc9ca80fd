"""Write docs/results.md (the studies) and docs/benchmarks.md (the systems benchmarks) from the result files under
benchmarks/results/, so that no figure or word in them is typed by hand (depthlab.study.page renders both).

    python -m benchmarks.report        # or: make results
    python -m benchmarks.report composition depth_transfer 658f5e2
        # the held-out splits' make-up of a study whose records predate it (results/<study>/composition.json)

A study built before each held-out split's make-up was recorded (the depth-transfer study) names its corpus by
sha256 only. `composition` rebuilds that corpus with the code of COMMIT (the last whose rule rebuilds it: today's
dedup builds another corpus), checks the sha256 against the records' and writes the splits' make-up beside them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import lns_study
from depthlab.study.page import science, systems

RESULTS = Path(__file__).resolve().parent / "results"
DOCS = RESULTS.parent.parent / "docs"
# run by the old code: the corpus of the settings' preset and overrides, split by the rule of its time
_REBUILD = """import json, sys
from pathlib import Path
from depthlab.config import apply_overrides
from depthlab.model.families import preset
from depthlab.study.corpus import build_corpus
s = json.loads(Path(sys.argv[1]).read_text())
c = build_corpus(apply_overrides(preset(s["preset"]), s["base"]), Path(sys.argv[2]), held_out="alternate")
print(json.dumps({"sha256": c["sha256"], "splits": {n: {k: v for k, v in sp.items() if k not in ("names", "doc_tokens")}
                                                    for n, sp in c.get("splits", {}).items()}}))
"""


def main() -> Path:
    systems.write(RESULTS, DOCS)
    along = [(L, lr) for L in lns_study.ALONG["along_depths"] for lr in lns_study.ALONG["along_lrs"]]
    return science.write(RESULTS, DOCS, list(lns_study.PARTS), list(lns_study.UNSTABLE), along)


def composition(study: str, commit: str) -> Path:
    """RESULTS/<study>/composition.json: its corpus rebuilt by the code of `commit` (git archive into a temporary
    folder), its held-out splits' make-up, and whether the rebuilt sha256 is the one the study's records name."""
    out = RESULTS / study
    recorded = json.loads((out / "settings.json").read_text())["meta"]["corpus"]["sha256"]
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", commit, "src"], cwd=RESULTS.parent.parent, capture_output=True,
                                 check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        done = subprocess.run([sys.executable, "-c", _REBUILD, str(out / "settings.json"), f"{tmp}/corpus"],
                              env={**os.environ, "PYTHONPATH": f"{tmp}/src"}, capture_output=True,
                              text=True, check=True)
    rebuilt = json.loads(done.stdout.splitlines()[-1])
    path = out / "composition.json"
    path.write_text(json.dumps({"command": f"python -m benchmarks.report composition {study} {commit}",
                                "code_commit": commit, **rebuilt, "matches_records": rebuilt["sha256"] == recorded},
                               indent=1) + "\n")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    if sys.argv[1:2] == ["composition"]:
        composition(*sys.argv[2:4])
    else:
        main()
