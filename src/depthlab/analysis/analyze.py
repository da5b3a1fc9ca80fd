"""The analysis runs: whole-model mode (every block in memory, one traced pass per batch) and layer-by-layer mode
(one block's weights at a time). Both feed the same accumulators, so their numbers agree (a test pins that).

Whole-model mode, per batch: trace (activations of every stream state), per-block and pairwise metrics, logit lens,
single-layer removal from the cached activations; then a second pass for the contiguous runs of n blocks chosen
by angular distance, and Jacobians on the first batch.

A classifier (a depthlab ViT) runs the same code on image batches: the "last token" angular distances are read at
its pooled readout, removal is scored by cross-entropy and top-1 accuracy, and the logit lens is skipped (no
vocabulary, no next token); `classifier_notes` says so in the results.

Removal (depthlab.analysis.removal): each block, and with options each block's attention or MLP alone or its
linear replacement, scored by the loss on the calibration windows and, given questions (depthlab.analysis.tasks),
by task accuracy; then the contiguous runs chosen by angular distance and the k least useful blocks together.

Layer-by-layer mode: each block is loaded once per pass, applied to every batch's streams (the model's own and
every removal's, depthlab.analysis.streaming: in memory up to a budget, on disk past it), measured, and dropped;
every stream state of the model's own is spilled to a float32 file on disk, from which the pairwise distances and
the lens are read at the end. dy/dh_l needs the whole suffix of the network and is left to whole-model mode.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from depthlab.analysis.answer import cost_text, headline_lines
from depthlab.analysis.calibration import Batch, ImageBatch
from depthlab.analysis.curse import CurseSpec, curse_index, index_lines
from depthlab.analysis.duplication import duplicate_plans, duplication_lines, duplication_scan
from depthlab.analysis.generation import generation_removal
from depthlab.analysis.jacobian import block_jacobian, output_jacobian, token_jacobian
from depthlab.analysis.layers import LayeredLM
from depthlab.analysis.profiles import profile_lines
from depthlab.analysis.removal import (
    BASE,
    PARTS,
    Plan,
    RemovalSums,
    drop_plans,
    run_plans,
    single_layer_sweep,
    single_plans,
)
from depthlab.analysis.results import IMAGE_CLASSIFICATION, LANGUAGE_MODELLING, is_classifier
from depthlab.analysis.streaming import ActivationStore, Unit, stream
from depthlab.analysis.tasks import TaskSums, answer_logits, question_mask, task_sweep, usefulness_orders
from depthlab.metrics import Accumulator, massive_lines, unit
from depthlab.progress import progress_bar


@dataclass(frozen=True)
class Options:
    removal: bool = True
    sublayers: bool = False  # also each block's attention alone and MLP alone taken out
    linear: bool = False  # also each block replaced by its least-squares linear map (fitted on separate windows)
    drop_lowest: int = 0  # also the k least useful blocks taken out together, k = 1..drop_lowest
    runs: bool = True  # also the contiguous runs of 2..L-1 blocks chosen by angular distance taken out
    duplicate: int = 0  # also every span of 1..duplicate blocks run twice (depthlab.analysis.duplication)
    activation_mb: float = 1024.0  # layer-by-layer: removal streams kept in memory up to this, the rest on disk
    jacobian: bool = True
    probes: int = 4
    heatmap_channels: int = 48
    token_chunk: int = 1024
    lens_tokens: int | None = 512  # the logit lens at this many positions, a seeded sample spread over all the
    # windows (its cost is (L + 1) heads per position); None: at every position, the exact lens
    curse: CurseSpec = CurseSpec()  # the index's thresholds and interior
    massive_factor: float | None = 10.0  # tokens whose stream norm tops this x the median set apart (metrics.py)
    progress: bool = False  # a bar per pass on a terminal


def heatmap_blocks(n_layers: int) -> list[int]:
    """0-based blocks whose one-token Jacobian is drawn: the first, the middle and the last."""
    return sorted({0, n_layers // 2, n_layers - 1})


def lens_quota(batches: list, opts: Options) -> int | None:
    """The lens positions each batch reads (None: all of them): opts.lens_tokens spread over the batches in
    proportion to their real tokens; None also when the windows hold no more than that."""
    total = sum(int(b.mask.sum()) for b in batches if isinstance(b, Batch))
    if opts.lens_tokens is None or total <= opts.lens_tokens:
        return None
    return -(-opts.lens_tokens // len(batches))


def lens_positions(mask: torch.Tensor, quota: int, seed: int) -> torch.Tensor:
    """`quota` of the real tokens in `mask`, drawn without replacement (seeded by the batch's index), as a mask."""
    real = mask.flatten().nonzero().squeeze(1)
    g = torch.Generator().manual_seed(seed)
    keep = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    keep[real[torch.randperm(len(real), generator=g)[:quota].to(real.device)]] = True
    return keep.view(mask.shape)


LENS_CHUNK = 128  # positions whose lens logits are held at once: (positions x vocabulary) fp32 and its softmaxes


def subsampled_lens(lm: LayeredLM, acc: Accumulator, states: list[torch.Tensor], b: Batch, keep: torch.Tensor):
    """The logit lens at the positions `keep` marks, LENS_CHUNK of them at a time: each state's logits there,
    against the model's own."""
    nxt = torch.cat([b.ids[:, 1:], b.ids[:, :1]], 1)  # the token after each position (the last one's unused)
    has = torch.cat([b.mask[:, 1:], torch.zeros_like(b.mask[:, :1])], 1)
    where = keep.nonzero(as_tuple=True)
    for i in range(0, len(where[0]), LENS_CHUNK):
        at = tuple(w[i:i + LENS_CHUNK] for w in where)
        final = lm.logits(states[-1][at])
        for s, h in enumerate(states):
            acc.lens_at(s, final if s == len(states) - 1 else lm.logits(h[at]), final, nxt[at], has[at])


@torch.no_grad()
def observe_states(lm: LayeredLM, acc: Accumulator, states: list[torch.Tensor], b: Batch, chunk: int,
                   keep: torch.Tensor | None = None) -> None:
    """Everything that needs only the stream states of one batch: per-state statistics, the final-normed output
    (kept apart from the raw last state), all-pairs angular distance, and the logit lens (language models only;
    at the positions `keep` marks, or at every real token)."""
    L = len(states) - 1
    for s, h in enumerate(states):
        acc.stream(s, h, b.mask, b.ids)
    acc.stream(L + 1, lm.final_norm(states[L]), b.mask, b.ids)
    if acc.massive_factor is not None:
        acc.set_apart(states, b.mask, b.ids)
    flat = [h[b.mask] for h in states]  # (N, d) each, real tokens only
    acc.angular_last(torch.stack([unit(lm.readout(h, b.mask)) for h in states]))
    for i in range(0, flat[0].shape[0], chunk):  # bounded memory: (chunk, S, S) cosines at a time
        acc.angular_all(torch.stack([unit(f[i:i + chunk]) for f in flat]))
    if lm.classifier:
        return
    if keep is not None:
        return subsampled_lens(lm, acc, states, b, keep)
    final = lm.logits(states[L])
    for s, h in enumerate(states):
        acc.lens(s, final if s == L else lm.logits(h), final, b.ids, b.mask)


def kind_of_model(lm: LayeredLM) -> str:
    """The kind its results are (depthlab.analysis.results)."""
    return IMAGE_CLASSIFICATION if lm.classifier else LANGUAGE_MODELLING


def classifier_notes(lm: LayeredLM) -> dict:
    """What a classifier's results mean where they differ from a language model's."""
    readout = "class token" if getattr(lm.model, "cls_token", None) is not None else "mean of the patch tokens"
    return {"task": IMAGE_CLASSIFICATION, "readout": readout, "notes": [
        "image classifier: the stream statistics are over every token of every image (the patches, and the class "
        f"token if there is one); the angular distances labelled 'last token' are read at the pooled readout "
        f"({readout}), the state the class is predicted from",
        "logit lens skipped: a classifier has no vocabulary and no next token (its head reads classes from the "
        "pooled stream only)",
        "perplexity does not apply: layer removal is scored by the cross-entropy against the labels and by the "
        "top-1 accuracy drop"]}


def first_plans(n_layers: int, opts: Options) -> list[Plan]:
    """The model itself and one plan per block and kind: removed, attention or MLP alone, linear replacement."""
    parts = ("block", *(PARTS if opts.sublayers else ()), *(("linear",) if opts.linear else ()))
    return [BASE, *single_plans(n_layers, parts)]


def later_plans(res: dict, removal: dict, task_removal: dict | None, opts: Options, n_layers: int) -> list[Plan]:
    """Plans that need the first pass's results: the contiguous runs chosen by angular distance (with opts.runs),
    and the k least useful blocks (by loss, and by tasks when there are questions) removed together."""
    runs = [(r["start_block"] - 1, r["n"]) for r in res["angular"]["best_block"] if 1 < r["n"] < n_layers]
    plans = run_plans(runs) if opts.runs else []
    if opts.drop_lowest:
        for by, order in usefulness_orders(removal, task_removal).items():
            plans += drop_plans(by, [b - 1 for b in order], opts.drop_lowest)
    return plans


def removal_results(res: dict, sums: RemovalSums, tsums: TaskSums, linear: dict | None, n_layers: int) -> None:
    res["removal"] = sums.results(n_layers)
    for row in res["removal"].get("linear", []):
        row["fit_residual"] = linear[row["block"] - 1].fit_residual
    if linear:
        res["removal"]["linear_fit_tokens"] = linear[0].tokens
    if tsums.tasks:
        res["task_removal"] = tsums.results()
    res["usefulness"] = usefulness_orders(res["removal"], res.get("task_removal"))


def _bar(opts: Options):
    return lambda it, desc: progress_bar(it, opts.progress, desc=desc, unit="batch")


class BlockBar:
    """A bar counting the blocks a stream (depthlab.analysis.streaming) has gone through: `counted(load)` is its
    block loader, moving the bar to j when block j is loaded; the bar is full when the `with` ends."""

    def __init__(self, opts: Options, n_layers: int, desc: str):
        self.bar = progress_bar(None, opts.progress, total=n_layers, desc=desc, unit="block")
        self.total = n_layers

    def counted(self, load):
        def counting(j: int) -> int:
            self.bar.update(j - self.bar.n)
            return load(j)
        return counting

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.bar.update(self.total - self.bar.n)
        self.bar.close()


def plan_bar(opts: Options, n_batches: int, plans: list, desc: str):
    """A bar counting plans scored (each plan on each batch), and its tick."""
    bar = progress_bar(None, opts.progress, total=n_batches * len(plans), desc=desc, unit="plan")
    return bar, lambda: bar.update(1)


@torch.no_grad()
def fit_linear_maps(lm: LayeredLM, fit: list[Batch], opts: Options = Options()) -> dict:
    """Each block's linear map, fitted on the fit windows' own streams (whole-model mode)."""
    store = ActivationStore(".", math.inf)  # whole-model mode: nothing goes to disk
    units = []
    with BlockBar(opts, lm.n_layers, "analyze: linear fit") as bar:
        for k, b in enumerate(fit):
            tr = lm.trace(b.inputs, b.mask)
            store.put(("fit0", k), tr.hidden[0])
            units.append(Unit(tr.calls, b.mask))
        return stream(lm, lm.n_layers, bar.counted(lambda j: j), [], [], store, units)


def analyze(lm: LayeredLM, batches: list[Batch | ImageBatch], opts: Options = Options(),
            questions: dict | None = None, fit: list[Batch] | None = None, generation: dict | None = None) -> dict:
    """Whole-model mode. `questions`: {task: [ScoredQuestion]} to score removal by; `fit`: the windows the linear
    maps are fitted on (with opts.linear); `generation`: {task: [GenQuestion]} to score removal by generation
    (depthlab.analysis.generation)."""
    L = lm.n_layers
    lm.discover(batches[0].inputs, batches[0].mask)
    acc, sums, tsums = Accumulator(L, opts.massive_factor), RemovalSums(L, lm.classifier), TaskSums()
    linear = fit_linear_maps(lm, fit, opts) if opts.removal and opts.linear else None
    plans = first_plans(L, opts) if opts.removal else [BASE]
    quota = lens_quota(batches, opts)
    bar, tick = plan_bar(opts, len(batches), plans, "analyze: metrics and removal" if opts.removal else
                         "analyze: metrics")
    with bar:
        for k, b in enumerate(batches):
            tr = lm.trace(b.inputs, b.mask)
            observe_states(lm, acc, tr.hidden, b, opts.token_chunk, quota and lens_positions(b.mask, quota, k))
            for l in range(L):
                acc.block(l, tr.hidden[l], tr.mid[l], tr.hidden[l + 1], b.mask)
            if opts.removal:
                single_layer_sweep(lm, b, tr, sums, plans, linear, tick)
            else:
                tick()
    res = acc.results()
    if opts.removal:
        task_sweep(lm, questions or {}, plans, tsums, linear, _bar(opts))
        later = later_plans(res, sums.results(L), tsums.results() if tsums.tasks else None, opts, L)
        if later:  # none: single_layer_sweep's default (every single block) would score each window again
            bar, tick = plan_bar(opts, len(batches), later, "analyze: removal of runs and of the k least useful")
            with bar:
                for b in batches:
                    single_layer_sweep(lm, b, lm.trace(b.inputs, b.mask), sums, later, tick=tick)
            task_sweep(lm, questions or {}, later, tsums, None, _bar(opts))
        removal_results(res, sums, tsums, linear, L)
        if generation:
            res["generate_removal"] = generation_removal(lm, generation, [*plans, *later], _bar(opts))
    if opts.duplicate:
        bar, tick = plan_bar(opts, len(batches), duplicate_plans(L, opts.duplicate), "analyze: duplication scan")
        with bar:
            res["duplication"] = duplication_scan(lm, batches, opts.duplicate, questions, tick, _bar(opts))
    if opts.jacobian:
        res["jacobian"] = whole_model_jacobians(lm, batches[0], opts)
    res["mode"], res["kind"] = "whole-model", kind_of_model(lm)
    res["curse_index"] = curse_index(res, opts.curse)
    if lm.classifier:
        res.update(classifier_notes(lm))
    return res


def whole_model_jacobians(lm: LayeredLM, b: Batch, opts: Options) -> dict:
    L = lm.n_layers
    tr = lm.trace(b.inputs, b.mask)
    jac = [block_jacobian(lm, l, tr.hidden[l], tr.calls[l], b.mask, opts.probes)
           for l in progress_bar(range(L), opts.progress, desc="analyze: jacobians", unit="block")]
    return {"block_gain": [g for g, _ in jac], "block_vs_identity": [d for _, d in jac],
            "output_gain": output_jacobian(lm, b, tr, opts.probes), "probes": opts.probes,
            "heatmaps": [token_jacobian(lm, l, tr.hidden[l], tr.calls[l], b.mask, opts.heatmap_channels)
                         for l in heatmap_blocks(L)]}


def _units(lm: LayeredLM, slots: list[int], store: ActivationStore, entries: list, prefix: str = "h0") -> list[Unit]:
    """Units of layer-by-layer mode from (inputs, mask, score) entries: each traced through the skeleton (its
    embedding output, and the arguments each slot is called with: block j gets those of its slot, `slots[j]`)."""
    units = []
    for k, (inputs, mask, score) in enumerate(entries):
        tr = lm.trace(inputs, mask)
        store.put((prefix, k), tr.hidden[0])
        units.append(Unit([tr.calls[s] for s in slots], mask, score))
    return units


def analyze_layerwise(skel, batches: list[Batch], opts: Options = Options(), spill_dir: str | None = None,
                      questions: dict | None = None, fit: list[Batch] | None = None) -> dict:
    """Layer-by-layer mode. `skel` is a `layerwise.Skeleton`: the model with one block slot."""
    lm, L = skel.lm, skel.n_layers
    skel.load_block(0)
    lm.discover(batches[0].inputs, batches[0].mask)
    acc, sums, tsums = Accumulator(L, opts.massive_factor), RemovalSums(L), TaskSums()
    entries = [(b.inputs, b.mask, lambda key, h, b=b: sums.add(key, lm.logits(h), b)) for b in batches]
    if opts.removal:
        entries += [(q.ids, question_mask(q), lambda key, h, t=t, q=q: tsums.add(t, key, q, answer_logits(lm, q, h)))
                    for t, qs in (questions or {}).items() for q in qs]
    jac: dict = {"block_gain": [], "block_vs_identity": [], "heatmaps": [], "probes": opts.probes}
    load = skel.load_block
    with tempfile.TemporaryDirectory(dir=spill_dir) as tmp:
        store = ActivationStore(tmp, opts.activation_mb * 2**20)
        units = _units(lm, skel.slots, store, entries)
        fits = [(b.inputs, b.mask, None) for b in fit] if opts.linear else []
        fit_units = _units(lm, skel.slots, store, fits, "fit0")
        spills = _state_spills(Path(tmp), store, units, batches, acc)
        hook = _jacobian_hook(lm, units[0], batches[0], opts, jac) if opts.jacobian else None
        plans = first_plans(L, opts) if opts.removal else []
        with BlockBar(opts, L, "analyze: blocks, every plan's streams") as bar:
            linear = stream(lm, L, bar.counted(load), units, plans, store, fit_units, hook)
        quota = lens_quota(batches, opts)
        for k, b in enumerate(progress_bar(batches, opts.progress, desc="analyze: lens and distances", unit="batch")):
            states = [torch.from_numpy(np.asarray(spills[k][s])).to(b.mask.device, lm.head.weight.dtype)
                      for s in range(L + 1)]
            observe_states(lm, acc, states, b, opts.token_chunk, quota and lens_positions(b.mask, quota, k))
        res = acc.results()
        if opts.removal:
            later = later_plans(res, sums.results(L), tsums.results() if tsums.tasks else None, opts, L)
            if later:  # none: the pass would load every block again and score nothing
                with BlockBar(opts, L, "analyze: blocks, runs and the k least useful") as bar:
                    stream(lm, L, bar.counted(load), [dataclasses.replace(u, observe=None) for u in units], later,
                           store)
            removal_results(res, sums, tsums, linear or None, L)
            res["removal"]["streams"] = store.sizes()
    if opts.jacobian:
        res["jacobian"] = jac
    res["mode"], res["kind"] = "layer-by-layer", kind_of_model(lm)
    res["curse_index"] = curse_index(res, opts.curse)
    return res


def _state_spills(tmp: Path, store: ActivationStore, units: list[Unit], batches: list[Batch], acc) -> list:
    """A float32 file per calibration batch for every state of the model's own stream (read at the end for the
    pairwise distances and the lens); each batch's unit measures each block and writes its output there."""
    spills = []
    for k, (u, b) in enumerate(zip(units, batches)):
        h0 = store.get(("h0", k))
        spill = np.lib.format.open_memmap(tmp / f"states{k}.npy", mode="w+", dtype=np.float32,
                                          shape=(len(u.calls) + 1, *h0.shape))
        spill[0] = h0.float().cpu().numpy()
        u.observe = _observer(acc, spill, b.mask)
        spills.append(spill)
    return spills


def _observer(acc, spill, mask: torch.Tensor):
    def observe(j: int, h: torch.Tensor, out: torch.Tensor, mid) -> None:
        acc.block(j, h, mid, out, mask)
        spill[j + 1] = out.float().cpu().numpy()
    return observe


def _jacobian_hook(lm: LayeredLM, unit: Unit, b: Batch, opts: Options, jac: dict):
    """Per block, as it is loaded: its Jacobian estimates on the first batch, and the heatmap of the chosen ones."""
    def hook(j: int, slot: int, h: torch.Tensor) -> None:
        # the block runs in its kind's slot, but its probes are drawn from its own index j, as in whole-model mode
        g, d = block_jacobian(lm, slot, h, unit.calls[j], b.mask, opts.probes, seed=j)
        jac["block_gain"].append(g)
        jac["block_vs_identity"].append(d)
        if j in heatmap_blocks(len(unit.calls)):
            hm = token_jacobian(lm, slot, h, unit.calls[j], b.mask, opts.heatmap_channels)
            jac["heatmaps"].append({**hm, "block": j + 1})
    return hook


def summary_lines(res: dict) -> list[str]:
    """A few lines for the terminal: the answer first (depthlab.analysis.answer), then the details."""
    st, L = res["states"], len(res["blocks"])
    lines = headline_lines(res) + ["details:"]
    lines += index_lines(res["curse_index"], res["curse_index"].get("at_init")) if "curse_index" in res else []
    lines += [f"variance: embedding {st[0]['variance']:.4g} -> raw last {st[-1]['variance']:.4g} "
             f"(final-normed {res['final_normed']['variance']:.4g})"]
    adj = [res["angular"]["last_token"][l][l + 1] for l in range(L)]
    where = res.get("readout", "last token")
    lines.append(f"adjacent angular distance ({where}), blocks 1-{L}: " + " ".join(f"{x:.3f}" for x in adj))
    lines += massive_lines(res)
    if "removal" in res:
        r = res["removal"]
        worst = min(r["single"], key=lambda x: (x.get("acc_drop", 0.0), x["delta_loss"]))
        cost = (f"accuracy drop {worst['acc_drop']:+.4f}, loss {worst['delta_loss']:+.4f} nats" if is_classifier(res)
                else cost_text(worst["delta_loss"]))
        lines.append(f"removing block {worst['block']} alone costs least: {cost}")
    lines += duplication_lines(res)
    if "jacobian" in res:
        lines.append("||J_block - I|| (rms): " + " ".join(f"{x:.3f}" for x in res["jacobian"]["block_vs_identity"]))
    if not math.isfinite(st[-1]["variance"]):
        lines.append("warning: non-finite activations")
    lines += profile_lines(res.get("profiles"))
    return lines + [f"note: {n}" for n in res.get("notes", [])]
