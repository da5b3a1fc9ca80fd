"""The own-rate study (issue 50): LNS against Pre-LN, each at its own validation-selected rate, at N = 12 and 24
(then 48, and gain-init and uniform gain there), on balanced held-out splits. A thin entry over
depthlab.study.own_rate (the design, the plan and the order of the cells).

    python -m benchmarks.own_rate plan                              # OUT/plan.json (commit it before any cell)
    python -m benchmarks.own_rate prepare --runs-dir DIR            # the corpus alone, and its splits' make-up
    python -m benchmarks.own_rate run --jobs 2 --runs-dir DIR       # resumable; records in OUT/runs.jsonl
    python -m benchmarks.own_rate status                            # cells done / missing

Model, training and probe are the depth-transfer study's (width 64, 2,000 steps of 16 x 64 tokens, the final model
probed on 256 windows without Jacobians); the corpus is the same 10 MB of the built-in corpus, deduplicated, with a
held-out fraction of 0.2 and the whole validation split (not a slice of it) selecting rates, evaluated every 500
steps (not 250: the split is 2.3 times the old slice) and at the end.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.depth_study import add_arguments, study
from depthlab import UserError
from depthlab.flags import SEED, at_least, fraction
from depthlab.ownership import write_whole
from depthlab.study import own_rate as o
from depthlab.study.records import load_records, recorded_command
from depthlab.study.script import parse, parser

OUT = Path(__file__).parent / "results" / "own_rate"


def main(argv=None, study_module=o, out: Path = OUT, **defaults) -> None:
    """The own-rate study's commands; another study built the same way (depthlab.study.muon) passes its module, its
    records folder and its argument defaults."""
    p, a, d = arguments(argv, study_module, out, **defaults)
    commands(p, a, d, argv, study_module)


def arguments(argv, study_module, out: Path, extra_commands: tuple[str, ...] = (), **defaults):
    """(the parser, its arguments, the study's Design, checked) of a study built like this one; `extra_commands`:
    the study's own besides plan, prepare, run and status."""
    name = study_module.__name__.rsplit(".", 1)[-1]
    p = parser(f"benchmarks.{'own_rate' if study_module is o else name + '_study'}", study_module.__doc__ or __doc__)
    p.add_argument("cmd", choices=("plan", "prepare", "run", "status", *extra_commands))
    p.add_argument("--deep", type=at_least(0), default=48, help="the deep stage's depth (0: none)")
    p.add_argument("--deep-seeds", nargs="+", type=SEED, default=[0, 1, 2, 3])
    p.add_argument("--widen", type=at_least(0), default=4, help="lattice steps a grid may grow past an edge")
    p.add_argument("--val-fraction", type=fraction, default=0.2, help="share of (non-generated) documents held out")
    p.add_argument("--gpu", action="store_true", help="at width 256 on one GPU (the depth-transfer study's --gpu "
                   "settings), records in OUT/gpu")
    add_arguments(p)
    p.set_defaults(**{"out": str(out), "budgets": [], "depths": [12, 24], "seeds": [0, 1, 2, 3], "val_tokens": 0,
                      "held_out": "balanced", "eval_every": 500, **defaults})
    a = parse(p, argv)
    if a.gpu:  # its own defaults, under anything given on the command line
        from benchmarks.depth_transfer import GPU

        p.set_defaults(**{**GPU, "out": str(out / "gpu")})
        a = parse(p, argv)
    d = study_module.Design(tuple(a.depths), tuple(a.seeds), a.deep or None, tuple(a.deep_seeds), widen=a.widen)
    d.check()
    return p, a, d


def commands(p, a, d, argv, study_module) -> None:
    """plan, status, prepare and run."""
    out = Path(a.out)
    if a.cmd == "plan":  # with the corpus's make-up, where `prepare` has built it (no loss is read)
        built = Path(a.runs_dir or out / "runs") / "corpus" / "corpus.json"
        info = json.loads(built.read_text()) if built.exists() else {}
        corpus = {"sha256": info.get("sha256"), "splits": {k: {f: v[f] for f in ("documents", "tokens", "effective",
                                                                                 "max_share", "top")}
                                                           for k, v in (info.get("splits") or {}).items()}}
        out.mkdir(parents=True, exist_ok=True)
        write_whole(out / "plan.json", json.dumps({**study_module.plan(d), "design": d.describe(), "corpus": corpus},
                                                  indent=2) + "\n")
        print(out / "plan.json")
        return
    if a.cmd == "status":
        print(json.dumps(o.counts(load_records(out / "runs.jsonl"), d)))
        return
    if a.cmd == "run" and not (out / "plan.json").exists():  # before the corpus is built
        raise UserError(f"{out / 'plan.json'} is missing: write it (plan) and commit it before the first cell")
    s = make_study(p, a, d, argv, study_module)
    if a.cmd == "run":
        o.run(s, d, a.jobs)
    print(json.dumps(o.counts(s.records(), d)))


def make_study(p, a, d, argv, study_module):
    """The study of these arguments, its corpus built (or found) in the runs dir, each split's make-up printed."""
    name = study_module.__name__.rsplit(".", 1)[-1]
    s = study(a, recorded_command(p.prog.split()[-1], argv), name, study_module.variants(d))
    s.probe = replace(s.probe, jacobian=False)
    s.rate_keys = getattr(study_module, "RATE_KEYS", s.rate_keys)
    corpus = s.meta["corpus"]
    s.meta.update(design=d.describe(), dedup_removed=(corpus.get("dedup") or {}).get("removed"),
                  test_tokens=corpus.get("test_tokens"), val_fraction=a.val_fraction)
    from depthlab.data.tokens import describe_composition

    for split, comp in (corpus.get("splits") or {}).items():
        print(describe_composition(split, comp))
    return s


if __name__ == "__main__":
    from depthlab.cli import run_script
    sys.exit(run_script(main))
