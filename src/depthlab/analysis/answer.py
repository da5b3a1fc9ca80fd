"""What an analysis found, before how: the lines that open `analyze`'s terminal summary and its report.

    verdict      per objective (loss; multiple choice and generation when they were scored), the word the declared
                 rule (depthlab.analysis.verdict) gives, the numbers it read and the rule itself in one line
    removable    the blocks that could go: the k blocks whose removal alone costs least, removed together (k = 1, 2,
                 4, as far as `--drop-lowest` scored them), with what that costs in nats per token and in % perplexity
    perplexity   the model's own, with its window and the tokens it was scored on

One unit: a removal costs nats of loss per scored token; % perplexity is the same number read as a perplexity ratio,
100 (e^Δ - 1). One notation for a set of blocks: 1-based, as the report counts, `results.blocks_text`.
"""

from __future__ import annotations

import math

from depthlab.analysis.results import blocks_text, is_classifier

HEADLINE_K = (1, 2, 4)  # how many of the cheapest blocks the headline removes together


def pct_ppl(delta_loss: float) -> float:
    """A loss change in nats as the change of perplexity in percent."""
    return 100.0 * math.expm1(min(delta_loss, 50.0))


def cost_text(delta_loss: float) -> str:
    """"+0.401 nats (+49.3% perplexity)": a removal's cost in the one unit, with its perplexity reading beside."""
    return f"{delta_loss:+.3f} nats ({pct_ppl(delta_loss):+.1f}% perplexity)"


def scored_tokens(res: dict) -> int | None:
    """The next-token targets the removal scores were read on (every window's real tokens after its first)."""
    w = res.get("removal", {}).get("windows")
    return int(sum(w["count"])) if w else None


def perplexity_text(res: dict) -> str | None:
    """The model's own perplexity with its window and token count, or a classifier's loss and accuracy."""
    r = res.get("removal")
    if not r:
        return None
    if is_classifier(res):
        return f"loss {r['base_loss']:.4f} nats, top-1 accuracy {r['base_acc']:.4f} on {res['sequences']} images"
    n = scored_tokens(res)
    window = res.get("data", {}).get("seq_len")
    where = f"{n:,} tokens scored" if n else f"{res['tokens']:,} tokens"
    where += f" in {res['sequences']} windows of {window}" if window else ""
    return f"perplexity {r['base_ppl']:.2f} (loss {r['base_loss']:.4f} nats), {where}"


def data_text(res: dict) -> str:
    return res.get("data", {}).get("source", "")


def outcomes(res: dict) -> list:
    """The raw outcomes the declared rule reads (depthlab.analysis.verdict.Outcomes), one per objective scored: the
    loss per calibration window; multiple choice, every task's questions pooled (chance: their mean 1/choices);
    generation, the items of the families the model itself answers at the rule's rate or more."""
    import numpy as np

    from depthlab.analysis import verdict

    w = res["removal"]["windows"]
    out = [verdict.Outcomes("loss", np.asarray(w["single_delta"], dtype=np.float64),
                            np.asarray(w["count"], dtype=np.float64))]
    chance = res.get("data", {}).get("chance", {})
    for objective, key in (("choice", "task_removal"), ("generation", "generate_removal")):
        tasks = res.get(key, {}).get("tasks", {})
        if objective == "generation":
            tasks = {t: v for t, v in tasks.items() if v["base_acc"] >= verdict.Rule.min_generation}
        rows = [np.asarray(t["per_question"]["right"], dtype=np.float64) for t in tasks.values()
                if len(t["per_question"]["right"]) == len(res["blocks"]) + 1]
        if rows:
            right = np.concatenate(rows, axis=1)  # (1 + L, questions): the model itself, then each block removed
            p = (float(np.mean([chance[t] for t in tasks])) if objective == "choice" and all(t in chance for t in tasks)
                 else 0.0)
            out.append(verdict.task_outcomes(objective, right[0], right[1:], p))
    return out


def verdicts(res: dict) -> list[dict]:
    """The declared rule's reading of each objective scored (depthlab.analysis.verdict); [] without layer removal
    (nothing to read) or with an interior too small for the rule's early and deep blocks."""
    from depthlab.analysis.curse import shallow_deep
    from depthlab.analysis.verdict import verdict

    early, deep = shallow_deep(len(res["blocks"]))
    if "windows" not in res.get("removal", {}) or len(early) < 2 or len(deep) < 2:
        return []  # leaving one block out needs two on each side
    return [verdict(o) for o in outcomes(res)]


def verdict_lines(res: dict) -> list[str]:
    out = [verdict_line(v) for v in verdicts(res)]
    if out:
        return out + [RULE]
    why = "no layer removal" if "removal" not in res else f"{len(res['blocks'])} blocks: too few for the rule"
    return [f"verdict: not read ({why})"]


RULE = ("rule: R = median removal cost over the deep interior (N/2, N-2] / median over the early interior "
        "[2, N/4+1], with a paired bootstrap interval (one objective of three, Bonferroni); deep blocks wasted if the "
        "interval lies below 0.5, not wasted if above, else inconclusive; it stands only if every reading with one "
        "block left out agrees (depthlab.analysis.verdict)")


def verdict_line(v: dict) -> str:
    """One objective's verdict: the word, R with its interval, the leave-one-block-out range, the medians read."""
    if v["word"] == "not testable" and not v["precondition"]["ok"]:
        pre = v["precondition"]
        return (f"verdict ({v['objective']}): not testable: the model itself answers {pre['right']} of {pre['n']} "
                f"(chance {pre['chance']:.2f}, p = {pre['above_chance_p']:.2g})")
    lo, hi = v["leave_one_out_range"]["ratio"]
    unit = "nats" if v["objective"] == "loss" else "accuracy"
    word = v["word"] + (" (the early interior's median cost is not above 0)" if v["word"] == "not testable" else "")
    return (f"verdict ({v['objective']}): {word}: R = {v['ratio']:.3g} [{v['ci'][0]:.3g}, {v['ci'][1]:.3g}] "
            f"({100 * v['level']:.1f}% interval, {v['units']} {'windows' if v['objective'] == 'loss' else 'items'}), "
            f"one block left out {lo:.3g}-{hi:.3g}; median cost deep {v['median_deep']:.3g} / early "
            f"{v['median_early']:.3g} {unit} (deep {blocks_text(v['deep'])}, early {blocks_text(v['early'])})")


def removable(res: dict) -> list[dict]:
    """The k cheapest blocks by loss removed together, for k in HEADLINE_K as far as `--drop-lowest` scored them
    (else the cheapest block alone, from the single-block removals): [{k, blocks, delta_loss, acc_drop?}]."""
    r = res.get("removal", {})
    drops = {d["k"]: d for d in r.get("drop", {}).get("loss", [])}
    order = res.get("usefulness", {}).get("loss", [])
    if not drops and r.get("single"):
        best = min(r["single"], key=lambda s: s["delta_loss"])
        drops, order = {1: best}, [best["block"]]
    rows = []
    for k in HEADLINE_K:
        if k in drops:
            d = drops[k]
            rows.append({"k": k, "blocks": sorted(order[:k]), "delta_loss": d["delta_loss"],
                         **({"acc_drop": d["acc_drop"]} if "acc_drop" in d else {})})
    return rows


def removable_lines(res: dict) -> list[str]:
    rows = removable(res)
    if not rows:
        return []
    lines = ["blocks that could go (the k whose removal alone costs least, removed together; cost per token):"]
    for row in rows:
        what = f"remove {row['k']}: block" + ("s" if row["k"] > 1 else "")
        cost = cost_text(row["delta_loss"])
        if "acc_drop" in row:  # a classifier: its loss, and its accuracy
            cost = f"{row['delta_loss']:+.3f} nats, top-1 accuracy {-row['acc_drop']:+.4f}"
        lines.append(f"  {what} {blocks_text(row['blocks'])}: {cost}")
    if len(rows) < len(HEADLINE_K) and "drop" not in res.get("removal", {}):
        lines.append("  (more blocks together: analyze again with --drop-lowest 4)")
    return lines


def headline_lines(res: dict) -> list[str]:
    """The answer, first: the verdict, the removable blocks and their cost, the model's own perplexity."""
    lines = verdict_lines(res) + removable_lines(res)
    ppl = perplexity_text(res)
    if ppl:
        lines.append(f"{ppl}; data: {data_text(res)}")
    return lines


def compare_line(label: str, res: dict) -> str:
    """One model of `compare` in one line: its verdicts' words, the cost of its cheapest blocks, its perplexity."""
    words = "; ".join(f"{v['objective']}: {v['word']}" for v in verdicts(res)) or "not read"
    rows = [r for r in removable(res) if "acc_drop" not in r]
    go = ""
    if rows:
        r = rows[-1]
        go = (f"; removing {'block' if r['k'] == 1 else str(r['k']) + ' cheapest blocks'} {blocks_text(r['blocks'])} "
              f"costs {cost_text(r['delta_loss'])}")
    ppl = perplexity_text(res)
    return f"{label}: {len(res['blocks'])} blocks, verdict {words}{go}" + (f"; {ppl}" if ppl else "")


def measured_alike(runs: list[tuple[str, dict]]) -> list[str]:
    """A warning line per way the compared models were measured differently: the text, the window, the tokens."""
    out = []
    for what, get in (("texts", data_text), ("windows", lambda r: r.get("data", {}).get("seq_len")),
                      ("token counts", lambda r: scored_tokens(r) or r.get("tokens"))):
        seen = {lab: get(r) for lab, r in runs}
        if len(set(map(str, seen.values()))) > 1:
            out.append(f"warning: the models were measured on different {what} (" + "; ".join(
                f"{lab}: {v}" for lab, v in seen.items()) + "): their numbers do not compare one to one")
    return out
