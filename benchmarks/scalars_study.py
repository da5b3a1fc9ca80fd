"""The scalars study (issue 65): {Pre-LN, LNS} x {no scalars, learnable stream scalars} under Muon at N = 12, 24 and
48, each arm at its own validation-selected rate, 3 seeds at each best. A thin entry over depthlab.study.scalars
(the design, the order of the cells and the plan), run like the Muon study (benchmarks.muon_study):

    python -m benchmarks.scalars_study measure --runs-dir DIR     # minutes a cell takes at each depth (the budget)
    python -m benchmarks.scalars_study plan --runs-dir DIR        # OUT/plan.json (commit it before any cell)
    python -m benchmarks.scalars_study run --jobs 1 --runs-dir DIR   # resumable; records in OUT/runs.jsonl
    python -m benchmarks.scalars_study status                     # cells done / missing
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.own_rate import arguments, commands, make_study
from depthlab.study import scalars
from depthlab.study.runner import Cell, train_cell

OUT = Path(__file__).parent / "results" / "scalars"
SHORT = (40, 120)  # steps of the two short cells per depth; their difference is the (CPU) time of a step


def main(argv=None) -> None:
    d = scalars.Design()
    p, a, d = arguments(argv, scalars, OUT, ("measure",), depths=list(d.depths), seeds=list(d.seeds), deep=0,
                        deep_seeds=list(d.deep_seeds), jobs=1)
    if a.cmd == "measure":
        measure(make_study(p, a, d, argv, scalars), d, a)
    else:
        commands(p, a, d, argv, scalars)


def measure(s, d: scalars.Design, a) -> None:
    """One lns+scalars cell per depth at SHORT[0] and SHORT[1] steps (an evaluation at the end of each) and one at
    SHORT[0] evaluating half-way too, at the arm's centre rate, in a scratch folder under the runs dir (no record
    here): a full cell is the short one plus its missing steps and evaluations. Core time is this process's CPU time
    (one torch thread, as a study's cell), which a shared machine does not inflate; wall time is printed beside it.
    Prints the minutes per depth (CELL_MINUTES) and the budget."""
    s = replace(s, out=str(Path(a.runs_dir) / "measure"), runs_dir=str(Path(a.runs_dir) / "measure"), ckpt_every=0)
    evals = a.steps // a.eval_every - 1  # a full cell's evaluations besides the last
    out = {}
    for L in d.depths:
        cpu, wall = {}, {}
        for steps, every in ((SHORT[0], SHORT[0]), (SHORT[1], SHORT[1]), (SHORT[0], SHORT[0] // 2)):
            cell = replace(s, base=[*s.base, f"train.max_steps={steps}", f"train.eval_every={every}",
                                    f"train.warmup_steps={steps // 10}"])
            c0, t0 = time.process_time(), time.time()
            train_cell(cell, Cell(scalars.LNS_S, scalars.o.t.rate(d.centre(scalars.LNS_S, L)), 0, L))
            cpu[f"{steps}@{every}"], wall[f"{steps}@{every}"] = time.process_time() - c0, time.time() - t0
        short, long, halves = (f"{SHORT[0]}@{SHORT[0]}", f"{SHORT[1]}@{SHORT[1]}", f"{SHORT[0]}@{SHORT[0] // 2}")
        step = (cpu[long] - cpu[short]) / (SHORT[1] - SHORT[0])
        one_eval = max(cpu[halves] - cpu[short], 0.0)
        out[L] = (cpu[short] + (a.steps - SHORT[0]) * step + evals * one_eval) / 60
        print(json.dumps({"depth": L, "cpu_s": {k: round(v, 1) for k, v in cpu.items()},
                          "wall_s": {k: round(v, 1) for k, v in wall.items()}, "step_cpu_s": round(step, 4),
                          "eval_cpu_s": round(one_eval, 1), "cell_cpu_minutes": round(out[L], 1)}), flush=True)
    print(json.dumps(scalars.budget(d, out)))

if __name__ == "__main__":
    from depthlab.cli import run_script
    sys.exit(run_script(main))
