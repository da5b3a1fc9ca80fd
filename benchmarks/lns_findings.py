"""The LNS study's findings in words, for the top of docs/results.md: what its runs support, at which rates and
depths, the explanations each run rules in or out, and what this scale cannot say. Every number is read from the
records through depthlab.study.summary; the words that judge (lower, absent, reproduces) follow from those numbers
by the rules written here, so a new run can change them."""

from __future__ import annotations

import json
from pathlib import Path

from depthlab.study.stats import spread
from depthlab.study.summary import along_verdict


def _d(c: dict) -> str:
    n = len(c.get("seeds", []))
    return f"{spread(c, '.3f', signed=True)} ({c['verdict']}, {n} seed{'' if n == 1 else 's'})"


def _own(res: dict) -> list[dict]:
    """The depths where both schemes ran a rate grid of their own (three rates or more) and a best rate inside."""
    return [d for d in res["depths"] if d["delta_val_loss"].get("seeds")
            and all(len(g["grid"]) >= 3 and not g["edge"] for g in d["grids"].values())]


def _reads(res: dict, word: str) -> list[int]:
    return [d["layers"] for d in res["depths"] if d["pre"].get("index", {}).get("reading") == word]


def _gain_init_share(g: dict) -> float | None:
    """gain-init's difference against pre as a share of LNS's, where both have seeds."""
    v = g["variants"]
    lns, gi = (v.get(k, {}).get("delta_val_loss", {}) for k in ("lns", "pre+gain_init"))
    if not (lns.get("seeds") and gi.get("seeds")) or lns["mean"] == 0:
        return None
    return gi["mean"] / lns["mean"]


def bottom_line(res: dict, along: list[dict], equal_rate: list[dict]) -> list[str]:
    """The headline's first paragraph: lns_study() results, along_pairs() of the along runs and the depth study's
    same-rate rows at its reference depth."""
    if not res["depths"]:
        return []
    own = _own(res)
    out = ["**What the runs say about LNS.**"]
    done = [d for d in res["depths"] if d["delta_val_loss"].get("seeds")]
    if done:
        out.append("Each scheme at its own best rate at each depth, LNS − Pre-LN validation loss: " + "; ".join(
            f"N = {d['layers']} {_d(d['delta_val_loss'])}" + ("" if d in own else " (a grid not yet complete)")
            for d in done) + ".")
        out.append("The loss itself, at those rates, by depth: " + "; ".join(
            f"N = {d['layers']} pre {d['pre']['val_loss']['mean']:.3f}, lns {d['lns']['val_loss']['mean']:.3f}"
            for d in done) + ".")
    means = [d["delta_val_loss"]["mean"] for d in done]
    if len(means) > 2 and all(b < a for a, b in zip(means, means[1:])):
        out.append("The gap widens with every doubling of depth.")
    behind = [r for r in equal_rate if r["delta"] > 0]
    low = [g for g in res["parts"] if g["variants"].get("lns", {}).get("delta_val_loss", {}).get("mean", 0) > 0]
    if behind or low:
        rates = ", ".join(f"{r['lr']:g}" for r in behind)
        out.append("It is an advantage at high learning rates only: " + "; ".join(
            [f"at N = 24 (seed 0) LNS is behind at {rates} (by {min(r['delta'] for r in behind):+.3f} to "
             f"{max(r['delta'] for r in behind):+.3f}; the paper trains every scheme at 1e-3)"] * bool(behind)
            + [f"at N = {g['layers']}, lr {g['lr']:g} LNS − Pre-LN is {_d(g['variants']['lns']['delta_val_loss'])}"
               for g in low]) + ".")
    absent, present = _reads(res, "absent"), _reads(res, "present")
    if absent:
        lead = [d["layers"] for d in res["depths"] if d["layers"] in absent and d["delta_val_loss"].get("verdict")
                == "lower"]
        old = [d["layers"] for d in res["depths"] if d["pre"].get("old_probe")]
        out.append(f"Pre-LN's curse index reads absent at N = {', '.join(map(str, absent))}"
                   + (f" and present at N = {', '.join(map(str, present))}" if present else "")
                   + (f" (at N = {', '.join(map(str, old))} from the earlier 64-window probe)" if old else "")
                   + (f": where LNS is ahead with no identity-like interior to lift (N = {', '.join(map(str, lead))}),"
                      " its gain is not curse-lifting." if lead else "."))
    shares = {(g["layers"], g["lr"]): _gain_init_share(g) for g in res["parts"]}
    if shares and all(s is not None for s in shares.values()):
        same = all(0.5 <= s <= 1.5 for s in shares.values())
        out.append("Taken apart at " + " and ".join(f"N = {L}, lr {lr:g}" for L, lr in shares) + ", the gains "
                   "initialised at l^-p alone give " + ", ".join(f"{s:.0%}" for s in shares.values()) + " of LNS's "
                   "difference against Pre-LN" + (", at either sign" if same else "") + "; the depth-scaled gain "
                   "learning rate alone gives " + ", ".join(
                       _d(g["variants"]["pre+gain_lr"]["delta_val_loss"]) for g in res["parts"]
                       if g["variants"].get("pre+gain_lr", {}).get("delta_val_loss", {}).get("seeds")) + ".")
    verdicts = [(a, along_verdict(a)) for a in along]
    verdicts = [(a, v) for a, v in verdicts if "to_delta" in v]
    if verdicts:
        out.append("Along training, seed 0: " + "; ".join(
            f"at N = {a['layers']}, lr {a['lr']:g} Δ goes from {v['from_delta']:+.3f} at {v['from_tokens'] / 1e6:.1f}M "
            f"tokens to {v['to_delta']:+.3f} at {v['to_tokens'] / 1e6:.1f}M while Pre-LN's index "
            f"{'stays' if v['pre_index'] == 'flat' else 'moves'} {v['pre_index']}: claim 1 **{v['verdict']}** "
            f"({v['why']})" for a, v in verdicts) + ".")
        ahead = [(a, v) for a, v in verdicts if v["from_delta"] < 0]
        if ahead and all(v["to_delta"] > v["from_delta"] + 0.01 for _, v in ahead):
            out.append("Where LNS starts ahead, its lead shrinks with training: a head start more than a better end "
                       "point.")
    st = stability_verdicts(res) if res.get("stability") else {}
    if st:
        out.append(f"Stability at N = {res['ref_depth']} under the width-matched init (seed-0 grids): " + "; ".join(
            f"{v} diverged at {_rates_text(r['diverged'])}: claim {r['claim']}"
            + (f" by divergence **{r['word']}**{_gap(r, res.get('unigram_loss'))}" if r["claim"] == 5
               else f" **{r['word']}**")
            for v, r in st.items()) + " (section 9, part 4).")
    favour = (absent and shares and all(s is not None and 0.5 <= s <= 1.5 for s in shares.values())
              and not any(v["verdict"] == "supported" for _, v in verdicts))
    if favour:
        gap = {d["layers"]: d["delta_val_loss"]["mean"] for d in done}
        larger = present and all(gap.get(p, 0) < min(gap.get(a, 0) for a in absent) for p in present)
        out.append("**The data favour an optimisation effect over curse-lifting**: smaller deep norm gains at the "
                   "start (what LNS is under Adam, docs/method.md) let the high rates train, and cost at low rates, "
                   "whether or not Pre-LN's deep blocks are identity-like. Where Pre-LN's index reads present "
                   f"(N = {', '.join(map(str, present)) or 'none'}), these runs cannot say how much of LNS's "
                   + ("larger lead" if larger else "lead there (no larger than where the index reads absent)")
                   + " is curse-lifting.")
    else:
        out.append("**The runs so far do not single out one explanation** of LNS's advantage (section 9 holds each).")
    return [" ".join(out), ""]


def tokens_per_parameter(settings: Path, depths: list[int]) -> dict[int, float]:
    """Training tokens per parameter (embeddings included) of a study's cells at each depth, from its settings."""
    import torch

    from depthlab.config import apply_overrides
    from depthlab.model.families import preset
    from depthlab.model.transformer import build_model

    s = json.loads(settings.read_text())
    tokens = s["meta"]["steps"] * s["meta"]["batch"] * s["meta"]["seq"]
    out = {}
    for L in depths:
        cfg = apply_overrides(preset(s["preset"]), [*s["base"], f"model.n_layers={L}"])
        with torch.device("meta"):
            out[L] = tokens / build_model(cfg.model, init=False).num_params()
    return out


def limits(lns_settings: Path, along_settings: Path, depths: list[int], along_depths: list[int],
           gpu_ran: bool) -> list[str]:
    """What this scale cannot say, with the tokens per parameter of these runs."""
    tpp = tokens_per_parameter(lns_settings, depths) if lns_settings.exists() else {}
    along = tokens_per_parameter(along_settings, along_depths) if along_settings.exists() else {}
    ratio = ", ".join(f"{tpp[L]:.1f} (N = {L})" for L in sorted(tpp))
    ratio += "".join(f", {along[L]:.0f} (the along runs, N = {L})" for L in sorted(along))
    return ["**What this scale cannot say.** The paper trains 130M-1B parameter models at width 768 and more on C4, "
            "about 20 tokens per parameter at 130M; these runs train width-64 models on Python source code, at "
            f"tokens per parameter {ratio or 'of a few'}. A high-rate advantage of a gain initialisation at width 64 "
            "need not survive at width 768, where the paper's shared 1e-3 may already sit at each scheme's optimum; "
            "and a curse that forms over billions of tokens may not have formed in 2M-15M. The GPU study (section 9, "
            "part 5) asks the along question at width 128 and 60M tokens" + ("." if gpu_ran else "; it has not run "
                                                                              "(no GPU machine was lent).")
            + " Every difference here is "
            "the mean over 2-3 seeds with its spread; one seed reads inconclusive.", ""]


def section1_reading(res: dict, depth: dict | None) -> list[str]:
    """What section 1 (one rate per scheme, chosen at its reference depth) supports, read against section 9's
    per-depth rates (res: lns_study(); depth: the depth study's results.json)."""
    if not depth:
        return []
    shared = depth["best_lr"]
    moved = [d for d in _own(res) if any(d["grids"][v]["best_lr"] != shared[v] for v in shared)]
    out = [f"**Reading.** Section 1 trains every depth at the rates chosen at N = {depth['settings']['ref_depth']} "
           f"(pre {shared['pre']:g}, lns {shared['lns']:g}); its Δ(N) therefore mixes depth with how well one rate "
           "transfers across depths. Section 9 tunes each depth on its own"]
    if moved:
        out[-1] += ": " + "; ".join(
            f"at N = {d['layers']} the best rates are pre {d['grids']['pre']['best_lr']:g}, lns "
            f"{d['grids']['lns']['best_lr']:g}, and Δ is {_d(d['delta_val_loss'])}" for d in moved) + "."
    else:
        out[-1] += "."
    wide = [d for d in depth["depths"] if d["delta_val_loss"].get("verdict") == "lower"]
    if wide:
        out.append("The gaps at N = " + ", ".join(
            f"{d['layers']} ({d['delta_val_loss']['mean']:+.3f} ± {d['delta_val_loss']['std']:.3f}, "
            f"{len(d['seeds'])} seeds)" for d in wide) + " are beyond two standard errors, so not one seed's luck")
    why = (" they do not show is why (the grid's same-rate rows flip sign below 8e-3, and the mechanism table "
           "below has LNS's deep blocks doing *less* than Pre-LN's, not more). The curse index here is the earlier "
           "64-window probe's, whose noise is the size of the interior costs it reads; section 9's cells are probed "
           "over the whole validation split with intervals.")
    if wide:
        out[-1] += "; what" + why
    else:
        out.append("What" + why)
    return [" ".join(out), ""]


def vit_reading(vit: dict | None) -> list[str]:
    """What the ViT study (section 7) supports, from its results.json."""
    if not vit:
        return []
    c = vit["comparisons"]
    words = {c[v][m]["verdict"] for v in c for m in ("loss", "acc")}
    edge = [v for v, e in vit["edge"].items() if e]
    n = vit["settings"].get("seeds", [])
    out = ["**Reading.**"]
    if words == {"inconclusive"}:
        out.append(f"Neither of the paper's ViT claims is supported or contradicted here: every difference, in loss "
                   f"and in top-1 accuracy, is within two standard errors over {len(n)} seeds (accuracy against the "
                   "binomial error of the validation set as well).")
    else:
        out.append("Verdicts: " + "; ".join(f"{v}: loss {c[v]['loss']['verdict']}, accuracy {c[v]['acc']['verdict']}"
                                             for v in c) + ".")
    if edge:
        out.append(f"The best rate of {', '.join(edge)} is at the edge of its grid, so its own optimum was not "
                   "found and its comparison is not yet at each variant's best rate.")
    se = max(c[v]["acc"].get("binomial_se", 0) for v in c)
    out.append(f"At 1,438 training images and {vit['settings']['steps']} steps this is a test of the code path, "
               f"not of the claim: the smallest accuracy difference it resolves (two binomial errors, "
               f"{200 * se:.1f} points) is larger than the paper's (ViT-S on ImageNet: +0.8 points with the scale "
               "on the branch outputs, −1.5 with it after the norm).")
    return [" ".join(out), ""]


def stability_verdicts(res: dict) -> dict[str, dict]:
    """Claims 5 and 6 read from the stability phase (res: lns_study()), per scheme: the rates it trained and diverged
    at, and its claim's word. Claim 5 (post, deepnorm and mixln less stable at depth than Pre-LN) is read on the rates
    both a scheme and Pre-LN ran at the reference depth with seed 0: supported where the scheme diverged at a rate
    Pre-LN trained at, not supported where it diverged at none of them. Claim 6 (lns with scaled init worse than lns)
    is the paired Δ against lns, each at its own best rate: supported if higher, contradicted if lower."""
    pre = next((d["grids"]["pre"] for d in res["depths"] if d["layers"] == res["ref_depth"]), None)
    if pre is None:
        return {}
    pre_ok = {float(lr) for lr in pre["grid"]} - set(pre["diverged"])
    out = {}
    for v, s in res["stability"].items():
        rates = sorted(float(lr) for lr in s["grid"])
        worse = [lr for lr in rates if lr in pre_ok and lr in s["diverged"]]
        row = {"claim": 5, "loss": {lr: s["grid"][f"{lr:g}"] for lr in rates}, "diverged": s["diverged"],
               "worse": worse, "pre_loss": {lr: pre["grid"][f"{lr:g}"] for lr in rates if f"{lr:g}" in pre["grid"]}}
        gaps = {lr: x - row["pre_loss"][lr] for lr, x in row["loss"].items() if lr in row["pre_loss"]}
        row["gap"] = max(gaps.items(), key=lambda kv: kv[1]) if gaps else None  # (rate, its loss minus pre's)
        if v.startswith("lns+"):
            vs = s["against"].get("lns", {})
            row.update(claim=6, delta=vs, word={"higher": "supported", "lower": "contradicted"}.get(
                vs.get("verdict"), "inconclusive"))
        else:
            row["word"] = "supported" if worse else ("not supported" if pre_ok & set(rates) else "not tested")
        out[v] = row
    return out


def _gap(r: dict, floor: float | None = None) -> str:
    """The largest loss gap to pre, and where the unigram loss (floor) is known how far that loss is from it."""
    if not r["gap"]:
        return ""
    lr, gap = r["gap"]
    out = f"; its largest loss gap to pre at one rate is {gap:+.3f} at {lr:g}"
    if floor is not None:
        out += f", {r['loss'][lr] - floor:+.3f} from the unigram loss ({floor:.3f}: token frequencies alone)"
    return out


def _rates_text(lrs: list[float]) -> str:
    return ", ".join(f"{lr:g}" for lr in lrs) or "none"


def stability_reading(res: dict) -> list[str]:
    """stability_verdicts() in words, under the stability table."""
    verdicts = stability_verdicts(res)
    if not verdicts:
        return []
    out = [f"*Reading (claims 5 and 6, N = {res['ref_depth']}, width-matched init):*"]
    for v, r in verdicts.items():
        span = f"{v}, final loss by rate " + ", ".join(
            f"{lr:g} {x:.3f}" + (f" (pre {r['pre_loss'][lr]:.3f})" if lr in r["pre_loss"] else "")
            for lr, x in r["loss"].items()) + f", diverged at {_rates_text(r['diverged'])}"
        if r["claim"] == 6:
            vs = r["delta"]
            out.append(f"{span}; at its best rate against lns at its own, Δ {_d(vs) if vs.get('seeds') else '-'}: "
                       f"claim 6 **{r['word']}**.")
        else:
            out.append(f"{span} (of the rates Pre-LN trained at, diverged at {_rates_text(r['worse'])}): claim 5 by "
                       f"divergence **{r['word']}** for {v}{_gap(r, res.get('unigram_loss'))}.")
    return [" ".join(out), ""]
