"""Recompute the real-model panel's table and words from its records alone (numpy and scipy; no model, no torch):

    python -m benchmarks.panel_recompute [RECORDS]     # default benchmarks/results/real_model_panel

RECORDS/MODEL/PHASE.json hold raw outcomes (benchmarks/real_model_panel.py writes them): per window the summed loss
and its tokens (loss, code, parts), per question and per item right or wrong (choice, generation), for the model
itself and with each block removed, and each chosen set's outcomes (search). From them, per model: each objective's
word by the declared rule (depthlab.analysis.verdict) with its leave-one-block-out range, the curse index's mean
ratio (reported, not the word), the rank correlations of the single-block profiles between objectives with
bootstrap intervals, the blocks that could go and, where the search ran, the objective x search table. Prints a
markdown table and writes RECORDS/panel.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from depthlab.analysis.curse import interior, removal_index
from depthlab.analysis.verdict import (
    OBJECTIVES,
    Rule,
    cheapest_blocks,
    joint_cost,
    loss_outcomes,
    task_outcomes,
    verdict,
)

RESULTS = Path(__file__).parent / "results" / "real_model_panel"
CHANCE = {"choice": 0.25, "generation": 0.0}
MODELS = ("smollm2", "gemma3", "qwen25")


def records(folder: Path) -> dict[str, dict[str, dict]]:
    return {m.name: {f.stem: json.loads(f.read_text()) for f in sorted(m.glob("*.json"))}
            for m in sorted(folder.iterdir(), key=lambda p: (MODELS + (p.name,)).index(p.name)) if m.is_dir()}


def outcomes(rec: dict) -> dict:
    """Each objective's verdict.Outcomes from a model's records (those present)."""
    out = {}
    if "loss" in rec:
        r = rec["loss"]
        out["loss"] = loss_outcomes(r["base"], r["removed"], r["tokens"])
    for name in ("choice", "generation"):
        if rec.get(name, {}).get("removed"):
            out[name] = task_outcomes(name, rec[name]["base"], rec[name]["removed"], CHANCE[name])
    return out


def rank_correlations(objs: dict, rule: Rule) -> dict:
    """Spearman's rho between each two objectives' single-block costs over the interior (2 .. N-2), with a
    bootstrap interval at the family level (the three pairs: 1 - 0.05/3): each objective's units drawn with
    replacement, independently (they are different data), from one seeded generator."""
    names = [o for o in OBJECTIVES if o in objs]
    if len(names) < 2:
        return {}
    n = objs[names[0]].delta.shape[0]
    inner = [l - 1 for l in interior(n)]
    rng = np.random.default_rng(rule.seed)
    boot = {}
    for name in names:
        o = objs[name]
        W = len(o.weight)
        draws = rng.multinomial(W, np.full(W, 1.0 / W), size=rule.replicates).astype(np.float64)
        boot[name] = (draws @ o.delta.T / (draws @ o.weight)[:, None])[:, inner]
    a = 1 - rule.level
    out = {}
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            rho = float(spearmanr(objs[x].costs[inner], objs[y].costs[inner]).statistic)
            reps = np.array([spearmanr(bx, by).statistic for bx, by in zip(boot[x], boot[y])])
            reps = reps[np.isfinite(reps)]
            out[f"{x} ~ {y}"] = {"rho": rho, "ci": np.quantile(reps, [a / 2, 1 - a / 2]).tolist(),
                                 "level": rule.level, "blocks": len(inner)}
    return out


def jaccard(a, b) -> float:
    a, b = set(a), set(b)
    return len(a & b) / len(a | b)


def search_table(rec: dict, rule: Rule) -> dict | None:
    """Each chosen set's cost by each objective (the set removed together, against the model itself, on the same
    units), and the Jaccard overlaps of the sets."""
    s = rec.get("search")
    if not s:
        return None
    rows = {}
    for how, blocks in s["sets"].items():
        scored = s["scored"][",".join(map(str, sorted(blocks)))]
        row = {"blocks": blocks}
        for name, got in scored.items():
            base = s["base"][name]
            if name == "loss":
                row["loss"] = joint_cost(np.subtract(got, base), s["tokens"], rule)
            else:
                row[name] = {"accuracy": float(np.mean(got)), "drop": float(np.mean(base) - np.mean(got))}
        rows[how] = row
    keys = list(s["sets"])
    overlaps = {f"{x} | {y}": jaccard(s["sets"][x], s["sets"][y]) for i, x in enumerate(keys) for y in keys[i + 1:]}
    return {"k": s["k"], "sets": rows, "jaccard": overlaps,
            "base": {name: (float(np.mean(v)) if name != "loss" else float(np.sum(v) / np.sum(s["tokens"])))
                     for name, v in s["base"].items()}}


def panel(folder: Path = RESULTS, rule: Rule | None = None) -> dict:
    rule, out = rule or Rule(), {}
    for model, rec in records(folder).items():
        objs = outcomes(rec)
        m = {"words": {name: verdict(o, rule) for name, o in objs.items()}}
        if "loss" in rec:
            r, n = rec["loss"], len(rec["loss"]["removed"])
            delta = (np.asarray(r["removed"]) - np.asarray(r["base"])).tolist()
            idx = removal_index({"count": r["tokens"], "single_delta": delta}, n)
            m["curse_index_mean_ratio"] = {"ratio": idx["removal_deep_over_shallow"],
                                           "ci": idx["removal_deep_over_shallow_ci"]}
            m["could_go"] = {"by_loss": cheapest_blocks(objs["loss"].costs, 4)}
            if "could_go" in rec:
                c = rec["could_go"]
                m["could_go"].update(measured=c["blocks"], **joint_cost(np.subtract(c["removed"], c["base"]),
                                                                       c["tokens"], rule))
            m["base_loss"] = float(np.sum(r["base"]) / np.sum(r["tokens"]))
        if "code" in rec:
            c = rec["code"]
            m["code_cost"] = loss_outcomes(c["base"], c["removed"], c["tokens"]).costs.tolist()
        m["rank_correlations"] = rank_correlations(objs, Rule(replicates=min(rule.replicates, 500), seed=rule.seed))
        m["search"] = search_table(rec, rule)
        out[model] = m
    return out


def fmt(v: dict) -> str:
    lo, hi = v["leave_one_out_range"]["ratio"]
    return (f"{v['word']}: R {v['ratio']:.2f} [{v['ci'][0]:.2f}, {v['ci'][1]:.2f}], "
            f"left one out {lo:.2f}..{hi:.2f}")


def table(p: dict) -> str:
    lines = ["| model | " + " | ".join(OBJECTIVES) + " | mean ratio (curse index) |", "|---" * 5 + "|"]
    for model in [*MODELS, *(x for x in p if x not in MODELS)]:
        m = p.get(model, {"words": {}})
        cells = [fmt(m["words"][o]) if o in m["words"] else "not run" for o in OBJECTIVES]
        c = m.get("curse_index_mean_ratio")
        cells.append(f"{c['ratio']:.2f} [{c['ci'][0]:.2f}, {c['ci'][1]:.2f}]" if c else "not run")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0]) if argv else RESULTS
    if not folder.is_dir():
        print(f"panel_recompute: error: {folder} is not a folder of panel records (MODEL/PHASE.json)", file=sys.stderr)
        raise SystemExit(2)
    p = panel(folder)
    (folder / "panel.json").write_text(json.dumps(p, indent=1) + "\n")  # an R of +inf is written Infinity
    print(table(p))


if __name__ == "__main__":
    main()
