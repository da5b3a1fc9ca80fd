"""The study runner: a rate grid, each variant's best rate by a declared selection metric, then seeds at that rate;
every cell trained in a fresh process, probed along training and at the end, and appended to OUT/runs.jsonl as
soon as it finishes. Running a study again trains only the cells that have no record yet; into a folder whose
records were made under other settings (settings.json: steps, width, corpus, probe, ...) it refuses to run.

A study is data (`Study`): its variants as config overrides, the overrides every cell shares, the metric that picks
rates, the probe and the token budgets to probe at. The phases are functions of it and of the records so far:

    grid_cells(study, lrs, layers)              every variant at every rate, seed 0
    best_rates(study, records, lrs, layers)     variant -> its best rate, None until its grid has finished
    widened_grids(study, grids, layers, widen)  variant -> its best rate: all grids side by side, widened past edges
    seed_cells(study, best, seeds, layers)      every variant at its best rate, every seed
    run_cells(study, cells, jobs)               train (in parallel processes) what is missing
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path

from depthlab import UserError
from depthlab.jsonl import read_jsonl
from depthlab.ownership import write_whole
from depthlab.study.probe import ProbeSpec
from depthlab.study.records import append_record, cell_key, load_records
from depthlab.train.callbacks import Callback
from depthlab.workers import exit_with_parent


@dataclass(frozen=True)
class Cell:
    variant: str
    lr: float
    seed: int
    layers: int | None = None

    @property
    def key(self) -> str:
        return cell_key(self.variant, self.lr, self.seed, self.layers)


@dataclass
class Study:
    name: str
    out: str  # runs.jsonl, settings.json (and the summary) live here
    variants: dict[str, list[str]]  # variant name -> its config overrides
    base: list[str] = field(default_factory=list)  # overrides every cell shares (on top of `preset`)
    preset: str = "cpu-tiny"
    runs_dir: str | None = None  # the cells' run directories (default OUT/runs); deleted once probed unless keep_runs
    select: str = "val_loss"  # the final validation metric that picks each variant's rate
    minimize: bool = True
    probe: ProbeSpec | None = None  # language models: probe the final model (and at `budgets`) with this
    budgets: list[int] = field(default_factory=list)  # training tokens at which to probe along training (0: at init)
    corpus: str | None = None  # a study.corpus folder the cells train on (else the config's own data)
    val_tokens: int | None = None  # the trainer evaluates on the first val_tokens of the validation split
    keep_runs: bool = False
    rate_keys: tuple[str, ...] = ("train.lr",)  # the config keys a cell's rate sets (the Muon study: both groups')
    ckpt_every: int = 0  # > 0: cells checkpoint every this many steps and a killed cell resumes where it stopped
    reuse: list[str] = field(default_factory=list)  # runs files of studies whose cells are this one's (same settings)
    command: str = ""  # how the study was started, recorded in settings.json
    meta: dict = field(default_factory=dict)  # the study's own description (sizes, depths, corpus), recorded too

    @property
    def runs_file(self) -> Path:
        return Path(self.out) / "runs.jsonl"

    def records(self) -> dict:
        """This study's records over those of the studies it reuses: a cell one of them trained is not trained
        again (the caller has checked that their settings and corpus are this study's)."""
        reused = {k: r for f in self.reuse for k, r in load_records(Path(f)).items()}
        return {**reused, **load_records(self.runs_file)}

    def config(self, cell: Cell):
        from depthlab.config import apply_overrides
        from depthlab.model.families import preset

        over = [*self.base, *self.variants[cell.variant], *(f"{k}={cell.lr}" for k in self.rate_keys),
                f"train.seed={cell.seed}"]
        if cell.layers is not None:
            over.append(f"model.n_layers={cell.layers}")
        return apply_overrides(preset(self.preset), over)

    def settings(self) -> dict:
        s = asdict(self)
        # where files go is not a setting; the corpus is named by its sha256 in meta
        return {k: v for k, v in s.items() if k not in ("out", "runs_dir", "corpus", "reuse")}


# ---------------------------------------------------------------------------------------------------- phases
def grid_cells(study: Study, lrs: list[float], layers: int | None = None, variants: list[str] | None = None,
               seed: int = 0) -> list[Cell]:
    return [Cell(v, lr, seed, layers) for v in variants or study.variants for lr in lrs]


def selection_value(record: dict, select: str = "val_loss", minimize: bool = True) -> float:
    """The record's selection metric, signed so that lower is better; a diverged run is worst."""
    if record.get("status") != "ok":
        return math.inf
    v = record["val_loss"] if select == "val_loss" else record.get("val", {}).get(select, math.nan)
    return v if minimize else -v


def best_rates(study: Study | None, records: dict, lrs: list[float], layers: int | None = None,
               variants: list[str] | None = None, seed: int = 0, select: str | None = None,
               minimize: bool | None = None) -> dict[str, float | None]:
    """Each variant's rate of `lrs` with the best selection metric at `seed` (the study's own, unless `select` and
    `minimize` are given), once all of its grid has finished; None before."""
    select = select or study.select
    minimize = study.minimize if minimize is None else minimize
    out = {}
    for v in variants or study.variants:
        grid = [records.get(cell_key(v, lr, seed, layers)) for lr in lrs]
        out[v] = min(grid, key=lambda r: selection_value(r, select, minimize))["lr"] if all(grid) else None
    return out


def widened_grids(s: Study, grids: dict[str, list[float]], layers: int | None, widen: int,
                  jobs: int = 1) -> dict[str, float | None]:
    """Train each variant's rate grid (seed 0), all variants' cells side by side, each grid widened by a factor 2
    past an edge that holds its best rate (`widen` times at most); returns each variant's best rate."""
    grids, best = {v: sorted(lrs) for v, lrs in grids.items()}, {}
    for i in range(widen + 1):
        run_cells(s, [c for v, lrs in grids.items() if v not in best for c in grid_cells(s, lrs, layers, [v])], jobs)
        records = s.records()
        for v, lrs in grids.items():
            if v in best:
                continue
            b = best_rates(s, records, lrs, layers, [v])[v]
            if i == widen or min(lrs) < b < max(lrs):
                best[v] = b
            else:
                grids[v] = [*lrs, max(lrs) * 2] if b == max(lrs) else [min(lrs) / 2, *lrs]
        if len(best) == len(grids):
            break
    return best


def seed_cells(study: Study, best: dict[str, float | None], seeds: list[int],
               layers: int | None = None) -> list[Cell]:
    return [Cell(v, lr, s, layers) for s in seeds for v, lr in best.items() if lr is not None]


# What makes a cell's record, besides its variant's overrides and the corpus (by its sha256 in meta): a record counts
# for a study whose settings agree on all of these. Which cells run (depths, seeds, rates), how they are picked
# (select), the command and where files go may change between runs of one study.
RECORD_SETTINGS = ("preset", "base", "rate_keys", "probe", "budgets", "val_tokens")


def settings_differ(old: dict, new: dict) -> list[str]:
    """What differs, in what makes a record, between the settings.json of the study that made some records (`old`)
    and a study's settings (`new`), each as `what: old -> new`; [] when the records count for the new study. A
    setting older files lack reads as its default."""
    default, new = (json.loads(json.dumps(s)) for s in (Study("", "", {}).settings(), new))  # as settings.json has it
    out = []
    for k in RECORD_SETTINGS:
        a, b = old.get(k, default[k]), new.get(k)
        if k == "base" and isinstance(a, list) and isinstance(b, list):
            a, b = [x for x in a if x not in b], [x for x in b if x not in a]  # the overrides that differ
        if a != b:
            out.append(f"{k}: {a} -> {b}")
    for v in sorted(set(old.get("variants") or {}) & set(new.get("variants") or {})):
        if old["variants"][v] != new["variants"][v]:
            out.append(f"variant {v}: {old['variants'][v]} -> {new['variants'][v]}")
    was, now = (((s.get("meta") or {}).get("corpus") or {}).get("sha256") for s in (old, new))
    if was and now and was != now:
        out.append(f"corpus: {was[:12]}… -> {now[:12]}…")
    return out


def _same_settings(study: Study, settings: Path) -> None:
    """Refuse to go on in a folder whose records were made under other settings (steps, width, corpus, probe, ...):
    they would count as this study's cells, and settings.json would be rewritten over them."""
    if not settings.exists() or not study.runs_file.exists():
        return
    try:
        old = json.loads(settings.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{settings} does not read ({e}); it says how the records in {study.runs_file} were made: "
                        "restore it, or give a new --out") from None
    diff = settings_differ(old if isinstance(old, dict) else {}, study.settings())
    if diff:
        raise UserError(f"{study.out} holds records made under other settings ({'; '.join(diff)}); they do not "
                        "count for this study: give a new --out, or run with the settings of its settings.json")


def run_cells(study: Study, cells: list[Cell], jobs: int = 1, log=lambda msg: print(msg, file=sys.stderr),
              more=None) -> list:
    """Train every cell that has no record yet (each in a fresh process, `jobs` at a time), appending each record
    when it finishes. With `more` (the records so far -> the cells that can be trained now, as a study's plan
    reads them), the plan is read again whenever a cell finishes and the freed worker takes its first cell that is
    neither recorded nor running: no worker waits for the slowest cell of a batch. Returns the new records."""
    out = Path(study.out)
    out.mkdir(parents=True, exist_ok=True)
    _same_settings(study, out / "settings.json")
    write_whole(out / "settings.json", json.dumps(study.settings(), indent=2) + "\n")  # read by every rerun
    records, failed, running = [], {}, {}
    pool = None

    def fill() -> None:
        nonlocal pool
        done = study.records()
        busy = {c.key for c in running.values()} | set(failed)
        todo = [c for c in dict.fromkeys([*cells, *(more(done) if more else [])])
                if c.key not in done and c.key not in busy]
        if todo and pool is None:
            log(f"{study.name}: " + (f"the plan's cells, {jobs} at a time" if more else f"{len(todo)} runs"))
            # spawn: no inherited thread pools. A study killed outright (SIGKILL) sends its workers SIGTERM: each
            # running cell saves its step and stops, none trains on alone or holds its run directory from the rerun
            pool = ProcessPoolExecutor(jobs, get_context("spawn"), exit_with_parent, (os.getpid(), signal.SIGTERM))
        for c in todo[:jobs - len(running)]:
            running[pool.submit(_cell_in_worker, study, c)] = c

    try:
        fill()
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                _record(study, running.pop(f), f, records, failed, log)
            fill()
    except BrokenProcessPool:  # a worker killed on its own (the OOM killer, a signal sent to its pid)
        _stop_cells(pool, running, log)
        raise UserError(f"a worker process of {study.name} died (out of memory? killed?); {len(records)} finished "
                        "cells are recorded, the running ones saved what they could: rerun the same command to go "
                        "on") from None
    except BaseException:  # Ctrl-C, SIGTERM, a bug: no cell is left training, none starts
        if pool is not None:
            _stop_cells(pool, running, log)
        raise
    if pool is not None:
        pool.shutdown()
    if failed:
        raise UserError(f"{len(failed)} of {len(records) + len(failed)} runs of {study.name} failed "
                        f"({'; '.join(failed.values())}); the others are recorded")
    return records


def _record(study: Study, cell: Cell, future, records: list, failed: dict, log) -> None:
    """A finished cell's record appended to the study's runs file (and to `records`), or its error to `failed`."""
    try:
        rec = future.result()
    except UserError as e:  # a cell that cannot run (its run directory held by another process, say)
        failed[cell.key] = f"{cell.key}: {e}"  # does not cost the records of the cells that can
        log(f"  {failed[cell.key]}")
        return
    append_record(study.runs_file, rec)
    records.append(rec)
    log(f"  {rec['key']}: {study.select} {rec['val'].get(study.select, rec['val_loss']):.4f} ({rec['wall_s']:.0f} s)")


STOP_GRACE_S = 60.0  # how long the running cells get to stop by themselves before they are sent SIGTERM


def _stop_cells(pool: ProcessPoolExecutor, futures: dict, log) -> None:
    """The study stops: the cells not started never start, and no running cell is left training on its own (the
    pool's way out would wait for every queued cell, and records nobody appends). A Ctrl-C at a terminal reached
    the workers too, and each saves its step and stops by itself; a worker still training after STOP_GRACE_S (the
    signal went to this process alone) gets SIGTERM, which makes it do the same. Waits for them: the checkpoints
    they write are whole."""
    workers = list((pool._processes or {}).values())  # the executor lists its processes nowhere public
    pool.shutdown(wait=False, cancel_futures=True)
    running = [f for f in futures if f.running()]
    if running:
        log("stopping: the running cells save their step and stop")
    wait(running, timeout=STOP_GRACE_S)
    for proc in workers:
        if proc.is_alive() and any(not f.done() for f in running):
            proc.terminate()
    for proc in workers:
        proc.join()


def _cell_in_worker(study: Study, cell: Cell) -> dict:
    """train_cell in a pool worker. A worker whose cell was interrupted ends there, after the cell's own cleanup
    (its checkpoint saved, its lock released), instead of taking the cell queued next; the pool then counts itself
    broken and nothing else starts."""
    try:
        return train_cell(study, cell)
    except KeyboardInterrupt:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)


# ---------------------------------------------------------------------------------------------------- one cell
class _ProbeAlong(Callback):
    """A trainer callback: probe the live model when it has done each of `steps` optimizer steps. With a `file`,
    each probe is appended to it as it is made and the probes already there are kept, so a resumed cell (whose
    model is bitwise the one that made them) does not probe those steps again."""

    def __init__(self, spec: ProbeSpec, val, steps: list[int], tokens_per_step: int, file: Path | None = None):
        self.spec, self.val, self.steps, self.tps, self.file = spec, val, set(steps), tokens_per_step, file
        self.probes: list[dict] = load_probes(file) if file else []

    def on_step_start(self, trainer, step: int) -> None:
        if step - 1 in self.steps:
            self.probe(trainer.module, step - 1)

    def probe(self, model, step: int) -> None:
        from depthlab.study.probe import probe_model

        if any(p["step"] == step for p in self.probes):
            return
        self.probes.append({"step": step, "tokens": step * self.tps, **probe_model(model, self.val, self.spec)})
        if self.file:  # after cutting off a line a killed writer left half-written (load_probes drops it)
            append_record(self.file, self.probes[-1])


def load_probes(file: Path) -> list[dict]:
    """The probes a killed cell left (depthlab.jsonl: a last line cut short is skipped)."""
    return read_jsonl(file, "skipped, that probe runs again")


def _data(study: Study):
    if not study.corpus:
        return None, None
    from depthlab.study.corpus import load_corpus

    return load_corpus(Path(study.corpus), study.val_tokens)


def _test(study: Study):
    if not study.corpus:
        return None
    from depthlab.study.corpus import test_tokens

    return test_tokens(Path(study.corpus))


def _document_losses(study: Study, trainer, cfg, streams: dict) -> dict:
    """The record's per-document losses on each held-out split whose make-up the corpus recorded
    (depthlab.study.corpus): {"doc_losses": {split: [...]}, "doc_scored": {split: [scored tokens per document]}},
    in the order of corpus.json's splits.<split>.names; {} for a corpus without them."""
    from depthlab.study.corpus import document_losses, held_out_units

    units = held_out_units(Path(study.corpus))
    out = {name: document_losses(trainer.module, streams[name], units[name], cfg.data.seq_len, cfg.train.batch_size,
                                 trainer.device, cfg.train.dtype) for name in units if streams.get(name) is not None}
    if not out:
        return {}
    return {"doc_losses": {k: v["loss"] for k, v in out.items()},
            "doc_scored": {k: v["tokens"] for k, v in out.items()}}


def _weighted(rec: dict, split: str) -> float | None:
    """The split's loss from the record's per-document losses (their mean weighted by scored tokens: what
    `evaluate` gives, without a second pass over the split); None without them."""
    losses, scored = rec.get("doc_losses", {}).get(split), rec.get("doc_scored", {}).get(split)
    if not losses or not sum(scored):
        return None
    return sum(x * n for x, n in zip(losses, scored, strict=True) if n) / sum(scored)


def _evaluate(trainer, cfg, tokens) -> float:
    from depthlab.eval.perplexity import evaluate

    return evaluate(trainer.module, tokens, cfg.data.seq_len, cfg.train.batch_size, trainer.device,
                    cfg.train.dtype)["val_loss"]


def train_cell(study: Study, cell: Cell) -> dict:
    """Train one cell, probe it, and return its record (depthlab.study.records)."""
    import shutil

    import torch

    from depthlab.metrics import init_update_ratios
    from depthlab.runfolder import read_metrics
    from depthlab.train.trainer import Trainer, TrainingDiverged

    torch.set_num_threads(1)
    cfg = study.config(cell)
    run_dir = Path(study.runs_dir or Path(study.out) / "runs") / f"{study.name}-{cell.key}"
    data, full_val = _data(study)
    tps = cfg.train.batch_size * cfg.train.grad_accum * cfg.data.seq_len
    probing = study.probe is not None and not cfg.model.is_vit
    resumable = study.ckpt_every > 0
    if resumable:
        cfg = replace(cfg, train=replace(cfg.train, ckpt_every=study.ckpt_every, keep_last=1))
        run_dir.mkdir(parents=True, exist_ok=True)
    along = _ProbeAlong(study.probe, full_val if full_val is not None else None,
                        sorted({round(b / tps) for b in study.budgets if 0 <= round(b / tps) < cfg.train.max_steps}),
                        tps, run_dir / "probes.jsonl" if resumable else None) if probing else None
    rec = {"study": study.name, "key": cell.key, **asdict(cell)}
    if not cfg.model.is_vit:
        rec["init_update_ratio"] = init_update_ratios(cfg.model, seed=cell.seed)
    t0 = time.time()
    trainer = Trainer(cfg, run_dir=run_dir, data=data, callbacks=[along] if along else [], progress=False,
                      overwrite=not resumable, resume="auto" if resumable else None)
    if trainer.step:
        rec["resumed_at_step"] = trainer.step
    if along and along.val is None:
        along.val = trainer.data.val
    try:
        result = trainer.train()
        rec.update(status="ok", val_loss=result.val_loss, val={k: v for k, v in result.val.items()
                                                              if isinstance(v, (int, float))})
        if along:
            along.probe(trainer.module, result.steps)
        test = _test(study)
        if full_val is not None:
            rec.update(_document_losses(study, trainer, cfg, {"val": full_val, "test": test}))
        if test is not None and len(test) > cfg.data.seq_len:  # the split no selection reads: what the page reports
            rec["test_loss"] = _weighted(rec, "test") or _evaluate(trainer, cfg, test)
    except TrainingDiverged as e:
        rec.update(status="diverged", error=str(e), val_loss=math.inf, val={})
    finally:
        trainer.close()
    rec.update(wall_s=time.time() - t0, steps=cfg.train.max_steps, tokens=cfg.train.max_steps * tps)
    rec.update(metrics_summary(read_metrics(run_dir)))
    if along:
        rec.update(probes=along.probes, probe=study.probe.describe())
    if not study.keep_runs:
        shutil.rmtree(run_dir, ignore_errors=True)
    return rec


def metrics_summary(rows: list[dict]) -> dict:
    """What a record keeps of a run's metrics.jsonl: the validation curve(s), every 5th training loss, the
    monitor's update ratios."""
    out = {"val_curve": [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r],
           "loss_curve": [(r["step"], r["loss"]) for r in rows if "loss" in r][::5],
           "monitor_update_ratio": [(r["step"], r["depth/update_ratio"]) for r in rows if "depth/update_ratio" in r]}
    if any("val_acc" in r for r in rows):
        out["acc_curve"] = [(r["step"], r["val_acc"]) for r in rows if "val_acc" in r]
    return out


def tokens_per_parameter(settings: Path, depths: list[int]) -> dict[int, float]:
    """Training tokens per parameter (embeddings included) of a study's cells at each depth, from its settings.json."""
    import torch

    from depthlab.config import apply_overrides
    from depthlab.model.families import preset
    from depthlab.model.transformer import build_model

    s = json.loads(Path(settings).read_text())
    tokens = s["meta"]["steps"] * s["meta"]["batch"] * s["meta"]["seq"]
    out = {}
    for L in depths:
        cfg = apply_overrides(preset(s["preset"]), [*s["base"], f"model.n_layers={L}"])
        with torch.device("meta"):
            out[L] = tokens / build_model(cfg.model, init=False).num_params()
    return out
