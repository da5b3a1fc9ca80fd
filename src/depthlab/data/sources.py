"""Text sources: local files and folders (globs allowed), and the built-in corpus.

The built-in corpus is the source of the Python standard library: real text that exists on every machine with
Python and needs no download.
"""

from __future__ import annotations

import glob
import hashlib
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from depthlab import UserError

TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".text", ""}


@dataclass
class Document:
    name: str
    text: str


@dataclass
class ReadReport:
    files: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)

    def summary(self) -> str:
        s = f"{self.files} file(s) read"
        if self.skipped:
            s += f", {len(self.skipped)} skipped (e.g. {self.skipped[0][0]}: {self.skipped[0][1]})"
        return s


def _expand(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        matches = sorted(glob.glob(p, recursive=True)) if any(c in p for c in "*?[") else [p]
        if not matches:
            raise UserError(f"no files match {p!r}")
        for m in map(Path, matches):
            if m.is_dir():
                files += sorted(f for f in m.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES
                                and not any(part.startswith(".") for part in f.relative_to(m).parts))
            elif m.is_file():
                files.append(m)
            else:
                raise UserError(f"data path {str(m)!r} does not exist")
    return files


def read_text_file(path: Path) -> str:
    """The file's text; ValueError with the reason if it is empty, binary or not UTF-8."""
    raw = path.read_bytes()
    if not raw.strip():
        raise ValueError("empty file")
    if b"\x00" in raw[:8192]:
        raise ValueError("binary file (NUL bytes)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not valid UTF-8 (byte {e.start})") from None


def read_documents(paths: list[str], fatal_bad_files: bool = False) -> tuple[list[Document], ReadReport]:
    """One document per file. Bad files are skipped and reported, or fatal with `fatal_bad_files`."""
    report = ReadReport()
    docs = []
    for f in _expand(paths):
        try:
            docs.append(Document(str(f), read_text_file(f)))
            report.files += 1
        except ValueError as e:
            if fatal_bad_files:
                raise UserError(f"{f}: {e}") from None
            report.skipped.append((str(f), str(e)))
        except OSError as e:
            raise UserError(f"cannot read {f}: {e.strerror}") from None
    if not docs:
        why = f"; skipped {len(report.skipped)}: " + ", ".join(f"{p} ({r})" for p, r in report.skipped[:3]) \
            if report.skipped else ""
        raise UserError(f"no usable text in {', '.join(paths)}{why}")
    return docs, report


def builtin_documents(max_mb: float = 4.0) -> list[Document]:
    """Python standard-library sources (no site-packages, no tests), a deterministic sample of about max_mb."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [f for f in root.rglob("*.py")
             if not {"site-packages", "test", "tests", "idle_test"} & set(f.relative_to(root).parts)]
    # A stable, content-independent shuffle so the sample spans the whole library, not just its first folders.
    files.sort(key=lambda f: hashlib.md5(str(f.relative_to(root)).encode()).hexdigest())
    docs, total = [], 0
    for f in files:
        try:
            text = read_text_file(f)
        except (ValueError, OSError):
            continue
        docs.append(Document(str(f.relative_to(root)), text))
        total += len(text.encode())
        if total >= max_mb * 1e6:
            break
    if not docs:
        raise UserError(f"the built-in corpus (Python sources under {root}) is empty on this machine; pass --data")
    return docs
