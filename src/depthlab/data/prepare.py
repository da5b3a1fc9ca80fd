"""`depthlab data prepare`: tokenize once into binary token files plus a JSON index; resumable and idempotent.

A prepared directory holds

    index.json           tokenizer hash, vocabulary size, EOT id, dtype, documents, tokens and sha256 per split,
                         the validation split's make-up, the held-out rule (and how many generated files it kept
                         out), source, skipped files, and the request (inputs + settings) it was made from
    tokenizer.json
    train.bin, val.bin   packed token ids (uint16 when the vocabulary fits, else uint32), EOT after every document
                         (after every chunk of a held-out document, by the balanced rule)

Work happens in DIR/.work: a plan (the inputs grouped into units of whole files), the tokenizer, and per finished
unit a token shard, its document lengths, (by the balanced held-out rule) each document's name, generated-file
flag and held-out chunks, and a done-marker, each written to a temporary name and renamed. Units run in worker
processes, each tokenizing with the batch API. At the end every document is routed to train or validation by its
index in the whole input (so the split does not depend on units or workers): by the balanced rule
(depthlab.data.tokens.held_out_mask, the study corpora's) the chunks of the held-out documents are tokenized then
and make up val.bin, the rest of each held-out document is used nowhere. A rerun of the
same request finishes the missing units only; index.json is written last, so a directory with an index is
complete and a rerun of a finished job does nothing. Bad input (a UserError) removes the work, so nothing
half-written is left behind; an interruption keeps it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import queue as queue_lib
import shutil
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from depthlab import UserError
from depthlab.checkpoint import TOKENIZER as TOKENIZER_FILE, write_failure
from depthlab.data.prepared import VERSION
from depthlab.data.sources import (
    HF_PREFIX,
    BadFile,
    Document,
    builtin_files,
    describe_inputs,
    expand,
    file_documents,
    kind_of,
)
from depthlab.data.tokenizer import eot_id, load_tokenizer, tokenizer_hash, train_bpe
from depthlab.data.tokens import (
    check_composition,
    composition,
    encode_texts,
    generated,
    held_chunks,
    held_out_mask,
    held_stream,
    is_val,
    rebalance,
    token_dtype,
    val_period,
)
from depthlab.ownership import claim, locked, write_whole
from depthlab.paths import (
    PREPARED_FORMAT as FORMAT,
    PREPARED_INDEX as INDEX,
    PREPARED_PLAN as PLAN,
    PREPARED_WORK as WORK,
    Kind,
    what_is,
)
from depthlab.workers import exit_with_parent

SPLITS = ("train", "val")
BATCH_DOCS, BATCH_BYTES = 512, 4_000_000  # one encode_batch call per this many documents or bytes
# Input bytes per unit (a unit is whole files, so one big file is one unit). Smaller inputs than the minimum run
# in this process, the tokenizer's own threads encoding each batch: starting a worker process costs about a second.
UNIT_MIN_BYTES, UNIT_MAX_BYTES = 16e6, 64e6
# A larger document is cut at line breaks into pieces of at most this size (a 50 MB document would otherwise be
# one unsplittable item of the held-out rule: the whole validation split, or none of it); a longer single line
# is refused before any text is read.
MAX_DOCUMENT_BYTES = 16_000_000
HELD_OUT = ("balanced", "alternate")  # the held-out rules (depthlab.study.corpus.build_corpus's names)
MIN_VOCAB = 257  # byte-level BPE: the 256 byte tokens and <|endoftext|>


def write_json_atomic(path: Path, obj) -> None:
    write_whole(path, json.dumps(obj, indent=1) + "\n")


def fingerprint(items: list[str]) -> list:
    """What the inputs are: hf specs by name, files by path, size and modification time."""
    out = []
    for item in items:
        if item.startswith(HF_PREFIX):
            out.append([item])
        else:
            st = os.stat(item)
            out.append([item, st.st_size, st.st_mtime_ns])
    return out


def plan_units(items: list[str], workers: int, streaming: bool, unit_bytes: float | None = None) -> list[dict]:
    """Group files, in order, into units of `unit_bytes` or by default about total / (4 * workers) bytes (within
    UNIT_MIN_BYTES..UNIT_MAX_BYTES), so every worker gets several units; a map-style hf: dataset is split into
    `workers` contiguous shards."""
    sizes = {i: os.path.getsize(i) for i in items if not i.startswith(HF_PREFIX)}
    target = unit_bytes or min(UNIT_MAX_BYTES, max(UNIT_MIN_BYTES, sum(sizes.values()) / (4 * workers)))
    groups: list[list] = []
    current, size = [], 0
    for item in items:
        if item.startswith(HF_PREFIX):
            n = 1 if streaming else workers
            groups += [[[item, i, n]] for i in range(n)]
            continue
        current.append([item, 0, 1])
        size += sizes[item]
        if size >= target:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return [{"index": k, "sources": g} for k, g in enumerate(groups)]


def _unit_path(work: Path, index: int, suffix: str) -> Path:
    return work / f"unit-{index:05d}.{suffix}"


# ---------------------------------------------------------------- oversized documents
def check_line_lengths(items: list[str], limit: int | None = None) -> None:
    """Refuse an input holding a single line longer than the limit, before any text is read: it could neither be
    cut into documents nor tokenized in reasonable time and memory. Only plain files larger than the limit are
    scanned, a line at a time of at most limit + 1 bytes, stopping at the first such line."""
    limit = limit or MAX_DOCUMENT_BYTES
    for item in items:
        if item.startswith(HF_PREFIX) or kind_of(item) == "parquet" or item.endswith(".gz"):
            continue  # checked document by document as they are read (bounded)
        size = os.path.getsize(item)
        if size > limit and _has_line_longer_than(item, limit):
            raise UserError(f"{item} holds a single line of more than {limit / 1e6:g} MB (the file is "
                            f"{size / 1e6:.1f} MB); documents are cut at line breaks only: break it into lines")


def _has_line_longer_than(path: str, limit: int) -> bool:
    with open(path, "rb") as f:
        while line := f.readline(limit + 1):
            if len(line.rstrip(b"\r\n")) > limit:
                return True
    return False


def bounded(doc: Document, limit: int | None = None) -> list[Document]:
    """The document, or for one larger than the limit its pieces cut at line breaks, each within the limit."""
    limit = limit or MAX_DOCUMENT_BYTES
    if len(doc.text) <= limit:
        return [doc]
    pieces, current, size = [], [], 0
    for line in doc.text.splitlines(keepends=True):
        if len(line) > limit:
            raise UserError(f"{doc.name} holds a single line of {len(line) / 1e6:.1f} MB, more than the "
                            f"{limit / 1e6:g} MB a document may have; break it into lines")
        if size + len(line) > limit:
            pieces.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    pieces.append("".join(current))
    return [Document(f"{doc.name}#{i}", text) for i, text in enumerate(pieces)]


def documents(path: str, settings: dict, shard: tuple[int, int] = (0, 1)):
    """A source's documents as units and the BPE sample see them: oversized ones cut (bounded)."""
    for doc in file_documents(path, settings["text_field"], settings["streaming"], shard):
        yield from bounded(doc)


# ---------------------------------------------------------------- one unit (runs in a worker process)
_worker: dict = {}  # per process: the tokenizer and the progress callback


class WorkerDied(UserError):
    """Not bad input: the work done so far is kept, and rerunning resumes it."""


class Stopped(Exception):
    """Another unit failed: this worker stops at its next batch instead of finishing work that will be discarded."""


def _init_worker(parent: int, tokenizer_json: str, progress_queue, stop, threads: int) -> None:
    exit_with_parent(parent)  # SIGKILL: a unit that is cut short is simply done again
    if threads:  # read by the tokenizers thread pool on first use; keeps workers from oversubscribing the cores
        os.environ["RAYON_NUM_THREADS"] = str(threads)
    _worker["tok"] = Tokenizer.from_str(tokenizer_json)
    _worker["report"] = lambda docs, nbytes: progress_queue.put((docs, nbytes))
    _worker["stop"] = stop


def run_unit(unit: dict, settings: dict) -> dict:
    """Tokenize one unit's files into its token shard and document lengths; a bad file is undone whole."""
    tok, report = _worker["tok"], _worker["report"]
    eot, dtype = eot_id(tok), token_dtype(tok.get_vocab_size())
    work, k = Path(settings["work"]), unit["index"]
    final = {"tokens": _unit_path(work, k, "bin"), "lengths": _unit_path(work, k, "lengths")}
    balanced = settings["held_out"] == "balanced"
    if balanced:  # per document a JSON line [name, generated, the chunks it keeps if held out]: _finalize routes it
        final["held"] = _unit_path(work, k, "held")
    tmp = {name: path.with_name(f"{path.name}.tmp-{os.getpid()}") for name, path in final.items()}
    files = {name: open(path, "wb") for name, path in tmp.items()}
    pending: list[Document] = []
    skipped, files_read, n_docs, n_tokens, chars = [], 0, 0, 0, 0

    def flush():
        nonlocal n_tokens
        if _worker.get("stop") is not None and _worker["stop"].is_set():
            raise Stopped
        if pending:
            ids, lengths = encode_texts(tok, [d.text for d in pending], eot, dtype)
            ids.tofile(files["tokens"])
            lengths.tofile(files["lengths"])
            if balanced:
                files["held"].write("".join(json.dumps(_held_line(d)) + "\n" for d in pending).encode())
            n_tokens += len(ids)
            report(len(pending), sum(len(d.text.encode()) for d in pending))
            pending.clear()

    try:
        for path, shard, shards in unit["sources"]:
            # Where to return to if this file turns out bad; files are batched together, not flushed one by one.
            mark = ({name: f.tell() for name, f in files.items()}, n_docs, n_tokens, list(pending))
            try:
                for doc in documents(path, settings, (shard, shards)):
                    pending.append(doc)
                    n_docs += 1
                    chars += len(doc.text)
                    if len(pending) >= BATCH_DOCS or chars >= BATCH_BYTES:
                        flush()
                        chars = 0
                files_read += 1
            except BadFile as e:
                if settings["fatal_bad_files"]:
                    raise UserError(f"{path}: {e}") from None
                skipped.append([path, str(e)])
                offsets, n_docs, n_tokens, pending[:] = mark
                for name, f in files.items():
                    f.truncate(offsets[name])
                    f.seek(offsets[name])
        flush()
        for name in files:
            files[name].close()
            os.replace(tmp[name], final[name])
    finally:
        for name in files:
            files[name].close()
            tmp[name].unlink(missing_ok=True)
    record = {"index": k, "files_read": files_read, "skipped": skipped, "documents": n_docs, "tokens": n_tokens}
    write_json_atomic(_unit_path(work, k, "json"), record)
    return record


def _held_line(doc: Document) -> list:
    """What _finalize needs of a document to hold it out by the balanced rule: its name, whether it is generated,
    and (if not) the chunks it keeps when held out."""
    gen = generated(doc)
    return [doc.name, gen, [] if gen else held_chunks(doc)]


# ---------------------------------------------------------------- the whole job
def _sample_texts(units: list[dict], settings: dict, max_bytes: float) -> list[str]:
    """Training documents (by the same held-out rule as the units) for training the BPE, up to max_bytes."""
    texts, total, doc_index, eligible = [], 0, 0, 0  # documents, and those the balanced rule may hold out, so far
    balanced, period = settings["held_out"] == "balanced", settings["period"]
    for unit in units:
        for path, shard, shards in unit["sources"]:
            mine, start = [], (doc_index, eligible)
            try:
                for doc in documents(path, settings, (shard, shards)):
                    gen = balanced and generated(doc)
                    held = held_out_mask(np.array([gen]), period, eligible)[0] if balanced else is_val(doc_index,
                                                                                                        period)
                    if not held:
                        mine.append(doc.text)
                        total += len(doc.text)
                    doc_index += 1
                    eligible += not gen
                    if total >= max_bytes:
                        return texts + mine
            except BadFile:  # the unit will skip (or fail on) this file; leave it out here too
                (doc_index, eligible), total = start, total - sum(map(len, mine))
                continue
            texts += mine
    return texts


def _run_units(units: list[dict], settings: dict, tokenizer_json: str, workers: int, progress: bool) -> None:
    bar = tqdm(desc="prepare", unit="doc", disable=not progress, dynamic_ncols=True, file=sys.stderr)
    t0, total_bytes = time.time(), 0

    def advance(docs: int, nbytes: int) -> None:
        nonlocal total_bytes
        total_bytes += nbytes
        bar.set_postfix_str(f"{total_bytes / 1e6 / max(time.time() - t0, 1e-9):.1f} MB/s", refresh=False)
        bar.update(docs)

    try:
        if workers == 1:  # in this process: no start-up cost, and the tokenizer may use every core itself
            _worker.update(tok=Tokenizer.from_str(tokenizer_json), report=advance, stop=None)
            for unit in units:
                run_unit(unit, settings)
            return
        # spawn, not fork: a forked child inherits (and disables) the tokenizer's thread pool. A pool of futures,
        # so a worker that dies (out of memory, killed) fails the job instead of hanging it.
        ctx = mp.get_context("spawn")
        progress_queue, stop = ctx.Queue(), ctx.Event()
        threads = max(1, (os.cpu_count() or 1) // workers)
        with ProcessPoolExecutor(workers, ctx, _init_worker,
                                 (os.getpid(), tokenizer_json, progress_queue, stop, threads)) as pool:
            running = set()
            try:
                running = {pool.submit(run_unit, unit, settings) for unit in units}
                while running:
                    done, running = wait(running, timeout=0.1, return_when=FIRST_COMPLETED)
                    for future in done:
                        future.result()  # re-raises a worker's error here
                    with contextlib.suppress(queue_lib.Empty):
                        while True:
                            advance(*progress_queue.get_nowait())
            except (BrokenProcessPool, BrokenPipeError):  # the second: one died while being started
                raise WorkerDied("a data prepare worker process died (out of memory?); rerun the same command to "
                                 "resume, perhaps with fewer --workers") from None
            finally:  # on any error, stop the other workers at their next batch
                stop.set()
                for future in running:
                    future.cancel()
    finally:
        bar.close()


def _finalize(out: Path, work: Path, plan: dict, tok: Tokenizer, source: str, settings: dict) -> dict:
    """Route every document to train or val by its index in the whole input, and write the split files."""
    records = [json.loads(_unit_path(work, u["index"], "json").read_text()) for u in plan["units"]]
    skipped = [s for r in records for s in r["skipped"]]
    files_read = sum(r["files_read"] for r in records)
    if not files_read:
        raise UserError(f"no usable text in {source}; skipped {len(skipped)}: "
                        + ", ".join(f"{p} ({why})" for p, why in skipped[:3]))
    n_docs = sum(r["documents"] for r in records)
    balanced = settings["held_out"] == "balanced"
    dtype = token_dtype(tok.get_vocab_size())
    docs, tokens, first = dict.fromkeys(SPLITS, 0), dict.fromkeys(SPLITS, 0), 0
    held = {"eligible": 0, "generated": 0, "parts": [], "sizes": [], "at": []}  # what _held_out collects
    digests = {s: hashlib.sha256() for s in SPLITS}  # recorded in the index, checked whenever the data is opened
    try:
        with open(out / "train.bin.tmp", "wb") as train, open(out / "val.bin.tmp", "wb") as val:
            for r in records:
                ids = np.fromfile(_unit_path(work, r["index"], "bin"), dtype=dtype)
                lengths = np.fromfile(_unit_path(work, r["index"], "lengths"), dtype=np.int64)
                held_out = _held_out(work, r["index"], lengths, first, settings, held)
                in_val = np.repeat(held_out, lengths)
                parts = (("train", train, ids[~in_val]),) + (() if balanced else (("val", val, ids[in_val]),))
                for split, f, part in parts:
                    part.tofile(f)
                    digests[split].update(part.tobytes())
                    tokens[split] += len(part)
                docs["val"] += int(held_out.sum())
                docs["train"] += len(lengths) - int(held_out.sum())
                first += len(lengths)
            if not docs["val"] or not docs["train"]:
                kept = f" (generated files are never held out: {held['generated']} here)" if balanced else ""
                raise UserError(f"{n_docs} document(s) in {source}: too few to hold out a validation set by whole "
                                f"documents{kept}; give more documents or a larger --val-fraction, or train on it "
                                f"directly with `depthlab train --data {source}` (which cuts fewer than 20 documents "
                                "into pieces at lines)")
            n_val, make_up = _finish_val(val, tok, held, plan, settings, digests["val"])
            tokens["val"] = tokens["val"] if n_val is None else n_val
    except BaseException:
        for split in SPLITS:
            (out / f"{split}.bin.tmp").unlink(missing_ok=True)
        raise
    for s in SPLITS:
        os.replace(out / f"{s}.bin.tmp", out / f"{s}.bin")
    tok.save(str(out / TOKENIZER_FILE))
    summary = f"{files_read} file(s), {n_docs} documents"
    if skipped:
        summary += f", {len(skipped)} bad file(s) skipped"
    index = {"format": FORMAT, "version": VERSION, "source": f"{source} ({summary})",
             "held_out": settings["held_out"], **({"generated": held["generated"]} if balanced else {}),
             "tokenizer_hash": tokenizer_hash(tok), "vocab_size": tok.get_vocab_size(), "eot_id": eot_id(tok),
             "dtype": np.dtype(dtype).name, "files_read": files_read, "skipped": skipped,
             "splits": {s: {"file": f"{s}.bin", "documents": docs[s], "tokens": tokens[s],
                            "sha256": digests[s].hexdigest(), **({"composition": make_up} if s == "val" else {})}
                        for s in SPLITS},
             "request": plan["request"]}
    write_json_atomic(out / INDEX, index)
    shutil.rmtree(work)
    return index


def _finish_val(f, tok: Tokenizer, held: dict, plan: dict, settings: dict, digest) -> tuple[int | None, dict]:
    """The validation split's make-up, checked with settings["check"]; by the balanced rule first its stream (the
    held-out documents' chunks, fewer by `rebalance`, tokenized now) written to `f`, and its tokens (None:
    written already, by the alternate rule)."""
    n = None
    if settings["held_out"] == "balanced":
        parts = rebalance(held["parts"])
        ids, doc_tokens = held_stream(tok, parts)
        ids.tofile(f)
        digest.update(ids.tobytes())
        n, make_up = len(ids), composition([name for name, _ in parts], doc_tokens)
    else:
        make_up = _make_up(np.concatenate(held["sizes"]), held["at"], plan, settings)
    if settings["check"]:
        check_composition("val", make_up, "give more documents or a larger --val-fraction (or leave out --held-out "
                          "to be warned instead)")
    return n, make_up


def _held_out(work: Path, unit: int, lengths: np.ndarray, first: int, settings: dict, held: dict) -> np.ndarray:
    """Which of a unit's documents (`first`: the number before it in the whole input) are held out. Balanced:
    held_out_mask over their generated-file flags, collecting each held-out one's (name, chunks) in held["parts"];
    alternate: is_val by index, collecting each one's tokens and (unit, index in it) in held["sizes"], ["at"]."""
    if settings["held_out"] == "balanced":
        lines = [json.loads(x) for x in _unit_path(work, unit, "held").read_text().splitlines()]
        gen = np.array([g for _, g, _ in lines], dtype=bool)
        out = held_out_mask(gen, settings["period"], held["eligible"])
        held["parts"] += [(name, cs) for (name, _, cs), h in zip(lines, out, strict=True) if h]
        held["eligible"] += int((~gen).sum())
        held["generated"] += int(gen.sum())
        return out
    out = is_val(np.arange(first, first + len(lengths)), settings["period"])
    held["sizes"].append(lengths[out])
    held["at"] += [(unit, int(i)) for i in np.flatnonzero(out)]
    return out


def _make_up(sizes: np.ndarray, at: list[tuple[int, int]], plan: dict, settings: dict, top: int = 3) -> dict:
    """The validation split's composition (depthlab.data.tokens.composition: documents, tokens, Kish's effective
    number, the largest shares), its largest documents named by reading their units' files again."""
    sizes = sizes.astype(np.float64)
    total, order = float(sizes.sum()), np.argsort(-sizes, kind="stable")[:top]
    units = {u["index"]: u for u in plan["units"]}
    wanted: dict[int, set[int]] = {}
    for i in order:
        wanted.setdefault(at[i][0], set()).add(at[i][1])
    names = {(k, j): name for k, js in wanted.items() for j, name in _unit_names(units[k], settings, js).items()}
    return {"documents": int(len(sizes)), "tokens": int(total),
            "effective": round(total ** 2 / float((sizes ** 2).sum()), 1) if total else 0.0,
            "max_share": round(float(sizes[order[0]]) / total, 4) if total else 0.0,
            "top": [[names.get(at[i], f"document {at[i][1]} of unit {at[i][0]}"), round(float(sizes[i]) / total, 4)]
                    for i in order]}


def _unit_names(unit: dict, settings: dict, wanted: set[int]) -> dict[int, str]:
    """The names of a unit's documents at positions `wanted`, counted as run_unit counts them (a bad file's
    documents do not count)."""
    out, n = {}, 0
    for path, shard, shards in unit["sources"]:
        mine, start = {}, n
        try:
            for doc in documents(path, settings, (shard, shards)):
                if n in wanted:
                    mine[n] = doc.name
                n += 1
        except BadFile:
            n = start
            continue
        out.update(mine)
        if len(out) == len(wanted):
            break
    return out


def _check_settings(val_fraction: float, vocab_size: int, workers: int, tokenizer: str | None) -> None:
    if not 0 < val_fraction < 1:
        raise UserError(f"the validation fraction must be in (0, 1), got {val_fraction}")
    if tokenizer is None and vocab_size < MIN_VOCAB:
        raise UserError(f"--vocab-size must be at least {MIN_VOCAB} (the 256 byte tokens and <|endoftext|>), got "
                        f"{vocab_size}")
    if workers < 0:
        raise UserError(f"--workers must be 0 (one per CPU core) or more, got {workers}")


def _is_prepared(out: Path) -> bool:
    """Prepared data, finished or not (only its .work directory so far): what `data prepare` may write again."""
    return what_is(out) is Kind.PREPARED or all(p.name == WORK for p in out.iterdir())


def _check_out(out: Path, request: dict, overwrite: bool, log) -> dict | None:
    """The finished index when `out` already holds exactly this request; None when the job is to run. Refuses
    anything but missing, empty or prepared-data directories (depthlab.ownership.claim; with `overwrite` another
    directory is removed first)."""
    kind = claim(out, _is_prepared, "data prepare", overwrite, choose="--out",
                 output="a depthlab prepared-data directory")
    if (out / INDEX).is_file() and kind is Kind.PREPARED:
        index = json.loads((out / INDEX).read_text())
        if index.get("request") == request:
            log(f"{out} is already prepared from these inputs: nothing to do")
            return index
        if not overwrite:
            raise UserError(f"{out} already holds data prepared from other inputs or settings; choose another --out, "
                            "or pass --overwrite to replace it")
    ours = kind in (Kind.MISSING, Kind.EMPTY) or _is_prepared(out)
    if not ours or (out / INDEX).is_file():  # with --overwrite: another directory, or data of another request
        shutil.rmtree(out)
    return None


def prepare(inputs: list[str], out: str | Path, *, tokenizer: str | None = None, vocab_size: int = 32000,
            text_field: str = "text", val_fraction: float = 0.05, workers: int = 0, fatal_bad_files: bool = False,
            streaming: bool = False, builtin_mb: float = 4.0, tokenizer_sample_mb: float = 200.0,
            unit_mb: float | None = None, progress: bool = True, overwrite: bool = False,
            held_out: str = "balanced", check: bool = False, log=lambda msg: print(msg, file=sys.stderr)) -> dict:
    """Prepare `inputs` (files, folders, globs, hf: specs; empty: the built-in corpus) into `out`; return the
    index. `tokenizer`: a tokenizer.json or transformers directory; None trains byte-level BPE of `vocab_size`
    on up to `tokenizer_sample_mb` of the training documents. `unit_mb`: input per unit of work (resume
    granularity; default: automatic). `held_out`: "balanced" (the rule of the study corpora: generated files never
    held out, a held-out document a few chunks of it; with `check`, a validation split of Kish effective documents
    < 30 or one document over 10% of it is refused) or "alternate" (every val_period-th document whole, the rule
    of data prepared before issue 50). `out` is locked for the whole job, so a concurrent prepare into it fails at
    once; it must be missing, empty or prepared data (unless `overwrite`)."""
    _check_settings(val_fraction, vocab_size, workers, tokenizer)
    if held_out not in HELD_OUT:
        raise UserError(f"--held-out must be one of {', '.join(HELD_OUT)}, got {held_out!r}")
    items = [i if i.startswith(HF_PREFIX) else os.path.abspath(i)
             for i in (expand(inputs) if inputs else map(str, builtin_files(builtin_mb)))]
    check_line_lengths(items)
    source = describe_inputs(inputs) if inputs else "built-in corpus (Python standard library)"
    given = load_tokenizer(tokenizer) if tokenizer else None
    request = {"inputs": fingerprint(items), "text_field": text_field, "val_fraction": val_fraction,
               "streaming": streaming, **({} if held_out == "alternate" else {"held_out": held_out}),
               "tokenizer": tokenizer_hash(given) if given else {"bpe_vocab": vocab_size,
                                                                 "sample_mb": tokenizer_sample_mb}}
    out = Path(out)
    settings = {"work": str(out / WORK), "text_field": text_field, "streaming": streaming,
                "fatal_bad_files": fatal_bad_files, "period": val_period(val_fraction), "held_out": held_out,
                "check": check}
    job = {"items": items, "request": request, "source": source, "given": given, "vocab_size": vocab_size,
           "sample_bytes": tokenizer_sample_mb * 1e6, "unit_bytes": unit_mb and unit_mb * 1e6,
           "workers": workers if workers > 0 else (os.cpu_count() or 1), "progress": progress}
    with locked(out, "data prepare"):
        index = _check_out(out, request, overwrite, log) or _run_job(out, job, settings, log)
    if index["skipped"]:
        path, why = index["skipped"][0]
        log(f"skipped {len(index['skipped'])} bad file(s), e.g. {path}: {why}")
    return index


def _run_job(out: Path, job: dict, settings: dict, log) -> dict:
    """Plan (or find the plan of an interrupted run), tokenize the units not done yet, and finalize."""
    work = out / WORK
    try:
        plan_path = work / PLAN
        if plan_path.is_file() and json.loads(plan_path.read_text()).get("request") != job["request"]:
            log(f"{out}: the inputs or settings changed since the interrupted run; starting over")
            shutil.rmtree(work)
        if not plan_path.is_file():
            work.mkdir(parents=True, exist_ok=True)
            units = plan_units(job["items"], job["workers"], settings["streaming"], job["unit_bytes"])
            tok = job["given"] or train_bpe(_sample_texts(units, settings, job["sample_bytes"]), job["vocab_size"],
                                        job["progress"])
            tok.save(str(work / TOKENIZER_FILE))
            write_json_atomic(plan_path, {"request": job["request"], "units": units})
        plan = json.loads(plan_path.read_text())
        tok = Tokenizer.from_file(str(work / TOKENIZER_FILE))
        todo = [u for u in plan["units"] if not _unit_path(work, u["index"], "json").is_file()]
        if len(todo) < len(plan["units"]):
            log(f"{out}: resuming, {len(plan['units']) - len(todo)} of {len(plan['units'])} units already done")
        if todo:
            _run_units(todo, settings, tok.to_str(), min(job["workers"], len(todo)), job["progress"])
        return _finalize(out, work, plan, tok, job["source"], settings)
    except UserError as e:
        if not isinstance(e, WorkerDied):  # bad input: leave nothing half-written behind
            shutil.rmtree(work, ignore_errors=True)
            with contextlib.suppress(OSError):
                out.rmdir()  # only if empty: the directory this job (or its interrupted first try) made
        raise
    except OSError as e:  # a full disk, an unwritable --out
        for split in SPLITS:  # a half-written split file only takes the space a rerun needs
            (out / f"{split}.bin.tmp").unlink(missing_ok=True)
        raise UserError(f"cannot write {out}: {write_failure(out, e)}; nothing was lost: the work done so far is "
                        "kept, and rerunning the same command resumes it") from None
