"""The depth-transfer study: which parameterization carries a learning rate across depth, and LNS taken apart
where Pre-LN's curse reads present (issue 37; docs/method.md section 5.2).

    (A) transfer   pre, lns, pre + CompleteP (alpha = 1), pre + depth-muP (alpha = 1/2), lns + CompleteP, with
                   L_base = the base depth: a sqrt(2)-spaced rate grid at the base depth (seed 0), its best rate
                   applied unchanged at every depth (every seed), and a 3-rate grid around it at each grid depth
                   (seed 0) to measure how far the optimum moved
    (B) parts      at the parts depth: pre, lns, pre with block-l gains starting at l^-p, pre with every gain
                   starting at one constant (the mean of l^-p), each on a 3-rate grid around its best (pre and lns:
                   their (A) grids; the others around pre's best), then every parts seed at the best

Rates live on one lattice, rate(k) = 1e-3 * sqrt(2)^k, so a grid's neighbours are k - 1 and k + 1 whatever was
rounded; a grid whose best sits at an edge is widened one lattice step past it (`widen` times at most). At the base
depth a depth-alpha variant is its scheme's model (m = 1: every multiplier and rate factor is 1; the tests check
the losses are equal), so its base grid is that scheme's, trained once.

Selection reads the final validation loss of seed 0; every reported loss is on the corpus's test split, which no
selection reads. Words come from depthlab.study.verdicts: paired t-intervals, and a TOST against its declared
margin for "gain-init matches LNS". The rate-against-depth exponent is the least-squares slope of log(best rate)
on log(N) (scipy.stats.linregress) with its 95% t-interval (df = depths - 2); each depth's best rate is the vertex
of the parabola through the grid's best and its two neighbours in log(rate), the grid's best itself at an edge.
The plan is a function of the records alone (`next_cells`), so a killed study run again trains what is missing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from depthlab.plots import pyplot, save_figure
from depthlab.stats import interval, mean_std, pooled_noise, pvalue, spread
from depthlab.study import declared
from depthlab.study.records import cell_key, final_probe
from depthlab.study.runner import Cell, run_cells, selection_value
from depthlab.study.verdicts import (
    EQUIVALENCE_MARGIN,
    ci_cell,
    compare,
    curse_said,
    curse_word,
    equivalent,
    pooled_family,
)
from depthlab.study.wording import composition_said, said

ROOT = Path(__file__).resolve().parents[3]  # the repository this file is in (src/depthlab/study/transfer.py)
OUT = ROOT / "benchmarks" / "results" / "depth_transfer"
IMG = ROOT / "docs" / "img" / "depth_transfer.png"

PRE = "pre"
LNS = "lns"
CP, MUP, LNS_CP = "pre+completep", "pre+depth_mup", "lns+completep"
GAIN_INIT, UNIFORM = "pre+gain_init", "pre+uniform_gain"
TRANSFER = (PRE, LNS, CP, MUP, LNS_CP)
PARTS = (PRE, LNS, GAIN_INIT, UNIFORM)
ALPHA = {CP: 1, MUP: 0.5, LNS_CP: 1}
TWIN = {CP: PRE, MUP: PRE, LNS_CP: LNS}  # at the base depth, the same model
ANCHOR = 1e-3  # rate(0)
ENDPOINT = "test_loss"  # what the page reports; selection reads val_loss


def variants(base_depth: int) -> dict[str, list[str]]:
    """Every variant's config overrides."""
    scheme = {v: f"model.norm_scheme={v.split('+')[0]}" for v in (*TRANSFER, *PARTS)}
    out = {v: [scheme[v], *([f"model.depth_alpha={ALPHA[v]}", f"model.depth_base={base_depth}"] if v in ALPHA
                            else [])] for v in TRANSFER}
    out[GAIN_INIT] = [scheme[GAIN_INIT], "model.norm_gain_init=depth"]
    out[UNIFORM] = [scheme[UNIFORM], "model.norm_gain_init=uniform"]
    return out


def rate(k: float) -> float:
    """The lattice's rate k: 1e-3 * sqrt(2)^k, to 4 significant digits (what configs and record keys read)."""
    return float(f"{ANCHOR * 2 ** (k / 2):.4g}")


def lattice(lr: float) -> int | None:
    """The lattice index of a rate, None when it is not on the lattice."""
    k = round(2 * math.log2(lr / ANCHOR))
    return k if abs(rate(k) - lr) <= 1e-3 * lr else None


@dataclass(frozen=True)
class Design:
    base_depth: int = 6
    depths: tuple[int, ...] = (6, 12, 24, 48)  # the transferred rate at each, every seed
    grid_depths: tuple[int, ...] = (12, 24, 48)  # a 3-rate grid around the transferred rate at each
    base_grid: tuple[int, ...] = (5, 6, 7, 8, 9, 10)  # lattice indices: 5.657e-3 ... 3.2e-2
    seeds: tuple[int, ...] = (0, 1)
    parts_depth: int | None = 48  # None: no part (B)
    parts_seeds: tuple[int, ...] = (0, 1, 2)
    widen: int = 4  # lattice steps a grid may grow past an edge
    transfer: tuple[str, ...] = TRANSFER
    parts: tuple[str, ...] = PARTS

    @classmethod
    def of(cls, d: dict) -> Design:
        """The design a settings file recorded (describe()'s output)."""
        names = cls.__dataclass_fields__
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names})

    def describe(self) -> dict:
        return {**asdict(self), "base_rates": [rate(k) for k in self.base_grid]}


# ---------------------------------------------------------------------------------------------------- the plan
def own(v: str, L: int, d: Design) -> str:
    """The variant whose cells stand for v at depth L (at the base depth a depth-alpha variant is its scheme)."""
    return TWIN[v] if L == d.base_depth and v in TWIN else v


def find(records: dict, d: Design, v: str, L: int, k: int, seed: int) -> dict | None:
    return records.get(cell_key(own(v, L, d), rate(k), seed, L))


def grid(records: dict, d: Design, v: str, L: int, ks) -> dict:
    """v's seed-0 grid at depth L from lattice indices ks, widened past an edge holding the best (d.widen steps at
    most): {"missing": cells to train before anything is known, "ks": the grid so far, "best": its best index or
    None, "edge": the best is at an edge of what ran}."""
    ks = sorted(ks)
    for grown in range(d.widen + 1):
        recs = {k: find(records, d, v, L, k, 0) for k in ks}
        missing = [Cell(own(v, L, d), rate(k), 0, L) for k, r in recs.items() if r is None]
        if missing:
            return {"missing": missing, "ks": ks, "best": None, "edge": False}
        best = min(ks, key=lambda k: (selection_value(recs[k]), k))
        edge = best in (ks[0], ks[-1])
        if not edge or grown == d.widen:
            return {"missing": [], "ks": ks, "best": best, "edge": edge, "records": recs}
        ks = [*ks, ks[-1] + 1] if best == ks[-1] else [ks[0] - 1, *ks]
    raise AssertionError("unreachable")


@dataclass
class Stage:
    label: str
    layers: int
    missing: list[Cell] = field(default_factory=list)
    waits: str = ""  # what must finish before this stage's cells are known
    done: int = 0
    variant: str = ""  # a waiting stage: whose cells, and what they are (the page groups them)
    what: str = ""


def plan(records: dict, d: Design) -> list[Stage]:
    """Every stage of the study with the cells it lacks now (or what it waits for), cheapest depth first."""
    stages = []
    for v in d.transfer:
        if own(v, d.base_depth, d) == v:
            g = grid(records, d, v, d.base_depth, d.base_grid)
            stages.append(Stage(f"{v} rate grid at N = {d.base_depth}", d.base_depth, g["missing"],
                                done=len(g["ks"]) - len(g["missing"])))
    for L in sorted(set(d.depths) | set(d.grid_depths)):
        for v in d.transfer:
            k = transferred(records, d, v)
            if k is None:
                stages.append(Stage(f"{v} at N = {L}", L, waits=f"the N = {d.base_depth} rate grids", variant=v,
                                    what="the transferred rate (and the grids around it)"))
                continue
            if L in d.depths:
                cells = [Cell(own(v, L, d), rate(k), s, L) for s in d.seeds]
                stages.append(Stage(f"{v} at N = {L}, lr {rate(k):g} (transferred), seeds "
                                    f"{', '.join(map(str, d.seeds))}", L, [c for c in cells if c.key not in records],
                                    done=sum(c.key in records for c in cells)))
            if L in d.grid_depths and L != d.base_depth:
                g = grid(records, d, v, L, (k - 1, k, k + 1))
                stages.append(Stage(f"{v} rate grid at N = {L}", L, g["missing"],
                                    done=len(g["ks"]) - len(g["missing"])))
    if d.parts_depth:
        stages += parts_stages(records, d)
    return stages


def part_grids(records: dict, d: Design) -> dict[str, dict | None]:
    """Part (B)'s grids at the parts depth: pre and lns around their transferred rates (part (A)'s grids where the
    parts depth is a grid depth), the others around pre's best there; None while the centre is unknown."""
    P = d.parts_depth

    def around(v: str, k: int | None) -> dict | None:
        return grid(records, d, v, P, (k - 1, k, k + 1)) if k is not None else None

    pre = around(PRE, transferred(records, d, PRE))
    return {v: pre if v == PRE else around(v, transferred(records, d, v) if v in d.transfer else
                                           pre and pre["best"]) for v in d.parts}


def parts_stages(records: dict, d: Design) -> list[Stage]:
    """Part (B): each part's grid not already in part (A), then every parts seed at each part's best rate."""
    P, out, seeds = d.parts_depth, [], ", ".join(map(str, d.parts_seeds))
    grids = part_grids(records, d)
    for v, g in grids.items():
        if v in d.transfer and P in d.grid_depths:
            continue  # part (A)'s stage
        out.append(Stage(f"{v} rate grid at N = {P}", P, g["missing"], done=len(g["ks"]) - len(g["missing"])) if g
                   else Stage(f"{v} rate grid at N = {P}", P, waits=f"pre's rate grid at N = {P}", variant=v,
                              what="the rate grid"))
    for v, g in grids.items():
        if not g or g["best"] is None:
            out.append(Stage(f"{v} at N = {P}, its best rate, seeds {seeds}", P, waits=f"their rate grids at N = {P}",
                             variant=v, what=f"seeds {seeds} at the best rate"))
            continue
        cells = [Cell(v, rate(g["best"]), s, P) for s in d.parts_seeds]
        out.append(Stage(f"{v} at N = {P}, lr {rate(g['best']):g} (its best), seeds {seeds}", P,
                         [c for c in cells if c.key not in records], done=sum(c.key in records for c in cells)))
    return out


def transferred(records: dict, d: Design, v: str) -> int | None:
    """v's transferred rate (lattice index): its scheme's best at the base depth; None until that grid finished."""
    return grid(records, d, own(v, d.base_depth, d), d.base_depth, d.base_grid)["best"]


def next_cells(records: dict, d: Design) -> list[Cell]:
    """The cells that can be trained now, cheapest (shallowest) first, each once."""
    cells = sorted((c for s in plan(records, d) for c in s.missing), key=lambda c: c.layers)
    return list(dict.fromkeys(cells))


def run(study, d: Design, jobs: int = 1, log=None) -> None:
    """Train the study until its plan has nothing left: `jobs` cells at a time, the cheapest known first, the plan
    read again whenever a cell finishes, so a cell that a grid's end has just made known (pre's transferred cells,
    once pre's base grid finished) runs before the deeper cells of schemes that were known earlier."""
    run_cells(study, [], jobs, **({"log": log} if log else {}), more=lambda records: next_cells(records, d))
    if cells := next_cells(study.records(), d):
        raise AssertionError(f"the plan asks for cells the runner holds already: {cells[:3]}")


# ---------------------------------------------------------------------------------------------------- results
def vertex(recs: dict[int, dict], best: int) -> float:
    """The lattice position of the parabola's vertex through the best rate and its neighbours (log-rate), or the
    best itself where a neighbour is missing or diverged."""
    return float(vertices(np.array([best]), *(np.array([[selection_value(recs[k]) if k in recs else math.inf]])
                                               for k in (best - 1, best, best + 1)))[0])


def vertices(best, below, at, above):
    """vertex() for arrays: the best lattice index and the losses at best - 1, best, best + 1 (each an array)."""
    curvature = below - 2 * at + above
    with np.errstate(invalid="ignore", divide="ignore"):
        shift = (below - above) / (2 * curvature)
    ok = np.isfinite(below) & np.isfinite(at) & np.isfinite(above) & (curvature > 0)
    return best + np.where(ok, shift, 0.0).reshape(best.shape)


BOOTSTRAP = 2000  # replicates of the grid noise


def grid_bootstrap(grids: dict[int, dict[int, float]], sd: float, argmin: bool = False, replicates: int = BOOTSTRAP,
                   seed: int = 0) -> np.ndarray:
    """The rate exponent refitted on grids made again with their noise: each grid point's loss (depth -> {lattice
    index: seed-0 validation loss}) plus N(0, sd) (sd: one loss's seed noise, pooled), each depth's best read again
    (its vertex, or with `argmin` the grid's best; an edge is its own best), and the slope of log(rate) on log(N)
    refitted (numpy.polyfit). Returns the replicates' slopes."""
    rng = np.random.default_rng(seed)
    depths = sorted(grids)
    est = []
    for L in depths:
        ks = np.array(sorted(grids[L]))
        y = np.array([grids[L][k] for k in ks])[None, :] + rng.normal(0.0, sd, (replicates, len(ks)))
        i = np.argmin(np.where(np.isnan(y), np.inf, y), axis=1)
        k = ks[i].astype(float)
        if argmin or len(ks) < 3:
            est.append(k)
            continue
        j = np.clip(i, 1, len(ks) - 2)  # the inner best's neighbours (the grid's lattice indices are consecutive)
        around = [np.take_along_axis(y, (j + o)[:, None], 1)[:, 0] for o in (-1, 0, 1)]
        est.append(np.where((i > 0) & (i < len(ks) - 1), vertices(ks[j], *around), k))
    logs = math.log(ANCHOR) + np.array(est) * math.log(2) / 2
    return np.round(np.polyfit(np.log(depths), logs, 1)[0], 12)  # an equal best everywhere: 0, not 1e-16


def exponent_reading(grids: dict[int, dict[int, float]], sd: float, margin: dict, level: float = 0.95) -> dict:
    """The exponent's word from its bootstrap over grid noise (grid_bootstrap): "falls with depth" / "rises with
    depth" where the 95% percentile interval excludes 0; "holds its rate" where the 90% interval lies inside ±
    the margin and that margin was declared before the data (depthlab.study.declared; a margin set after gives
    no word, its numbers stay); "inconclusive" otherwise. The word stands only where the grids' argmin and each
    drop-one-depth fit read the same (each bootstrapped alike); else "inconclusive", with what moved it. Beside
    it, the bootstrap's p for a family to adjust: "p_move" (two-sided, slope 0) and "p_hold" (the larger one-sided
    share beyond ± the margin; below 0.05 where the 90% interval lies inside)."""
    def read(slopes: np.ndarray) -> dict:
        lo, hi = (float(x) for x in np.quantile(slopes, [(1 - level) / 2, (1 + level) / 2]))
        tlo, thi = (float(x) for x in np.quantile(slopes, [1 - level, level]))
        inside = -margin["value"] < tlo and thi < margin["value"]
        word = ("falls with depth" if hi < 0 else "rises with depth" if lo > 0 else
                "holds its rate" if inside and margin.get("declared") else "inconclusive")
        p_move = min(1.0, 2 * min(float(np.mean(slopes <= 0)), float(np.mean(slopes >= 0))))
        p_hold = max(float(np.mean(slopes <= -margin["value"])), float(np.mean(slopes >= margin["value"])))
        return {"ci": [lo, hi], "tost_ci": [tlo, thi], "inside": inside, "word": word, "p_move": p_move,
                "p_hold": p_hold}

    if len(grids) < 3 or not math.isfinite(sd):
        return {"word": "no bootstrap (under 3 depths)", "ci": [math.nan] * 2, "tost_ci": [math.nan] * 2,
                "margin": margin, "checks": {}}
    main = read(grid_bootstrap(grids, sd))
    checks = {"argmin": read(grid_bootstrap(grids, sd, argmin=True))}
    if len(grids) > 3:
        for L in sorted(grids):
            checks[f"without N = {L}"] = read(grid_bootstrap({k: g for k, g in grids.items() if k != L}, sd))
    moved = [name for name, c in checks.items() if c["word"] != main["word"]]
    word = main["word"] if not moved else "inconclusive"
    return {**main, "word": word, "bootstrap_word": main["word"], "moved_by": moved, "checks": checks,
            "margin": margin, "sd": sd, "replicates": BOOTSTRAP}


def hold_margin(depths: list[int]) -> float:
    """The slope inside which a rate "holds": the one that moves it by a single lattice step (a factor sqrt(2), the
    grid's resolution) across the depths fitted, ln(sqrt 2) / ln(max / min); 1/6 over 6-48 blocks."""
    return math.log(2) / 2 / math.log(max(depths) / min(depths))


def exponent(depths: list[int], rates: list[float], level: float = 0.95) -> dict:
    """The slope of log(rate) on log(depth) (scipy.stats.linregress), its standard error and t-interval (df = n - 2)
    and the word: "falls"/"rises" when the interval excludes 0; "holds its rate" when a TOST puts the slope inside
    +-hold_margin (both one-sided t-tests at 1 - level: the (2 level - 1) interval inside the margin); "inconclusive"
    otherwise; no interval at n = 2. A slope that is both shown nonzero and shown inside the margin says both."""
    from scipy import stats as st

    n = len(depths)
    out = {"n": n, "slope": math.nan, "se": math.nan, "ci": [math.nan, math.nan], "word": "no fit (under 2 depths)",
           "margin": hold_margin(depths) if n > 1 else math.nan, "tost_ci": [math.nan, math.nan], "tost_p": math.nan}
    if n < 2:
        return out
    fit = st.linregress([math.log(L) for L in depths], [math.log(r) for r in rates])
    out.update(slope=float(fit.slope))
    if n == 2:
        return {**out, "word": "two depths: no interval"}
    slope, se, df, m = out["slope"], float(fit.stderr), n - 2, out["margin"]
    half = float(st.t.ppf(0.5 + level / 2, df)) * se
    ci = [slope - half, slope + half]
    inner = float(st.t.ppf(level, df)) * se
    p = max(float(st.t.sf((slope + m) / se, df)), float(st.t.cdf((slope - m) / se, df))) if se > 0 else (
        0.0 if abs(slope) < m else 1.0)
    holds = p < 1 - level
    moves = "falls with depth" if ci[1] < 0 else "rises with depth" if ci[0] > 0 else None
    if moves:
        word = f"{moves}, within one grid step" if holds else moves
    else:
        word = "holds its rate" if holds else "inconclusive"
    return {**out, "se": se, "ci": ci, "word": word, "tost_ci": [slope - inner, slope + inner], "tost_p": p}


def _endpoint(records: dict, d: Design, v: str, L: int, k: int | None, seeds) -> dict[int, float]:
    """Each seed's test loss at lattice rate k (finished, not diverged)."""
    if k is None:
        return {}
    found = {s: find(records, d, v, L, k, s) for s in seeds}
    return {s: r[ENDPOINT] for s, r in found.items() if r and r.get("status") == "ok" and ENDPOINT in r}


def _paired(a: dict[int, float], b: dict[int, float]) -> dict:
    seeds = sorted(set(a) & set(b))
    return {**compare([b[s] - a[s] for s in seeds]), "seeds": seeds}


def rates_by_depth(records: dict, d: Design, v: str) -> dict[int, dict]:
    """Each grid depth's best rate for v (where its grid finished): the grid, the best, the vertex estimate."""
    base = grid(records, d, own(v, d.base_depth, d), d.base_depth, d.base_grid)
    k, out = base["best"], {}
    for L in sorted({d.base_depth, *d.grid_depths}):
        if k is None:
            break
        g = base if L == d.base_depth else grid(records, d, v, L, (k - 1, k, k + 1))
        if g["best"] is None:
            continue
        est = vertex(g["records"], g["best"]) if not g["edge"] else float(g["best"])
        out[L] = {"grid": {rate(k): g["records"][k]["val_loss"] for k in g["ks"]}, "best": rate(g["best"]),
                  "losses": {k: selection_value(g["records"][k]) for k in g["ks"]},
                  "best_k": g["best"], "estimate": ANCHOR * 2 ** (est / 2), "edge": g["edge"],
                  "moved": g["best"] - k}
    return out


def loss_noise(records: dict, extra_var: float = 0.0) -> dict:
    """The seed noise of one final validation loss, pooled over every cell (variant, depth, rate) that ran two or
    more seeds (stats.pooled_noise), plus `extra_var` (one run's rerun variance): the noise the exponent's bootstrap
    puts on each grid point."""
    cells: dict[tuple, list[float]] = {}
    for r in records.values():
        if r.get("status") == "ok":
            cells.setdefault((r["variant"], r.get("layers"), r["lr"]), []).append(r["val_loss"])
    return pooled_noise(cells.values(), extra_var)


def margins(study: Path | None, records: dict, d: Design) -> dict:
    """The study's two margins (depthlab.study.declared): the slope inside which a rate holds, and gain-init's
    equivalence with LNS; each from its plan.json where that declares it, else the code's (set after the data)."""
    depths = sorted({d.base_depth, *d.grid_depths})
    return {"hold": declared.margin(study, "holds_its_rate_slope", hold_margin(depths) if len(depths) > 1 else
                                    math.nan, records, f"{min(depths)}-{max(depths)}"),
            "equivalence": declared.margin(study, "equivalence_nats", EQUIVALENCE_MARGIN, records)}


def summarize(records: dict, d: Design, study: Path | None = None, rerun_var: float = 0.0) -> dict:
    """Everything the page says, computed from the records (`study`: their folder, where a plan.json may declare
    the margins; `rerun_var`: the run-to-run variance of a paired difference, summary.reruns). Every paired
    comparison of the section is one family: read with their pooled seed noise and Holm-adjusted together."""
    m = margins(study, records, d)
    res = {"design": d.describe(), "transfer": {}, "decomposition": None, "margins": m,
           "loss_noise": loss_noise(records, rerun_var / 2)}
    pre_k = rates_by_depth(records, d, PRE).get(d.base_depth, {}).get("best_k")
    for v in d.transfer:
        rates = rates_by_depth(records, d, v)
        k = rates.get(d.base_depth, {}).get("best_k")
        loss = {L: _endpoint(records, d, v, L, k, d.seeds) for L in d.depths}
        row = {"transferred": rate(k) if k is not None else None, "rates": rates,
               "loss": {L: {"per_seed": x, **mean_std(x.values())} for L, x in loss.items()},
               "exponent": exponent(list(rates), [r["estimate"] for r in rates.values()]),
               "bootstrap": exponent_reading({L: r["losses"] for L, r in rates.items()}, res["loss_noise"]["sd"],
                                             m["hold"])}
        if v != PRE:  # at the base depth a twin's comparison is its scheme's, the same test (counted once)
            row["vs_pre"] = {L: res["transfer"][own(v, L, d)]["vs_pre"][L] if own(v, L, d) in res["transfer"] else
                             _paired(_endpoint(records, d, PRE, L, pre_k, d.seeds), x) for L, x in loss.items()
                             if not (L == d.base_depth and own(v, L, d) == PRE)}
        res["transfer"][v] = row
    tests = [c for row in res["transfer"].values() for c in row.get("vs_pre", {}).values()]
    if d.parts_depth:
        dec = res["decomposition"] = decomposition(records, d)
        tests += [r["vs_pre"] for r in dec["variants"].values() if "vs_pre" in r]
        tests += [dec["tost"]["comparison"], dec.get("uniform_vs_gain_init")]
    res["noise"] = pooled_family(list({id(c): c for c in tests if c and c.get("n")}.values()), rerun_var)
    if d.parts_depth:
        gi, ln = (dec["variants"].get(v, {}).get("per_seed", {}) for v in (GAIN_INIT, LNS))
        seeds = sorted(set(gi) & set(ln))
        c = dec["tost"]["comparison"]
        dec["tost"] = {**equivalent([gi[s] - ln[s] for s in seeds], m["equivalence"]["value"], res["noise"],
                                    m["equivalence"]["status"] == declared.BEFORE), "comparison": c}
    return res


def decomposition(records: dict, d: Design) -> dict:
    """Part (B) at the parts depth: each part at its own best rate over its seeds (test loss, the curse
    index), each against pre seed by seed, and the TOST of gain-init against LNS."""
    from depthlab.study.summary import index_reading, ratio_noise_of

    P, rows = d.parts_depth, {}
    for v, g in part_grids(records, d).items():
        k = g["best"] if g else None
        loss = _endpoint(records, d, v, P, k, d.parts_seeds)
        runs = {s: r for s in d.parts_seeds if k is not None and (r := find(records, d, v, P, k, s))
                and r.get("status") == "ok" and final_probe(r)}
        rows[v] = {"lr": rate(k) if k is not None else None, "edge": bool(g and g["edge"]), "per_seed": loss,
                   **mean_std(loss.values()),
                   "index": index_reading(runs, ratio_noise_of(records, v)) if runs else None}
    for v in d.parts[1:]:
        rows[v]["vs_pre"] = _paired(rows[PRE]["per_seed"], rows[v]["per_seed"])
    gi, ln = rows.get(GAIN_INIT, {}).get("per_seed", {}), rows.get(LNS, {}).get("per_seed", {})
    seeds = sorted(set(gi) & set(ln))
    out = {"layers": P, "variants": rows, "tost": equivalent([gi[s] - ln[s] for s in seeds]),
           "pre_reading": (rows[PRE]["index"] or {}).get("reading", "unknown")}
    if UNIFORM in rows and GAIN_INIT in rows:
        out["uniform_vs_gain_init"] = _paired(rows[GAIN_INIT]["per_seed"], rows[UNIFORM]["per_seed"])
    return out



# ---------------------------------------------------------------------------------------------------- the page
def _setup(settings: dict, d: Design) -> str:
    m = settings.get("meta", {})
    corpus = m.get("corpus") or {}
    return (f"Width {m.get('dim')}, {m.get('steps')} steps of {m.get('batch')} x {m.get('seq')} tokens, "
            f"{corpus.get('source', 'its corpus')} with {m.get('dedup_removed', '?')} duplicate documents removed; "
            f"rates selected on validation (seed 0's final loss), every loss below on the test split "
            f"({m.get('test_tokens', '?'):,} tokens) that no selection reads. L_base = {d.base_depth}; rates on a "
            f"sqrt(2) lattice; base grid {', '.join(f'{rate(k):g}' for k in d.base_grid)}, widened past an edge "
            f"{d.widen} steps at most. Held-out text: {composition_said(corpus)}. `{settings.get('command', '')}`")


def _transfer_lines(res: dict, d: Design) -> list[str]:
    Ls = list(d.depths)
    head = "| " + " | ".join(f"N = {L}" for L in Ls) + " |"
    rule = "|---" * (len(Ls) + 2) + "|"
    out = [f"**Loss against depth at the transferred rate.** Each parameterization at its N = {d.base_depth} best "
           "rate, unchanged at every depth: test loss, mean ± std over seeds (n).", "",
           "| parameterization | transferred lr " + head, rule]
    for v, row in res["transfer"].items():
        lr = f"{row['transferred']:g}" if row["transferred"] else "not yet"
        out.append(f"| {v} | {lr} | " + " | ".join(
            f"{spread(row['loss'][L])} ({row['loss'][L]['n']})" if row["loss"][L]["n"] else "-" for L in Ls) + " |")
    noise = res["noise"]
    out += ["", "Each against pre at pre's transferred rate, paired by seed (test loss, nats; at "
            f"N = {d.base_depth} pre + CompleteP and pre + depth-μP are pre's model). *One noise model:* this "
            f"section's {noise['cells']} paired test-loss comparisons with two or more seeds (these, part B's against "
            "pre, gain-init against LNS, uniform against gain-init) are one family: each interval and p uses the "
            f"seed noise pooled over them (sd {noise['sd']:.4f} nats, df = {noise['df']}, the rerun spread added), "
            "p is Holm-adjusted over the family, and a word needs the adjusted p below 0.05; the per-cell reading "
            "(df = n − 1) is printed beside it where the two differ.", "",
            "| parameterization − pre " + head, "|---" * (len(Ls) + 1) + "|"]
    for v, row in res["transfer"].items():
        if "vs_pre" in row:
            out.append(f"| {v} | " + " | ".join(said(row["vs_pre"][L]) if L in row["vs_pre"] else "same model"
                                                 for L in Ls) + " |")
    return out + [""]


def _rate_lines(res: dict, d: Design) -> list[str]:
    Ls = sorted({d.base_depth, *d.grid_depths})
    hold, noise = res["margins"]["hold"], res["loss_noise"]
    out = ["**The best rate against depth.** Each depth's grid best (seed 0, validation; * at an edge of what ran) "
           "and, in brackets, the vertex of the parabola through it and its neighbours in log(rate): best rate ∝ "
           "N^slope, the least-squares fit of the vertices (its own 95% t-interval, df = depths − 2, beside). The "
           "reading comes from a bootstrap over grid noise: every grid point's loss redrawn "
           f"{BOOTSTRAP:,} times with one loss's seed noise (sd {noise['sd']:.4f} nats, pooled over the "
           f"{noise['cells']} cells of two or more seeds, df = {noise['df']}, with the rerun spread), each depth's "
           "vertex found again and the slope refitted; *falls*/*rises with depth* where its 95% percentile interval "
           "excludes 0. It stands only where the same bootstrap on the grids' argmin and with each depth left out "
           "reads alike. \"Holds its rate\" needs the 90% interval inside a margin declared before the data; this "
           f"one, ±{hold['value']:.3f} (the slope that moves the rate one √2 grid step across the depths fitted), "
           f"was {hold['status']} ({hold['why']}): whether the 90% interval lies inside is printed, and a margin "
           "set after the data gives no word.", "",
           "| parameterization | " + " | ".join(f"N = {L}" for L in Ls) + " | slope (fit's 95% t) | bootstrap 95% "
           "(90%) | 90% inside ±margin | argmin; each depth left out | reading |", "|---" * (len(Ls) + 6) + "|"]
    for v, row in res["transfer"].items():
        r, e, b = row["rates"], row["exponent"], row["bootstrap"]
        cells = [f"{r[L]['best']:g}{'*' if r[L]['edge'] else ''} ({r[L]['estimate']:.3g})" if L in r else "-"
                 for L in Ls]
        slope = f"{e['slope']:+.2f}" if math.isfinite(e["slope"]) else "-"
        if math.isfinite(e["ci"][0]):
            slope += f" [{e['ci'][0]:+.2f}, {e['ci'][1]:+.2f}]"
        if not b.get("checks"):
            out.append(f"| {v} | " + " | ".join(cells) + f" | {slope} | - | - | - | {b['word']} |")
            continue
        boot = f"[{b['ci'][0]:+.2f}, {b['ci'][1]:+.2f}] ([{b['tost_ci'][0]:+.2f}, {b['tost_ci'][1]:+.2f}])"
        checks = "; ".join(f"{name} [{c['ci'][0]:+.2f}, {c['ci'][1]:+.2f}] {c['word']}" for name, c in
                           b["checks"].items())
        word = b["word"] + (f" (the bootstrap reads {b['bootstrap_word']}; {', '.join(b['moved_by'])} does not)"
                            if b["bootstrap_word"] != b["word"] else "")
        out.append(f"| {v} | " + " | ".join(cells) + f" | {slope} | {boot} | {'yes' if b['inside'] else 'no'} | "
                   f"{checks} | *{word}* |")
    return out + [""]


def _precondition(curse: dict | None) -> str:
    """Part (B)'s precondition, Pre-LN's curse present at the parts depth (verdicts.curse_reading across the parts
    seeds), as the page says it: where it does not read present (absent, inconclusive, one seed, unreadable, not
    yet run) the question the part asks, which part of LNS lifts the curse, is *not testable*; the loss comparisons
    stand either way."""
    head = f"Pre-LN's curse index here: {curse_said(curse)}"
    if curse and curse["word"] == "present":
        return head + ", so which part of LNS lifts the curse is testable here."
    return (head + ". The precondition (present, by the 95% t-interval across seeds) is not shown, so which part "
            "of LNS lifts the curse is *not testable* here; the losses below still compare the parts.")


def _parts_lines(dec: dict, margin: dict) -> list[str]:
    P, rows = dec["layers"], dec["variants"]
    out = [f"**LNS taken apart at N = {P}.** Each part at its own best rate (its grid around pre's best; seed 0, "
           "validation), test loss (mean ± std over its seeds), each against pre paired by seed; the curse index "
           "of the final models (deep/shallow removal ratio, mean [95% t-interval across seeds], and its reading). "
           + _precondition((rows[PRE]["index"] or {}).get("curse")), "",
           "| variant | best lr | test loss (n) | − pre | deep/shallow removal | curse index |", "|---" * 6 + "|"]
    for v, r in rows.items():
        cur = (r["index"] or {}).get("curse")
        lr = f"{r['lr']:g}{'*' if r['edge'] else ''}" if r["lr"] else "not yet"
        out.append(f"| {v} | {lr} | {spread(r)} ({r['n']}) | {said(r.get('vs_pre', {})) if v != PRE else ''} | "
                   f"{ci_cell(cur['ratio']) if cur else '-'} | {curse_word(cur) if cur else '-'} |")
    t = dec["tost"]
    out += ["", f"Gain-init − LNS, each at its best rate: {said(t['comparison'])}; TOST against "
            f"{declared.said(margin, ' nats')}: 90% {interval(t)}, p {pvalue(t['p'])}, *{t['verdict']}*."]
    if dec.get("uniform_vs_gain_init"):
        out.append(f"Uniform gains − gain-init l^-p (does the depth profile matter, or any damping?): "
                   f"{said(dec['uniform_vs_gain_init'])}.")
    return out + [""]


def not_run_lines(records: dict, d: Design) -> list[str]:
    """The plan's stages that have not finished: how many cells each lacks, or what it waits for."""
    rows, waiting = [], {}
    for s in plan(records, d):
        if s.waits:
            group = waiting.setdefault((s.what, s.waits), ({}, {}))
            group[0][s.variant], group[1][s.layers] = None, None
        elif s.missing:
            rows.append(f"{s.label}: {len(s.missing)} of {len(s.missing) + s.done} cells not run")
    rows += [f"{what} of {', '.join(vs)} at N = {', '.join(map(str, Ls))}: waits for {waits}"
             for (what, waits), (vs, Ls) in waiting.items()]
    return (["**Not run yet** (the plan as far as the records fix it; a widened grid adds cells):", "",
             *[f"- {r}" for r in rows], ""] if rows else ["Every cell of the plan has run.", ""])


def study_summary(out: Path | None = None) -> tuple[dict, Design, dict, dict] | None:
    """(summarize()'s result, the design, settings.json, the records) of the study whose records are in `out`;
    None when it has none."""
    import json

    from depthlab.study.records import load_records
    from depthlab.study.summary import reruns

    out = Path(out or OUT)
    records = load_records(out / "runs.jsonl")
    if not records:
        return None
    settings = json.loads((out / "settings.json").read_text())
    d = Design.of(settings["meta"]["design"])
    return summarize(records, d, out, reruns(out.parent)["variance"]), d, settings, records


def page_lines(out: Path | None = None, img: Path | None = IMG) -> list[str]:
    """The results page's section on the depth-transfer study, from the records in `out` (the CPU study's by
    default; its GPU study's below it where they exist); [] when there are none. Draws the figure to `img`."""
    out = Path(out or OUT)
    study = study_summary(out)
    if study is None:
        return []
    res, d, settings, records = study
    lines = ["## Depth transfer: which parameterization carries its rate across depth", "", _setup(settings, d), "",
             *_transfer_lines(res, d), *_rate_lines(res, d)]
    if res["decomposition"]:
        lines += _parts_lines(res["decomposition"], res["margins"]["equivalence"])
    lines += not_run_lines(records, d)
    if img and plot(res, d, Path(img)):
        lines += [f"![Loss against depth at the transferred rate; best rate against depth]"
                  f"(img/{Path(img).name})", ""]
    gpu = out / "gpu"
    if (gpu / "runs.jsonl").exists() and out != gpu:
        sub = page_lines(gpu, Path(img).with_name("depth_transfer_gpu.png") if img else None)
        lines += [f"#{sub[0]} (GPU)", *sub[1:]] if sub else []
    return lines


def plot(res: dict, d: Design, path: Path) -> bool:
    """Two panels: test loss against depth at the transferred rate (seeds as dots), and the best rate's estimate
    against depth with each fitted exponent. False when nothing has run past the base depth."""
    if not any(row["loss"][L]["n"] for row in res["transfer"].values() for L in d.depths):
        return False
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (v, row) in enumerate(res["transfer"].items()):
        c = f"C{i}"
        Ls = [L for L in d.depths if row["loss"][L]["n"]]
        a.plot(Ls, [row["loss"][L]["mean"] for L in Ls], "o-", color=c, label=f"{v} (lr {row['transferred']:g})")
        for L in Ls:
            a.scatter([L] * row["loss"][L]["n"], list(row["loss"][L]["per_seed"].values()), color=c, s=10, alpha=0.5)
        r, e = row["rates"], row["exponent"]
        if r:
            slope = f"{e['slope']:+.2f}" if math.isfinite(e["slope"]) else "-"
            b.plot(list(r), [x["estimate"] for x in r.values()], "o-", color=c, label=f"{v}: N^{slope}")
            edges = [L for L in r if r[L]["edge"]]
            b.scatter(edges, [r[L]["estimate"] for L in edges], marker="x", color="k", zorder=3)
    a.set(title="test loss at the transferred rate", ylabel="nats")
    b.set(title="best rate (vertex of the grid; x: at an edge)", ylabel="learning rate", yscale="log")
    for ax in (a, b):
        ax.set(xscale="log", xlabel="blocks N")
        ax.set_xticks(list(d.depths), [str(L) for L in d.depths])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.legend(fontsize=7)
    save_figure(fig, path)
    return True
