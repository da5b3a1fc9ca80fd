"""Writing into directories without taking what is not ours: advisory locks, the one ownership rule, and outputs
written whole.

Every command that writes a run or an output directory holds its advisory lock (`locked`: fcntl.flock on a sibling
`.NAME.depthlab-lock`, released by the OS when the holder dies, even by SIGKILL), so a second writer fails at once
naming the holder's PID. Whether a command may write a directory is decided by `claim`, for every writer (train's
run directory, `data prepare --out`, export, prune, import, every `--out`): never one of its inputs, never a file;
a missing or empty directory, the command's own kind of output, or, with --overwrite, any directory. What a command
reads and writes is declared on its options (each path option's argparse type is a PathRole: INPUT, OUTPUT,
FOLDER, PREFIX, CONTINUED, UPDATED, or a reading role of its own that finds the files a spec names), and the CLI's
parser refuses a written path inside, above or at a read one before the command runs (`path_refusal`); commands
check again what they only know later (a default path). Outputs are
written whole (`writing`, `writing_files`; `write_whole` for a small file such as a settings or
records file): into a temporary sibling that replaces the target only when complete.

Paths are compared as the filesystem sees them (`Path.resolve`: symlinks followed), so a lock, an ownership check
or an own-input check cannot be walked around through a link. A writer killed before it could tidy up (SIGKILL,
power loss) leaves a hidden `.NAME.tmp-PID` or `.NAME.old-PID` and its lock file; the next writer into the same
folder clears them, for every name whose lock nobody holds (`_tidy_leftovers`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from depthlab import UserError
from depthlab.checkpoint import usual_mode
from depthlab.paths import ANALYSIS_RESULTS, EXPORT_INFO, LOCK_SUFFIX, Kind, what_is

_HELD: dict[Path, list] = {}  # lock file -> [fd, count]: a process may take its own lock again
_LEFTOVER = re.compile(r"\.(?P<name>.+?)(?:\.(?:tmp|old)-\d+|" + re.escape(LOCK_SUFFIX) + ")")


class InUse(UserError):
    """Another process holds the directory's lock."""


def _lock_file(directory: Path) -> Path:
    d = Path(directory).resolve()  # one lock per directory, whatever link or relative path names it
    return d.parent / f".{d.name}{LOCK_SUFFIX}"


def _make_parents(path: Path, label: str) -> list[Path]:
    """Create the missing parents of path; return those this call created, deepest first (to remove them again).
    A parent another process creates at the same moment (runs started together under a new folder) is theirs."""
    made: list[Path] = []
    for parent in reversed(Path(path).resolve().parents):
        try:
            if not parent.is_dir():
                parent.mkdir()
                made.insert(0, parent)
        except FileExistsError:  # made by another writer since we looked, or a file
            if not parent.is_dir():
                _remove_empty(made)
                raise UserError(f"cannot write to {label}{path}: {parent} is a file") from None
        except OSError as e:
            _remove_empty(made)
            raise UserError(f"cannot write to {label}{path}: {e.strerror or e} ({parent})") from None
    return made


def _remove_empty(dirs: list[Path]) -> None:
    for d in dirs:
        with contextlib.suppress(OSError):
            d.rmdir()


def _take(lock: Path) -> int | None:
    """A descriptor holding `lock`'s flock, or None when another process holds it. The file may vanish under us
    (its holder unlinks it before releasing, a concurrent writer removes an emptied parent): FileNotFoundError."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError:
            os.close(fd)
            raise
        try:  # its previous holder may have unlinked the file between our open and our lock: then take the new one
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _acquire(lock: Path, directory: Path, what: str, label: str) -> int:
    try:
        fd = _take(lock)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):  # a filesystem without flock (some NFS)
            raise UserError(f"cannot lock {label}{directory}: its filesystem does not support file locks "
                            f"({e.strerror or e}); use a directory on a filesystem with flock") from None
        raise UserError(f"cannot write to {label}{directory}: {e.strerror or e} (creating {lock})") from None
    if fd is None:
        holder = (lock_text(directory) or "").strip() or "pid unknown"
        raise InUse(f"{directory} is in use by another depthlab process ({holder}); wait for it to finish, or stop "
                    "it")
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}, depthlab {what}".encode())
    return fd


def _tidy_leftovers(lock: Path) -> None:
    """Clear what killed writers left beside the directory whose `lock` this process has just taken: its own
    leftovers, and those of every sibling name whose lock nobody holds (a held one is being written)."""
    folder = lock.parent
    try:
        names = {m["name"] for e in os.listdir(folder) if (m := _LEFTOVER.fullmatch(e))}
    except OSError:
        return
    for name in names:
        other = folder / f".{name}{LOCK_SUFFIX}"
        if other == lock:
            with contextlib.suppress(OSError):
                _clear(folder, name)
            continue
        if other in _HELD:
            continue
        try:
            fd = _take(other)
        except OSError:
            continue
        if fd is None:
            continue
        try:
            _clear(folder, name)
            other.unlink()  # before the unlock, as a holder does
        except OSError:
            pass
        finally:
            os.close(fd)


def _clear(folder: Path, name: str) -> None:
    """Remove NAME's temporary siblings; an old copy goes back in place when NAME itself is missing (a writer
    killed between the two renames of `_swap_in`), else it is removed too. Call with NAME's lock held."""
    target = folder / name
    for part in sorted(folder.glob(f".{glob.escape(name)}.old-*")):
        if not target.exists() and not target.is_symlink():
            os.replace(part, target)
        else:
            _remove(part)
    for part in folder.glob(f".{glob.escape(name)}.tmp-*"):
        _remove(part)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


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
    for the error a second writer gets (InUse), `label` what the directory is in a "cannot write to" error.
    Missing parents are created, and removed again if left empty; what killed writers left beside it is cleared
    (_tidy_leftovers)."""
    directory = Path(directory)
    lock = _lock_file(directory)
    held = _HELD.get(lock)
    made: list[Path] = []
    if held:
        held[1] += 1
    else:
        for attempt in range(100):
            made = _make_parents(directory, label)
            try:
                _HELD[lock] = [_acquire(lock, directory, what, label), 1]
                break
            except FileNotFoundError:  # a parent we found was removed by the writer that made it: make it again
                if attempt == 99:
                    raise UserError(f"cannot write to {label}{directory}: its folder keeps disappearing") from None
            except UserError:
                _remove_empty(made)
                raise
        _tidy_leftovers(lock)
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


def refuse_own_input(out: str | Path, inputs: Iterable[str | Path], what: str) -> None:
    """A command never writes where it reads, --overwrite or not: `out` may not be one of its inputs, hold one
    (a directory above it) or sit inside one (a run written into its corpus is read as data by the next run on
    it). Paths are compared resolved, so a symlink or a relative path does not hide an input."""
    for inp in inputs:
        if how := _relation(out, inp):
            raise UserError(f"{out} {how} {what}'s own input{_named(out, inp, how)}; write the output to another path")


def _relation(out: str | Path, inp: str | Path) -> str | None:
    """How the written path `out` stands to the read path `inp`: "is", "holds" (a folder above it), "is inside",
    or None; resolved, so a symlink or a relative path does not hide it."""
    o, i = Path(out).resolve(), Path(inp).resolve()
    return "is" if o == i else "holds" if o in i.parents else \
        "is inside" if i in o.parents and not i.is_file() else None  # under a file: nothing can be written


def _named(out, inp, how: str) -> str:
    return "" if how == "is" and str(inp) == str(out) else f" ({inp})" if how == "is" else f" {inp}"


class PathRole:
    """What a command does with the path an option names, given as the option's argparse `type` (the value stays
    the text given): it reads it, writes it, makes new things inside it, or writes files named after it.
    `refuses` are the ways a path of this role may not stand to a path the command reads (`_relation`); a role that
    `reads` names its files through `paths` (the values as given -> the local paths behind them): a plain path, a
    glob or an `hf:` folder (`input_paths`), or a spec that names a file inside it (`continue:FILE,n=3`)."""

    def __init__(self, name: str, refuses: tuple[str, ...] = (), reads: bool = False,
                 paths: Callable[[Iterable[str]], list[str]] | None = None):
        self.__name__, self.refuses, self.reads = name, refuses, reads  # argparse names a type by its __name__
        self._paths = paths

    def paths(self, values: Iterable[str]) -> list[str]:
        return (self._paths or input_paths)(values)

    def __call__(self, text: str) -> str:
        return text

    def __repr__(self) -> str:
        return f"PathRole({self.__name__})"


INPUT = PathRole("input", reads=True)  # read: what a command writes is never it, above it or inside it
CONTINUED = PathRole("continued")  # a run the command continues, in place or as a branch: the run folder's rule
OUTPUT = PathRole("output", ("is", "holds", "is inside"))  # written (replaced whole) at this path
FOLDER = PathRole("folder", ("is", "is inside"))  # new things are made inside it: a run's parent, an offload folder
PREFIX = PathRole("prefix", ("is inside",))  # files PREFIX.md, PREFIX.json are written beside it
UPDATED = PathRole("updated", reads=True)  # read, and one file in it rewritten whole (eval --card's README.md)


def path_refusal(parser, args) -> str | None:
    """The one-line refusal of a path the command would write (an OUTPUT, FOLDER or PREFIX option given on the
    command line) that stands to an existing path it reads (an option whose role reads: INPUT, UPDATED, a spec that
    names files) as its role forbids, naming both options; None when there is none. The CLI's parser asks it of
    every command before the command runs."""
    what = parser.prog.removeprefix("depthlab").strip() or parser.prog
    reads, writes = [], []
    for action in parser._actions:
        if not isinstance(action.type, PathRole):
            continue
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [] if value is None else [value]
        if action.type.reads:
            # a missing path cannot be lost
            reads += [(action, p) for p in action.type.paths(values) if os.path.lexists(p)]
        elif action.type.refuses and value != action.default:  # a default (eval's --table) is the command's to check
            writes += [(action, v) for v in values]
    for w, out in writes:
        for r, inp in reads:
            how = _relation(out, inp)
            if how in w.type.refuses:
                return (f"{option_name(w)} {out} {how} {what}'s own input {option_name(r)}{_named(out, inp, how)}; "
                        f"choose another {option_name(w)}")
    return None


def option_name(action) -> str:
    """An option's first flag, or a positional's name as the usage line shows it (OUT_DIR, MODEL)."""
    return action.option_strings[0] if action.option_strings else \
        action.metavar if isinstance(action.metavar, str) else action.dest.upper()


def input_paths(specs: Iterable[str | Path]) -> list[str]:
    """The local paths behind data inputs as users give them: a glob stands for what it matches now, an `hf:`
    dataset for its folder when that is a local one, a hub name for nothing."""
    out = []
    for spec in map(str, specs):
        if spec.startswith("hf:"):
            local = spec[3:].split(":")[0]
            if local and os.path.exists(local):
                out.append(local)
        elif any(c in spec for c in "*?["):
            out += sorted(glob.glob(os.path.expanduser(spec), recursive=True))
        else:
            out.append(os.path.expanduser(spec))
    return out


def is_depthlab_hf(path: Path) -> bool:
    """An HF directory depthlab wrote (export, prune or duplicate): the kind those commands may replace."""
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
    inputs = list(inputs)
    refuse_own_input(out, inputs, what)  # before the lock makes any folder
    with locked(out, what):
        claim(out, own, what, overwrite)
        real = out.resolve()  # through a link: the directory it names is replaced, the link stays
        tmp = real.parent / f".{real.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            yield tmp
            for f in tmp.rglob("*"):
                if f.is_file():
                    usual_mode(f)
            _swap_in(tmp, real)
        except OSError as e:
            raise UserError(_failure(e, out, tmp, real)) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _failure(e: OSError, out: Path, *ours: Path) -> str:
    """The line for an OS error met while a command wrote `out` whole: "cannot write OUT" when it concerns the
    output (a file in it or its temporary folder, or no file named), else the file it concerns (an input, a cache),
    so that a new, writable output is not blamed for another file's error."""
    named = Path(os.fsdecode(e.filename)) if e.filename else None
    if named is not None and not any(_inside(named, p) for p in ours):
        return f"{named}: {e.strerror or e}; nothing was written to {out}"
    return f"cannot write {out}: {e.strerror or e}"


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False


@contextlib.contextmanager
def writing_files(outs: list[Path], own: Callable[[Path], bool], what: str, overwrite: bool = False,
                  inputs: Iterable[str | Path] = ()) -> Iterator[list[Path]]:
    """`writing` for single files: each of `outs` must be missing, or its own kind of output (`own`), or any file
    with --overwrite; never a directory, never an input. The block writes the temporary siblings it is given,
    which replace the targets only when it succeeds; on any failure the old files are intact."""
    outs, inputs = [Path(o) for o in outs], list(inputs)
    for out in outs:
        refuse_own_input(out, inputs, what)
        if out.is_dir():
            raise UserError(f"{out} is a directory; {what} writes a file there: choose another path")
        if out.exists() and not (overwrite or own(out)):
            raise UserError(f"{out} exists and is not {what} output; choose another path, or pass --overwrite "
                            "to replace it")
    with contextlib.ExitStack() as held:
        for out in outs:  # each file's lock: a writer beside them must not take their temporary files for leftovers
            held.enter_context(locked(out, what))
        targets = [o.resolve() for o in outs]  # through a link: the file it names is replaced
        tmps = [o.parent / f".{o.name}.tmp-{os.getpid()}" for o in targets]
        try:
            yield tmps
            for tmp, target in zip(tmps, targets):
                usual_mode(tmp)
                os.replace(tmp, target)
        except OSError as e:
            raise UserError(f"cannot write {outs[0]}: {e.strerror or e}; the old files are intact") from None
        finally:
            for tmp in tmps:
                with contextlib.suppress(OSError):
                    tmp.unlink()


def write_whole(path: Path, text: str | None = None, write=None) -> None:
    """Write a file whole: `text`, or what `write(tmp)` writes to the path it is given, into a temporary sibling
    (`.NAME.tmp-PID`) renamed over it, so a kill or a failure mid-write leaves the old file (or none), never a
    truncated one that the next reader chokes on."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text) if write is None else write(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _swap_in(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
