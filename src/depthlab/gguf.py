"""A GGUF file (llama.cpp's format, as quantized models are shipped) as a model source. Every command that takes a
Hugging Face model directory also takes a `.gguf` file, or a directory holding one: transformers' own GGUF loader
(`from_pretrained(dir, gguf_file=...)`) dequantizes it to float32, and the model and its tokenizer are saved once
as a plain HF model directory in depthlab's cache (DEPTHLAB_CACHE, else $XDG_CACHE_HOME/depthlab, else
~/.cache/depthlab), named by the file's sha256. Every command then reads that directory as any other, so a GGUF
file gives exactly the numbers its dequantized directory gives; `source_of` says which file and quantization a
directory came from (the analysis report and metrics.json record it).

Needs the optional extra `depthlab[gguf]` (transformers, gguf, accelerate). Sits below `paths` (whose
`model_path` turns a GGUF path into its directory), so it imports nothing else of depthlab.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from depthlab import UserError

SUFFIX = ".gguf"
SOURCE = "gguf_source.json"  # in a dequantized directory: the file it came from and its quantization
EXTRA = "pip install 'depthlab[gguf]'"
DENSE = ("F32", "F16", "BF16")  # tensor types stored unquantized


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file a model path names: the file itself, or the one file in a directory that is no HF model
    directory; None for any other path. A directory holding several is refused in one line."""
    p = Path(path)
    if p.is_file():
        return p if p.suffix.lower() == SUFFIX else None
    if not p.is_dir() or (p / "config.json").is_file():
        return None
    found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() == SUFFIX)
    if len(found) > 1:
        raise UserError(f"{p} holds {len(found)} GGUF files ({', '.join(f.name for f in found[:4])}); name one of them")
    return found[0] if found else None


def cache_root() -> Path:
    if os.environ.get("DEPTHLAB_CACHE"):
        return Path(os.environ["DEPTHLAB_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "depthlab"


def _need_packages(f: Path) -> None:
    missing = [m for m in ("gguf", "transformers", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"{f} is a GGUF file; reading it needs the `{missing[0]}` package: {EXTRA}")


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    part = f.parts[f.data[0]]
    return bytes(part).decode("utf-8", "replace") if f.types and f.types[0].name == "STRING" else part[0].item()


def describe(f: Path) -> dict:
    """What the file is, read from its header and checked before anything is dequantized: its architecture and its
    quantization (the file type llama.cpp names, and the count of tensors of each type). One line for an
    architecture transformers does not read from GGUF, or a tensor type it cannot dequantize."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = gguf.GGUFReader(f)
    except (ValueError, OSError, KeyError, IndexError) as e:
        raise UserError(f"{f}: not a readable GGUF file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") \
            from None
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise UserError(f"{f}: GGUF architecture {arch!r} is not one transformers reads from GGUF (it reads "
                        f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES)[:8])}, ...)")
    types = Counter(t.tensor_type.name for t in reader.tensors)
    readable = {*DENSE, *(t.name for t in getattr(gguf.quants, "_type_traits", {}))}
    unsupported = sorted(set(types) - readable)
    if unsupported:
        raise UserError(f"{f}: tensor type {unsupported[0]} cannot be dequantized (the types gguf reads: "
                        f"{', '.join(sorted(readable))})")
    code = _field(reader, "general.file_type")
    try:
        file_type = gguf.LlamaFileType(int(code)).name.removeprefix("MOSTLY_") if code is not None else None
    except ValueError:
        file_type = None
    matrices = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) > 1)
    return {"file": str(f), "architecture": arch, "name": _field(reader, "general.name"),
            "quantization": file_type or (matrices or types).most_common(1)[0][0], "tensor_types": dict(types)}


def dequantized(path: str | Path) -> Path:
    """The HF model directory holding the GGUF file `path` (see gguf_file) dequantized to float32; made on first
    use, from the cache after that. An entry whose files are missing or not the size they were written at (a disk
    that filled, a file someone truncated) is said and made again; what a dequantization killed outright left
    (its `.NAME-SHA-xxxx` temporary folder) is cleared by the next one. A cache that cannot be read or written is
    one line naming it and DEPTHLAB_CACHE."""
    f = gguf_file(path)
    _need_packages(f)
    info = describe(f)
    with open(f, "rb") as fh:
        info["sha256"] = hashlib.file_digest(fh, "sha256").hexdigest()
    root = cache_root() / "gguf"
    out = root / f"{f.stem}-{info['sha256'][:16]}"
    made = [d for d in (root, *root.parents) if not d.exists()]  # removed again when nothing was cached
    try:
        if _intact(out, info["sha256"]):
            return out
        root.mkdir(parents=True, exist_ok=True)
        with _building(out):  # one builder per entry: a second process waits for it, then finds the entry made
            if _intact(out, info["sha256"]):
                return out
            for debris in root.glob(f".{out.name}-*"):  # temporary folders of killed builders (the lock is ours)
                shutil.rmtree(debris)
            if out.exists():
                print(f"depthlab: warning: the GGUF cache entry {out} is damaged ({_damage(out)}); making it "
                      "again", file=sys.stderr)
                shutil.rmtree(out)
            _build(f, info, out)
    except OSError as e:
        raise UserError(f"the GGUF cache {root} cannot be used ({e.strerror or e}"
                        f"{f': {e.filename}' if e.filename else ''}); point DEPTHLAB_CACHE at a writable folder") \
            from None
    finally:
        for d in made:
            with contextlib.suppress(OSError):
                d.rmdir()  # only an empty one: a refused file leaves no cache behind
    return out


def _build(f: Path, info: dict, out: Path) -> None:
    """Dequantize `f` into a temporary sibling of `out`, record its files' sizes, and rename it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _write_dense(f, tmp)
        sizes = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / SOURCE).write_text(json.dumps({**info, "files": sizes}, indent=1) + "\n")
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _building(out: Path):
    """Hold the entry's lock (flock on `.NAME.lock` beside it, released by the OS however its holder dies; removed
    by the holder before it lets go, so a waiter that took the removed file takes the new one)."""
    lock = out.parent / f".{out.name}.lock"
    while True:
        fh = open(lock, "a")
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            if os.fstat(fh.fileno()).st_ino == os.stat(lock).st_ino:
                break
        except FileNotFoundError:
            pass
        fh.close()
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        fh.close()


def _damage(out: Path) -> str | None:
    """What is wrong with a cache entry, in a few words; None for a whole one (its source record says which file
    sizes it was written with; an entry from before that record counts as whole when its record reads)."""
    try:
        recorded = json.loads((out / SOURCE).read_text())
    except FileNotFoundError:
        return f"no {SOURCE}"
    except (OSError, ValueError) as e:
        return f"{SOURCE} does not read: {e}"
    if not isinstance(recorded, dict):
        return f"{SOURCE} is not a record"
    for name, size in (recorded.get("files") or {}).items():
        p = out / name
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != size:
            return f"{name} is {p.stat().st_size:,} bytes, written as {size:,}"
    return None


def _intact(out: Path, sha256: str) -> bool:
    if not out.is_dir() or _damage(out) is not None:
        return False
    return json.loads((out / SOURCE).read_text()).get("sha256") == sha256


def _write_dense(f: Path, out: Path) -> None:
    """The file loaded by transformers, refused when the file lacks a tensor its header implies (transformers would
    start it at random, or at ones for a norm, and say so only in a load report), saved as an HF directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # its load report of missing tensors: what is missing is refused below instead
    try:  # its GGUF reader draws a progress bar no setting turns off: an error must stay one line
        with contextlib.redirect_stderr(io.StringIO()):
            model, loading = AutoModelForCausalLM.from_pretrained(str(f.parent), gguf_file=f.name,
                                                                  dtype=torch.float32, output_loading_info=True)
            tok = AutoTokenizer.from_pretrained(str(f.parent), gguf_file=f.name)
    except (ValueError, NotImplementedError, KeyError, OSError) as e:
        raise UserError(f"{f}: transformers cannot load this GGUF file ({str(e).splitlines()[0]})") from None
    finally:
        logging.set_verbosity(verbosity)
    missing = sorted(loading.get("missing_keys") or ())
    if missing:
        raise UserError(f"{f} lacks {len(missing)} tensor(s) its header implies ({', '.join(missing[:4])}"
                        f"{', ...' if len(missing) > 4 else ''}, as transformers names them); refused: transformers "
                        "would start them at random (was the file written incompletely?)")
    dense = {p.dtype for p in model.parameters()}
    if dense != {torch.float32}:
        raise UserError(f"{f}: transformers kept weights of type {sorted(map(str, dense))} instead of dequantizing "
                        "them to float32")
    plain(model).save_pretrained(out)
    tok.save_pretrained(out)


def plain(model):
    """A model transformers loaded from GGUF as a plain one: newer transformers keep a GGUF "quantizer" on the
    model even when every weight was dequantized, and refuse to save it."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if getattr(model, "is_quantized", False):
        model.is_quantized = False
    return model


def source_of(path: str | Path) -> dict | None:
    """The GGUF file and quantization a model path came from: for a GGUF file (or a directory holding one), or a
    directory dequantized from one; None for any other path. Reads no tensor."""
    p = Path(path)
    if (p / SOURCE).is_file():
        return {k: v for k, v in json.loads((p / SOURCE).read_text()).items() if k != "files"}
    try:
        f = gguf_file(p)
    except UserError:
        return None
    if f is None:
        return None
    _need_packages(f)
    return describe(f)


def note(info: dict) -> str:
    """One line for a report."""
    return f"dequantized to float32 from the GGUF file {Path(info['file']).name} (quantization {info['quantization']})"
