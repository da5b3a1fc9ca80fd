"""A study's probe: the library's analysis on a seeded sample of windows spread over the whole validation split,
with the Jacobians on and the curse index, reduced to what a runs.jsonl record keeps."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from depthlab.analysis.curse import CurseSpec, interior as interior_blocks, removal_index, update_slope


@dataclass(frozen=True)
class ProbeSpec:
    windows: int = 256
    seq_len: int = 64
    seed: int = 0
    batch_size: int = 16
    jacobian: bool = True
    probes: int = 2  # random projections per Jacobian estimate

    def describe(self) -> dict:
        return {**asdict(self), "where": "seeded windows spread over the whole validation split"}


KEPT = ("inert_fraction", "inert_fraction_ci", "inert_fraction_rel", "inert_fraction_rel_ci", "inert_blocks",
        "interior", "removal_deep_over_shallow", "removal_deep_over_shallow_ci", "update_slope",
        "jacobian_vs_identity", "contiguous", "windows")


@torch.no_grad()
def probe_model(model, val: np.ndarray, spec: ProbeSpec = ProbeSpec()) -> dict:
    """Per block (update ratio, variance after it, adjacent angular distance at the last token and over all tokens,
    removal cost, and the learned stream scalars where the model has them) and the curse index of a depthlab
    language model on `spec.windows` windows of `val`."""
    from depthlab.analysis.analyze import Options, analyze
    from depthlab.analysis.calibration import probe_batches
    from depthlab.analysis.layers import from_depthlab

    was_training = model.training
    device = str(next(model.parameters()).device)
    batches = probe_batches(val, spec.windows, spec.seq_len, spec.batch_size, spec.seed, device)
    with torch.random.fork_rng(devices=[]):  # probing mid-run must not move the training's random stream
        res = analyze(from_depthlab(model.eval(), "probe"), batches, Options(jacobian=spec.jacobian,
                                                                             probes=spec.probes))
    model.train(was_training)
    L, ang = len(res["blocks"]), res["angular"]
    idx = res["curse_index"]
    return {**stream_scalars(model), "probe_loss": res["removal"]["base_loss"], "probe_tokens": res["tokens"],
            "update_ratio": [b["update_ratio"] for b in res["blocks"]],
            "var": [res["states"][l + 1]["variance"] for l in range(L)],
            "angular_last": [ang["last_token"][l][l + 1] for l in range(L)],
            "angular_all": [ang["all_tokens"][l][l + 1] for l in range(L)],
            "removal": [r["delta_loss"] for r in res["removal"]["single"]],
            "curse": {k: idx[k] for k in KEPT if k in idx}}


def stream_scalars(model) -> dict:
    """{"stream_scalars": {"resid_lambda": [r_1 .. r_N], "x0_lambda": [a_1 .. a_N]}} of a model with the stream scalars
    (model.resid_lambda / x0_lambda; None where one is off), what a record keeps of what they learned; {} without."""
    mixes = [m.stream_mix for m in model.modules() if getattr(m, "stream_mix", None) is not None]
    if not mixes:
        return {}
    return {"stream_scalars": {kind: [None if getattr(m, kind) is None else getattr(m, kind).item() for m in mixes]
                               for kind in ("resid_lambda", "x0_lambda")}}


def index_from_costs(costs: list[float], update_ratio: list[float], spec: CurseSpec | None = None) -> dict:
    """The index from per-block removal costs alone (an old record's): no interval, one window standing for all."""
    spec = spec or CurseSpec()
    idx = removal_index({"count": [1], "single_delta": [[c] for c in costs]}, len(costs),
                        CurseSpec(**{**asdict(spec), "bootstrap": 1}))
    idx = {k: v for k, v in idx.items() if not k.endswith("_ci")}
    idx["update_slope"] = update_slope(update_ratio, interior_blocks(len(costs), spec))
    idx["windows"] = None
    return idx
