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

import hashlib
import importlib.util
import json
import os
import shutil
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
    use, from the cache after that."""
    f = gguf_file(path)
    _need_packages(f)
    info = describe(f)
    with open(f, "rb") as fh:
        info["sha256"] = hashlib.file_digest(fh, "sha256").hexdigest()
    out = cache_root() / "gguf" / f"{f.stem}-{info['sha256'][:16]}"
    if (out / SOURCE).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _write_dense(f, tmp)
        (tmp / SOURCE).write_text(json.dumps(info, indent=1) + "\n")
        try:
            tmp.rename(out)
        except OSError:  # another process made it first
            if not (out / SOURCE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_dense(f: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(f.parent), gguf_file=f.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(f.parent), gguf_file=f.name)
    except (ValueError, NotImplementedError, KeyError, OSError) as e:
        raise UserError(f"{f}: transformers cannot load this GGUF file ({str(e).splitlines()[0]})") from None
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
        return json.loads((p / SOURCE).read_text())
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
