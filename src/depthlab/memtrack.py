"""What a training step holds at its peak, measured by PyTorch's own trackers, in the dry-run plan's categories.

The step is the trainer's: the model and its parallel wrapping from depthlab.train.distributed.build_parallel, the
trainer's optimizer (make_optimizer), its forward and backward per micro-batch
(depthlab.train.trainer.backward_steps, the function Trainer.train_step runs: the loss by chunks under autocast),
clipping, the optimizer step, gradients set to None. It runs on random tokens of the plan's shape (memory does not
depend on their values) -- two steps, the second holding AdamW's moments, of at most two micro-batches (the second
is where the first one's gradients meet a forward's activations; more add nothing new) -- under
torch.distributed._tools.mem_tracker.MemTracker, or on an FSDP rank under FSDPMemTracker, which also tells the
gathered blocks apart. Each category is read at the total's peak, the gradients and the activations at their own,
the optimizer's states after the steps (the trackers count whatever a step makes as optimizer state: under
train.optimizer=muon the most Muon's step holds beyond its states is its own category). Real tensors on the CPU
(FSDP ranks are spawned processes over gloo), or everything under FakeTensorMode: shapes only, no memory, FSDP
against a fake process group of the plan's world size, so that one rank of a 7B run is measured on a laptop.

Below them, the meters the memory benchmarks read (benchmarks/memory.py, benchmarks/scaleout.py): the bytes autograd
saves for backward, by the module that saved them; the peak of live tensor bytes from the profiler's allocation
events; the peak resident set per named phase.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from depthlab import UserError
from depthlab.config import Config, per_rank_batch
from depthlab.progress import progress_bar

# the plan's categories, each from the trackers' own (MemTracker's and FSDPMemTracker's names)
CATEGORIES = {"parameters": ("Parameter", "Buffer", "Sharded Param"), "gradients": ("Gradient", "Sharded Grad"),
              "optimizer": ("Optstate", "OptState"),
              "gathered blocks": ("Unsharded Param", "Unsharded Grad", "All Gather", "Reduce Scatter"),
              "activations": ("Activation", "Temp", "Inputs", "Other")}
STEPS = 2
_TOTAL = "Total"  # the trackers' key of the total


def micro_batches(cfg: Config) -> int:
    """How many micro-batches the measured steps take: STEPS steps of at most two."""
    return STEPS * min(cfg.train.grad_accum, 2)


def _train_steps(cfg: Config, model, opt, device: torch.device, world_size: int, clip: bool):
    """STEPS optimizer steps of at most two micro-batches each, the trainer's (backward_steps; clipping when `clip`);
    yields after each micro-batch's backward."""
    from depthlab.train.optim import clip_gradients
    from depthlab.train.trainer import backward_steps

    tc, micro = cfg.train, micro_batches(cfg) // STEPS
    gen = torch.Generator().manual_seed(0)
    shape = (per_rank_batch(tc, world_size), cfg.data.seq_len)
    x, y = (torch.randint(cfg.model.vocab_size, shape, generator=gen).to(device) for _ in range(2))
    for _ in range(STEPS):
        for _ in backward_steps(model, lambda: (x, y), tc, device, micro):
            yield
        if clip:
            clip_gradients(model, cfg)
        opt.step()
        opt.zero_grad(set_to_none=True)


def _by_category(snap: dict) -> dict[str, int]:
    by_name = {getattr(k, "value", k): v for k, v in snap.items()}
    return {c: sum(by_name.get(n, 0) for n in names) for c, names in CATEGORIES.items()}


OWN_PEAK = ("gradients", "activations")  # read at their own peaks, not at the total's


def _category(reftype) -> str | None:
    return next((c for c, names in CATEGORIES.items() if getattr(reftype, "value", reftype) in names), None)


def _tracker(module, opt):
    """MemTracker, or FSDPMemTracker for an FSDP model, that also keeps the gradients' and the activations' own
    peaks: the trackers keep the total's, which with one micro-batch falls before backward has formed any
    gradient, and under activation checkpointing late in backward, when the activations have fallen. A tensor is
    counted in the category it ends up in: the trackers label a new tensor by the phase it is made in and relabel
    it later (a parameter's gradient is a backward temporary until its hook runs; under FSDP a block's gathered
    parameters and unsharded gradients are activations and temporaries until FSDP's hooks finish), so the
    category's bytes after each operation are kept, and corrected back to the tensor's birth when it moves."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker, _UpdateType
    from torch.distributed.fsdp import FSDPModule

    base = FSDPMemTracker if isinstance(module, FSDPModule) else MemTracker

    class Tracker(base):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            self.timeline: dict[str, list[int]] = {c: [] for c in OWN_PEAK}  # bytes after each operation
            self.born: dict[int, int] = {}  # id of a storage's record -> the operation it appeared after
            self.optimizer_bytes: list[int] = []  # the optimizer category after each operation
            self.step_extra = 0  # _watch_step's

        def own_peak(self) -> dict[str, int]:
            return {c: max(t, default=0) for c, t in self.timeline.items()}

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
            if u_type == _UpdateType.ADD:
                self.born[id(winfo)] = len(self.timeline["activations"])
            elif u_type == _UpdateType.REF:
                for c, sign in ((_category(old_reftype), -1), (_category(winfo.reftype), 1)):
                    for i in range(self.born.get(id(winfo), 0), len(self.timeline.get(c, ()))):
                        self.timeline[c][i] += sign * winfo.mem_consumed

        def _update_peak_stats(self, peak_state) -> None:  # called after every operation
            super()._update_peak_stats(peak_state)
            now = _by_category(next(iter(self._curr_mem_snap.values()), {}))
            for c, t in self.timeline.items():
                t.append(now[c])
            self.optimizer_bytes.append(now["optimizer"])

        def _instrument_optimizer(self) -> None:
            # FSDPMemTracker hooks the one optimizer it is given (an Optimizers list has no hooks): each in turn
            handles = []
            for self._optm in optimizers:
                super()._instrument_optimizer()
                handles += self._optimizer_hook_handles
            self._optimizer_hook_handles = tuple(handles)

    optimizers = opt if isinstance(opt, list) else [opt]  # train.optimizer=muon: two
    tracker = Tracker(module) if base is FSDPMemTracker else Tracker()
    if base is MemTracker:
        tracker.track_external(module, *optimizers)
    for o in optimizers:
        if isinstance(o, torch.optim.Muon):
            _watch_step(tracker, o)
    return tracker


def _watch_step(tracker, optimizer) -> None:
    """Keep in tracker.step_extra the most `optimizer`'s steps hold beyond the optimizer states: the trackers count
    everything made during a step as optimizer state, so a step's temporaries are its peak of the category
    (tracker.optimizer_bytes, after each operation) less the category once the step has returned."""
    start = [0]

    def before(*_) -> None:
        start[0] = len(tracker.optimizer_bytes)

    def after(*_) -> None:
        now = _by_category(next(iter(tracker.get_tracker_snapshot().values())))["optimizer"]
        tracker.step_extra = max(tracker.step_extra, max(tracker.optimizer_bytes[start[0]:], default=now) - now)

    optimizer.register_step_pre_hook(before)
    optimizer.register_step_post_hook(after)


def _peak(cfg: Config, built: tuple, world_size: int, device: torch.device, fake: bool = False,
          tick=lambda: None) -> dict[str, int]:
    """Bytes per plan category at the total's peak (the gradients and activations at their own, the optimizer's
    states once the steps are done, under train.optimizer=muon the most Muon's step held beyond them), and the
    total, over the steps of `cfg` on this rank, for the (model, what the step calls) that build_parallel returns;
    `tick` is called after every micro-batch (a progress bar's). Fake steps leave clipping out: under
    FakeTensorMode a sharded gradient's norm gathers the whole gradient (8 x the shard on 8 ranks), which real ranks
    do not (a peak 2 KiB over the gradients on 2 gloo ranks, against 7 MiB)."""
    from depthlab.train.optim import make_optimizer

    module, model = built
    opt = make_optimizer(model, cfg)
    tracker = _tracker(module, opt)
    with tracker:
        for _ in _train_steps(cfg, model, opt, device, world_size, clip=not fake):
            tracker.reset_mod_stats()  # per-module statistics are per forward; the peaks are kept
            tick()
        states = _by_category(next(iter(tracker.get_tracker_snapshot().values())))["optimizer"]  # steps done
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    muon = {"Muon step": tracker.step_extra} if cfg.train.optimizer == "muon" else {}
    return {**_by_category(peak), "optimizer": states, **tracker.own_peak(), **muon, "total": peak[_TOTAL]}


def measure(cfg: Config, world_size: int = 1, fake: bool = False, tick=lambda: None) -> dict[str, int]:
    """Peak bytes per plan category of one rank's training steps of `cfg` on `world_size` ranks: this process
    (world_size 1, `tick` called after each of its micro_batches(cfg)), rank 0 of world_size spawned gloo
    processes, or (fake) rank 0 under FakeTensorMode."""
    if cfg.model.is_vit:
        raise UserError("measuring a step's memory takes a language model; a ViT's plan is an estimate only")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device="cpu", compile=False))
    if fake:
        return _fake_rank(cfg, world_size)
    if world_size == 1:
        from depthlab.train.distributed import DistEnv, build_parallel

        cpu = torch.device("cpu")
        return _peak(cfg, build_parallel(cfg.model, cfg.train, DistEnv(), cpu), 1, cpu, tick=tick)
    return _spawn(cfg, world_size)[0]


def _fake_rank(cfg: Config, world_size: int) -> dict[str, int]:
    """Rank 0 of `world_size` under FakeTensorMode. build_parallel's layout (the same shard_model), built another
    way: a fake parameter cannot be moved or copied in place (FakeTensorMode keeps a weak reference to it, so torch
    refuses to swap it), and a device mesh cannot be formed inside the mode (it reads tensor values)."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from depthlab.model import build_model
    from depthlab.train.distributed import apply_activation_checkpointing, mesh_shape, shard_model

    cpu, tc = torch.device("cpu"), cfg.train
    if world_size == 1:
        with FakeTensorMode():
            model = build_model(cfg.model)
            if tc.activation_checkpointing:
                apply_activation_checkpointing(model)
            return _peak(cfg, (model, model), 1, cpu, fake=True)
    if tc.parallel != "fsdp" or mesh_shape(tc, world_size)[0] > 1:
        raise UserError("a fake rank of several is measured under plain FSDP only (train.parallel=fsdp, one replica)")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        mesh = dist.device_mesh.init_device_mesh("cpu", (world_size,))
        with FakeTensorMode():
            with torch.device("meta"):
                model = build_model(cfg.model, init=False)
            if tc.activation_checkpointing:
                apply_activation_checkpointing(model)
            shard_model(model, cfg.model, tc, mesh)
            model.to_empty(device=cpu)
            return _peak(cfg, (model, model), world_size, cpu, fake=True)
    finally:
        dist.destroy_process_group()



def _spawn(cfg: Config, world_size: int) -> list[dict[str, int]]:
    """Every rank's peak, from world_size processes joined over gloo on this host."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="depthlab-memtrack-") as tmp:
        mp.spawn(_rank_main, args=(world_size, port, cfg.to_dict(), tmp), nprocs=world_size)
        return [json.loads((Path(tmp) / f"{r}.json").read_text()) for r in range(world_size)]


def _rank_main(rank: int, world_size: int, port: int, cfg: dict, out: str) -> None:
    from depthlab.train.distributed import build_parallel, init_distributed, shutdown

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    env = init_distributed(torch.device("cpu"), 300.0)
    try:
        cfg, cpu = Config.from_dict(cfg), torch.device("cpu")
        peak = _peak(cfg, build_parallel(cfg.model, cfg.train, env, cpu), world_size, cpu)
        (Path(out) / f"{rank}.json").write_text(json.dumps(peak))
    finally:
        shutdown(env)


def measure_plan(cfg: Config, plan: dict, progress: bool = True) -> dict:
    """`plan` (depthlab.train.plan.memory_plan) with the tracker's figure for each category: `depthlab train
    --dry-run --measure`, two real training steps of `cfg` in this process, on the CPU. A large model's take
    minutes: it says on stderr that it measures, and shows its progress by micro-batch
    (depthlab.progress: a bar on a terminal, else a line every few seconds)."""
    world = plan["layout"]["world_size"]
    if world > 1:
        raise UserError(f"--measure runs one process, not {world} ranks: drop --world-size (ranks and FakeTensorMode "
                        "are measured by benchmarks/memory_plan.py)")
    need, host = plan["bytes"]["total"], os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > host / 2:
        raise UserError(f"--measure runs the step on this machine's CPU: the plan needs {need / 2**30:,.1f} GiB, more "
                        f"than half of its {host / 2**30:,.0f} GiB; measure a smaller config")
    tc, n = cfg.train, micro_batches(cfg)
    print(f"depthlab train: measuring the plan: {STEPS} training steps of {n // STEPS} micro-batch(es) of "
          f"{per_rank_batch(tc, 1)} x {cfg.data.seq_len} tokens on the CPU under PyTorch's MemTracker (minutes for a "
          "large model)", file=sys.stderr, flush=True)
    with progress_bar(total=n, enabled=progress, desc="measuring the plan", unit="micro-batches") as bar:
        measured = measure(cfg, tick=bar.update)
    what = (f"PyTorch's MemTracker over {STEPS} training steps on the CPU (random tokens; the second holds the "
            "optimizer's states): each category at the total's peak, the gradients and activations at their own, the "
            "optimizer's states after the steps")
    return {**plan, "measured": {"bytes": measured, "what": what}}


def compare(plan: dict[str, float], measured: dict[str, int]) -> dict[str, dict]:
    """{category: {estimate, measured, ratio}}; ratio None where the tracker saw none of the category."""
    return {c: {"estimate": plan[c], "measured": measured[c],
                "ratio": plan[c] / measured[c] if measured[c] else None} for c in measured}


def ladder_config(shape: dict | str, overrides: list[str]) -> Config:
    """A memory-ladder config: a paper preset by name, or a LLaMA of {dim, n_layers, batch, seq} (heads of 32,
    a SwiGLU of 8/3 dim, a 4,096-token vocabulary, fp32), with `overrides` applied."""
    from depthlab.config import apply_overrides
    from depthlab.model.families import preset
    from depthlab.model.validate import validate

    if isinstance(shape, str):
        return validate(apply_overrides(preset(shape), overrides))
    d = shape["dim"]
    return validate(apply_overrides(Config(), [
        f"model.dim={d}", f"model.n_layers={shape['n_layers']}", f"model.ffn_dim={d * 8 // 3}",
        f"model.n_heads={d // 32}", "model.vocab_size=4096", f"model.max_seq_len={shape['seq']}",
        f"data.seq_len={shape['seq']}", f"train.batch_size={shape['batch']}", "train.dtype=fp32", *overrides]))


def ladder_row(shape: dict | str, ranks: int, fake: bool, overrides: list[str]) -> dict:
    """One rung of benchmarks/memory_plan.py: the config's cells, and the plan against the tracker per category."""
    from depthlab.train.plan import memory_plan

    cfg, t0 = ladder_config(shape, overrides), time.time()
    measured = measure(cfg, ranks, fake)
    m, tc = cfg.model, cfg.train
    return {"config": {"preset": shape if isinstance(shape, str) else None, "dim": m.dim, "n_layers": m.n_layers,
                       "batch": per_rank_batch(tc, ranks), "seq": cfg.data.seq_len, "dtype": tc.dtype,
                       "loss_chunk": tc.loss_chunk, "grad_accum": tc.grad_accum, "world_size": ranks,
                       "parallel": tc.parallel if ranks > 1 else None, "tensors": "fake" if fake else "real",
                       "optimizer": tc.optimizer,
                       "activation_checkpointing": tc.activation_checkpointing},
            "categories": compare(memory_plan(cfg, ranks)["bytes"], measured), "wall_s": round(time.time() - t0, 1)}


def saved_for_backward(model, run):
    """(bytes of the distinct non-parameter tensors autograd saves during `run()`, those bytes by the module that
    saved each first -- its name with block indices as `*`, "" for the model's own forward, the loss --, run's
    result)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, stack = {}, [""]

    def enter(module, args, name):
        stack.append(re.sub(r"\.\d+(?=\.|$)", ".*", name))

    def leave(module, args, out):
        stack.pop()

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params and s.data_ptr() not in seen:
            seen[s.data_ptr()] = (s.nbytes(), stack[-1])
        return t

    handles = [h for name, m in model.named_modules() if name
               for h in (m.register_forward_pre_hook(functools.partial(enter, name=name)),
                         m.register_forward_hook(leave))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = run()
    finally:
        for h in handles:
            h.remove()
    by_module = {}
    for nbytes, where in seen.values():
        by_module[where] = by_module.get(where, 0) + nbytes
    return sum(by_module.values()), dict(sorted(by_module.items(), key=lambda kv: -kv[1])), out


class PeakSampler:
    """The peak resident set (MiB) of this process, per named phase."""

    def __init__(self):
        self.phase, self.peaks, self.start = None, {}, {}
        self.page = os.sysconf("SC_PAGE_SIZE")
        threading.Thread(target=self._run, daemon=True).start()

    def rss(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page / 2**20

    def _run(self):
        while True:
            if self.phase:
                self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), self.rss())
            time.sleep(0.002)

    def begin(self, phase: str) -> None:
        self.start[phase] = self.rss()
        self.peaks[phase] = self.start[phase]
        self.phase = phase

    def end(self) -> None:
        if self.phase:
            self.peaks[self.phase] = max(self.peaks[self.phase], self.rss())
        self.phase = None


def live_peak(fn, *args) -> float:
    """The peak of live tensor bytes (MiB) while fn runs, above those live when it starts, from the allocation
    and free events PyTorch's profiler records (exact, unlike the resident set)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*args)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = top = 0
    for e in events:
        live += e.nbytes()
        top = max(top, live)
    return top / 2**20
