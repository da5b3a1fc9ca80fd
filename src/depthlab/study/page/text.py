"""What every section of the pages prints alike."""

from __future__ import annotations

import json
from pathlib import Path

from depthlab.study.summary import MECHANISMS
from depthlab.study.wording import composition_said, said  # noqa: F401 (the sections read them from here too)


def load(path: Path) -> dict | None:
    """A result file, or None where it was never written (its section says so)."""
    return json.loads(Path(path).read_text()) if Path(path).exists() else None


def settings_of(out: Path) -> dict | None:
    """A study's settings.json as one flat dict (the runner's `meta` and `command`, or an earlier flat file)."""
    s = load(Path(out) / "settings.json")
    if s is None:
        return None
    return {**s["meta"], "command": s.get("command", "")} if "meta" in s else s


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
