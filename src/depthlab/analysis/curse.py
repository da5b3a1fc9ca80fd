"""The curse-of-depth index: one definition, read from an analysis result (`study.analyze`) of any model.

Trained Pre-LN depth profiles are U-shaped: block 1 acts as a second embedding and the last blocks matter again,
so the index reads the *interior*: blocks first+1 .. N-last (1-based; by default 2 .. N-2, the first block and the
last two left out). With cost(l) the loss increase (nats per scored token) when block l alone is removed:

    inert_fraction        share of interior blocks with |cost(l)| < delta (default 0.005 nats); inert_blocks names
                          them (a block whose removal *lowers* the loss by more than delta is active, not inert)
    inert_fraction_rel    share with |cost(l)| < rel_delta * |cost(2)| (default 0.05): the same, relative to block 2
    inert_fraction_deep   the same share over the deep half of the interior only (`deep_half`): the curse of depth
                          is about deep blocks, and shallow inert blocks must not count towards it
    removal_deep_over_shallow
                          mean cost over the deep interior (N/2, N-2] over the mean over the shallow interior
                          [2, N/4 + 1]; < 1: deep blocks are cheaper to remove than shallow ones
    update_slope          least-squares slope of log update_ratio(l) against l over the interior blocks
    jacobian_vs_identity  ||J_l - I|| (rms) per block, when the Jacobians were computed
    adjacent_angular      last-token (Gromov et al. 2024) and all-token angular distance between block l's input and
                          output, per block
    angular_rows          the paper's (l, n) heatmap: d(h_l, h_{l+n}) at the last token, each row n divided by its
                          largest entry
    contiguous            for n = 1 .. N/2, the run of n blocks whose ends are closest by last-token angular
                          distance (Gromov's protocol) and the loss increase when that run is removed

inert_fraction, inert_fraction_rel, inert_fraction_deep and removal_deep_over_shallow carry 95% bootstrap intervals
over calibration windows: windows are resampled with replacement (seeded) and every cost recomputed from the
resampled sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from depthlab.analysis.results import blocks_text


@dataclass(frozen=True)
class CurseSpec:
    delta: float = 0.005  # nats: a block cheaper than this to remove is inert
    rel_delta: float = 0.05  # ... or cheaper than this share of block 2's cost
    skip_first: int = 1  # interior = blocks skip_first+1 .. N-skip_last (1-based)
    skip_last: int = 2
    bootstrap: int = 1000
    seed: int = 0


def interior(n_layers: int, spec: CurseSpec = CurseSpec()) -> list[int]:
    """1-based interior blocks."""
    return list(range(spec.skip_first + 1, n_layers - spec.skip_last + 1))


def shallow_deep(n_layers: int) -> tuple[list[int], list[int]]:
    """1-based shallow interior [2, N/4 + 1] and deep interior (N/2, N-2]."""
    shallow = [l for l in range(2, n_layers + 1) if l <= n_layers / 4 + 1]
    deep = [l for l in range(1, n_layers - 1) if l > n_layers / 2]
    return shallow, deep


def deep_half(blocks: list[int]) -> list[int]:
    """The deep half of an interior (its 1-based blocks, shallow first): the upper floor(k/2) of its k blocks. An odd
    count's middle block stays with the shallow half, so under the default interior 2 .. N-2 the deep half is exactly
    the deep interior (N/2, N-2] that removal_deep_over_shallow averages over."""
    return blocks[len(blocks) - len(blocks) // 2:]


def inert_share(costs, blocks: list[int], delta: float) -> np.ndarray:
    """The share of `blocks` (1-based) whose removal cost is below delta in absolute value, along the last axis of
    `costs` (a block whose removal lowers the loss by more than delta is active, not inert); nan for no blocks."""
    if not blocks:
        return np.full(np.shape(costs)[:-1], math.nan)
    return (np.abs(np.asarray(costs)[..., [l - 1 for l in blocks]]) < delta).mean(-1)


def _ratio(costs: np.ndarray, shallow: list[int], deep: list[int]) -> np.ndarray:
    """Deep-over-shallow mean cost along the last axis (1-based block lists); nan where undefined."""
    if not shallow or not deep:
        return np.full(costs.shape[:-1], math.nan)
    s = costs[..., [l - 1 for l in shallow]].mean(-1)
    d = costs[..., [l - 1 for l in deep]].mean(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s > 0, d / np.where(s > 0, s, 1.0), math.nan)


def _fractions(costs: np.ndarray, inner: list[int], spec: CurseSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c = np.abs(costs[..., [l - 1 for l in inner]])
    ref = np.abs(costs[..., 1:2] if costs.shape[-1] > 1 else costs[..., :1])
    return (inert_share(costs, inner, spec.delta), (c < spec.rel_delta * ref).mean(-1),
            inert_share(costs, deep_half(inner), spec.delta))


def _interval(samples: np.ndarray) -> list[float]:
    s = samples[np.isfinite(samples)]
    return [float(np.quantile(s, 0.025)), float(np.quantile(s, 0.975))] if len(s) else [math.nan, math.nan]


def resampled_costs(delta: np.ndarray, count: np.ndarray, spec: CurseSpec = CurseSpec()) -> np.ndarray:
    """(R, K): each row of `delta` (K, W), a summed loss change per window, as a cost per scored token, under R =
    spec.bootstrap resamplings of the W windows with replacement (seeded by spec.seed)."""
    rng = np.random.default_rng(spec.seed)
    W = len(count)
    draws = rng.multinomial(W, np.full(W, 1.0 / W), size=spec.bootstrap).astype(np.float64)  # (R, W)
    return (draws @ delta.T) / np.maximum(draws @ count, 1.0)[:, None]


def cost_interval(delta: list[float], count: list[int], spec: CurseSpec = CurseSpec()) -> list[float]:
    """The 95% bootstrap interval over windows of one plan's cost (its per-window summed loss change against the
    model's own on the same windows: paired)."""
    row = np.asarray(delta, dtype=np.float64)[None]
    return _interval(resampled_costs(row, np.asarray(count, dtype=np.float64), spec)[:, 0])


def removal_index(windows: dict, n_layers: int, spec: CurseSpec = CurseSpec()) -> dict:
    """The removal part of the index, with bootstrap intervals, from the per-window sums of removal.RemovalSums."""
    count = np.asarray(windows["count"], dtype=np.float64)
    delta = np.asarray(windows["single_delta"], dtype=np.float64)  # (L, W) summed loss increase per window
    costs = delta.sum(1) / max(count.sum(), 1.0)
    inner, (shallow, deep) = interior(n_layers, spec), shallow_deep(n_layers)
    W = len(count)
    boot = resampled_costs(delta, count, spec)  # (R, L)
    out = {"interior": [inner[0], inner[-1]] if inner else [], "delta": spec.delta, "rel_delta": spec.rel_delta,
           "windows": W, "removal_cost": costs.tolist(),
           "shallow_interior": shallow, "deep_interior": deep}
    if inner:
        frac, frac_rel, frac_deep = _fractions(costs, inner, spec)
        bf, bf_rel, bf_deep = _fractions(boot, inner, spec)
        out.update(inert_fraction=float(frac), inert_fraction_ci=_interval(bf),
                   inert_fraction_rel=float(frac_rel), inert_fraction_rel_ci=_interval(bf_rel),
                   inert_blocks=[l for l in inner if abs(costs[l - 1]) < spec.delta],
                   inert_fraction_deep=float(frac_deep), inert_fraction_deep_ci=_interval(bf_deep),
                   deep_half=deep_half(inner))
    ratio = float(_ratio(costs, shallow, deep))
    out.update(removal_deep_over_shallow=ratio, removal_deep_over_shallow_ci=_interval(_ratio(boot, shallow, deep)))
    return out


def update_slope(update_ratio: list[float], blocks: list[int]) -> float:
    """Least-squares slope of log update ratio against the 1-based block index over `blocks`."""
    pts = [(l, math.log(update_ratio[l - 1])) for l in blocks if update_ratio[l - 1] > 0]
    if len(pts) < 2:
        return math.nan
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def angular_rows(last: list[list[float]]) -> list[list[float]]:
    """Row n (1 .. N): d(h_l, h_{l+n}) for l = 0 .. N-n, divided by the row's largest entry."""
    S = len(last)
    rows = []
    for n in range(1, S):
        row = [last[l][l + n] for l in range(S - n)]
        top = max(row)
        rows.append([x / top if top > 0 else 0.0 for x in row])
    return rows


def contiguous(res: dict, n_layers: int) -> list[dict]:
    """Gromov's protocol for n = 1 .. N/2: the run chosen by last-token angular distance and its removal cost."""
    best = {r["n"]: r for r in res["angular"]["best_block"]}
    removal = res.get("removal", {})
    costs = {r["n"]: r["delta_loss"] for r in removal.get("runs", []) if "delta_loss" in r}
    out = []
    for n in range(1, n_layers // 2 + 1):
        b = best[n]
        cost = costs.get(n)
        if n == 1 and "single" in removal:
            cost = removal["single"][b["start_block"] - 1]["delta_loss"]
        out.append({"n": n, "blocks": b["blocks"], "distance": b["distance"], "delta_loss": cost})
    return out


def curse_index(res: dict, spec: CurseSpec = CurseSpec()) -> dict:
    """The index of one analysis result; the removal part only when removal was run."""
    L = len(res["blocks"])
    inner = interior(L, spec)
    ur = [b["update_ratio"] for b in res["blocks"]]
    last, every = res["angular"]["last_token"], res["angular"]["all_tokens"]
    out = {"blocks": L, "update_slope": update_slope(ur, inner),
           "adjacent_angular": {"last_token": [last[l][l + 1] for l in range(L)],
                                "all_tokens": [every[l][l + 1] for l in range(L)]},
           "angular_rows": angular_rows(last), "contiguous": contiguous(res, L)}
    if "jacobian" in res:
        out["jacobian_vs_identity"] = res["jacobian"]["block_vs_identity"]
    if "removal" in res and "windows" in res["removal"]:
        out.update(removal_index(res["removal"]["windows"], L, spec))
    return out


def _fmt_ci(x: float, ci: list[float], f: str) -> str:
    return f"{x:{f}} [{ci[0]:{f}}, {ci[1]:{f}}]"


def index_lines(idx: dict, init: dict | None = None) -> list[str]:
    """The index in a few lines for the terminal and the report; `init`: the same model's index at initialisation."""
    at0 = lambda key, f: (f" (at init {init[key]:{f}})" if init and key in init else "")  # noqa: E731
    lines = []
    if "inert_fraction" in idx:
        lo, hi = idx["interior"]
        frac = _fmt_ci(idx["inert_fraction"], idx["inert_fraction_ci"], ".2f")
        lines.append(f"curse index: interior inert fraction {frac}"
                     f"{at0('inert_fraction', '.2f')} of blocks {lo}-{hi} (removal < {idx['delta']:g} nats; "
                     f"inert: {blocks_text(idx['inert_blocks']) or 'none'}); relative to block 2: "
                     f"{_fmt_ci(idx['inert_fraction_rel'], idx['inert_fraction_rel_ci'], '.2f')}")
        if idx.get("deep_half"):  # an index written before the deep half was kept has no such key
            d = idx["deep_half"]
            lines.append(f"deep half of the interior (blocks {d[0]}-{d[-1]}): inert fraction "
                         f"{_fmt_ci(idx['inert_fraction_deep'], idx['inert_fraction_deep_ci'], '.2f')}"
                         f"{at0('inert_fraction_deep', '.2f')}")
    if "removal_deep_over_shallow" in idx:
        lines.append("depth profile: removal deep/shallow "
                     f"{_fmt_ci(idx['removal_deep_over_shallow'], idx['removal_deep_over_shallow_ci'], '.3g')}"
                     f"{at0('removal_deep_over_shallow', '.3g')}, log update-ratio slope "
                     f"{idx['update_slope']:+.4f}{at0('update_slope', '+.4f')} per block")
    else:
        lines.append(f"depth profile: log update-ratio slope {idx['update_slope']:+.4f} per block")
    return lines
