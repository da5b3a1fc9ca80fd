"""docs/results.md's own-rate section (depthlab.study.own_rate) as far as its records go: each scheme's seed-0 rate
grid at each depth with validation and test loss, the paired LNS − Pre-LN test loss at each one's own
validation-selected rate read with the rules plan.json declared before the first cell (pooled seed noise across
depths, Holm over the plan's depths with those not yet compared at p = 1, at least 3 paired seeds for a word),
beside it an interval that also covers the sampling of test documents (a bootstrap over the records' per-document
losses, stats.document_bootstrap; it gives no word), LNS taken apart at N = 48 once its parts have run (the plan's
parts family and its equivalence margin, `parts`), and, scheme by scheme and depth by depth, the cells the plan still
lacks. The first screen (screen.py) reads the same comparisons."""

from __future__ import annotations

from pathlib import Path

from depthlab.stats import DOC_REPLICATES, document_bootstrap
from depthlab.study import declared, own_rate as o, transfer as t
from depthlab.study.own_rate import depths_of
from depthlab.study.page import rates
from depthlab.study.page.text import composition_said, load, said, settings_of
from depthlab.study.records import load_records
from depthlab.study.runner import Cell
from depthlab.study.verdicts import EQUIVALENCE_MARGIN, MIN_SEEDS, compare, equivalent, holm_words, pooled_family

FEW = f"fewer than {MIN_SEEDS} paired seeds: no verdict"
SPLIT = "test"  # the split every interval of the section reads (no selection reads it)
HEAD = "## The own-rate study: LNS against Pre-LN on balanced held-out splits"


def document_interval(rs: list[dict], paired_with: list[dict] | None = None) -> dict | None:
    """document_bootstrap of the runs' test loss (one run per seed), or with `paired_with` (the other scheme's runs,
    seed by seed) of the paired difference rs − paired_with; None where a run lacks per-document losses."""
    runs = [*rs, *(paired_with or [])]
    if not rs or any(SPLIT not in (r.get("doc_losses") or {}) for r in runs):
        return None
    rows = [r["doc_losses"][SPLIT] for r in rs]
    if paired_with:
        rows = [[None if x is None or y is None else x - y for x, y in zip(a, b["doc_losses"][SPLIT], strict=True)]
                for a, b in zip(rows, paired_with, strict=True)]
    return document_bootstrap(rows, rs[0]["doc_scored"][SPLIT])


def boot_said(b: dict | None, f: str = ".4f", signed: bool = True) -> str:
    """A document_bootstrap() as a table cell: the point, its percentile interval, what was resampled."""
    if b is None:
        return "no per-document losses"
    sign = "+" if signed else ""
    what = f"{b['documents']} documents" + (f" × {b['seeds']} seeds" if b["seeds"] > 1 else ", 1 seed")
    return f"{b['mean']:{sign}{f}} [{b['ci'][0]:{sign}{f}}, {b['ci'][1]:{sign}{f}}] ({what})"


def seeds_at(d: o.Design, L: int) -> tuple[int, ...]:
    return d.seeds if L in d.depths else d.deep_seeds


def at_best(records: dict, d: o.Design, v: str, L: int) -> tuple[float | None, dict[int, dict]]:
    """v's validation-selected rate at depth L and its records there, by seed (None and {} before its grid has
    finished)."""
    lr = o.best(records, d, v, L)
    return lr, {} if lr is None else {s: r for s in seeds_at(d, L) if (r := records.get(Cell(v, lr, s, L).key))}


def paired(records: dict, d: o.Design, a: str, b: str, L: int) -> dict:
    """b − a test loss at depth L, paired by seed, each at its own best rate: compare() with "seeds", "rates" and
    "documents" (the difference's bootstrap over test documents and seeds, document_interval)."""
    (ra, A), (rb, B) = at_best(records, d, a, L), at_best(records, d, b, L)
    seeds = sorted(set(A) & set(B))
    return {**compare([B[s][t.ENDPOINT] - A[s][t.ENDPOINT] for s in seeds]), "seeds": seeds, "rates": [ra, rb],
            "documents": document_interval([B[s] for s in seeds], [A[s] for s in seeds])}


def plan_words(cs: list[dict], family_size: int, min_seeds: int = MIN_SEEDS, pool: bool = True) -> dict | None:
    """One family of the plan, in place: the comparisons with at least `min_seeds` paired seeds read with their
    pooled seed noise (`pool`; else each its own, as Welch's tests are) and Holm over `family_size` tests
    (verdicts.pooled_family / holm_words: a test not yet run counts at p = 1); the others get FEW (or "no runs") as
    their word. Returns the pooled noise model (None without `pool`)."""
    read = [c for c in cs if c["n"] >= min_seeds]
    noise = pooled_family(read, family_size=family_size) if pool else None
    if not pool:
        holm_words(read, family_size=family_size)
    for c in cs:
        if c["n"] < min_seeds:
            c["word"] = FEW if c["n"] else "no runs"
    return noise


def comparisons(records: dict, d: o.Design, min_seeds: int = MIN_SEEDS) -> dict[int, dict]:
    """LNS − Pre-LN test loss by depth, paired by seed, each scheme at its own best rate (`paired`): one family
    (pooled seed noise, Holm over the plan's depths), with the word withheld below `min_seeds` paired seeds
    (`plan_words`); "documents" decides no word."""
    out = {L: paired(records, d, o.PRE, o.LNS, L) for L in depths_of(d)
           if None not in (o.best(records, d, o.PRE, L), o.best(records, d, o.LNS, L))}
    plan_words(list(out.values()), len(depths_of(d)), min_seeds)
    return out


PART_TESTS = ((o.PRE, o.GAIN_INIT, "gain-init − Pre-LN"), (o.PRE, o.UNIFORM, "uniform gain − Pre-LN"),
              (o.GAIN_INIT, o.UNIFORM, "uniform gain − gain-init"))  # the plan's parts_at_deep family


def parts(records: dict, d: o.Design, study: Path | None = None, min_seeds: int = MIN_SEEDS) -> dict | None:
    """LNS taken apart at the plan's deep depth, each variant at its own best rate, test loss paired by seed: the
    parts family (PART_TESTS, read by `plan_words`) and gain-init − LNS against the plan's equivalence margin (TOST
    with the family's pooled noise; a word only for a margin declared before the data, depthlab.study.declared, and
    at `min_seeds` paired seeds). None where no part has a paired seed against Pre-LN yet."""
    P = d.deep
    if not P or not d.parts:
        return None
    tests = {label: paired(records, d, a, b, P) for a, b, label in PART_TESTS}
    if not any(tests[label]["n"] for _, _, label in PART_TESTS[:2]):
        return None
    noise = plan_words(list(tests.values()), len(PART_TESTS), min_seeds)
    m = declared.margin(study, "equivalence_nats", EQUIVALENCE_MARGIN, records)
    c = paired(records, d, o.LNS, o.GAIN_INIT, P)
    holm_words([c])  # the equivalence family is this one test
    tost = equivalent(c["per_seed"], m["value"], noise if noise["df"] else None, m["declared"])
    return {"layers": P, "tests": tests, "margin": m, "tost": {**tost, "comparison": c}}


def pair_said(c: dict, f: str = ".4f", min_seeds: int = MIN_SEEDS) -> str:
    """A comparison's cell: the plan's reading (text.said) with `min_seeds` or more paired seeds, else its mean, n
    and why there is no word (FEW)."""
    if c.get("n", 0) >= min_seeds:
        return said(c, f)
    return f"{c['mean']:+{f}} (n = {c['n']}: *{FEW}*)" if c.get("n") else "no runs"


def parts_said(p: dict, f: str = ".4f") -> str:
    """parts() (or a study's decomposition in its shape) in prose: each test of the family, then gain-init − LNS
    with its TOST word (none below MIN_SEEDS paired seeds)."""
    t, m = p["tost"], p["margin"]
    n = t["comparison"]["n"]
    word = t["verdict"] if n >= MIN_SEEDS else FEW if n else "no runs"
    return ("; ".join(f"{label} {pair_said(c, f)}" for label, c in p["tests"].items())
            + f"; gain-init − LNS {pair_said(t['comparison'], f)}, TOST ±{m['value']:g} nats {m['status']}: *{word}*")


def study(out: Path, module=o) -> tuple[dict, dict, o.Design] | None:
    """The own-rate study in `out` (or another built on it: `module`, its design's module): its records, settings
    (settings.json, else plan.json) and design; None where it has no records."""
    records = load_records(out / "runs.jsonl")
    if not records:
        return None
    settings = settings_of(out) or {}
    return records, settings, design_of(out, settings, module)


def grid_row(records: dict, d: o.Design, v: str, L: int) -> str:
    g = o.grid(records, d, v, L)
    cells = []
    for k in g["ks"]:
        r = t.find(records, d.lattice, v, L, k, 0)
        if r is None:
            cells.append(f"{t.rate(k):g} not run yet")
            continue
        b = document_interval([r])
        ci = f" [{b['ci'][0]:.3f}, {b['ci'][1]:.3f}]" if b else ""
        text = f"{t.rate(k):g} {r['val_loss']:.4f} / {r[t.ENDPOINT]:.4f}{ci}"
        cells.append(f"**{text}**" if k == g["best"] else text)
    best = "-" if g["best"] is None else f"{t.rate(g['best']):g}" + (" (at an edge)" if g["edge"] else "")
    return f"| {L} | {v} | {', '.join(cells)} | {best} |"


def progress_row(records: dict, d: o.Design, v: str, L: int) -> str:
    """Where v's cells at depth L stand against the plan: its seed-0 grid (rates run, widened past which edge), the
    seeds run at its best rate with their test loss (documents and seeds resampled), and the cells still missing
    (those known now, and those that wait on the grid)."""
    g, seeds = o.grid(records, d, v, L), seeds_at(d, L)
    c = d.centre(v, L)
    ran = [k for k in g["ks"] if t.find(records, d.lattice, v, L, k, 0)]
    steps = {"lower": c - 1 - min(g["ks"]), "upper": max(g["ks"]) - c - 1}
    widened = [f"{n} {'step' if n == 1 else 'steps'} past its {side} edge" for side, n in steps.items() if n > 0]
    grid = f"{len(ran)} of {len(g['ks'])} rates run" + "".join(f", widened {w}" for w in widened)
    later = [s for s in seeds if s != 0]
    if g["best"] is None:
        missing = [f"{t.rate(k):g} (seed 0)" for k in g["ks"] if k not in ran]
        rest = f"; then seed{'s' * (len(later) > 1)} {', '.join(map(str, later))} at the grid's best" if later else ""
        return f"| {L} | {v} | {grid}; best not known yet | - | - | {', '.join(missing)}{rest} |"
    lr = t.rate(g["best"])
    done = [s for s in seeds if Cell(v, lr, s, L).key in records]
    lacking = [s for s in seeds if s not in done]
    best = f"best {lr:g}" + (" (at an edge)" if g["edge"] else "")
    todo = f"seed{'s' * (len(lacking) > 1)} {', '.join(map(str, lacking))} at {lr:g}" if lacking else "none"
    loss = boot_said(document_interval([records[Cell(v, lr, s, L).key] for s in done]), ".3f", signed=False)
    return f"| {L} | {v} | {grid}; {best} | {', '.join(map(str, done))} | {loss} | {todo} |"


def design_of(out: Path, settings: dict, study=o) -> o.Design:
    """The design a study's records were made under: settings.json's, else plan.json's (`study`: its module)."""
    return study.Design.of(settings.get("design") or (load(out / "plan.json") or {}).get("design") or {})


def made_by(out: Path, records: dict, settings: dict, d: o.Design) -> str:
    """The section's first line: the command, the corpus and its held-out splits, whether plan.json was declared
    before the records (declared.plan_order), and the cells done and missing (own_rate.counts)."""
    order, counts = declared.plan_order(out, records), o.counts(records, d)
    return (f"Made by `{settings.get('command', '?')}` on the corpus sha256 {settings['corpus']['sha256'][:8]}… "
            f"({composition_said(settings['corpus'])}). What decides the words is plan.json beside the records"
            f" ({order['status']}: {order['why']}). Cells done: {counts['done']}; known and missing: "
            f"{counts['missing']}; at least {counts['waiting_at_least']} more wait on those.")


def grid_lines(records: dict, d: o.Design, rows: list[tuple[int, str]]) -> list[str]:
    """Each (depth, scheme)'s seed-0 grid as a table, its best by validation in bold."""
    return ["Each scheme's seed-0 grid: rate, final validation loss / test loss and, in brackets, the test loss's 95% "
            "interval over test documents (bold: the best by validation, the rate every seed of that scheme and depth "
            "runs at).", "", "| N | scheme | rate: val / test [documents resampled] | best |", "|---|---|---|---|",
            *[grid_row(records, d, v, L) for L, v in rows], ""]


def progress_lines(records: dict, d: o.Design, rows: list[tuple[int, str]]) -> list[str]:
    return ["Each scheme at its own best rate: the seeds run there, their test loss (mean over seeds; 95% "
            "interval with documents and seeds resampled as above), and what the plan still lacks (the seed-0 "
            "grid first, then every other seed at the grid's best; a grid whose best lies at an edge widens one "
            f"rate past it, {d.widen} times at most):", "",
            "| N | scheme | seed-0 grid | seeds at its best rate | test loss (documents and seeds resampled) | "
            "still missing |", "|---|---|---|---|---|---|", *[progress_row(records, d, v, L) for L, v in rows], ""]


def page_lines(out: Path) -> list[str]:
    """The section, from OUT/runs.jsonl, OUT/settings.json and OUT/plan.json; a line saying it has not run where
    OUT has no records."""
    head = [HEAD, ""]
    if not (found := study(out)):
        return head + ["Not run yet (`make study-own-rate`; docs/method.md section 5.3).", ""]
    records, settings, d = found
    rows = [(L, v) for L in depths_of(d) for v in (*d.pair, *(d.parts if L == d.deep else ()))]
    lines = head + [made_by(out, records, settings, d), ""]
    lines += grid_lines(records, d, [(L, v) for L, v in rows if any(t.find(records, d.lattice, v, L, k, 0)
                                                                    for k in o.grid(records, d, v, L)["ks"])])
    cs = comparisons(records, d)
    lines += ["LNS − Pre-LN test loss, paired by seed, each at its own best rate. The word is the plan's (its "
              "`primary` family): the "
              "t-interval with seed noise pooled across depths, Holm over the plan's depths (a depth not yet compared "
              "counts at p = 1, so that a word given now stands whatever the depths still to come show), and 3 "
              "paired seeds before a word. Beside it, an interval that also covers which documents the test split "
              "happened to hold: a "
              f"percentile bootstrap (scipy.stats.bootstrap, {DOC_REPLICATES} replicates, numpy seed 0) over the "
              "records' per-document test losses, each replicate drawing the test documents with replacement (one "
              "draw for both schemes and every seed, so the difference stays paired) and, where a depth has 2 or "
              "more paired seeds, the seeds with replacement, independently of the documents; its statistic is the "
              "token-weighted mean over the drawn documents of the mean over the drawn seeds. It is not "
              "Holm-adjusted and gives no word: with a few seeds a bootstrap understates the seed spread (two seeds "
              "give three draws), so read it for what the documents add.", "",
              "| N | rates (pre, lns) | seeds | lns − pre (the plan's reading) | lns − pre, documents and seeds "
              "resampled (95% bootstrap) |", "|---|---|---|---|---|"]
    for L in depths_of(d):
        c = cs.get(L)
        if c is None:
            lines.append(f"| {L} | - | - | not run yet: a grid has not finished (see below) | - |")
            continue
        lines.append(f"| {L} | {c['rates'][0]:g}, {c['rates'][1]:g} | {', '.join(map(str, c['seeds'])) or '-'} | "
                     f"{pair_said(c)} | {boot_said(c['documents']) if c['n'] else '-'} |")
    if p := parts(records, d, out):
        lines += ["", f"LNS taken apart at N = {p['layers']}, each variant at its own best rate, test loss paired by "
                  "seed (the plan's `parts_at_deep` family: seed noise pooled over its three tests, Holm over them, "
                  "3 paired seeds for a word; its `equivalence` family, gain-init − LNS, a TOST against the margin "
                  f"{declared.said(p['margin'], ' nats')}): {parts_said(p)}."]
    lines += [""] + rates.exponent_lines(rates.exponents(records, d, out), "each scheme's")
    return lines + progress_lines(records, d, rows)
