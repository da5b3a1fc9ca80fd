"""Whether a margin was declared before the data it decides, checked from git (docs/method.md, "Margins declared
before the data").

A study declares its plan in `plan.json` beside its records (benchmarks/results/<study>/plan.json):

    {"primary_endpoint": "...", "seeds": {...}, "families": {...},
     "margins": {"equivalence_nats": 0.01, "holds_its_rate_slope": {"12-48": 0.25, "12-24": 0.5}}}

(benchmarks/results/own_rate/plan.json is one). A margin is a number, or a number per range of depths fitted
("min-max") where it depends on them.

A margin is *declared before* the data when the plan names it and the plan's last commit precedes the first commit
of the study's runs.jsonl (both read with `git log`), the plan in the working tree is the committed one, and no
record names another plan (a record's "plan_sha256", where records carry one, is the plan's). A margin no such plan
declares was *set after* the data; where git cannot be asked, the order is *not verifiable*. Only a margin declared
before can produce a verdict word (an equivalence, "holds its rate"); any other is printed as a number.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

BEFORE, AFTER, UNKNOWN = "declared before the data", "set after the data", "not verifiable"
PLAN = "plan.json"


def _git(cwd: Path, *args: str) -> str | None:
    """git's stdout, or None where git is missing or cannot answer here."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def commit_times(path: Path) -> list[int] | None:
    """The commit times (unix seconds) of every commit that touched `path`, oldest first; [] for a file git does not
    track; None where git cannot be asked."""
    path = Path(path).resolve()
    if not path.parent.is_dir():
        return None
    log = _git(path.parent, "log", "--format=%ct", "--", path.name)
    return None if log is None else sorted(int(x) for x in log.split())


def _dirty(path: Path) -> bool:
    return bool(_git(path.parent, "status", "--porcelain", "--", path.name))


def plan_of(study: Path) -> dict | None:
    p = Path(study) / PLAN
    return json.loads(p.read_text()) if p.exists() else None


def plan_order(study: Path, records: dict | None = None) -> dict:
    """Whether the study's plan precedes its records: {"status": BEFORE / AFTER / UNKNOWN, "why": a phrase}."""
    study = Path(study)
    plan, runs = study / PLAN, study / "runs.jsonl"
    if not plan.exists():
        return {"status": AFTER, "why": "no plan file declares it before the records"}
    times = commit_times(plan)
    if times is None:
        return {"status": UNKNOWN, "why": "git cannot be asked here"}
    if not times or _dirty(plan):
        return {"status": AFTER, "why": f"{PLAN} is not committed as it stands"}
    digest = hashlib.sha256(plan.read_bytes()).hexdigest()
    if any(r.get("plan_sha256") not in (None, digest) for r in (records or {}).values()):
        return {"status": AFTER, "why": f"records were made under another {PLAN}"}
    first = commit_times(runs) if runs.exists() else []
    if first and first[0] <= times[-1]:
        return {"status": AFTER, "why": f"{PLAN}'s last commit does not precede the records' first"}
    return {"status": BEFORE, "why": f"{PLAN}'s commit precedes every record"}


def margin(study: Path | None, name: str, default: float, records: dict | None = None, key: str | None = None) -> dict:
    """The margin `name` the study's page uses: the plan's value (its entry `key` where the plan gives one per range
    of depths) where its plan declares it, with plan_order's status; else `default` (set in code) with status
    AFTER. {"name", "value", "status", "why", "declared"}."""
    plan = (plan_of(study) if study else None) or {}
    value = (plan.get("margins") or {}).get(name)
    if isinstance(value, dict):
        value = value.get(key)
    if value is None:
        return {"name": name, "value": default, "status": AFTER, "declared": False,
                "why": f"set in code; no {PLAN} declares it before the records"}
    order = plan_order(study, records)
    return {"name": name, "value": float(value), "declared": order["status"] == BEFORE, **order}


def said(m: dict, unit: str = "", f: str = ".3g") -> str:
    """A margin as the page prints it: its value (and unit) and whether it was declared before the data."""
    return f"±{m['value']:{f}}{unit} ({m['status']}: {m['why']})"


def plans(results: Path) -> list[dict]:
    """Every study under `results` with a plan.json: its name, the margins it declares and plan_order's status
    ({"study", "margins", "status", "why"}), for the page to say which margins were declared before the data."""
    out = []
    for plan in sorted(Path(results).glob(f"*/{PLAN}")):
        margins = {k: v for k, v in (plan_of(plan.parent).get("margins") or {}).items() if not k.endswith("_rule")}
        out.append({"study": plan.parent.name, "margins": margins, **plan_order(plan.parent)})
    return out
