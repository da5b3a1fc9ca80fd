"""The depth coordinate check (`depthlab coord-check`): does a parameterization keep training's effect on the
activations the same at every depth?

For each depth L in --depths and each seed, a model of the user's config with n_layers = L trains --steps Adam steps
at the config's peak rate, held constant (no warm-up or decay: the check is about the first steps at that rate).
After every step a fixed probe batch from the validation split is run and each block's output h_l is compared with
its value at initialisation:

    update   RMS(h_l(t) - h_l(0))               how far training has moved block l's output (its coordinates)
    ratio    ||h_l - h_(l-1)|| / ||h_(l-1)||    the block's own relative update of the stream (depthlab.metrics)
    rms      RMS(h_l(t))                         the activation scale

A depth-stable parameterization (CompleteP, arXiv 2505.01618) gives flat lines against L: what training does to
the last block's output neither grows nor shrinks with depth. `depth_slope` is the number the test and the figure
read: the least-squares slope of log(update of the last block) against log(L) at the last step, over all seeds;
near 0 is flat. (The ratio falls with depth under every parameterization: it is each block's share of a stream
that L blocks write.)
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import torch

from depthlab.jsonl import read_jsonl
from depthlab.ownership import write_whole
from depthlab.plots import pyplot, save_figure

RECORDS = "coord_check.jsonl"
QUANTITIES = {"update": "last block: change since init  RMS(h(t) - h(0))",
              "ratio": "last block: relative update  ||h_L - h_(L-1)|| / ||h_(L-1)||",
              "rms": "last block: activation RMS"}


def coord_check(cfg, depths: list[int], seeds: int, steps: int, name: str, probe_batch: int = 8,
                progress: bool = False) -> list[dict]:
    """One record per (depth, seed, step 0..steps) for config `cfg` (depthlab.config.Config), each with the
    per-block lists of QUANTITIES. The data is loaded once, for every depth. `progress`: a bar over the steps of
    all depths and seeds, weighted by depth (what a step costs)."""
    from depthlab.data.dataset import PackedSampler, build_token_data, gather_windows
    from depthlab.model import build_model
    from depthlab.model.validate import validate
    from depthlab.progress import progress_bar
    from depthlab.train.optim import clip_gradients, make_optimizer
    from depthlab.train.runtime import seed_everything

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    data = build_token_data(cfg)
    seq = cfg.data.seq_len
    n_probe = max(1, min(probe_batch, (len(data.val) - 1) // seq))
    probe, _ = gather_windows(data.val, torch.arange(n_probe).numpy(), seq)
    records = []
    bar = progress_bar(total=sum(depths) * seeds * steps, enabled=progress, desc=f"coord-check {name}",
                       unit="block-steps")
    for depth in depths:
        run = replace(cfg, model=replace(cfg.model, n_layers=depth))
        validate(run)
        for seed in range(seeds):
            seed_everything(seed)
            model = build_model(run.model)
            opt = make_optimizer(model, run)
            sampler = PackedSampler(data.train, seq, run.train.batch_size, seed)
            start = _hidden(model, probe)
            for step in range(steps + 1):
                if step:
                    x, y = sampler.next_batch()
                    model(x, targets=y).backward()
                    clip_gradients(model, run)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    bar.update(depth)
                records.append({"name": name, "depth": depth, "seed": seed, "step": step,
                                **_measure(start, _hidden(model, probe))})
    bar.close()
    return records


@torch.no_grad()
def _hidden(model, probe: torch.Tensor) -> list[torch.Tensor]:
    """The residual stream before the first block and after each block (none final-normed)."""
    return model(probe, return_hidden=True)[1]


def _measure(start: list[torch.Tensor], now: list[torch.Tensor]) -> dict[str, list[float]]:
    from depthlab.metrics import token_update_ratio

    blocks = range(1, len(now))
    rms = lambda t: t.float().pow(2).mean().sqrt().item()  # noqa: E731
    return {"update": [rms(now[l] - start[l]) for l in blocks],
            "ratio": [token_update_ratio(now[l - 1], now[l]).mean().item() for l in blocks],
            "rms": [rms(now[l]) for l in blocks]}


def depth_slope(records: list[dict], quantity: str = "update") -> float:
    """Least-squares slope of log(quantity of the last block) against log(depth) at each run's last step, over the
    runs that did not diverge (NaN when fewer than two depths are left)."""
    last = max(r["step"] for r in records)
    pts = [(math.log(r["depth"]), math.log(max(r[quantity][-1], 1e-30))) for r in records
           if r["step"] == last and math.isfinite(r[quantity][-1])]
    if not pts:
        return float("nan")
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else float("nan")


def diverged(records: list[dict]) -> list[int]:
    """The depths at which some seed's last block reached a value that is not finite (a rate too high for it)."""
    return sorted({r["depth"] for r in records if not all(math.isfinite(r[q][-1]) for q in QUANTITIES)})


def plot(records: list[dict], out: Path, title: str = "") -> Path:
    """One row per parameterization (record name), one column per quantity: the last block's value (seed mean)
    against depth, one line per step, darker for later steps; the row's label carries its depth_slope."""
    plt = pyplot()

    names = list(dict.fromkeys(r["name"] for r in records))
    fig, axes = plt.subplots(len(names), len(QUANTITIES), figsize=(4.2 * len(QUANTITIES), 3.0 * len(names)),
                             squeeze=False)
    for row, name in zip(axes, names):
        mine = [r for r in records if r["name"] == name]
        depths, n_steps = sorted({r["depth"] for r in mine}), max(r["step"] for r in mine)
        for ax, (q, label) in zip(row, QUANTITIES.items()):
            drawn = False  # a positive finite point: what a log scale needs (a diverged run has none)
            for step in range(1 if q == "update" else 0, n_steps + 1):
                ys = [_mean([r[q][-1] for r in mine if r["depth"] == d and r["step"] == step]) for d in depths]
                ys = [y if math.isfinite(y) and y > 0 else float("nan") for y in ys]  # a gap in the line
                drawn |= any(y == y for y in ys)
                ax.plot(depths, ys, marker="o", ms=3, color=plt.cm.viridis(1 - step / max(1, n_steps)),
                        label=f"step {step}")
            ax.set_xscale("log", base=2)
            if drawn:
                ax.set_yscale("log")
            else:
                ax.text(0.5, 0.5, "no finite value: diverged", transform=ax.transAxes, ha="center", fontsize=8)
            ax.set_xlabel("depth L (blocks)")
            ax.set_title(f"{name}: {label}" if q != "update" else
                         f"{name}: {label}\nslope of log change vs log L = {depth_slope(mine):+.2f}", fontsize=8)
        row[-1].legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, out)


def _mean(xs: list[float]) -> float:
    """NaN for none (a step a run cut short never recorded): a gap in its line."""
    return sum(xs) / len(xs) if xs else float("nan")


def read_records(directory: Path) -> list[dict]:
    """The records of OUT/coord_check.jsonl (depthlab.jsonl: a last line cut short is skipped with a warning, any
    other bad line is an error naming it); [] when there are none."""
    return read_jsonl(Path(directory) / RECORDS, "skipped (that run is not in the figure)",
                      need=("name", "depth", "seed", "step", *QUANTITIES))


def keep_records(out: Path, name: str, records: list[dict], earlier: list[dict]) -> list[dict]:
    """Write `earlier` (read_records, before training) and `records` to OUT/coord_check.jsonl, `records` in place
    of any earlier ones under `name`. The file is replaced whole (a temporary sibling renamed over it): a crash
    mid-write leaves the old records."""
    out.mkdir(parents=True, exist_ok=True)
    kept = [r for r in earlier if r["name"] != name] + records
    write_whole(out / RECORDS, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
