"""What every section of the pages prints alike."""

from __future__ import annotations

import json
import math
from pathlib import Path

from depthlab.stats import interval, pvalue
from depthlab.study.summary import MECHANISMS


def load(path: Path) -> dict | None:
    """A result file, or None where it was never written (its section says so)."""
    return json.loads(Path(path).read_text()) if Path(path).exists() else None


def settings_of(out: Path) -> dict | None:
    """A study's settings.json as one flat dict (the runner's `meta` and `command`, or an earlier flat file)."""
    s = load(Path(out) / "settings.json")
    if s is None:
        return None
    return {**s["meta"], "command": s.get("command", "")} if "meta" in s else s


def said(c: dict, f: str = ".3f") -> str:
    """A comparison as the page prints it everywhere: mean, its interval, p (and, inside a family, Holm's) and n, then
    the word (the family's, where it has one); under the pooled noise model the per-cell reading (df = n − 1) beside
    it where it differs from both the word and the pooled reading before Holm (the "unadjusted" note says that)."""
    if not c or not c.get("n"):
        return "no runs"
    n = f"n = {c['n']}"
    if c["n"] < 2 or not math.isfinite(c["ci"][0]):
        return f"{c['mean']:+{f}} ({n}: *{c['verdict']}*)"
    holm = f" (Holm {pvalue(c['p_holm'])})" if "p_holm" in c else ""
    word, cell = c.get("word", c["verdict"]), c.get("cell")
    moved = f" (unadjusted: {c['verdict']})" if word != c["verdict"] else ""
    beside = (f"; per cell (df = {c['n'] - 1}) {interval(cell, f)}: *{cell['verdict']}*"
              if cell and cell["verdict"] not in (word, c["verdict"]) else "")
    return f"{c['mean']:+{f}} {interval(c, f)}, p {pvalue(c['p'])}{holm}, {n}: *{word}*{moved}{beside}"


def grid(g: dict) -> str:
    """A seed-0 rate grid: each rate's final loss, the best in bold, diverged rates named."""
    bad, best = {f"{lr:g}" for lr in g["diverged"]}, "-" if g["best_lr"] is None else f"{g['best_lr']:g}"
    cells = [f"{lr} diverged" if lr in bad else (f"**{lr} {loss:.3f}**" if lr == best else f"{lr} {loss:.3f}")
             for lr, loss in g["grid"].items()]
    return ", ".join(cells) + (" (best at an edge)" if g["edge"] else "")


def rate(lr: float | None) -> str:
    return "-" if lr is None else f"{lr:g}"


def number(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def mechanism_table(res: dict, claims: bool = False) -> list[str]:
    """Each mechanism quantity by depth: both schemes seed by seed, lns − pre with its interval and word, the direction
    the paper predicts (and, with `claims`, the claim it bears on)."""
    out = ["| N | quantity | pre (per seed) | lns (per seed) | lns − pre | paper predicts |" + (" claim |" if claims
                                                                                          else ""),
           "|---" * (7 if claims else 6) + "|"]
    for d in res["depths"]:
        for name, m in d.get("mechanisms", {}).items():
            seeds = [", ".join(f"{x:.3g}" for x in m[side].values()) for side in ("a", "b")]
            out.append(f"| {d['layers']} | {MECHANISMS[name][0]} | {seeds[0]} | {seeds[1]} | {said(m, '.3g')} | "
                       f"lns {m['predicted']} |" + (f" {m['paper_claim']} |" if claims else ""))
    return out


def composition_said(corpus: dict, whose: str = "its") -> str:
    """A study corpus's held-out splits as the page prints them: each split's documents, Kish's effective number of
    documents and its largest document's share, from the corpus record's "splits"; where the record has none, that
    the composition is not recorded, and what the record does hold (each held-out split's documents and tokens, as
    far as it counted them)."""
    splits = corpus.get("splits") or {}
    if splits:
        return f"{whose} " + "; ".join(f"{name} split {s['documents']} documents, Kish effective {s['effective']:g}"
                                       + "".join(f", largest {doc} {share:.0%}" for doc, share in s["top"][:1])
                                       for name, s in splits.items())
    docs = corpus.get("documents") or {}
    held = [f"{name} split " + (f"{docs[name]} documents ({corpus[f'{name}_tokens']:,} tokens)" if name in docs else
                                f"{corpus[f'{name}_tokens']:,} tokens (documents not counted)")
            for name in ("val", "test") if corpus.get(f"{name}_tokens")]
    held += [] if corpus.get("test_tokens") or not held else ["no test split"]
    known = f"; the records hold only: {', '.join(held)}" if held else ""
    return (f"{whose} held-out splits' composition (each document's share, Kish's effective number of documents) is "
            f"not recorded{known}")
