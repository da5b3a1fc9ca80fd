"""How a comparison and a study corpus's held-out splits read in prose, alike wherever a study's words are printed:
the results page's sections (depthlab.study.page) and the study modules that write their own (transfer)."""

from __future__ import annotations

import math

from depthlab.stats import interval, pvalue


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
