"""The checkpoint format, in one place: the step directory's name, its typed metadata, writing, listing, verifying
and reading. One directory per step, named by `step_dir` and read back by `step_of`:

    step_0001000/
      config.json         the resolved config: loading rebuilds the model with its scheme
      meta.json           CheckpointMeta: step, loader position, the task's record of its data, the last
                          validation, a sha256 of every other file (the manifest), and its own (meta_sha256, of the
                          rest of it), so an edited step is refused like a damaged file
      tokenizer.json
      trainer.pt          scheduler + RNG states, and in the full format the optimizer (tensors and plain
                          containers only: read back with torch.load(weights_only=True), never a full unpickle)
      model.safetensors   full format (a single process): the weights, unsharded
      shards/             sharded format (torchrun): torch.distributed.checkpoint's files, each rank's own shards of
                          the weights and the optimizer (shards/.metadata says what lies where)

A single process writes the full format; a run on several ranks writes the sharded one, every rank its own part,
so nothing is gathered on one rank. Both load on any number of ranks: the sharded format reshards as it loads,
and `load_weights` assembles full weights from either (what export, eval and analyze read).

Writing goes to a temporary sibling directory that is renamed into place only when complete, so a crash or a
full disk never leaves a checkpoint that looks valid but is not; the checksums catch later corruption. A process
hashes a checkpoint at most once: verdicts are cached by the files' identity (inode, size, modification time).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from depthlab import UserError

CONFIG, META, WEIGHTS, TOKENIZER, TRAINER, SHARDS = "config.json", "meta.json", "model.safetensors", \
    "tokenizer.json", "trainer.pt", "shards"
CHECKPOINTS = "checkpoints"  # a run directory's subdirectory of checkpoints


class CorruptCheckpoint(UserError):
    pass


def warn(msg: str) -> None:
    print(msg if msg.startswith("depthlab:") else f"depthlab: warning: {msg}", file=sys.stderr)


# ---------------------------------------------------------------- the step directory's name
_STEP_DIR = re.compile(r"step_(\d+)")


def step_dir(step: int) -> str:
    """The name of the checkpoint directory of `step` in a run's checkpoints/: step_0001000 (step_of reads it)."""
    return f"step_{step:07d}"


def step_of(name: str) -> int | None:
    """The step a checkpoint directory's name stands for (step_dir's inverse, any number of digits), or None for
    any other name: a step_N.tmp being written, a step_N.old being replaced, another file."""
    m = _STEP_DIR.fullmatch(name)
    return int(m[1]) if m else None


# ---------------------------------------------------------------- the metadata
@dataclass(frozen=True)
class CheckpointMeta:
    """A checkpoint's meta.json, typed. The trainer fills every field; `depthlab import` the step (0), where it
    came from, and a ViT's data. `data` is the task's record of its data (depthlab.train.tasks: its train_* and
    val_* sizes, which must match on resume, a ViT's classes and pixel statistics, a fine-tune's task); `val` the
    validation metrics of the step that saved it, when that step evaluated (the last one)."""

    step: int
    skipped: int = 0  # non-finite steps skipped so far (train.on_nonfinite=skip)
    loader: dict | None = None  # the sampler's position: where a resumed run continues (trainer checkpoints only)
    world_size: int = 1  # ranks that wrote it: with the per-rank batch, the global batch a resume must keep
    source: str | None = None  # the data, in words
    tokenizer_hash: str | None = None
    n_params: int | None = None
    cwd: str | None = None  # where the config's relative data paths start from
    imported_from: str | None = None  # `depthlab import`: the HF directory
    data: dict = field(default_factory=dict)
    val: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)  # the manifest, name -> sha256: written by the checkpoint writers

    @classmethod
    def from_dict(cls, d: dict, where: str | Path = "checkpoint") -> CheckpointMeta:
        """The typed view of a meta.json's fields. Before this class, the data's entries and the last validation
        sat beside the other fields: such a file reads the same. A field this depthlab does not know is named in
        one warning line and ignored; a missing step is a corrupted checkpoint."""
        d = {k: v for k, v in d.items() if k != META_DIGEST}
        if not isinstance(d.get("step"), int):
            raise CorruptCheckpoint(f"corrupted checkpoint {where}: its {META} records no step")
        if "data" not in d and "val" not in d:  # a flat file, as depthlab wrote before the typed layout
            rest = {k: d.pop(k) for k in list(d) if k not in _META_FIELDS}
            d["val"] = {k: v for k, v in rest.items() if k in _LAST_VALIDATION}
            d["data"] = {k: v for k, v in rest.items() if k not in _LAST_VALIDATION}
        unknown = sorted(set(d) - _META_FIELDS)
        if unknown and str(where) not in _UNKNOWN_NOTED:
            _UNKNOWN_NOTED.add(str(where))
            warn(f"{where}: {META} has fields this depthlab does not know ({', '.join(unknown)}), written by a newer "
                 "version? They are ignored")
        return cls(**{k: v for k, v in d.items() if k in _META_FIELDS})

    def to_dict(self) -> dict:
        """The fields as meta.json holds them (those that are None left out; `data` and `val`, even empty, mark
        the typed layout)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


_META_FIELDS = {f.name for f in fields(CheckpointMeta)}
_LAST_VALIDATION = {"val_loss", "val_ppl", "val_acc"}  # a flat meta.json's metrics (val_tokens is also the data's)
_UNKNOWN_NOTED: set[str] = set()  # checkpoints whose unknown fields have been named (once per process)


def as_meta(meta: CheckpointMeta | dict) -> CheckpointMeta:
    """A CheckpointMeta, also from a flat dict of meta.json's fields as writers outside the trainer give them."""
    return meta if isinstance(meta, CheckpointMeta) else CheckpointMeta.from_dict(meta)


# ---------------------------------------------------------------- listing and verifying
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _identity(path: Path, names) -> tuple:
    out = []
    for name in names:
        try:
            st = os.stat(path / name)
            out.append((name, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((name, None))
    return tuple(out)


_VERIFIED: dict[tuple, CheckpointMeta] = {}  # (path, identity of its files) -> meta: what this process has hashed
_TEAM = None  # the DistEnv of the ranks that share rank 0's verifications (verifying_together)


def _key(path: Path, meta: CheckpointMeta) -> tuple:
    return str(path.resolve()), _identity(path, [META, *meta.files])


def _check(path: Path, files: dict) -> str | None:
    """Why some of a checkpoint's files (name -> sha256) are not what its manifest says, or None."""
    for name, digest in files.items():
        if not (path / name).is_file():
            return f"corrupted checkpoint {path}: {name} is missing"
        try:
            if _sha256(path / name) != digest:
                return f"corrupted checkpoint {path}: {name} does not match its checksum"
        except OSError as e:
            return f"corrupted checkpoint {path}: cannot read {name} ({e.strerror or e})"
    return None


META_DIGEST = "meta_sha256"  # meta.json's own checksum, inside it: of its other fields (meta_digest)
_UNSEALED_NOTED: list[bool] = []  # a checkpoint without META_DIGEST has been mentioned (once per process)


def meta_digest(meta: dict) -> str:
    """sha256 of a checkpoint's metadata without its META_DIGEST field, in canonical JSON (sorted keys), so it
    does not depend on how the file is laid out, only on what it says."""
    fields = {k: v for k, v in meta.items() if k != META_DIGEST}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _check_meta(path: Path, raw: dict) -> None:
    """meta.json (its fields, as read) against its own checksum: an edited step or loader position would resume
    the wrong way."""
    if META_DIGEST not in raw:
        if not _UNSEALED_NOTED:
            _UNSEALED_NOTED.append(True)
            warn(f"{path} was written before checkpoints checksummed their {META}: its step and other metadata are "
                 "read unverified (said once)")
    elif raw[META_DIGEST] != meta_digest(raw):
        raise CorruptCheckpoint(f"corrupted checkpoint {path}: {META} does not match its checksum (edited?)")


def verify_checkpoint(path: Path) -> CheckpointMeta:
    """The checkpoint's meta.json, after checking it and every other file against their recorded sha256 (once
    per process for the same files). On rank 0 inside verifying_together, the files are hashed by all ranks,
    each its share."""
    path = Path(path)
    try:
        raw = json.loads((path / META).read_text())
        files = raw["files"]
        if not isinstance(files, dict):
            raise TypeError(f"its files are a {type(files).__name__}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"corrupted checkpoint {path}: unreadable {META} ({e})") from None
    _check_meta(path, raw)
    meta = CheckpointMeta.from_dict(raw, path)
    key = _key(path, meta)
    if key in _VERIFIED:
        return _VERIFIED[key]
    error = _ask_team((str(path), meta, _deal(path, files, _TEAM.world_size)), _TEAM) if _TEAM else \
        _check(path, files)
    if error:
        raise CorruptCheckpoint(error)
    _VERIFIED[key] = meta
    return meta


def _deal(path: Path, files: dict, ranks: int) -> dict[str, int]:
    """Which rank hashes which file: the largest first, each to the rank with the fewest bytes so far."""
    sizes = {name: (path / name).stat().st_size if (path / name).is_file() else 0 for name in files}
    load, owner = [0] * ranks, {}
    for name in sorted(files, key=lambda n: (-sizes[n], n)):
        owner[name] = min(range(ranks), key=load.__getitem__)
        load[owner[name]] += sizes[name]
    return owner


def _share(request: tuple, env) -> str | None:
    """One shared verification, on every rank: its own files of the checkpoint, then every rank's verdict; the
    first error of any rank (the same on all), or None, and then the verdict is remembered on every rank."""
    path, meta, owner = Path(request[0]), request[1], request[2]
    mine = {n: d for n, d in meta.files.items() if owner[n] == env.rank}
    error = next((e for e in env.gather(_check(path, mine)) if e), None)
    if error is None:
        _VERIFIED[_key(path, meta)] = meta
    return error


def _ask_team(request: tuple, env) -> str | None:
    """Rank 0: send the other ranks (waiting in serve_verification) a checkpoint to verify, and verify with them."""
    env.broadcast(request)
    return _share(request, env)


@contextlib.contextmanager
def verifying_together(env):
    """Rank 0's side of a shared decision: inside the block, each checkpoint verify_checkpoint hashes is dealt out
    to every rank (see serve_verification), so every file is read once in all, not all of them by rank 0."""
    global _TEAM
    _TEAM = env
    try:
        yield
    finally:
        _TEAM = None
        env.broadcast(None)  # the other ranks stop serving


def serve_verification(env) -> None:
    """The other ranks' side: hash their share of every checkpoint rank 0 verifies, until it is done."""
    while (request := env.broadcast(None)) is not None:
        _share(request, env)


def rank0_decides(env, decide: Callable):
    """decide() on rank 0, every checkpoint it verifies hashed by all ranks together; its result, or its
    UserError, on every rank (collective). In one process, just decide()."""
    if not env.enabled:
        return decide()
    result = None
    if env.is_main:
        with verifying_together(env):
            try:
                result = decide()
            except UserError as e:
                result = e
    else:
        serve_verification(env)
    result = env.broadcast(result)
    if isinstance(result, UserError):
        raise result
    return result


def is_valid(ckpt: Path) -> bool:
    try:
        verify_checkpoint(ckpt)
        return True
    except CorruptCheckpoint:
        return False


def is_sharded(ckpt: Path) -> bool:
    return (Path(ckpt) / SHARDS).is_dir()


def list_checkpoints(run_dir: Path) -> list[Path]:
    """A run's finished checkpoints, oldest first by step (step_N.tmp, a save in progress or killed, is not one)."""
    d = Path(run_dir) / CHECKPOINTS
    found = [(step, p) for p in d.iterdir() if (step := step_of(p.name)) is not None and p.is_dir()] \
        if d.is_dir() else []
    return [p for _, p in sorted(found)]


def newest_valid_checkpoint(run_dir: Path, warn: Callable[[str], None] = warn) -> Path | None:
    for ckpt in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(ckpt)
            return ckpt
        except CorruptCheckpoint as e:
            warn(f"depthlab: warning: skipping {e}")
    return None


def previous_checkpoint(ckpt: Path) -> Path | None:
    """The newest valid checkpoint of ckpt's run before ckpt's step (None for a checkpoint outside a run)."""
    step = step_of(Path(ckpt).name)
    if step is None or Path(ckpt).parent.name != CHECKPOINTS:
        return None
    older = [p for p in list_checkpoints(ckpt.parent.parent) if step_of(p.name) < step]
    return next((p for p in reversed(older) if is_valid(p)), None)


def read_meta(ckpt: Path) -> CheckpointMeta | None:
    """A checkpoint's meta.json as it stands, unverified, or None when it cannot be read: for a look at a field
    before the one who uses the checkpoint verifies it."""
    try:
        return CheckpointMeta.from_dict(json.loads((Path(ckpt) / META).read_text()), ckpt)
    except (OSError, ValueError, AttributeError, CorruptCheckpoint):
        return None


def load_verified(ckpt: Path) -> CheckpointMeta:
    """verify_checkpoint, naming the previous valid checkpoint when this one is corrupted."""
    try:
        return verify_checkpoint(ckpt)
    except CorruptCheckpoint as e:
        prev = previous_checkpoint(ckpt)
        raise CorruptCheckpoint(f"{e}; " + (f"the previous valid checkpoint is {prev}" if prev else
                                            "no earlier valid checkpoint exists")) from None


# ---------------------------------------------------------------- reading
def load_weights(ckpt: Path, device: str = "cpu") -> dict:
    """The full model state dict of a checkpoint in either format (sharded ones assembled in this process)."""
    return read_weights(ckpt, None, device)


def weight_names(ckpt: Path) -> list[str]:
    """The names of a checkpoint's weights, in either format, without reading them."""
    if not is_sharded(ckpt):
        from safetensors import safe_open

        with safe_open(str(Path(ckpt) / WEIGHTS), "pt") as f:
            return list(f.keys())
    return list(_shard_entries(ckpt))


def _shard_entries(ckpt: Path) -> dict:
    import torch.distributed.checkpoint as dcp

    entries = dcp.FileSystemReader(str(Path(ckpt) / SHARDS)).read_metadata().state_dict_metadata
    return {k[len("model."):]: m for k, m in entries.items() if k.startswith("model.") and hasattr(m, "size")}


def read_weights(ckpt: Path, names=None, device: str = "cpu") -> dict:
    """Some of a checkpoint's weights, full tensors by name (names None: all of them), in either format. From a
    sharded checkpoint only the parts of the rank files that hold them are read, so a caller that takes one
    block at a time (layer-by-layer analysis) never holds the whole model."""
    if not is_sharded(ckpt):
        from safetensors import safe_open

        with safe_open(str(Path(ckpt) / WEIGHTS), "pt", device=device) as f:
            return {k: f.get_tensor(k) for k in (f.keys() if names is None else names)}
    import torch
    import torch.distributed.checkpoint as dcp

    entries = _shard_entries(ckpt)
    state = {k: torch.empty(entries[k].size, dtype=entries[k].properties.dtype)
             for k in (entries if names is None else names)}
    if state:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({"model": state}, checkpoint_id=str(Path(ckpt) / SHARDS), no_dist=True)
    return {k: v.to(device) for k, v in state.items()}


def load_trainer_state(ckpt: Path) -> dict:
    from depthlab.pickled import load_tensors

    return load_tensors(Path(ckpt) / TRAINER, map_location="cpu")


def load_sharded_state(ckpt: Path, model, opt=None) -> None:
    """Load a sharded checkpoint's weights (and optimizer) into a plain or FSDP-sharded model on this rank: each
    rank reads the parts of the files that its own shards need, whatever the world size that wrote them."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt or [])
    state = {"model": msd, **({"optim": osd} if opt is not None else {})}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(Path(ckpt) / SHARDS), no_dist=not dist.is_initialized())
    load_states(model, opt, msd, osd if opt is not None else None, full=False)


def load_states(model, opt, model_state: dict, optim_state: dict | None, full: bool) -> None:
    """Load state dicts into a plain or FSDP-sharded model (not a DDP wrapper) and its optimizer: `full`, full
    tensors present on every rank, else this rank's shards. The optimizer first: torch builds an empty optimizer's
    state by one step at lr 0, which fires the optimizer's step hooks (ProRes's would set every ramp to step 1);
    the weights loaded after it put back whatever a hook keeps in the model, so the model is the checkpoint's."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if opt is not None and optim_state is not None:
        set_optimizer_state_dict(model, opt, optim_state, options=StateDictOptions(full_state_dict=full))
    set_model_state_dict(model, model_state, options=StateDictOptions(full_state_dict=full, strict=False))


# ---------------------------------------------------------------- writing
LOW_SPACE = 64 << 20  # bytes free below which a writer's bare "short write" is taken for a full disk
# how writers that lose the errno report a short write: torch's serializer, numpy's tofile
_SHORT_WRITE = re.compile(r"unexpected pos|file write failed|\d+ requested and \d+ written")


def _free_bytes(where: Path) -> int | None:
    for p in (Path(where), *Path(where).parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(p).free
    return None


def out_of_space(where: Path, e: BaseException) -> str | None:
    """'the disk is full ...' (or the file-size limit is reached) when a write under `where` failed for lack of
    space: ENOSPC or a quota, EFBIG, or a writer's bare short write (no errno) with the disk all but full or a
    file-size limit set; None for any other failure."""
    import resource

    code = getattr(e, "errno", None)
    short = code is None and bool(_SHORT_WRITE.search(str(e)))
    free = _free_bytes(where)
    said = code is None and any(os.strerror(c) in str(e) for c in (errno.ENOSPC, errno.EDQUOT))  # in a wrapper's words
    if code in (errno.ENOSPC, errno.EDQUOT) or said or (short and free is not None and free < LOW_SPACE):
        return f"the disk is full (no space left on the file system of {where}" + \
            (f", {free / 1e6:.1f} MB free now)" if free is not None and free < LOW_SPACE else ")")
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if code == errno.EFBIG or (short and limit != resource.RLIM_INFINITY):
        return "out of space: a file reached this process's file-size limit (ulimit -f" + \
            (f", {limit:,} bytes)" if limit != resource.RLIM_INFINITY else ")")
    return None


def write_failure(where: Path, e: BaseException) -> str:
    """Why a write under `where` failed, in one line: out_of_space's words, else the error's own (last line)."""
    return out_of_space(where, e) or getattr(e, "strerror", None) or str(e).strip().splitlines()[-1]


def _write_failed(path: Path, e: BaseException, intact: str) -> UserError:
    return UserError(f"cannot write checkpoint {path}: {write_failure(path.parent, e)}; nothing was lost: {intact}")


def _write_common(tmp: Path, cfg, meta: CheckpointMeta, tokenizer, trainer_state: dict | None, digests: dict) -> None:
    """Everything but the weights, then the manifest: meta.json with the sha256 of every file (`digests`: those
    already hashed by the ranks that wrote them)."""
    import torch

    cfg.save(tmp / CONFIG)
    if tokenizer is not None:
        tokenizer.save(str(tmp / TOKENIZER))
    if trainer_state is not None:
        torch.save(trainer_state, tmp / TRAINER)
    files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    files.update({f"{SHARDS}/{p.name}": _sha256(p) for p in sorted((tmp / SHARDS).glob("*"))
                  if p.is_file() and f"{SHARDS}/{p.name}" not in digests})
    # the digest is of the fields as they will read back (tuples as lists)
    written = json.loads(json.dumps({**meta.to_dict(), "files": dict(sorted({**files, **digests}.items()))}))
    (tmp / META).write_text(json.dumps({**written, META_DIGEST: meta_digest(written)}, indent=2) + "\n")
    with open(tmp / META) as f:
        os.fsync(f.fileno())


def _put_in_place(tmp: Path, path: Path) -> None:
    old = path.with_name(path.name + ".old")
    if path.exists():  # replacing a checkpoint of the same step: keep it until the new one is in place
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def usual_mode(path: Path) -> None:
    """The permissions any file we create gets from the umask: libraries that write a temporary file and rename
    it (safetensors) leave 0600."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def save_weights(state: dict, path: Path, metadata: dict | None = None) -> None:
    """safetensors' file, with the permissions of any other file we write (usual_mode); a full disk or a file-size
    limit is the OSError it is."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(state, str(path), metadata=metadata)
    except SafetensorError as e:  # keep the OS error's number (a full disk), which safetensors puts in words
        code = re.search(r"os error (\d+)|code: (\d+)", str(e))  # "I/O error: ... (os error 28)"
        if code:
            number = int(code[1] or code[2])
            raise OSError(number, os.strerror(number), str(path)) from None
        raise OSError(str(e).strip().splitlines()[-1]) from None
    usual_mode(path)


def save_checkpoint(path: str | Path, state: dict, cfg, meta: CheckpointMeta | dict, tokenizer=None,
                    trainer_state: dict | None = None, intact: str = "earlier checkpoints are intact") -> Path:
    """Write a full-format checkpoint atomically. `state` is a full model state dict (tensors on any device).
    `intact`: what a failed write leaves as it was, for its one-line error."""
    path, meta = Path(path), as_meta(meta)
    tmp = path.with_name(path.name + ".tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        weights = {k: v.detach().contiguous().cpu() for k, v in state.items()}
        if cfg.model.tie_embeddings:
            weights.pop("lm_head.weight", None)  # safetensors refuses shared storage; the tie is in the config
        save_weights(weights, tmp / WEIGHTS)
        _write_common(tmp, cfg, meta, tokenizer, trainer_state, {})
        _put_in_place(tmp, path)
    except (OSError, RuntimeError) as e:  # a full disk: torch.save raises RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_failed(path, e, intact) from None
    return path


def save_sharded(path: str | Path, model, opt, cfg, meta: CheckpointMeta, tokenizer, trainer_state: dict,
                 env) -> Path:
    """Write a sharded checkpoint atomically; collective (every rank calls it, `env` the DistEnv). Each rank
    writes and hashes its own shards; rank 0 writes the rest and the manifest, and renames the directory into
    place after every rank has finished. A failure on any rank is the same one-line error on every rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")

    def agreed(step):  # run step on rank 0 (or every rank), then raise rank 0's error, or any rank's, everywhere
        try:
            step()
            error = None
        except (OSError, RuntimeError, dcp.api.CheckpointException) as e:
            error = str(_write_failed(path, e, "earlier checkpoints are intact"))
        errors = [e for e in env.gather(error) if e]
        if errors:
            if env.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise UserError(errors[0])

    def fresh_tmp():
        if env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / SHARDS).mkdir(parents=True)

    agreed(fresh_tmp)
    msd, osd = get_state_dict(model, opt)
    digests: dict[str, str] = {}

    def write_shards():
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / SHARDS))
        mine = {f"{SHARDS}/{p.name}": _sha256(p) for p in sorted((tmp / SHARDS).glob(f"__{env.rank}_*"))}
        for part in env.gather(mine):
            digests.update(part)

    agreed(write_shards)

    def finish():
        if env.is_main:
            _write_common(tmp, cfg, meta, tokenizer, trainer_state, digests)
            _put_in_place(tmp, path)

    agreed(finish)
    return path


def prune_checkpoints(run_dir: Path, keep_last: int, verdicts: dict[str, bool]) -> list[Path]:
    """Retention: keep the newest `keep_last` *valid* checkpoints and delete everything older than the oldest of
    them. Corrupted checkpoints never count, so they cannot push a valid one out, and the newest valid checkpoint
    is never deleted. `verdicts` caches each checkpoint's validity (by name) for this process, so each is hashed
    once; whoever writes a checkpoint records it as valid. Returns the deleted directories."""
    ckpts = list_checkpoints(run_dir)
    kept = []
    for ckpt in reversed(ckpts):
        if ckpt.name not in verdicts:
            verdicts[ckpt.name] = is_valid(ckpt)
        if verdicts[ckpt.name]:
            kept.append(ckpt)
            if len(kept) == keep_last:
                break
    if len(kept) < keep_last:
        return []
    doomed = ckpts[:ckpts.index(kept[-1])]
    for ckpt in doomed:
        shutil.rmtree(ckpt, ignore_errors=True)
    return doomed


def tidy_after_kill(run_dir: Path) -> None:
    """Undo what a writer killed mid-save leaves: a step_N.tmp is dropped; a step_N.old whose step_N is missing
    (killed between the two renames that replace a checkpoint) is put back. Call with the run's lock held."""
    d = Path(run_dir) / CHECKPOINTS
    parts = sorted(p for p in d.iterdir() if p.suffix in (".old", ".tmp") and step_of(p.stem) is not None) \
        if d.is_dir() else []
    for part in parts:
        final = part.with_name(part.stem)
        if part.suffix == ".tmp":
            shutil.rmtree(part, ignore_errors=True)
        elif final.exists():
            shutil.rmtree(part, ignore_errors=True)
        else:
            os.replace(part, final)
