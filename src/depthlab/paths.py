"""What a path is: the file names of every on-disk output, the kind of a directory (`what_is`), decided here and
nowhere else, and the model a path names.

    checkpoint   a directory with meta.json (the trainer's checkpoints/step_N, `depthlab import` output)
    run          a directory with checkpoints/, or a started run (a depthlab config.json with metrics/env)
    runs         a directory whose subdirectories include runs (train's default --out, `runs/`)
    hf           a Hugging Face model directory (a config.json that is not depthlab's)
    prepared     `depthlab data prepare` output, finished (index.json) or not (.work/plan.json)
    analysis     `depthlab analyze` / `compare` output (report.html)

A model path (`model_path`) is a checkpoint; a run (its newest valid checkpoint); a directory holding exactly one
run (that run); or an HF directory. Anything else is one error line naming what it is. Loading the model is
depthlab.loading's (a depthlab checkpoint) and depthlab.loading's (any model path); writing into a directory,
depthlab.ownership's.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from pathlib import Path

from depthlab import UserError
from depthlab.checkpoint import CHECKPOINTS, CONFIG, META, WEIGHTS, newest_valid_checkpoint, warn

# file names, defined once (the checkpoint's own are depthlab.checkpoint's)
METRICS, ENV = "metrics.jsonl", "env.json"
VAL_TOKENS = "val_tokens.npy"  # a run's validation tokens, kept when it tokenized raw text (eval reuses them)
PREPARED_INDEX, PREPARED_WORK, PREPARED_PLAN, PREPARED_FORMAT = "index.json", ".work", "plan.json", \
    "depthlab-tokens"
EXPORT_INFO = "depthlab_export.json"  # provenance of an HF directory depthlab wrote (export, prune, duplicate)
GREEDY_RECORD = "greedy_pruning.json"  # `prune --greedy`'s steps, beside the pruned model
ANALYSIS_REPORT, ANALYSIS_RESULTS = "report.html", ("metrics.json", "compare.json")
LOCK_SUFFIX = ".depthlab-lock"


class Kind(enum.Enum):
    MISSING = "a path that does not exist"
    FILE = "a file"
    EMPTY = "an empty directory"
    CHECKPOINT = "a depthlab checkpoint"
    RUN = "a depthlab run directory"
    RUNS = "a directory of runs"
    HF = "a Hugging Face model directory"
    PREPARED = "a prepared-data directory"
    ANALYSIS = "an analysis report folder"
    OTHER = "a directory of other files"


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _config_owner(path: Path) -> str | None:
    """'depthlab' or 'hf' for the directory's config.json, None without one."""
    if not (path / CONFIG).is_file():
        return None
    d = read_json(path / CONFIG)
    return "depthlab" if isinstance(d, dict) and "model" in d and "model_type" not in d else "hf"


def what_is(path: str | Path) -> Kind:
    """What kind of path this is; see the module docstring."""
    p = Path(path)
    if not p.exists():
        return Kind.MISSING
    if not p.is_dir():
        return Kind.FILE
    owner = _config_owner(p)
    if (p / META).is_file() or ((p / WEIGHTS).is_file() and owner == "depthlab"):
        return Kind.CHECKPOINT
    if (p / CHECKPOINTS).is_dir() or (owner == "depthlab" and ((p / METRICS).is_file() or (p / ENV).is_file())):
        return Kind.RUN
    index = read_json(p / PREPARED_INDEX) if (p / PREPARED_INDEX).is_file() else None
    if (isinstance(index, dict) and index.get("format") == PREPARED_FORMAT) or \
            (p / PREPARED_WORK / PREPARED_PLAN).is_file():
        return Kind.PREPARED
    if owner == "hf":
        return Kind.HF
    if (p / ANALYSIS_REPORT).is_file() and any((p / f).is_file() for f in ANALYSIS_RESULTS):
        return Kind.ANALYSIS
    entries = list(p.iterdir())
    if not entries:
        return Kind.EMPTY
    if any(e.is_dir() and what_is(e) is Kind.RUN for e in entries):
        return Kind.RUNS
    return Kind.OTHER


def runs_in(path: Path) -> list[Path]:
    return sorted(e for e in Path(path).iterdir() if e.is_dir() and what_is(e) is Kind.RUN)


def run_of(ckpt: Path) -> Path | None:
    """The run directory holding a checkpoint (RUN/checkpoints/step_N), or None for a checkpoint on its own."""
    ckpt = Path(ckpt)
    home = ckpt.parent.parent
    return home if ckpt.parent.name == CHECKPOINTS and what_is(home) is Kind.RUN else None


# ---------------------------------------------------------------- model paths
WANT_MODEL = "a depthlab checkpoint or run directory, a directory holding one run, or a Hugging Face model directory"


def not_a_model(p: Path, kind: Kind) -> str:
    if kind is Kind.MISSING:
        return f"model path {p} does not exist"
    if kind is Kind.FILE:
        return f"{p} is a file, not a model: give {WANT_MODEL}"
    return f"{p} is neither a checkpoint nor a run directory: it is {kind.value}; give {WANT_MODEL}"


def model_path(path: str | Path, hf: bool = True, warn: Callable[[str], None] = warn) -> tuple[Kind, Path]:
    """(CHECKPOINT, checkpoint dir) or (HF, model dir) for what a user gave as a model; one error line otherwise.
    A run means its newest valid checkpoint, a directory holding one run that run. hf=False: only depthlab."""
    p, kind, what = Path(path), what_is(path), Kind.HF.value
    if kind in (Kind.FILE, Kind.OTHER):  # a GGUF file, or a folder holding one: its dequantized HF directory
        from depthlab.gguf import dequantized, gguf_file

        if (gguf := gguf_file(p)) is not None:
            what = "a GGUF file" if gguf == p else f"a folder holding a GGUF file ({gguf.name})"
            p, kind = dequantized(p) if hf else p, Kind.HF
    if kind is Kind.RUNS:
        runs = runs_in(p)
        if len(runs) > 1:
            raise UserError(f"{p} holds {len(runs)} runs: {', '.join(r.name for r in runs)}; name one of them")
        p, kind = runs[0], Kind.RUN
    if kind is Kind.RUN:
        skipped: list[str] = []
        ckpt = newest_valid_checkpoint(p, skipped.append)
        if ckpt is None:  # one line for all of them, not a warning per checkpoint and then the error
            why = f"{len(skipped)} corrupted, the newest: {skipped[0].split('skipping ')[-1]}" if skipped else \
                "none written yet"
            raise UserError(f"{p} is a run directory with no valid checkpoint ({why})")
        for msg in skipped:
            warn(msg)
        return Kind.CHECKPOINT, ckpt
    if kind is Kind.CHECKPOINT or (kind is Kind.HF and hf):
        return kind, p
    if kind is Kind.HF:
        raise UserError(f"{p} is {what}, not a depthlab checkpoint; to train from it, "
                        f"import it (`depthlab import {p} OUT_DIR`) and start with --init-from OUT_DIR")
    raise UserError(not_a_model(p, kind))


def find_checkpoint(path: str | Path) -> Path:
    """The depthlab checkpoint a model path names (see model_path)."""
    return model_path(path, hf=False)[1]


def short_names(paths, flag: str, taken=()) -> list[str]:
    """A name for each of the files `paths` that tells it from the others and from the names `taken`, for results
    keyed by name: its stem, or, where stems collide, its stem after as many of its folders as tell them apart
    (`arc/test`, `piqa/test`). The same file twice, or a name that cannot be told apart, is one line naming `flag`."""
    real = [Path(p).expanduser().resolve() for p in paths]
    for i, r in enumerate(real):
        if r in real[:i]:
            raise UserError(f"{flag} names {paths[real.index(r)]} twice ({paths[i]}); give each file once")
    names = [r.stem for r in real]
    for depth in range(1, max((len(r.parts) for r in real), default=1)):
        clash = {n for n in names if names.count(n) > 1}
        if not clash:
            break
        names = [str(Path(*r.parts[-1 - depth:-1], r.stem)) if n in clash else n for n, r in zip(names, real)]
    for i, (n, p) in enumerate(zip(names, paths)):
        if n in taken or n in names[:i]:
            raise UserError(f"{flag}: the results of {p} would be named {n!r}, as another task's are; rename the "
                            "file")
    return names
