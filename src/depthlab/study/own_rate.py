"""The own-rate study (issue 50): LNS against Pre-LN, each at its own learning rate, on held-out splits a reader
can trust (depthlab.data.dataset.held_out_split: no generated file held out, no document over 10% of a split,
Kish's effective number of documents >= 30 in validation and in test).

    N = 12, 24     pre and lns: each its own rate grid (seed 0; three rates of the sqrt(2) lattice of
                   depthlab.study.transfer around the depth-transfer study's best at that depth, widened one step
                   past an edge holding the best, `widen` times at most), its best by the final loss on the whole
                   validation split, then every seed at that best rate
    N = 48         the same for pre and lns, then pre + gain-init and pre + uniform gain (grids centred on their
                   depth-transfer best at 48): as far as the cores allow

The cells run in that order: every grid at 12 and 24, then their seeds (seed by seed, so that a stopped study leaves
pairs), then N = 48. The plan is a function of the records alone (`next_cells`), so a killed study run again trains
what is missing. What decides the words (endpoint, families, margins, noise model) is `plan()`, written to
OUT/plan.json and committed before the first cell (docs/method.md). Every record carries per-document losses on
validation and test (depthlab.study.records: doc_losses, doc_scored), in the order of the corpus's
splits.<split>.names (settings.json meta.corpus.splits, which also holds each split's make-up).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from depthlab import UserError
from depthlab.study import transfer as t
from depthlab.study.runner import Cell, run_cells

PRE, LNS, GAIN_INIT, UNIFORM = t.PRE, t.LNS, t.GAIN_INIT, t.UNIFORM
# lattice index of the depth-transfer study's best rate (seed 0, its validation slice) at each depth: the centres
CENTRES = {(PRE, 12): 6, (PRE, 24): 5, (PRE, 48): 5, (LNS, 12): 7, (LNS, 24): 8, (LNS, 48): 7, (GAIN_INIT, 48): 7,
           (UNIFORM, 48): 6}


@dataclass(frozen=True)
class Design:
    depths: tuple[int, ...] = (12, 24)
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    deep: int | None = 48  # None: no N = 48 stage
    deep_seeds: tuple[int, ...] = (0, 1, 2, 3)
    pair: tuple[str, ...] = (PRE, LNS)
    parts: tuple[str, ...] = (GAIN_INIT, UNIFORM)  # at the deep depth only, after the pair
    widen: int = 4
    transfer_from: int | None = None  # a depth whose best rate every other shallow depth also runs at, every seed

    def centre(self, v: str, L: int) -> int:
        """The lattice index v's grid at depth L starts around."""
        return self.centres()[(v, L)]

    def check(self) -> None:
        """Refuse in one line a depth whose grids have no declared centre (--depths 7), before anything runs."""
        wanted = [(v, L) for L in self.depths for v in self.pair]
        if self.deep:
            wanted += [(v, self.deep) for v in (*self.pair, *self.parts)]
        if self.transfer_from is not None and self.transfer_from not in self.depths:
            raise UserError(f"the rate-transfer depth N = {self.transfer_from} must be one of --depths "
                            f"{' '.join(map(str, self.depths))}")
        for v, L in wanted:
            try:
                self.centre(v, L)
            except KeyError:
                known = sorted({d for (w, d) in self.centres() if w == v})
                raise UserError(f"{'--deep' if L == self.deep else '--depths'} {L}: the study declares {v}'s rate "
                                f"grid centres at N = {', '.join(map(str, known))} only") from None

    def centres(self) -> dict[tuple[str, int], int]:
        """(variant, depth) -> the lattice index its grid starts around."""
        return CENTRES

    @classmethod
    def of(cls, d: dict) -> Design:
        names = cls.__dataclass_fields__
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names})

    def describe(self) -> dict:
        return {**asdict(self), "centres": {f"{v}@{L}": t.rate(k) for (v, L), k in CENTRES.items()}}

    def stages(self, records: dict) -> list[tuple[str, list[Cell] | None, list[str]]]:
        """This design's stages in run order (next_cells, counts and run read them here, so that a study built on
        this one may order them its own way)."""
        return stages(records, self)

    @property
    def lattice(self) -> t.Design:
        """The transfer study's grid machinery with this design's widening (none of these variants has a twin)."""
        return t.Design(base_depth=0, widen=self.widen)


def depths_of(d: Design) -> list[int]:
    """Every depth the design trains: its depths, then its deep depth if any."""
    return [*d.depths, *([d.deep] if d.deep else [])]


def variants(d: Design) -> dict[str, list[str]]:
    """Each variant's config overrides (the depth-transfer study's)."""
    return {v: t.variants(6)[v] for v in (*d.pair, *d.parts)}


def grid(records: dict, d: Design, v: str, L: int) -> dict:
    """v's seed-0 grid at depth L (transfer.grid: missing cells, lattice indices, best, edge)."""
    k = d.centre(v, L)
    return t.grid(records, d.lattice, v, L, (k - 1, k, k + 1))


def best(records: dict, d: Design, v: str, L: int) -> float | None:
    """v's validation-selected rate at depth L; None until its grid has finished."""
    g = grid(records, d, v, L)
    return t.rate(g["best"]) if g["best"] is not None else None


def stages(records: dict, d: Design) -> list[tuple[str, list[Cell] | None, list[str]]]:
    """(label, the cells it lacks now or None while they are not known, the keys of its cells done) for every stage,
    in run order. Two stages may share a cell (N = 6's best rate is often on a deeper grid)."""
    out = []

    def grids(pairs):
        for v, L in pairs:
            g = grid(records, d, v, L)
            ran = [Cell(v, t.rate(k), 0, L).key for k in g["ks"]]
            out.append((f"{v} rate grid at N = {L}", g["missing"], [k for k in ran if k in records]))

    def one(label, v, lr, s, L):  # one cell at a rate known once a grid has finished (None: not known yet)
        cell = Cell(v, lr, s, L) if lr is not None else None
        done = bool(cell and cell.key in records)
        out.append((label, cell and ([] if done else [cell]), [cell.key] if done else []))

    def seeds(pairs, ss):
        for s in [s for s in ss if s != 0]:  # seed 0 at the best rate is the grid's cell
            for v, L in pairs:
                one(f"{v} at N = {L}, its best rate, seed {s}", v, best(records, d, v, L), s, L)

    shallow = [(v, L) for L in d.depths for v in d.pair]
    grids(shallow)
    seeds(shallow, d.seeds)
    if d.transfer_from:  # the base depth's best rate at every other depth, every seed (the depth-transfer protocol)
        for s in d.seeds:
            for v, L in [(v, L) for v, L in shallow if L != d.transfer_from]:
                one(f"{v} at N = {L}, N = {d.transfer_from}'s best rate, seed {s}", v,
                    best(records, d, v, d.transfer_from), s, L)
    if d.deep:
        for vs in (d.pair, d.parts):
            deep = [(v, d.deep) for v in vs]
            grids(deep)
            seeds(deep, d.deep_seeds)
    return out


def next_cells(records: dict, d: Design) -> list[Cell]:
    """The cells that can be trained now, in the plan's order, each once."""
    return list(dict.fromkeys(c for _, cells, _ in d.stages(records) for c in cells or []))


def counts(records: dict, d: Design) -> dict:
    """Cells done, known and still missing (each cell once, whichever stages share it), and the stages whose cells
    are not known yet (minimum count: a grid is three cells before any widening, a seed stage one cell)."""
    st = d.stages(records)
    done = len({k for _, _, keys in st for k in keys})
    missing = len({c.key for _, cs, _ in st for c in cs or []})
    waiting = sum(3 if "grid" in label else 1 for label, c, _ in st if c is None)
    return {"done": done, "missing": missing, "waiting_at_least": waiting, "planned_at_least": done + missing + waiting}


def run(study, d: Design, jobs: int = 1, log=None) -> None:
    """Train until the plan has nothing left, `jobs` cells at a time, the plan read again whenever one finishes."""
    run_cells(study, [], jobs, **({"log": log} if log else {}), more=lambda records: next_cells(records, d))
    if cells := next_cells(study.records(), d):
        raise AssertionError(f"the plan asks for cells the runner holds already: {cells[:3]}")


# ---------------------------------------------------------------------------------------------------- the plan
def plan(d: Design) -> dict:
    """What decides this study's words, declared before its first cell (OUT/plan.json, committed first)."""
    depths = [*d.depths, *([d.deep] if d.deep else [])]
    hold = {f"{min(ds)}-{max(ds)}": round(t.hold_margin(ds), 4) for ds in (depths, list(d.depths)) if len(ds) > 1}
    return {
        "study": "own_rate",
        "question": "Does LNS reach a lower test loss than Pre-LN when each runs at its own validation-selected "
                    "learning rate, at N = 12 and 24 (and 48)?",
        "primary_endpoint": "paired by seed: test loss (token-weighted mean over the whole test split) of LNS minus "
                            "that of Pre-LN, each at its own rate selected on the validation split, at each depth",
        "selection": "seed 0's final validation loss (whole validation split) over a 3-rate sqrt(2) lattice grid "
                     "centred on the depth-transfer study's best, widened one lattice step past an edge holding "
                     f"the best ({d.widen} times at most); the grid's argmin is the rate every seed runs at",
        "splits": "held_out_split: every 5th non-generated document held out (data.val_fraction 0.2), dealt "
                  "alternately to validation and test; generated = at least 50% of code lines are data lines; a "
                  "held-out document keeps at most 4 chunks of <= 2,000 characters spread over it, fewer where it "
                  "would hold over 5% of its split's characters; each split must have Kish effective documents >= "
                  "30 and no document over 10% of its tokens",
        "depths": depths, "variants": {"pair": list(d.pair), "parts_at_deep": list(d.parts)},
        "seeds": {str(L): list(d.seeds) for L in d.depths} | ({str(d.deep): list(d.deep_seeds)} if d.deep else {}),
        "alpha": 0.05, "interval": "95% two-sided t-interval",
        "min_seeds_for_a_word": 3,
        "families": {
            "primary": {"tests": [f"lns - pre at N = {L}" for L in depths],
                        "correction": "Holm over the family (a depth not run to >= 3 paired seeds leaves it and is "
                                      "reported as not run)"},
            "parts_at_deep": {"tests": [f"{GAIN_INIT} - {PRE}", f"{UNIFORM} - {PRE}", f"{UNIFORM} - {GAIN_INIT}"],
                              "correction": "Holm over the family"},
            "equivalence": {"tests": [f"{GAIN_INIT} - {LNS} at N = {d.deep}"],
                            "correction": "none (one test); TOST at alpha 0.05"},
            "rate_exponent": {"tests": [f"slope of log(best rate) on log(N), {v}" for v in d.pair],
                              "correction": "Holm over the two schemes"},
        },
        "words": {"lower/higher": "Holm-adjusted p < 0.05 and the 95% interval excludes 0",
                  "inconclusive": "otherwise, with >= 3 paired seeds",
                  "no verdict": "fewer than 3 paired seeds"},
        "margins": {
            "equivalence_nats": 0.01,
            "equivalence_rule": "'matches' when both one-sided tests reject at alpha 0.05 against +-0.01 nats",
            "holds_its_rate_slope": hold,
            "holds_rule": "'holds its rate' when the 90% interval of the slope (a bootstrap over grid noise: each "
                          "grid's losses resampled with the pooled seed spread) lies inside +-ln(sqrt 2) / "
                          "ln(N_max / N_min), one lattice step across the depths fitted",
        },
        "noise_model": {
            "primary": "seed variance of the paired differences pooled across the comparable cells (LNS - Pre-LN "
                       "at every depth run; df = sum of (n - 1)); the per-cell t-interval (df = n - 1) is shown "
                       "beside it where the two disagree",
            "documents": "a bootstrap over test documents (per-document losses, the same resample for both schemes "
                         "and all seeds) combined with the seeds, so an interval covers document sampling too",
        },
        "declared_before": "this file's commit precedes every record of runs.jsonl beside it",
    }
