"""The analysis runs: whole-model mode (every block in memory, one traced pass per batch) and layer-by-layer mode
(one block's weights at a time). Both feed the same accumulators, so their numbers agree (a test pins that).

Whole-model mode, per batch: trace (activations of every stream state), per-block and pairwise metrics, logit lens,
single-layer removal from the cached activations; then a second pass for the contiguous runs of n blocks chosen
by angular distance, and Jacobians on the first batch.

A classifier (a depthlab ViT) runs the same code on image batches: the "last token" angular distances are read at
its pooled readout, removal is scored by cross-entropy and top-1 accuracy, and the logit lens is skipped (no
vocabulary, no next token); `classifier_notes` says so in the results.

Layer-by-layer mode: the calibration activations of the current depth for all batches stay in memory; each
block is loaded, applied to them, measured, and dropped; every stream state is spilled to a float32 file on
disk, from which the pairwise distances and the lens are read at the end. Removal and dy/dh_l need the whole
suffix of the network and are left to whole-model mode.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from depthlab.analysis.calibration import Batch, ImageBatch
from depthlab.analysis.curse import CurseSpec, curse_index, index_lines
from depthlab.analysis.jacobian import block_jacobian, output_jacobian, token_jacobian
from depthlab.analysis.layers import LayeredLM
from depthlab.analysis.removal import RemovalSums, run_removal, single_layer_sweep
from depthlab.analysis.results import IMAGE_CLASSIFICATION, LANGUAGE_MODELLING, is_classifier
from depthlab.metrics import Accumulator, unit
from depthlab.progress import progress_bar


@dataclass(frozen=True)
class Options:
    removal: bool = True
    jacobian: bool = True
    probes: int = 4
    heatmap_channels: int = 48
    token_chunk: int = 1024
    curse: CurseSpec = CurseSpec()  # the index's thresholds and interior
    progress: bool = False  # a bar per pass on a terminal


def heatmap_blocks(n_layers: int) -> list[int]:
    """0-based blocks whose one-token Jacobian is drawn: the first, the middle and the last."""
    return sorted({0, n_layers // 2, n_layers - 1})


@torch.no_grad()
def observe_states(lm: LayeredLM, acc: Accumulator, states: list[torch.Tensor], b: Batch, chunk: int) -> None:
    """Everything that needs only the stream states of one batch: per-state statistics, the final-normed output
    (kept apart from the raw last state), all-pairs angular distance, and the logit lens (language models only)."""
    L = len(states) - 1
    for s, h in enumerate(states):
        acc.stream(s, h, b.mask, b.ids)
    acc.stream(L + 1, lm.final_norm(states[L]), b.mask, b.ids)
    flat = [h[b.mask] for h in states]  # (N, d) each, real tokens only
    acc.angular_last(torch.stack([unit(lm.readout(h, b.mask)) for h in states]))
    for i in range(0, flat[0].shape[0], chunk):  # bounded memory: (chunk, S, S) cosines at a time
        acc.angular_all(torch.stack([unit(f[i:i + chunk]) for f in flat]))
    if lm.classifier:
        return
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


def analyze(lm: LayeredLM, batches: list[Batch | ImageBatch], opts: Options = Options()) -> dict:
    """Whole-model mode."""
    L = lm.n_layers
    lm.discover(batches[0].inputs, batches[0].mask)
    acc, sums = Accumulator(L), RemovalSums(L, lm.classifier)
    for b in progress_bar(batches, opts.progress, desc="analyze: metrics", unit="batch"):
        tr = lm.trace(b.inputs, b.mask)
        observe_states(lm, acc, tr.hidden, b, opts.token_chunk)
        for l in range(L):
            acc.block(l, tr.hidden[l], tr.mid[l], tr.hidden[l + 1], b.mask)
        if opts.removal:
            single_layer_sweep(lm, b, tr, sums)
    res = acc.results()
    if opts.removal:
        runs = [(r["start_block"] - 1, r["n"]) for r in res["angular"]["best_block"] if 1 < r["n"] < L]
        for b in progress_bar(batches, opts.progress, desc="analyze: removal", unit="batch"):
            run_removal(lm, b, lm.trace(b.inputs, b.mask), runs, sums)
        res["removal"] = sums.results(L)
    if opts.jacobian:
        b = batches[0]
        tr = lm.trace(b.inputs, b.mask)
        jac = [block_jacobian(lm, l, tr.hidden[l], tr.calls[l], b.mask, opts.probes)
               for l in progress_bar(range(L), opts.progress, desc="analyze: jacobians", unit="block")]
        res["jacobian"] = {"block_gain": [g for g, _ in jac], "block_vs_identity": [d for _, d in jac],
                           "output_gain": output_jacobian(lm, b, tr, opts.probes), "probes": opts.probes,
                           "heatmaps": [token_jacobian(lm, l, tr.hidden[l], tr.calls[l], b.mask,
                                                       opts.heatmap_channels) for l in heatmap_blocks(L)]}
    res["mode"], res["kind"] = "whole-model", kind_of_model(lm)
    res["curse_index"] = curse_index(res, opts.curse)
    if lm.classifier:
        res.update(classifier_notes(lm))
    return res


def analyze_layerwise(skel, batches: list[Batch], opts: Options = Options(), spill_dir: str | None = None) -> dict:
    """Layer-by-layer mode. `skel` is a `layerwise.Skeleton`: the model with one block slot."""
    lm, L = skel.lm, skel.n_layers
    skel.load_block(0)
    lm.discover(batches[0].inputs, batches[0].mask)
    acc = Accumulator(L)
    traces = [lm.trace(b.inputs, b.mask) for b in batches]
    H = [tr.hidden[0] for tr in traces]
    calls = [tr.calls[0] for tr in traces]
    del traces
    jac: dict = {"block_gain": [], "block_vs_identity": [], "heatmaps": [], "probes": opts.probes}
    with tempfile.TemporaryDirectory(dir=spill_dir) as tmp:
        spills = [np.lib.format.open_memmap(Path(tmp) / f"batch{k}.npy", mode="w+", dtype=np.float32,
                                            shape=(L + 1, *h.shape)) for k, h in enumerate(H)]
        for k, h in enumerate(H):
            spills[k][0] = h.float().cpu().numpy()
        for l in progress_bar(range(L), opts.progress, desc="analyze: blocks", unit="block"):
            if l > 0:
                skel.load_block(l)
            if opts.jacobian:
                g, d = block_jacobian(lm, 0, H[0], calls[0], batches[0].mask, opts.probes, seed=l)
                jac["block_gain"].append(g)
                jac["block_vs_identity"].append(d)
                if l in heatmap_blocks(L):
                    hm = token_jacobian(lm, 0, H[0], calls[0], batches[0].mask, opts.heatmap_channels)
                    jac["heatmaps"].append({**hm, "block": l + 1})
            with torch.no_grad():
                for k, b in enumerate(batches):
                    out, mid = lm.run_block_mid(0, H[k], calls[k])
                    acc.block(l, H[k], mid, out, b.mask)
                    spills[k][l + 1] = out.float().cpu().numpy()
                    H[k] = out
        for k, b in enumerate(batches):
            states = [torch.from_numpy(np.asarray(spills[k][s])).to(H[k]) for s in range(L + 1)]
            observe_states(lm, acc, states, b, opts.token_chunk)
        del spills
    res = acc.results()
    if opts.jacobian:
        res["jacobian"] = jac
    res["mode"], res["kind"] = "layer-by-layer", kind_of_model(lm)
    res["curse_index"] = curse_index(res, opts.curse)
    return res


def summary_lines(res: dict) -> list[str]:
    """A few lines for the terminal."""
    st, L = res["states"], len(res["blocks"])
    lines = index_lines(res["curse_index"], res["curse_index"].get("at_init")) if "curse_index" in res else []
    lines += [f"variance: embedding {st[0]['variance']:.4g} -> raw last {st[-1]['variance']:.4g} "
             f"(final-normed {res['final_normed']['variance']:.4g})"]
    adj = [res["angular"]["last_token"][l][l + 1] for l in range(L)]
    where = res.get("readout", "last token")
    lines.append(f"adjacent angular distance ({where}): " + " ".join(f"{x:.3f}" for x in adj))
    if "removal" in res and is_classifier(res):
        r = res["removal"]
        worst = min(r["single"], key=lambda x: (x["acc_drop"], x["delta_loss"]))
        lines.append(f"loss {r['base_loss']:.4f}, top-1 accuracy {r['base_acc']:.4f}; removing block {worst['block']} "
                     f"costs least (accuracy drop {worst['acc_drop']:+.4f}, loss {worst['delta_loss']:+.4f})")
    elif "removal" in res:
        r = res["removal"]
        worst = min(r["single"], key=lambda x: x["delta_ppl"])
        lines.append(f"perplexity {r['base_ppl']:.3f}; removing block {worst['block']} costs least "
                     f"({worst['delta_ppl']:+.3f})")
    if "jacobian" in res:
        lines.append("||J_block - I|| (rms): " + " ".join(f"{x:.3f}" for x in res["jacobian"]["block_vs_identity"]))
    if not math.isfinite(st[-1]["variance"]):
        lines.append("warning: non-finite activations")
    return lines + [f"note: {n}" for n in res.get("notes", [])]
