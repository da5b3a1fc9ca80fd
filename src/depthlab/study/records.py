"""The runs.jsonl schema. One line per finished cell (a variant at one depth, rate and seed), appended as soon as
the cell finishes, so an interrupted study keeps everything it finished:

    key            "<variant>-L<layers>-lr<lr>-seed<seed>" (no -L part for a study without a depth axis)
    variant, layers, lr, seed
    status         "ok" | "diverged"
    val_loss       final validation loss (inf when diverged); val: every final validation metric (val_acc, ...)
    tokens, steps, wall_s
    val_curve      [[step, val_loss], ...] from the run's metrics.jsonl; loss_curve: every 5th logged training loss
    monitor_update_ratio  [[step, [per block]], ...]: the training monitor's update ratio
    init_update_ratio     per-block update ratio at initialisation
    probes         [{"step", "tokens", "probe_loss", "curse": <index>, per-block lists}, ...] along training and at
                   the end (depthlab.study.probe); the last one is the final model's
    probe          which probe made them ("windows", "seed", "jacobian", ...)
    test_loss      final loss on the corpus's test split (which no selection reads), where the corpus has one
    doc_losses     {"val": [...], "test": [...]}: the final model's mean loss on each held-out document, in the order of
                   the corpus's corpus.json splits.<split>.names (settings.json meta.corpus.splits); None for a document
                   with no scored token. doc_scored: the same shape, the tokens scored per document (weights: their
                   weighted mean is val_loss / test_loss). Only in records of a corpus that records its splits' make-up
                   (depthlab.study.corpus); older records lack both.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from depthlab.jsonl import read_jsonl

TRAINING = ("dim", "heads", "ffn", "vocab", "seq", "batch", "steps", "eval_every", "corpus_mb", "val_tokens",
            "init_std", "embed_std")  # the study settings (in its meta) that decide how a cell trains


def trained_alike(meta: dict, other: Path) -> bool:
    """Whether the study whose settings.json is `other` trained its cells as the study of `meta` does (its TRAINING
    settings and the corpus by its sha256; older files keep them at the top level); its probe may differ."""
    if not other.exists():
        return False
    o = json.loads(other.read_text())
    o = {**o, **o.get("meta", {})}
    sha = o.get("corpus_sha256") or (o.get("corpus") or {}).get("sha256")
    return sha == meta["corpus"]["sha256"] and all(o.get(k) == meta[k] for k in TRAINING)


def recorded_command(module: str, argv: list[str] | None) -> str:
    """A study's command as its settings record it: `python -m MODULE ARGV` (ARGV None: this process's arguments)
    without --out / --runs-dir, so that it names no machine path."""
    kept, skip = [], False
    for a in sys.argv[1:] if argv is None else argv:
        if not skip and a not in ("--out", "--runs-dir") and not a.startswith(("--out=", "--runs-dir=")):
            kept.append(a)
        skip = a in ("--out", "--runs-dir")
    return " ".join([f"python -m {module}", *kept])


def cell_key(variant: str, lr: float, seed: int, layers: int | None = None) -> str:
    return f"{variant}{'' if layers is None else f'-L{layers}'}-lr{lr:g}-seed{seed}"


def record_key(r: dict) -> str:
    return cell_key(r["variant"], r["lr"], r["seed"], r.get("layers"))


def load_records(path: Path) -> dict[str, dict]:
    """Every record of a runs.jsonl by key (a later line for the same key wins); {} when there is no file. A last
    line cut short is skipped (depthlab.jsonl): its cell runs again."""
    return {record_key(r): r for r in read_jsonl(path, "skipped, its cell runs again", need=("variant", "lr", "seed"))}


def append_record(path: Path, record: dict) -> None:
    """One line, written with one write and synced, after cutting off a last line that an interrupted writer left
    without its newline (load_records skips it): the new record never joins a broken one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab+") as fh:
        size = fh.seek(0, 2)
        if size:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                fh.seek(0)
                fh.truncate(fh.read().rfind(b"\n") + 1)
        fh.write((json.dumps(record) + "\n").encode())
        fh.flush()
        os.fsync(fh.fileno())


def final_probe(r: dict) -> dict | None:
    """The probe of the final model: the last of `probes`."""
    return r["probes"][-1] if r.get("probes") else None


OLD_PROBE = {"windows": 64, "where": "the first 64 windows of validation", "jacobian": False, "old": True}


def upgrade(r: dict) -> dict:
    """A record of the earlier depth study (probe fields at the top level, 64 windows at the head of validation, no
    Jacobian, all-token angular distances only) in this schema; its index is recomputed from its per-block removal
    costs, without an interval (the per-window sums were not kept)."""
    if "probes" in r or "removal" not in r:
        return {**r, "key": record_key(r)}
    from depthlab.study.probe import index_from_costs

    probe = {"step": r.get("val_curve", [[None]])[-1][0], "tokens": r.get("tokens"), "probe_loss": r["probe_loss"],
             "update_ratio": r["update_ratio"], "var": r["var"], "angular_all": r["angular"],
             "removal": r["removal"], "curse": index_from_costs(r["removal"], r["update_ratio"])}
    rest = {k: v for k, v in r.items() if k not in ("probe_loss", "update_ratio", "var", "angular", "removal")}
    return {**rest, "key": record_key(r), "probes": [probe], "probe": OLD_PROBE}
