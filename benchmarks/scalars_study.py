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
MEASURED = "measured.jsonl"  # under RUNS_DIR/measure: one line per depth measured (its short cells' CPU and wall s)
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
    """Minutes of core time a full cell takes at each depth, from short lns+scalars cells at the arm's centre rate in
    a scratch folder under the runs dir (no record here). At every depth: SHORT[0] steps, evaluated and probed at the
    end (the cell's fixed part: corpus, evaluation, per-document losses, the probe, whose removal plans grow faster
    than N). At the study's two shallowest depths also SHORT[1] steps and SHORT[0] steps evaluated half-way too, whose
    differences from the first are a step's and an evaluation's time; deeper, those two are the line through the
    two shallowest depths' (a block's work is the same at every depth), which spares the deep cells' long runs.
    Core time is this process's CPU time (one torch thread, as a study's cell), which a shared machine inflates far
    less than wall time (kept beside it). Each depth's runs are appended to RUNS_DIR/measure/MEASURED (a rerun
    measures only the depths it lacks, so depths may run in parallel processes); the minutes per depth
    (CELL_MINUTES) and the budget are printed once every depth is there."""
    s = replace(s, out=str(Path(a.runs_dir) / "measure"), runs_dir=str(Path(a.runs_dir) / "measure"), ckpt_every=0)
    log = Path(s.out) / MEASURED
    read = lambda: {r["depth"]: r for r in map(json.loads, log.read_text().splitlines())} if log.exists() else {}  # noqa: E731
    full = sorted(scalars.Design().depths)[:2]
    for L in [L for L in d.depths if L not in read()]:
        cpu, wall = {}, {}
        for steps, every in [(SHORT[0], SHORT[0])] + [(SHORT[1], SHORT[1]), (SHORT[0], SHORT[0] // 2)] * (L in full):
            cell = replace(s, base=[*s.base, f"train.max_steps={steps}", f"train.eval_every={every}",
                                    f"train.warmup_steps={steps // 10}"])
            c0, t0 = time.process_time(), time.time()
            train_cell(cell, Cell(scalars.LNS_S, scalars.o.t.rate(d.centre(scalars.LNS_S, L)), 0, L))
            cpu[f"{steps}@{every}"], wall[f"{steps}@{every}"] = time.process_time() - c0, time.time() - t0
        row = {"depth": L, "cpu_s": {k: round(v, 1) for k, v in cpu.items()},
               "wall_s": {k: round(v, 1) for k, v in wall.items()}}
        print(json.dumps(row), flush=True)
        with log.open("a") as f:
            f.write(json.dumps(row) + "\n")
    rows = read()
    if any(L not in rows for L in (*full, *d.depths)):
        return
    short, long, halves = (f"{SHORT[0]}@{SHORT[0]}", f"{SHORT[1]}@{SHORT[1]}", f"{SHORT[0]}@{SHORT[0] // 2}")
    per = {L: ((rows[L]["cpu_s"][long] - rows[L]["cpu_s"][short]) / (SHORT[1] - SHORT[0]),
               max(rows[L]["cpu_s"][halves] - rows[L]["cpu_s"][short], 0.0)) for L in full}
    (l1, (s1, e1)), (l2, (s2, e2)) = sorted(per.items())
    minutes = {}
    for L in d.depths:
        step, one_eval = per.get(L) or (s1 + (s2 - s1) * (L - l1) / (l2 - l1),
                                        max(e1 + (e2 - e1) * (L - l1) / (l2 - l1), 0.0))  # an evaluation is never < 0
        evals = a.steps // a.eval_every - 1  # a full cell's evaluations besides the last
        minutes[L] = (rows[L]["cpu_s"][short] + (a.steps - SHORT[0]) * step + evals * one_eval) / 60
        print(json.dumps({"depth": L, "step_cpu_s": round(step, 4), "eval_cpu_s": round(one_eval, 1),
                          "from": "measured" if L in per else f"the line through N = {l1} and {l2}",
                          "cell_cpu_minutes": round(minutes[L], 1)}))
    print(json.dumps(scalars.budget(d, minutes)))

if __name__ == "__main__":
    from depthlab.cli import run_script
    sys.exit(run_script(main))
