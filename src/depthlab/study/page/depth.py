"""docs/results.md's sections 7-8 and its appendix: the depth study (one rate per scheme at every depth), the ViT
study, every cell of a study and the curse along training, with results.json and figures recomputed from the runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

from depthlab.stats import mean_std, spread
from depthlab.study import figures
from depthlab.study.claims import LNS, PRE
from depthlab.study.page.text import composition_said, mechanism_table, number, said, settings_of
from depthlab.study.records import load_records, upgrade
from depthlab.study.summary import lm_study, vit_study
from depthlab.study.verdicts import ci_cell, curse_word, deep_inert_fraction


# ---------------------------------------------------------------------------------------------------- depth study
def write_depth(out: Path) -> dict | None:
    s = settings_of(out)
    if s is None:
        return None
    raw = load_records(out / "runs.jsonl")
    res = lm_study(raw, s)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    figures.plot_depth(res, {k: upgrade(r) for k, r in raw.items()}, out)
    print(f"wrote {out / 'results.json'}")
    return res


def _per_seed(xs) -> str:
    return ", ".join(f"{x:+.3g}" for x in xs) or "-"


def _setup_lines(res: dict) -> list[str]:
    s = res["settings"]
    tokens = s["steps"] * s["batch"] * s["seq"]
    probe = next((d["probe"] for d in res["depths"] if d.get("probe")), None) or {}
    how = ("**the earlier probe** (the first 64 windows of validation, 4,096 tokens, no Jacobian, all-token angular "
           "distances): its checkpoints are gone, so every probe figure below is from it and has no bootstrap "
           "interval" if probe.get("old") else
           f"{probe.get('windows')} seeded windows over the whole validation split, Jacobians on")
    return [f"Commands: `make study` (`make study-grid`, `study-sweep`, `study-mixln` one part each), which runs "
            f"`{s['command']}`; `make results` rebuilds this page from the runs file.", "",
            f"Setup: width {s['dim']} ({s['heads']} heads, FFN {s['ffn']}), depths {s['depths']}, reference depth "
            f"{s['ref_depth']}, init std `auto` (width-matched {(2 / (5 * s['dim'])) ** 0.5:.3f}), embedding std "
            f"{s['embed_std']:.3f}, {s['steps']} steps of {s['batch']} x {s['seq']} = {tokens / 1e6:.2f}M tokens per "
            f"run, warmup 10%, cosine to 10%, fp32. Data: {s['corpus']['source']}, {s['corpus']['train_tokens']:,} "
            f"training tokens, BPE vocabulary {s['vocab']}, sha256 `{s['corpus']['sha256'][:16]}…`; "
            f"{composition_said(s['corpus'])}. Validation "
            f"loss on the first {s['val_tokens']:,} held-out tokens (it also selects each scheme's rate). Probe: "
            f"{how}. {res['runs']} runs, {res['train_s'] / 3600:.1f} h of one-thread training.", ""]


def _grid_lines(res: dict) -> list[str]:
    s, best = res["settings"], res["best_lr"]
    lines = [f"Rate grid at N = {s['ref_depth']} (seed 0, validation loss; **bold**: the rate each scheme uses "
             "everywhere; the last row is the same-rate comparison, ⚠ where its sign differs from the best-rate "
             "comparison):", "", "| scheme | " + " | ".join(f"lr {lr:g}" for lr in s["lrs"]) + " |",
             "|---|" + "---|" * len(s["lrs"])]
    for v, g in res["grid"].items():
        cells = [(f"**{g[f'{lr:g}']:.4f}**" if best[v] == lr else f"{g[f'{lr:g}']:.4f}") if f"{lr:g}" in g else "-"
                 for lr in s["lrs"]]
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    same = {r["lr"]: r for r in res["equal_rate"]}
    lines.append("| lns − pre | " + " | ".join(f"{same[lr]['delta']:+.4f}{' ⚠' if same[lr]['sign_differs'] else ''}"
                                               if lr in same else "-" for lr in s["lrs"]) + " |")
    edge = [f"{v} ({best[v]:g})" for v, e in res["edge"].items() if e]
    return lines + ["", f"Best rate at the edge of the grid: {', '.join(edge)}; its optimum may lie beyond it."
                    if edge else "No best rate is at an edge of the grid.", ""]


def _depth_lines(res: dict) -> list[str]:
    lines = ["Each depth at the one rate per scheme chosen at the reference depth; Δ paired seed by seed with its 95% "
             "t-interval (the page's one rule). The curse index of the final models: the deep half's inert "
             "fraction (the upper half of blocks 2 .. N−2 whose removal changes the loss by < 0.005 nats) and "
             "removal cost deep / shallow interior, each mean [95% t-interval across seeds; the inert fraction's "
             "widened to the exact interval of its count pooled over seeds]; Pre-LN's curse reads "
             "from those intervals (the rule under the claims table). The whole interior's inert fraction (mean ± "
             "std) describes the models and decides nothing.", "",
             "| N | pre val loss (whole-split probe) | lns val loss (whole-split probe) | Δ lns − pre | pre inert, "
             "deep half | lns inert, deep half | pre inert, whole interior | lns inert, whole interior | pre "
             "deep/shallow | lns deep/shallow | Pre-LN curse |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in res["depths"]:
        if not d["seeds"]:
            lines.append(f"| {d['layers']} | not run |" + " |" * 9)
            continue
        p, q, delta = d["pre"]["index"], d["lns"]["index"], d["delta_val_loss"]
        index = ([ci_cell((x.get("curse") or {}).get("inert")) for x in (p, q)]
                 + [spread(x.get("inert_fraction"), ".2f") for x in (p, q)]
                 + [ci_cell((x.get("curse") or {}).get("ratio")) for x in (p, q)])
        own = {v: f"{spread(d[v]['val_loss'])} ({spread(d[v].get('probe_loss'), '.2f')})" for v in (PRE, LNS)}
        lines.append(f"| {d['layers']} | {own['pre']} | {own['lns']} | {said(delta)} | " + " | ".join(index)
                     + f" | {curse_word(p.get('curse'))} |")
    return lines + [""]


def _mechanism_lines(res: dict) -> list[str]:
    return ["Every mechanism quantity: lns − pre seed by seed and the paper's predicted direction (the claims are "
            "read at each scheme's own rate, in the claims table).", ""] + mechanism_table(res) + [""]


def depth_section(out: Path, img_prefix: str) -> list[str]:
    if not (out / "results.json").exists():
        return ["Not run yet (`make study`).", ""]
    res = json.loads((out / "results.json").read_text())
    return (_setup_lines(res) + _grid_lines(res) + _depth_lines(res)
            + [f"![Δ loss and the curse index by depth](img/{img_prefix}delta_and_index_by_depth.png)", "",
               f"![per-block profiles](img/{img_prefix}profiles_by_depth.png)", ""] + _mechanism_lines(res))


def along_section(out: Path) -> list[str]:
    """A study re-run with the new probe: the curse index at every probe along training, with its interval."""
    s = settings_of(out)
    if s is None:
        return []
    res = lm_study(load_records(out / "runs.jsonl"), s)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"Re-run with the new probe (`{s['command']}`, the settings above, 2 runs, "
             f"{res['train_s'] / 60:.0f} min of one-thread training; the same token streams, sha256 "
             f"`{s['corpus']['sha256'][:16]}…`): {s['probe_windows']} seeded windows over the whole validation split, "
             "Jacobians on, probed along training. Interval: 95% bootstrap over windows.", "",
             "| N | scheme | tokens | probe loss | val loss (first 32k tokens) | inert fraction | removal deep / "
             "shallow | log update-ratio slope |", "|---|---|---|---|---|---|---|---|"]
    for d in res["depths"]:
        for v in (PRE, LNS):
            val = d[v]["val_loss"]["mean"]
            for seed, probes in d[v]["along"].items():
                for i, p in enumerate(probes):
                    ci, rci = p["inert_fraction_ci"], p.get("removal_deep_over_shallow_ci") or [math.nan] * 2
                    lines.append(f"| {d['layers']} | {v} (seed {seed}) | {p['tokens'] / 1e6:.2f}M | "
                                 f"{p['probe_loss']:.4f} | {f'{val:.4f}' if i == len(probes) - 1 else ''} | "
                                 f"{p['inert_fraction']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] | "
                                 f"{p['removal_deep_over_shallow']:.3f} [{rci[0]:.3f}, {rci[1]:.3f}] | "
                                 f"{p['update_slope']:+.4f} |")
    return lines + ["", "The probe's own loss over the whole split is well above the validation loss on the "
                    "split's first 32k tokens: that head is easier than the rest, so the earlier probe (its first "
                    "4,096 tokens) and the validation loss each describe a part of the split.", ""]


# ---------------------------------------------------------------------------------------------------- ViT study
def write_vit(out: Path) -> dict | None:
    s = settings_of(out)
    if s is None:
        return None
    res = vit_study(load_records(out / "runs.jsonl"), s, "pre", s.get("direction") or
                    {"lns-norm": "worse", "lns-branch": "better"})
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    figures.plot_vit(res, out / "vit_study.png")
    print(f"wrote {out / 'results.json'}")
    return res


def vit_section(out: Path, img: str) -> list[str]:
    if not (out / "results.json").exists():
        return ["Not run yet (`make study-vit`).", ""]
    res = json.loads((out / "results.json").read_text())
    s, best = res["settings"], res["best_lr"]
    lines = [f"Command: `make study-vit` (`{s['command']}`). The `vit-digits` preset: a 12 x 64 ViT (patch 2), "
             f"scikit-learn's 1,797 8 x 8 digits (1,438 train / 359 validation), {s['steps']} steps of {s['batch']} "
             f"images, AdamW, fp32. Rates {', '.join(f'{x:g}' for x in s['lrs'])} with seed 0, then each variant's "
             f"best rate **by validation loss**, with seeds {s['seeds']}. Selection and the verdict use the same "
             "metric (loss); accuracy is reported beside it with its binomial standard error over the 359 images.",
             "", "| variant | best lr (by loss) | by accuracy it would be | val loss | top-1 accuracy | seeds |",
             "|---|---|---|---|---|---|"]
    for v, d in res["variants"].items():
        edge = " ⚠ grid edge" if res["edge"][v] else ""
        lines.append(f"| {v} | {best[v]:g}{edge} | {res['best_lr_by_accuracy'][v]:g} | {spread(d['loss'])} | "
                     f"{spread(d['acc'])} | {d['loss']['n']} |")
    lines += ["", "| paper's claim | metric | per seed (variant − pre) | variant − pre | claim |",
              "|---|---|---|---|---|"]
    claims = {"lns-branch": "LNS on the branch outputs beats Pre-LN", "lns-norm": "LNS after the norm loses to Pre-LN"}
    for v, c in res["comparisons"].items():
        for metric in ("loss", "acc"):
            m = c[metric]
            se = (f" (within two binomial SE of the difference, {2 * m['binomial_se']:.3f}, over the same "
                  "images every seed scores: read inconclusive)" if "binomial_se" in m
                  and abs(m["mean"]) <= 2 * m["binomial_se"] else "")
            lines.append(f"| {claims.get(v, v)} | {metric} | {_per_seed(m['per_seed'])} | {said(m)}{se} | "
                         f"{m['claim']} |")
    return lines + ["", f"![ViT study]({img})", ""]


def cell_tables(out: Path) -> list[str]:
    """One row per variant, depth and rate: final validation loss (mean and spread over seeds) and the final
    model's curse index (the deep half's inert fraction, the whole interior's, the deep/shallow removal ratio), from
    the records."""
    rows = {}
    for r in load_records(out / "runs.jsonl").values():
        rows.setdefault((r["variant"], r.get("layers"), r["lr"]), []).append(r)
    lines = ["| variant | N | lr | seeds | val loss | diverged | inert fraction, deep half | inert fraction, whole "
             "interior | removal deep/shallow |", "|---|---|---|---|---|---|---|---|---|"]
    for (v, L, lr), rs in sorted(rows.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0], kv[0][2])):
        ok = [r for r in rs if r["status"] == "ok"]
        curse = [r["probes"][-1]["curse"] for r in ok if r.get("probes")]
        deep = _mean_of([{"x": deep_inert_fraction(r["probes"][-1])} for r in ok if r.get("probes")], "x")
        inert, ratio = (_mean_of(curse, k) for k in ("inert_fraction", "removal_deep_over_shallow"))
        lines.append(f"| {v} | {L} | {lr:g} | {len(rs)} | {spread(mean_std(r['val_loss'] for r in ok)) if ok else '-'}"
                     f" | {len(rs) - len(ok)} | {spread(deep, '.2f') if deep else '-'} | "
                     f"{spread(inert, '.2f') if inert else '-'} | {spread(ratio, '.2f') if ratio else '-'} |")
    along = [r for r in load_records(out / "runs.jsonl").values() if len(r.get("probes", [])) > 2]
    if along:  # the curse along training: each probe's tokens, inert fraction, removal ratio, probe loss
        lines += ["", "| run | tokens | inert fraction | removal deep/shallow | probe loss |", "|---|---|---|---|---|"]
        lines += [f"| {r['key']} | {q['tokens']:,} | {number(q['curse'].get('inert_fraction'))} | "
                  f"{number(q['curse'].get('removal_deep_over_shallow'))} | {q['probe_loss']:.4f} |"
                  for r in along for q in r["probes"]]
    return lines


def _mean_of(curse: list[dict], key: str) -> dict | None:
    """mean_std of one index entry over seeds; None where no model has it (no interior at tiny depths)."""
    xs = [c[key] for c in curse if c.get(key) is not None]
    return mean_std(xs) if xs else None


def along_table(records: dict) -> list[str]:
    """Part 3: at every probe along training, both schemes' probe loss, Δ and both curse indices."""
    from depthlab.study.summary import along_pairs

    lines = []
    for a in along_pairs(records):
        lines += [f"**N = {a['layers']}, lr {a['lr']:g}** (seed 0; final validation loss pre {a['val_loss']['pre']:.4f}"
                  f", lns {a['val_loss']['lns']:.4f}).", "",
                  "| tokens | probe loss pre | lns | Δ | inert pre | inert lns | removal deep/shallow pre | lns |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {p['tokens']:,} | {p['pre_loss']:.4f} | {p['lns_loss']:.4f} | {p['delta']:+.4f} | "
                  f"{number(p['pre_inert_fraction'])} | {number(p['lns_inert_fraction'])} | "
                  f"{number(p['pre_removal_deep_over_shallow'])} | {number(p['lns_removal_deep_over_shallow'])} |"
                  for p in a["probes"]]
        lines.append("")
    return lines


