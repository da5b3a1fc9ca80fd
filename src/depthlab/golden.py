"""Golden losses: does today's code still train the same?

tests/golden/losses.json holds the per-step training losses of 100 steps of a small fp32 CPU run (one thread,
fixed seeds, a corpus generated here and the tokenizer stored beside the file: nothing is downloaded) for every
registered scheme, and of one 2-rank FSDP run under torchrun on gloo.

    python -m depthlab.golden check                  today's code against the file, within each case's spread
    python -m depthlab.golden check --bitwise        exactly the file: on the machine that made it
    python -m depthlab.golden check --atol 0.05 --set train.dtype=bf16     another tolerance: bf16, another torch
    python -m depthlab.golden compare HEAD~1 .       two commits ("." is the working tree), or two configs:
    python -m depthlab.golden compare . . --set-b train.lr=0.004
    python -m depthlab.golden regen                  the one command that rewrites the file (--cases to add one)

Each reports, per case, the first differing step and the largest difference. check's default tolerance is the
spread of the losses under other CPUs' kernels (another vector width, GEMM kernel or thread count: measured by
benchmarks/golden_spread.py) times a safety factor, so the documented command gives no false alarm on another
machine while a one-line change to the forward still fails it (docs/golden.md). `--bitwise` is for the machine
that made the file, where a refactor meant to be neutral should be exactly neutral; `compare` runs both sides on
one machine and is bitwise by default. A commit that moves the losses on purpose regenerates the file and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from depthlab import UserError

SRC = Path(__file__).resolve().parents[1]  # the src/ directory this file is in
GOLDEN = SRC.parent / "tests" / "golden"
FILE = GOLDEN / "losses.json"
TOKENIZER = GOLDEN / "tokenizer.json"
STEPS = 100
SPREAD = SRC.parent / "benchmarks" / "results" / "golden_spread.json"  # benchmarks/golden_spread.py measures it
SAFETY, FLOOR = 10, 1e-5  # check's default tolerance of a case: SAFETY x its spread, at least FLOOR (docs/golden.md)
BASE = {"model.dim": 32, "model.n_layers": 4, "model.n_heads": 2, "model.ffn_dim": 64, "model.vocab_size": 300,
        "data.seq_len": 32, "train.batch_size": 4, "train.max_steps": STEPS, "train.warmup_steps": 10,
        "train.log_every": 1, "train.eval_every": 1000, "train.monitor_every": 0, "train.threads": 1,
        "train.peak_flops": 1.0, "train.device": "cpu", "train.dtype": "fp32"}  # peak_flops: skip measuring one


@dataclass(frozen=True)
class Case:
    name: str
    sets: tuple[str, ...]  # KEY=VALUE overrides on top of BASE
    world: int = 1  # > 1: under torchrun, gloo


def cases() -> dict[str, Case]:
    """One run per registered scheme, a 2-rank FSDP run of lns (each rank 2 of the 4 sequences), lns under
    train.optimizer=muon and lns with the stream scalars."""
    from depthlab.model.schemes import SCHEMES

    out = {s: Case(s, (f"model.norm_scheme={s}",)) for s in SCHEMES}
    out["fsdp2-lns"] = Case("fsdp2-lns", ("model.norm_scheme=lns", "train.parallel=fsdp", "train.batch_size=2"), 2)
    out["muon-lns"] = Case("muon-lns", ("model.norm_scheme=lns", "train.optimizer=muon"))  # torch.optim.Muon's step
    # the stream scalars (model.resid_lambda, model.x0_lambda) on lns, in their own AdamW groups
    out["scalars-lns"] = Case("scalars-lns", ("model.norm_scheme=lns", "model.resid_lambda=true",
                                              "model.x0_lambda=true"))
    return out


def corpus_text() -> str:
    """The training text: 1,500 lines of words drawn with random.Random(0).random(), which Python keeps stable
    across versions (choice() is not promised to)."""
    import random

    words = ("the quick brown fox jumps over a lazy dog and cat sat on mat while birds sing in green trees "
             "under old bridges near quiet rivers").split()
    rng = random.Random(0)
    return "\n".join(" ".join(words[int(rng.random() * len(words))] for _ in range(12)) for _ in range(1500)) + "\n"


def case_args(case: Case, corpus: Path, extra: list[str]) -> list[str]:
    sets = [f"{k}={v}" for k, v in BASE.items()] + list(case.sets) + [f"data.tokenizer={TOKENIZER}"] + extra
    return ["train", "--data", str(corpus), "--no-progress", *(a for s in sets for a in ("--set", s))]


class _Stop(Exception):
    pass


def train_losses(argv: list[str], steps: int = STEPS) -> list[float]:
    """The per-step losses of `depthlab train ARGV` (this rank's part of it under torchrun), stopped after
    `steps` steps: fewer steps are the first steps of the full run, its learning-rate schedule unchanged."""
    from depthlab.cli import build_config, make_parser
    from depthlab.train.callbacks import Callback
    from depthlab.train.distributed import shutdown
    from depthlab.train.trainer import Trainer

    losses: list[float] = []

    class Record(Callback):
        def on_step_start(self, trainer, step):
            if step > steps:
                raise _Stop

        def on_log(self, trainer, step, record):
            losses.append(record["loss"])

    threads = _num_threads()
    trainer = Trainer(build_config(make_parser().parse_args(argv)), run_dir=argv[argv.index("--run-dir") + 1],
                      progress=False)
    trainer.callbacks.append(Record())  # on every rank (the trainer keeps other callbacks on rank 0 only)
    try:
        with contextlib.suppress(_Stop):
            trainer.train()
    finally:
        trainer.close()
        shutdown(trainer.env)
        _num_threads(threads)
    return losses


def _child(argv: list[str]) -> list[str]:
    """A command running this file's command line with whichever depthlab is on PYTHONPATH (a file run as a
    script would put src/depthlab/ itself first on sys.path, where config.py and paths.py shadow others)."""
    return [sys.executable, "-c", f"import runpy, sys; sys.argv = {['golden', *argv]!r}; "
                                  f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')"]


def run_case(case: Case, work: Path, extra: list[str] = (), steps: int = STEPS) -> list[float]:
    """The case's first `steps` losses from the depthlab importable now: in this process for one rank, under
    torchrun (gloo, one thread per rank) for more."""
    corpus, run = work / "corpus.txt", work / case.name
    if not corpus.exists():
        corpus.write_text(corpus_text())
    argv = case_args(case, corpus, list(extra)) + ["--run-dir", str(run)]
    if case.world == 1:
        out = io.StringIO()  # the trainer's banner and warnings; a user's error says which case it was
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                return train_losses(argv, steps)
        except UserError as e:
            raise UserError(f"golden case {case.name} did not train: {e}") from None
    losses = work / f"{case.name}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(case.world), "--no-python", *_child(["rank", "--out", str(losses), "--steps",
                                                                    str(steps), "--", *argv])],
                          env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stdout.splitlines()]
        why = [line for line in lines if "Error" in line or "error:" in line] or [line for line in lines if line]
        raise UserError(f"golden case {case.name} did not train under torchrun: {(why or ['no output'])[-1]}")
    return json.loads(losses.read_text())


def _num_threads(n: int | None = None) -> int:
    import torch

    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def known_cases(names: list[str] | None) -> dict[str, Case]:
    """The cases `names` asks for (None: all), in its order; a name that is no case is refused, naming them all."""
    known = cases()
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise UserError(f"unknown golden case(s) {', '.join(unknown)}; the cases are {', '.join(known)}")
    return {n: known[n] for n in names or known}


def run_cases(names: list[str], extra: list[str] = (), steps: int = STEPS) -> dict[str, list[float]]:
    known = known_cases(names)
    with tempfile.TemporaryDirectory(prefix="depthlab-golden-") as tmp:
        return {n: run_case(known[n], Path(tmp), extra, steps) for n in names}


# ---------------------------------------------------------------- comparing
def differences(name: str, got: list[float], want: list[float], atol: float = 0.0, rtol: float = 0.0) -> str | None:
    """None when `got` matches `want` step for step (bitwise with atol = rtol = 0), else one line: the first
    step that differs and the largest difference."""
    if len(got) != len(want):
        return f"{name}: {len(got)} steps logged, expected {len(want)}"
    bad = [i for i, (g, w) in enumerate(zip(got, want, strict=True))
           if not (g == w or abs(g - w) <= atol + rtol * abs(w))]
    if not bad:
        return None
    i = bad[0]
    diffs = [abs(g - w) if math.isfinite(g - w) else math.inf for g, w in zip(got, want, strict=True)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    return (f"{name}: first differing step {i + 1} ({got[i]!r} vs {want[i]!r}), largest difference "
            f"{diffs[worst]:.3g} at step {worst + 1}; {len(bad)} of {len(want)} steps differ")


def default_atol() -> dict[str, float]:
    """check's default tolerance per case: SAFETY times the largest difference from the file that another CPU's
    kernels made in its losses (SPREAD: every variant measured, over the file's steps), at least FLOOR."""
    measured = json.loads(SPREAD.read_text())["variants"].values() if SPREAD.is_file() else []
    return {n: max([FLOOR, *(SAFETY * v["cases"][n]["max_abs_diff"] for v in measured if n in v["cases"])])
            for n in cases()}


def compare_runs(got: dict[str, list[float]], want: dict[str, list[float]], atol: float | dict[str, float] = 0.0,
                 rtol: float = 0.0) -> list[str]:
    """One line per case that `got` and `want` do not both hold, or where they differ."""
    out = []
    for name in {**want, **got}:
        if name not in got or name not in want:
            out.append(f"{name}: not run by {'the first' if name not in got else 'the second'}")
        elif (line := differences(name, got[name], want[name], atol[name] if isinstance(atol, dict) else atol,
                                  rtol)) is not None:
            out.append(line)
    return out


def load_golden(path: Path = FILE) -> dict:
    """The golden file; one line when there is none or it is not one (cut short, edited): git restores it."""
    if not path.is_file():
        raise UserError(f"no golden losses file at {path}" + (": run `python -m depthlab.golden regen` in a "
                                                              "depthlab checkout" if path == FILE else ""))
    try:
        golden = json.loads(path.read_text())
        if not all(isinstance(c["sets"], list) and len(c["losses"]) == golden["steps"] and
                   all(isinstance(x, (int, float)) for x in c["losses"]) for c in golden["cases"].values()):
            raise TypeError
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        why = f"not JSON: {e}" if isinstance(e, ValueError) else "not the layout regen writes"
        raise UserError(f"{path} is not a golden losses file ({why}); restore it (git checkout -- {path}) or "
                        "rewrite it (python -m depthlab.golden regen)") from None
    return golden


def check(names: list[str] | None = None, atol: float | None = None, rtol: float = 0.0, steps: int = STEPS,
          extra: list[str] = (), path: Path = FILE) -> list[str]:
    """Today's code against the golden file's first `steps` steps, with `extra` overrides (train.dtype=bf16 and a
    tolerance, say): the problem lines (none: it trains the same). `atol` None: each case's default_atol."""
    known = known_cases(names)
    golden = load_golden(path)
    names = list(known)
    problems = [f"{n}: no golden losses (a new case: `python -m depthlab.golden regen --cases {n}`)"
                for n in names if n not in golden["cases"]]
    problems += [f"{n}: its config changed since the file was made: regenerate it" for n in names
                 if n in golden["cases"] and golden["cases"][n]["sets"] != list(known[n].sets)]
    if problems:
        return problems
    if golden.get("base") != [f"{k}={v}" for k, v in BASE.items()] or golden.get("steps") != STEPS:
        return ["the base config changed since the file was made: regenerate it"]
    got = run_cases(names, extra, steps)
    return compare_runs(got, {n: golden["cases"][n]["losses"][:steps] for n in names},
                        default_atol() if atol is None else atol, rtol)


def made_with(rev: str | None = None) -> dict:
    import torch

    def git(*a):
        return subprocess.run(["git", "-C", str(SRC.parent), *a], capture_output=True, text=True).stdout.strip()

    dirty = bool(git("status", "--porcelain", "--", "src")) if rev is None else False
    return {"commit": git("rev-parse", rev or "HEAD"), "src_dirty": dirty, "torch": torch.__version__,
            "python": platform.python_version(), "machine": platform.machine(), "cpu": _cpu_name()}


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def regen(names: list[str] | None = None, rev: str | None = None, path: Path = FILE) -> dict:
    """Rewrite the golden file from the working tree's code (or commit `rev`'s); with `names`, only those cases,
    the others kept."""
    names, known = list(known_cases(names)), cases()
    old = load_golden(path) if path.is_file() and set(names) != set(known) else {"cases": {}}  # the kept cases
    losses = run_cases(names) if rev is None else run_rev(rev, names)
    golden = {"about": "per-step training losses, fp32 CPU, one thread; check: python -m depthlab.golden check; "
                       "regenerate: python -m depthlab.golden regen (see src/depthlab/golden.py)",
              "steps": STEPS, "base": [f"{k}={v}" for k, v in BASE.items()], "made_with": made_with(rev),
              "cases": {n: old["cases"][n] if n not in names else
                        {"sets": list(known[n].sets), "world": known[n].world, "losses": losses[n]}
                        for n in known if n in names or n in old["cases"]}}
    one_line = re.sub(r"\[\s+([-+\d.e,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]",
                      json.dumps(golden, indent=1))  # each case's losses on one line
    path.write_text(one_line + "\n")
    return golden


# ---------------------------------------------------------------- another commit's code
@contextlib.contextmanager
def source_of(rev: str):
    """A src/ directory holding commit `rev`'s code ("." : this working tree's), in a temporary directory."""
    if rev == ".":
        yield SRC
        return
    repo = str(SRC.parent)
    sha = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                         capture_output=True, text=True).stdout.strip()
    if not sha:
        raise UserError(f"{rev!r} is not a commit of {repo} (give a commit, a branch, or . for the working tree)")
    with tempfile.TemporaryDirectory(prefix=f"depthlab-golden-{sha[:10]}-") as tmp:
        # git archive, not git worktree: a killed run leaves no worktree registered in the shared repository
        archive = subprocess.run(["git", "-C", repo, "archive", sha, "src"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp) / "src"


def run_rev(rev: str, names: list[str], extra: list[str] = (), steps: int = STEPS) -> dict[str, list[float]]:
    """The cases' losses from commit `rev`'s depthlab: this file's runner in a child process whose depthlab
    is that commit's (so a commit from before this file existed can be compared too)."""
    with source_of(rev) as src, tempfile.TemporaryDirectory(prefix="depthlab-golden-out-") as tmp:
        out = Path(tmp) / "losses.json"
        argv = ["run", "--out", str(out), "--steps", str(steps), "--cases", *names,
                *(a for s in extra for a in ("--set", s))]
        env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(_child(argv), cwd=tmp, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise UserError(f"the golden cases did not run on {rev}: "
                            f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
        return json.loads(out.read_text())


def compare(a: str, b: str, names: list[str], set_a: list[str], set_b: list[str], atol: float = 0.0,
            rtol: float = 0.0, steps: int = STEPS) -> list[str]:
    """The problem lines of run A against run B (each a commit or "." with its own overrides)."""
    return compare_runs(run_rev(a, names, set_a, steps), run_rev(b, names, set_b, steps), atol, rtol)


# ---------------------------------------------------------------- command line
def _parser() -> argparse.ArgumentParser:
    from depthlab.cli import Parser  # the CLI's one-line errors; its float flags refuse NaN and inf
    from depthlab.flags import at_least, non_negative

    p = Parser(prog="python -m depthlab.golden", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True)

    def with_cases(s, atol: str | None = None):
        s.add_argument("--cases", nargs="+", metavar="CASE", help="these cases only (default: all: every scheme, "
                                                                 "fsdp2-lns)")
        s.add_argument("--steps", type=at_least(1, STEPS), default=STEPS, metavar=f"1..{STEPS}",
                       help=f"the first N steps of the {STEPS}-step runs (the same schedule, stopped early)")
        if atol is not None:  # parsed as None when not given: check's --bitwise needs to tell
            s.add_argument("--atol", type=non_negative, help=f"absolute tolerance on each loss (default: {atol})")
            s.add_argument("--rtol", type=non_negative, default=0.0, help="relative tolerance on each loss (default 0)")
        return s

    k = with_cases(sub.add_parser("check", help="today's code against tests/golden/losses.json, within each "
                                                "case's spread on other CPUs (--bitwise: on the machine that made "
                                                "it)"), f"{SAFETY} x the case's measured spread, at least {FLOOR:g}")
    k.add_argument("--bitwise", action="store_true", help="exactly the file's losses (atol = rtol = 0): on the "
                                                          "machine that made it, for a change meant to be neutral")
    k.add_argument("--file", type=Path, default=FILE, help="the golden file (default tests/golden/losses.json)")
    k.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for every case (train.dtype=bf16 train.device=cuda, with a tolerance)")
    c = with_cases(sub.add_parser("compare", help="two commits (. is the working tree) or two configs, on this "
                                                  "machine (bitwise by default)"), "0")
    c.add_argument("a", help="a commit, or . for the working tree")
    c.add_argument("b", help="a commit, or . for the working tree")
    c.add_argument("--set-a", action="append", default=[], metavar="KEY=VALUE", help="an override for run A")
    c.add_argument("--set-b", action="append", default=[], metavar="KEY=VALUE", help="an override for run B")
    r = sub.add_parser("regen", help="rewrite tests/golden/losses.json")
    r.add_argument("--cases", nargs="+", metavar="CASE", help="these cases only, the others kept (default: all)")
    r.add_argument("--rev", help="from this commit's code instead of the working tree's")
    run = with_cases(sub.add_parser("run", help="(compare's child process)"))
    run.add_argument("--out", required=True)
    run.add_argument("--set", action="append", default=[])
    rank = sub.add_parser("rank", help="(one torchrun rank of a case)")
    rank.add_argument("--out", required=True)
    rank.add_argument("--steps", type=int, required=True)
    rank.add_argument("train", nargs=argparse.REMAINDER)
    return p


def _report(problems: list[str], what: str) -> int:
    for line in problems:
        print(line)
    print(f"golden: {what}: {'the same' if not problems else f'{len(problems)} case(s) differ'}")
    return 1 if problems else 0


def _command(args) -> int:
    if args.command == "check":
        if args.bitwise and (args.atol is not None or args.rtol):
            raise UserError("--bitwise is atol 0 and rtol 0: give it or a tolerance, not both")
        atol, rtol = (0.0, 0.0) if args.bitwise else (args.atol, args.rtol)
        tol = ("bitwise" if args.bitwise else f"atol {atol:g}, rtol {rtol:g}" if atol is not None else
               f"each case's atol: {SAFETY} x its measured spread, at least {FLOOR:g}; rtol {rtol:g}")
        return _report(check(args.cases, atol, rtol, args.steps, args.set, args.file),
                       f"today's code against {args.file.name}, {args.steps} steps ({tol})")
    if args.command == "compare":
        names = list(known_cases(args.cases))  # today's names (a commit without one of them: "not run")
        return _report(compare(args.a, args.b, names, args.set_a, args.set_b, args.atol or 0.0, args.rtol,
                               args.steps),
                       " against ".join(" ".join([rev, *sets]) for rev, sets in ((args.a, args.set_a),
                                                                                 (args.b, args.set_b))))
    if args.command == "regen":
        golden = regen(args.cases, args.rev)
        print(f"wrote {FILE} ({len(golden['cases'])} cases x {STEPS} steps, commit {golden['made_with']['commit']})")
        return 0
    if args.command == "rank":
        losses = train_losses(args.train[1:] if args.train[:1] == ["--"] else args.train, args.steps)
        if int(os.environ.get("RANK", 0)) == 0:
            Path(args.out).write_text(json.dumps(losses))
        return 0
    names = [n for n in args.cases or cases() if n in cases()]  # a commit may lack a scheme: "not run"
    Path(args.out).write_text(json.dumps(run_cases(names, args.set, args.steps)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line; a mistake is one `depthlab: error:` line and exit status 2, as for every depthlab command
    (a value out of range is refused by the parser: `func` is then the refusal)."""
    from depthlab.cli import run_script

    args = _parser().parse_args(argv)
    done = []  # the command's own status: 1 when cases differ
    return run_script(lambda: done.append(getattr(args, "func", _command)(args))) or done[0]


if __name__ == "__main__":
    sys.exit(main())
