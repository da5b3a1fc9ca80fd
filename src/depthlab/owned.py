"""Writing into directories without taking what is not ours: advisory locks, the one ownership rule, and outputs
written whole.

Every command that writes a run or an output directory holds its advisory lock (`locked`: fcntl.flock on a sibling
`.NAME.depthlab-lock`, released by the OS when the holder dies, even by SIGKILL), so a second writer fails at once
naming the holder's PID. Whether a command may write a directory is decided by `claim`, for every writer (train's
run directory, `data prepare --out`, export, prune, import, every `--out`): never one of its inputs, never a file;
a missing or empty directory, the command's own kind of output, or, with --overwrite, any directory. Outputs are
written whole (`writing`): into a temporary sibling that replaces the target only when complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from depthlab import UserError
from depthlab.checkpoint import usual_mode
from depthlab.paths import ANALYSIS_RESULTS, EXPORT_INFO, LOCK_SUFFIX, Kind, what_is

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
          inputs: Iterable[str | Path] = (), *, choose: str | None = None, output: str | None = None,
          anyway: str = "to replace it") -> Kind:
    """The one ownership rule: check that `what` may write `out`: never one of its `inputs` (nor inside or above
    one), never a file; missing, empty, its own kind of output (`own`), or any directory with --overwrite. Returns
    what `out` is, for the caller's own next step (train continues a run it owns, prepare reuses its own data).
    The errors name the option to change (`choose`, default: another path / directory), the caller's `output`
    (default: "WHAT output") and what --overwrite does (`anyway`)."""
    refuse_own_input(out, inputs, what)
    kind = what_is(out)
    if kind is Kind.FILE:
        raise UserError(f"{out} is a file; {what} writes a directory there: choose another {choose or 'path'}")
    if kind in (Kind.MISSING, Kind.EMPTY) or overwrite or own(out):
        return kind
    raise UserError(f"{out} is {kind.value}, not {output or what + ' output'}; choose another "
                    f"{choose or 'directory'}, or pass --overwrite {anyway}")


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
