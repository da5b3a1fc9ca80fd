"""Run directories and every other path a command is given: what a path is, loading a model from it, and
writing into directories without taking what is not ours.

What a path is (`what_is`), decided here and nowhere else:

    checkpoint   a directory with meta.json (the trainer's checkpoints/step_N, `depthlab import` output)
    run          a directory with checkpoints/, or a started run (a depthlab config.json with metrics/env)
    runs         a directory whose subdirectories include runs (train's default --out, `runs/`)
    hf           a Hugging Face model directory (a config.json that is not depthlab's)
    prepared     `depthlab data prepare` output, finished (index.json) or not (.work/plan.json)
    analysis     `depthlab analyze` / `compare` output (report.html)

A model path (`model_path`, `load_model`) is a checkpoint; a run (its newest valid checkpoint); a directory
holding exactly one run (that run); or an HF directory. Anything else is one error line naming what it is.

Writers. Every command that writes a run or an output directory holds its advisory lock (`locked`: fcntl.flock
on a sibling `.NAME.depthlab-lock`, released by the OS when the holder dies, even by SIGKILL), so a second writer
fails at once naming the holder's PID. Outputs are written whole (`writing`): into a temporary sibling that
replaces the target only when complete, and only if the target is missing, empty or the command's own kind of
output (`claim`), unless the user passed --overwrite.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from depthlab import UserError
from depthlab.checkpoint import (  # noqa: F401 (the checkpoint format's names, re-exported for every command)
    CHECKPOINTS,
    CONFIG,
    META,
    SHARDS,
    TOKENIZER,
    TRAINER,
    WEIGHTS,
    CorruptCheckpoint,
    is_sharded,
    is_valid,
    list_checkpoints,
    load_verified,
    load_weights,
    newest_valid_checkpoint,
    previous_checkpoint,
    save_weights,
    usual_mode,
    verify_checkpoint,
    warn,
)

# ---------------------------------------------------------------- file names, defined once
METRICS, ENV = "metrics.jsonl", "env.json"
VAL_TOKENS = "val_tokens.npy"  # a run's validation tokens, kept when it tokenized raw text (eval reuses them)
PREPARED_INDEX, PREPARED_WORK, PREPARED_PLAN, PREPARED_FORMAT = "index.json", ".work", "plan.json", \
    "depthlab-tokens"
EXPORT_INFO = "depthlab_export.json"  # provenance of an HF directory depthlab wrote (export, prune)
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


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _config_owner(path: Path) -> str | None:
    """'depthlab' or 'hf' for the directory's config.json, None without one."""
    if not (path / CONFIG).is_file():
        return None
    d = _read_json(path / CONFIG)
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
    index = _read_json(p / PREPARED_INDEX) if (p / PREPARED_INDEX).is_file() else None
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
    p, kind = Path(path), what_is(path)
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
        raise UserError(f"{p} is a Hugging Face model directory, not a depthlab checkpoint; to train from it, "
                        f"import it (`depthlab import {p} OUT_DIR`) and start with --init-from OUT_DIR")
    raise UserError(not_a_model(p, kind))


def find_checkpoint(path: str | Path) -> Path:
    """The depthlab checkpoint a model path names (see model_path)."""
    return model_path(path, hf=False)[1]


# ---------------------------------------------------------------- loading
@dataclass
class Loaded:
    """A model loaded from any model path, with what every command needs around it."""

    model: object  # a depthlab Transformer, or a transformers PreTrainedModel (kind HF)
    tokenizer: object | None  # tokenizers.Tokenizer (depthlab; None without tokenizer.json), transformers' (HF)
    kind: Kind  # CHECKPOINT or HF
    path: Path  # the checkpoint or HF directory that was loaded
    cfg: object | None = None  # the depthlab Config (None for HF)
    meta: dict = field(default_factory=dict)

    @property
    def context(self) -> int:
        """The longest window the model takes."""
        return self.cfg.model.max_seq_len if self.cfg is not None else hf_context(self.model.config)

    @property
    def seq_len(self) -> int:
        """The default window: the run's own (a depthlab export records its run's), or for other HF models their
        context up to 512."""
        if self.cfg is not None:
            return self.cfg.data.seq_len
        info = _read_json(self.path / EXPORT_INFO) if self.kind is Kind.HF else None
        window = info.get("seq_len") if isinstance(info, dict) else None
        return min(window, self.context) if isinstance(window, int) and window > 0 else min(512, self.context)

    def lm(self):
        """The model as a module from token ids (B, T) to logits (B, T, V)."""
        return self.model if self.kind is Kind.CHECKPOINT else _logits_module(self.model)

    def fast_tokenizer(self):
        """The tokenizer as a `tokenizers.Tokenizer` (the packing and batch encoding use its batch API)."""
        if self.tokenizer is None:
            raise UserError(f"{self.path} has no {TOKENIZER}")
        return getattr(self.tokenizer, "backend_tokenizer", self.tokenizer)


def _logits_module(model):
    import torch

    class Logits(torch.nn.Module):
        """An HF causal LM returning bare logits, like depthlab's Transformer."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            return self.inner(input_ids=ids, use_cache=False).logits

    return Logits(model)


DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise UserError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return getattr(torch, name)


def load_model(path: str | Path, device: str = "cpu", dtype: str = "float32", hf: bool = True,
               trust_remote_code: bool = False, warn: Callable[[str], None] = warn) -> Loaded:
    """A model from any model path (see model_path), on `device` in `dtype`, in eval mode."""
    kind, p = model_path(path, hf=hf, warn=warn)
    if kind is Kind.HF:
        return _load_hf(p, device, dtype, trust_remote_code)
    model, cfg, meta = load_checkpoint(p, device=str(device))
    from depthlab.data.tokenizer import load_tokenizer

    tok = load_tokenizer(p / TOKENIZER) if (p / TOKENIZER).is_file() else None
    return Loaded(model.to(torch_dtype(dtype)).eval(), tok, Kind.CHECKPOINT, p, cfg, meta)


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple:
    """(model, config, meta) from a checkpoint or a run directory; the model is rebuilt with its saved scheme."""
    from depthlab.config import Config
    from depthlab.model import build_model
    from depthlab.train.lora import plain_weights  # a LoRA fine-tune's adapters merged into its weights

    ckpt = find_checkpoint(path)
    meta = load_verified(ckpt)
    cfg = Config.load(ckpt / CONFIG)
    model = build_model(cfg.model, init=False).to(device)
    missing, unexpected = model.load_state_dict(plain_weights(ckpt, device), strict=False)
    missing = [k for k in missing if not (cfg.model.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise UserError(f"checkpoint {ckpt} does not match its config: missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}")
    return model, cfg, meta


def quiet_transformers() -> None:
    """Commands print their own one-line summaries; transformers' per-load progress bars only add noise."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def _load_hf(p: Path, device: str, dtype: str, trust_remote_code: bool) -> Loaded:
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise UserError(f"{p} is a Hugging Face model directory; loading it needs `transformers` "
                        "(pip install depthlab[hf])")
    from depthlab.hf.apply import load_pretrained

    quiet_transformers()
    # load_pretrained: a model saved after apply_scheme comes back with its scheme; a plain one as plain HF
    model = load_pretrained(str(p), dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code)
    return Loaded(model.to(device).eval(), load_hf_tokenizer(p, trust_remote_code), Kind.HF, p)


def load_hf_tokenizer(p: Path, trust_remote_code: bool = False):
    """The transformers tokenizer saved with an HF model."""
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(p), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as e:
        raise UserError(f"{p}: no usable tokenizer in the model directory ({str(e).splitlines()[0]})") from None


def hf_context(config) -> int:
    """The longest window an HF model takes, from its config."""
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 512


# ---------------------------------------------------------------- writing: locks and whole outputs
_HELD: dict[Path, list] = {}  # lock file -> [fd, count]: a process may take its own lock again


def _lock_file(directory: Path) -> Path:
    d = Path(os.path.abspath(directory))
    return d.parent / f".{d.name}{LOCK_SUFFIX}"


def _make_parents(path: Path, label: str) -> list[Path]:
    """Create the missing parents of path; return those created, deepest first (to remove them again)."""
    made = []
    for parent in [p for p in reversed(Path(os.path.abspath(path)).parents) if not p.exists()]:
        try:
            parent.mkdir()
        except OSError as e:
            _remove_empty(made)
            raise UserError(f"cannot write to {label}{path}: {e.strerror or e} ({parent})") from None
        made.insert(0, parent)
    return made


def _remove_empty(dirs: list[Path]) -> None:
    for d in dirs:
        with contextlib.suppress(OSError):
            d.rmdir()


def _acquire(lock: Path, directory: Path, what: str, label: str) -> int:
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UserError(f"cannot write to {label}{directory}: {e.strerror or e} (creating {lock})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "pid unknown"
            os.close(fd)
            raise UserError(f"{directory} is in use by another depthlab process ({holder}); wait for it to finish, "
                            "or stop it") from None
        except OSError as e:  # ENOLCK / EOPNOTSUPP: a filesystem without flock (some NFS mounts)
            os.close(fd)
            raise UserError(f"cannot lock {label}{directory}: its filesystem does not support file locks "
                            f"({e.strerror or e}); use a directory on a filesystem with flock") from None
        try:  # its previous holder may have unlinked the file between our open and our lock: then take the new one
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()}, depthlab {what}".encode())
            return fd
        os.close(fd)


def lock_text(directory: str | Path) -> str | None:
    """What the holder of `directory`'s lock wrote into it (its PID and command), None without a lock file: how
    another process, on this host or another, checks that it sees the directory the holder writes."""
    try:
        return _lock_file(Path(directory)).read_text()
    except OSError:
        return None


@contextlib.contextmanager
def locked(directory: str | Path, what: str, label: str = "") -> Iterator[Path]:
    """Hold the advisory lock of `directory` (which need not exist yet) for the block; `what` names the command
    for the error a second writer gets, `label` what the directory is in a "cannot write to" error. Missing
    parents are created, and removed again if left empty."""
    directory = Path(directory)
    lock = _lock_file(directory)
    made = _make_parents(directory, label)
    held = _HELD.get(lock)
    if held:
        held[1] += 1
    else:
        try:
            _HELD[lock] = [_acquire(lock, directory, what, label), 1]
        except UserError:
            _remove_empty(made)
            raise
    try:
        yield directory
    finally:
        entry = _HELD[lock]
        entry[1] -= 1
        if entry[1] == 0:
            del _HELD[lock]
            with contextlib.suppress(OSError):
                lock.unlink()  # before the unlock, so that a waiter that took the old file retries
            os.close(entry[0])
            _remove_empty(made)


def claim(out: Path, own: Callable[[Path], bool], what: str, overwrite: bool = False,
          inputs: Iterable[str | Path] = ()) -> Kind:
    """Check that `what` may write `out`: never one of its `inputs` (nor inside or above one), never a file;
    missing, empty, its own kind of output, or any directory with --overwrite. Returns what `out` is."""
    refuse_own_input(out, inputs, what)
    kind = what_is(out)
    if kind is Kind.FILE:
        raise UserError(f"{out} is a file; {what} writes a directory there: choose another path")
    if kind in (Kind.MISSING, Kind.EMPTY) or overwrite or own(out):
        return kind
    raise UserError(f"{out} is {kind.value}, not {what} output; choose another directory, or pass --overwrite "
                    f"to replace it")


def refuse_own_input(out: Path, inputs: Iterable[str | Path], what: str, inside: bool = False) -> None:
    """A command never replaces what it reads (the path itself or a directory above it; with `inside`, a file
    within it too), --overwrite or not."""
    o = Path(os.path.realpath(out))
    for inp in inputs:
        i = Path(os.path.realpath(inp))
        if o == i or o in i.parents or (inside and i in o.parents):
            raise UserError(f"{out} is {what}'s own input ({inp}); write the output to another path")


def is_depthlab_hf(path: Path) -> bool:
    """An HF directory depthlab wrote (export or prune): the kind `export` and `prune` may replace."""
    return what_is(path) is Kind.HF and (path / EXPORT_INFO).is_file()


def is_analysis(path: Path) -> bool:
    """`depthlab analyze` output (compare's has compare.json instead of metrics.json)."""
    return what_is(path) is Kind.ANALYSIS and (path / ANALYSIS_RESULTS[0]).is_file()


def is_comparison(path: Path) -> bool:
    return what_is(path) is Kind.ANALYSIS and (path / ANALYSIS_RESULTS[1]).is_file()


@contextlib.contextmanager
def writing(out: str | Path, own: Callable[[Path], bool], what: str, overwrite: bool = False,
            inputs: Iterable[str | Path] = ()) -> Iterator[Path]:
    """Write the directory `out` whole: under its lock, after `claim`, the block writes into a fresh temporary
    sibling, which replaces `out` only when the block succeeds; on any failure nothing is left behind."""
    out = Path(out)
    with locked(out, what):
        claim(out, own, what, overwrite, inputs)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            yield tmp
            for f in tmp.rglob("*"):
                if f.is_file():
                    usual_mode(f)
            _swap_in(tmp, out)
        except OSError as e:
            raise UserError(f"cannot write {out}: {e.strerror or e}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def writing_files(outs: list[Path], own: Callable[[Path], bool], what: str, overwrite: bool = False,
                  inputs: Iterable[str | Path] = ()) -> Iterator[list[Path]]:
    """`writing` for single files: each of `outs` must be missing, or its own kind of output (`own`), or any file
    with --overwrite; never a directory, never an input. The block writes the temporary siblings it is given,
    which replace the targets only when it succeeds; on any failure the old files are intact."""
    outs = [Path(o) for o in outs]
    for out in outs:
        refuse_own_input(out, inputs, what, inside=True)
        if out.is_dir():
            raise UserError(f"{out} is a directory; {what} writes a file there: choose another path")
        if out.exists() and not (overwrite or own(out)):
            raise UserError(f"{out} exists and is not {what} output; choose another path, or pass --overwrite "
                            "to replace it")
    with locked(outs[0], what):  # the first file's lock; its directory is created if missing
        tmps = [o.parent / f".{o.name}.tmp-{os.getpid()}" for o in outs]
        try:
            yield tmps
            for tmp, out in zip(tmps, outs):
                usual_mode(tmp)
                os.replace(tmp, out)
        except OSError as e:
            raise UserError(f"cannot write {outs[0]}: {e.strerror or e}; the old files are intact") from None
        finally:
            for tmp in tmps:
                with contextlib.suppress(OSError):
                    tmp.unlink()


def _swap_in(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
