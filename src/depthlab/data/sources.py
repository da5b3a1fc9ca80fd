"""Text sources: local files and folders (globs allowed), Hugging Face `datasets`, and the built-in corpus.

A source yields `Document`s. Local formats, chosen by suffix (a trailing `.gz` is read through gzip):

- text: `.txt`, `.md`, `.rst`, `.py`, ... one document per file;
- JSON: `.jsonl`, `.ndjson`, `.json`: JSON lines (C4 ships `.json.gz` JSON lines) or one JSON array of records,
  the document text in a configurable field (`text` by default);
- `.parquet` (via `pyarrow`), the text in a column of that name;
- `hf:PATH[:CONFIG[:SPLIT]]`: anything `datasets.load_dataset` reads (a hub id when a network exists, a local
  dataset folder, a `save_to_disk` folder), streamed when asked.

A bad file (empty, binary, not UTF-8, corrupt gzip/parquet) raises `BadFile`; callers skip it and report it, or
make it fatal. Errors in a file's *content* that a user must fix (a malformed JSON line, a missing text field)
raise `UserError` with the file and line number. The built-in corpus is the source of the Python standard
library: real text that exists on every machine with Python and needs no download.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import importlib
import json
import sysconfig
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from depthlab import UserError
from depthlab.jsonl import json_line

TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".text", ""}
JSON_SUFFIXES = {".jsonl", ".ndjson", ".json"}
PARQUET_SUFFIXES = {".parquet"}
HF_PREFIX = "hf:"


class BadFile(ValueError):
    """A file that cannot be read as text: skipped and reported by default, fatal on request."""


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


def require(module: str, package: str, purpose: str):
    """Import an optional dependency, or tell the user which package to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"{purpose} need the `{package}` package: pip install {package}") from None


def kind_of(path: str | Path) -> str | None:
    """'text', 'json' or 'parquet' by suffix (ignoring a trailing .gz); None if not a known text format."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".gz":
        suffix = Path(p.stem).suffix.lower()
    if suffix in JSON_SUFFIXES:
        return "json"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    return "text" if suffix in TEXT_SUFFIXES else None


def describe_inputs(paths: list[str]) -> str:
    """A short one-line name for a list of inputs (a shell-expanded glob can be a thousand paths)."""
    return ", ".join(paths) if len(paths) <= 3 else f"{paths[0]}, ..., {paths[-1]} ({len(paths)} inputs)"


def resolved(paths: list[str], cwd: str | Path | None = None) -> list[str]:
    """The data paths as absolute paths with symbolic links resolved, relative ones taken from `cwd` (default:
    the current directory), so one file compares equal however it was named; hf: specs as given."""
    base = Path(cwd) if cwd else Path.cwd()
    return [p if p.startswith(HF_PREFIX) else str((base / Path(p).expanduser()).resolve()) for p in paths]


def expand(paths: list[str]) -> list[str]:
    """Files (folders walked, globs matched, hidden entries ignored) and `hf:` specs, in a stable order."""
    out: list[str] = []
    for p in paths:
        if p.startswith(HF_PREFIX):
            out.append(p)
            continue
        matches = sorted(glob.glob(p, recursive=True)) if any(c in p for c in "*?[") else [p]
        if not matches:
            raise UserError(f"no files match {p!r}")
        for m in map(Path, matches):
            if m.is_dir():
                found = [f for f in sorted(m.rglob("*")) if f.is_file() and kind_of(f)
                         and not any(part.startswith(".") for part in f.relative_to(m).parts)]
                for f in found:  # a `data prepare` output is not text: its index.json would read as bad JSON
                    if f.name == "index.json" and (f.parent / "train.bin").is_file():
                        raise UserError(f"{f.parent} holds prepared token data, not text; pass it alone as the data")
                out += map(str, found)
            elif m.is_file():
                out.append(str(m))
            elif m.exists():
                raise UserError(f"data path {str(m)!r} is not a regular file or a folder (a device, a pipe, a socket)")
            else:
                raise UserError(f"data path {str(m)!r} does not exist")
    return out


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def _decode(raw: bytes, where: str) -> str:
    if b"\x00" in raw[:8192]:
        raise BadFile("binary file (NUL bytes)")
    try:
        return raw.decode("utf-8-sig")  # -sig: a byte-order mark (Excel, Notepad) is not text, nor a JSON error
    except UnicodeDecodeError as e:
        raise BadFile(f"not valid UTF-8 ({where}byte {e.start})") from None


def read_text_file(path: Path) -> str:
    """The file's text; BadFile with the reason if it is empty, binary or not UTF-8."""
    with _open(path) as f:
        raw = f.read()
    if not raw.strip():
        raise BadFile("empty file")
    return _decode(raw, "")


def _record_text(rec, text_field: str, where: str) -> str:
    if not isinstance(rec, dict) or text_field not in rec:
        keys = ", ".join(map(str, rec)) if isinstance(rec, dict) else type(rec).__name__
        raise UserError(f"{where}: no {text_field!r} field (found: {keys}); choose the field with --text-field "
                        f"or data.text_field")
    return _text_value(rec[text_field], text_field, where)


def _text_value(text, text_field: str, where: str) -> str:
    """The one rule for a record's text, in every format: a string ("" is an empty document, skipped); anything
    else (null, a number, a list) is refused, never skipped unseen."""
    if not isinstance(text, str):
        kind = "null" if text is None else f"of type {type(text).__name__}"
        raise UserError(f"{where}: field {text_field!r} is {kind}, not text (every record needs a string there; "
                        "\"\" for none)")
    return text


def _json_documents(path: Path, text_field: str) -> Iterator[Document]:
    """JSON lines, streamed line by line; or, if the file starts with '[', one JSON array of records."""
    with _open(path) as f:
        seen = False
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            line = _decode(raw, f"line {lineno}, ")
            if not seen and line.lstrip().startswith("["):
                yield from _json_array(path, line + _decode(f.read(), ""), text_field)
                return
            seen = True
            rec = json_line(line, f"{path}:{lineno}")
            text = _record_text(rec, text_field, f"{path}:{lineno}")
            if text:
                yield Document(f"{path}:{lineno}", text)
    if not seen:
        raise BadFile("empty file")


def _json_array(path: Path, text: str, text_field: str) -> Iterator[Document]:
    try:
        records = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(records, list):
        raise UserError(f"{path}: expected JSON lines or a JSON array of records")
    for i, rec in enumerate(records):
        text = _record_text(rec, text_field, f"{path}: record {i}")
        if text:
            yield Document(f"{path}#{i}", text)


def _parquet_documents(path: Path, text_field: str) -> Iterator[Document]:
    pq = require("pyarrow.parquet", "pyarrow", "parquet files")
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError subclasses for files it cannot parse
        raise BadFile(f"not a readable parquet file ({str(e).splitlines()[0]})") from None
    if text_field not in pf.schema_arrow.names:
        raise UserError(f"{path}: no {text_field!r} column (found: {', '.join(pf.schema_arrow.names)}); choose "
                        f"the column with --text-field or data.text_field")
    row = 0
    try:
        for batch in pf.iter_batches(columns=[text_field], batch_size=1024):
            for text in batch.column(0).to_pylist():
                if _text_value(text, text_field, f"{path} row {row}"):
                    yield Document(f"{path}#{row}", text)
                row += 1
    except UserError:
        raise
    except Exception as e:  # a corrupt row group (ArrowInvalid, OSError)
        raise BadFile(f"corrupt parquet data after row {row} ({str(e).splitlines()[0]})") from None


def parse_hf_spec(spec: str) -> tuple[str, str | None, str]:
    """`hf:PATH[:CONFIG[:SPLIT]]` -> (path, config, split); e.g. hf:allenai/c4:en:train."""
    parts = spec[len(HF_PREFIX):].split(":")
    if not parts[0] or len(parts) > 3:
        raise UserError(f"expected hf:PATH[:CONFIG[:SPLIT]], got {spec!r}")
    path, config, split = (parts + [None, None])[:3]
    return path, config or None, split or "train"


def _hf_documents(spec: str, text_field: str, streaming: bool, shard: tuple[int, int]) -> Iterator[Document]:
    datasets = require("datasets", "datasets", "hf: sources")
    path, config, split = parse_hf_spec(spec)
    try:
        if (Path(path) / "dataset_dict.json").exists() or (Path(path) / "state.json").exists():
            ds = datasets.load_from_disk(path)  # a folder written by save_to_disk
            ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        else:
            ds = datasets.load_dataset(path, config, split=split, streaming=streaming)
    except Exception as e:  # datasets raises many types (not found, offline, bad config); all are user-facing
        raise UserError(f"cannot load {spec}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if ds.column_names is not None and text_field not in ds.column_names:
        raise UserError(f"{spec}: no {text_field!r} column (found: {', '.join(ds.column_names)}); choose the "
                        f"column with --text-field or data.text_field")
    index, count = shard
    if count > 1:
        ds = ds.shard(num_shards=count, index=index, contiguous=True)
    i = 0
    try:
        for i, rec in enumerate(ds):
            text = _record_text(rec, text_field, f"{spec} row {i}")
            if text:
                yield Document(f"{spec}#{i}", text)
    except UserError:
        raise
    except Exception as e:  # e.g. the network dropped while streaming
        raise UserError(f"{spec}: reading failed after row {i}: {str(e).splitlines()[0] if str(e) else e!r}") \
            from None


def file_documents(path: str, text_field: str = "text", streaming: bool = False,
                   shard: tuple[int, int] = (0, 1)) -> Iterator[Document]:
    """The documents of one source (a file or an hf: spec). Raises BadFile or UserError as described above."""
    if path.startswith(HF_PREFIX):
        yield from _hf_documents(path, text_field, streaming, shard)
        return
    p = Path(path)
    try:
        if p.stat().st_size == 0:
            raise BadFile("empty file")
        kind = kind_of(p) or "text"  # a file named explicitly is read as text whatever its suffix
        if kind == "parquet":
            yield from _parquet_documents(p, text_field)
        elif kind == "json":
            yield from _json_documents(p, text_field)
        else:
            yield Document(path, read_text_file(p))
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise BadFile(f"corrupt gzip data ({e or 'truncated'})") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None


def read_documents(paths: list[str], fatal_bad_files: bool = False, text_field: str = "text",
                   streaming: bool = False, max_bytes: float = float("inf")) -> tuple[list[Document], ReadReport]:
    """All documents of `paths` in memory (for small inputs). Bad files are skipped whole and reported, or fatal
    with `fatal_bad_files`. More than `max_bytes` of text is a UserError (prepare such data once instead)."""
    report = ReadReport()
    docs: list[Document] = []
    total = 0
    for path in expand(paths):
        try:
            mine = list(file_documents(path, text_field, streaming))
        except BadFile as e:
            if fatal_bad_files:
                raise UserError(f"{path}: {e}") from None
            report.skipped.append((path, str(e)))
            continue
        docs += mine
        report.files += 1
        total += sum(len(d.text) for d in mine)
        if total > max_bytes:
            raise UserError(f"more than {max_bytes / 1e6:.0f} MB of text in {describe_inputs(paths)}: tokenize it "
                            f"once with `depthlab data prepare INPUTS --out DIR` and pass DIR as the data")
    if not docs:
        why = f"; skipped {len(report.skipped)}: " + ", ".join(f"{p} ({r})" for p, r in report.skipped[:3]) \
            if report.skipped else ""
        raise UserError(f"no usable text in {describe_inputs(paths)}{why}")
    return docs, report


def _python_files(root: Path) -> list[Path]:
    """The non-empty .py files under root (no tests, no nested site-packages), in a stable, content-independent
    shuffle, so a sample spans the whole tree and not just its first folders."""
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    files = [f for f in root.rglob("*.py") if not skip & set(f.relative_to(root).parts) and f.stat().st_size]
    return sorted(files, key=lambda f: hashlib.md5(str(f.relative_to(root)).encode()).hexdigest())


def builtin_roots() -> list[Path]:
    """Where the built-in corpus comes from: the Python standard library first, then the installed packages'
    sources (torch, transformers, numpy, ... -- present wherever depthlab is installed)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(Path(paths[k]) for k in ("stdlib", "purelib")))


def builtin_files(max_mb: float = 4.0) -> list[Path]:
    """A deterministic sample of about max_mb of Python sources: the standard library (about 12 MB), then, for
    more, the installed packages. A smaller sample is always a prefix of a larger one."""
    out, total = [], 0
    for root in builtin_roots():
        for f in _python_files(root):
            if total >= max_mb * 1e6:
                return out
            out.append(f)
            total += f.stat().st_size
    if not out:
        raise UserError(f"the built-in corpus (Python sources under {builtin_roots()[0]}) is empty on this machine; "
                        f"pass --data")
    return out


def builtin_documents(max_mb: float = 4.0) -> list[Document]:
    roots = builtin_roots()
    docs = []
    for f in builtin_files(max_mb):
        root = next(r for r in roots if f.is_relative_to(r))
        try:
            docs.append(Document(str(f.relative_to(root)), read_text_file(f)))
        except (BadFile, OSError):
            continue
    return docs
