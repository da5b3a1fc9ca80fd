"""Every plan's stream advanced block by block, each block visited once: how layer-by-layer mode removes blocks
(and sublayers, and fits the linear maps) while holding one block's weights at a time.

A unit is one batch (calibration windows, or one question's choices) entered at block 0. At block j its base
stream (the model's own) goes through the block; a plan that first changes block j starts its own stream there
from the base stream; every started plan's stream goes through block j as the plan says (removal.through_block,
as whole-model mode's replay does). At the end every stream is read by the head. The streams live in an
`ActivationStore`: in memory up to a budget, on disk past it. Block passes: those of the whole-model replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from depthlab.analysis.layers import BlockCall, LayeredLM
from depthlab.analysis.linear import fit_linear, real_tokens
from depthlab.analysis.removal import Plan, through_block
from depthlab.progress import detail


class ActivationStore:
    """Tensors by key: in memory up to `budget` bytes, the rest in .npy files under `folder` (as float32, which
    holds bfloat16 and float16 values exactly), read back in their own dtype and device."""

    def __init__(self, folder: str | Path, budget: float):
        self.folder, self.budget = Path(folder), budget
        self.mem: dict = {}
        self.disk: dict = {}  # key -> (memmap, dtype, device)
        self.used = self.peak = 0

    def put(self, key, t: torch.Tensor) -> None:
        if key in self.disk:  # a stream keeps its shape from block to block
            self.disk[key][0][...] = t.float().cpu().numpy()
            return
        old = self.mem.pop(key, None)
        self.used -= 0 if old is None else old.nbytes
        if self.used + t.nbytes <= self.budget:
            self.mem[key] = t
            self.used += t.nbytes
            self.peak = max(self.peak, self.used)
            return
        mm = np.lib.format.open_memmap(self.folder / f"{len(self.disk)}.npy", mode="w+", dtype=np.float32,
                                       shape=tuple(t.shape))
        mm[...] = t.float().cpu().numpy()
        self.disk[key] = (mm, t.dtype, t.device)

    def get(self, key) -> torch.Tensor:
        if key in self.mem:
            return self.mem[key]
        mm, dtype, device = self.disk[key]
        return torch.from_numpy(np.array(mm)).to(device, dtype)

    def sizes(self) -> dict:
        return {"in_memory_peak_mb": self.peak / 2**20,
                "on_disk_mb": sum(m.nbytes for m, _, _ in self.disk.values()) / 2**20}


@dataclass
class Unit:
    """One batch the streams run on. `calls[j]`: how block j is called on it; `score(key, h)` takes every plan's
    raw last stream state at the end (the head is applied there, to the positions it reads); `observe(j, h, out,
    mid)` sees its base stream at each block; `mask` marks real tokens."""

    calls: list[BlockCall]
    mask: torch.Tensor
    score: Callable | None = None
    observe: Callable | None = None


@torch.no_grad()
def stream(lm: LayeredLM, n_layers: int, load: Callable[[int], int], units: list[Unit], plans: list[Plan],
           store: ActivationStore, fit: list[Unit] = (), on_block: Callable | None = None) -> dict:
    """Run `plans` (BASE among them: the model's own stream is scored too) on `units` block by block; `load(j)`
    puts block j in the model and returns its slot; the units' inputs to block 0 are in `store` under ("h0", k)
    (fit units: ("fit0", k)). With `fit` units, block j's linear map is fitted on their base streams before the
    others reach block j. Returns the linear maps {j: LinearMap}."""
    linear: dict = {}
    for k in range(len(units)):
        store.put(("base", k), store.get(("h0", k)))
    for k in range(len(fit)):
        store.put(("fit", k), store.get(("fit0", k)))
    for j in range(n_layers):
        slot = load(j)
        if on_block is not None:
            on_block(j, slot, store.get(("base", 0)))
        if fit:
            h = [store.get(("fit", k)) for k in range(len(fit))]
            out = [lm.run_block(slot, x, u.calls[j]) for x, u in zip(h, fit)]
            masks = [u.mask for u in fit]
            linear[j] = fit_linear(real_tokens(h, masks), real_tokens(out, masks))
            for k, y in enumerate(out):
                store.put(("fit", k), y)
        started = [p for p in plans if p.first is not None and p.first <= j]
        for k, u in enumerate(units):
            h = store.get(("base", k))
            for i, p in enumerate(started):
                s = h if p.first == j else store.get((p.key, k))
                store.put((p.key, k), through_block(lm, slot, j, p, s, u.calls[j], linear))
                detail(f"block {j + 1}: {k * (len(started) + 1) + i + 1}/{len(units) * (len(started) + 1)} streams")
            out, mid = lm.run_block_mid(slot, h, u.calls[j])
            if u.observe is not None:
                u.observe(j, h, out, mid)
            store.put(("base", k), out)
    scored = [(k, u) for k, u in enumerate(units) if u.score is not None]
    for n, (k, u) in enumerate(scored):
        for i, p in enumerate(plans):  # a head per stream: SmolLM2's 31 over 2,048 tokens are 6.5 forward passes
            detail(f"scoring {n * len(plans) + i + 1}/{len(scored) * len(plans)} streams")
            u.score(p.key, store.get(("base" if p.first is None else p.key, k)))
    return linear
